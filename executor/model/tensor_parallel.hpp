// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053 sec. 3) with sequence parallelism
// (Korthikanti et al. 2022, arXiv:2205.05198 sec. 4.2.2), for the functional model of transformer.hpp:
// - q/k/v and gate/up are column-parallel (each rank holds its heads' / its intermediate columns' rows), o_proj and
//   down_proj row-parallel (the matching input columns); a rank's partial outputs are summed over the tp group;
// - attention heads and kv heads are split over tp; when kv_heads < tp each rank holds the kv head its query heads
//   use (replicated over the tp/kv_heads ranks sharing it; their gradients are summed over those ranks);
// - the embedding and the head are vocabulary-parallel: rows of the vocabulary per rank, and the cross-entropy is
//   computed without gathering the logits (Megatron's vocab_parallel_cross_entropy: max, sum of exponentials and
//   target logit all-reduced over tp);
// - without sequence parallelism the block's input is copied into the tp region (identity forward, all-reduce
//   backward: Megatron's f) and its output all-reduced (g); with it, norms and residuals run on 1/tp of the sequence,
//   the input is all-gathered along the sequence and the output reduce-scattered (backward: the reverse);
// - parameters that are not split (norms, row-parallel biases, position embeddings) are replicated; where a rank
//   computes only part of their gradient (on its sequence slice under sequence parallelism, on its heads for Qwen3's
//   per-head q/k norms) the parts are summed over tp (Megatron's allreduce of layernorm grads with sequence
//   parallelism).
// Uneven splits (a vocabulary or intermediate size not divisible by tp) give the first n mod tp ranks one more row.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/model_spec.hpp"
#include "program/op_kinds.hpp"

namespace fsdp::exec {

class Group;
struct ParamDef;
using ParamMap = std::unordered_map<std::string, at::Tensor>;

// [start, start + size) of `n` rows split over `parts`: the first n mod parts parts one row more.
struct RowRange {
  int64_t start = 0, size = 0;
};
RowRange split_rows(int64_t n, int parts, int index);

// What the forward of one rank's tensor-parallel slice needs. group == nullptr: no tensor parallelism.
struct TpContext {
  Group* group = nullptr;
  int size = 1, rank = 0;
  bool sequence_parallel = false;
  int64_t heads = 0, kv_heads = 0;    // this rank's attention heads and kv heads
  RowRange vocab;                     // this rank's rows of the embedding and the head
  int unit = -1;                      // the wrap unit running (the collectives' tags)
  const bool* in_backward = nullptr;  // the collectives of a recomputation in backward are tagged backward
  bool active() const { return group != nullptr; }
};

// The model's parameters as this tp rank holds them: shapes sliced (ParamDef::tp_dim, tp_start, full_shape), the
// gradient sums over tp marked (ParamDef::grad_sum) and the copies that count in the global gradient norm
// (ParamDef::counts_in_norm: one of identical copies).
std::vector<ParamDef> tp_param_defs(const std::vector<ParamDef>& full, const ModelSpec& spec, int tp, int tp_rank,
                                    bool sequence_parallel);
// This rank's slice of the full parameter `full` (shape def.full_shape).
at::Tensor tp_slice(const ParamDef& def, const at::Tensor& full);
// The ranks of a tp group holding the same kv head (kv_heads < tp): tp / kv_heads consecutive tp ranks.
int kv_group_size(const ModelSpec& spec, int tp);

// Megatron's f / all-gather along the sequence: x [B, T(/tp), H] -> [B, T, H] for a column-parallel block.
at::Tensor tp_enter(const TpContext& tp, const at::Tensor& x);
// Megatron's g / reduce-scatter along the sequence: partial [B, T, H] -> summed [B, T(/tp), H].
at::Tensor tp_exit(const TpContext& tp, const at::Tensor& y);
// A row-parallel linear `prefix`: x W^T summed over tp (tp_exit), then the replicated bias.
at::Tensor row_parallel_linear(const TpContext& tp, const ParamMap& p, const std::string& prefix, const at::Tensor& x);
// The vocabulary-parallel embedding lookup of `tokens` [B, T] with this rank's rows `w`, summed over tp (tp_exit).
at::Tensor vocab_parallel_embedding(const TpContext& tp, const at::Tensor& w, const at::Tensor& tokens);
// Mean cross-entropy of `logits` [N, vocab rows of this rank] (fp32) against `targets` [N] over the whole
// vocabulary (Megatron core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy).
at::Tensor vocab_parallel_cross_entropy(const TpContext& tp, const at::Tensor& logits, const at::Tensor& targets);

}  // namespace fsdp::exec
