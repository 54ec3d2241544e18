// The step program as a runtime observes it (simulator/program/step_trace.hpp program_trace), for the mesh: a
// unit's tensor-parallel collectives one entry per call in the order Megatron-LM and fsdp-run issue them, the head's
// with the head, the vocabulary-parallel loss's calls, the norms' gradient sums, and a pipeline stage's passes in its
// schedule's order with the gathers that order implies. fsdp-run's recorded steps are compared with these traces in
// tests/accuracy (grid rows 55-61); here the order itself, on Llama 3 8B's shape.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "model/model_loader.hpp"
#include "program/step_trace.hpp"
#include "program/tensor_parallel.hpp"
#include "simulate.hpp"

using namespace fsdp;

namespace {

const ModuleGraph& llama8b() {
  static const ModuleGraph g(load_model("llama3-8b", FSDP_SOURCE_ROOT));
  return g;
}

const RuntimeProfile& runtime(const std::string& name) {
  static const RuntimeProfile fsdp_run = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  static const RuntimeProfile torchtitan = load_runtime("torchtitan", FSDP_SOURCE_ROOT);
  return name == "fsdp-run" ? fsdp_run : torchtitan;
}

StepProgram emit(const Strategy& s, int64_t gpus, const std::string& rt = "fsdp-run", int64_t stage = 0) {
  ProgramInput in;
  in.graph = &llama8b();
  in.cluster = Cluster{1, gpus};
  in.strategy = s;
  in.runtime = &runtime(rt);
  in.pipeline_stage = stage;
  return emit_step_program(in);
}

Strategy mesh_plan(StrategyKind kind, int64_t tp, int64_t pp, int64_t accum, bool sp = true) {
  Strategy s;
  s.kind = kind;
  s.seq_len = 4096;
  s.micro_batch = 1;
  s.grad_accum = accum;
  s.mesh.tp = tp;
  s.mesh.sequence_parallel = sp && tp > 1;
  s.mesh.pp = pp;
  return s;
}

// The trace's entries of `phase` (all units and micro-batches), in order.
std::vector<TraceEntry> of_phase(const std::vector<TraceEntry>& t, Phase phase) {
  std::vector<TraceEntry> out;
  for (const TraceEntry& e : t)
    if (e.phase == phase) out.push_back(e);
  return out;
}

// "ag rs ..." for the collectives of `phase` on `unit` in `micro_batch`.
std::string kinds(const std::vector<TraceEntry>& t, Phase phase, int unit, int micro_batch) {
  std::string s;
  for (const TraceEntry& e : t) {
    if (e.phase != phase || e.unit != unit || e.micro_batch != micro_batch) continue;
    if (!s.empty()) s += ' ';
    s += e.collective == CollectiveKind::AllGather       ? "ag"
         : e.collective == CollectiveKind::ReduceScatter ? "rs"
         : e.collective == CollectiveKind::AllReduce     ? "ar"
                                                         : "?";
  }
  return s;
}

// "fwd0 bwd1 ..." for the parameter gathers of `unit` in the trace's order.
std::string gathers_of(const StepProgram& p, int unit) {
  std::string s;
  for (const TraceEntry& e : program_trace(p))
    if (e.unit == unit && (e.phase == Phase::FwdAllGather || e.phase == Phase::BwdAllGather))
      s += std::string(e.phase == Phase::FwdAllGather ? "fwd" : "bwd") + std::to_string(e.micro_batch) + " ";
  return s;
}

// What the walk's events add to and release of `unit`'s unsharded parameters, over micro-batch `micro_batch` (-1:
// all of them).
double unsharded_params_net(const StepProgram& p, int unit, int micro_batch) {
  double net = 0;
  for (const Op& op : p.ops) {
    if (op.unit != unit || (micro_batch >= 0 && op.micro_batch != micro_batch)) continue;
    for (const MemEvent& e : op.on_issue)
      if (e.category == MemoryCategory::UnshardedParams) net += e.bytes;
    for (const MemEvent& e : op.on_complete)
      if (e.category == MemoryCategory::UnshardedParams) net += e.bytes;
  }
  return net;
}

}  // namespace

