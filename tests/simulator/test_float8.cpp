// Float8 linears (Strategy::float8, program/float8_linears.hpp): their GEMMs at the FP8 peak, the casts torchao's
// roofline counts, the float8 all-gather's bytes, the capability rules and hardware checks that refuse what is not
// priced; and the compiled loss of the June 2025 torchtitan (RuntimeProfile::loss_compiled). Golden numbers derived
// by hand for the Llama 3 8B shape of configs/models/llama3-8b.yaml (hidden 4096, q 4096, kv 1024, FFN 14336).
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "compute/compute_cost.hpp"
#include "core/errors.hpp"
#include "model/module_graph.hpp"
#include "program/float8_linears.hpp"
#include "program/layer_costs.hpp"
#include "sim_fixtures.hpp"
#include "strategy/capabilities.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;

namespace {

constexpr double kH = 4096, kQ = 4096, kKv = 1024, kF = 14336, kVocab = 128256;

// torchtitan's 8B runs: FSDP per layer, the per-op checkpointing policy, micro-batch 2 of 8192 tokens.
Strategy titan_8b(Float8Recipe recipe, bool all_gather) {
  Strategy s;
  s.act_ckpt = ActCkpt::SelectiveOp;
  s.micro_batch = 2;
  s.seq_len = 8192;
  std::tie(s.float8, s.float8_all_gather) = std::pair{recipe, all_gather};
  return s;
}

using test::error_of;

}  // namespace

TEST_CASE("float8: torchao's roofline bytes for the casts of activations and weights") {
  // Activations: tensorwise max(abs) 2 + cast 2 + 1 + 1; rowwise 2 + 1 + 2, then 2 + 1.
  CHECK(float8_activation_cast_bytes_per_element(Float8Recipe::None) == 0);
  CHECK(float8_activation_cast_bytes_per_element(Float8Recipe::Tensorwise) == 6);
  CHECK(float8_activation_cast_bytes_per_element(Float8Recipe::Rowwise) == 8);
  // Weights: tensorwise 5 forward, 3 backward; with the float8 all-gather each gather casts the shard (3 / 8 on 8
  // ranks) and the backward transposes the gathered float8 weight (2); rowwise 3 and 7.
  const Float8WeightCastBytes t = float8_weight_cast_bytes_per_element(Float8Recipe::Tensorwise, false, 8);
  CHECK(t.forward == 5);
  CHECK(t.backward == 3);
  const Float8WeightCastBytes ag = float8_weight_cast_bytes_per_element(Float8Recipe::Tensorwise, true, 8);
  CHECK(ag.forward == doctest::Approx(3.0 / 8));
  CHECK(ag.backward == doctest::Approx(3.0 / 8 + 2));
  // Rowwise's backward GEMMs rescale their bf16 outputs afterwards (read and write: 4 B an element): the grad_weight's
  // per weight element, the grad_input's per input element.
  const Float8WeightCastBytes r = float8_weight_cast_bytes_per_element(Float8Recipe::Rowwise, false, 8);
  CHECK(r.forward == 3);
  CHECK(r.backward == 7 + 4);
  CHECK(float8_backward_rescale_bytes_per_element(Float8Recipe::Rowwise) == 4);
  CHECK(float8_backward_rescale_bytes_per_element(Float8Recipe::Tensorwise) == 0);
}

