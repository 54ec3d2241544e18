#include <fstream>
#include <iostream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/errors.hpp"
#include "planfile/plan_file.hpp"
#include "report/compare.hpp"
#include "report/html_report.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"
#include "simulate.hpp"

namespace fsdp {

int run_compare(const std::vector<std::string>& argv) {
  Args args(argv, {"--config-root", "--html"}, {"--json", "--help"});
  if (args.has("--help")) {
    std::cout << "usage: fsdp-plan compare plan.yaml report.json [--json] [--html FILE]\n"
                 "  sets the plan's prediction beside the run fsdp-run reported (fsdp-run plan.yaml --report FILE):\n"
                 "  memory by category, step time, collectives; --html draws both\n";
    return 0;
  }
  if (args.positional().size() != 2)
    throw InputError("compare: usage: fsdp-plan compare plan.yaml report.json [--json] [--html FILE]");
  const std::string plan_path = args.positional()[0], report_path = args.positional()[1];
  PlanFile plan = read_plan_file(plan_path);
  // The plan's step program, simulated now (the collective comparison needs its ops); the prediction is the
  // plan file's where it has one.
  auto sim = simulate_plan(plan, config_root_from(argv), plan_path);
  check_trained_length(plan, plan_path);
  PlanPrediction pred = plan.prediction ? *plan.prediction : plan_prediction(sim->prediction);
  std::ifstream in(report_path);
  if (!in) throw InputError(report_path + ": cannot open report");
  nlohmann::json report;
  try {
    report = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(report_path + ": not valid JSON: " + e.what());
  }
  // The attention the run executed, where the report says and it differs from the plan's (fsdp-run on a LibTorch
  // without fused attention runs eager; executor/io/report.cpp plan.attention): compared with the plan re-simulated
  // with it, as fsdp-run's own table is.
  if (const auto a = report.find("plan"); a != report.end() && a->contains("attention")) {
    AttentionImpl ran{};
    const std::string name = (*a)["attention"].is_string() ? (*a)["attention"].get<std::string>() : "";
    if (!parse_attention(name, ran))
      throw InputError(report_path + ": plan.attention: '" + name + "' is not an attention implementation");
    if (ran != plan.strategy.attention) {
      std::cerr << "compare: the run executed " << name << " attention (" << report_path
                << " plan.attention), the plan " << to_string(plan.strategy.attention)
                << ": compared with the plan re-simulated with " << name << "\n";
      plan.strategy.attention = ran;
      sim = simulate_plan(plan, config_root_from(argv), plan_path);
      pred = plan_prediction(sim->prediction);
    }
  }
  Comparison c = compare_plan_report(pred, plan.strategy, program_side(sim->rank0_program), report, report_path);
  if (auto html = args.get("--html")) write_comparison_html(*html, plan, c, plan_path, report_path);
  if (args.has("--json")) {
    std::cout << comparison_json(c).dump(2) << "\n";
  } else {
    std::cout << "predicted (" << plan_path << ") vs measured (" << report_path << ")\n\n" << format_comparison(c);
  }
  return 0;
}

}  // namespace fsdp
