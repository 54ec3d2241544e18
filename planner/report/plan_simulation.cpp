#include "report/plan_simulation.hpp"

#include "planfile/plan_keys.hpp"

namespace fsdp {

PlanFile plan_file_for(const ModelSpec& model, const HardwareProfile& hw, const Cluster& cluster,
                       const std::string& runtime, const Strategy& strategy) {
  PlanFile plan;
  plan.model_name = model.name;
  plan.model = model;
  plan.cluster.hardware = hw.name;
  plan.cluster.device = hw.device_kind;
  plan.cluster.nodes = cluster.nodes;
  plan.cluster.gpus_per_node = cluster.gpus_per_node;
  if (!hw.device_is_host() && cluster.nodes > 1) plan.cluster.network = network_summary(hw);
  plan.cluster.clocks = clock_summary(hw);
  plan.runtime = runtime;
  plan.strategy = strategy;
  return plan;
}

std::unique_ptr<PlanSimulation> simulate_plan(const PlanFile& plan, const std::string& root,
                                              const std::string& plan_path) {
  auto s = std::make_unique<PlanSimulation>(plan.model);
  s->hardware = load_hardware(plan.cluster.hardware, root);
  s->runtime = load_runtime(plan.runtime, root);
  validate_profiles(s->hardware, s->runtime);
  s->cluster = Cluster{plan.cluster.nodes, plan.cluster.gpus_per_node};
  const auto name_of = plan_path.empty()
                           ? std::function<std::string(const std::string&)>()
                           : [&](const std::string& flag) { return plan_path + ": " + plan_key_of_flag(flag); };
  validate_strategy(plan.strategy, plan.model, s->cluster, s->runtime.support, name_of);
  check_lora_targets(plan.strategy, s->graph, name_of);
  s->prediction = simulate(s->input(plan), &s->program);
  s->rank0_program = plan.strategy.mesh.pp > 1 ? emit_stage_program(s->input(plan), 0) : s->program;
  return s;
}

TraceSide program_side(const StepProgram& program) {
  TraceSide t{program_trace(program), {}};
  for (const WrapUnit& u : program.units) t.unit_names.push_back(u.name);
  return t;
}

}  // namespace fsdp
