// Reading model descriptions: a zoo name or alias ("70b", "llama3-8b"), a path
// to a zoo-style YAML file, or a path to a Hugging Face config.json.
#pragma once

#include <string>
#include <vector>

#include "core/config_map.hpp"
#include "model/model_spec.hpp"

namespace fsdp {

// Strict parse of a model mapping (configs/models schema; see configs/models/README.md).
// Reads every key and calls finish() (unknown keys are errors).
ModelSpec parse_model_map(ConfigMap& map);
// Writes a ModelSpec back in the same schema (used by plan.yaml to embed the model).
void emit_model_map(const ModelSpec& spec, YAML::Emitter& out);

// A model and what its reader wants the user to know: the keys that took a transformers default, and the keys
// that change memory or time but are not modelled (configs/models/README.md, "Reading a Hugging Face config.json").
struct LoadedModel {
  ModelSpec spec;
  std::vector<std::string> warnings;
};

// Parse a Hugging Face config.json text (the architectures of configs/models/README.md).
LoadedModel read_hf_config(const std::string& json_text, const std::string& source_name);
// The same, for callers that need only the shape (tests, the fuzzer): the warnings are not returned.
ModelSpec parse_hf_config(const std::string& json_text, const std::string& source_name);

struct ZooEntry {
  std::string name;
  std::vector<std::string> aliases;
  std::string path;
};

// The zoo: configs/models/*.yaml under config_root; aliases from configs/models/aliases.yaml.
std::vector<ZooEntry> list_zoo(const std::string& config_root);

// name, alias, YAML path, config.json path or a model directory (its config.json) -> the model and its
// reader's warnings. InputError on anything unknown; a hub id ("Qwen/Qwen3-8B") that is not a local path is
// refused with a message saying there is no network here.
LoadedModel load_model_with_warnings(const std::string& name_or_path, const std::string& config_root);
// The Hugging Face model directory `name_or_path` names, absolute: the directory itself, or the one holding a
// config.json given by path; empty for a zoo name, a YAML model file or anything else. Launchers whose loaders take a
// local path (from_pretrained, swift's --model) load the model from it (PlanFile::model_path).
std::string hf_model_directory(const std::string& name_or_path);
// The same, printing each warning on stderr ("fsdp-plan: warning: ...").
ModelSpec load_model(const std::string& name_or_path, const std::string& config_root);

// Semantic checks shared by all readers (heads divide hidden, kv heads divide heads, ...).
void validate_model(const ModelSpec& spec, const std::string& source);

}  // namespace fsdp
