#include "program/expert_parallel.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace fsdp {

bool routed_expert_linear(const ModuleNode& n) {
  if (n.kind != ModuleKind::Linear || n.in_features <= 0 || n.out_features <= 0) return false;
  const double whole = 2.0 * static_cast<double>(n.in_features) * static_cast<double>(n.out_features);
  return n.flops_per_token < whole;
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

EpAllToAlls ep_layer_all_to_alls(const LayerCost& lc, bool backward, int64_t ep, double tokens, double bytes_per_elem) {
  EpAllToAlls a;
  if (ep <= 1 || lc.dispatch_elems_per_token <= 0) return a;
  // Dispatch and combine; in backward their reverses, and the recomputed forward's under full checkpointing (the
  // per-op policy saves all_to_all_single's output).
  a.calls = backward && lc.ckpt == ActCkpt::Full ? 4 : 2;
  a.bytes = tokens * lc.dispatch_elems_per_token * bytes_per_elem;
  return a;
}

}  // namespace fsdp
