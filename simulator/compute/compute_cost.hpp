// Roofline compute costs on one device: time = max(FLOPs / achieved FLOP rate, bytes / memory
// bandwidth), with the achieved rate = peak(dtype) x the profile's efficiency curve of that dtype at the
// call's FLOP count. Formulas and sources: docs/hardware.md.
#pragma once

#include <cstdint>

#include "core/units.hpp"
#include "hardware/hardware_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// --- GEMM: C[m,n] = A[m,k] B[k,n] ---
Flops matmul_flops(int64_t m, int64_t n, int64_t k);               // 2mnk
Bytes matmul_bytes(int64_t m, int64_t n, int64_t k, DType dtype);  // read A and B, write C once
// The profile's matmul curve (measured at the best shapes: stas00/ml-engineering's MAMF search) times the tile and
// wave quantization of the call's three GEMMs (tile_wave_efficiency).
Seconds matmul_time(const HardwareProfile& hw, int64_t m, int64_t n, int64_t k, DType dtype);
// Tile and wave quantization of an m x n GEMM output (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
// Background User's Guide", sections "Tile Quantization" and "Wave Quantization"): cuBLAS computes C in tiles, one
// thread block each, and runs them in waves of one block per SM (device.sm_count); a partial tile or a partial last
// wave takes a whole one's time. The fraction of the issued work that is useful, for the best of the profile's tile
// shapes (device.matmul_tiles, as cuBLAS's heuristic picks the kernel); 1 for a profile without them (CPUs).
double tile_wave_efficiency(const HardwareProfile& hw, int64_t m, int64_t n);
// A float8 linear's GEMMs (torch._scaled_mm: E4M3/E5M2 operands, 1 byte each, output in the compute dtype): the
// profile's matmul curve of `out_dtype` (its large-GEMM plateau is a fraction of the bf16 peak) applied to the FP8
// peak, with the same tile and wave quantization, for the forward's output GEMM (fast accumulation: torchao's float8
// roofline assumes that one fraction for bf16 and fp8, torchao/testing/training/roofline_utils.py @
// 36027d82d1ad9949597ea16002ff4940374b1b94, pct_achievable_gemm_tops 0.78 on H100); the two gradient GEMMs, which
// accumulate in full precision, at device.float8_matmul_ratio of it (stas00/ml-engineering's MAMF table timed
// torch._scaled_mm with its default use_fast_accum=False: H100 SXM 70.9% of the FP8 peak against bf16's 80.3%). Its
// bytes are the operands at 1 byte and the output at the compute dtype's size (the same file's
// get_individual_gemm_time_sympy). The forward's output GEMM and each of the two gradient GEMMs:
struct LinearGemmTimes {
  Seconds forward, gradient;
};
LinearGemmTimes float8_linear_gemm_times(const HardwareProfile& hw, int64_t m, int64_t n, int64_t k, DType out_dtype);
// One batched GEMM: `batch` independent products C[m,n] = A[m,k] B[k,n] in one launch (torch.matmul on 4-d tensors
// calls bmm). Its rate is the profile's curve at the launch's FLOP count times the tile and wave quantization of the
// batch's tiles, issued together (batch x m rows of output tiles, n columns); its bytes are every operand read and
// every output written once.
Seconds batched_matmul_time(const HardwareProfile& hw, int64_t batch, int64_t m, int64_t n, int64_t k, DType dtype);

// --- Liger-Kernel's fused linear cross-entropy (linkedin/Liger-Kernel src/liger_kernel/ops/
// fused_linear_cross_entropy.py fused_linear_cross_entropy_forward @ ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c) ---
// The head's `tokens` x `vocab` logits computed chunk by chunk of the tokens: inc_factor = ceil(V / H), chunk =
// next_power_of_2(ceil(tokens / inc_factor)) rows, so one chunk's logits are about as large as the hidden states.
int64_t fused_linear_ce_chunk_rows(int64_t tokens, int64_t vocab, int64_t hidden);
// The three GEMMs of every chunk, all in the forward: the chunk's logits (c x V, K = H), the input's gradient
// (c x H, K = V) and the weight's (V x H, K = c) accumulated into one buffer by torch.addmm with beta 1, which reads
// the whole V x H gradient and writes it back. Each GEMM is a roofline at the rate of a linear of the chunk's shape
// (matmul_time's curve and tile quantization): a chunk's GEMMs read the whole weight (or its gradient) for c rows, so
// their bytes are a V x H tensor each whatever c, and chunks of few rows run at the memory's pace.
Seconds fused_linear_cross_entropy_time(const HardwareProfile& hw, int64_t tokens, int64_t vocab, int64_t hidden,
                                        DType dtype);