TEST_CASE(
    "float8: a GEMM runs at the FP8 peak on the bf16 curve, the gradients' at the FP8 ratio, operands one byte each") {
  HardwareProfile hw = test::hardware("h100-80gb");
  // Compute-bound: the time scales with the peaks (the same curve, the same tile quantization), the two gradient
  // GEMMs' (no fast accumulation) at device.float8_matmul_ratio, MAMF's 70.9% / 80.3% on H100.
  // The mean of a linear's three GEMMs, what matmul_time prices for a compute-dtype linear.
  auto mean = [&](int64_t rows) {
    const LinearGemmTimes t = float8_linear_gemm_times(hw, rows, 4096, 4096, DType::Bf16);
    return (t.forward.value + 2.0 * t.gradient.value) / 3.0;
  };
  const double bf16 = matmul_time(hw, 16384, 4096, 4096, DType::Bf16).value;
  CHECK(mean(16384) / bf16 == doctest::Approx(989.5 / 1979.0 * (1.0 + 2.0 / 0.883) / 3.0));
  // Without the ratio (torchao roofline's assumption), the peaks alone.
  hw.float8_matmul_ratio = 0;
  CHECK(mean(16384) / bf16 == doctest::Approx(989.5 / 1979.0));
  // Memory-bound (16 tokens): operands at 1 byte, the output in bf16, at the HBM peak.
  const double m = 16, n = 4096, k = 4096;
  CHECK(mean(16) == doctest::Approx((m * k + k * n + 2 * m * n) / hw.memory_bandwidth.value));
}

TEST_CASE("float8: each pass of a float8 linear's GEMMs at its own rate; a compute-dtype one split by the ratio") {
  HardwareProfile hw = test::hardware("h100-80gb");
  GemmShape g{16384, 4096, 4096};
  g.float8 = true;
  const GemmPassTimes f8 = gemm_pass_times(hw, g, DType::Bf16);
  // Compute-bound: the output GEMM (fast accumulation) at the bf16 curve's efficiency of the FP8 peak, each gradient
  // GEMM at float8_matmul_ratio of it: compute_cost.hpp float8_linear_gemm_times, pass by pass.
  CHECK(f8.gradient == doctest::Approx(f8.forward / 0.883));
  const LinearGemmTimes t = float8_linear_gemm_times(hw, 16384, 4096, 4096, DType::Bf16);
  CHECK(f8.forward == doctest::Approx(t.forward.value));
  CHECK(f8.gradient == doctest::Approx(t.gradient.value));
  // A bf16 GEMM: the curve's mean, the forward taking matmul_forward_ratio of it (1 on a GPU profile without one; a
  // measured CPU profile's own), each gradient GEMM half the rest.
  g.float8 = false;
  const double mean = matmul_time(hw, 16384, 4096, 4096, DType::Bf16).value;
  GemmPassTimes bf = gemm_pass_times(hw, g, DType::Bf16);
  CHECK(bf.forward == doctest::Approx(mean));
  CHECK(bf.gradient == doctest::Approx(mean));
  hw.matmul_forward_ratio_bf16 = 0.8;
  bf = gemm_pass_times(hw, g, DType::Bf16);
  CHECK(bf.forward == doctest::Approx(0.8 * mean));
  CHECK(bf.gradient == doctest::Approx(1.1 * mean));
}

