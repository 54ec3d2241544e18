#include "strategy/placement.hpp"

namespace fsdp {

const char* to_string(GradReduction r) {
  switch (r) {
    case GradReduction::AllReducePerUnit:
      return "all-reduce per unit";
    case GradReduction::AllReduceBuckets:
      return "all-reduce in buckets";
    case GradReduction::ReduceScatter:
      return "reduce-scatter";
  }
  return "?";
}

std::vector<bool> reshard_choices(StrategyKind k) {
  if (k == StrategyKind::FsdpGradOp) return {false};
  if (shards_params(k)) return {true, false};
  return {true};
}

bool uses_shard_groups(StrategyKind k) { return k == StrategyKind::Hsdp; }

UnitPlacement unit_placement(const Strategy& s, bool root, bool root_reshard_after_forward) {
  UnitPlacement p;
  p.params_sharded = shards_params(s.kind);
  p.grads_sharded = shards_grads(s.kind);
  p.optim_sharded = shards_optimizer(s.kind);
  p.reshard_after_forward = p.params_sharded && s.kind != StrategyKind::FsdpGradOp && s.reshard_after_forward &&
                            (!root || root_reshard_after_forward);
  p.reduction = p.grads_sharded                   ? GradReduction::ReduceScatter
                : s.kind == StrategyKind::NoShard ? GradReduction::AllReducePerUnit
                                                  : GradReduction::AllReduceBuckets;
  p.reduce_group = p.params_sharded ? GroupKind::Shard : GroupKind::World;
  p.replica_all_reduce = uses_shard_groups(s.kind);
  p.master_on_host = s.offload != Offload::None;
  p.params_on_host = s.offload == Offload::Params;
  return p;
}

}  // namespace fsdp
