// configs/runtimes/torchtitan.yaml and the key it added (sharding.last_unit_reshard_after_forward): what the profile
// says torchtitan @ 9dec370ad26b5f8e9a7333a0e36165018262644b does (the citations are the file's comments), the
// key's strict parsing, and what it changes in the step program.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "sim_fixtures.hpp"
#include "strategy/capabilities.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

// pytorch.yaml with `line` added under its `section` mapping, written to a scratch file; the loader's message
// ("" when it loads).
std::string load_error_with_line(const std::string& section, const std::string& line) {
  std::string yaml = runtime_text("pytorch");
  const std::string anchor = section + ":\n";
  const size_t at = yaml.find(anchor);
  REQUIRE(at != std::string::npos);
  yaml.insert(at + anchor.size(), "  " + line + "\n");
  return runtime_load_error(yaml, "torchtitan");
}

std::string load_error_with_sharding_line(const std::string& line) { return load_error_with_line("sharding", line); }

Strategy titan_row() {
  // tests/accuracy/published/torchtitan.yaml titan-h100-llama3-8b-8gpu-fsdp: FSDP2, per-op SAC, local batch 2 x 8192.
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.act_ckpt = ActCkpt::SelectiveOp;
  s.micro_batch = 2;
  s.seq_len = 8192;
  return s;
}

