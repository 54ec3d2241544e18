#include "compute/compute_cost.hpp"

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"

namespace fsdp {

namespace {

void require_positive(const HardwareProfile& hw, double v, const char* what) {
  if (!(v > 0)) throw InputError("hardware profile '" + hw.name + "': " + what + " is zero");
}

Seconds roofline(const HardwareProfile& hw, Flops flops, FlopsPerSecond achieved, Bytes bytes) {
  require_positive(hw, hw.memory_bandwidth.value, "device.memory_bandwidth");
  require_positive(hw, achieved.value, "device.peak_flops");
  return std::max(flops / achieved, bytes / hw.memory_bandwidth);
}

double dsize(DType d) { return static_cast<double>(dtype_bytes(d)); }

}  // namespace

Flops matmul_flops(int64_t m, int64_t n, int64_t k) { return Flops(2.0 * double(m) * double(n) * double(k)); }

Bytes matmul_bytes(int64_t m, int64_t n, int64_t k, DType dtype) {
  return Bytes(dsize(dtype) * (double(m) * double(k) + double(k) * double(n) + double(m) * double(n)));
}

double tile_wave_efficiency(const HardwareProfile& hw, int64_t m, int64_t n) {
  if (hw.sm_count <= 0 || hw.matmul_tiles.empty() || m <= 0 || n <= 0) return 1.0;
  // The search prices millions of GEMMs: 32-bit divisions where every operand fits (tile counts are at most m x n),
  // else 64-bit ones.
  constexpr int64_t kFits32 = int64_t{1} << 31;
  const bool mn_small = m < kFits32 && n < kFits32 && m * n < kFits32 && hw.sm_count < kFits32;
  double best = 0;
  for (const auto& [tm, tn] : hw.matmul_tiles) {
    const bool small = mn_small && tm < kFits32 && tn < kFits32;
    auto ceil_div = [small](int64_t x, int64_t y) -> int64_t {
      if (small) return (static_cast<uint32_t>(x) + static_cast<uint32_t>(y) - 1u) / static_cast<uint32_t>(y);
      return (x + y - 1) / y;
    };
    const int64_t waves = ceil_div(ceil_div(m, tm) * ceil_div(n, tn), hw.sm_count);
    best = std::max(best, double(m) * double(n) / (double(tm) * double(tn) * double(hw.sm_count) * double(waves)));
  }
  return best;
}

namespace {

// The curve prices the mean of a linear layer's three GEMMs (timeline/op_cost.cpp); their outputs are m x n
// (y = x W^T), m x k (dx = dy W) and n x k (dW = dy^T x), each quantized over the SMs on its own: the mean of
// the three times is the harmonic mean of their efficiencies.
double linear_quantized(const HardwareProfile& hw, int64_t m, int64_t n, int64_t k) {
  return 3.0 / (1.0 / tile_wave_efficiency(hw, m, n) + 1.0 / tile_wave_efficiency(hw, m, k) +
                1.0 / tile_wave_efficiency(hw, n, k));
}

}  // namespace

Seconds matmul_time(const HardwareProfile& hw, int64_t m, int64_t n, int64_t k, DType dtype) {
  if (m <= 0 || n <= 0 || k <= 0) return Seconds(0);
  Flops f = matmul_flops(m, n, k);
  FlopsPerSecond rate = hw.peak_flops(dtype) * (hw.matmul_curve(dtype).at(f.value) * linear_quantized(hw, m, n, k));
  return roofline(hw, f, rate, matmul_bytes(m, n, k, dtype));
}

int64_t fused_linear_ce_chunk_rows(int64_t tokens, int64_t vocab, int64_t hidden) {
  FSDP_ASSERT(tokens > 0 && vocab > 0 && hidden > 0, "a fused linear cross-entropy needs tokens, vocab and hidden");
  const int64_t inc_factor = (vocab + hidden - 1) / hidden;
  const int64_t rows = (tokens + inc_factor - 1) / inc_factor;
  int64_t chunk = 1;
  while (chunk < rows) chunk *= 2;
  return chunk;
}

Seconds fused_linear_cross_entropy_time(const HardwareProfile& hw, int64_t tokens, int64_t vocab, int64_t hidden,
                                        DType dtype) {
  const int64_t chunk = fused_linear_ce_chunk_rows(tokens, vocab, hidden);
  const double b = dsize(dtype), v = double(vocab), h = double(hidden);
  auto chunk_time = [&](int64_t c) {
    const Flops f = matmul_flops(c, vocab, hidden);
    const FlopsPerSecond rate =
        hw.peak_flops(dtype) * (hw.matmul_curve(dtype).at(f.value) * linear_quantized(hw, c, vocab, hidden));
    const double r = double(c);
    return roofline(hw, f, rate, Bytes(b * (r * h + v * h + r * v))).value +       // logits = x_c W^T
           roofline(hw, f, rate, Bytes(b * (r * v + v * h + r * h))).value +       // dx_c = g_c W
           roofline(hw, f, rate, Bytes(b * (r * v + r * h + 2.0 * v * h))).value;  // dW += g_c^T x_c (beta 1)
  };
  const int64_t whole = tokens / chunk, rest = tokens % chunk;
  return Seconds(double(whole) * chunk_time(chunk) + (rest > 0 ? chunk_time(rest) : 0.0));
}

LinearGemmTimes float8_linear_gemm_times(const HardwareProfile& hw, int64_t m, int64_t n, int64_t k, DType out_dtype) {
  if (m <= 0 || n <= 0 || k <= 0) return LinearGemmTimes{};
  const Flops f = matmul_flops(m, n, k);
  const FlopsPerSecond fast_accumulation =
      hw.float8_peak_flops() * (hw.matmul_curve(out_dtype).at(f.value) * linear_quantized(hw, m, n, k));
  constexpr double kFloat8Bytes = 1.0;
  const Bytes bytes(kFloat8Bytes * (double(m) * double(k) + double(k) * double(n)) +
                    dsize(out_dtype) * double(m) * double(n));
  // The output GEMM accumulates fast, the two gradient GEMMs do not (torchao/float8/config.py @ 36027d82d:
  // gemm_config_output use_fast_accum=True, gemm_config_grad_input and gemm_config_grad_weight the default False).
  return LinearGemmTimes{roofline(hw, f, fast_accumulation, bytes),
                         roofline(hw, f, fast_accumulation * hw.float8_matmul_efficiency_ratio(), bytes)};
}

Seconds batched_matmul_time(const HardwareProfile& hw, int64_t batch, int64_t m, int64_t n, int64_t k, DType dtype) {
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return Seconds(0);
  const double b = double(batch);
  const Flops f = matmul_flops(m, n, k) * b;
  const FlopsPerSecond rate =
      hw.peak_flops(dtype) * (hw.matmul_curve(dtype).at(f.value) * tile_wave_efficiency(hw, batch * m, n));
  return roofline(hw, f, rate, matmul_bytes(m, n, k, dtype) * b);
}

double causal_keys_per_query(int64_t seq, int64_t window, bool chunked) {
  const double s = static_cast<double>(seq);
  if (window <= 0 || window >= seq) return s * 0.5;
  const double w = static_cast<double>(window);
  if (chunked) {
    const double whole = static_cast<double>(seq / window);
    const double rest = s - whole * w;
    return (whole * w * w + rest * rest) / (2.0 * s);
  }
  return w - w * w / (2.0 * s);
}

double flex_document_block_factor(int64_t doc_len) {
  if (doc_len <= 0) return 1.0;
  constexpr double kBlock = 128;  // torch.nn.attention.flex_attention _DEFAULT_SPARSE_BLOCK_SIZE
  const double n = static_cast<double>(doc_len);
  return (n + 3.0 * kBlock) / (n + kBlock);
}

Flops attention_forward_flops(const AttentionShape& a) {
  FSDP_ASSERT(a.causal || a.window == 0, "a local-attention window is modelled for causal attention only");
  if (a.window > 0 && a.window < a.seq_len)
    return Flops(4.0 * double(a.batch) * double(a.seq_len) * double(a.heads) * double(a.head_dim) *
                 causal_keys_per_query(a.seq_len, a.window, a.chunked));
  double s = double(a.seq_len);
  double f = 4.0 * double(a.batch) * s * s * double(a.heads) * double(a.head_dim);
  // With a causal mask FlashAttention skips the blocks above the diagonal (FlashAttention-2 paper,
  // section 3.1.1 "Causal masking"), so about half the FLOPs are done; the FA benchmarks count f/2.
  return Flops(a.causal ? f / 2 : f);
}

Flops attention_backward_flops(const AttentionShape& a) {
  // Backward recomputes QK^T and computes dV, dP, dQ, dK: 5 matmuls against the forward's 2.
  return attention_forward_flops(a) * 2.5;
}

Bytes attention_forward_bytes(const AttentionShape& a, DType dtype) {
  double tokens = double(a.batch) * double(a.seq_len);
  double q_or_o = tokens * double(a.heads) * double(a.head_dim);
  double k_or_v = tokens * double(a.kv_heads) * double(a.head_dim);
  return Bytes(dsize(dtype) * (2 * q_or_o + 2 * k_or_v));  // read q, k, v; write o
}

Bytes attention_backward_bytes(const AttentionShape& a, DType dtype) {
  double tokens = double(a.batch) * double(a.seq_len);
  double q_or_o = tokens * double(a.heads) * double(a.head_dim);
  double k_or_v = tokens * double(a.kv_heads) * double(a.head_dim);
  // read q, o, dO and write dq (4 query-sized); read k, v and write dk, dv (4 key-sized)
  return Bytes(dsize(dtype) * (4 * q_or_o + 4 * k_or_v));
}

Seconds attention_forward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype) {
  return attention_forward_time(hw, a, dtype, 1.0);
}

