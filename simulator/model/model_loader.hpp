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

// Parse a Hugging Face config.json text (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, QWenLMHeadModel, MixtralForCausalLM, GPT2LMHeadModel).
ModelSpec parse_hf_config(const std::string& json_text, const std::string& source_name);

struct ZooEntry {
  std::string name;
  std::vector<std::string> aliases;
  std::string path;
};

// The zoo: configs/models/*.yaml under config_root; aliases from configs/models/aliases.yaml.
std::vector<ZooEntry> list_zoo(const std::string& config_root);

// name, alias, YAML path or config.json path -> ModelSpec. InputError on anything unknown.
ModelSpec load_model(const std::string& name_or_path, const std::string& config_root);

// Semantic checks shared by all readers (heads divide hidden, kv heads divide heads, ...).
void validate_model(const ModelSpec& spec, const std::string& source);

}  // namespace fsdp