// --- Fused (flash) attention over a batch of sequences ---
struct AttentionShape {
  int64_t batch = 1;
  int64_t seq_len = 1;   // queries = keys (self-attention)
  int64_t heads = 1;     // query heads
  int64_t kv_heads = 1;  // key/value heads (GQA/MQA when fewer than heads)
  int64_t head_dim = 1;
  bool causal = true;
  int64_t window = 0;    // local attention: a query attends at most this many keys (0: all; causal only)
  bool chunked = false;  // the window is fixed chunks of `window` tokens, not a band (causal_keys_per_query)
};
// Keys a query attends on average in causal attention over seq tokens, each query attending at most `window`
// earlier keys (0: all of them). Global: seq / 2, the lower triangle (FlashAttention-2 paper, arXiv 2307.08691,
// sec. 3.1.1). Sliding (window < seq): query t attends min(t, window) keys, so sum_t = seq * window -
// window^2 / 2 pairs (continuous count), the band FlashAttention's local attention computes
// (flash_attn_func window_size=(window, 0): only blocks inside the band are visited). Chunked (window < seq): the
// sequence is cut into chunks of `window` tokens and each query attends the earlier keys of its own chunk
// (transformers masking_utils.py create_chunked_causal_mask, Llama 4's attention_chunk_size): n = seq / window whole
// chunks of window^2 / 2 pairs and a last one of r = seq - n window tokens, r^2 / 2 pairs (the same continuous count).
double causal_keys_per_query(int64_t seq, int64_t window, bool chunked = false);
// flex_attention over packed documents of `doc_len` tokens, against the varlen kernel the document pricing assumes:
// the time factor of the block-sparse mask's partial blocks. flex_attention visits every (query block, key block)
// pair of its BlockMask that any pair of tokens in it may attend (torch/nn/attention/flex_attention.py
// create_block_mask; partial blocks run whole with the mask applied), in blocks of 128 x 128 tokens
// (_DEFAULT_SPARSE_BLOCK_SIZE; torchtitan's FlexAttention.Config block_size default). A query block that starts u
// tokens into a document (documents packed end to end, so u is uniform over [0, N) for a document of N) visits
// ceil(u / B) + 1 key blocks: a query attends N / 2 + 3B / 2 keys on average. The varlen kernel starts each
// document's tiles at its first token: N / 2 + B / 2, which the flash curves read at a sequence of N include (their
// causal FLOPs count N / 2). Factor (N + 3B) / (N + B): 1.40 at N = 512, 1.11 at 2048; 1 without documents
// (doc_len 0: the whole sequence one causal document, block-aligned as the varlen kernel's).
double flex_document_block_factor(int64_t doc_len);
// Forward 4 * b * s^2 * h * d (QK^T and PV), halved when causal (a sliding window: 4 * b * s * h * d *
// causal_keys_per_query); backward 2.5x forward (the
// convention of flash-attention's benchmarks/benchmark_flash_attention.py).
Flops attention_forward_flops(const AttentionShape& a);
Flops attention_backward_flops(const AttentionShape& a);
// HBM traffic of the fused kernels: forward reads q, k, v and writes o; backward reads q, k, v, o,
// dO and writes dq, dk, dv (the s x s matrix never reaches HBM).
Bytes attention_forward_bytes(const AttentionShape& a, DType dtype);
Bytes attention_backward_bytes(const AttentionShape& a, DType dtype);
Seconds attention_forward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype);
Seconds attention_backward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype);
// Another fused kernel (SDPA's memory-efficient or cuDNN backend) whose compute rate is `rate_ratio` times the flash
// curves' (HardwareProfile::sdpa_*_ratio); 1: flash itself.
Seconds attention_forward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype, double rate_ratio);
Seconds attention_backward_time(const HardwareProfile& hw, const AttentionShape& a, DType dtype, double rate_ratio);

// --- Memory-bound kernels (elementwise, norms, casts, copies): bytes read + written / the device's
// elementwise bandwidth for the dtype they compute in (HardwareProfile::elementwise_bandwidth: HBM on a GPU,
// a calibrated rate on a CPU) ---
Seconds memory_bound_time(const HardwareProfile& hw, Bytes bytes_moved, DType compute_dtype);

// --- Optimizer step over `params` parameters held in `state_dtype` (master params and states),
// with gradients in `grad_dtype`. Bytes and FLOPs per parameter follow the update rules in
// PyTorch's torch.optim.AdamW / SGD documentation (see compute_cost.cpp).
Bytes optimizer_bytes_per_param(Optimizer opt, DType state_dtype, DType grad_dtype);
double optimizer_flops_per_param(Optimizer opt);
// On the device: memory-bound (bytes / HBM bandwidth).
Seconds gpu_optimizer_step_time(const HardwareProfile& hw, int64_t params, Optimizer opt, DType state_dtype,
                                DType grad_dtype);
// On the host (optimizer offload): `ranks_per_node` ranks step at the same time and share the node's
// memory bandwidth and cores; the slower of the memory and the compute bound.
Seconds host_optimizer_step_time(const HardwareProfile& hw, int64_t params, Optimizer opt, DType state_dtype,
                                 DType grad_dtype, int ranks_per_node);

}  // namespace fsdp
