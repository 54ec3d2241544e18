#include "export/target_spec.hpp"

#include <algorithm>
#include <filesystem>

#include "core/config_map.hpp"
#include "core/errors.hpp"
#include "export/knob_table.hpp"

namespace fsdp {

namespace {

namespace fs = std::filesystem;

fs::path targets_dir(const std::string& config_root) { return fs::path(config_root) / "configs" / "targets"; }

bool is_commit(const std::string& c) {
  return c.size() == 40 &&
         std::all_of(c.begin(), c.end(), [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); });
}

// A citation map: `path` required, `repository` and `commit` default to the enclosing citation's.
Citation read_citation(ConfigMap m, const Citation* parent) {
  Citation c;
  c.repository = m.has("repository") || !parent ? m.get_string("repository") : parent->repository;
  c.commit = m.has("commit") || !parent ? m.get_string("commit") : parent->commit;
  c.path = m.get_string("path");
  if (!is_commit(c.commit)) m.fail("commit", "'" + c.commit + "' is not a 40-digit lowercase hex commit");
  if (c.repository.find('/') == std::string::npos) m.fail("repository", "expected owner/name");
  m.finish();
  return c;
}

Citation citation_or(ConfigMap& m, const std::string& key, const Citation& parent) {
  return m.has(key) ? read_citation(m.get_map(key), &parent) : parent;
}

const std::vector<std::string> kKeyTypes{"int", "float", "bool", "string", "string_list", "call"};

// A capabilities map (the target's, or one model's): knob[@kind,kind] -> values, nearest, together, why, source.
std::vector<KnobRule> read_capabilities(ConfigMap caps, const Citation& fallback) {
  std::vector<KnobRule> out;
  for (const std::string& knob : caps.keys()) {
    ConfigMap c = caps.get_map(knob);
    KnobRule r;
    r.knob = knob.substr(0, knob.find('@'));
    if (knob.find('@') != std::string::npos) {
      std::string kinds = knob.substr(knob.find('@') + 1) + ",", cur;
      for (char ch : kinds) {
        if (ch != ',') {
          cur += ch;
          continue;
        }
        StrategyKind k{};
        if (!parse_strategy_kind(cur, k)) caps.fail(knob, "'" + cur + "' is not a strategy kind");
        r.kinds.push_back(k);
        cur.clear();
      }
    }
    r.values = c.get_string_list("values");
    if (r.values.empty()) c.fail("values", "must list at least one value");
    if (c.has("nearest")) {
      ConfigMap n = c.get_map("nearest");
      for (const std::string& from : n.keys()) r.nearest[from] = n.get_string(from);
      n.finish();
    }
    if (c.has("together")) {
      YAML::Node groups = c.take_raw("together");
      if (!groups.IsSequence()) c.fail("together", "expected a list of module lists");
      for (const auto& g : groups) {
        if (!g.IsSequence()) c.fail("together", "expected a list of module lists");
        std::vector<std::string> group;
        for (const auto& m : g) group.push_back(m.as<std::string>());
        r.together.push_back(group);
      }
    }
    const Knob* k = find_knob(r.knob);
    if (!k) {
      std::string known;
      for (const Knob& kn : knob_table()) known += (known.empty() ? "" : ", ") + std::string(kn.name);
      caps.fail(knob, "unknown knob '" + r.knob + "' (known: " + known + ")");
    }
    // Every concrete value must be one fsdp-plan can set (patterns every:N, size:N, fraction:P and any match
    // values).
    auto check_value = [&](const std::string& v, const std::string& key) {
      if (v == "any" || v == "every:N" || v == "size:N" || v == "fraction:P") return;
      Strategy probe;
      probe.method = Method::Lora;
      if (!k->set(probe, v, Cluster{2, 8})) c.fail(key, "'" + v + "' is not a value of " + r.knob);
    };
    for (const auto& v : r.values) check_value(v, "values");
    for (const auto& [from, to] : r.nearest) check_value(to, "nearest");
    r.why = c.get_string("why");
    r.source = citation_or(c, "source", fallback);
    c.finish();
    out.push_back(r);
  }
  caps.finish();
  return out;
}

}  // namespace

const KnobRule* TargetSpec::rule(const std::string& knob, StrategyKind kind) const {
  const KnobRule* plain = nullptr;
  for (const KnobRule& r : capabilities) {
    if (r.knob != knob) continue;
    if (r.kinds.empty()) {
      plain = &r;
    } else if (std::find(r.kinds.begin(), r.kinds.end(), kind) != r.kinds.end()) {
      return &r;
    }
  }
  return plain;
}

