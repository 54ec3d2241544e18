// Unfused attention on a GPU: eager attention (Hugging Face's eager_attention_forward) and SDPA's math backend.
// Both compute the whole s x s score matrix S = Q K^T as a batched GEMM (a causal or sliding-window mask is added
// to it, no block is skipped), run elementwise kernels over it (scale, mask, softmax, casts), and multiply the
// probabilities by V in a second batched GEMM; autograd's backward runs four batched GEMMs (dP = dO V^T,
// dV = P^T dO, dQ = dS K, dK = dS^T Q) and the elementwise backward of each pass. The fused kernels (flash,
// memory-efficient, cuDNN) are priced by compute_cost.hpp's attention curves instead.
#pragma once

#include "compute/compute_cost.hpp"
#include "core/versions.hpp"

namespace fsdp {

// What one unfused implementation moves besides its GEMMs, in HBM bytes per element of the tensors it touches.
struct UnfusedAttentionRecipe {
  DType input_dtype = DType::Bf16;   // the dtype q, k and v arrive in (the compute dtype)
  DType kernel_dtype = DType::Bf16;  // the dtype its GEMMs and score kernels compute in
  double score_forward_bytes = 0;    // per element of the b x h x s x s score matrix, forward
  double score_backward_bytes = 0;   // the same, backward
  double qkv_forward_bytes = 0;      // per element of a query-sized tensor (b x s x h x d), summed over q, k, v, o
  double qkv_backward_bytes = 0;     // the same, backward
  // GQA / MQA: k and v are expanded to the query heads by a copy (transformers repeat_kv; the math backend's
  // enable_gqa path repeats them too), and the backward sums the expanded gradients back.
  bool expands_kv = true;
};

// transformers/models/llama/modeling_llama.py eager_attention_forward (the same function in every family's
// modeling file): matmul(q, k^T) * scaling, + causal_mask, softmax(dim=-1, dtype=float32).to(q.dtype) when the
// runtime's eager softmax runs in fp32 (RuntimeProfile::eager_softmax_fp32), dropout (p = 0 in these runs: ATen's
// dropout returns its input for p == 0), matmul(p, v).
UnfusedAttentionRecipe hf_eager_attention(DType compute, bool softmax_fp32);

// SDPA's math backend (pytorch/pytorch aten/src/ATen/native/transformers/attention.cpp
// _scaled_dot_product_attention_math): q * sqrt(scale), k^T * sqrt(scale), matmul, add_(mask), softmax, matmul.
// From torch 2.5 on, fp16 and bf16 inputs are upcast to fp32 first unless
// torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True) is set (pytorch/pytorch#128922; the default is
// off), so its GEMMs run at the fp32 rate and the output is cast back. `torch`: the release that runs (nullopt:
// not stated, taken as a current one, which upcasts).
UnfusedAttentionRecipe sdpa_math_attention(DType compute, const std::optional<TorchVersion>& torch);

// FLOPs: forward 2 GEMMs of 2 b h s^2 d each (the full square: 4 b h s^2 d, twice a causal flash kernel's count);
// backward 4 of them (8 b h s^2 d: no recomputation, the probabilities are saved).
Flops unfused_attention_forward_flops(const AttentionShape& a);
Flops unfused_attention_backward_flops(const AttentionShape& a);
Seconds unfused_attention_forward_time(const HardwareProfile& hw, const AttentionShape& a,
                                       const UnfusedAttentionRecipe& r);
Seconds unfused_attention_backward_time(const HardwareProfile& hw, const AttentionShape& a,
                                        const UnfusedAttentionRecipe& r);

}  // namespace fsdp
