#include "program/wrap_units.hpp"

#include "core/errors.hpp"

namespace fsdp {

namespace {

WrapUnit layer_unit(const ModuleGraph& g, int64_t first, int64_t last) {
  WrapUnit u;
  u.first_layer = first;
  u.last_layer = last;
  // Named after the modules: "layers.3", "layers.0-3", "vision_tower.layers.5" (a vision block, module_graph.hpp).
  const std::string& first_name = g.node(g.layers()[static_cast<size_t>(first)]).name;
  const std::string& last_name = g.node(g.layers()[static_cast<size_t>(last)]).name;
  u.name = first == last ? first_name : first_name + "-" + last_name.substr(last_name.rfind('.') + 1);
  for (int64_t i = first; i <= last; ++i) {
    ModuleId id = g.layers()[static_cast<size_t>(i)];
    u.modules.push_back(id);
    u.params += g.params_under(id);
  }
  return u;
}

}  // namespace

std::vector<WrapUnit> build_wrap_units(const ModuleGraph& g, const WrapPolicy& policy) {
  const int64_t L = static_cast<int64_t>(g.layers().size());
  std::vector<WrapUnit> layer_units;
  switch (policy.kind) {
    case WrapKind::Layer:
      for (int64_t i = 0; i < L; ++i) layer_units.push_back(layer_unit(g, i, i));
      break;
    case WrapKind::EveryK:
      FSDP_ASSERT(policy.every_k > 0, "every:K needs K > 0");
      for (int64_t i = 0; i < L; i += policy.every_k)
        layer_units.push_back(layer_unit(g, i, std::min(L, i + policy.every_k) - 1));
      break;
    case WrapKind::Size: {
      // Post-order recursion of size_based_auto_wrap_policy: each decoder layer whose parameters reach
      // min_params becomes a unit; otherwise the layers stay unwrapped and the stack itself is wrapped if
      // the remaining parameters reach min_params; what is left goes to the root.
      int64_t unwrapped = 0;
      std::vector<int64_t> loose;
      for (int64_t i = 0; i < L; ++i) {
        int64_t p = g.params_under(g.layers()[static_cast<size_t>(i)]);
        if (p >= policy.min_params) {
          layer_units.push_back(layer_unit(g, i, i));
        } else {
          unwrapped += p;
          loose.push_back(i);
        }
      }
      if (!loose.empty() && unwrapped >= policy.min_params && loose.size() == static_cast<size_t>(L)) {
        WrapUnit stack = layer_unit(g, 0, L - 1);
        stack.name = "layers";
        layer_units.push_back(stack);
        loose.clear();
      }
      if (!loose.empty() && !layer_units.empty()) {
        // Mixed: some layers wrapped, the small ones fall to the root (FSDP semantics). Only possible with
        // heterogeneous layers; our layers are uniform, so this is unreachable for zoo models.
        throw InputError("--wrap size:" + std::to_string(policy.min_params) +
                         ": some layers reach it and some do not (a vision tower's blocks are smaller than the "
                         "decoder layers); size-based wrapping of such a stack is not modelled: wrap by layer or "
                         "every:K");
      }
      break;
    }
    case WrapKind::Model:
      break;
  }
  WrapUnit root;
  root.name = "root";
  root.is_root = true;
  int64_t in_layers = 0;
  for (const auto& u : layer_units) in_layers += u.params;
  root.params = g.total_params() - in_layers;
  root.modules.push_back(g.root());
  if (policy.kind == WrapKind::Model || layer_units.empty()) {
    root.first_layer = 0;
    root.last_layer = L - 1;
  }
  std::vector<WrapUnit> out;
  out.push_back(root);
  for (auto& u : layer_units) out.push_back(std::move(u));
  return out;
}

WrapPolicy strategy_wrap_policy(const Strategy& s) {
  return shards_params(s.kind) ? s.wrap : WrapPolicy{WrapKind::Layer, 1, 0};
}

std::vector<WrapUnit> strategy_units(const ModuleGraph& g, const Strategy& s) {
  return build_wrap_units(g, strategy_wrap_policy(s));
}

}  // namespace fsdp
