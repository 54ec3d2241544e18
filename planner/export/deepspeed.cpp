// DeepSpeed's engine (deepspeedai/DeepSpeed) under the user's training script: ds_config.json, a hostfile and the
// `deepspeed` launcher; the script's model arguments in script_args.json.
#include "export/export_plan.hpp"
#include "export/hf_script_args.hpp"
#include "export/target.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

constexpr const char* kConfig = "ds_config.json";
constexpr const char* kScriptArgs = "script_args.json";

int zero_stage(StrategyKind k) { return k == StrategyKind::Zero1 ? 1 : k == StrategyKind::Zero2 ? 2 : 3; }

class DeepSpeedTarget final : public Target {
 public:
  std::string name() const override { return "deepspeed"; }

  ExportResult write(const PlanFile& plan, const TargetSpec& spec) const override {
    const Strategy& s = plan.strategy;
    const auto model = target_model(spec, plan.model_name, plan.model_path);
    const int64_t world = plan.cluster.world_size();
    ExportResult r;
    WrittenFile cfg{kConfig, {}, {}, "", false};
    FlatDoc& d = cfg.keys;
    d.emplace_back("train_batch_size", s.micro_batch * world * s.grad_accum);
    d.emplace_back("train_micro_batch_size_per_gpu", s.micro_batch);
    d.emplace_back("gradient_accumulation_steps", s.grad_accum);
    d.emplace_back("gradient_clipping", plan.training.grad_clip);
    d.emplace_back("bf16.enabled", s.param_dtype == DType::Bf16);
    d.emplace_back("communication_data_type", to_string(s.reduce_dtype));
    d.emplace_back("zero_optimization.stage", zero_stage(s.kind));
    d.emplace_back("zero_optimization.overlap_comm", true);
    d.emplace_back("zero_optimization.contiguous_gradients", true);
    d.emplace_back("zero_optimization.offload_optimizer.device", s.offload == Offload::None ? "none" : "cpu");
    if (s.kind == StrategyKind::Zero3)
      d.emplace_back("zero_optimization.offload_param.device", s.offload == Offload::Params ? "cpu" : "none");
    d.emplace_back("optimizer.type", "AdamW");
    d.emplace_back("optimizer.params.lr", plan.training.lr);
    d.emplace_back("optimizer.params.eps", plan.training.eps);
    d.emplace_back("optimizer.params.weight_decay", plan.training.weight_decay);
    r.files.push_back(cfg);
    r.files.push_back(WrittenFile{kScriptArgs, hf_script_args(plan, model.at("hf_id")), {}, "", false});
    std::string hosts;
    for (int64_t n = 0; n < plan.cluster.nodes; ++n)
      hosts += "node-" + std::to_string(n) + " slots=" + std::to_string(plan.cluster.gpus_per_node) + "\n";
    r.files.push_back(WrittenFile{"hostfile", {}, {}, hosts, false});
    r.notes.push_back("hostfile: replace node-0 ... with your hosts' names (DeepSpeed reaches them over ssh).");
    r.notes.push_back(
        "train.py: your script: it builds the model of script_args.json (from_pretrained with its "
        "torch_dtype and attn_implementation, gradient_checkpointing_enable() when set), trains "
        "max_seq_length-token sequences and calls deepspeed.initialize(config=\"ds_config.json\").");
    r.launch_command = "deepspeed --hostfile hostfile --num_nodes " + std::to_string(plan.cluster.nodes) +
                       " --num_gpus " + std::to_string(plan.cluster.gpus_per_node) +
                       " --master_addr \"${MASTER_ADDR:-node-0}\" --master_port \"${MASTER_PORT:-29500}\" "
                       "train.py --deepspeed_config ds_config.json --script_args script_args.json";
    return r;
  }

 private:
  Strategy read_files(const std::string& dir, const TargetSpec& spec, const ClusterShape&) const override {
    const auto files = read_export(dir, spec);
    const FlatDoc& d = files.at(kConfig);
    auto get = [&](const std::string& k) -> const json& { return doc_get(d, k, kConfig); };
    Strategy s;
    const int64_t stage = get("zero_optimization.stage").get<int64_t>();
    s.kind = stage == 1 ? StrategyKind::Zero1 : stage == 2 ? StrategyKind::Zero2 : StrategyKind::Zero3;
    s.micro_batch = get("train_micro_batch_size_per_gpu").get<int64_t>();
    s.grad_accum = get("gradient_accumulation_steps").get<int64_t>();
    s.param_dtype = get("bf16.enabled").get<bool>() ? DType::Bf16 : DType::Fp32;
    parse_dtype(get("communication_data_type").get<std::string>(), s.reduce_dtype);
    const bool params_off = doc_has(d, "zero_optimization.offload_param.device") &&
                            get("zero_optimization.offload_param.device").get<std::string>() == "cpu";
    const bool opt_off = get("zero_optimization.offload_optimizer.device").get<std::string>() == "cpu";
    s.offload = params_off ? Offload::Params : opt_off ? Offload::Optimizer : Offload::None;
    read_hf_script_args(files.at(kScriptArgs), kScriptArgs, s);
    return s;
  }
};

}  // namespace

const Target& deepspeed_target() {
  static const DeepSpeedTarget t;
  return t;
}

}  // namespace fsdp
