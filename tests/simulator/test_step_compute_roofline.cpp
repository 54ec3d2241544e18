// The GEMM and attention time of a whole simulated step against the roofline computed here, independently,
// from the hardware profile's numbers: time of a kernel = max(FLOPs / (peak(dtype) x efficiency(FLOPs)),
// bytes / memory bandwidth), the efficiency interpolated linearly in log2(FLOPs) between the profile's points
// and clamped at both ends (compute/compute_cost.hpp, docs/hardware.md). The expected time is summed here over
// the model's own linears (the shapes typed from ../shared/calibration/README.md, not read from the module
// graph) and the passes a training step makes: forward, the two backward GEMMs (input and weight gradients, at
// their own shapes), the recomputed forward under full checkpointing, and the attention kernels (forward,
// backward 2.5x the forward's FLOPs, the forward again when recomputed). The simulator's side is the step
// program's compute ops priced by op_duration with their memory-bound, collective and copy work taken out.
// Both sides are one formula evaluated two ways, so the tolerance is rounding: 1e-6 relative.
//
// The rows: the H200 calibration rows (../shared/calibration/pytorch-h200.jsonl, shapes and world as
// measured), whose measured step (compute only: the world is emulated, collectives are no-ops) must also be
// longer than its GEMMs and attention alone; and torchtitan's A100 rows (test_published_throughput.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "compute/compute_cost.hpp"
#include "sim_fixtures.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

// ---- the roofline, from the profile's numbers ------------------------------------------------------------

// Linear in log2(x) between the points, clamped at both ends.
double efficiency(const std::vector<double>& x, const std::vector<double>& e, double flops) {
  REQUIRE(!x.empty());
  REQUIRE(x.size() == e.size());
  if (flops <= x.front()) return e.front();
  if (flops >= x.back()) return e.back();
  size_t i = 1;
  while (x[i] < flops) ++i;
  const double w = (std::log2(flops) - std::log2(x[i - 1])) / (std::log2(x[i]) - std::log2(x[i - 1]));
  return e[i - 1] + w * (e[i] - e[i - 1]);
}

// bf16 compute: the profile's bf16 curve when it has one, else its shared curve.
const EfficiencyCurve& bf16_curve(const EfficiencyCurve& shared, const EfficiencyCurve& own) {
  return own.empty() ? shared : own;
}

// `flops` at the rate the curve gives at `curve_x` (the call's own FLOPs unless said), times `quantized`.
double roofline_at(const HardwareProfile& hw, const EfficiencyCurve& c, double flops, double curve_x, double bytes,
                   double quantized) {
  const double rate = hw.peak_flops(DType::Bf16).value * efficiency(c.x, c.efficiency, curve_x) * quantized;
  return std::max(flops / rate, bytes / hw.memory_bandwidth.value);
}

double roofline(const HardwareProfile& hw, const EfficiencyCurve& c, double flops, double bytes, double quantized = 1) {
  return roofline_at(hw, c, flops, flops, bytes, quantized);
}

constexpr double kBf16 = 2.0;  // bytes per element

// Tile and wave quantization of a rows x cols GEMM output: the useful share of ceil(tiles / SMs) whole waves of
// whole tiles, for the best of the profile's tiles (NVIDIA's Matrix Multiplication Background guide).
double quantization(const HardwareProfile& hw, double rows, double cols) {
  if (hw.sm_count <= 0) return 1.0;
  double best = 0;
  for (const auto& [tr, tc] : hw.matmul_tiles) {
    const double waves = std::ceil(std::ceil(rows / double(tr)) * std::ceil(cols / double(tc)) / double(hw.sm_count));
    best = std::max(best, rows * cols / (double(tr) * double(tc) * double(hw.sm_count) * waves));
  }
  return best;
}

// C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs; A and B read, C written once. Every pass of a linear layer is priced at the
// mean of its three GEMMs (the simulator's convention, timeline/op_cost.cpp): their quantizations' harmonic mean.
double gemm(const HardwareProfile& hw, double m, double n, double k) {
  const EfficiencyCurve& c = bf16_curve(hw.matmul_efficiency, hw.matmul_efficiency_bf16);
  const double q = 3.0 / (1.0 / quantization(hw, m, n) + 1.0 / quantization(hw, m, k) + 1.0 / quantization(hw, n, k));
  return roofline(hw, c, 2.0 * m * n * k, kBf16 * (m * k + k * n + m * n), q);
}

struct Shape {
  double hidden, layers, heads, kv_heads, head_dim, ffn, vocab;
};

