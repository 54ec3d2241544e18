#include "export/config_doc.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "core/errors.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

std::string value_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return v.dump();
}

// A value of an `args` file as one shell word: as is where the shell reads it so (names, paths, numbers, a lone
// ${VAR} the launch expands), else in single quotes (a regular expression's ( | ? * $ \). A value holding a single
// quote or a space cannot be one such word: a bug in the exporter that built it.
std::string shell_word(const json& v) {
  const std::string text = value_text(v);
  if (!v.is_string()) return text;
  const bool variable = text.size() > 3 && text.rfind("${", 0) == 0 && text.back() == '}' &&
                        text.find_first_of("${}", 2) == text.size() - 1;
  if (variable || text.find_first_of("()|!?*^$<>&;[]{}\\\"`~#") == std::string::npos) return text;
  FSDP_ASSERT(text.find_first_of("' \t\n") == std::string::npos, "an args value is one single-quotable word");
  return "'" + text + "'";
}

// The value a shell word stands for: single quotes removed (shell_word).
std::string unquoted_word(const std::string& w) {
  if (w.size() >= 2 && w.front() == '\'' && w.back() == '\'') return w.substr(1, w.size() - 2);
  return w;
}

bool type_matches(const json& v, const std::string& type) {
  if (type == "int") return v.is_number_integer();
  if (type == "float") return v.is_number();
  if (type == "bool") return v.is_boolean();
  if (type == "string" || type == "call") return v.is_string();
  if (type == "string_list") {
    if (!v.is_array()) return false;
    for (const auto& e : v)
      if (!e.is_string()) return false;
    return true;
  }
  return false;
}

const KeyRule& rule_for(const FileTable& table, const std::string& key, const std::string& where) {
  auto it = table.keys.find(key);
  if (it == table.keys.end()) throw InputError(where + ": key '" + key + "' is not in " + table.name + "'s key table");
  return it->second;
}

// Text read from a file -> the key table's type.
json typed(const std::string& text, const KeyRule& rule, const std::string& where) {
  if (rule.nullable && (text == "null" || text == "~" || text == "None")) return nullptr;
  auto fail = [&]() -> json { throw InputError(where + ": '" + text + "' is not a " + rule.type); };
  if (rule.type == "string" || rule.type == "call") return text;
  if (rule.type == "bool") {
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
    return fail();
  }
  if (rule.type == "int") {
    try {
      size_t used = 0;
      const long long v = std::stoll(text, &used);
      if (used != text.size()) return fail();
      return v;
    } catch (const std::exception&) {
      return fail();
    }
  }
  if (rule.type == "float") {
    try {
      size_t used = 0;
      const double v = std::stod(text, &used);
      if (used != text.size() || !std::isfinite(v)) return fail();
      return v;
    } catch (const std::exception&) {
      return fail();
    }
  }
  return fail();
}

std::string quoted(const std::string& s) { return json(s).dump(); }

// TOML / Python literal of a value.
std::string literal(const json& v, bool python) {
  if (v.is_boolean()) return python ? (v.get<bool>() ? "True" : "False") : (v.get<bool>() ? "true" : "false");
  if (v.is_string()) return quoted(v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + literal(v[i], python);
    return out + "]";
  }
  if (v.is_number_float()) {
    std::ostringstream o;
    o.precision(10);
    o << v.get<double>();
    std::string s = o.str();
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  return v.dump();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// A TOML / Python literal back to text (strings unquoted) or a list of texts.
json read_literal(const std::string& raw, const KeyRule& rule, const std::string& where) {
  const std::string t = trim(raw);
  if (rule.type == "call") return t;
  if (rule.type == "string_list") {
    if (t.size() < 2 || t.front() != '[' || t.back() != ']') throw InputError(where + ": expected a list");
    json out = json::array();
    std::string inner = t.substr(1, t.size() - 2);
    std::istringstream in(inner);
    std::string item;
    while (std::getline(in, item, ',')) {
      item = trim(item);
      if (item.empty()) continue;
      out.push_back(json::parse(item, nullptr, false).is_string() ? json::parse(item).get<std::string>() : item);
    }
    return out;
  }
  if (!t.empty() && t.front() == '"') {
    json s = json::parse(t, nullptr, false);
    if (!s.is_string()) throw InputError(where + ": bad string " + t);
    return typed(s.get<std::string>(), rule, where);
  }
  return typed(t, rule, where);
}

void add(FlatDoc& doc, const std::string& key, json v, const std::string& where) {
  for (const auto& [k, _] : doc)
    if (k == key) throw InputError(where + ": key '" + key + "' given twice");
  doc.emplace_back(key, std::move(v));
}

// ---- JSON and YAML: nested by the dots of the keys.
json nest(const FlatDoc& doc) {
  json root = json::object();
  for (const auto& [key, v] : doc) {
    std::string pointer = "/" + key;
    for (char& ch : pointer)
      if (ch == '.') ch = '/';
    root[json::json_pointer(pointer)] = v;
  }
  return root;
}

void flatten_json(const json& j, const std::string& prefix, const FileTable& table, FlatDoc& out,
                  const std::string& source) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object() && !table.keys.count(key)) {
      flatten_json(*it, key, table, out, source);
    } else {
      rule_for(table, key, source);
      add(out, key, *it, source);
    }
  }
}

