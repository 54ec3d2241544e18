// The planner's search space counted from its description, not from the search code: README "Planner
// defaults" ("strategy x wrap (layer, every:2, every:4, model) x reshard-after-forward x activation
// checkpointing (none, selective, full) x offload (none, optimizer, params) x (param, reduce) dtypes (bf16/fp32,
// bf16/bf16, fp32/fp32) x micro-batch (powers of two ...) x HSDP group size (node-aligned)"), with the rules
// that say which knob applies to which strategy:
//  - wrapping decides which parameters are gathered together, so it is a knob of the strategies that shard
//    parameters (zero3, fsdp, fsdp-grad-op, hsdp); every:K is a distinct grouping only while K < layers;
//  - reshard-after-forward is free for fsdp, zero3 and hsdp (FULL_SHARD / HYBRID_SHARD vs keeping them);
//    fsdp-grad-op is SHARD_GRAD_OP, never resharded; the replicated strategies have no such choice;
//  - offload: none for ddp and no-shard (they keep everything on the GPU), the optimizer for any ZeRO stage,
//    parameters only where they are sharded (validate_strategy's rules, README "Strategies");
//  - HSDP shard groups are node-aligned (the GPUs of a node times a power of two), divide the world and are
//    smaller than it (a whole-world group is plain FSDP);
//  - micro-batches are the powers of two up to SearchRequest::max_micro_batch.
// Every point of the space is either evaluated or pruned, so evaluated + pruned must equal this count.
#pragma once

#include <cstdint>
#include <vector>

#include "search/plan_search.hpp"

namespace fsdp::test {

inline bool shards_parameters(StrategyKind k) {
  return k == StrategyKind::Zero3 || k == StrategyKind::Fsdp || k == StrategyKind::FsdpGradOp ||
         k == StrategyKind::Hsdp;
}

inline const std::vector<StrategyKind>& all_strategy_kinds() {
  static const std::vector<StrategyKind> k{StrategyKind::Ddp,        StrategyKind::NoShard, StrategyKind::Zero1,
                                           StrategyKind::Zero2,      StrategyKind::Fsdp,    StrategyKind::Zero3,
                                           StrategyKind::FsdpGradOp, StrategyKind::Hsdp};
  return k;
}

inline int64_t search_space_size(int64_t num_layers, const Cluster& c, const SearchPins& pins,
                                 int64_t max_micro_batch) {
  const int64_t world = c.world_size();
  int64_t ckpts = pins.act_ckpt ? 1 : 3;
  int64_t dtypes = 0;  // (bf16, fp32), (bf16, bf16), (fp32, fp32), filtered by the pins
  for (auto [p, r] :
       {std::pair{DType::Bf16, DType::Fp32}, std::pair{DType::Bf16, DType::Bf16}, std::pair{DType::Fp32, DType::Fp32}})
    if ((!pins.param_dtype || *pins.param_dtype == p) && (!pins.reduce_dtype || *pins.reduce_dtype == r)) ++dtypes;
  if (dtypes == 0 && pins.param_dtype && pins.reduce_dtype) dtypes = 1;  // an explicit pair outside the list
  int64_t micro_batches = 0;
  if (pins.micro_batch) {
    micro_batches = 1;
  } else {
    for (int64_t b = 1; b <= max_micro_batch; b *= 2) ++micro_batches;
  }
  int64_t wraps_sharded = 2;  // layer, model
  for (int64_t k : {2, 4})
    if (k < num_layers) ++wraps_sharded;
  if (pins.wrap) wraps_sharded = 1;

  int64_t total = 0;
  for (StrategyKind k : all_strategy_kinds()) {
    if (pins.strategy && *pins.strategy != k) continue;
    const bool sharded = shards_parameters(k);
    int64_t groups = 1;
    if (k == StrategyKind::Hsdp) {
      groups = 0;
      if (pins.hsdp_group) {
        groups = 1;
      } else {
        for (int64_t g = c.gpus_per_node; g < world; g *= 2)
          if (world % g == 0) ++groups;
      }
    }
    const int64_t wraps = sharded ? wraps_sharded : 1;
    int64_t reshards = (k == StrategyKind::Fsdp || k == StrategyKind::Zero3 || k == StrategyKind::Hsdp) ? 2 : 1;
    if (pins.reshard_after_forward) reshards = 1;
    int64_t offloads = 0;
    for (Offload o : {Offload::None, Offload::Optimizer, Offload::Params}) {
      if (pins.offload && *pins.offload != o) continue;
      if (o != Offload::None && (k == StrategyKind::Ddp || k == StrategyKind::NoShard)) continue;
      if (o == Offload::Params && !sharded) continue;
      ++offloads;
    }
    total += groups * wraps * reshards * ckpts * offloads * dtypes * micro_batches;
  }
  return total;
}

}  // namespace fsdp::test
