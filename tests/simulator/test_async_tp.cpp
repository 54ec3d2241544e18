// Async tensor parallelism as PyTorch runs it (simulator/timeline/async_tp_overlap.hpp): the decomposed
// all-gather + matmul and matmul + reduce-scatter of torch/distributed/_symmetric_memory, priced from their chunks'
// GEMMs, copy-engine pulls, staging copy and partials' reduction.
#include <doctest/doctest.h>

#include "compute/compute_cost.hpp"
#include "sim_fixtures.hpp"
#include "timeline/async_tp_overlap.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

// Llama 3 8B's FSDP plan on one node of 8 H100s, tp 8 with sequence parallelism, micro-batch 2 x 8192.
Strategy llama3_8b_tp8() {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Fp32;
  s.micro_batch = 2;
  s.seq_len = 8192;
  s.attention = AttentionImpl::Flash;
  s.mesh.tp = 8;
  s.mesh.sequence_parallel = true;
  return s;
}

}  // namespace

TEST_CASE("async tp: a fused call's exposed time, copy-bound and compute-bound (hand-derived goldens)") {
  AsyncTpMoves m;
  m.latency_s = 0.01;
  m.copy_s = 0.2;
  m.stage_s = 0.05;
  m.reduce_s = 0.3;
  // A narrow GEMM (attention's projections at tp 8): the chain of 7 pulls and the last chunk's GEMM outlast the
  // SMs' 8 chunks: pipeline max(8 x 0.14, 7 x 0.2 + 0.15) = 1.55; all-gather: 0.01 + 0.05 + 1.55 - 1.0 = 0.61;
  // reduce-scatter (no staging, the reduction after): 0.01 + 1.55 + 0.3 - 1.0 = 0.86.
  const AsyncTpGemms narrow{1.0, 0.15, 0.14};
  CHECK(async_tp_all_gather_matmul_exposed_s(narrow, m, 8) == doctest::Approx(0.61));
  CHECK(async_tp_matmul_reduce_scatter_exposed_s(narrow, m, 8) == doctest::Approx(0.86));
  // A wide GEMM (the MLP's): the SMs are the bound, max(8 x 0.55, 7 x 0.2 + 0.6) = 4.4; what stays exposed is the
  // chunks' loss of efficiency plus the staging or the reduction: 0.01 + 0.05 + 4.4 - 4.0 = 0.46 and
  // 0.01 + 4.4 + 0.3 - 4.0 = 0.71.
  const AsyncTpGemms wide{4.0, 0.6, 0.55};
  CHECK(async_tp_all_gather_matmul_exposed_s(wide, m, 8) == doctest::Approx(0.46));
  CHECK(async_tp_matmul_reduce_scatter_exposed_s(wide, m, 8) == doctest::Approx(0.71));
  // Never negative: a GEMM that swallows everything leaves nothing exposed.
  const AsyncTpGemms huge{100.0, 10.0, 10.0};
  CHECK(async_tp_all_gather_matmul_exposed_s(huge, m, 8) == 0.0);
  // tp 2: one pull; pipeline max(2 x 0.5, 0.2 + 0.5) = 1.0, all-gather exposed 0.01 + 0.05 + 1.0 - 1.0 = 0.06.
  CHECK(async_tp_all_gather_matmul_exposed_s(AsyncTpGemms{1.0, 0.5, 0.5}, m, 2) == doctest::Approx(0.06));
}

TEST_CASE("async tp: the emitted program's fused collectives hide part of the vanilla time, not 1 - 1/tp of it") {
  // Llama 3 8B on one node of 8 H100s, tp 8 with sequence parallelism, micro-batch 2 x 8192: each layer unit's
  // forward all-gathers (attention and MLP column inputs) and reduce-scatters (their row outputs).
  static const ModuleGraph g(zoo("llama3-8b"));
  const RuntimeProfile rt = runtime("torchtitan-compile");
  const HardwareProfile hw = hardware("h100-80gb");
  const Strategy s = llama3_8b_tp8();
  Strategy async = s;
  async.mesh.async_tp = true;
  const Cluster c{1, 8};
  const StepProgram pv = program(g, s, rt, 1, 8), pa = program(g, async, rt, 1, 8);
  REQUIRE(pv.ops.size() == pa.ops.size());
  int checked = 0;
  for (size_t i = 0; i < pa.ops.size(); ++i) {
    const Op& op = pa.ops[i];
    if (op.kind != OpKind::TpCollective || op.phase != Phase::TpForwardCollectives || op.first_layer < 0) continue;
    if (op.async_tp_fused_calls != op.comm_calls) continue;  // a layer unit's: every call fused
    const double vanilla = op_duration(pv.ops[i], pv, hw, c, s), fused = op_duration(op, pa, hw, c, async);
    // The reduce-scatters' partial sums are reduced by one memory-bound kernel after the pipeline: at least that
    // reduction (s x b x h bf16 read, 1/tp of it written) stays exposed per call.
    const double a = static_cast<double>(op.comm_bytes);
    const double reduce = memory_bound_time(hw, Bytes(a * (1.0 + 1.0 / 8.0)), DType::Bf16).value;
    CHECK(fused < vanilla);
    CHECK(fused > vanilla / 8.0);
    if (op.collective == CollectiveKind::ReduceScatter) CHECK(fused >= static_cast<double>(op.comm_calls) * reduce);
    ++checked;
  }
  CHECK(checked == 2 * 32);
}

TEST_CASE("async tp: under float8 rowwise linears the reduce-scatters fuse and the all-gathers stay whole") {
  // pytorch/pytorch#149990 (tensor_parallel.hpp TpUnitShape::gathers_fuse): Inductor fuses rowwise scaled_mm with
  // the reduce-scatter after it, not with the all-gather before it. Tensorwise fuses both.
  static const ModuleGraph g(zoo("llama3-8b"));
  const RuntimeProfile rt = runtime("torchtitan-2506-compile");
  const HardwareProfile hw = hardware("h100-80gb");
  Strategy s = llama3_8b_tp8();
  s.act_ckpt = ActCkpt::Full;
  s.mesh.async_tp = true;
  const Cluster c{1, 8};
  for (Float8Recipe recipe : {Float8Recipe::Rowwise, Float8Recipe::Tensorwise}) {
    CAPTURE(static_cast<int>(recipe));
    Strategy f8 = s;
    f8.float8 = recipe;
    Strategy vanilla = f8;
    vanilla.mesh.async_tp = false;
    const StepProgram pa = program(g, f8, rt, 1, 8), pv = program(g, vanilla, rt, 1, 8);
    REQUIRE(pa.ops.size() == pv.ops.size());
    int gathers = 0, scatters = 0;
    for (size_t i = 0; i < pa.ops.size(); ++i) {
      const Op& op = pa.ops[i];
      if (op.kind != OpKind::TpCollective || op.first_layer < 0) continue;
      const bool gather = op.collective == CollectiveKind::AllGather;
      if (!gather && op.collective != CollectiveKind::ReduceScatter) continue;
      const double fused_s = op_duration(op, pa, hw, c, f8), whole_s = op_duration(pv.ops[i], pv, hw, c, vanilla);
      if (gather && recipe == Float8Recipe::Rowwise) {
        CHECK(op.async_tp_fused_calls == 0);
        CHECK(fused_s == doctest::Approx(whole_s));
      } else {
        CHECK(op.async_tp_fused_calls > 0);
        CHECK(fused_s < whole_s);
      }
      (gather ? gathers : scatters) += 1;
    }
    CHECK(gathers > 0);
    CHECK(scatters > 0);
  }
}
