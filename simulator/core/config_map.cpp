#include "core/config_map.hpp"

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/duplicate_keys.hpp"
#include "core/errors.hpp"
#include "core/unit_parse.hpp"

namespace fsdp {

ConfigMap ConfigMap::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_string(ss.str(), path);
}

ConfigMap ConfigMap::load_string(const std::string& text, const std::string& source_name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(source_name + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw InputError(source_name + ":1: expected a YAML mapping at the top level");
  reject_duplicate_yaml_keys(root, source_name);
  return ConfigMap(root, source_name, "");
}

ConfigMap::ConfigMap(YAML::Node node, std::string source, std::string key_path)
    : node_(std::move(node)), source_(std::move(source)), path_(std::move(key_path)) {}

std::string ConfigMap::key_path(const std::string& key) const { return join_key_path(path_, key); }

int ConfigMap::line_of(const std::string& key) const {
  if (!key.empty() && node_.IsMap()) {
    for (auto it = node_.begin(); it != node_.end(); ++it)
      if (it->first.Scalar() == key) return it->first.Mark().line + 1;
  }
  int line = node_.Mark().line;
  return line < 0 ? 1 : line + 1;
}

void ConfigMap::fail(const std::string& key, const std::string& message) const {
  throw InputError(source_ + ":" + std::to_string(line_of(key)) + ": key '" + key_path(key) + "': " + message);
}

void ConfigMap::fail_here(const std::string& message) const {
  int line = node_.Mark().line;
  std::string where = path_.empty() ? "" : " in '" + path_ + "'";
  throw InputError(source_ + ":" + std::to_string(line < 0 ? 1 : line + 1) + where + ": " + message);
}

bool ConfigMap::has(const std::string& key) const { return node_.IsMap() && node_[key].IsDefined(); }

YAML::Node ConfigMap::require(const std::string& key) {
  if (!node_.IsMap()) fail_here("expected a mapping");
  YAML::Node n = node_[key];
  if (!n.IsDefined()) fail(key, "missing (required)");
  consumed_.insert(key);
  return n;
}

std::string ConfigMap::scalar(const std::string& key) {
  YAML::Node n = require(key);
  if (!n.IsScalar()) fail(key, "expected a single value");
  return n.Scalar();
}

std::string ConfigMap::get_string(const std::string& key) {
  std::string s = scalar(key);
  if (s.empty()) fail(key, "must not be empty");
  return s;
}

int64_t ConfigMap::get_int(const std::string& key) {
  std::string s = scalar(key);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) fail(key, "expected an integer, got '" + s + "'");
  return v;
}

int64_t ConfigMap::get_positive_int(const std::string& key) {
  int64_t v = get_int(key);
  if (v <= 0) fail(key, "must be positive, got " + std::to_string(v));
  return v;
}

double ConfigMap::get_double(const std::string& key) {
  std::string s = scalar(key);
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v))
    fail(key, "expected a number, got '" + s + "'");
  return v;
}

double ConfigMap::get_positive_double(const std::string& key) {
  double v = get_double(key);
  if (!(v > 0)) fail(key, "must be positive, got " + std::to_string(v));
  return v;
}

bool ConfigMap::get_bool(const std::string& key) {
  std::string s = scalar(key);
  if (s == "true") return true;
  if (s == "false") return false;
  fail(key, "expected true or false, got '" + s + "'");
}

Bytes ConfigMap::get_bytes(const std::string& key) {
  std::string s = scalar(key);
  auto v = parse_bytes(s);
  if (!v) fail(key, "expected a size with a unit such as '80 GiB' or '512 MB', got '" + s + "'");
  if (v->value < 0) fail(key, "must not be negative");
  return *v;
}

BytesPerSecond ConfigMap::get_bandwidth(const std::string& key) {
  std::string s = scalar(key);
  auto v = parse_bandwidth(s);
  if (!v) fail(key, "expected a bandwidth with a unit such as '300 GB/s' or '200 Gb/s', got '" + s + "'");
  if (!(v->value > 0)) fail(key, "bandwidth must be positive, got '" + s + "'");
  return *v;
}

Seconds ConfigMap::get_duration(const std::string& key) {
  std::string s = scalar(key);
  auto v = parse_duration(s);
  if (!v) fail(key, "expected a duration with a unit such as '2 us' or '5 ms', got '" + s + "'");
  if (v->value < 0) fail(key, "must not be negative");
  return *v;
}

FlopsPerSecond ConfigMap::get_flops_rate(const std::string& key) {
  std::string s = scalar(key);
  auto v = parse_flops_rate(s);
  if (!v) fail(key, "expected a FLOP rate with a unit such as '312 TFLOP/s', got '" + s + "'");
  if (!(v->value > 0)) fail(key, "must be positive, got '" + s + "'");
  return *v;
}

std::string ConfigMap::get_enum(const std::string& key, const std::vector<std::string>& allowed) {
  std::string s = scalar(key);
  for (const auto& a : allowed)
    if (a == s) return s;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  fail(key, "'" + s + "' is not one of: " + list);
}

ConfigMap ConfigMap::get_map(const std::string& key) {
  YAML::Node n = require(key);
  if (!n.IsMap()) fail(key, "expected a mapping");
  return ConfigMap(n, source_, key_path(key));
}

std::vector<ConfigMap> ConfigMap::get_list_of_maps(const std::string& key) {
  YAML::Node n = require(key);
  if (!n.IsSequence()) fail(key, "expected a list");
  std::vector<ConfigMap> out;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsMap()) fail(key, "item " + std::to_string(i) + " is not a mapping");
    out.emplace_back(n[i], source_, key_path(key) + "[" + std::to_string(i) + "]");
  }
  return out;
}

std::vector<double> ConfigMap::get_double_list(const std::string& key) {
  YAML::Node n = require(key);
  if (!n.IsSequence()) fail(key, "expected a list of numbers");
  std::vector<double> out;
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string& s = n[i].Scalar();
    double v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (!n[i].IsScalar() || ec != std::errc() || p != s.data() + s.size())
      fail(key, "item " + std::to_string(i) + " is not a number");
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> ConfigMap::get_string_list(const std::string& key) {
  YAML::Node n = require(key);
  if (!n.IsSequence()) fail(key, "expected a list");
  std::vector<std::string> out;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar()) fail(key, "item " + std::to_string(i) + " is not a single value");
    out.push_back(n[i].Scalar());
  }
  return out;
}

std::vector<std::string> ConfigMap::keys() const {
  std::vector<std::string> out;
  if (node_.IsMap())
    for (auto it = node_.begin(); it != node_.end(); ++it) out.push_back(it->first.Scalar());
  return out;
}

YAML::Node ConfigMap::take_raw(const std::string& key) { return require(key); }

void ConfigMap::finish() const {
  if (!node_.IsMap()) return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string& k = it->first.Scalar();
    if (!consumed_.count(k))
      throw InputError(source_ + ":" + std::to_string(it->first.Mark().line + 1) + ": unknown key '" + key_path(k) +
                       "'");
  }
}

}  // namespace fsdp