// Whether a YAML 1.1 reader (PyYAML's safe_load, which accelerate and torchtune's OmegaConf use) reads the plain
// scalar as something other than a string: a bool (yes/no/on/off/true/false), null, or a number (0-prefixed as
// octal: torchtune's max_filename "00004"). Those strings are written quoted.
bool yaml11_non_string(const std::string& v) {
  if (v.empty()) return true;
  std::string lower;
  for (char ch : v) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* word : {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"})
    if (lower == word) return true;
  bool numeric = true;
  for (char ch : v)
    numeric = numeric && (std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '+' ||
                          ch == 'e' || ch == 'E' || ch == '_' || ch == ':');
  return numeric &&
         std::any_of(v.begin(), v.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
}

void emit_yaml(YAML::Emitter& e, const json& j) {
  if (j.is_object()) {
    e << YAML::BeginMap;
    for (auto it = j.begin(); it != j.end(); ++it) {
      e << YAML::Key << it.key() << YAML::Value;
      emit_yaml(e, *it);
    }
    e << YAML::EndMap;
  } else if (j.is_array()) {
    e << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : j) emit_yaml(e, x);
    e << YAML::EndSeq;
  } else if (j.is_null()) {
    e << YAML::Null;
  } else if (j.is_string()) {
    const std::string v = j.get<std::string>();
    if (yaml11_non_string(v))
      e << YAML::DoubleQuoted << v;
    else
      e << v;
  } else if (j.is_boolean()) {
    e << j.get<bool>();
  } else if (j.is_number_integer()) {
    e << j.get<long long>();
  } else {
    e << literal(j, false);
  }
}

void flatten_yaml(const YAML::Node& n, const std::string& prefix, const FileTable& table, FlatDoc& out,
                  const std::string& source) {
  for (const auto& kv : n) {
    const std::string where = source + ":" + std::to_string(kv.first.Mark().line + 1);
    if (!kv.first.IsScalar()) throw InputError(where + ": a key must be a plain name");
    const std::string key = prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>();
    if (kv.second.IsMap()) {
      flatten_yaml(kv.second, key, table, out, source);
      continue;
    }
    const KeyRule& rule = rule_for(table, key, where);
    if (kv.second.IsSequence()) {
      json list = json::array();
      for (const auto& x : kv.second) {
        if (!x.IsScalar()) throw InputError(where + ": " + key + ": expected a list of names");
        list.push_back(x.as<std::string>());
      }
      add(out, key, list, where);
    } else if (kv.second.IsNull()) {
      if (!rule.nullable) throw InputError(where + ": " + key + " must not be null");
      add(out, key, nullptr, where);
    } else {
      add(out, key, typed(kv.second.as<std::string>(), rule, where + ": " + key), where);
    }
  }
}

}  // namespace

void check_against_table(const FlatDoc& doc, const FileTable& table, const std::string& spec_path) {
  for (const auto& [key, v] : doc) {
    const std::string where = spec_path + ": " + table.name;
    const KeyRule& rule = rule_for(table, key, where);
    if (v.is_null() && rule.nullable) continue;
    if (!type_matches(v, rule.type))
      throw InputError(where + ": key '" + key + "' = " + v.dump() + " is not of type " + rule.type);
    if (!rule.values.empty()) {
      auto texts = v.is_array() ? std::vector<json>(v.begin(), v.end()) : std::vector<json>{v};
      for (const json& x : texts)
        if (std::find(rule.values.begin(), rule.values.end(), value_text(x)) == rule.values.end())
          throw InputError(where + ": key '" + key + "' = " + value_text(x) + " is not one of its allowed values");
    }
    if (rule.min && v.is_number() && v.get<double>() < *rule.min)
      throw InputError(where + ": key '" + key + "' = " + v.dump() + " is below its minimum");
  }
}

