// Expert parallelism as a transform of the step, beside data_parallel.hpp, tensor_parallel.hpp and
// pipeline_parallel.hpp: what splitting a mixture-of-experts model's routed experts over ep ranks does to a rank's
// units and adds to its step. "MoE dispatch all-to-all time" is here: ep_layer_all_to_alls gives the collectives, the
// step program emits them on Stream::ExpertParallel (GroupKind::Expert), op_cost.cpp prices them
// (comm/collective_cost.hpp all_to_all_cost).
//
// Sources (pytorch/torchtitan @ b5bcd76c6):
//  - torchtitan/distributed/parallel_dims.py: ep must divide dp_shard x cp x tp; the routed experts live on the sparse
//    mesh (pp, dp_replicate, efsdp, ep), ep innermost (consecutive ranks, a node's NVLink for ep <= 8), and FSDP
//    shards each rank's experts over efsdp = dp_shard x cp x tp / ep ranks. A rank so stores 1/dp_shard of the routed
//    experts' parameters, as without expert parallelism, but gathers only its E/ep experts for a block, over a group
//    ep times smaller.
//  - torchtitan/models/common/token_dispatcher.py AllToAllTokenDispatcher: each MoE block exchanges its token counts,
//    waits for them on the host (a device-to-host sync), sends each routed token copy (T x k per micro-batch, hidden
//    wide) to the rank holding its expert (all_to_all_single, dispatch) and the experts' outputs back (combine);
//    autograd runs the two again, reversed, in backward. The block waits for each: they are on the critical path.
//  - torchtitan/distributed/activation_checkpoint.py: the per-op policy saves all_to_all_single's output, so a block
//    recomputed under it does not exchange again; full checkpointing runs the block's forward, and its two
//    all-to-alls, again in backward.
//  - Balanced routing (every expert sees T x k / E of the tokens, GShard: Lepikhin et al. 2020, arXiv:2006.16668,
//    sec. 2.2 with the auxiliary balance loss): a rank's E/ep experts compute ep times the tokens each of E experts
//    would, the same FLOPs in fewer, larger GEMMs, and receive as many token copies as it sends.
// Beside pipeline parallelism each stage splits its own layers' experts over its data-parallel ranks (the same
// transform on the stage's program). Not modelled: expert parallelism beside tensor parallelism (torchtitan's ep over
// tp, or expert tensor parallelism), token dropping by a capacity factor, load imbalance, DeepEP's fused kernels; rule
// ExpertParallel (strategy/capabilities.cpp) refuses what is not priced.
#pragma once

#include <cstdint>

#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"

namespace fsdp {

// A linear of a routed expert: it sees a fraction of the tokens (k / E; ModuleGraph's MoE experts), where every other
// linear, a shared expert's too, sees them all.
bool routed_expert_linear(const ModuleNode& n);

// Scales one decoder layer's GEMM shapes to one rank of the ep group: of its routed experts' GEMMs (GemmShape::routed,
// one per expert and linear, experts in order) the rank runs its E / ep experts' on ep times the tokens each.
// Parameters, FLOPs and saved tensors per rank are unchanged under balanced routing.
void shard_layer_for_ep(LayerCost& lc, int64_t ep);

// Of `params` parameter elements, `routed` of them routed experts', those a rank holds gathered (unsharded) under
// expert parallelism of degree `ep`: the others and its own experts, routed / ep.
double ep_unsharded_params(double params, double routed, int64_t ep);

// The same elements as a collective over the `shard`-rank shard group sees them: the others as they are, and the
// rank's experts, gathered over their efsdp group (shard / ep ranks), as the elements whose collective over the shard
// group moves per rank what theirs moves (a ring all-gather or reduce-scatter of S over n ranks sends S (n - 1) / n).
// The efsdp group is priced on the shard group's tier (both cross the nodes' NICs once they span nodes; inside a node
// both are NVLink). The experts count 0 when each has its own ranks (ep = shard: nothing to gather).
double ep_shard_equivalent_params(double params, double routed, int64_t shard, int64_t ep);

// The all-to-alls of one decoder layer's MoE block in one direction of a micro-batch of `tokens` tokens: `calls` of
// `bytes` each (its dispatch and combine, and in backward the recomputed forward's under full checkpointing), from
// the layer's LayerCost (routed_params, dispatch_elems_per_token and ckpt); none in a dense layer or without ep.
struct EpAllToAlls {
  int calls = 0;
  double bytes = 0;  // per call: the rank's routed token copies of one block (tokens x k x hidden, compute dtype)
};
EpAllToAlls ep_layer_all_to_alls(const LayerCost& lc, bool backward, int64_t ep, double tokens, double bytes_per_elem);

}  // namespace fsdp
