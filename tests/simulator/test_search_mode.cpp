// The planner's search simulates without the per-op memory samples (SimulationInput::memory_samples = false): every
// other field of the prediction must be what the full simulation gives, bit for bit, on every kind of plan (data
// parallel kinds, tensor and pipeline parallelism, offload, CUDA and a CPU device whose backend buffers race).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/errors.hpp"
#include "memory/memory_walk.hpp"
#include "model/model_loader.hpp"
#include "program/step_program.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

using namespace fsdp;

namespace {

void check_same_except_samples(const Prediction& full, const Prediction& search) {
  const MemoryResult& a = full.memory;
  const MemoryResult& b = search.memory;
  CHECK(b.samples.empty());
  CHECK(a.samples.size() > 0);
  CHECK(a.peak_allocated == b.peak_allocated);
  CHECK(a.peak_allocated_floor == b.peak_allocated_floor);
  CHECK(a.peak_allocated_after_backward == b.peak_allocated_after_backward);
  CHECK(a.reserved_peak == b.reserved_peak);
  CHECK(a.device_total == b.device_total);
  CHECK(a.breakdown == b.breakdown);
  CHECK(a.peak_phase == b.peak_phase);
  CHECK(a.peak_op == b.peak_op);
  CHECK(a.host_bytes_per_node == b.host_bytes_per_node);
  CHECK(a.reduce_pool_cached == b.reduce_pool_cached);
  CHECK(a.step_segments == b.step_segments);
  CHECK(a.collective_inputs_held == b.collective_inputs_held);
  CHECK(a.capped_at_device == b.capped_at_device);
  // The walk's peak is the most of its per-op totals (the samples), and the totals are those of the search's walk.
  double most = 0;
  for (const MemorySample& s : a.samples) most = std::max(most, s.allocated);
  CHECK(most <= a.peak_allocated);
  CHECK(full.time.step_s == search.time.step_s);
  CHECK(full.time.compute_s == search.time.compute_s);
  CHECK(full.time.exposed_comm_s == search.time.exposed_comm_s);
  CHECK(full.time.pipeline_bubble_s == search.time.pipeline_bubble_s);
  CHECK(full.fits == search.fits);
  CHECK(full.host_fits == search.host_fits);
  CHECK(full.mfu == search.mfu);
}

}  // namespace

TEST_CASE("search mode: a simulation without memory samples equals the full one in every other field") {
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  int64_t plans = 0;
  for (const std::string hw_name : {"h100-80gb", "cpu"}) {
    const HardwareProfile hw = load_hardware(hw_name, FSDP_SOURCE_ROOT);
    for (const std::string model : {"llama3-8b", "gemma2-9b"}) {
      const ModuleGraph graph{load_model(model, FSDP_SOURCE_ROOT)};
      EmitMemo memo;
      for (int64_t pp : {1, 2, 4})
        for (int64_t tp : {1, 2})
          for (int64_t mb : {1, 2})
            for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Zero1, StrategyKind::Ddp})
              for (Offload off : {Offload::None, Offload::Optimizer})
                for (ActCkpt ck : {ActCkpt::None, ActCkpt::Full}) {
                  Strategy s;
                  s.kind = kind;
                  s.offload = off;
                  s.act_ckpt = ck;
                  s.seq_len = 4096;
                  s.micro_batch = mb;
                  s.grad_accum = 4;
                  s.mesh.tp = tp;
                  s.mesh.pp = pp;
                  const Cluster c{2, 8};
                  if (!test::valid_plan(s, graph.spec(), c)) continue;
                  SimulationInput in{&graph, &hw, &rt, c, s};
                  in.memo = &memo;
                  StepProgram full_prog, search_prog;
                  const Prediction full = simulate(in, &full_prog);
                  in.memory_samples = false;
                  const Prediction search = simulate(in, &search_prog);
                  CHECK(full_prog.ops.size() == search_prog.ops.size());
                  check_same_except_samples(full, search);
                  // And the walk alone, either way.
                  const MemoryResult w = walk_memory(full_prog, rt, c.gpus_per_node, !hw.device_is_host(), false);
                  const MemoryResult v = walk_memory(full_prog, rt, c.gpus_per_node, !hw.device_is_host(), true);
                  CHECK(w.samples.empty());
                  CHECK(v.samples.size() == full_prog.ops.size());
                  CHECK(w.peak_allocated == v.peak_allocated);
                  CHECK(w.peak_allocated_floor == v.peak_allocated_floor);
                  CHECK(w.device_total == v.device_total);
                  ++plans;
                }
    }
  }
  CHECK(plans > 100);
}

TEST_CASE("an op packs its one-byte and four-byte fields together") {
  // Op is copied once per emission and read by the walk and the timeline: it must stay small and trivially
  // copyable (step_program.hpp, the field order).
  static_assert(std::is_trivially_copyable_v<Op>);
  static_assert(sizeof(OpKind) == 1 && sizeof(Stream) == 1);
  CHECK(sizeof(Op) <= 320);  // 304 before Op::device_copy_bytes, 312 before Op::float8_cast_bytes
}
