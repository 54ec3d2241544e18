// ms-swift (modelscope/ms-swift): `swift sft` over torchrun with DeepSpeed's ZeRO configs it ships (zero1, zero2,
// zero3 and their _offload variants). Its command line is its config: swift_sft.sh, typed by the key table. v3
// names the method --train_type, v4 --tuner_type.
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "export/export_plan.hpp"
#include "export/hf_script_args.hpp"
#include "export/knob_table.hpp"
#include "export/target.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

constexpr const char* kScript = "swift_sft.sh";

std::string method_key(const TargetSpec& spec) {
  return spec.file(kScript).keys.count("tuner_type") ? "tuner_type" : "train_type";
}

// ms-swift's ds_config names (swift/llm/ds_config, swift/config).
std::string ds_config(const Strategy& s) {
  const std::string stage = s.kind == StrategyKind::Zero1 ? "zero1" : s.kind == StrategyKind::Zero2 ? "zero2" : "zero3";
  return s.offload == Offload::None ? stage : stage + "_offload";
}

// The names a vision-language model's tower and aligner have (the target's models table, `vision_modules`).
std::vector<std::string> vision_modules(const std::map<std::string, std::string>& model, const TargetSpec& spec,
                                        const std::string& model_name) {
  const auto it = model.find("vision_modules");
  if (it == model.end())
    throw InputError(spec.spec_path + ": models: " + model_name +
                     " has no vision_modules: with LoRA and --train-vision none the export restricts the adapters to "
                     "the language model by the tower's and aligner's module names (plan it with --train-vision all, "
                     "or by a model the table names)");
  for (char c : it->second)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ',')
      throw InputError(spec.spec_path + ": models: " + model_name + ": vision_modules '" + it->second +
                       "' is not a comma-separated list of module names");
  return split(it->second, ',');
}

// PEFT full-matches a string target_modules against each module's qualified name
// (peft/tuners/tuners_utils.py check_target_module_exists): every module named one of `targets` that lies under no
// module named one of `excluded`, in either of Transformers' layouts (Qwen2.5-VL's tower is `visual` or
// `model.visual`).
constexpr const char* kRegexTargetsOpen = ").*\\.(";
std::string target_regex(const std::vector<std::string>& excluded, const std::vector<std::string>& targets) {
  return "^(?!(.*\\.)?(" + join(excluded, "|") + ")\\." + kRegexTargetsOpen + join(targets, "|") + ")$";
}

// The target names of a regex target_regex wrote, or an InputError naming the file and key.
std::vector<std::string> regex_targets(const std::string& regex) {
  const std::string open = kRegexTargetsOpen;
  const auto at = regex.rfind(open);
  const std::string close = ")$";
  if (at == std::string::npos || regex.size() < close.size() ||
      regex.compare(regex.size() - close.size(), close.size(), close) != 0)
    throw InputError(std::string(kScript) + ": target_regex '" + regex +
                     "' is not the form fsdp-plan writes (^(?!(.*\\.)?(EXCLUDED)\\.).*\\.(TARGETS)$)");
  return split(regex.substr(at + open.size(), regex.size() - close.size() - at - open.size()), '|');
}

class SwiftTarget final : public Target {
 public:
  std::string name() const override { return "swift"; }