TEST_CASE("float8: a layer's float8 linears, their weights and the casts per token") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const RuntimeProfile rt = test::runtime("torchtitan-compile");
  const Strategy s = titan_8b(Float8Recipe::Tensorwise, false);
  const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), 16384.0};
  const LayerCost c = layer_cost(in, g.layers().front(), ActCkpt::None);
  // Every linear of the block: q, k, v, o, gate, up, down.
  CHECK(c.float8_params == kH * (kQ + 2 * kKv) + kQ * kH + 3 * kH * kF);
  for (const GemmShape& gs : c.shape.gemms) CHECK(gs.float8);
  // Inputs: q, k, v read the normed stream (3 h), o the attention output (q), gate and up h each, down f.
  CHECK(c.float8_cast_bytes_per_token == 6 * (3 * kH + kQ + 2 * kH + kF));
  // Incoming gradients: each linear's output width.
  CHECK(c.float8_cast_backward_bytes_per_token == 6 * (kQ + 2 * kKv + kH + 2 * kF + kH));
  // Rowwise: 8 bytes a cast element, and the backward GEMMs' rescale of the grad_input (4 bytes an input element).
  const Strategy rowwise = titan_8b(Float8Recipe::Rowwise, false);
  const LayerCostInput rin{&g, &rowwise, &rt, activation_query(rowwise, rt), 16384.0};
  const LayerCost rc = layer_cost(rin, g.layers().front(), ActCkpt::None);
  CHECK(rc.float8_cast_bytes_per_token == 8 * (3 * kH + kQ + 2 * kH + kF));
  CHECK(rc.float8_cast_backward_bytes_per_token ==
        8 * (kQ + 2 * kKv + kH + 2 * kF + kH) + 4 * (3 * kH + kQ + 2 * kH + kF));
  // Without float8: none of it.
  const Strategy plain = titan_8b(Float8Recipe::None, false);
  const LayerCostInput pin{&g, &plain, &rt, activation_query(plain, rt), 16384.0};
  const LayerCost p = layer_cost(pin, g.layers().front(), ActCkpt::None);
  CHECK(p.float8_params == 0);
  CHECK(p.float8_cast_bytes_per_token == 0);
  for (const GemmShape& gs : p.shape.gemms) CHECK_FALSE(gs.float8);
  // The same saved activations (torchao saves the high-precision input since matmul_with_hp_or_float8_args).
  CHECK(c.saved_bytes == p.saved_bytes);
}

TEST_CASE("float8: the step runs faster, and the float8 all-gather moves and holds a byte per linear weight") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const HardwareProfile hw = test::hardware("h100-80gb");
  const RuntimeProfile rt = test::runtime("torchtitan-compile");
  const Cluster c{1, 8};
  auto run = [&](const Strategy& s, StepProgram* prog) { return simulate(SimulationInput{&g, &hw, &rt, c, s}, prog); };
  StepProgram p_bf16, p_f8, p_ag;
  const Prediction bf16 = run(titan_8b(Float8Recipe::None, false), &p_bf16);
  const Prediction f8 = run(titan_8b(Float8Recipe::Tensorwise, false), &p_f8);
  const Prediction ag = run(titan_8b(Float8Recipe::Tensorwise, true), &p_ag);
  CHECK(f8.time.compute_s < bf16.time.compute_s);
  CHECK(f8.time.compute_s > 0.5 * bf16.time.compute_s);
  // Same memory without the float8 all-gather (the casts are transient kernels' outputs, not kept).
  CHECK(f8.memory.peak_allocated == doctest::Approx(bf16.memory.peak_allocated).epsilon(1e-9));
  // A decoder layer's gather: its linears' weights at 1 byte, its two norms at 2.
  auto first_layer_gather = [](const StepProgram& p) {
    for (const Op& op : p.ops)
      if (op.collective == CollectiveKind::AllGather && op.group == GroupKind::Shard && op.unit == 1)
        return op.comm_bytes;
    return 0.0;
  };
  const double linears = kH * (kQ + 2 * kKv) + kQ * kH + 3 * kH * kF, norms = 2 * kH;
  CHECK(first_layer_gather(p_f8) == doctest::Approx(2 * (linears + norms)));
  CHECK(first_layer_gather(p_ag) == doctest::Approx(linears + 2 * norms));
  CHECK(test::cat(ag.memory.breakdown, MemoryCategory::UnshardedParams) <
        test::cat(f8.memory.breakdown, MemoryCategory::UnshardedParams));
  CHECK(ag.time.comm_s < f8.time.comm_s);
}

