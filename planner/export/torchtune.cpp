// torchtune (pytorch/torchtune): the full_finetune_distributed and lora_finetune_distributed recipes (FSDP2),
// configured by one YAML file and launched with `tune run` (torchrun's arguments).
#include "export/export_plan.hpp"
#include "export/target.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

constexpr const char* kConfig = "torchtune_config.yaml";

// Our module names -> torchtune's LoRA attention module names (torchtune/modules/peft/lora.py LORA_ATTN_MODULES).
std::string tune_module(const std::string& m) { return m == "o_proj" ? "output_proj" : m; }
std::string our_module(const std::string& m) { return m == "output_proj" ? "o_proj" : m; }
bool is_mlp(const std::string& m) { return m == "gate_proj" || m == "up_proj" || m == "down_proj"; }

class TorchtuneTarget final : public Target {
 public:
  std::string name() const override { return "torchtune"; }

  ExportResult write(const PlanFile& plan, const TargetSpec& spec) const override {
    const Strategy& s = plan.strategy;
    const auto model = target_model(spec, plan.model_name, plan.model_path);
    const bool lora = s.method == Method::Lora;
    const std::string dir = hf_model_dir(model.at("hf_id"));
    ExportResult r;
    WrittenFile f{kConfig, {}, {"Written by fsdp-plan for " + spec.writes_for + "."}, "", false};
    FlatDoc& d = f.keys;
    d.emplace_back("output_dir", "/tmp/torchtune/fsdp-plan");
    d.emplace_back("tokenizer._component_", model.at("tokenizer"));
    d.emplace_back("tokenizer.path", dir + "/" + model.at("tokenizer_file"));
    if (model.count("merges_file")) d.emplace_back("tokenizer.merges_file", dir + "/" + model.at("merges_file"));
    d.emplace_back("tokenizer.max_seq_len", s.seq_len);
    d.emplace_back("dataset._component_", "torchtune.datasets.alpaca_cleaned_dataset");
    d.emplace_back("dataset.packed", true);
    d.emplace_back("seed", nullptr);
    d.emplace_back("shuffle", true);
    d.emplace_back("model._component_", lora ? model.at("lora_builder") : model.at("builder"));
    if (lora) {
      std::vector<std::string> attn;
      bool mlp = false;
      for (const auto& m : s.lora.target_modules) {
        if (is_mlp(m))
          mlp = true;
        else
          attn.push_back(tune_module(m));
      }
      d.emplace_back("model.lora_attn_modules", attn);
      d.emplace_back("model.apply_lora_to_mlp", mlp);
      d.emplace_back("model.apply_lora_to_output", false);
      d.emplace_back("model.lora_rank", s.lora.rank);
      d.emplace_back("model.lora_alpha", 2 * s.lora.rank);
    }
    d.emplace_back("checkpointer._component_", "torchtune.training.FullModelHFCheckpointer");
    d.emplace_back("checkpointer.checkpoint_dir", dir);
    d.emplace_back("checkpointer.checkpoint_files.filename_format", "model-{}-of-{}.safetensors");
    d.emplace_back("checkpointer.checkpoint_files.max_filename", model.at("max_filename"));
    d.emplace_back("checkpointer.output_dir", "/tmp/torchtune/fsdp-plan");
    d.emplace_back("checkpointer.model_type", model.at("model_type"));
    d.emplace_back("resume_from_checkpoint", false);
    d.emplace_back("batch_size", s.micro_batch);
    d.emplace_back("epochs", 1);
    d.emplace_back("max_steps_per_epoch", nullptr);
    d.emplace_back("gradient_accumulation_steps", s.grad_accum);
    d.emplace_back("optimizer._component_", "torch.optim.AdamW");
    d.emplace_back("optimizer.lr", plan.training.lr);
    d.emplace_back("optimizer.weight_decay", plan.training.weight_decay);
    d.emplace_back("optimizer.fused", true);
    d.emplace_back("lr_scheduler._component_", "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup");
    d.emplace_back("lr_scheduler.num_warmup_steps", 100);
    // torchtune's own loss, as 133 of the 139 recipe configs at the target's commit name it and the torchtune runtime
    // prices it (configs/runtimes/torchtune.yaml loss_output_chunks: its default 8 chunks of the sequence).
    d.emplace_back("loss._component_", "torchtune.modules.loss.CEWithChunkedOutputLoss");
    d.emplace_back("clip_grad_norm", plan.training.grad_clip > 0 ? json(plan.training.grad_clip) : json(nullptr));
    d.emplace_back("compile", false);
    d.emplace_back("device", "cuda");
    d.emplace_back("dtype", s.param_dtype == DType::Bf16 ? "bf16" : "fp32");
    d.emplace_back("enable_activation_checkpointing", s.act_ckpt == ActCkpt::Full);
    d.emplace_back("enable_activation_offloading", false);
    d.emplace_back("custom_sharded_layers", std::vector<std::string>{});
    d.emplace_back("fsdp_cpu_offload", s.offload == Offload::Params);
    d.emplace_back("fsdp_reshard_after_forward", s.reshard_after_forward);
    d.emplace_back("metric_logger._component_", "torchtune.training.metric_logging.DiskLogger");
    d.emplace_back("metric_logger.log_dir", "/tmp/torchtune/fsdp-plan/logs");
    d.emplace_back("log_every_n_steps", 1);
    d.emplace_back("log_peak_memory_stats", true);
    d.emplace_back("profiler._component_", "torchtune.training.setup_torch_profiler");
    d.emplace_back("profiler.enabled", false);
    r.files.push_back(f);
    r.notes.push_back("First, on every node: tune download " + model.at("hf_id") + " --output-dir " + dir +
                      "; dataset: alpaca_cleaned (replace dataset._component_ with yours).");
    r.notes.push_back("Run on every node with NODE_RANK set (0 on the node at MASTER_ADDR).");
    r.launch_command = "tune run --nnodes " + std::to_string(plan.cluster.nodes) + " --nproc_per_node " +
                       std::to_string(plan.cluster.gpus_per_node) +
                       " --node_rank \"${NODE_RANK:-0}\" --rdzv_backend c10d --rdzv_endpoint "
                       "\"${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}\" " +
                       (lora ? "lora_finetune_distributed" : "full_finetune_distributed") +
                       " --config torchtune_config.yaml";
    return r;
  }

