#include "export/target.hpp"

#include <filesystem>

#include "core/errors.hpp"
#include "export/knob_table.hpp"

namespace fsdp {

// One per target file.
const Target& fsdp_run_target();
const Target& torchtitan_target();
const Target& deepspeed_target();
const Target& accelerate_target();
const Target& swift_target();
const Target& torchtune_target();

const Target& target_by_name(const std::string& name) {
  const Target* all[] = {&fsdp_run_target(),   &torchtitan_target(), &deepspeed_target(),
                         &accelerate_target(), &swift_target(),      &torchtune_target()};
  std::string known;
  for (const Target* t : all) {
    if (t->name() == name) return *t;
    known += (known.empty() ? "" : ", ") + t->name();
  }
  throw InputError("unknown target '" + name + "' (known: " + known + ")");
}

std::map<std::string, std::string> target_model(const TargetSpec& spec, const std::string& model_name,
                                                const std::string& model_path) {
  if (const auto* m = spec.model(model_name)) return *m;
  // A target without a models table (fsdp-run) carries the model itself: plan.yaml embeds its description.
  if (spec.models.empty() && !spec.models_accept_path) return {{"name", model_name}};
  // A model read from a config.json is named by its _name_or_path (a hub id) or its path: the Hugging Face loaders
  // take either as is.
  const bool is_path = model_name.find('/') != std::string::npos;
  if (is_path && spec.models_accept_path) {
    std::string dir = model_name;
    const std::string cfg = "/config.json";
    if (dir.size() > cfg.size() && dir.compare(dir.size() - cfg.size(), cfg.size(), cfg) == 0)
      dir.resize(dir.size() - cfg.size());
    return {{"hf_id", dir}};
  }
  // A model directory (or its config.json) without _name_or_path, named after the directory: its path.
  if (spec.models_accept_path && !model_path.empty()) return {{"hf_id", model_path}};
  std::string known;
  for (const auto& [k, _] : spec.models) known += (known.empty() ? "" : ", ") + k;
  // Another version of the target that names it (configs/targets/<target>/ beside this file); a sibling that does not
  // load gives no hint rather than another error.
  std::string elsewhere;
  if (!spec.spec_path.empty()) {
    const std::filesystem::path dir = std::filesystem::path(spec.spec_path).parent_path();
    const std::string config_root = dir.parent_path().parent_path().parent_path().string();
    try {
      for (const std::string& v : target_versions(config_root, spec.target))
        if (v != spec.version && load_target_spec(config_root, spec.target, v).model(model_name) != nullptr)
          elsewhere += (elsewhere.empty() ? "; --target-version " : " or ") + v;
    } catch (const InputError&) {
      elsewhere.clear();
    }
  }
  if (!elsewhere.empty()) elsewhere += " names it";
  throw InputError(spec.spec_path + ": models: " + spec.target + " " + spec.version + " has no name for model '" +
                   model_name + "' (it names: " + known +
                   (spec.models_accept_path
                        ? "; or the model's Hugging Face directory or config.json as --model, or a config.json whose "
                          "_name_or_path is its hub id"
                        : "") +
                   elsewhere + ")");
}

Strategy Target::read(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster) const {
  Strategy s = read_files(dir, spec, cluster);
  apply_fixed_knobs(spec, s, Cluster{cluster.nodes, cluster.gpus_per_node});
  return s;
}

void apply_fixed_knobs(const TargetSpec& spec, Strategy& s, const Cluster& c) {
  for (const Knob& k : knob_table()) {
    const KnobRule* r = spec.rule(k.name, s.kind);
    if (!r || r->values.size() != 1 || !k.applies(s)) continue;
    const std::string& v = r->values.front();
    if (v == "any" || v == "every:N" || v == "size:N" || v == "fraction:P") continue;
    if (!rule_admits(*r, k.value(s, c))) k.set(s, v, c);
  }
}

std::string hf_model_dir(const std::string& hf_id) {
  if (!hf_id.empty() && hf_id.front() == '/') return hf_id;  // already a local directory
  const auto slash = hf_id.rfind('/');
  return "/tmp/" + (slash == std::string::npos ? hf_id : hf_id.substr(slash + 1));
}

std::string shell_header(const TargetSpec& spec) {
  return "#!/bin/sh\n# Written by fsdp-plan for " + spec.writes_for + "; keys read from " + spec.source.repository +
         "@" + spec.source.commit.substr(0, 12) + ".\nset -eu\n";
}

}  // namespace fsdp
