// torchtitan (pytorch/torchtitan): FSDP2 / HSDP / DDP over a device mesh, configured by a TOML job config up to
// v0.2.2 and by a Python function returning Trainer.Config after (configs/targets/torchtitan/*.yaml cite both: v0.2.2
// and main at a9c5edc, whose Trainer.Config fields carry the TOML's names).
#include "core/errors.hpp"
#include "export/export_plan.hpp"
#include "export/target.hpp"
#include "report/prediction_view.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

constexpr const char* kTomlFile = "job.toml";
constexpr const char* kPythonFile = "fsdp_plan_config.py";

bool is_python(const TargetSpec& spec) { return spec.files.front().format == "python"; }

const char* torch_dtype(DType d) { return d == DType::Bf16 ? "bfloat16" : "float32"; }

DType dtype_of(const json& v) { return v.get<std::string>() == "bfloat16" ? DType::Bf16 : DType::Fp32; }

// The mesh: dp_replicate x dp_shard over the data-parallel ranks, then tp and pp (torchtitan/distributed/
// parallel_dims.py: world = dp_replicate x dp_shard x cp x tp x pp).
std::pair<int64_t, int64_t> dp_mesh(const Strategy& s, int64_t world) {
  const int64_t dp = s.mesh.dp(world);
  switch (s.kind) {
    case StrategyKind::Ddp:
      return {dp, 1};
    case StrategyKind::Hsdp:
      return {dp / s.hsdp_group, s.hsdp_group};
    default:
      return {1, dp};
  }
}

// torch.distributed.pipelining's schedule names (pipeline_parallel_schedule, get_schedule_class).
const char* schedule_name(PipelineSchedule p) {
  switch (p) {
    case PipelineSchedule::GPipe:
      return "GPipe";
    case PipelineSchedule::OneFOneB:
      return "1F1B";
    case PipelineSchedule::Interleaved1F1B:
      return "Interleaved1F1B";
  }
  return "1F1B";
}

PipelineSchedule schedule_of(const std::string& name) {
  if (name == "GPipe") return PipelineSchedule::GPipe;
  if (name == "Interleaved1F1B") return PipelineSchedule::Interleaved1F1B;
  return PipelineSchedule::OneFOneB;
}

// Virtual stages per pipeline rank: without pipeline_parallel_layers_per_stage a multi-stage schedule (Interleaved1F1B)
// runs 2 stages on each rank, a single-stage one 1 (torchtitan/distributed/pipeline_parallel.py). The exporter writes
// that default only; a plan of other virtual stages is refused by name.
constexpr int64_t kDefaultStagesPerRank = 2;
// torchtitan's weights of the embedding and the output in the stage split, in layers (both schemas, 1 by default).
constexpr const char* kFirstStageLessLayers = "parallelism.pipeline_parallel_first_stage_less_layers";
constexpr const char* kLastStageLessLayers = "parallelism.pipeline_parallel_last_stage_less_layers";

// The keys both schemas share (the v0.2.2 Training / Parallelism dataclasses moved into configs.py unchanged).
void common_keys(FlatDoc& d, const Strategy& s, int64_t world) {
  const auto [replicate, shard] = dp_mesh(s, world);
  d.emplace_back("training.enable_cpu_offload", s.offload == Offload::Params);
  d.emplace_back("training.dtype", torch_dtype(s.master_dtype));
  d.emplace_back("training.mixed_precision_param", torch_dtype(s.param_dtype));
  d.emplace_back("training.mixed_precision_reduce", torch_dtype(s.reduce_dtype));
  d.emplace_back("parallelism.data_parallel_replicate_degree", replicate);
  d.emplace_back("parallelism.data_parallel_shard_degree", shard);
  d.emplace_back("parallelism.fsdp_reshard_after_forward", s.reshard_after_forward ? "always" : "never");
  d.emplace_back("parallelism.tensor_parallel_degree", s.mesh.tp);
  d.emplace_back("parallelism.pipeline_parallel_degree", s.mesh.pp);
  // The routed experts over ep ranks of the shard dimension (1 for a dense model: "No effect for non-MoE models").
  d.emplace_back("parallelism.expert_parallel_degree", s.mesh.ep);
  if (s.mesh.pp > 1) {
    d.emplace_back("parallelism.pipeline_parallel_schedule", schedule_name(s.mesh.pp_schedule));
    if (s.mesh.pp_schedule == PipelineSchedule::Interleaved1F1B && s.mesh.pp_virtual_stages != kDefaultStagesPerRank)
      throw InputError("--pp-virtual-stages: the torchtitan export writes interleaved 1F1B with its default of " +
                       std::to_string(kDefaultStagesPerRank) + " stages per rank; the plan has " +
                       std::to_string(s.mesh.pp_virtual_stages));
    // The split the plan was priced with (simulator/program/pipeline_parallel.hpp stage_layers): the decoder layers
    // over the pp x v model chunks as evenly as they go, the first chunks one more, the embedding on the first and
    // the norm and output on the last. torchtitan's generate_llm_fqn_per_model_part (distributed/
    // pipeline_parallel.py) counts the embedding and the output as pipeline_parallel_first_stage_less_layers and
    // pipeline_parallel_last_stage_less_layers layers, 1 each by default, which moves a layer off the first and the
    // last stage (Llama 3 70B on pp 8: 10, 11, 10, 10, 10, 10, 10, 9); 0 and 0 give the priced split.
    for (const char* key : {kFirstStageLessLayers, kLastStageLessLayers}) d.emplace_back(key, int64_t{0});
  }
}

