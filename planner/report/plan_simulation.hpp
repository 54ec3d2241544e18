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
  // Rank 0's program (the first pipeline stage's; `program` itself without pp): the step fsdp-run records in its
  // report (executor/io/report.cpp step_trace), which `compare` and fsdp-run's closing table check it against.
  StepProgram rank0_program;
  Prediction prediction;
  explicit PlanSimulation(const ModelSpec& m) : graph(m) {}
  SimulationInput input(const PlanFile& plan) const { return {&graph, &hardware, &runtime, cluster, plan.strategy}; }
};

// The plan file of a strategy on a model, hardware profile and cluster, predicted with `runtime`, without a
// prediction or commands yet: what fsdp-plan writes (it adds those) and what export reads.
PlanFile plan_file_for(const ModelSpec& model, const HardwareProfile& hw, const Cluster& cluster,
                       const std::string& runtime, const Strategy& strategy);

// InputError naming the profile or the strategy flag when the plan cannot be simulated; with `plan_path` (a plan read
// from that file), the file and its key instead of the flag ("plan.yaml: strategy.tp: ...").
std::unique_ptr<PlanSimulation> simulate_plan(const PlanFile& plan, const std::string& config_root,
                                              const std::string& plan_path = "");

// The program's step trace with its units' names (program/step_trace.hpp).
TraceSide program_side(const StepProgram& program);

}  // namespace fsdp