TargetSpec TargetSpec::for_model(const std::string& zoo_name) const {
  TargetSpec t = *this;
  auto it = model_overrides.find(zoo_name);
  if (it == model_overrides.end()) return t;
  const ModelOverrides& o = it->second;
  if (!o.runtime.empty()) t.runtime = o.runtime;
  for (const KnobRule& r : o.capabilities) {
    // The model's rule takes the place of the target's for the same knob and kinds.
    std::erase_if(t.capabilities, [&](const KnobRule& x) { return x.knob == r.knob && x.kinds == r.kinds; });
    t.capabilities.push_back(r);
  }
  t.model_overrides.clear();
  return t;
}

const FileTable& TargetSpec::file(const std::string& name) const {
  for (const FileTable& f : files)
    if (f.name == name) return f;
  FSDP_ASSERT(false, "target " + target + " " + version + " writes '" + name + "' without a key table");
  return files.front();
}

const std::map<std::string, std::string>* TargetSpec::model(const std::string& zoo_name) const {
  auto it = models.find(zoo_name);
  return it == models.end() ? nullptr : &it->second;
}

std::vector<std::string> target_names(const std::string& config_root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(targets_dir(config_root), ec))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> target_versions(const std::string& config_root, const std::string& target) {
  const std::vector<std::string> names = target_names(config_root);
  if (std::find(names.begin(), names.end(), target) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw InputError("unknown target '" + target + "' (known: " + known + ")");
  }
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(targets_dir(config_root) / target))
    if (e.path().extension() == ".yaml") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

TargetSpec load_target_spec(const std::string& config_root, const std::string& target, const std::string& version) {
  const std::vector<std::string> versions = target_versions(config_root, target);
  std::string chosen = version;
  if (chosen.empty()) {
    for (const auto& v : versions) {
      ConfigMap probe = ConfigMap::load_file((targets_dir(config_root) / target / (v + ".yaml")).string());
      if (probe.has("default") && probe.get_bool("default")) chosen = v;
    }
    FSDP_ASSERT(!chosen.empty(), "configs/targets/" + target + " marks no version default: true");
  } else if (std::find(versions.begin(), versions.end(), chosen) == versions.end()) {
    std::string known;
    for (const auto& v : versions) known += (known.empty() ? "" : ", ") + v;
    throw InputError("--target-version: " + target + " has no version '" + chosen + "' (known: " + known + ")");
  }
  TargetSpec t;
  t.spec_path = (targets_dir(config_root) / target / (chosen + ".yaml")).string();
  ConfigMap root = ConfigMap::load_file(t.spec_path);
  t.target = root.get_string("target");
  t.version = root.get_string("version");
  if (t.target != target) root.fail("target", "'" + t.target + "' but the file is under " + target + "/");
  if (t.version != chosen) root.fail("version", "'" + t.version + "' but the file is " + chosen + ".yaml");
  t.is_default = root.get_bool("default");
  t.writes_for = root.get_string("writes_for");
  t.source = read_citation(root.get_map("source"), nullptr);
  {
    ConfigMap rt = root.get_map("runtime");
    t.runtime = rt.get_string("name");
    t.runtime_why = rt.get_string("why");
    t.runtime_source = citation_or(rt, "source", t.source);
    rt.finish();
  }
  t.capabilities = read_capabilities(root.get_map("capabilities"), t.source);
  {
    ConfigMap files = root.get_map("files");
    for (const std::string& name : files.keys()) {
      ConfigMap f = files.get_map(name);
      FileTable ft;
      ft.name = name;
      ft.format = f.get_enum("format", {"toml", "python", "json", "yaml", "args", "hostfile"});
      const Citation file_source = citation_or(f, "source", t.source);
      ConfigMap keys = f.get_map("keys");
      for (const std::string& key : keys.keys()) {
        ConfigMap k = keys.get_map(key);
        KeyRule kr;
        kr.type = k.get_enum("type", kKeyTypes);
        if (k.has("values")) kr.values = k.get_string_list("values");
        if (k.has("min")) kr.min = k.get_double("min");
        if (k.has("nullable")) kr.nullable = k.get_bool("nullable");
        kr.source = citation_or(k, "source", file_source);
        k.finish();
        ft.keys[key] = kr;
      }
      keys.finish();
      f.finish();
      t.files.push_back(ft);
    }
    files.finish();
  }
  if (root.has("models")) {
    ConfigMap models = root.get_map("models");
    t.models_source = citation_or(models, "source", t.source);
    if (models.has("accepts_path")) t.models_accept_path = models.get_bool("accepts_path");
    for (const std::string& zoo : models.keys()) {
      if (zoo == "source" || zoo == "accepts_path") continue;
      ConfigMap m = models.get_map(zoo);
      for (const std::string& field : m.keys()) {
        if (field == "runtime") {
          t.model_overrides[zoo].runtime = m.get_string(field);
        } else if (field == "capabilities") {
          t.model_overrides[zoo].capabilities = read_capabilities(m.get_map(field), t.models_source);
        } else {
          t.models[zoo][field] = m.get_string(field);
        }
      }
      m.finish();
    }
    models.finish();
  }
  root.finish();
  return t;
}

}  // namespace fsdp