// A job config whose stages are weighted differently splits the layers otherwise than the plan it reads as.
void check_even_split(const FlatDoc& d, const std::string& file) {
  for (const char* key : {kFirstStageLessLayers, kLastStageLessLayers}) {
    const json& v = doc_get(d, key, file);
    if (!v.is_number_integer() || v.get<int64_t>() != 0)
      throw InputError(file + ": " + key + " = " + v.dump() +
                       ": fsdp-plan prices the stages' even split (0: the embedding and the output not counted as "
                       "layers; torchtitan/distributed/pipeline_parallel.py generate_llm_fqn_per_model_part)");
  }
}

// The keys both schemas write alike (v0.2.2's TOML job config, a9c5edc's Trainer.Config fields of the same names).
void batch_keys(FlatDoc& d, const PlanFile& plan) {
  const Strategy& s = plan.strategy;
  const int64_t dp = s.mesh.dp(plan.cluster.world_size());
  // With pipeline stages the micro-batches are the schedule's: local_batch_size holds them all and
  // pipeline_parallel_microbatch_size is one of them (torchtitan/distributed/pipeline_parallel.py: n_microbatches
  // = local_batch_size / pipeline_parallel_microbatch_size); without, global_batch_size / (local x dp) steps
  // accumulate (torchtitan/train.py, trainer.py gradient_accumulation_steps).
  const int64_t local = s.mesh.pp > 1 ? s.micro_batch * s.grad_accum : s.micro_batch;
  d.emplace_back("training.local_batch_size", local);
  d.emplace_back("training.global_batch_size", s.micro_batch * dp * s.grad_accum);
  d.emplace_back("training.seq_len", s.seq_len);
  d.emplace_back("training.max_norm", plan.training.grad_clip);
  common_keys(d, s, plan.cluster.world_size());
  if (s.mesh.pp > 1) d.emplace_back("parallelism.pipeline_parallel_microbatch_size", s.micro_batch);
}

// activation_checkpoint.mode: none, full, or selective (the per-op policy; v0.2.2's selective_ac_option an integer N
// for every N-th block).
const char* ckpt_mode(const Strategy& s) {
  if (s.act_ckpt == ActCkpt::None) return "none";
  return checkpoints_every_layer(s) ? "full" : "selective";
}

class TorchtitanTarget final : public Target {
 public:
  std::string name() const override { return "torchtitan"; }

