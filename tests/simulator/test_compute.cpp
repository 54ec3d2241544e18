// Compute cost model: roofline limits, efficiency interpolation, attention and optimizer costs,
// and a check of the h200 profile against the measured H200 step times in ../shared/calibration.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "compute/compute_cost.hpp"
#include "compute/unfused_attention.hpp"
#include "core/errors.hpp"
#include "hardware/hardware_profile.hpp"

using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

HardwareProfile synthetic_device() {
  HardwareProfile hw;
  hw.name = "synthetic";
  hw.device_kind = "cuda";
  hw.peak_flops_fp32 = FlopsPerSecond(50 * kTera);
  hw.peak_flops_bf16 = FlopsPerSecond(1000 * kTera);
  hw.peak_flops_fp16 = FlopsPerSecond(1000 * kTera);
  hw.memory_bandwidth = BytesPerSecond(4000 * kGB);
  hw.matmul_efficiency = EfficiencyCurve{{1e9, 1e11}, {0.4, 0.8}};
  hw.attention_efficiency = EfficiencyCurve{{1e9}, {0.5}};
  hw.attention_backward_efficiency = EfficiencyCurve{{1e9}, {0.25}};
  hw.gpus_per_node = 8;
  hw.cpu_cores = 64;
  hw.host_memory_bandwidth = BytesPerSecond(400 * kGB);
  hw.host_flops_per_core = FlopsPerSecond(100 * kGB);  // 100 GFLOP/s per core
  return hw;
}

// GEMM + attention time of one training step of a Llama-style decoder (no recomputation), one rank:
// every linear layer costs its forward GEMM plus two backward GEMMs (dX and dW) of the same size.
struct LlamaShape {
  int64_t hidden, layers, heads, kv_heads, ffn, vocab;
};
struct StepCompute {
  Seconds gemm_forward{0}, gemm_backward{0}, attention_forward{0}, attention_backward{0};
};
StepCompute llama_step(const HardwareProfile& hw, const LlamaShape& m, int64_t batch, int64_t seq) {
  int64_t t = batch * seq;
  int64_t d = m.hidden / m.heads;
  struct Linear {
    int64_t in, out;
  };
  const Linear layer[] = {{m.hidden, m.hidden}, {m.hidden, m.kv_heads * d}, {m.hidden, m.kv_heads * d},
                          {m.hidden, m.hidden}, {m.hidden, m.ffn},          {m.hidden, m.ffn},
                          {m.ffn, m.hidden}};
  StepCompute s;
  auto add_linear = [&](int64_t in, int64_t out, double count) {
    s.gemm_forward += matmul_time(hw, t, out, in, DType::Bf16) * count;  // Y = X W^T
    s.gemm_backward += (matmul_time(hw, t, in, out, DType::Bf16) +       // dX = dY W
                        matmul_time(hw, in, out, t, DType::Bf16)) *
                       count;  // dW = dY^T X
  };
  for (const auto& l : layer) add_linear(l.in, l.out, double(m.layers));
  add_linear(m.hidden, m.vocab, 1.0);  // lm_head
  AttentionShape a{batch, seq, m.heads, m.kv_heads, d, true};
  s.attention_forward = attention_forward_time(hw, a, DType::Bf16) * double(m.layers);
  s.attention_backward = attention_backward_time(hw, a, DType::Bf16) * double(m.layers);
  return s;
}

}  // namespace

