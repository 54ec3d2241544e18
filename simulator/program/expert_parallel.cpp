#include "program/expert_parallel.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace fsdp {

bool routed_expert_linear(const ModuleNode& n) {
  if (n.kind != ModuleKind::Linear || n.in_features <= 0 || n.out_features <= 0) return false;
  const double whole = 2.0 * static_cast<double>(n.in_features) * static_cast<double>(n.out_features);
  return n.flops_per_token < whole;
}

double routed_expert_params(const ModuleGraph& g, ModuleId layer) {
  double p = 0;
  for (ModuleId leaf : g.leaves_under(layer))
    if (routed_expert_linear(g.node(leaf))) p += static_cast<double>(g.node(leaf).params);
  return p;
}

double ep_dispatch_elems_per_token(const ModuleGraph& g, ModuleId layer) {
  // Each routed expert (an Mlp named "expert" under the layer's Moe container, module_graph.cpp) reads one dispatched
  // row per token copy it receives, hidden wide: its first linear's input, k / E of the tokens.
  double elems = 0;
  for (ModuleId c : g.children(layer)) {
    if (g.node(c).kind != ModuleKind::Moe) continue;
    for (ModuleId e : g.children(c)) {
      const ModuleNode& expert = g.node(e);
      if (expert.kind != ModuleKind::Mlp || expert.short_name != "expert") continue;
      for (ModuleId leaf : g.leaves_under(e)) {
        const ModuleNode& n = g.node(leaf);
        if (!routed_expert_linear(n)) continue;
        elems += n.flops_per_token / (2.0 * static_cast<double>(n.out_features));
        break;
      }
    }
  }
  return elems;
}

void shard_layer_for_ep(LayerCost& lc, int64_t ep) {
  if (ep <= 1) return;
  size_t routed = 0;
  for (const GemmShape& gs : lc.shape.gemms) routed += gs.routed ? 1 : 0;
  FSDP_ASSERT(routed % static_cast<size_t>(ep) == 0, "ep divides the routed experts (rule ExpertParallel)");
  const size_t kept = routed / static_cast<size_t>(ep);
  std::vector<GemmShape> gemms;
  gemms.reserve(lc.shape.gemms.size() - routed + kept);
  size_t seen = 0;
  for (GemmShape gs : lc.shape.gemms) {
    if (gs.routed) {
      if (seen++ >= kept) continue;
      gs.weight *= static_cast<double>(ep);
    }
    gemms.push_back(gs);
  }
  lc.shape.gemms = std::move(gemms);
}

double ep_unsharded_params(double params, double routed, int64_t ep) {
  return params - routed + routed / static_cast<double>(std::max<int64_t>(1, ep));
}

double ep_shard_equivalent_params(double params, double routed, int64_t shard, int64_t ep) {
  if (ep <= 1) return params;
  const double m = static_cast<double>(shard / ep), n = static_cast<double>(shard);
  const double experts = m <= 1 || n <= 1 ? 0.0 : routed / static_cast<double>(ep) * ((m - 1.0) / m) / ((n - 1.0) / n);
  return params - routed + experts;
}

EpAllToAlls ep_unit_all_to_alls(const ModuleGraph& g, int64_t first_layer, int64_t last_layer, bool backward,
                                const Strategy& s, double tokens, double bytes_per_elem) {
  EpAllToAlls a;
  if (s.mesh.ep <= 1 || first_layer < 0) return a;
  double bytes = 0;
  for (int64_t l = first_layer; l <= last_layer; ++l) {
    const double per_block =
        tokens * ep_dispatch_elems_per_token(g, g.layers()[static_cast<size_t>(l)]) * bytes_per_elem;
    if (per_block <= 0) continue;
    // Dispatch and combine; in backward their reverses, and the recomputed forward's under full checkpointing (the
    // per-op policy saves all_to_all_single's output).
    const int calls = backward ? (layer_ckpt(s, l) == ActCkpt::Full ? 4 : 2) : 2;
    a.calls += calls;
    bytes += calls * per_block;
  }
  if (a.calls > 0) a.bytes = bytes / a.calls;
  return a;
}

}  // namespace fsdp
