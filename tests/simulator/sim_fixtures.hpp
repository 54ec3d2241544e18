// Shared helpers for simulator tests: load zoo models, runtimes and hardware from the source tree.
#pragma once

#include <string>

#include "memory/memory_walk.hpp"
#include "model/model_loader.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"

namespace fsdp::test {

inline const std::string& root() {
  static const std::string r = FSDP_SOURCE_ROOT;
  return r;
}

inline ModelSpec zoo(const std::string& name) { return load_model(name, root()); }
inline RuntimeProfile runtime(const std::string& name) { return load_runtime(name, root()); }
inline HardwareProfile hardware(const std::string& name) { return load_hardware(name, root()); }

inline StepProgram program(const ModuleGraph& g, const Strategy& s, const RuntimeProfile& rt, int64_t nodes,
                           int64_t gpus_per_node) {
  ProgramInput in;
  in.graph = &g;
  in.cluster = Cluster{nodes, gpus_per_node};
  in.strategy = s;
  in.runtime = &rt;
  return emit_step_program(in);
}

inline double cat(const MemoryBreakdown& b, MemoryCategory c) { return b[static_cast<size_t>(c)]; }

}  // namespace fsdp::test
