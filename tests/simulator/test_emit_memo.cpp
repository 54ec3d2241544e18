// The emit memo (simulator/program/emit_memo.hpp): programs emitted with one memo shared across a grid of plans (and
// their pipeline stages) are those emitted without one: the same units, layer classes and shapes, op for op the same
// timeline and the same memory walk, bit for bit.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/errors.hpp"
#include "memory/memory_walk.hpp"
#include "model/model_loader.hpp"
#include "program/emit_memo.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;

namespace {

bool same_memory(const MemoryResult& a, const MemoryResult& b) {
  if (a.samples.size() != b.samples.size()) return false;
  for (size_t i = 0; i < a.samples.size(); ++i)
    if (a.samples[i].op != b.samples[i].op || a.samples[i].allocated != b.samples[i].allocated) return false;
  return a.peak_allocated == b.peak_allocated && a.peak_allocated_floor == b.peak_allocated_floor &&
         a.reserved_peak == b.reserved_peak && a.device_total == b.device_total && a.peak_phase == b.peak_phase &&
         a.breakdown == b.breakdown && a.host_bytes_per_node == b.host_bytes_per_node;
}

bool same_time(const TimelineResult& a, const TimelineResult& b) {
  if (a.ops.size() != b.ops.size()) return false;
  for (size_t i = 0; i < a.ops.size(); ++i)
    if (a.ops[i].start != b.ops[i].start || a.ops[i].end != b.ops[i].end) return false;
  return a.step_s == b.step_s && a.compute_s == b.compute_s && a.comm_s == b.comm_s &&
         a.exposed_comm_s == b.exposed_comm_s && a.pipeline_micro_batch_s == b.pipeline_micro_batch_s;
}

struct Ckpt {
  ActCkpt mode;
  int64_t every;
};

}  // namespace

TEST_CASE("emit memo: programs emitted with a memo shared across plans are those emitted without one") {
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  const HardwareProfile hw = load_hardware("h100-80gb", FSDP_SOURCE_ROOT);
  int64_t programs = 0;
  for (const std::string model : {"llama3-8b", "gemma2-9b"}) {
    const ModuleGraph graph{load_model(model, FSDP_SOURCE_ROOT)};
    EmitMemo memo;  // one for every plan of the model, as the search keeps one
    for (int64_t pp : {1, 4})
      for (int64_t tp : {1, 2})
        for (int64_t mb : {1, 2})
          for (Ckpt ck : {Ckpt{ActCkpt::None, 1}, Ckpt{ActCkpt::Full, 3}, Ckpt{ActCkpt::Selective, 1}})
            for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Zero1, StrategyKind::Ddp})
              for (WrapPolicy wrap : {WrapPolicy{WrapKind::Layer, 1, 0}, WrapPolicy{WrapKind::EveryK, 2, 0}})
                for (DType param : {DType::Bf16, DType::Fp32}) {
                  Strategy s;
                  s.kind = kind;
                  s.wrap = wrap;
                  s.act_ckpt = ck.mode;
                  s.ckpt_every = ck.every;
                  s.param_dtype = param;
                  s.seq_len = 8192;
                  s.micro_batch = mb;
                  s.grad_accum = 4;
                  s.mesh.tp = tp;
                  s.mesh.pp = pp;
                  const Cluster c{2, 8};
                  if (!test::valid_plan(s, graph.spec(), c)) continue;
                  SimulationInput in{&graph, &hw, &rt, c, s};
                  for (int64_t stage = 0; stage < pp; ++stage) {
                    in.memo = &memo;
                    const StepProgram with = emit_stage_program(in, stage);
                    in.memo = nullptr;
                    const StepProgram without = emit_stage_program(in, stage);
                    ++programs;
                    REQUIRE(with.ops.size() == without.ops.size());
                    REQUIRE(with.units.size() == without.units.size());
                    for (size_t u = 0; u < with.units.size(); ++u) {
                      CHECK(with.units[u].name == without.units[u].name);
                      CHECK(with.units[u].params == without.units[u].params);
                    }
                    CHECK(with.layer_shape_of == without.layer_shape_of);
                    CHECK(with.layer_shapes.size() == without.layer_shapes.size());
                    CHECK(same_time(run_timeline(with, hw, c, s), run_timeline(without, hw, c, s)));
                    CHECK(same_memory(walk_memory(with, rt, c.gpus_per_node, true),
                                      walk_memory(without, rt, c.gpus_per_node, true)));
                  }
                  // And whole simulations, the memo's against a fresh one per plan.
                  in.memo = &memo;
                  const Prediction a = simulate(in);
                  in.memo = nullptr;
                  const Prediction b = simulate(in);
                  CHECK(a.time.step_s == b.time.step_s);
                  CHECK(a.memory.device_total == b.memory.device_total);
                }
  }
  CHECK(programs > 200);
}

TEST_CASE("emit memo: one entry per wrap policy") {
  const ModuleGraph a{load_model("llama3-8b", FSDP_SOURCE_ROOT)};
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  EmitMemo memo;
  memo.bind(a, rt);
  CHECK_NOTHROW(memo.bind(a, rt));
  Strategy s;
  CHECK(memo.strategy_units(a, s).size() == strategy_units(a, s).size());
  // The same units again: the memo's entry, not a new one.
  CHECK(&memo.strategy_units(a, s) == &memo.strategy_units(a, s));
  // A replicated strategy builds by one layer per unit whatever its wrap: the fsdp plan's layer-wrap entry.
  Strategy ddp;
  ddp.kind = StrategyKind::Ddp;
  ddp.wrap = WrapPolicy{WrapKind::EveryK, 4, 0};
  CHECK(&memo.strategy_units(a, ddp) == &memo.strategy_units(a, s));
}