  ExportResult write(const PlanFile& plan, const TargetSpec& spec) const override {
    const Strategy& s = plan.strategy;
    const auto model = target_model(spec, plan.model_name, plan.model_path);
    const std::string assets = "./assets/hf/" + hf_model_dir(model.at("hf_id")).substr(5);
    ExportResult r;
    WrittenFile f;
    std::string config_arg;
    FlatDoc& d = f.keys;
    if (!is_python(spec)) {
      f.name = kTomlFile;
      f.header = {"Written by fsdp-plan for " + spec.writes_for + ".", "Plan: " + one_line_strategy(plan.strategy)};
      d.emplace_back("job.description", "fsdp-plan: " + plan.model_name);
      d.emplace_back("model.name", model.at("name"));
      d.emplace_back("model.flavor", model.at("flavor"));
      d.emplace_back("model.hf_assets_path", assets);
      d.emplace_back("optimizer.name", "AdamW");
      d.emplace_back("optimizer.lr", plan.training.lr);
      d.emplace_back("optimizer.eps", plan.training.eps);
      d.emplace_back("optimizer.weight_decay", plan.training.weight_decay);
      batch_keys(d, plan);
      d.emplace_back("activation_checkpoint.mode", ckpt_mode(s));
      if (s.act_ckpt != ActCkpt::None && !checkpoints_every_layer(s)) {
        // fraction:P is refused by the target's knob table (configs/targets/torchtitan: act_ckpt) before this.
        FSDP_ASSERT(s.ckpt_fraction == 0, "torchtitan has no fractional checkpointing");
        d.emplace_back("activation_checkpoint.selective_ac_option",
                       s.act_ckpt == ActCkpt::SelectiveOp ? std::string("op") : std::to_string(s.ckpt_every));
      }
      config_arg = std::string("--job.config_file ") + kTomlFile;
    } else {
      f.name = kPythonFile;
      f.header = {"# Written by fsdp-plan for " + spec.writes_for + ".",
                  "# Plan: " + one_line_strategy(plan.strategy),
                  "from torchtitan.components.loss import CrossEntropyLoss",
                  "from torchtitan.config import CompileConfig",
                  "from torchtitan.models." + model.at("name") + " import model_registry",
                  "from torchtitan.models." + model.at("name") + ".config_registry import " + model.at("config_fn"),
                  "from torchtitan.trainer import Trainer",
                  "",
                  "",
                  "def fsdp_plan() -> Trainer.Config:"};
      // The model function's config, with what the plan is priced as in place of what it sets otherwise: SDPA
      // attention, the whole-logits loss, eager (configs/targets/torchtitan/python-a9c5edc.yaml says why).
      d.emplace_back("config", model.at("config_fn") + "()");
      // varlen for flash3 (FlashAttention-3 on Hopper), flex for flex, each over the documents
      // (configs/runtimes/torchtitan-2606.yaml); sdpa causal over the whole sequence.
      const char* backend = s.attention == AttentionImpl::Flash3 ? "varlen"
                            : s.attention == AttentionImpl::Flex ? "flex"
                                                                 : "sdpa";
      d.emplace_back("model_spec", "model_registry(\"" + model.at("flavor") + "\", attn_backend=\"" + backend + "\")");
      d.emplace_back("hf_assets_path", assets);
      d.emplace_back("loss", "CrossEntropyLoss.Config()");
      d.emplace_back("compile", "CompileConfig()");
      batch_keys(d, plan);
      d.emplace_back("parallelism.enable_sequence_parallel", true);
      d.emplace_back("parallelism.enable_async_tensor_parallel", false);
      FSDP_ASSERT(s.act_ckpt == ActCkpt::None || checkpoints_every_layer(s) || s.act_ckpt == ActCkpt::SelectiveOp,
                  "torchtitan a9c5edc checkpoints none, every layer or by the per-op policy");
      d.emplace_back("activation_checkpoint.mode", ckpt_mode(s));
      config_arg = "--module fsdp_plan_config --config fsdp_plan";
    }
    r.files.push_back(f);
    r.notes.push_back("Run from this directory in a torchtitan checkout of " + spec.source.commit.substr(0, 12) +
                      " (PYTHONPATH=. for the Python config); the tokenizer comes from python "
                      "scripts/download_hf_assets.py --repo_id " +
                      model.at("hf_id") + " --assets tokenizer.");
    r.launch_command = "PYTORCH_ALLOC_CONF=expandable_segments:True PYTHONPATH=.:${PYTHONPATH:-} torchrun --nnodes " +
                       std::to_string(plan.cluster.nodes) + " --nproc_per_node " +
                       std::to_string(plan.cluster.gpus_per_node) +
                       " --node_rank \"${NODE_RANK:-0}\" --rdzv_backend c10d --rdzv_endpoint "
                       "\"${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}\" -m torchtitan.train " +
                       config_arg;
    return r;
  }

