// What the modules outside the decoder layers move in memory-bound kernels per micro-batch: the token embedding's
// lookup and its backward, learned positions, and the final norm (the head's GEMM and the loss are the step
// program's own: StepProgram::head_gemm and the Loss ops). The root unit's compute carries them.
#pragma once

#include "model/module_graph.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct RootModuleTraffic {
  double forward_bytes = 0;
  double backward_bytes = 0;
};

// `module` is a child of the graph's root; `tokens` the tokens of one micro-batch it runs on (a vision tower's own:
// ModuleGraph::token_ratio applied by the caller). Modules that are neither an embedding nor a norm move nothing here.
RootModuleTraffic root_module_traffic(const ModuleGraph& g, ModuleId module, const Strategy& s,
                                      const RuntimeProfile& rt, const ActivationQuery& q, double tokens);

}  // namespace fsdp