std::string render_file(const WrittenFile& f, const FileTable& table) {
  std::ostringstream o;
  if (table.format == "toml") {
    for (const auto& h : f.header) o << "# " << h << "\n";
    std::string current = "\x01";
    for (const auto& [key, v] : f.keys) {
      const auto dot = key.rfind('.');
      const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
      if (section != current) {
        o << (section.empty() ? "" : "\n[" + section + "]\n");
        current = section;
      }
      o << key.substr(dot == std::string::npos ? 0 : dot + 1) << " = " << literal(v, false) << "\n";
    }
  } else if (table.format == "python") {
    for (const auto& h : f.header) o << h << "\n";
    for (const auto& [key, v] : f.keys) {
      const std::string text = table.keys.at(key).type == "call" ? v.get<std::string>() : literal(v, true);
      o << "    " << (key == "config" ? "config" : "config." + key) << " = " << text << "\n";
    }
    o << "    return config\n";
  } else if (table.format == "json") {
    o << nest(f.keys).dump(2) << "\n";
  } else if (table.format == "yaml") {
    for (const auto& h : f.header) o << "# " << h << "\n";
    YAML::Emitter e;
    emit_yaml(e, nest(f.keys));
    o << e.c_str() << "\n";
  } else if (table.format == "args") {
    for (const auto& h : f.header) o << h << "\n";
    for (size_t i = 0; i < f.keys.size(); ++i) {
      const auto& [key, v] = f.keys[i];
      o << "    --" << key;
      if (v.is_array()) {
        for (const auto& x : v) o << " " << shell_word(x);
      } else {
        o << " " << shell_word(v);
      }
      o << (i + 1 < f.keys.size() ? " \\\n" : "\n");
    }
  }
  return o.str();
}

FlatDoc parse_file(const std::string& text, const FileTable& table, const std::string& source) {
  FlatDoc out;
  if (table.format == "json") {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw InputError(source + ": not a JSON object");
    flatten_json(j, "", table, out, source);
  } else if (table.format == "yaml") {
    YAML::Node n;
    try {
      n = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw InputError(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
    }
    if (!n.IsMap()) throw InputError(source + ": not a YAML mapping");
    flatten_yaml(n, "", table, out, source);
  } else {
    std::istringstream in(text);
    std::string line, section;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      const std::string where = source + ":" + std::to_string(lineno);
      std::string t = trim(line);
      if (t.empty() || t[0] == '#') continue;
      if (table.format == "toml") {
        if (t.front() == '[') {
          if (t.back() != ']') throw InputError(where + ": bad table header");
          section = t.substr(1, t.size() - 2);
          continue;
        }
        const auto eq = t.find('=');
        if (eq == std::string::npos) throw InputError(where + ": expected key = value");
        const std::string key = (section.empty() ? "" : section + ".") + trim(t.substr(0, eq));
        add(out, key, read_literal(t.substr(eq + 1), rule_for(table, key, where), where + ": " + key), where);
      } else if (table.format == "python") {
        if (t.rfind("config", 0) != 0 || t.find(" = ") == std::string::npos) continue;  // imports, def, return
        const auto eq = t.find(" = ");
        std::string key = t.substr(0, eq);
        key = key == "config" ? key : key.substr(std::string("config.").size());
        add(out, key, read_literal(t.substr(eq + 3), rule_for(table, key, where), where + ": " + key), where);
      } else if (table.format == "args") {
        if (t.rfind("--", 0) != 0) continue;  // the command and its environment
        if (t.size() >= 2 && t.substr(t.size() - 2) == " \\") t = trim(t.substr(0, t.size() - 2));
        std::istringstream words(t.substr(2));
        std::string key, w;
        words >> key;
        std::vector<std::string> values;
        while (words >> w) values.push_back(unquoted_word(w));
        const KeyRule& rule = rule_for(table, key, where);
        if (rule.type == "string_list") {
          add(out, key, json(values), where);
        } else {
          if (values.size() != 1) throw InputError(where + ": --" + key + " takes one value");
          add(out, key, typed(values[0], rule, where + ": --" + key), where);
        }
      }
    }
  }
  check_against_table(out, table, source);
  return out;
}

bool doc_has(const FlatDoc& doc, const std::string& key) {
  for (const auto& [k, _] : doc)
    if (k == key) return true;
  return false;
}

const nlohmann::json& doc_get(const FlatDoc& doc, const std::string& key, const std::string& source) {
  for (const auto& [k, v] : doc)
    if (k == key) return v;
  throw InputError(source + ": key '" + key + "' is missing");
}

}  // namespace fsdp