TEST_CASE("float8: refused where it is not priced, naming the flag and why") {
  const ModelSpec llama = test::zoo("llama3-8b");
  const Cluster c{1, 8};
  // The runtimes that swap no linears, and the eager ones (priced compiled only).
  for (const char* name : {"fsdp-run", "deepspeed", "nanotron", "pytorch", "torchtitan", "pytorch-fsdp1"}) {
    CAPTURE(name);
    const RuntimeProfile rt = test::runtime(name);
    Strategy s = titan_8b(Float8Recipe::Tensorwise, false);
    CHECK(error_of([&] { validate_strategy(s, llama, c, rt.support); }).find("--float8: ") == 0);
  }
  // FSDP1 runs float8 linears compiled, but gathers its flat parameters in bf16.
  const RuntimeProfile fsdp1 = test::runtime("pytorch-fsdp1-compile");
  CHECK(
      error_of([&] { validate_strategy(titan_8b(Float8Recipe::Tensorwise, false), llama, c, fsdp1.support); }).empty());
  CHECK(error_of([&] {
          validate_strategy(titan_8b(Float8Recipe::Tensorwise, true), llama, c, fsdp1.support);
        }).find("--float8-all-gather: ") == 0);
  // The float8 all-gather: tensorwise and FSDP's sharded parameters only.
  const RuntimeProfile rt = test::runtime("torchtitan-compile");
  CHECK(error_of([&] {
          validate_strategy(titan_8b(Float8Recipe::Rowwise, true), llama, c, rt.support);
        }).find("applies to --float8 tensorwise") != std::string::npos);
  Strategy ddp = titan_8b(Float8Recipe::Tensorwise, true);
  ddp.kind = StrategyKind::Ddp;
  CHECK(error_of([&] { validate_strategy(ddp, llama, c, rt.support); }).find("FSDP's") != std::string::npos);
  // Tensor parallelism without sequence parallelism, MoE experts and LoRA are not modelled with float8.
  Strategy tp = titan_8b(Float8Recipe::Tensorwise, false);
  tp.mesh.tp = 2;
  tp.mesh.sequence_parallel = true;
  CHECK(error_of([&] { validate_strategy(tp, llama, c, rt.support); }).empty());
  tp.mesh.sequence_parallel = false;
  CHECK(error_of([&] { validate_strategy(tp, llama, c, rt.support); }).find("without sequence parallelism") !=
        std::string::npos);
  CHECK(error_of([&] {
          validate_strategy(titan_8b(Float8Recipe::Tensorwise, false), test::zoo("mixtral-8x7b"), c, rt.support);
        }).find("mixture-of-experts") != std::string::npos);
  // A GPU without FP8 tensor cores (A100: compute capability 8.0), at the first simulation.
  const ModuleGraph g(llama);
  const HardwareProfile a100 = test::hardware("a100-80gb");
  const std::string why = error_of([&] {
    simulate(SimulationInput{&g, &a100, &rt, c, titan_8b(Float8Recipe::Tensorwise, false)});
  });
  CHECK(why.find("--float8: a100-80gb has compute capability 8.0") == 0);
}

