#include "export/target_table.hpp"

#include "export/knob_table.hpp"
#include "export/target_spec.hpp"

namespace fsdp {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

void add_unique(std::vector<std::string>& v, const std::string& x) {
  for (const auto& y : v)
    if (y == x) return;
  v.push_back(x);
}

// Markdown table cells: pipes escaped, one line.
std::string cell(std::string s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|')
      out += "\\|";
    else if (ch == '\n')
      out += ' ';
    else
      out += ch;
  }
  return out;
}

std::string rule_name(const KnobRule& r) {
  if (r.kinds.empty()) return r.knob;
  std::vector<std::string> kinds;
  for (StrategyKind k : r.kinds) kinds.push_back(to_string(k));
  return r.knob + " (" + join(kinds) + ")";
}

}  // namespace

std::string targets_markdown(const std::string& config_root) {
  std::string o;
  for (const auto& t : target_names(config_root)) {
    for (const auto& v : target_versions(config_root, t)) {
      const TargetSpec spec = load_target_spec(config_root, t, v);
      o += "#### `--target " + t +
           (spec.is_default ? "` (default version " + v + ")" : " --target-version " + v + "`") + "\n\n";
      o += "Writes for " + spec.writes_for + "; predicted with runtime `" + spec.runtime + "`. Files: ";
      std::vector<std::string> files;
      for (const FileTable& f : spec.files)
        files.push_back("`" + f.name + "` (" + f.format + ", " + std::to_string(f.keys.size()) + " keys)");
      o += (files.empty() ? std::string("`plan.yaml`") : join(files)) + ", `launch.sh`.\n\n";
      o += "| knob | expresses | does not express | why (source: " + spec.source.repository + "@" +
           spec.source.commit.substr(0, 12) + ") |\n| --- | --- | --- | --- |\n";
      for (const KnobRule& r : spec.capabilities) {
        std::vector<std::string> yes, no;
        for (const auto& val : r.values) add_unique(yes, sample_label(r.knob, val));
        for (const auto& sample : knob_samples(r.knob))
          if (!rule_admits(r, sample)) add_unique(no, sample_label(r.knob, sample));
        o += "| " + cell(rule_name(r)) + " | " + cell(join(yes)) + " | " + cell(no.empty() ? "-" : join(no)) + " | " +
             cell(r.why) + " (" + cell(r.source.path) + ") |\n";
      }
      if (!spec.models.empty()) {
        std::vector<std::string> names;
        for (const auto& [zoo, _] : spec.models) names.push_back("`" + zoo + "`");
        o += "\nModels (" + spec.models_source.path + "): " + join(names) + ".\n";
        for (const auto& [zoo, over] : spec.model_overrides) {
          o += "`" + zoo + "`:";
          if (!over.runtime.empty()) o += " predicted with runtime `" + over.runtime + "`;";
          for (const KnobRule& r : over.capabilities)
            o += " " + cell(rule_name(r)) + " " + cell(join(r.values)) + " only (" + cell(r.why) + ", " +
                 cell(r.source.path) + ");";
          o.back() = '.';
          o += "\n";
        }
      }
      o += "\n";
    }
  }
  return o;
}

}  // namespace fsdp