TEST_CASE("step trace, tp: a layer's collectives one entry per call, the blocks' kinds in turn") {
  // DDP over tp 2 with sequence parallelism, wrap=layer: unit 1 is layers.0. Korthikanti et al. 2022 Fig. 5:
  // the attention's gather and reduce-scatter, then the MLP's; backward their conjugates in reverse block order.
  const std::vector<TraceEntry> t = program_trace(emit(mesh_plan(StrategyKind::Ddp, 2, 1, 1), 2));
  CHECK(kinds(t, Phase::TpForwardCollectives, 1, 0) == "ag rs ag rs");
  CHECK(kinds(t, Phase::TpBackwardCollectives, 1, 0) == "ag rs ag rs");
  // The root's own: the embedding's output reduce-scattered in forward, its gradient gathered in backward.
  CHECK(kinds(t, Phase::TpForwardCollectives, 0, 0) == "rs ag");
  CHECK(kinds(t, Phase::TpBackwardCollectives, 0, 0) == "rs ag");
  // Without sequence parallelism: an all-reduce after each row-parallel linear (forward) and before each
  // column-parallel block's input gradient (backward).
  const std::vector<TraceEntry> no_sp = program_trace(emit(mesh_plan(StrategyKind::Ddp, 2, 1, 1, false), 2));
  CHECK(kinds(no_sp, Phase::TpForwardCollectives, 1, 0) == "ar ar");
  CHECK(kinds(no_sp, Phase::TpBackwardCollectives, 1, 0) == "ar ar");
  CHECK(kinds(no_sp, Phase::TpForwardCollectives, 0, 0) == "ar");   // the embedding's
  CHECK(kinds(no_sp, Phase::TpBackwardCollectives, 0, 0) == "ar");  // the head's input gradient
}

TEST_CASE("step trace, tp: the head's collectives run with the head, not with the root's forward and backward") {
  const std::vector<TraceEntry> t = program_trace(emit(mesh_plan(StrategyKind::Ddp, 2, 1, 1), 2));
  // Positions of: the last layer's forward collectives, the head's gather (root, forward), the loss's all-reduces,
  // the head's input-gradient reduce-scatter (root, backward), the last layer's backward collectives.
  const int last = static_cast<int>(llama8b().layers().size());  // unit index of layers.31
  int last_fwd = -1, head_gather = -1, loss = -1, head_rs = -1, last_bwd = -1, embedding_rs = -1;
  for (size_t i = 0; i < t.size(); ++i) {
    const TraceEntry& e = t[i];
    const int at = static_cast<int>(i);
    if (e.phase == Phase::TpForwardCollectives && e.unit == last) last_fwd = at;
    if (e.phase == Phase::TpForwardCollectives && e.unit == 0 && e.collective == CollectiveKind::AllGather)
      head_gather = at;
    if (e.phase == Phase::TpForwardCollectives && e.unit == 0 && e.collective == CollectiveKind::ReduceScatter)
      embedding_rs = at;
    if (e.phase == Phase::TpLossAllReduce && loss < 0) loss = at;
    if (e.phase == Phase::TpBackwardCollectives && e.unit == 0 && e.collective == CollectiveKind::ReduceScatter)
      head_rs = at;
    if (e.phase == Phase::TpBackwardCollectives && e.unit == last && last_bwd < 0) last_bwd = at;
  }
  REQUIRE(embedding_rs >= 0);
  CHECK(embedding_rs < last_fwd);
  CHECK(last_fwd < head_gather);
  CHECK(head_gather < loss);
  CHECK(loss < head_rs);
  CHECK(head_rs < last_bwd);
}

TEST_CASE("step trace, tp: the vocabulary-parallel loss's all-reduces, fused (fsdp-run) or separate (DTensor)") {
  const double tokens = 4096;
  const std::vector<TraceEntry> fused =
      of_phase(program_trace(emit(mesh_plan(StrategyKind::Ddp, 2, 1, 1), 2)), Phase::TpLossAllReduce);
  REQUIRE(fused.size() == 2);  // the maximum, then the target logit and the sum of exponentials in one call
  CHECK(fused[0].bytes == static_cast<int64_t>(tokens * 4));
  CHECK(fused[1].bytes == static_cast<int64_t>(tokens * 8));
  const std::vector<TraceEntry> separate =
      of_phase(program_trace(emit(mesh_plan(StrategyKind::Fsdp, 2, 1, 1), 2, "torchtitan")), Phase::TpLossAllReduce);
  REQUIRE(separate.size() == 3);
  for (const TraceEntry& e : separate) CHECK(e.bytes == static_cast<int64_t>(tokens * 4));
}

TEST_CASE("step trace, tp: the norms' gradients summed per unit and micro-batch (fsdp-run) or once a step") {
  // Llama 3 8B's layer holds two RMSNorms of 4096, the root the final norm: per unit in the compute dtype (bf16,
  // the default Strategy's).
  const std::vector<TraceEntry> per_unit =
      of_phase(program_trace(emit(mesh_plan(StrategyKind::Ddp, 2, 1, 2), 2)), Phase::TpNormGradAllReduce);
  const size_t units = llama8b().layers().size() + 1;
  REQUIRE(per_unit.size() == 2 * units);  // every unit, both micro-batches
  CHECK(per_unit.front().micro_batch == 0);
  CHECK(per_unit.back().micro_batch == 1);
  CHECK(per_unit.front().unit == static_cast<int>(units) - 1);  // the backward's first unit: layers.31
  CHECK(per_unit.front().bytes == 2 * 4096 * 2);
  CHECK(per_unit.back().unit == 0);  // the root: the final norm
  CHECK(per_unit.back().bytes == 4096 * 2);
  // torchtitan's profile says nothing: once a step, after the last backward, every norm at once.
  const std::vector<TraceEntry> per_step = of_phase(
      program_trace(emit(mesh_plan(StrategyKind::Fsdp, 2, 1, 2), 2, "torchtitan")), Phase::TpNormGradAllReduce);
  REQUIRE(per_step.size() == 1);
  CHECK(per_step.front().micro_batch == 1);
}