  ExportResult write(const PlanFile& plan, const TargetSpec& spec) const override {
    const Strategy& s = plan.strategy;
    const auto model = target_model(spec, plan.model_name, plan.model_path);
    ExportResult r;
    WrittenFile f{kScript, {}, {}, "", true};
    f.header = {"#!/bin/sh", "# Written by fsdp-plan for " + spec.writes_for + ".",
                "# NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and NPROC_PER_NODE come from launch.sh.", "set -eu",
                "swift sft \\"};
    FlatDoc& d = f.keys;
    d.emplace_back("model", model.at("hf_id"));
    d.emplace_back(method_key(spec), s.method == Method::Lora ? "lora" : "full");
    if (s.method == Method::Lora) {
      d.emplace_back("lora_rank", s.lora.rank);
      d.emplace_back("lora_alpha", 2 * s.lora.rank);
      // With the vision side frozen the adapters stay in the language model: PEFT would match the names in the
      // tower too, which the plan prices without adapters (ms-swift's all-linear under freeze_vit does the same,
      // swift/utils/transformers_utils.py get_multimodal_target_regex).
      if (plan.model.vision && s.train_vision == VisionTraining::None)
        d.emplace_back("target_regex",
                       target_regex(vision_modules(model, spec, plan.model_name), s.lora.target_modules));
      else
        d.emplace_back("target_modules", s.lora.target_modules);
    }
    d.emplace_back("torch_dtype", s.param_dtype == DType::Bf16 ? "bfloat16" : "float32");
    d.emplace_back("attn_impl", s.attention == AttentionImpl::Flash    ? "flash_attn"
                                : s.attention == AttentionImpl::Flash3 ? "flash_attention_3"
                                : s.attention == AttentionImpl::Eager  ? "eager"
                                                                       : "sdpa");
    // ms-swift's max_length counts a sample's whole encoded sequence, its images' tokens too (the template expands
    // each image into them): the language model's sequence (language_model_strategy).
    d.emplace_back("max_length", s.seq_len + (plan.model.vision ? plan.model.vision->image_tokens : 0));
    d.emplace_back("packing", true);
    d.emplace_back("per_device_train_batch_size", s.micro_batch);
    d.emplace_back("gradient_accumulation_steps", s.grad_accum);
    d.emplace_back("gradient_checkpointing", s.act_ckpt == ActCkpt::Full);
    // Liger-Kernel (Strategy::kernels): Transformers' TrainingArguments use_liger_kernel, which ms-swift passes to the
    // Trainer (examples/train/liger/sft.sh '--use_liger_kernel true'); written where the plan patches it in.
    if (s.kernels == KernelLibrary::Liger) d.emplace_back("use_liger_kernel", true);
    // A vision-language model: what of its vision side trains, said either way (ms-swift freezes the tower and the
    // aligner unless told: TunerArguments freeze_vit, freeze_aligner).
    if (plan.model.vision) {
      d.emplace_back("freeze_vit", s.train_vision != VisionTraining::All);
      d.emplace_back("freeze_aligner", s.train_vision == VisionTraining::None);
    }
    d.emplace_back("deepspeed", ds_config(s));
    d.emplace_back("optim", "adamw_torch");
    d.emplace_back("learning_rate", plan.training.lr);
    d.emplace_back("weight_decay", plan.training.weight_decay);
    d.emplace_back("max_grad_norm", plan.training.grad_clip);
    d.emplace_back("dataset", std::vector<std::string>{"${DATASET}"});
    r.files.push_back(f);
    r.notes.push_back(
        "Set DATASET to your data set (a ModelScope / Hugging Face id or a path); --packing fills every "
        "sequence to max_length tokens, the plan's sequence.");
    r.notes.push_back("Run on every node with NODE_RANK set (0 on the node at MASTER_ADDR).");
    if (plan.model.vision)
      r.notes.push_back("The plan prices " + std::to_string(plan.model.vision->image_tokens) +
                        " image tokens a sample (--image-tokens): keep your images to that many (for Qwen2-VL's "
                        "dynamic resolution, --max_pixels caps an image at max_pixels / (28 x 28) tokens).");
    r.launch_command =
        "DATASET=\"${DATASET:?set DATASET to your data set}\" NNODES=" + std::to_string(plan.cluster.nodes) +
        " NODE_RANK=\"${NODE_RANK:-0}\" MASTER_ADDR=\"${MASTER_ADDR:-localhost}\" "
        "MASTER_PORT=\"${MASTER_PORT:-29500}\" NPROC_PER_NODE=" +
        std::to_string(plan.cluster.gpus_per_node) + " sh swift_sft.sh";
    return r;
  }

 private:
  Strategy read_files(const std::string& dir, const TargetSpec& spec, const ClusterShape&) const override {
    const auto files = read_export(dir, spec);
    const FlatDoc& d = files.at(kScript);
    auto get = [&](const std::string& k) -> const json& { return doc_get(d, k, kScript); };
    Strategy s;
    const std::string ds = get("deepspeed").get<std::string>();
    const std::string stage = ds.substr(0, 5);
    s.kind = stage == "zero1" ? StrategyKind::Zero1 : stage == "zero2" ? StrategyKind::Zero2 : StrategyKind::Zero3;
    const bool offload = ds.size() > 5;
    s.offload = !offload ? Offload::None : s.kind == StrategyKind::Zero3 ? Offload::Params : Offload::Optimizer;
    s.method = get(method_key(spec)).get<std::string>() == "lora" ? Method::Lora : Method::Full;
    if (s.method == Method::Lora) {
      s.lora.rank = get("lora_rank").get<int64_t>();
      s.lora.target_modules = doc_has(d, "target_regex") ? regex_targets(get("target_regex").get<std::string>())
                                                         : get("target_modules").get<std::vector<std::string>>();
    }
    const bool bf16 = get("torch_dtype").get<std::string>() == "bfloat16";
    s.param_dtype = s.reduce_dtype = bf16 ? DType::Bf16 : DType::Fp32;
    const std::string attn = get("attn_impl").get<std::string>();
    s.attention = attn == "flash_attn" || attn == "flash_attention_2" ? AttentionImpl::Flash
                  : attn == "flash_attention_3"                       ? AttentionImpl::Flash3
                  : attn == "eager"                                   ? AttentionImpl::Eager
                                                                      : AttentionImpl::Sdpa;
    s.seq_len = get("max_length").get<int64_t>();  // a vision-language model's: text and image tokens
    s.micro_batch = get("per_device_train_batch_size").get<int64_t>();
    s.grad_accum = get("gradient_accumulation_steps").get<int64_t>();
    s.act_ckpt = get("gradient_checkpointing").get<bool>() ? ActCkpt::Full : ActCkpt::None;
    if (doc_has(d, "use_liger_kernel") && get("use_liger_kernel").get<bool>()) s.kernels = KernelLibrary::Liger;
    if (doc_has(d, "freeze_vit")) {
      const bool vit = get("freeze_vit").get<bool>(), aligner = get("freeze_aligner").get<bool>();
      s.train_vision = !vit ? VisionTraining::All : aligner ? VisionTraining::None : VisionTraining::Projector;
    }
    return s;
  }
};

}  // namespace

const Target& swift_target() {
  static const SwiftTarget t;
  return t;
}

}  // namespace fsdp
