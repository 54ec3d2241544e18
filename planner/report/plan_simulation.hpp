#pragma once
// A plan file simulated again on the hardware and runtime it names: what `fsdp-plan show --html`,
// `simulate --plan`, `compare` and fsdp-run's closing table all need (the program, its prediction).
#include <memory>
#include <string>

#include "planfile/plan_file.hpp"
#include "report/trace_compare.hpp"
#include "simulate.hpp"

namespace fsdp {

struct PlanSimulation {
  HardwareProfile hardware;
  RuntimeProfile runtime;
  Cluster cluster;
  ModuleGraph graph;
  StepProgram program;
  Prediction prediction;
  explicit PlanSimulation(const ModelSpec& m) : graph(m) {}
  SimulationInput input(const PlanFile& plan) const { return {&graph, &hardware, &runtime, cluster, plan.strategy}; }
};

// InputError naming the profile or the strategy flag when the plan cannot be simulated.
std::unique_ptr<PlanSimulation> simulate_plan(const PlanFile& plan, const std::string& config_root);

// The program's step trace with its units' names (program/step_trace.hpp).
TraceSide program_side(const StepProgram& program);

}  // namespace fsdp