TEST_CASE("step trace, pp: a stage's passes in its schedule's order, transfers under the micro-batch they carry") {
  // ZeRO-1 on pp 2 (2 GPUs, dp 1), 4 micro-batches, of which the program emits the first, one middle and the
  // last (0, 1, 3). Stage 0 under 1F1B: F0 F1 B0 F2 B1 F3 B2 B3, so F0 F1 B0 B1 F3 B3; under GPipe every forward
  // first. Each pass's transfer: the activations sent at a forward's end, the gradient received at a backward's
  // start.
  auto passes = [](PipelineSchedule sched) {
    Strategy s = mesh_plan(StrategyKind::Zero1, 1, 2, 4);
    s.mesh.pp_schedule = sched;
    std::string out;
    for (const TraceEntry& e : program_trace(emit(s, 2))) {
      if (e.phase == Phase::PipelineSendActivations) out += "F" + std::to_string(e.micro_batch) + " ";
      if (e.phase == Phase::PipelineRecvGradients) out += "B" + std::to_string(e.micro_batch) + " ";
    }
    return out;
  };
  CHECK(passes(PipelineSchedule::OneFOneB) == "F0 F1 B0 B1 F3 B3 ");
  CHECK(passes(PipelineSchedule::GPipe) == "F0 F1 F3 B0 B1 B3 ");
  // The last stage runs a forward and its backward in turn (no warm-up): the program's own order.
  std::string last;
  for (const TraceEntry& e : program_trace(emit(mesh_plan(StrategyKind::Zero1, 1, 2, 4), 2, "fsdp-run", 1))) {
    if (e.phase == Phase::PipelineRecvActivations) last += "F" + std::to_string(e.micro_batch) + " ";
    if (e.phase == Phase::PipelineSendGradients) last += "B" + std::to_string(e.micro_batch) + " ";
  }
  CHECK(last == "F0 B0 F1 B1 F3 B3 ");
}

TEST_CASE("step trace, pp: a unit kept gathered after forward is gathered where the schedule resharded it") {
  // FSDP on pp 2 x dp 2, 2 micro-batches, stage 0 under 1F1B: F0 F1 B0 B1. The root (kept after forward) is
  // gathered in F0, still resident in F1, resharded at the end of B0 and gathered again in B1's backward.
  Strategy s = mesh_plan(StrategyKind::Fsdp, 1, 2, 2);
  const StepProgram p = emit(s, 4);
  CHECK(gathers_of(p, 0) == "fwd0 bwd1 ");
  // The walk holds the root's parameters once: the resident forward adds them without a gather, the backward's
  // gather moves them without adding them again, and the reshard after each backward frees them once.
  const double root_params = unsharded_params_net(p, 0, 1);
  CHECK(root_params == 0.0);  // added by micro-batch 1's resident forward, freed by its post-backward
  // Without a pipeline every forward gathers it (the previous micro-batch's backward resharded it).
  CHECK(gathers_of(emit(mesh_plan(StrategyKind::Fsdp, 1, 1, 2), 2), 0) == "fwd0 fwd1 ");
}

TEST_CASE("step trace, pp: torch.distributed.pipelining keeps the stage's units gathered through the step") {
  // torchtitan's profile (pipeline_reshard_after_backward: last): FSDP without resharding after forward (torchtitan's
  // policy under pipeline parallelism), pp 2 x dp 2, 4 micro-batches. Every unit is gathered once, at the first
  // micro-batch's forward, and resharded at the last one's backward; fsdp-run reshards at every backward and gathers
  // again.
  Strategy s = mesh_plan(StrategyKind::Fsdp, 1, 2, 4);
  s.reshard_after_forward = false;
  auto gathers = [&](const std::string& rt, int& forward, int& backward) {
    forward = backward = 0;
    for (const TraceEntry& e : program_trace(emit(s, 4, rt))) {
      forward += e.phase == Phase::FwdAllGather ? 1 : 0;
      backward += e.phase == Phase::BwdAllGather ? 1 : 0;
    }
  };
  const int units = static_cast<int>(llama8b().layers().size()) / 2 + 1;  // stage 0: 16 layers and the root
  int fwd = 0, bwd = 0;
  gathers("torchtitan", fwd, bwd);
  CHECK(fwd == units);
  CHECK(bwd == 0);
  gathers("fsdp-run", fwd, bwd);
  CHECK(fwd > units);  // the forwards after a backward gather again (micro-batches 1 and 3 of those emitted)
  CHECK(bwd > 0);      // and the backwards after a backward
  // The walk holds every unit's parameters from the first gather to the last backward: released only there.
  const StepProgram p = emit(s, 4, "torchtitan");
  double released_early = 0, released_last = 0;
  for (const Op& op : p.ops)
    for (const MemEvent& e : op.on_complete)
      if (e.category == MemoryCategory::UnshardedParams && e.bytes < 0 && op.phase == Phase::PostBackward)
        (op.micro_batch == 3 ? released_last : released_early) += e.bytes;
  CHECK(released_early == 0.0);
  CHECK(released_last < 0.0);
}

