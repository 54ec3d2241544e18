#include "compute/unfused_attention.hpp"

namespace fsdp {

namespace {

constexpr double kFp32Bytes = 4.0;

double dsize(DType d) { return static_cast<double>(dtype_bytes(d)); }

// Elements of the score matrix and of one query-sized and one key-sized tensor.
struct Elems {
  double scores, q, kv;
};
Elems elems(const AttentionShape& a) {
  const double tokens = double(a.batch) * double(a.seq_len);
  return Elems{double(a.batch) * double(a.heads) * double(a.seq_len) * double(a.seq_len),
               tokens * double(a.heads) * double(a.head_dim), tokens * double(a.kv_heads) * double(a.head_dim)};
}

// The expansion of k and v to the query heads: read kv-sized, write query-sized, each of the two (forward); the
// backward reads the expanded gradients and writes the summed ones. In the compute dtype (before any upcast).
double expand_kv_bytes(const AttentionShape& a, const UnfusedAttentionRecipe& r) {
  if (!r.expands_kv || a.kv_heads >= a.heads) return 0;
  const Elems e = elems(a);
  return 2.0 * (e.kv + e.q) * dsize(r.input_dtype);
}

}  // namespace

UnfusedAttentionRecipe hf_eager_attention(DType compute, bool softmax_fp32) {
  const double d = dsize(compute);
  UnfusedAttentionRecipe r;
  r.input_dtype = compute;
  r.kernel_dtype = compute;
  // Forward, per score element: `* scaling` reads and writes it (2d); `+ causal_mask` reads it and the mask and
  // writes the sum (3d); softmax reads it and writes fp32 probabilities, .to(q.dtype) reads those and writes them
  // back (d + 4, 4 + d); without the fp32 softmax, one read and one write (2d).
  r.score_forward_bytes = 2 * d + 3 * d + (softmax_fp32 ? 2 * (d + kFp32Bytes) : 2 * d);
  // Backward: the cast's backward reads the gradient and writes it in fp32 (d + 4); softmax's backward reads the
  // gradient and the saved fp32 output and writes the input's gradient in the input dtype (4 + 4 + d), or 3d
  // without the upcast; the mask add passes the gradient through; the scaling reads and writes it (2d).
  r.score_backward_bytes = (softmax_fp32 ? (d + kFp32Bytes) + (2 * kFp32Bytes + d) : 3 * d) + 2 * d;
  // q, k, v and the output: the transposes to (batch, heads, seq, dim) are counted with the layer's elementwise
  // traffic (program/layer_costs.cpp, "attention layout"); nothing else touches them.
  r.qkv_forward_bytes = 0;
  r.qkv_backward_bytes = 0;
  return r;
}

UnfusedAttentionRecipe sdpa_math_attention(DType compute, const std::optional<TorchVersion>& torch) {
  const bool half = compute == DType::Bf16 || compute == DType::Fp16;
  const bool upcast = half && (!torch || torch->at_least(2, 5));
  const double d = dsize(compute), u = upcast ? kFp32Bytes : d;
  UnfusedAttentionRecipe r;
  r.input_dtype = compute;
  r.kernel_dtype = upcast ? DType::Fp32 : compute;
  // Per score element: add_(mask) reads the scores and the mask and writes in place (3u); softmax reads and writes
  // (2u). Backward: softmax's backward reads the gradient and the output and writes (3u); add_ passes it through.
  // The causal mask itself (ones(L, S).tril(), converted to -inf / 0) is built once per call, not per head: left out.
  r.score_forward_bytes = 5 * u;
  r.score_backward_bytes = 3 * u;
  // Per query-sized element: q * sqrt(scale) and k^T * sqrt(scale) read and write (2u each), forward and backward;
  // with the upcast, q, k and v are cast to fp32 and the output back (4 casts of d + u), and in backward the
  // output's gradient is cast up and the three input gradients down (4 more).
  r.qkv_forward_bytes = 4 * u + (upcast ? 4 * (d + u) : 0);
  r.qkv_backward_bytes = 4 * u + (upcast ? 4 * (d + u) : 0);
  return r;
}

Flops unfused_attention_forward_flops(const AttentionShape& a) {
  return matmul_flops(a.seq_len, a.seq_len, a.head_dim) * (2.0 * double(a.batch) * double(a.heads));
}

Flops unfused_attention_backward_flops(const AttentionShape& a) { return unfused_attention_forward_flops(a) * 2.0; }

namespace {

// One pass of unfused attention: `sd_gemms` batched GEMMs with s x s outputs over d and `ds_gemms` with s x d
// outputs over s, `score_bytes` and `qkv_bytes` per score and per query-sized element through its elementwise
// kernels, and the k / v expansion (in the dtype q arrives in, before any upcast).
Seconds unfused_pass_time(const HardwareProfile& hw, const AttentionShape& a, const UnfusedAttentionRecipe& r,
                          double sd_gemms, double ds_gemms, double score_bytes, double qkv_bytes) {
  if (a.batch <= 0 || a.seq_len <= 0) return Seconds(0);
  const int64_t bh = a.batch * a.heads, s = a.seq_len, d = a.head_dim;
  const DType dt = r.kernel_dtype;
  const Seconds gemms =
      batched_matmul_time(hw, bh, s, s, d, dt) * sd_gemms + batched_matmul_time(hw, bh, s, d, s, dt) * ds_gemms;
  const Elems e = elems(a);
  return gemms + memory_bound_time(hw, Bytes(e.scores * score_bytes + e.q * qkv_bytes), dt) +
         memory_bound_time(hw, Bytes(expand_kv_bytes(a, r)), r.input_dtype);
}

}  // namespace

// Forward: S = Q K^T (s x s over d), O = P V (s x d over s).
Seconds unfused_attention_forward_time(const HardwareProfile& hw, const AttentionShape& a,
                                       const UnfusedAttentionRecipe& r) {
  return unfused_pass_time(hw, a, r, 1.0, 1.0, r.score_forward_bytes, r.qkv_forward_bytes);
}

// Backward: dP = dO V^T (s x s over d); dV = P^T dO, dQ = dS K, dK = dS^T Q (s x d over s).
Seconds unfused_attention_backward_time(const HardwareProfile& hw, const AttentionShape& a,
                                        const UnfusedAttentionRecipe& r) {
  return unfused_pass_time(hw, a, r, 1.0, 3.0, r.score_backward_bytes, r.qkv_backward_bytes);
}

}  // namespace fsdp
