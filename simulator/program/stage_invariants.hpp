// What a step program's emission derives from the model, the strategy and the runtime alone, the same for every
// pipeline stage of one plan: the strategy's wrap units before a stage clips them to its layers, and the costs and
// shapes of each class of decoder layers. simulate() emits up to pp stage programs of one plan (simulate.cpp); these
// are derived once for all of them instead of once per stage, which is exact: Emitter::setup (step_program.cpp)
// computes them from the graph, the strategy, the runtime, the activation query and the micro-batch's tokens, none of
// which depends on ProgramInput::pipeline_stage, so every stage would compute the very same values.
#pragma once

#include <cstdint>
#include <vector>

#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/wrap_units.hpp"
#include "runtime/runtime_profile.hpp"

namespace fsdp {

struct StageInvariants {
  bool filled = false;  // set by the first emission that derives them
  // The inputs they were derived from, checked on every later use: a cache serves the stages of one plan only.
  const ModuleGraph* graph = nullptr;
  const RuntimeProfile* runtime = nullptr;
  std::vector<WrapUnit> units;           // strategy_units(graph, strategy)
  std::vector<LayerCost> class_costs;    // per (layer class, checkpointing mode), tensor-parallel shard applied
  std::vector<int32_t> layer_class;      // per decoder layer: its index into class_costs
  std::vector<LayerShape> layer_shapes;  // StepProgram::layer_shapes
  std::vector<int32_t> layer_shape_of;   // StepProgram::layer_shape_of
};

}  // namespace fsdp