struct Row {
  const char* model;  // zoo name or a path under tests/data
  Shape shape;
  const char* hw;
  StrategyKind kind;
  int64_t nodes, gpus_per_node, micro_batch, seq;
  ActCkpt ckpt;
  double measured_step_s;  // 0: not measured here
};

// GEMM + attention seconds of one step of one micro-batch on one rank.
double expected_step(const HardwareProfile& hw, const Row& r) {
  const Shape& m = r.shape;
  const double t = static_cast<double>(r.micro_batch * r.seq);
  const double kv = m.kv_heads * m.head_dim, q = m.heads * m.head_dim;
  struct Linear {
    double in, out;
  };
  // q, k, v, o projections; gate, up, down of the gated MLP.
  const Linear linears[] = {{m.hidden, q},     {m.hidden, kv},    {m.hidden, kv},   {q, m.hidden},
                            {m.hidden, m.ffn}, {m.hidden, m.ffn}, {m.ffn, m.hidden}};
  const double recompute = r.ckpt == ActCkpt::Full ? 1.0 : 0.0;
  auto training_gemms = [&](const Linear& l, double forwards) {
    return forwards * gemm(hw, t, l.out, l.in)  // y = x W^T
           + gemm(hw, t, l.in, l.out)           // dx = dy W
           + gemm(hw, l.in, l.out, t);          // dW = dy^T x
  };
  double layer = 0;
  for (const Linear& l : linears) layer += training_gemms(l, 1.0 + recompute);
  const double head = training_gemms({m.hidden, m.vocab}, 1.0);  // never recomputed

  // Causal flash attention: forward 4 b s^2 h d / 2 FLOPs, backward 2.5x; HBM traffic q, k, v, o forward and
  // q, o, dO, dq, k, v, dk, dv backward.
  const double b = static_cast<double>(r.micro_batch), s = static_cast<double>(r.seq);
  const double fwd_flops = 4.0 * b * s * s * m.heads * m.head_dim / 2.0;
  const double fwd_bytes = kBf16 * (2.0 * t * q + 2.0 * t * kv), bwd_bytes = kBf16 * (4.0 * t * q + 4.0 * t * kv);
  // Every profile here reads its curves at FlashAttention's benchmark call (device.attention_reference: 16k tokens x
  // 16 heads a call, the sequence varied): the curve point of this call's sequence is the reference call's FLOPs,
  // scaled from this call's tokens x heads to the reference's. FA2's grid has one block per 128 query rows of each
  // head, b x h x s / 128 blocks, more than the SMs in every row here (no idle SMs).
  REQUIRE(hw.attention_reference_tokens == 16384);
  REQUIRE(hw.attention_reference_heads == 16);
  const double to_reference = 16384.0 * 16.0 / (b * s * m.heads);
  REQUIRE(b * m.heads * s / 128.0 >= hw.sm_count);
  const double attn_fwd = roofline_at(hw, bf16_curve(hw.attention_efficiency, hw.attention_efficiency_bf16), fwd_flops,
                                      fwd_flops * to_reference, fwd_bytes, 1.0);
  const double attn_bwd =
      roofline_at(hw, bf16_curve(hw.attention_backward_efficiency, hw.attention_backward_efficiency_bf16),
                  2.5 * fwd_flops, 2.5 * fwd_flops * to_reference, bwd_bytes, 1.0);
  const double attn_recompute = r.ckpt != ActCkpt::None ? 1.0 : 0.0;
  const double attention = (1.0 + attn_recompute) * attn_fwd + attn_bwd;
  return m.layers * (layer + attention) + head;
}

// ---- the simulator's side ----------------------------------------------------------------------------------

// The step program's compute ops priced by op_duration with everything but GEMMs and attention taken out.
double simulated_step(const HardwareProfile& hw, const Row& r) {
  ModuleGraph g(std::string(r.model).find('/') != std::string::npos ? load_model(r.model, root()) : zoo(r.model));
  RuntimeProfile rt = runtime("pytorch");
  Strategy s;
  s.kind = r.kind;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Fp32;
  s.micro_batch = r.micro_batch;
  s.seq_len = r.seq;
  s.act_ckpt = r.ckpt;
  s.attention = AttentionImpl::Sdpa;
  s.grad_accum = 1;
  const Cluster c{r.nodes, r.gpus_per_node};
  StepProgram p = program(g, s, rt, r.nodes, r.gpus_per_node);
  REQUIRE(p.layout.micro_batches_emitted == 1);
  double total = 0;
  for (Op op : p.ops) {
    op.elementwise_bytes = 0;
    op.device_copy_bytes = 0;
    op.collective = CollectiveKind::None;
    op.comm_bytes = 0;
    op.copy_bytes = 0;
    op.host_optimizer_params = 0;
    total += op_duration(op, p, hw, c, s);
  }
  return total;
}