TEST_CASE("matmul roofline: compute-bound GEMMs at peak x efficiency, skinny ones at memory bandwidth") {
  HardwareProfile hw = synthetic_device();
  SUBCASE("large square GEMM is compute bound at the plateau") {
    // 2 * 8192^3 = 1.1e12 FLOP > 1e11: efficiency 0.8 -> 800 TFLOP/s.
    double f = 2.0 * 8192.0 * 8192.0 * 8192.0;
    CHECK(matmul_flops(8192, 8192, 8192).value == doctest::Approx(f));
    CHECK(matmul_time(hw, 8192, 8192, 8192, DType::Bf16).value == doctest::Approx(f / (800 * kTera)));
  }
  SUBCASE("matrix-vector product is memory bound") {
    // m = 1: 2 * 8192 * 8192 FLOP is tiny next to reading the 8192 x 8192 bf16 weight.
    double bytes = 2.0 * (1 * 8192 + 8192.0 * 8192 + 1 * 8192);
    CHECK(matmul_bytes(1, 8192, 8192, DType::Bf16).value == doctest::Approx(bytes));
    CHECK(matmul_time(hw, 1, 8192, 8192, DType::Bf16).value == doctest::Approx(bytes / (4000 * kGB)));
  }
  SUBCASE("the efficiency curve is interpolated in log2(FLOPs)") {
    // 1e10 FLOP lies halfway (in log2) between 1e9 and 1e11: efficiency 0.6.
    // m = n = 2000, k = 1250: 2 * 2000 * 2000 * 1250 = 1e10.
    CHECK(matmul_time(hw, 2000, 2000, 1250, DType::Bf16).value == doctest::Approx(1e10 / (0.6 * 1000 * kTera)));
  }
  SUBCASE("dtype selects the peak") {
    double t16 = matmul_time(hw, 8192, 8192, 8192, DType::Bf16).value;
    double t32 = matmul_time(hw, 8192, 8192, 8192, DType::Fp32).value;
    CHECK(t32 / t16 == doctest::Approx(1000.0 / 50.0));
  }
  CHECK(matmul_time(hw, 0, 10, 10, DType::Bf16).value == 0);
}

TEST_CASE("a dtype's own curves replace the shared ones for that dtype only") {
  HardwareProfile hw = synthetic_device();
  const double f = 2.0 * 8192.0 * 8192.0 * 8192.0;  // compute bound, above the last point of every curve
  const double shared = matmul_time(hw, 8192, 8192, 8192, DType::Bf16).value;
  CHECK(shared == doctest::Approx(f / (0.8 * 1000 * kTera)));
  hw.matmul_efficiency_bf16 = EfficiencyCurve{{1e9}, {0.2}};
  CHECK(matmul_time(hw, 8192, 8192, 8192, DType::Bf16).value == doctest::Approx(f / (0.2 * 1000 * kTera)));
  CHECK(matmul_time(hw, 8192, 8192, 8192, DType::Fp16).value == doctest::Approx(shared));  // fp16: no own curve
  CHECK(matmul_time(hw, 8192, 8192, 8192, DType::Fp32).value == doctest::Approx(f / (0.8 * 50 * kTera)));
  AttentionShape a{1, 8192, 32, 8, 128, true};
  const double af = attention_forward_flops(a).value;
  hw.attention_efficiency_bf16 = EfficiencyCurve{{1e9}, {0.1}};
  hw.attention_backward_efficiency_fp16 = EfficiencyCurve{{1e9}, {0.05}};
  CHECK(attention_forward_time(hw, a, DType::Bf16).value == doctest::Approx(af / (0.1 * 1000 * kTera)));
  CHECK(attention_forward_time(hw, a, DType::Fp16).value == doctest::Approx(af / (0.5 * 1000 * kTera)));
  CHECK(attention_backward_time(hw, a, DType::Bf16).value == doctest::Approx(2.5 * af / (0.25 * 1000 * kTera)));
  CHECK(attention_backward_time(hw, a, DType::Fp16).value == doctest::Approx(2.5 * af / (0.05 * 1000 * kTera)));
}