TEST_CASE("step trace, tp: q/k norms see only the rank's heads: their gradients summed over tp without SP too") {
  // Qwen3 8B: q_norm and k_norm of head_dim 128 in each layer's attention. Without sequence parallelism the layer
  // norms see the whole sequence on every rank (equal gradients, nothing summed), the q/k norms only the rank's heads:
  // each unit's post-backward sums 2 x 128 values (fsdp-run, bf16). With sequence parallelism every norm is summed.
  static const ModuleGraph qwen(load_model("qwen3-8b", FSDP_SOURCE_ROOT));
  auto norm_sums = [](bool sp) {
    ProgramInput in;
    in.graph = &qwen;
    in.cluster = Cluster{1, 2};
    in.strategy = mesh_plan(StrategyKind::Fsdp, 2, 1, 1, sp);
    in.runtime = &runtime("fsdp-run");
    std::vector<int64_t> bytes;
    for (const TraceEntry& e : program_trace(emit_step_program(in)))
      if (e.phase == Phase::TpNormGradAllReduce) bytes.push_back(e.bytes);
    return bytes;
  };
  const int64_t head_dim = qwen.spec().head_dim, hidden = qwen.spec().hidden_size;
  const std::vector<int64_t> no_sp = norm_sums(false);
  REQUIRE(no_sp.size() == qwen.layers().size());  // the layer units; the root has no q/k norm
  for (int64_t b : no_sp) CHECK(b == 2 * head_dim * 2);
  const std::vector<int64_t> sp = norm_sums(true);
  REQUIRE(sp.size() == qwen.layers().size() + 1);  // and the root's final norm
  CHECK(sp.front() == (2 * head_dim + 2 * hidden) * 2);
  CHECK(sp.back() == hidden * 2);
  // What the layer's norms save whole on every rank without sequence parallelism: the two layer norms' inputs, not
  // the q/k norms' (split like the heads).
  ActivationQuery q;
  q.seq_len = 4096;
  const ModuleId layer = qwen.layers().front();
  double whole = 0, attention = 0;
  for (ModuleId leaf : qwen.leaves_under(layer))
    if (qwen.node(leaf).kind == ModuleKind::Norm) whole += qwen.saved_bytes_per_token(leaf, q, ActCkpt::None);
  for (ModuleId child : qwen.children(layer))
    if (qwen.node(child).kind == ModuleKind::Attention)
      for (ModuleId leaf : qwen.leaves_under(child))
        if (qwen.node(leaf).kind == ModuleKind::Norm) attention += qwen.saved_bytes_per_token(leaf, q, ActCkpt::None);
  CHECK(attention > 0);
  CHECK(norm_saved_bytes_per_token(qwen, layer, q) == doctest::Approx(whole - attention));
}

TEST_CASE("step trace, pp: under torch.distributed.pipelining a unit resharded after forward is found unsharded") {
  // torchtitan's profile, FSDP resharding after forward, pp 2 x dp 2, 4 micro-batches (emitted 0, 1, 3), stage 0
  // under 1F1B: F0 F1 B0 F2 B1 F3 B2 B3. No backward but the last reshards, so layers.0 is gathered by F0, F1 (after a
  // forward), B0, B1 (each after a forward) and B2, and found unsharded by F2, F3 (after a backward) and B3.
  Strategy s = mesh_plan(StrategyKind::Fsdp, 1, 2, 4);
  s.reshard_after_forward = true;
  const StepProgram p = emit(s, 4, "torchtitan");
  CHECK(gathers_of(p, 1) == "fwd0 fwd1 bwd0 bwd1 ");
  // The walk: every op of layers.0 that adds or releases its parameters, summed, leaves nothing held after the step.
  const double net = unsharded_params_net(p, 1, -1);
  CHECK(net == doctest::Approx(0.0));
}
