// accelerate (huggingface/accelerate) launching Transformers' Trainer: accelerate_config.yaml (MULTI_GPU = DDP, or
// FSDP with fsdp_version 2 or 1), the Trainer's TrainingArguments as training_args.json, and the script's model
// arguments as script_args.json.
#include "export/export_plan.hpp"
#include "export/hf_script_args.hpp"
#include "export/target.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

constexpr const char* kAccelerate = "accelerate_config.yaml";
constexpr const char* kTraining = "training_args.json";
constexpr const char* kScriptArgs = "script_args.json";

// FSDP1's sharding strategies by name (accelerate/utils/constants.py FSDP_SHARDING_STRATEGY).
const char* fsdp1_strategy(const Strategy& s) {
  switch (s.kind) {
    case StrategyKind::FsdpGradOp:
      return "SHARD_GRAD_OP";
    case StrategyKind::NoShard:
      return "NO_SHARD";
    case StrategyKind::Hsdp:
      return "HYBRID_SHARD";
    default:
      return "FULL_SHARD";
  }
}

class AccelerateTarget final : public Target {
 public:
  std::string name() const override { return "accelerate"; }

  static int fsdp_version(const TargetSpec& spec) {
    const auto& keys = spec.file(kAccelerate).keys;
    const auto& values = keys.at("fsdp_config.fsdp_version").values;
    return values.size() == 1 && values.front() == "1" ? 1 : 2;
  }

  ExportResult write(const PlanFile& plan, const TargetSpec& spec) const override {
    const Strategy& s = plan.strategy;
    const auto model = target_model(spec, plan.model_name, plan.model_path);
    const int version = fsdp_version(spec);
    const bool fsdp = s.kind != StrategyKind::Ddp;
    ExportResult r;
    WrittenFile acc{kAccelerate, {}, {"Written by fsdp-plan for " + spec.writes_for + "."}, "", false};
    FlatDoc& a = acc.keys;
    a.emplace_back("compute_environment", "LOCAL_MACHINE");
    a.emplace_back("distributed_type", fsdp ? "FSDP" : "MULTI_GPU");
    a.emplace_back("mixed_precision", s.param_dtype == DType::Bf16 ? "bf16" : "no");
    a.emplace_back("num_machines", plan.cluster.nodes);
    a.emplace_back("num_processes", plan.cluster.world_size());
    a.emplace_back("machine_rank", 0);
    a.emplace_back("main_process_port", 29500);
    a.emplace_back("rdzv_backend", "static");
    a.emplace_back("same_network", true);
    a.emplace_back("use_cpu", false);
    // Every key accelerate's FSDP plugin reads is written, so that the plan does not depend on its defaults.
    a.emplace_back("fsdp_config.fsdp_version", version);
    if (version == 2)
      a.emplace_back("fsdp_config.fsdp_reshard_after_forward", s.reshard_after_forward);
    else
      a.emplace_back("fsdp_config.fsdp_reshard_after_forward", fsdp1_strategy(s));
    a.emplace_back("fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP");
    a.emplace_back("fsdp_config.fsdp_transformer_layer_cls_to_wrap", model.at("layer_cls"));
    a.emplace_back("fsdp_config.fsdp_offload_params", s.offload == Offload::Params);
    a.emplace_back("fsdp_config.fsdp_activation_checkpointing", fsdp && s.act_ckpt == ActCkpt::Full);
    a.emplace_back("fsdp_config.fsdp_state_dict_type", "SHARDED_STATE_DICT");
    a.emplace_back("fsdp_config.fsdp_cpu_ram_efficient_loading", true);
    if (version == 1) {
      a.emplace_back("fsdp_config.fsdp_backward_prefetch", "BACKWARD_PRE");
      a.emplace_back("fsdp_config.fsdp_forward_prefetch", false);
      a.emplace_back("fsdp_config.fsdp_use_orig_params", true);
      a.emplace_back("fsdp_config.fsdp_sync_module_states", true);
    }
    if (!fsdp) {
      // MULTI_GPU ignores fsdp_config; none is written for DDP.
      FlatDoc kept;
      for (auto& kv : a)
        if (kv.first.rfind("fsdp_config.", 0) != 0) kept.push_back(kv);
      a = kept;
    }
    r.files.push_back(acc);
    WrittenFile tr{kTraining, {}, {}, "", false};
    FlatDoc& t = tr.keys;
    t.emplace_back("output_dir", "outputs");
    t.emplace_back("per_device_train_batch_size", s.micro_batch);
    t.emplace_back("gradient_accumulation_steps", s.grad_accum);
    t.emplace_back("bf16", s.param_dtype == DType::Bf16);
    // Under FSDP the checkpointing is accelerate's fsdp_activation_checkpointing (Trainer refuses both).
    t.emplace_back("gradient_checkpointing", !fsdp && s.act_ckpt == ActCkpt::Full);
    t.emplace_back("optim", "adamw_torch");
    t.emplace_back("learning_rate", plan.training.lr);
    t.emplace_back("weight_decay", plan.training.weight_decay);
    t.emplace_back("adam_beta1", plan.training.beta1);
    t.emplace_back("adam_beta2", plan.training.beta2);
    t.emplace_back("adam_epsilon", plan.training.eps);
    t.emplace_back("max_grad_norm", plan.training.grad_clip);
    if (!fsdp) t.emplace_back("ddp_bucket_cap_mb", s.ddp_bucket_mb);
    // Liger-Kernel (Strategy::kernels): the Trainer patches the model before accelerate wraps it
    // (TrainingArguments use_liger_kernel; trainer.py _apply_liger_kernel_to_instance).
    if (s.kernels == KernelLibrary::Liger) t.emplace_back("use_liger_kernel", true);
    r.files.push_back(tr);
    FlatDoc script = hf_script_args(plan, model.at("hf_id"));
    // The Trainer enables it from training_args.json (DDP) or accelerate does (FSDP); the script does not.
    for (auto& kv : script)
      if (kv.first == "gradient_checkpointing") kv.second = false;
    r.files.push_back(WrittenFile{kScriptArgs, script, {}, "", false});
    r.notes.push_back(
        "train.py: your Trainer script: it parses training_args.json with HfArgumentParser"
        "(TrainingArguments).parse_json_file, loads the model of script_args.json (its torch_dtype and "
        "attn_implementation) and trains max_seq_length-token sequences.");
    r.notes.push_back("Run on every node with NODE_RANK set (0 on the node at MASTER_ADDR).");
    r.launch_command = "accelerate launch --config_file accelerate_config.yaml --num_machines " +
                       std::to_string(plan.cluster.nodes) + " --num_processes " +
                       std::to_string(plan.cluster.world_size()) +
                       " --machine_rank \"${NODE_RANK:-0}\" --main_process_ip \"${MASTER_ADDR:-localhost}\" "
                       "--main_process_port \"${MASTER_PORT:-29500}\" train.py training_args.json script_args.json";
    return r;
  }

