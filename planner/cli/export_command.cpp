// fsdp-plan export plan.yaml --to TARGET [--target-version V] [--out DIR]: the plan's files for a framework, or a
// refusal naming every knob it cannot express and the nearest plan it can run (planner/export/export_plan.hpp).
#include <filesystem>
#include <iostream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/errors.hpp"
#include "export/export_plan.hpp"
#include "export/target_table.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"

namespace fsdp {

int run_export(const std::vector<std::string>& argv) {
  Args args(argv, {"--to", "--target-version", "--out", "--config-root"}, {"--help"});
  if (args.has("--help")) {
    std::cout << "usage: fsdp-plan export plan.yaml --to TARGET [--target-version V] [--out DIR]\n"
                 "  TARGET: fsdp-run, torchtitan, deepspeed, accelerate, swift, torchtune (configs/targets/)\n"
                 "  writes the target's config files and launch.sh into DIR (default: the plan's directory)\n";
    return 0;
  }
  if (args.positional().size() != 1) throw InputError("export: usage: fsdp-plan export plan.yaml --to TARGET");
  auto to = args.get("--to");
  if (!to) throw InputError("--to: required (a target: fsdp-run, torchtitan, deepspeed, accelerate, swift, torchtune)");
  const std::string root = config_root_from(argv);
  const std::string plan_path = args.positional()[0];
  PlanFile plan = read_plan_file(plan_path);
  check_trained_length(plan, plan_path);
  const TargetSpec spec = load_target_spec(root, *to, args.get_or("--target-version", "")).for_model(plan.model_name);
  const ExportResult r = export_plan(plan, spec, root);
  std::string dir = args.get_or("--out", std::filesystem::path(plan_path).parent_path().string());
  if (dir.empty()) dir = ".";
  const auto written = write_export(r, spec, dir);
  // The prediction on the target's runtime: what the plan costs as the target runs it.
  PlanFile on_target = plan;
  on_target.runtime = spec.runtime;
  auto sim = simulate_plan(on_target, root);
  const Prediction& p = sim->prediction;
  std::cout << "plan " << plan_path << " for " << spec.writes_for << "\n  " << one_line_strategy(plan.strategy)
            << "\n  predicted with runtime " << spec.runtime << ": " << format_gib(p.memory.device_total)
            << " GiB per GPU, " << static_cast<long long>(p.tokens_per_s_per_gpu + 0.5) << " tokens/s/GPU"
            << (p.fits ? "" : " (does not fit)") << "\nwrote";
  for (const auto& w : written) std::cout << " " << w;
  std::cout << "\n";
  for (const auto& n : r.notes) std::cout << "  note: " << n << "\n";
  std::cout << "launch: " << r.launch_command << "\n";
  return 0;
}

int run_list_targets(const std::vector<std::string>& argv) {
  Args args(argv, {"--config-root"}, {"--list-targets"});
  if (!args.positional().empty())
    throw InputError("--list-targets: unexpected argument '" + args.positional()[0] + "'");
  std::cout << targets_markdown(config_root_from(argv));
  return 0;
}

}  // namespace fsdp
