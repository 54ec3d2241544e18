#include <fstream>
#include <iostream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/errors.hpp"
#include "planfile/plan_file.hpp"
#include "report/compare.hpp"
#include "report/html_report.hpp"
#include "report/prediction_view.hpp"
#include "simulate.hpp"

namespace fsdp {

int run_compare(const std::vector<std::string>& argv) {
  Args args(argv, {"--config-root", "--html"}, {"--json"});
  if (args.positional().size() != 2)
    throw InputError("compare: usage: fsdp-plan compare plan.yaml report.json [--json]");
  const std::string plan_path = args.positional()[0], report_path = args.positional()[1];
  PlanFile plan = read_plan_file(plan_path);
  PlanPrediction pred;
  if (plan.prediction) {
    pred = *plan.prediction;
  } else {
    // No prediction in the file: simulate it now.
    const std::string root = config_root_from(argv);
    HardwareProfile hw = load_hardware(plan.cluster.hardware, root);
    RuntimeProfile rt = load_runtime(plan.runtime, root);
    ModuleGraph g(plan.model);
    Cluster cluster{plan.cluster.nodes, plan.cluster.gpus_per_node};
    validate_strategy(plan.strategy, plan.model, cluster);
    pred = plan_prediction(simulate(SimulationInput{&g, &hw, &rt, cluster, plan.strategy}));
  }
  std::ifstream in(report_path);
  if (!in) throw InputError(report_path + ": cannot open report");
  nlohmann::json report;
  try {
    report = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(report_path + ": not valid JSON: " + e.what());
  }
  Comparison c = compare_plan_report(pred, plan.strategy, report, report_path);
  if (auto html = args.get("--html")) write_comparison_html(*html, plan, c, plan_path, report_path);
  if (args.has("--json")) {
    std::cout << comparison_json(c).dump(2) << "\n";
  } else {
    std::cout << "predicted (" << plan_path << ") vs measured (" << report_path << ")\n\n" << format_comparison(c);
  }
  return 0;
}

}  // namespace fsdp