Seconds attention_backward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype) {
  return attention_backward_time(hw, a, dtype, 1.0);
}

namespace {

// The fraction of the device's peak a fused attention call of `f` FLOPs runs at, read from `curve`.
// With a reference call (HardwareProfile::attention_reference_*: FlashAttention's benchmarks, 16k tokens per call
// over 16 heads, the sequence varied) the curve is read at the FLOPs of the reference call of this call's sequence,
// f x (reference tokens x heads) / (this call's tokens x heads): the kernel's work per thread block (one block of
// query rows of one head against its keys) is what the sequence sets, and more sequences or heads add blocks, not
// work per block. A call with fewer blocks than the device has SMs leaves the rest idle: FlashAttention-2 launches
// one block per 128 query rows of each head and sequence (grid (ceil(seqlen_q / kBlockM), b, h), kBlockM 128 for
// head dims up to 128 on sm80 and sm90: pytorch/pytorch aten/src/ATen/native/transformers/cuda/flash_attn/
// flash_fwd_launch_template.h @ 04ff5bebd3a737cd53c7858de8998a37a4003c49 run_flash_fwd, run_mha_fwd_hdim128).
double attention_fraction(const HardwareProfile& hw, const EfficiencyCurve& curve, const AttentionShape& a, Flops f) {
  if (hw.attention_reference_tokens <= 0) return curve.at(f.value);
  const double tokens_heads = double(a.batch) * double(a.seq_len) * double(a.heads);
  const double reference = double(hw.attention_reference_tokens) * double(hw.attention_reference_heads);
  double fraction = curve.at(f.value * reference / tokens_heads);
  if (hw.sm_count > 0) {
    constexpr int64_t kQueryRowsPerBlock = 128;
    const double blocks =
        double((a.seq_len + kQueryRowsPerBlock - 1) / kQueryRowsPerBlock) * double(a.batch) * double(a.heads);
    fraction *= std::min(1.0, blocks / double(hw.sm_count));
  }
  return fraction;
}

}  // namespace

