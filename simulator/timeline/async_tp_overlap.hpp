// PyTorch's async tensor parallelism as it runs (torchtitan parallelism.enable_async_tensor_parallel): what a
// collective that Inductor's micro-pipeline pass fused with its GEMM leaves on the critical path, beyond the GEMM's
// own unsplit time (which the compute op already prices). Which collectives fuse: tensor_parallel.hpp.
//
// Source: pytorch/pytorch torch/distributed/_symmetric_memory/__init__.py, the mid-2025 version the benchmark's
// nightly (38410cf9b57079f3360c1e79601973a01cb2588c, 2025-06-14) carries (read from a stored copy of that era: the
// fused_scaled_matmul_reduce_scatter with orig_scatter_dim, torch.cuda streams; that exact commit's file was not
// available to read). The two pipelining functions keep the same logic at 006b161f8e5a26c8618dee34ee4d6b5dcaf578c0,
// where the partials' reduction became one Triton kernel accumulating in fp32 (the same bytes moved). For the large M
// of training (M = tokens of the micro-batch; the native _async_input_mm path is only taken for 2048 < M <= 4096
// under TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP, multimem for M <= 2048) both fused ops take the decomposition path.
// The copies run at the tp tier's bandwidth (the all-gather's transfer over tp - 1 steps: no copy-engine P2P figure
// for this part was found to cite); they use no SMs, so the GEMMs beside them are not slowed as under NCCL.
//  - fused_all_gather_matmul -> _fused_all_gather_matmul_impl -> _pipelined_all_gather_and_consume: the rank copies
//    its shard into its symmetric-memory buffer ("mv") and waits at a barrier, deliberately not overlapped with the
//    first GEMM (the function's comment: "giving up the chance to overlap mv and b"); then the local shard's GEMMs
//    (M/tp rows, every B of the call) run first, and for steps 1..tp-1 the remote shards are pulled with
//    Tensor.copy_ from the peer's buffer (a copy-engine transfer over NVLink, no SMs) and consumed, alternating
//    between the current and a backend stream so that one step's copy runs under the other's GEMM ("cp from
//    different streams cannot overlap": the copies form one chain) and two steps' GEMMs can run together ("allows
//    for computation/computation overlapping, greatly reducing quantization inefficiency").
//  - fused_matmul_reduce_scatter -> _fused_matmul_reduce_scatter_impl -> _pipelined_produce_and_all2all: for steps
//    1..tp-1, alternating streams, the partial GEMM for a peer's rows (M/tp) into a symmetric buffer, a barrier, the
//    peer's partial pulled by copy-engine copy; the local rows' GEMM last. Then torch.sum over the stacked partials
//    (reduce_fn, one eager reduction kernel): it reads the tp partials (the whole M x N output) and writes the M/tp x N
//    shard, work NCCL's reduce-scatter does inside its own kernel.
// Priced per fused call (the chunks' GEMMs through the GEMM cost path, so the efficiency curve and tile-wave
// quantization see the M/tp-row calls):
//   all-gather + matmul:     latency + stage + max(tp x pooled, (tp - 1) x copy + single) - whole
//   matmul + reduce-scatter: latency + max(tp x pooled, single + (tp - 1) x copy) + reduce - whole
// `single` one chunk's GEMMs alone (the pipeline's head or tail), `pooled` one chunk's when two streams run theirs
// together (two chunks' GEMMs priced as one of 2M/tp rows, halved: their tiles share the waves), `copy` one chunk's
// copy (the tier's all-gather transfer over tp - 1 steps), `stage` the shard's copy into the symmetric buffer and
// `reduce` the partials' reduction (memory-bound), `latency` the collective's latency once (the barriers).
#pragma once

#include <cstdint>

#include "hardware/hardware_profile.hpp"
#include "program/step_program.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// The GEMMs one fused call decomposes, in seconds (one pass's share of the cost path's mean GEMM).
struct AsyncTpGemms {
  double whole_s = 0;   // unsplit, M rows (what the compute op charges)
  double single_s = 0;  // one chunk alone, M/tp rows
  double pooled_s = 0;  // one chunk when two chunks' GEMMs run together: the GEMM of 2M/tp rows, halved
};

// The data movement of one fused call.
struct AsyncTpMoves {
  double latency_s = 0;  // the collective's latency (its barriers), once
  double copy_s = 0;     // one chunk's copy-engine pull from a peer
  double stage_s = 0;    // all-gather: the shard's copy into the symmetric-memory buffer
  double reduce_s = 0;   // reduce-scatter: the reduction of the tp stacked partials
};

// Exposed seconds of one fused all-gather + matmul (never negative).
double async_tp_all_gather_matmul_exposed_s(const AsyncTpGemms& g, const AsyncTpMoves& m, int64_t tp);
// Exposed seconds of one fused matmul + reduce-scatter (never negative).
double async_tp_matmul_reduce_scatter_exposed_s(const AsyncTpGemms& g, const AsyncTpMoves& m, int64_t tp);

// The exposed seconds of a tensor-parallel op's `op.async_tp_fused_calls` fused
// calls, each priced with the GEMMs Inductor fuses it with (tensor_parallel.hpp), or false where the unit's layers
// do not read as dense attention + MLP blocks (tp_overlap_gemms' reading) or the calls found do not match the count
// (the caller then keeps the 1/tp estimate, tp_exposed_fraction). Per layer, as tp_forward_collectives /
// tp_backward_collectives count them: forward the gathers of the attention's and the MLP's column-parallel inputs
// (with every column GEMM of the block: fused_all_gather_matmul takes the list of Bs) and the reduce-scatters of
// their row-parallel outputs; backward the gathers of the row outputs' gradients (the input-gradient GEMM of the row
// linear), where the layer's forward runs again its column inputs' gathers (full: the block's column GEMMs; the
// per-op policy: the ones it recomputes) and its row outputs' reduce-scatters (full), and the input-gradient
// reduce-scatter of a block read by one linear; the head's gather forward and its input gradient's reduce-scatter.
// Each GEMM at its pass's share of the cost path's mean (matmul_forward_ratio; a backward GEMM the rest over two).
bool async_tp_fused_exposed_s(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Strategy& s,
                              const AsyncTpMoves& moves, double& exposed_s);

}  // namespace fsdp
