// A target framework's data (configs/targets/<target>/<version>.yaml): the release it writes for, the runtime
// profile that predicts it, which knob values it can express (capabilities) and the keys, types and allowed
// values of every file it writes (key tables), each cited (repository, path, commit). Read strictly: an unknown
// key is an InputError naming the file and the key.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strategy/strategy.hpp"

namespace fsdp {

struct Citation {
  std::string repository;  // owner/name on GitHub
  std::string path;        // file in that repository
  std::string commit;      // 40 hex digits
  std::string text() const { return repository + "@" + commit.substr(0, 12) + ":" + path; }
};

// One knob's expressible values. `values` are the knob's text names (knob_table.hpp); "every:N" and "size:N"
// match any N, "any" matches every value. `nearest` maps a value the target cannot express to the one the nearest
// plan takes (absent: the first of `values`). `together` (lora_targets): modules the target adapts all or none.
// A capability named `knob@kind,kind` holds for plans of those strategy kinds only, before the plain `knob` rule.
struct KnobRule {
  std::string knob;
  std::vector<StrategyKind> kinds;  // empty: every kind
  std::vector<std::string> values;
  std::map<std::string, std::string> nearest;
  std::vector<std::vector<std::string>> together;
  std::string why;
  Citation source;
};

// One key a written file may hold: its type (int, float, bool, string, string_list, call) and, where closed, its
// allowed values (as text) or its minimum.
struct KeyRule {
  std::string type;
  std::vector<std::string> values;
  std::optional<double> min;
  bool nullable = false;  // null (None) is a value too, e.g. torchtune's max_steps_per_epoch
  Citation source;
};

struct FileTable {
  std::string name;                     // the written file's name, e.g. job.toml
  std::string format;                   // toml, python, json, yaml, args (a command line), hostfile
  std::map<std::string, KeyRule> keys;  // dotted key path -> rule
};

struct TargetSpec {
  std::string target;
  std::string version;
  bool is_default = false;
  std::string writes_for;  // the release, in words
  std::string runtime;     // configs/runtimes/NAME.yaml that predicts it
  std::string runtime_why;
  Citation runtime_source;
  Citation source;  // the release's commit
  std::vector<KnobRule> capabilities;
  std::vector<FileTable> files;
  // zoo model name -> the target's fields for it (a torchtitan flavor, a Hugging Face id, a torchtune builder).
  std::map<std::string, std::map<std::string, std::string>> models;
  Citation models_source;
  std::string spec_path;

  bool models_accept_path = false;  // a Hugging Face model directory is named as is (accelerate, swift, ...)

  // What a models-table entry says of its model beyond the names a writer needs (its `runtime` and `capabilities`
  // keys): the runtime profile that predicts the model on this target where the target implements that family
  // otherwise than the target's runtime describes (torchtitan's Qwen3 rotates with rotate_half, its Llama 3 with
  // complex numbers), and knob rules that hold for that model alone (torchtitan v0.2.2 pipelines no Qwen3).
  struct ModelOverrides {
    std::string runtime;                 // empty: the target's
    std::vector<KnobRule> capabilities;  // each replaces the target's rule of the same knob and kinds
  };
  std::map<std::string, ModelOverrides> model_overrides;

  // This target as it plans and writes `zoo_name`: its runtime and knob rules with the model's entry applied (the
  // target itself for a model without one). Planning, export and the nearest plan all read this.
  TargetSpec for_model(const std::string& zoo_name) const;

  // The rule for `knob` on a plan of `kind` (a kind-specific rule first), or null: the target does not restrict it.
  const KnobRule* rule(const std::string& knob, StrategyKind kind) const;
  const FileTable& file(const std::string& name) const;  // assertion: the writer names only its own files
  const std::map<std::string, std::string>* model(const std::string& zoo_name) const;
};

// The targets under config_root/configs/targets (directory names), sorted.
std::vector<std::string> target_names(const std::string& config_root);
// The versions of one target (its file stems), sorted; InputError for an unknown target.
std::vector<std::string> target_versions(const std::string& config_root, const std::string& target);
// `version` empty: the file marked `default: true`. InputError naming the target or version and the known ones.
TargetSpec load_target_spec(const std::string& config_root, const std::string& target, const std::string& version);

}  // namespace fsdp