Seconds attention_forward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype, double rate_ratio) {
  FSDP_ASSERT(rate_ratio > 0, "an attention kernel's rate ratio is positive");
  if (a.batch <= 0 || a.seq_len <= 0) return Seconds(0);
  Flops f = attention_forward_flops(a);
  FlopsPerSecond rate =
      hw.peak_flops(dtype) * (attention_fraction(hw, hw.attention_forward_curve(dtype), a, f) * rate_ratio);
  return roofline(hw, f, rate, attention_forward_bytes(a, dtype));
}

Seconds attention_backward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype, double rate_ratio) {
  FSDP_ASSERT(rate_ratio > 0, "an attention kernel's rate ratio is positive");
  if (a.batch <= 0 || a.seq_len <= 0) return Seconds(0);
  Flops f = attention_backward_flops(a);
  FlopsPerSecond rate =
      hw.peak_flops(dtype) * (attention_fraction(hw, hw.attention_backward_curve(dtype), a, f) * rate_ratio);
  return roofline(hw, f, rate, attention_backward_bytes(a, dtype));
}

Seconds memory_bound_time(const HardwareProfile& hw, Bytes bytes_moved, DType compute_dtype) {
  if (bytes_moved.value <= 0) return Seconds(0);
  require_positive(hw, hw.memory_bandwidth.value, "device.memory_bandwidth");
  return bytes_moved / hw.elementwise_bandwidth(compute_dtype);
}

