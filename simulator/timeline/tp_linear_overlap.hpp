// nanotron's asynchronous tensor-parallel linears (tp_mode REDUCE_SCATTER with tp_linear_async_communication, the
// Ultra-Scale Playbook's runs; RuntimeProfile::tp_linear_async_overlap): which part of each sequence-parallel
// collective of a decoder layer runs under a GEMM of the same linear, and which stays on the critical path.
//
// Source: huggingface/nanotron src/nanotron/parallel/tensor_parallel/functional.py @
// 67c5ebb6a925cb47026b22013af8bd1bb6c46d93 (branch nouamane/bench2, the playbook's benchmark commit), with
// tp_recompute_allgather True (src/nanotron/config/parallelism_config.py default):
//  - _ColumnLinearAsyncCommunication.forward: all_gather_into_tensor(async_op=True) of the sequence shard, the
//    rank's own shard of the output (1/tp of the GEMM) computed meanwhile, then handle.wait() and the other shards:
//    exposed max(0, gather - GEMM / tp).
//  - _ColumnLinearAsyncCommunication.backward: the input gathered again (tp_recompute_allgather: only the shard was
//    saved) while grad_output.matmul(weight) runs, the input gradient then reduce-scattered (async) while the weight
//    gradient runs; both on one communicator, so the reduce-scatter starts when the gather and the input-gradient
//    GEMM are done: exposed max(0, gather - dgrad) + max(0, reduce-scatter - wgrad).
//  - _RowLinearAsyncCommunication.forward: F.linear then differentiable_reduce_scatter_sum, waited for: exposed.
//  - _RowLinearAsyncCommunication.backward: grad_output all-gathered (async) while the rank's own shard of the input
//    gradient (1/tp of that GEMM) runs: exposed max(0, gather - dgrad / tp).
// The vocabulary-parallel head is a TensorParallelColumnLinear (src/nanotron/models/llama.py lm_head) and overlaps
// likewise; the embedding's reduce-scatter (forward) and its conjugate all-gather (backward) are waited for.
#pragma once

#include <cstdint>
#include <vector>

#include "program/op_kinds.hpp"

namespace fsdp {

// One block of a decoder layer (attention, MLP): the seconds of its column-parallel linears' GEMMs and of its
// row-parallel linear's GEMM, forward (x W^T) and one backward GEMM (the input gradient; the weight gradient takes
// as long).
struct TpBlockGemms {
  double column_forward_s = 0, column_backward_s = 0;
  double row_forward_s = 0, row_backward_s = 0;
};

// The GEMMs a linear overlaps its collective with, of a decoder layer and of the head.
struct TpOverlapGemms {
  std::vector<std::vector<TpBlockGemms>> layers;  // per decoder layer of the unit, its blocks in order
  bool head = false;                              // the unit holds the vocabulary-parallel head
  double head_forward_s = 0, head_backward_s = 0;
};

// The exposed seconds of a unit's `calls` tensor-parallel collectives of `kind` in one direction, `one_s` each:
// per layer block, forward one all-gather (column input) and one reduce-scatter (row output); backward two
// all-gathers (the column input again, the row output gradient) and one reduce-scatter (the column input
// gradient); the head one gather forward, one gather and one reduce-scatter backward; every other call (the
// embedding's) exposed whole.
double tp_async_linear_exposed_s(CollectiveKind kind, bool backward, double one_s, int calls, const TpOverlapGemms& g,
                                 int64_t tp);

}  // namespace fsdp