TEST_CASE("ranks sharing a CPU node's cores: cores per rank and the compute slowdown") {
  // fsdp-run's thread policy: floor(cores / ranks) threads each; more ranks than cores are time-sliced.
  CHECK(cpu_cores_per_rank(2, 1) == 2);
  CHECK(cpu_cores_per_rank(2, 2) == 1);
  CHECK(cpu_cores_per_rank(2, 4) == doctest::Approx(0.5));
  CHECK(cpu_cores_per_rank(16, 3) == 5);  // 5 threads each, one core idle
  CHECK(cpu_cores_per_rank(0, 0) == 1);   // degenerate input is clamped, never a division by zero
  HardwareProfile hw = synthetic_device();
  hw.cpu_cores = 2;
  CHECK(cpu_compute_slowdown(hw, 4) == 1);  // a GPU does not share its compute with other ranks
  hw.device_kind = "cpu";
  hw.device_cores = 1;                      // rates measured on one core per rank (2 ranks on the 2 cores)
  CHECK(cpu_compute_slowdown(hw, 1) == 1);  // more cores than measured are not credited
  CHECK(cpu_compute_slowdown(hw, 2) == 1);
  CHECK(cpu_compute_slowdown(hw, 4) == doctest::Approx(2.0));
  CHECK(cpu_compute_slowdown(hw, 8) == doctest::Approx(4.0));
  hw.device_cores = 0;  // absent: the rates are the whole node's
  CHECK(cpu_compute_slowdown(hw, 1) == 1);
  CHECK(cpu_compute_slowdown(hw, 2) == doctest::Approx(2.0));
}

TEST_CASE("bigger GEMMs never take less time on the shipped profiles") {
  for (const auto& name : list_hardware(kRoot)) {
    CAPTURE(name);
    HardwareProfile hw = load_hardware(name, kRoot);
    double prev = 0;
    for (DType d : {DType::Fp32, DType::Bf16, DType::Fp16}) {
      prev = 0;
      for (int64_t n = 16; n <= 32768; n *= 2) {
        double t = matmul_time(hw, n, n, n, d).value;
        CHECK(t > prev);
        prev = t;
      }
    }
  }
}

TEST_CASE("attention FLOPs: 4 b s^2 h d forward, halved with a causal mask, backward 2.5x") {
  AttentionShape a{2, 1024, 32, 8, 128, false};
  double f = 4.0 * 2 * 1024.0 * 1024 * 32 * 128;
  CHECK(attention_forward_flops(a).value == doctest::Approx(f));
  CHECK(attention_backward_flops(a).value == doctest::Approx(2.5 * f));
  a.causal = true;
  CHECK(attention_forward_flops(a).value == doctest::Approx(f / 2));
  // GQA: fewer key/value heads move fewer bytes.
  AttentionShape mha = a;
  mha.kv_heads = 32;
  CHECK(attention_forward_bytes(a, DType::Bf16) < attention_forward_bytes(mha, DType::Bf16));
  CHECK(attention_forward_bytes(mha, DType::Bf16).value == doctest::Approx(2.0 * 4 * 2 * 1024 * 32 * 128));

  HardwareProfile hw = synthetic_device();
  CHECK(attention_forward_time(hw, a, DType::Bf16).value == doctest::Approx(f / 2 / (0.5 * 1000 * kTera)));
  CHECK(attention_backward_time(hw, a, DType::Bf16).value == doctest::Approx(2.5 * f / 2 / (0.25 * 1000 * kTera)));
}

