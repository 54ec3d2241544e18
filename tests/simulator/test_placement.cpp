// strategy/placement.hpp: the table the step program and fsdp-run's ShardedModel both read, strategy by
// strategy (golden rows from the sources the header cites), and the root's reshard rule.
#include <doctest/doctest.h>

#include <tuple>
#include <vector>

#include "strategy/placement.hpp"

using namespace fsdp;

TEST_CASE("placement: each strategy's shards, reduction and groups") {
  using R = GradReduction;
  using G = GroupKind;
  // kind, params / grads / optimizer sharded, reduction, reduce group, replica all-reduce, reshard after forward
  const std::tuple<StrategyKind, bool, bool, bool, R, G, bool, bool> rows[] = {
      {StrategyKind::NoShard, false, false, false, R::AllReducePerUnit, G::World, false, false},
      {StrategyKind::Ddp, false, false, false, R::AllReduceBuckets, G::World, false, false},
      {StrategyKind::Zero1, false, false, true, R::AllReduceBuckets, G::World, false, false},
      {StrategyKind::Zero2, false, true, true, R::ReduceScatter, G::World, false, false},
      {StrategyKind::Zero3, true, true, true, R::ReduceScatter, G::Shard, false, true},
      {StrategyKind::Fsdp, true, true, true, R::ReduceScatter, G::Shard, false, true},
      {StrategyKind::FsdpGradOp, true, true, true, R::ReduceScatter, G::Shard, false, false},
      {StrategyKind::Hsdp, true, true, true, R::ReduceScatter, G::Shard, true, true},
  };
  for (const auto& [kind, params, grads, optim, reduction, group, replica, reshard] : rows) {
    Strategy s;
    s.kind = kind;
    const UnitPlacement p = unit_placement(s, /*root=*/false, /*root_reshard_after_forward=*/false);
    INFO(to_string(kind));
    CHECK(p.params_sharded == params);
    CHECK(p.grads_sharded == grads);
    CHECK(p.optim_sharded == optim);
    CHECK(p.reduction == reduction);
    CHECK(p.reduce_group == group);
    CHECK(p.replica_all_reduce == replica);
    CHECK(p.reshard_after_forward == reshard);
    CHECK_FALSE(p.master_on_host);
  }
}

TEST_CASE("placement: the root reshards only where the runtime does; reshard_after_forward off keeps every unit") {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  CHECK_FALSE(unit_placement(s, /*root=*/true, false).reshard_after_forward);
  CHECK(unit_placement(s, /*root=*/true, true).reshard_after_forward);
  s.reshard_after_forward = false;
  CHECK_FALSE(unit_placement(s, false, true).reshard_after_forward);
  CHECK_FALSE(unit_placement(s, true, true).reshard_after_forward);
}

TEST_CASE("placement: offload puts the master on the host, parameter offload the parameters too") {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.offload = Offload::Optimizer;
  UnitPlacement p = unit_placement(s, false, false);
  CHECK(p.master_on_host);
  CHECK_FALSE(p.params_on_host);
  s.offload = Offload::Params;
  p = unit_placement(s, false, false);
  CHECK(p.master_on_host);
  CHECK(p.params_on_host);
  CHECK(std::string(to_string(GradReduction::ReduceScatter)) == "reduce-scatter");
}

TEST_CASE("placement: the reshard choices and shard groups the search enumerates per kind") {
  using V = std::vector<bool>;
  CHECK(reshard_choices(StrategyKind::Fsdp) == V{true, false});
  CHECK(reshard_choices(StrategyKind::Zero3) == V{true, false});
  CHECK(reshard_choices(StrategyKind::Hsdp) == V{true, false});
  CHECK(reshard_choices(StrategyKind::FsdpGradOp) == V{false});
  for (StrategyKind k : {StrategyKind::Ddp, StrategyKind::NoShard, StrategyKind::Zero1, StrategyKind::Zero2})
    CHECK(reshard_choices(k) == V{true});
  CHECK(uses_shard_groups(StrategyKind::Hsdp));
  CHECK_FALSE(uses_shard_groups(StrategyKind::Fsdp));
}
