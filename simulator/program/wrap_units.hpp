// FSDP wrap units: which modules' parameters are flattened, sharded and gathered together.
// The root unit always exists and holds what no other unit claims (embeddings, final norm, head),
// like fully_shard(model) applied last in PyTorch FSDP2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/module_graph.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct WrapUnit {
  std::string name;  // "root", "layers.3", "layers.0-1", "layers"
  bool is_root = false;
  int64_t first_layer = -1;  // decoder layers [first_layer, last_layer] (inclusive), -1 for root
  int64_t last_layer = -1;
  int64_t params = 0;
  std::vector<ModuleId> modules;  // top modules of the unit
  int64_t num_layers() const { return first_layer < 0 ? 0 : last_layer - first_layer + 1; }
};

// Units in forward execution order of their first use: root first (it holds the embedding), then the
// layer units. Size-based wrapping follows torch.distributed.fsdp.wrap.size_based_auto_wrap_policy's
// recursion (wrap a module when its not-yet-wrapped parameters reach min_num_params) at decoder-layer
// granularity: the smallest unit this simulator forms is one decoder layer.
std::vector<WrapUnit> build_wrap_units(const ModuleGraph& graph, const WrapPolicy& policy);

// The units a strategy computes and reduces by: its wrap policy when it shards parameters; one decoder layer
// per unit for the replicated strategies (DDP, no-shard, ZeRO-1/2), whose gradients are bucketed or
// reduced layer by layer whatever the plan's wrap says. The step program and fsdp-run both build these.
std::vector<WrapUnit> strategy_units(const ModuleGraph& graph, const Strategy& strategy);
// The policy strategy_units builds by: build_wrap_units(graph, strategy_wrap_policy(strategy)).
WrapPolicy strategy_wrap_policy(const Strategy& strategy);

}  // namespace fsdp