 private:
  Strategy read_files(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster) const override {
    const auto files = read_export(dir, spec);
    const std::string name = is_python(spec) ? kPythonFile : kTomlFile;
    const FlatDoc& d = files.at(name);
    auto get = [&](const std::string& k) -> const json& { return doc_get(d, k, name); };
    Strategy s;
    const int64_t replicate = get("parallelism.data_parallel_replicate_degree").get<int64_t>();
    const int64_t shard = get("parallelism.data_parallel_shard_degree").get<int64_t>();
    s.mesh.tp = get("parallelism.tensor_parallel_degree").get<int64_t>();
    s.mesh.pp = get("parallelism.pipeline_parallel_degree").get<int64_t>();
    s.mesh.ep = get("parallelism.expert_parallel_degree").get<int64_t>();
    if (replicate * shard * s.mesh.tp * s.mesh.pp != cluster.world_size())
      throw InputError(name +
                       ": data_parallel_replicate_degree x data_parallel_shard_degree x tensor_parallel_degree "
                       "x pipeline_parallel_degree = " +
                       std::to_string(replicate * shard * s.mesh.tp * s.mesh.pp) + ", not the world size " +
                       std::to_string(cluster.world_size()));
    if (s.mesh.pp > 1) {
      check_even_split(d, name);
      s.mesh.pp_schedule = schedule_of(get("parallelism.pipeline_parallel_schedule").get<std::string>());
      s.mesh.pp_virtual_stages = s.mesh.pp_schedule == PipelineSchedule::Interleaved1F1B ? kDefaultStagesPerRank : 1;
    }
    s.kind = shard > 1 && replicate > 1 ? StrategyKind::Hsdp : shard > 1 ? StrategyKind::Fsdp : StrategyKind::Ddp;
    if (replicate == 1 && shard == 1) s.kind = StrategyKind::Fsdp;
    s.hsdp_group = s.kind == StrategyKind::Hsdp ? shard : 0;
    s.reshard_after_forward = get("parallelism.fsdp_reshard_after_forward").get<std::string>() != "never";
    s.offload = get("training.enable_cpu_offload").get<bool>() ? Offload::Params : Offload::None;
    s.master_dtype = dtype_of(get("training.dtype"));
    s.param_dtype = dtype_of(get("training.mixed_precision_param"));
    s.reduce_dtype = dtype_of(get("training.mixed_precision_reduce"));
    // batch_keys' reverse.
    const int64_t local = get("training.local_batch_size").get<int64_t>();
    s.micro_batch = s.mesh.pp > 1 ? get("parallelism.pipeline_parallel_microbatch_size").get<int64_t>() : local;
    s.seq_len = get("training.seq_len").get<int64_t>();
    s.grad_accum = get("training.global_batch_size").get<int64_t>() / (s.micro_batch * s.mesh.dp(cluster.world_size()));
    if (is_python(spec)) {
      // model_registry(flavor, attn_backend=...): the backends this target writes (its file's values list).
      const std::string spec_call = get("model_spec").get<std::string>();
      auto names = [&](const char* backend) {
        return spec_call.find(std::string("attn_backend=\"") + backend + "\"") != std::string::npos;
      };
      s.attention = names("varlen") ? AttentionImpl::Flash3 : names("flex") ? AttentionImpl::Flex : AttentionImpl::Sdpa;
    }
    const std::string mode = get("activation_checkpoint.mode").get<std::string>();
    if (mode == "memory_budget")
      throw InputError(name +
                       ": activation_checkpoint.mode = \"memory_budget\": the compiler's partitioner decides "
                       "what it saves, which fsdp-plan does not price");
    s.act_ckpt = mode == "none" ? ActCkpt::None : mode == "full" ? ActCkpt::Full : ActCkpt::SelectiveOp;
    if (mode == "selective" && !is_python(spec)) {
      const std::string opt = get("activation_checkpoint.selective_ac_option").get<std::string>();
      if (opt != "op") {
        if (opt.empty() || opt.size() > 9 || opt.find_first_not_of("0123456789") != std::string::npos || opt == "0")
          throw InputError(name + ": activation_checkpoint.selective_ac_option = \"" + opt +
                           "\": expected \"op\" or a positive integer N (every N-th block)");
        s.act_ckpt = ActCkpt::Full;
        s.ckpt_every = std::stoll(opt);
      }
    }
    return s;
  }
};

}  // namespace

const Target& torchtitan_target() {
  static const TorchtitanTarget t;
  return t;
}

}  // namespace fsdp
