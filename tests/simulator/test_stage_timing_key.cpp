// The stages between the first and the last of a pipeline plan that simulate() times once for all of equal key
// (simulator/program/stage_timing_key.hpp): over a grid of plans, every two such stages of equal key, each emitted
// and timed in full, have bit-identical timelines; and simulate() reports the same step as the stages timed one by
// one.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "program/pipeline_parallel.hpp"
#include "program/stage_timing_key.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;

namespace {

// Every field of two timelines, bit for bit.
bool identical(const TimelineResult& a, const TimelineResult& b) {
  if (a.ops.size() != b.ops.size()) return false;
  for (size_t i = 0; i < a.ops.size(); ++i)
    if (a.ops[i].start != b.ops[i].start || a.ops[i].end != b.ops[i].end) return false;
  return a.step_s == b.step_s && a.compute_s == b.compute_s && a.comm_s == b.comm_s &&
         a.exposed_comm_s == b.exposed_comm_s && a.offload_s == b.offload_s &&
         a.exposed_offload_s == b.exposed_offload_s && a.optimizer_s == b.optimizer_s &&
         a.optimizer_phase_s == b.optimizer_phase_s && a.contention_s == b.contention_s && a.tp_comm_s == b.tp_comm_s &&
         a.pp_comm_s == b.pp_comm_s && a.pipeline_bubble_s == b.pipeline_bubble_s &&
         a.pipeline_micro_batch_s == b.pipeline_micro_batch_s && a.host_wait_s == b.host_wait_s;
}

struct Ckpt {
  ActCkpt mode;
  int64_t every;
};

}  // namespace

TEST_CASE("stage timing key: stages between of equal key time bit-identically, and simulate() reports their step") {
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  const HardwareProfile hw = load_hardware("h100-80gb", FSDP_SOURCE_ROOT);
  // A uniform stack, and one whose every fourth layer attends globally without RoPE and the others within chunks
  // (Llama 4 Scout's NoPE layers: two classes of decoder layer, so stages of 6 layers alternate in key). Gemma's
  // alternating windows would do too, but its tied embeddings refuse pipeline parallelism.
  for (const std::string model : {"llama3-8b", "llama4-scout-17b-16e"}) {
    ModelSpec spec = load_model(model, FSDP_SOURCE_ROOT);
    if (spec.vision && spec.vision->image_tokens <= 0) spec.vision->image_tokens = 576;
    const ModuleGraph graph{spec};
    int64_t equal_pairs = 0, unequal_pairs = 0, plans = 0;
    for (int64_t pp : {4, 8})
      for (PipelineSchedule sched : {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe})
        for (int64_t tp : {1, 2})
          for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Zero1})
            for (WrapPolicy wrap : {WrapPolicy{WrapKind::Layer, 1, 0}, WrapPolicy{WrapKind::EveryK, 3, 0},
                                    WrapPolicy{WrapKind::Model, 1, 0}})
              for (Ckpt ck : {Ckpt{ActCkpt::None, 1}, Ckpt{ActCkpt::Selective, 1}, Ckpt{ActCkpt::Full, 2}})
                for (int64_t accum : {1, 3, 16}) {
                  if (kind == StrategyKind::Zero1 && wrap.kind != WrapKind::Layer) continue;  // one wrap unsharded
                  Strategy s;
                  s.kind = kind;
                  s.wrap = wrap;
                  s.act_ckpt = ck.mode;
                  s.ckpt_every = ck.every;
                  s.seq_len = 8192;
                  s.micro_batch = 1;
                  s.grad_accum = accum;
                  s.mesh.tp = tp;
                  s.mesh.pp = pp;
                  s.mesh.pp_schedule = sched;
                  s.mesh.sequence_parallel = tp > 1;
                  const Cluster c{4, 8};
                  if (!test::valid_plan(s, graph.spec(), c)) continue;
                  ++plans;
                  const SimulationInput in{&graph, &hw, &rt, c, s};
                  const std::vector<WrapUnit> units = strategy_units(graph, s);
                  std::vector<TimelineResult> times;
                  std::vector<std::optional<StageTimingKey>> keys;
                  for (int64_t stage = 0; stage < pp; ++stage) {
                    const StepProgram prog = emit_stage_program(in, stage);
                    times.push_back(run_timeline(prog, hw, c, s));
                    keys.push_back(stage_timing_key(graph, s, rt, units, stage));
                    CHECK(keys.back().has_value() == (stage > 0 && stage < pp - 1));
                  }
                  for (int64_t j = 1; j < pp - 1; ++j)
                    for (int64_t k = j + 1; k < pp - 1; ++k) {
                      const size_t a = static_cast<size_t>(j), b = static_cast<size_t>(k);
                      if (*keys[a] == *keys[b]) {
                        ++equal_pairs;
                        CHECK_MESSAGE(identical(times[a], times[b]),
                                      model << " pp " << pp << " stages " << j << ", " << k);
                      } else {
                        ++unequal_pairs;
                      }
                    }
                  // simulate() with the shared timelines: the slowest stage's pace and the fill and drain of the
                  // stages timed one by one (simulate.cpp).
                  size_t slowest = 0;
                  std::vector<double> per_micro_batch;
                  auto paced = [](const TimelineResult& t) { return t.step_s - t.pipeline_bubble_s; };
                  for (size_t j = 0; j < times.size(); ++j) {
                    per_micro_batch.push_back(times[j].pipeline_micro_batch_s);
                    if (paced(times[j]) > paced(times[slowest])) slowest = j;
                  }
                  const double step = times[slowest].step_s + (pipeline_fill_drain_s(s.mesh, per_micro_batch, slowest) -
                                                               times[slowest].pipeline_bubble_s);
                  StepProgram chosen;
                  const Prediction p = simulate(in, &chosen);
                  CHECK(p.time.step_s == step);
                  CHECK(chosen.layout.stage == static_cast<int64_t>(slowest));
                  CHECK(chosen.ops.size() == p.time.ops.size());
                }
    // The grid exercises both: stages that share a timeline and stages whose layers or units differ.
    CAPTURE(model);
    CHECK(plans > 50);
    CHECK(equal_pairs > 50);
    CHECK(unequal_pairs > 10);
  }
}