 private:
  Strategy read_files(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster) const override {
    const auto files = read_export(dir, spec);
    const FlatDoc& a = files.at(kAccelerate);
    const FlatDoc& t = files.at(kTraining);
    Strategy s;
    read_hf_script_args(files.at(kScriptArgs), kScriptArgs, s);
    if (doc_has(t, "use_liger_kernel") && doc_get(t, "use_liger_kernel", kTraining).get<bool>())
      s.kernels = KernelLibrary::Liger;
    const bool fsdp = doc_get(a, "distributed_type", kAccelerate).get<std::string>() == "FSDP";
    if (!fsdp) {
      s.kind = StrategyKind::Ddp;
      s.act_ckpt = doc_get(t, "gradient_checkpointing", kTraining).get<bool>() ? ActCkpt::Full : ActCkpt::None;
      s.ddp_bucket_mb = doc_get(t, "ddp_bucket_cap_mb", kTraining).get<int64_t>();
    } else {
      const json& reshard = doc_get(a, "fsdp_config.fsdp_reshard_after_forward", kAccelerate);
      s.kind = StrategyKind::Fsdp;
      if (reshard.is_boolean()) {
        s.reshard_after_forward = reshard.get<bool>();
      } else {
        const std::string v = reshard.get<std::string>();
        s.kind = v == "SHARD_GRAD_OP"  ? StrategyKind::FsdpGradOp
                 : v == "NO_SHARD"     ? StrategyKind::NoShard
                 : v == "HYBRID_SHARD" ? StrategyKind::Hsdp
                                       : StrategyKind::Fsdp;
        s.reshard_after_forward = s.kind != StrategyKind::FsdpGradOp;
        if (s.kind == StrategyKind::Hsdp) s.hsdp_group = cluster.gpus_per_node;
      }
      s.offload =
          doc_get(a, "fsdp_config.fsdp_offload_params", kAccelerate).get<bool>() ? Offload::Params : Offload::None;
      s.act_ckpt = doc_get(a, "fsdp_config.fsdp_activation_checkpointing", kAccelerate).get<bool>() ? ActCkpt::Full
                                                                                                    : ActCkpt::None;
    }
    s.micro_batch = doc_get(t, "per_device_train_batch_size", kTraining).get<int64_t>();
    s.grad_accum = doc_get(t, "gradient_accumulation_steps", kTraining).get<int64_t>();
    const bool bf16 = doc_get(a, "mixed_precision", kAccelerate).get<std::string>() == "bf16";
    s.param_dtype = bf16 ? DType::Bf16 : DType::Fp32;
    // accelerate's FSDP plugin reduces in the mixed-precision dtype; DDP all-reduces the fp32 gradients.
    s.reduce_dtype = bf16 && fsdp ? DType::Bf16 : DType::Fp32;
    return s;
  }
};

}  // namespace

const Target& accelerate_target() {
  static const AccelerateTarget t;
  return t;
}

}  // namespace fsdp
