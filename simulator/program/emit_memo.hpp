// What emit_step_program derives from the model, the runtime and a few of the strategy's fields, kept for the
// programs of many plans: the stages of one plan (simulate.cpp emits up to pp of them) and the plans of one search
// (plan_search.cpp simulates thousands, which share these derivations by the hundred). Two derivations:
//  - the strategy's wrap units (wrap_units.hpp strategy_units): build_wrap_units(graph, policy), a function of the
//    graph and the policy alone (strategy_wrap_policy), keyed by the policy;
//  - the costs and shapes of each class of decoder layers (emit_setup.cpp Emitter::setup): per layer, its cost
//    class (graph class, checkpointing mode) and the class's layer_cost, tensor-parallel shard applied, and the shape
//    class. They read (layer_costs.cpp layer_cost; tensor_parallel.cpp shard_layer_for_tp; expert_parallel.cpp
//    shard_layer_for_ep; strategy.cpp
//    layer_ckpt) the graph, the runtime, the activation query, the micro-batch's tokens (micro_batch x seq_len), and
//    of the strategy seq_len, micro_batch, param_dtype, method, lora (rank and target modules), act_ckpt,
//    ckpt_every, ckpt_fraction, float8, train_vision, kernels, and mesh.tp, mesh.sequence_parallel and mesh.ep; CostKey
//    holds all of them but the graph and runtime, which are bound once (the first emission's, asserted on every later
//    one).
// Exact: an entry is the value the derivation computes from its key's inputs, and a hit is an emission whose inputs
// equal the key, so it computes the very same values (bit for bit) that the memo returns.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/wrap_units.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

class EmitMemo {
 public:
  // Every input of the layer-class derivation but the graph and runtime (above).
  using CostKey = std::tuple<DType, AttentionImpl, int64_t, bool, bool, bool, bool, bool, bool, bool, bool, bool, bool,
                             bool,  // query
                             int64_t, int64_t, DType, Method, int64_t, std::vector<std::string>, ActCkpt, int64_t,
                             double, int64_t, bool, Float8Recipe, VisionTraining, int64_t, KernelLibrary>;
  static CostKey cost_key(const ActivationQuery& q, const Strategy& s);

  struct LayerClasses {
    std::vector<LayerCost> class_costs;    // per (layer class, checkpointing mode), tensor-parallel shard applied
    std::vector<int32_t> layer_class;      // per decoder layer: its index into class_costs
    std::vector<LayerShape> layer_shapes;  // StepProgram::layer_shapes
    std::vector<int32_t> layer_shape_of;   // StepProgram::layer_shape_of
  };

  // Binds the memo to the graph and runtime of its first emission; asserts later ones are the same.
  void bind(const ModuleGraph& g, const RuntimeProfile& rt);
  // strategy_units(g, s), derived once per wrap policy; the reference stays valid while the memo lives.
  const std::vector<WrapUnit>& strategy_units(const ModuleGraph& g, const Strategy& s);
  // The entry of `key`, or null.
  const LayerClasses* find(const CostKey& key) const;
  void store(CostKey key, LayerClasses classes);

 private:
  const ModuleGraph* graph_ = nullptr;
  const RuntimeProfile* runtime_ = nullptr;
  std::map<std::tuple<WrapKind, int64_t, int64_t>, std::vector<WrapUnit>> units_;  // by policy (stable references)
  std::map<CostKey, LayerClasses> classes_;
};

}  // namespace fsdp
