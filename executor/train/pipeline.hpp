// One step's micro-batches through this rank's pipeline stage (shard/mesh.hpp): the plain loop of forward and
// backward on a single stage (pp 1), else a pipeline schedule with point-to-point sends of the activations and
// their gradients between neighbouring stages:
// - 1F1B (PipeDream-Flush, Narayanan et al. 2021, arXiv:2006.09503; Megatron-LM schedules.py
//   forward_backward_pipelining_without_interleaving): stage s of P runs min(P - s - 1, K) warm-up forwards, then
//   alternates one forward and one backward, then runs the remaining backwards, so at most P - s micro-batches'
//   activations are alive on it;
// - GPipe (Huang et al. 2019, arXiv:1811.06965): every forward, then every backward (K alive).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace fsdp::exec {

class ShardedModel;

struct MicroBatch {
  at::Tensor tokens, targets;  // [b, T] int64
};

// Runs forward and backward of every micro-batch (the loss multiplied by loss_scale / K before its backward), the
// gradients synchronised on each stage's last one. Returns the sum of the micro-batches' mean losses (fp64, one
// element) on the last stage, zero on the others.
at::Tensor run_micro_batches(ShardedModel& model, const std::vector<MicroBatch>& batches, double loss_scale);

}  // namespace fsdp::exec