TEST_CASE("attention curves read at a reference call: the sequence sets the point, blocks beyond the SMs") {
  HardwareProfile hw = synthetic_device();
  // Forward 0.2 at 1e10 FLOPs, 0.4 at 1e12; reference calls of 4096 tokens over 8 heads; 100 SMs.
  hw.attention_efficiency = EfficiencyCurve{{1e10, 1e12}, {0.2, 0.4}};
  hw.attention_reference_tokens = 4096;
  hw.attention_reference_heads = 8;
  hw.sm_count = 100;
  auto seconds = [&](int64_t batch, int64_t seq, int64_t heads) {
    const AttentionShape a{batch, seq, heads, heads, 128, true};
    return attention_forward_time(hw, a, DType::Bf16).value;
  };
  auto at = [](double flops, double e) { return flops / (e * 1000 * kTera); };
  // seq 16384, one sequence of 8 heads (128 x 8 = 1024 blocks of 128 query rows): its tokens x heads are 4x the
  // reference's, so the curve is read at a quarter of its FLOPs.
  const double f16k = 2.0 * 16384.0 * 16384.0 * 8.0 * 128.0;  // causal forward, 5.5e11
  const double x = f16k / 4.0;                                // 1.37e11
  const double e = 0.2 + (0.4 - 0.2) * (std::log2(x) - std::log2(1e10)) / (std::log2(1e12) - std::log2(1e10));
  CHECK(seconds(1, 16384, 8) == doctest::Approx(at(f16k, e)));
  // More sequences or more heads of that sequence: more blocks of the same work, the same rate (read by FLOPs per
  // call, twice the FLOPs would have been a faster point of the curve).
  CHECK(seconds(2, 16384, 8) == doctest::Approx(2.0 * seconds(1, 16384, 8)));
  CHECK(seconds(1, 16384, 16) == doctest::Approx(2.0 * seconds(1, 16384, 8)));
  // Fewer blocks than SMs: one sequence of 512 tokens over 8 heads is 4 x 8 = 32 blocks on 100 SMs, 0.32 of them
  // busy; its reference point (8 x 512 tokens x 8 heads: 2.1e9 FLOPs) is below the curve's first, 0.2.
  const double f512 = 2.0 * 512.0 * 512.0 * 8.0 * 128.0;
  CHECK(seconds(1, 512, 8) == doctest::Approx(at(f512, 0.2 * 0.32)));
  // Without a reference the curve is by FLOPs per call, as measured (calibrated CPU profiles): no block count either.
  hw.attention_reference_tokens = 0;
  hw.attention_reference_heads = 0;
  CHECK(seconds(1, 512, 8) == doctest::Approx(at(f512, 0.2)));
}

TEST_CASE("unfused attention: the full square as batched GEMMs plus the score passes, golden numbers") {
  HardwareProfile hw = synthetic_device();  // no tiles: no quantization; 4000 GB/s for every elementwise pass
  // b = 2, s = 1024, 32 query heads over 8 kv heads, d = 128; causal, which unfused kernels do not exploit.
  const AttentionShape a{2, 1024, 32, 8, 128, true};
  const double bh = 64, s = 1024, d = 128;
  const double gemm_f = 2.0 * s * s * d * bh;  // one of the six GEMMs: 1.7e10 FLOP, efficiency interpolated
  CHECK(unfused_attention_forward_flops(a).value == doctest::Approx(2 * gemm_f));
  CHECK(unfused_attention_backward_flops(a).value == doctest::Approx(4 * gemm_f));
  // log2-interpolated efficiency between (1e9, 0.4) and (1e11, 0.8).
  const double eff = 0.4 + 0.4 * (std::log2(gemm_f / 1e9) / std::log2(100.0));
  // Each GEMM is a roofline of its own: at this shape the s x s operand makes them all memory bound on this device
  // (2d = 256 FLOP per 2-byte score against its 250 FLOP per byte).
  auto gemm = [&](double m, double n, double k, double peak, double bytes) {
    return std::max(gemm_f / (eff * peak), bytes * bh * (m * k + k * n + m * n) / (4000 * kGB));
  };
  const double qk_bf16 = gemm(s, s, d, 1000 * kTera, 2), pv_bf16 = gemm(s, d, s, 1000 * kTera, 2);
  CHECK(qk_bf16 > gemm_f / (eff * 1000 * kTera));
  const double scores = bh * s * s, q = 2 * 1024 * 32 * 128.0, kv = q / 4;
  SUBCASE("Hugging Face eager, bf16 with the fp32 softmax") {
    const UnfusedAttentionRecipe r = hf_eager_attention(DType::Bf16, true);
    CHECK(r.kernel_dtype == DType::Bf16);
    // forward per score: scale 4 + mask add 6 + softmax 2+4 + cast 4+2 = 22 B; backward: cast 2+4, softmax
    // 4+4+2, scale 4 = 20 B. repeat_kv: 2 x (kv + q) x 2 B each way.
    CHECK(r.score_forward_bytes == 22);
    CHECK(r.score_backward_bytes == 20);
    const double expand = 2 * (kv + q) * 2;
    CHECK(unfused_attention_forward_time(hw, a, r).value ==
          doctest::Approx(qk_bf16 + pv_bf16 + (22 * scores + expand) / (4000 * kGB)));
    CHECK(unfused_attention_backward_time(hw, a, r).value ==
          doctest::Approx(qk_bf16 + 3 * pv_bf16 + (20 * scores + expand) / (4000 * kGB)));
    // Slower than the causal flash kernel at this shape: the full square, and 22 B per score through HBM.
    CHECK(unfused_attention_forward_time(hw, a, r).value > attention_forward_time(hw, a, DType::Bf16).value);
  }
  SUBCASE("SDPA math: torch 2.5 upcasts bf16 to fp32; 2.4 does not") {
    const UnfusedAttentionRecipe up = sdpa_math_attention(DType::Bf16, parse_torch_version("2.5.0"));
    CHECK(up.kernel_dtype == DType::Fp32);
    CHECK(up.score_forward_bytes == 20);  // add_(mask) 12 + softmax 8
    CHECK(up.score_backward_bytes == 12);
    CHECK(up.qkv_forward_bytes == 16 + 4 * 6);  // two fp32 scalings (8 B each) + four casts (2 + 4 B)
    const double fp32_gemms = gemm(s, s, d, 50 * kTera, 4) + gemm(s, d, s, 50 * kTera, 4);
    CHECK(fp32_gemms == doctest::Approx(2 * gemm_f / (eff * 50 * kTera)));  // compute bound at the fp32 peak
    CHECK(unfused_attention_forward_time(hw, a, up).value ==
          doctest::Approx(fp32_gemms + (20 * scores + 40 * q) / (4000 * kGB) + 2 * (kv + q) * 2 / (4000 * kGB)));
    const UnfusedAttentionRecipe old = sdpa_math_attention(DType::Bf16, parse_torch_version("2.4.1"));
    CHECK(old.kernel_dtype == DType::Bf16);
    CHECK(old.score_forward_bytes == 10);
    CHECK(old.qkv_forward_bytes == 8);
    // Not stated: a current release, which upcasts; fp32 training has nothing to upcast.
    CHECK(sdpa_math_attention(DType::Bf16, std::nullopt).kernel_dtype == DType::Fp32);
    CHECK(sdpa_math_attention(DType::Fp32, std::nullopt).qkv_forward_bytes == 16);
  }
}