TEST_CASE("stage timing key: none for the first and last stage, interleaved 1F1B or nanotron's compute-cost split") {
  const ModuleGraph graph{load_model("llama3-8b", FSDP_SOURCE_ROOT)};
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  const RuntimeProfile nanotron = load_runtime("nanotron", FSDP_SOURCE_ROOT);
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.mesh.pp = 4;
  const std::vector<WrapUnit> units = strategy_units(graph, s);
  CHECK_FALSE(stage_timing_key(graph, s, rt, units, 0).has_value());
  CHECK_FALSE(stage_timing_key(graph, s, rt, units, 3).has_value());
  CHECK(stage_timing_key(graph, s, rt, units, 1).has_value());
  // 32 layers over 4 stages of 8, a unit per layer: stages 1 and 2 alike.
  CHECK(*stage_timing_key(graph, s, rt, units, 1) == *stage_timing_key(graph, s, rt, units, 2));
  CHECK_FALSE(stage_timing_key(graph, s, nanotron, units, 1).has_value());
  s.mesh.pp_schedule = PipelineSchedule::Interleaved1F1B;
  s.mesh.pp_virtual_stages = 2;
  CHECK_FALSE(stage_timing_key(graph, s, rt, units, 1).has_value());
  // every:3 checkpointing over stages of 8 layers: stage 1 (layers 8-15) checkpoints 8, 11, 14; stage 2 (16-23)
  // 17, 20, 23: other offsets, other keys.
  Strategy e;
  e.kind = StrategyKind::Fsdp;
  e.mesh.pp = 4;
  e.act_ckpt = ActCkpt::Full;
  e.ckpt_every = 3;
  CHECK_FALSE(*stage_timing_key(graph, e, rt, units, 1) == *stage_timing_key(graph, e, rt, units, 2));
}