 private:
  Strategy read_files(const std::string& dir, const TargetSpec& spec, const ClusterShape&) const override {
    const auto files = read_export(dir, spec);
    const FlatDoc& d = files.at(kConfig);
    auto get = [&](const std::string& k) -> const json& { return doc_get(d, k, kConfig); };
    Strategy s;
    s.kind = StrategyKind::Fsdp;
    s.reshard_after_forward = get("fsdp_reshard_after_forward").get<bool>();
    s.offload = get("fsdp_cpu_offload").get<bool>() ? Offload::Params : Offload::None;
    s.act_ckpt = get("enable_activation_checkpointing").get<bool>() ? ActCkpt::Full : ActCkpt::None;
    const DType dt = get("dtype").get<std::string>() == "bf16" ? DType::Bf16 : DType::Fp32;
    s.param_dtype = s.reduce_dtype = s.master_dtype = dt;
    s.micro_batch = get("batch_size").get<int64_t>();
    s.grad_accum = get("gradient_accumulation_steps").get<int64_t>();
    s.seq_len = get("tokenizer.max_seq_len").get<int64_t>();
    if (doc_has(d, "model.lora_rank")) {
      s.method = Method::Lora;
      s.lora.rank = get("model.lora_rank").get<int64_t>();
      for (const auto& m : get("model.lora_attn_modules").get<std::vector<std::string>>())
        s.lora.target_modules.push_back(our_module(m));
      if (get("model.apply_lora_to_mlp").get<bool>())
        for (const char* m : {"gate_proj", "up_proj", "down_proj"}) s.lora.target_modules.push_back(m);
    }
    return s;
  }
};

}  // namespace

const Target& torchtune_target() {
  static const TorchtuneTarget t;
  return t;
}

}  // namespace fsdp