int count_gathers(const StepProgram& p) {
  int n = 0;
  for (const Op& op : p.ops) n += op.kind == OpKind::Gather ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("runtime torchtitan: its Llama, loop and FSDP2 setup as its sources say") {
  const RuntimeProfile t = runtime("torchtitan");
  CHECK(t.name == "torchtitan");
  CHECK(t.logits_upcast_fp32);                     // loss_fn: cross_entropy(pred.flatten(0, 1).float(), ...)
  CHECK_FALSE(t.logits_kept_by_caller);            // train.py: del pred before loss.backward()
  CHECK(t.norm_saves_fp32_input);                  // norms.py RMSNorm: self._norm(x.float()).type_as(x) * weight
  CHECK_FALSE(t.autocast_caches_weight_casts);     // no torch.autocast: MixedPrecisionPolicy casts at the gather
  CHECK_FALSE(t.root_reshard_after_forward);       // FSDP2 _lazy_init keeps the root unsharded
  CHECK_FALSE(t.last_unit_reshard_after_forward);  // apply_fsdp: the last TransformerBlock is not resharded
  CHECK(t.grad_norm_bytes_per_grad == 12);  // clip_grad_norm_(foreach=True): _foreach_norm r4, _foreach_mul_ r4 w4
  // The other profiles say nothing of the key: every unit follows the strategy.
  for (const char* name : {"pytorch", "pytorch-fsdp1", "deepspeed", "fsdp-run"})
    CHECK(runtime(name).last_unit_reshard_after_forward);
}

TEST_CASE("runtime profile: last_unit_reshard_after_forward is parsed strictly") {
  CHECK(load_error_with_sharding_line("last_unit_reshard_after_forward: false").empty());
  CHECK(load_error_with_sharding_line("last_unit_reshard_after_forward: sometimes")
            .find("last_unit_reshard_after_forward") != std::string::npos);
  CHECK(load_error_with_sharding_line("last_unit_reshards: false").find("last_unit_reshards") != std::string::npos);
}

TEST_CASE("runtime profile: DeepSpeed's ZeRO-3 keys are optional and parsed strictly") {
  CHECK(load_error_with_sharding_line("zero3_master_copy_same_dtype: true").empty());
  CHECK(load_error_with_sharding_line("zero3_grad_partition_persistent: yes-please")
            .find("zero3_grad_partition_persistent") != std::string::npos);
  CHECK(load_error_with_sharding_line("default_reduce_dtype: compute").empty());
  CHECK(load_error_with_sharding_line("default_reduce_dtype: bf16").find("default_reduce_dtype") != std::string::npos);
  // Only the DeepSpeed profiles set them; Transformers' Trainer over DeepSpeed drops the logits before backward.
  for (const char* name : {"pytorch", "pytorch-fsdp1", "torchtitan", "fsdp-run", "nanotron"}) {
    const RuntimeProfile r = runtime(name);
    CHECK_FALSE(r.zero3_master_copy_same_dtype);
    CHECK_FALSE(r.zero3_grad_partition_persistent);
    CHECK_FALSE(r.reduce_in_compute_dtype_by_default);
    CHECK(r.zero3_step_sub_group_elems == 0);
  }
  const RuntimeProfile hf = runtime("transformers-deepspeed");
  CHECK(hf.zero3_master_copy_same_dtype);
  CHECK_FALSE(hf.logits_kept_by_caller);
  CHECK(runtime("deepspeed").logits_kept_by_caller);
}

TEST_CASE("runtime profile: keeping the last layer unit after forward saves its backward gather and holds it") {
  ModuleGraph g(zoo("llama3-8b"));
  const Strategy s = titan_row();
  const RuntimeProfile base = runtime("pytorch");
  RuntimeProfile keep = base;
  keep.last_unit_reshard_after_forward = false;
  const StepProgram pb = program(g, s, base, 1, 8);
  const StepProgram pk = program(g, s, keep, 1, 8);
  CHECK(count_gathers(pk) == count_gathers(pb) - 1);
  const MemoryResult mb = walk_memory(pb, base, 8);
  const MemoryResult mk = walk_memory(pk, keep, 8);
  // Both peak in the loss backward; the kept block's bf16 parameters (4096 x (4096 + 2 x 1024 + 4096) attention,
  // 3 x 4096 x 14336 MLP, 2 x 4096 norms = 218,112,000) are the difference in unsharded parameters there.
  REQUIRE(mb.peak_phase == mk.peak_phase);
  CHECK(mb.peak_phase.find("loss backward") != std::string::npos);
  const double layer_bf16 = 218112000.0 * 2.0;
  CHECK(cat(mk.breakdown, MemoryCategory::UnshardedParams) - cat(mb.breakdown, MemoryCategory::UnshardedParams) ==
        doctest::Approx(layer_bf16).epsilon(1e-3));
  // Reshard-after-forward off for the whole strategy keeps the last unit anyway: the key changes nothing there.
  Strategy no_reshard = s;
  no_reshard.reshard_after_forward = false;
  CHECK(count_gathers(program(g, no_reshard, keep, 1, 8)) == count_gathers(program(g, no_reshard, base, 1, 8)));
}

TEST_CASE("runtime profile: ZeRO's parameter gather staging is optional, parsed strictly and held during the gather") {
  CHECK(load_error_with_sharding_line("zero_param_gather_replica_copies: 1").empty());
  CHECK(
      load_error_with_sharding_line("zero_param_gather_replica_copies: -1").find("zero_param_gather_replica_copies") !=
      std::string::npos);
  CHECK(load_error_with_sharding_line("zero_param_gather_shard_copies: many").find("zero_param_gather_shard_copies") !=
        std::string::npos);
  for (const char* name : {"pytorch", "pytorch-fsdp1", "torchtitan", "fsdp-run", "deepspeed"}) {
    CHECK(runtime(name).zero_param_gather_replica_copies == 0);
    CHECK(runtime(name).zero_param_gather_shard_copies == 0);
  }
  // nanotron's ZeRO-1 (configs/runtimes/nanotron.yaml): 2 bf16 copies of the replica and 1 of the rank's slice.
  const RuntimeProfile nano = runtime("nanotron");
  REQUIRE(nano.zero_param_gather_replica_copies == 2);
  REQUIRE(nano.zero_param_gather_shard_copies == 1);
  RuntimeProfile bare = nano;
  bare.zero_param_gather_replica_copies = 0;
  bare.zero_param_gather_shard_copies = 0;
  ModuleGraph g(zoo("llama3-8b"));
  Strategy s;
  s.kind = StrategyKind::Zero1;
  s.param_dtype = DType::Bf16;
  s.micro_batch = 1;
  s.seq_len = 4096;
  s.grad_accum = 2;
  const int64_t world = 16;
  const MemoryResult with = walk_memory(program(g, s, nano, 2, 8), nano, 8);
  const MemoryResult without = walk_memory(program(g, s, bare, 2, 8), bare, 8);
  const double P = static_cast<double>(g.total_params());
  const double slice = std::ceil(P / static_cast<double>(world));
  CHECK(with.peak_allocated_after_backward - without.peak_allocated_after_backward ==
        doctest::Approx((2.0 * P + slice) * 2.0).epsilon(1e-3));
  // The window's peak is the gather: bf16 parameters, the fp32 gradient accumulator and the staging over the whole
  // replica, the fp32 master slice and Adam's two states over the rank's slice (nanotron's "Mem Alloc": 10 B per
  // parameter and 14 B per parameter over DP on the Ultra-Scale Playbook's runs).
  CHECK(with.peak_allocated_after_backward == doctest::Approx(10.0 * P + 14.0 * slice).epsilon(2e-3));
  // At one rank there is nothing to gather and nothing is staged.
  CHECK(walk_memory(program(g, s, nano, 1, 1), nano, 1).peak_allocated_after_backward ==
        doctest::Approx(walk_memory(program(g, s, bare, 1, 1), bare, 1).peak_allocated_after_backward));
}

TEST_CASE("runtime profile: allocator.collective_inputs_held_for_the_pass is optional and parsed strictly") {
  CHECK(load_error_with_line("allocator", "collective_inputs_held_for_the_pass: true").empty());
  CHECK(load_error_with_line("allocator", "collective_inputs_held_for_the_pass: mostly")
            .find("collective_inputs_held_for_the_pass") != std::string::npos);
  CHECK(load_error_with_line("allocator", "collective_inputs_held: true").find("collective_inputs_held") !=
        std::string::npos);
  // Only nanotron's profile sets it (configs/runtimes/nanotron.yaml: its CPU issues a pass ahead of the GPU).
  for (const char* name : {"pytorch", "pytorch-fsdp1", "torchtitan", "fsdp-run", "deepspeed"})
    CHECK_FALSE(runtime(name).collective_inputs_held_for_the_pass);
  CHECK(runtime("nanotron").collective_inputs_held_for_the_pass);
}

TEST_CASE("runtime profile: the tensor-parallel loss and norm-gradient keys are optional and parsed strictly") {
  CHECK(load_error_with_sharding_line("tp_loss_all_reduces: fused").empty());
  CHECK(load_error_with_sharding_line("tp_loss_all_reduces: separate").empty());
  CHECK(load_error_with_sharding_line("tp_loss_all_reduces: two").find("tp_loss_all_reduces") != std::string::npos);
  CHECK(load_error_with_sharding_line("tp_norm_grad_sum: per-unit").empty());
  CHECK(load_error_with_sharding_line("tp_norm_grad_sum: per-layer").find("tp_norm_grad_sum") != std::string::npos);
  CHECK(load_error_with_sharding_line("unit_grads_released: after-copy-in").empty());
  CHECK(load_error_with_sharding_line("unit_grads_released: later").find("unit_grads_released") != std::string::npos);
  CHECK(runtime("fsdp-run").unit_grads_held_through_reduce_issue);
  for (const char* name : {"pytorch", "torchtitan", "pytorch-fsdp1", "deepspeed", "nanotron"})
    CHECK_FALSE(runtime(name).unit_grads_held_through_reduce_issue);
  CHECK(load_error_with_sharding_line("offloaded_grads: on-device-until-step").empty());
  CHECK(load_error_with_sharding_line("offloaded_grads: host").find("offloaded_grads") != std::string::npos);
  CHECK(load_error_with_sharding_line("embedding_unit: own").empty());
  CHECK(load_error_with_sharding_line("embedding_unit: separate").find("embedding_unit") != std::string::npos);
  CHECK(load_error_with_sharding_line("tp_loss_backward: as-loss").empty());
  CHECK(load_error_with_sharding_line("tp_loss_backward: loss-parallel").empty());
  CHECK(load_error_with_sharding_line("tp_loss_backward: in-place").find("tp_loss_backward") != std::string::npos);
  // fsdp-run's vocabulary-parallel backward copies the probabilities (VocabParallelCE::backward); torchtitan runs
  // DTensor's loss_parallel handlers (and the profiles derived from it); the others their loss's own backward.
  using TLB = RuntimeProfile::TpLossBackward;
  CHECK(runtime("fsdp-run").tp_loss_backward == TLB::ProbabilitiesCopy);
  for (const char* name : {"torchtitan", "torchtitan-compile", "torchtitan-2506-compile", "torchtitan-2606"})
    CHECK(runtime(name).tp_loss_backward == TLB::LossParallel);
  for (const char* name : {"pytorch", "nanotron", "deepspeed"}) CHECK(runtime(name).tp_loss_backward == TLB::AsLoss);
  // fsdp-run fuses and sums per unit (executor/model/tensor_parallel.cpp VocabParallelCE, shard/sharded_model.cpp
  // sum_partial_grads); nanotron says separate and per step, torchtitan separate; pytorch says nothing (absent: the
  // same).
  CHECK(runtime("fsdp-run").tp_loss_all_reduces_fused);
  CHECK(runtime("fsdp-run").tp_norm_grad_sum_per_unit);
  for (const char* name : {"pytorch", "torchtitan", "nanotron"}) {
    CHECK_FALSE(runtime(name).tp_loss_all_reduces_fused);
    CHECK_FALSE(runtime(name).tp_norm_grad_sum_per_unit);
  }
}

TEST_CASE("runtime profile: pipeline_reshard_after_backward is optional and parsed strictly") {
  // pytorch.yaml (load_error_with_sharding_line's base) says `last`: its value replaced.
  auto with_value = [](const std::string& value) {
    std::string yaml = runtime_text("pytorch");
    const std::string key = "pipeline_reshard_after_backward: last";
    const size_t at = yaml.find(key);
    REQUIRE(at != std::string::npos);
    yaml.replace(at, key.size(), "pipeline_reshard_after_backward: " + value);
    return runtime_load_error(yaml, "pipeline-reshard");
  };
  CHECK(with_value("each").empty());
  CHECK(with_value("never").find("pipeline_reshard_after_backward") != std::string::npos);
  CHECK(with_value("never").find("duplicate") == std::string::npos);
  // FSDP2 under torch.distributed.pipelining (pytorch, torchtitan and their compiled bases) keeps the units gathered
  // to the step's last backward; fsdp-run reshards at every backward.
  for (const char* name : {"pytorch", "pytorch-compile", "torchtitan", "torchtitan-compile"})
    CHECK(runtime(name).pipeline_keeps_units_gathered);
  CHECK_FALSE(runtime("fsdp-run").pipeline_keeps_units_gathered);
  // FSDP2 keeps unsynced gradients in the reduce dtype; FSDP1's no_sync and the rest in the compute dtype.
  for (const char* name : {"pytorch", "pytorch-compile", "torchtitan", "torchtitan-compile", "torchtitan-2503-compile",
                           "torchtitan-2506-compile"})
    CHECK(runtime(name).unsynced_grads_in_reduce_dtype);
  for (const char* name : {"pytorch-fsdp1", "pytorch-fsdp1-compile", "fsdp-run", "deepspeed", "nanotron"})
    CHECK_FALSE(runtime(name).unsynced_grads_in_reduce_dtype);
  // pytorch.yaml's line `key: value` given another value: the load error names the key.
  auto error_with = [](const std::string& key, const std::string& value, const std::string& other) {
    std::string yaml = runtime_text("pytorch");
    const std::string line = key + ": " + value;
    const size_t at = yaml.find(line);
    REQUIRE(at != std::string::npos);
    yaml.replace(at, line.size(), key + ": " + other);
    return runtime_load_error(yaml, key);
  };
  CHECK(error_with("unsynced_grads_kept_in", "reduce-dtype", "fp16").find("unsynced_grads_kept_in") !=
        std::string::npos);
  CHECK(error_with("pipeline_outputs_to_step_end", "last-stage", "first-stage").find("pipeline_outputs_to_step_end") !=
        std::string::npos);
}

TEST_CASE("runtime profile: the float8 section says what runs float8, parsed strictly") {
  // The compiled PyTorch runtimes run float8 linears, FSDP2's with the float8 all-gather; the eager ones, FSDP1's
  // all-gather, fsdp-run, DeepSpeed and nanotron do not (capabilities.hpp RuntimeSupport).
  for (const char* name :
       {"pytorch-compile", "torchtitan-compile", "torchtitan-2503-compile", "torchtitan-2506-compile"}) {
    CAPTURE(name);
    CHECK(runtime(name).support.float8_linears);
    CHECK(runtime(name).support.float8_all_gather);
  }
  CHECK(runtime("pytorch-fsdp1-compile").support.float8_linears);
  CHECK_FALSE(runtime("pytorch-fsdp1-compile").support.float8_all_gather);
  for (const char* name :
       {"pytorch", "torchtitan", "pytorch-fsdp1", "fsdp-run", "deepspeed", "transformers-deepspeed", "nanotron"}) {
    CAPTURE(name);
    CHECK_FALSE(runtime(name).support.float8_linears);
  }
  // Every eager runtime that leaves float8 to its compiled twin names a shipped runtime that prices float8 linears;
  // the frameworks without float8 name none (rule Float8Runtime's message).
  for (const auto& entry : std::filesystem::directory_iterator(root() + "/configs/runtimes")) {
    const RuntimeProfile r = runtime(entry.path().stem().string());
    CAPTURE(r.name);
    if (r.support.float8_linears) continue;
    if (!r.support.float8_compiled_runtime.empty())
      CHECK(runtime(r.support.float8_compiled_runtime).support.float8_linears);
  }
  CHECK(runtime("torchtitan").support.float8_compiled_runtime == "torchtitan-compile");
  CHECK(runtime("fms-fsdp").support.float8_compiled_runtime == "fms-fsdp-compile");
  for (const char* name : {"fsdp-run", "deepspeed", "transformers-deepspeed", "nanotron"})
    CHECK(runtime(name).support.float8_compiled_runtime.empty());
  // The compiled loss: torchtitan of June 2025 only.
  CHECK(runtime("torchtitan-2506-compile").loss_compiled);
  CHECK_FALSE(runtime("torchtitan-2503-compile").loss_compiled);
  std::string yaml = runtime_text("pytorch");
  const std::string section = "float8:\n  linears: false\n  all_gather: false\n";
  const size_t at = yaml.find(section);
  REQUIRE(at != std::string::npos);
  std::string unknown = yaml, bad = yaml;
  unknown.replace(at, section.size(), "float8:\n  linears: false\n  recipe: tensorwise\n");
  bad.replace(at, section.size(), "float8:\n  linears: maybe\n");
  CHECK(runtime_load_error(unknown, "float8-unknown").find("recipe") != std::string::npos);
  CHECK(runtime_load_error(bad, "float8-bad").find("linears") != std::string::npos);
  // The compiled twin a refusal names must be a shipped runtime.
  std::string twin = yaml;
  const size_t named = twin.find("compiled_runtime: pytorch-compile ");
  REQUIRE(named != std::string::npos);
  twin.replace(named, std::string("compiled_runtime: pytorch-compile").size(), "compiled_runtime: pytorch-compiled");
  CHECK(runtime_load_error(twin, "float8-twin").find("float8.compiled_runtime") != std::string::npos);
  CHECK(runtime_load_error(twin, "float8-twin").find("'pytorch-compiled' is not a shipped runtime") !=
        std::string::npos);
}

TEST_CASE("runtime profile: the compute-cost split names its threshold rule, parsed strictly") {
  // pytorch.yaml says nothing of the split (the even split); with the compute-cost split the rule is required.
  CHECK(load_error_with_sharding_line("pipeline_stage_split: compute-cost").find("pipeline_stage_threshold") !=
        std::string::npos);
  std::string yaml = runtime_text("pytorch");
  const std::string anchor = "sharding:\n";
  yaml.insert(yaml.find(anchor) + anchor.size(),
              "  pipeline_stage_split: compute-cost\n  pipeline_stage_threshold: exceeded\n");
  CHECK(runtime_load_error(yaml, "stage-threshold").empty());
  CHECK(load_error_with_sharding_line("pipeline_stage_threshold: reached")
            .find("only with pipeline_stage_split: compute-cost") != std::string::npos);
  const std::string wrong = runtime_load_error(
      runtime_text("nanotron")
          .replace(runtime_text("nanotron").find("pipeline_stage_threshold: reached"),
                   std::string("pipeline_stage_threshold: reached").size(), "pipeline_stage_threshold: equal"),
      "stage-threshold-value");
  CHECK(wrong.find("pipeline_stage_threshold") != std::string::npos);
  // A profile derived from nanotron's may change the rule alone; over an even split it is refused.
  CHECK(runtime_load_error("base: nanotron\nname: nano-exceeded\nsharding:\n  pipeline_stage_threshold: exceeded\n",
                           "stage-threshold-derived")
            .empty());
  CHECK(runtime_load_error("base: pytorch\nname: even\nsharding:\n  pipeline_stage_threshold: exceeded\n",
                           "stage-threshold-even")
            .find("only with pipeline_stage_split: compute-cost") != std::string::npos);
  // nanotron's: reached (the playbook's runs, configs/runtimes/nanotron.yaml); the others split evenly.
  CHECK(runtime("nanotron").pipeline_stage_closes_on_reaching);
  CHECK_FALSE(runtime("pytorch").pipeline_split_by_cost);
}

TEST_CASE("runs: the strategies and offload modes a runtime runs, strictly read, and the capability rule on them") {
  // What each shipped framework runs (configs/runtimes/*.yaml section runs, with their sources there); fsdp-run and
  // a profile without the section run everything the simulator prices.
  const RuntimeSupport nanotron = runtime("nanotron").support, pytorch = runtime("pytorch").support;
  CHECK(nanotron.strategies == std::vector<StrategyKind>{StrategyKind::Ddp, StrategyKind::Zero1});
  CHECK(nanotron.offloads == std::vector<Offload>{Offload::None});
  CHECK_FALSE(pytorch.runs(StrategyKind::Zero1));
  CHECK_FALSE(pytorch.runs(Offload::Optimizer));
  CHECK(pytorch.runs(Offload::Params));
  // Derived profiles inherit the lists (pytorch-compile from pytorch, torchtitan-2510 from torchtitan).
  CHECK(runtime("pytorch-compile").support.strategies == pytorch.strategies);
  CHECK_FALSE(runtime("torchtitan-2510").support.runs(Offload::Optimizer));
  CHECK(runtime("pytorch-fsdp1").support.runs(StrategyKind::NoShard));
  CHECK_FALSE(runtime("transformers-deepspeed").support.runs(StrategyKind::Fsdp));
  for (StrategyKind k : {StrategyKind::NoShard, StrategyKind::Ddp, StrategyKind::Zero1, StrategyKind::Zero2,
                         StrategyKind::Zero3, StrategyKind::Fsdp, StrategyKind::FsdpGradOp, StrategyKind::Hsdp})
    CHECK(runtime("fsdp-run").support.runs(k));
  CHECK(runtime("fsdp-run").support.runs(Offload::Optimizer));
  CHECK(runtime("fsdp-run").support.runs(CkptPolicy::Selective));
  // Checkpointing: the attention-core policy is fsdp-run's; nanotron and DeepSpeed under Transformers checkpoint every
  // layer or none; torchtitan every N-th block and the per-op list too, not a fraction.
  CHECK(nanotron.ckpt_policies == std::vector<CkptPolicy>{CkptPolicy::None, CkptPolicy::Full});
  CHECK_FALSE(pytorch.runs(CkptPolicy::Selective));
  CHECK(pytorch.runs(CkptPolicy::Fraction));
  CHECK(runtime("torchtitan-2506-compile").support.runs(CkptPolicy::Every));
  CHECK_FALSE(runtime("torchtitan").support.runs(CkptPolicy::Fraction));
  Strategy every;
  CHECK(parse_act_ckpt("every:2", every));
  CHECK(policy_of(every) == CkptPolicy::Every);
  CHECK(parse_act_ckpt("fraction:0.5", every));
  CHECK(policy_of(every) == CkptPolicy::Fraction);
  CHECK(parse_act_ckpt("full", every));
  CHECK(policy_of(every) == CkptPolicy::Full);

  // Strict reading: a name that is not a strategy or an offload mode, a list without none, an unknown key.
  auto with = [](const std::string& from, const std::string& to) {
    std::string yaml = runtime_text("pytorch");
    const size_t at = yaml.find(from);
    REQUIRE(at != std::string::npos);
    yaml.replace(at, from.size(), to);
    return runtime_load_error(yaml, "runs");
  };
  const std::string strategies = "strategies: [ddp, fsdp, fsdp-grad-op, hsdp]";
  CHECK(with(strategies, "strategies: [ddp, fsdp2]").find("'fsdp2' is not a strategy") != std::string::npos);
  CHECK(with(strategies, "strategies: []").find("names no strategy") != std::string::npos);
  CHECK(with("offload: [none, params]", "offload: [params]").find("must include none") != std::string::npos);
  CHECK(with("offload: [none, params]", "offload: [none, disk]").find("'disk' is not an offload mode") !=
        std::string::npos);
  CHECK(with(strategies, strategies + "\n  pipelines: [1f1b]").find("pipelines") != std::string::npos);
  const std::string ckpt = "act_ckpt: [none, full, selective-op, every, fraction]";
  CHECK(with(ckpt, "act_ckpt: [none, layer]").find("'layer' is not a checkpointing policy") != std::string::npos);
  CHECK(with(ckpt, "act_ckpt: [full]").find("must include none") != std::string::npos);

  // The capability table refuses what the runtime does not run, naming the flag and the runtime.
  ModuleGraph g(zoo("llama3-8b"));
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  const MeshWorld w{8, 8};
  const auto strategy = first_violation(s, g.spec(), w, nanotron);
  REQUIRE(strategy);
  CHECK(strategy->rule == CapabilityRule::RuntimeStrategy);
  CHECK(strategy->flag == "--strategy");
  CHECK(strategy->reason == "nanotron runs ddp, zero1, not fsdp (its runtime profile's runs.strategies)");
  s.offload = Offload::Optimizer;
  const auto offload = first_violation(s, g.spec(), w, pytorch);
  REQUIRE(offload);
  CHECK(offload->flag == "--offload");
  CHECK(offload->reason.find("pytorch offloads none, params, not optimizer") == 0);
  s.offload = Offload::Params;
  CHECK_FALSE(first_violation(s, g.spec(), w, pytorch));
  // DeepSpeed's AutoTP: tensor parallelism without sequence parallelism, beside ZeRO-1/2 only, and no pipeline.
  const RuntimeSupport deepspeed = runtime("deepspeed").support;
  CHECK_FALSE(deepspeed.sequence_parallel);
  CHECK_FALSE(deepspeed.pipeline_parallel);
  CHECK(deepspeed.tensor_parallel);
  CHECK(runtime("transformers-deepspeed").support.tp_with_zero3 == false);
  Strategy autotp;
  autotp.kind = StrategyKind::Zero2;
  autotp.mesh.tp = 2;
  autotp.mesh.sequence_parallel = false;
  CHECK_FALSE(first_violation(autotp, g.spec(), w, deepspeed));
  autotp.kind = StrategyKind::Zero3;
  const auto zero3_tp = first_violation(autotp, g.spec(), w, deepspeed);
  REQUIRE(zero3_tp);
  CHECK(zero3_tp->flag == "--tp");
  CHECK(zero3_tp->reason.find("ZeRO stages 1 and 2, not zero3") != std::string::npos);
  s.act_ckpt = ActCkpt::Selective;
  const auto ckpt_refused = first_violation(s, g.spec(), w, pytorch);
  REQUIRE(ckpt_refused);
  CHECK(ckpt_refused->flag == "--act-ckpt");
  CHECK(ckpt_refused->reason.find("pytorch checkpoints none, full, selective-op, every, fraction, not selective") == 0);

  // Wrap: torchtitan and DeepSpeed build one decoder layer a unit, FSDP2 no size-based units, FSDP1 no groups of
  // layers; fsdp-run everything. The rule applies where parameters are sharded only.
  const RuntimeSupport titan = runtime("torchtitan-2510").support;
  CHECK(titan.wraps == std::vector<WrapKind>{WrapKind::Layer});
  CHECK(runtime("transformers-deepspeed").support.wraps == std::vector<WrapKind>{WrapKind::Layer});
  CHECK_FALSE(pytorch.runs(WrapKind::Size));
  CHECK(pytorch.runs(WrapKind::EveryK));
  CHECK(runtime("pytorch-fsdp1-compile").support.runs(WrapKind::Size));
  CHECK_FALSE(runtime("pytorch-fsdp1").support.runs(WrapKind::EveryK));
  for (WrapKind k : {WrapKind::Layer, WrapKind::EveryK, WrapKind::Size, WrapKind::Model})
    CHECK(runtime("fsdp-run").support.runs(k));
  Strategy grouped;
  grouped.kind = StrategyKind::Fsdp;
  REQUIRE(parse_wrap("every:2", grouped.wrap));
  const auto wrap_refused = first_violation(grouped, g.spec(), w, titan);
  REQUIRE(wrap_refused);
  CHECK(wrap_refused->rule == CapabilityRule::RuntimeStrategy);
  CHECK(wrap_refused->flag == "--wrap");
  CHECK(wrap_refused->reason == "torchtitan-2510 wraps layer, not every:2 (its runtime profile's runs.wrap)");
  CHECK_FALSE(first_violation(grouped, g.spec(), w, pytorch));
  grouped.kind = StrategyKind::Ddp;  // no sharded parameters: no unit to build
  CHECK_FALSE(first_violation(grouped, g.spec(), w, titan));
  const std::string wrap = "wrap: [layer, every, model]";
  CHECK(with(wrap, "wrap: [every, model]").find("must include layer") != std::string::npos);
  CHECK(with(wrap, "wrap: [layer, block]").find("'block' is not a wrap family") != std::string::npos);
}