Bytes optimizer_bytes_per_param(Optimizer opt, DType state_dtype, DType grad_dtype) {
  double s = dsize(state_dtype), g = dsize(grad_dtype);
  switch (opt) {
    // torch.optim.AdamW: reads param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq.
    case Optimizer::AdamW:
      return Bytes(3 * s + g + 3 * s);
    // torch.optim.SGD with momentum: reads param, grad, momentum_buffer; writes param, momentum_buffer.
    case Optimizer::Sgd:
      return Bytes(2 * s + g + 2 * s);
  }
  return Bytes(0);
}

double optimizer_flops_per_param(Optimizer opt) {
  switch (opt) {
    // torch.optim.AdamW algorithm (PyTorch docs): decay theta -= lr*lambda*theta (2); m = b1 m + (1-b1) g (3);
    // v = b2 v + (1-b2) g^2 (4); bias corrections m/(1-b1^t), v/(1-b2^t) (2);
    // theta -= lr * m_hat / (sqrt(v_hat) + eps) (5): 16 FLOPs.
    case Optimizer::AdamW:
      return 16;
    // torch.optim.SGD algorithm: g += lambda*theta (2); b = mu b + g (2); theta -= lr b (2): 6 FLOPs.
    case Optimizer::Sgd:
      return 6;
  }
  return 0;
}

Seconds gpu_optimizer_step_time(const HardwareProfile& hw, int64_t params, Optimizer opt, DType state_dtype,
                                DType grad_dtype) {
  if (params <= 0) return Seconds(0);
  return memory_bound_time(hw, optimizer_bytes_per_param(opt, state_dtype, grad_dtype) * double(params), state_dtype);
}

Seconds host_optimizer_step_time(const HardwareProfile& hw, int64_t params, Optimizer opt, DType state_dtype,
                                 DType grad_dtype, int ranks_per_node) {
  if (params <= 0) return Seconds(0);
  require_positive(hw, hw.host_memory_bandwidth.value, "node.host_memory_bandwidth");
  require_positive(hw, hw.host_flops_per_core.value, "node.cpu_peak_flops_per_core");
  int sharing = std::max(1, ranks_per_node);
  BytesPerSecond bw = hw.host_memory_bandwidth / double(sharing);
  double cores = std::max(1.0, double(hw.cpu_cores) / sharing);
  Seconds memory = optimizer_bytes_per_param(opt, state_dtype, grad_dtype) * double(params) / bw;
  Seconds compute = Flops(optimizer_flops_per_param(opt) * double(params)) / (hw.host_flops_per_core * cores);
  return std::max(memory, compute);
}

}  // namespace fsdp
