// Where a data-parallel strategy keeps a wrap unit's state and how it reduces the unit's gradients: one table
// (unit_placement), read by the step program (simulator/program/step_program.cpp) and by fsdp-run's
// ShardedModel (executor/shard/sharded_model.cpp), per unit. Sources per strategy:
//   DDP: torch/nn/parallel/distributed.py (replicas; bucket_cap_mb buckets all-reduced as backward fills them);
//   NO_SHARD, FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD: torch/distributed/fsdp/api.py ShardingStrategy;
//   ZeRO-1/2/3: Rajbhandari et al. 2020 (arXiv:1910.02054) sec. 5, partitioning P_os, P_os+g, P_os+g+p.
#pragma once

#include <cstdint>
#include <vector>

#include "program/op_kinds.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

enum class GradReduction : uint8_t {
  AllReducePerUnit,  // each unit's full gradient all-reduced when its backward ends (FSDP NO_SHARD)
  AllReduceBuckets,  // full gradients all-reduced in buckets of ddp_bucket_mb, in backward order (DDP, ZeRO-1)
  ReduceScatter,     // each unit's gradient reduce-scattered into this rank's shard, every micro-batch (ZeRO-2+)
};
const char* to_string(GradReduction);

struct UnitPlacement {
  bool params_sharded = false;  // master parameters: one shard per rank of the shard group (else a replica)
  bool grads_sharded = false;   // gradients kept as a shard (else the full gradient on every rank)
  bool optim_sharded = false;   // optimizer states of a shard only
  // The unit's gathered parameters are freed after its forward and gathered again in backward. Never for
  // replicas, nor SHARD_GRAD_OP, nor with reshard_after_forward off; the root unit only where the runtime
  // reshards it (FSDP2 fully_shard leaves the root unsharded: runtime profile root_reshard_after_forward).
  bool reshard_after_forward = false;
  GradReduction reduction = GradReduction::AllReduceBuckets;
  // The group the gradient reduction spans: the shard group for the FSDP family (an HSDP shard group, else the
  // world), the world for replicas and ZeRO-1/2 (whose partitions span every data-parallel rank).
  GroupKind reduce_group = GroupKind::World;
  bool replica_all_reduce = false;  // HSDP: the reduced shard then all-reduced across the replica groups
  bool master_on_host = false;      // optimizer or parameter offload: master shard and optimizer states on the host
  bool params_on_host = false;      // parameter offload: no device copy; the shard is copied in before each gather
};

// The placement of a unit (`root`: the unit holding the embedding and head) of strategy `s` under a runtime that
// does (or not) reshard its root after forward.
UnitPlacement unit_placement(const Strategy& s, bool root, bool root_reshard_after_forward);

// The reshard_after_forward values that mean something for a kind, as the planner's search enumerates them: both
// where a unit's gathered parameters may be freed after its forward (FULL_SHARD, ZeRO-3, HSDP), off alone for
// SHARD_GRAD_OP (its parameters stay gathered from forward to backward: torch/distributed/fsdp/api.py
// ShardingStrategy), the default alone for replicas (nothing to reshard).
std::vector<bool> reshard_choices(StrategyKind);
// Whether the kind takes a shard-group size (Strategy::hsdp_group): HSDP alone, sharded within groups and
// replicated across them (torch/distributed/fsdp/api.py HYBRID_SHARD; UnitPlacement::replica_all_reduce).
bool uses_shard_groups(StrategyKind);

}  // namespace fsdp