TEST_CASE("memory-bound kernels and the GPU optimizer step") {
  HardwareProfile hw = synthetic_device();
  CHECK(memory_bound_time(hw, Bytes(8 * kGB), DType::Bf16).value == doctest::Approx(2e-3));
  // AdamW over fp32 master params, states and grads: read p, g, m, v (16 B), write p, m, v (12 B).
  CHECK(optimizer_bytes_per_param(Optimizer::AdamW, DType::Fp32, DType::Fp32).value == 28);
  CHECK(optimizer_bytes_per_param(Optimizer::AdamW, DType::Fp32, DType::Bf16).value == 26);
  CHECK(optimizer_bytes_per_param(Optimizer::Sgd, DType::Fp32, DType::Fp32).value == 20);
  CHECK(gpu_optimizer_step_time(hw, 1'000'000'000, Optimizer::AdamW, DType::Fp32, DType::Fp32).value ==
        doctest::Approx(28e9 / (4000 * kGB)));
  CHECK(gpu_optimizer_step_time(hw, 0, Optimizer::AdamW, DType::Fp32, DType::Fp32).value == 0);
  // A calibrated elementwise rate replaces the memory bandwidth for its dtype; fp16 without its own falls
  // back to fp32's, and every dtype to memory_bandwidth when there is none.
  hw.elementwise_bandwidth_bf16 = BytesPerSecond(2 * kGB);
  CHECK(memory_bound_time(hw, Bytes(8 * kGB), DType::Bf16).value == doctest::Approx(4.0));
  CHECK(memory_bound_time(hw, Bytes(8 * kGB), DType::Fp16).value == doctest::Approx(2e-3));
  hw.elementwise_bandwidth_fp32 = BytesPerSecond(8 * kGB);
  CHECK(memory_bound_time(hw, Bytes(8 * kGB), DType::Fp16).value == doctest::Approx(1.0));
  CHECK(memory_bound_time(hw, Bytes(8 * kGB), DType::Fp32).value == doctest::Approx(1.0));
  CHECK(gpu_optimizer_step_time(hw, 1'000'000'000, Optimizer::AdamW, DType::Fp32, DType::Fp32).value ==
        doctest::Approx(28e9 / (8 * kGB)));
}

TEST_CASE("host optimizer: memory or compute bound, shared by the node's ranks") {
  HardwareProfile hw = synthetic_device();
  int64_t p = 1'000'000'000;
  // Memory: 28 GB over 400 GB/s = 70 ms. Compute: 16 GFLOP over 64 cores x 100 GFLOP/s = 2.5 ms.
  CHECK(host_optimizer_step_time(hw, p, Optimizer::AdamW, DType::Fp32, DType::Fp32, 1).value == doctest::Approx(0.07));
  // Eight ranks per node share the bandwidth: each sees 50 GB/s.
  CHECK(host_optimizer_step_time(hw, p, Optimizer::AdamW, DType::Fp32, DType::Fp32, 8).value == doctest::Approx(0.56));
  // With a fast memory and one slow core the compute bound takes over: 16 GFLOP / 100 GFLOP/s.
  hw.host_memory_bandwidth = BytesPerSecond(1e6 * kGB);
  hw.cpu_cores = 1;
  CHECK(host_optimizer_step_time(hw, p, Optimizer::AdamW, DType::Fp32, DType::Fp32, 1).value == doctest::Approx(0.16));
  hw.host_memory_bandwidth = BytesPerSecond(0);
  CHECK_THROWS_AS(host_optimizer_step_time(hw, p, Optimizer::AdamW, DType::Fp32, DType::Fp32, 1), InputError);
}

// Measured on one H200 (../shared/calibration/pytorch-h200.jsonl; torch 2.11, FSDP2, bf16 params, sdpa,
// world emulated, so step_s is compute only). Steps 2 and 3 are the steady state; the smaller one is used
// because noise only adds time.
//   llama3-8b, world 8, micro_batch 1, seq 4096, act_ckpt false: step_s [4.266, 0.702, 0.463] -> 0.4630
//   llama3-8b, same, act_ckpt true (every decoder layer recomputed):  [2.654, 0.577, 0.576] -> 0.5758
TEST_CASE("h200 profile against the measured H200 step times") {
  HardwareProfile h200 = load_hardware("h200-141gb", kRoot);
  const LlamaShape llama3_8b{4096, 32, 32, 8, 14336, 128256};

  SUBCASE("recomputation: the extra forward of the decoder layers (GEMMs + attention) vs the measured difference") {
    // Full activation checkpointing adds one forward of every decoder layer to the step, so
    // step(ckpt) - step(no ckpt) = 0.5758 - 0.4630 = 0.1128 s is (mostly) decoder-layer forward compute:
    // 32 layers x 2 x 4096 tokens x 218.1M params = 57.2 TFLOP of GEMMs and 4.4 TFLOP of causal attention.
    // The prediction leaves out the layers' memory-bound forward work (norms, SiLU, RoPE, residuals), so
    // it should land somewhat below the difference: within 25%.
    LlamaShape layers_only = llama3_8b;
    StepCompute full = llama_step(h200, layers_only, 1, 4096);
    // Remove the lm_head's forward GEMM, which is not recomputed.
    double lm_head_fwd = matmul_time(h200, 4096, llama3_8b.vocab, llama3_8b.hidden, DType::Bf16).value;
    double recompute = full.gemm_forward.value - lm_head_fwd + full.attention_forward.value;
    double measured = 0.5758 - 0.4630;
    MESSAGE("llama3-8b recompute forward: predicted " << recompute << " s, measured difference " << measured << " s");
    CHECK(recompute == doctest::Approx(measured).epsilon(0.25));
  }
  // The GEMM + attention time of whole steps against the roofline computed from the profile, and below the
  // measured steps: test_step_compute_roofline.cpp.
}