TEST_CASE("float8 under tensor parallelism: torchao's float8 TP styles cast shards and gather in float8") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const RuntimeProfile rt = test::runtime("torchtitan-compile");
  Strategy s = titan_8b(Float8Recipe::Tensorwise, false);
  s.mesh.tp = 2;
  s.mesh.sequence_parallel = true;
  const ModuleId layer = g.layers().front();
  // Tensorwise: each column block's input cast once on its sequence shard (h / 2, attention and MLP), the row
  // linears' split inputs; backward the column linears' split output gradients (4 of 8 kv heads a rank), the row
  // linears' output gradients on the sequence shard; the gathered float8 operands of the 7 weight-gradient GEMMs
  // copied transposed (5 column inputs, 2 row output gradients); no rescale.
  const Float8CastElems t = float8_cast_elems_per_token(g, layer, s);
  CHECK(t.forward == doctest::Approx((kQ + kF) / 2));
  CHECK(t.forward_shard == doctest::Approx(2 * kH / 2));
  CHECK(t.backward == doctest::Approx((kQ + 2 * kKv + 2 * kF) / 2));
  CHECK(t.backward_shard == doctest::Approx(2 * kH / 2));
  CHECK(t.transposed == doctest::Approx(7 * kH));
  CHECK(t.rescale == 0);
  CHECK(float8_shard_cast_bytes_per_element() == 5);
  CHECK(float8_transpose_bytes_per_element() == 2);
  // Rowwise: the plain TP styles, every column linear casting the gathered input, the row linears the gathered
  // gradient; the grad_input rescale over the column linears' whole outputs and the row linears' split ones.
  s.float8 = Float8Recipe::Rowwise;
  const Float8CastElems r = float8_cast_elems_per_token(g, layer, s);
  CHECK(r.forward == doctest::Approx(5 * kH + (kQ + kF) / 2));
  CHECK(r.backward == doctest::Approx((kQ + 2 * kKv + 2 * kF) / 2 + 2 * kH));
  CHECK(r.rescale == doctest::Approx(5 * kH + (kQ + kF) / 2));
  // The layers' sequence-parallel gathers move a byte an element under tensorwise (forward and backward), the
  // reduce-scatters two; rowwise gathers in bf16.
  const HardwareProfile hw = test::hardware("h100-80gb");
  auto collectives = [&](Float8Recipe recipe) {
    Strategy st = s;
    st.float8 = recipe;
    StepProgram p;
    simulate(SimulationInput{&g, &hw, &rt, Cluster{1, 8}, st}, &p);
    double ag = 0, rs = 0;
    for (const Op& op : p.ops) {
      if (op.kind != OpKind::TpCollective || op.unit != 1) continue;
      if (op.collective == CollectiveKind::AllGather) ag += op.comm_bytes * op.comm_calls;
      if (op.collective == CollectiveKind::ReduceScatter) rs += op.comm_bytes * op.comm_calls;
    }
    return std::pair{ag, rs};
  };
  const auto [ag_t, rs_t] = collectives(Float8Recipe::Tensorwise);
  const auto [ag_r, rs_r] = collectives(Float8Recipe::Rowwise);
  CHECK(ag_t > 0);
  CHECK(ag_t == doctest::Approx(ag_r / 2));
  CHECK(rs_t == doctest::Approx(rs_r));
}

TEST_CASE("a compiled loss keeps the bf16 logits for its backward, with no fp32 copy") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const Strategy s = titan_8b(Float8Recipe::None, false);
  const double logits = 2.0 * 8192 * kVocab * 2;  // micro-batch 2 x seq 8192 tokens, bf16
  auto loss_ops = [&](const RuntimeProfile& rt, const Op*& loss, const Op*& back, StepProgram& p) {
    p = test::program(g, s, rt, 1, 8);
    for (const Op& op : p.ops) {
      if (op.kind == OpKind::Loss && !loss) loss = &op;
      if (op.kind == OpKind::LossBackward && !back) back = &op;
    }
    REQUIRE(loss);
    REQUIRE(back);
  };
  StepProgram pc, pe;
  const Op *lc = nullptr, *bc = nullptr, *le = nullptr, *be = nullptr;
  const RuntimeProfile compiled = test::runtime("torchtitan-2506-compile");
  const RuntimeProfile eager_loss = test::runtime("torchtitan-compile");
  CHECK(compiled.loss_compiled);
  CHECK_FALSE(eager_loss.loss_compiled);
  loss_ops(compiled, lc, bc, pc);
  loss_ops(eager_loss, le, be, pe);
  // Compiled: the logits saved (activations), their bf16 gradient beside them in the backward.
  REQUIRE(lc->on_issue.count == 1);
  CHECK(lc->on_issue.items[0].bytes == doctest::Approx(logits));
  CHECK(lc->transient_bytes == 0);
  CHECK(bc->transient_bytes == doctest::Approx(logits));
  CHECK(bc->elementwise_bytes == doctest::Approx(2 * logits));
  // The end-2024 torchtitan's eager loss: fp32 log-probabilities saved (twice the bytes), and in its backward the
  // gradients of the log-probabilities and of the fp32 logits.
  CHECK(le->on_issue.items[0].bytes == doctest::Approx(2 * logits));
  CHECK(be->transient_bytes == doctest::Approx(4 * logits));
}