std::string data(const char* file) { return std::string(FSDP_TEST_DATA) + "/" + file; }

// A zoo name, or a model file's name without its directory and extension.
std::string label(const std::string& model) {
  const std::string file = model.substr(model.rfind('/') + 1);
  return file.substr(0, file.rfind(".yaml"));
}

}  // namespace

TEST_CASE("a step's GEMMs and attention are priced at the profile's roofline, pass by pass") {
  // Shapes (hidden, layers, heads, kv heads, head dim, ffn, vocab): ../shared/calibration/README.md for the
  // H200 rows; the Llama 2 / Llama 3 configs (the zoo files' sources) for the A100 rows.
  const Shape llama_1b{2048, 16, 32, 8, 64, 8192, 128256};
  const Shape llama2_7b{4096, 32, 32, 32, 128, 11008, 32000};
  const Shape llama3_8b{4096, 32, 32, 8, 128, 14336, 128256};
  const Shape llama2_13b{5120, 40, 40, 40, 128, 13824, 32000};
  const Shape llama3_70b{8192, 80, 64, 8, 128, 28672, 128256};
  const std::string llama_1b_path = data("models/llama-1b.yaml");
  // Measured steps: the smaller of steady-state steps 2 and 3 of each row (noise only adds time).
  const Row rows[] = {
      {"llama3-8b", llama3_8b, "h200-141gb", StrategyKind::Fsdp, 1, 8, 1, 4096, ActCkpt::None, 0.4630},
      {"llama3-8b", llama3_8b, "h200-141gb", StrategyKind::Fsdp, 1, 8, 1, 4096, ActCkpt::Full, 0.5758},
      {"llama2-7b", llama2_7b, "h200-141gb", StrategyKind::Fsdp, 1, 4, 2, 2048, ActCkpt::None, 0.4387},
      {llama_1b_path.c_str(), llama_1b, "h200-141gb", StrategyKind::Fsdp, 1, 1, 4, 2048, ActCkpt::None, 0.2030},
      {llama_1b_path.c_str(), llama_1b, "h200-141gb", StrategyKind::Ddp, 1, 8, 2, 2048, ActCkpt::Full, 0.1535},
      {"llama3-70b", llama3_70b, "a100-80gb", StrategyKind::Fsdp, 8, 8, 1, 8192, ActCkpt::Full, 0},
      {"llama2-13b", llama2_13b, "a100-80gb", StrategyKind::Fsdp, 8, 8, 2, 4096, ActCkpt::None, 0},
      {"llama2-7b", llama2_7b, "a100-80gb", StrategyKind::Fsdp, 8, 8, 2, 4096, ActCkpt::Selective, 0},
  };
  for (const Row& r : rows) {
    HardwareProfile hw = hardware(r.hw);
    REQUIRE(hw.device_kind == "cuda");  // no host overhead, no shared cores, forward GEMM ratio 1
    REQUIRE(hw.host_overhead(DType::Bf16).empty());
    REQUIRE(hw.matmul_forward_ratio(DType::Bf16) == 1.0);
    const double expected = expected_step(hw, r), simulated = simulated_step(hw, r);
    std::printf("%-10s %-10s %-4s world %3lld mb %lld seq %5lld ckpt %-9s: GEMM + attention %.4f s (roofline %.4f s)",
                label(r.model).c_str(), r.hw, to_string(r.kind), static_cast<long long>(r.nodes * r.gpus_per_node),
                static_cast<long long>(r.micro_batch), static_cast<long long>(r.seq), to_string(r.ckpt), simulated,
                expected);
    if (r.measured_step_s > 0) std::printf(", measured step %.4f s", r.measured_step_s);
    std::printf("\n");
    CAPTURE(r.model);
    CAPTURE(r.hw);
    CAPTURE(to_string(r.ckpt));
    CHECK(simulated == doctest::Approx(expected).epsilon(1e-6));
    // A measured step also holds norms, activations, the loss, the optimizer and FSDP's copies: its GEMMs and
    // attention alone cannot take longer.
    if (r.measured_step_s > 0) CHECK(expected < r.measured_step_s);
  }
}
