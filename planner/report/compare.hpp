#pragma once
// Predicted against measured: a plan's prediction (plan.yaml, or re-simulated) beside an fsdp-run
// report, category by category, with the error of each and of the total.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planfile/plan_file.hpp"
#include "report/trace_compare.hpp"

namespace fsdp {

struct ComparisonRow {
  std::string name;  // memory category, "peak allocated", "step time", ...
  std::string unit;  // "bytes" or "s" or "tokens/s"
  double predicted = 0;
  double measured = 0;
  bool has_measured = true;
  double error() const { return measured != 0 ? (predicted - measured) / measured : 0.0; }
};

struct Comparison {
  std::vector<ComparisonRow> memory;  // categories, then the peak
  std::vector<ComparisonRow> time;    // step time (median over steps after the first), tokens/s/GPU
  TraceComparison collectives;        // the step program beside the run's recorded step
};

// `report` is fsdp-run's --report JSON; InputError naming the file when it is not one.
// `program` is the plan's step program as program_trace gives it, with its units' names.
Comparison compare_plan_report(const PlanPrediction& predicted, const Strategy& s, const TraceSide& program,
                               const nlohmann::json& report, const std::string& report_path);
std::string format_comparison(const Comparison& c);
nlohmann::json comparison_json(const Comparison& c);

}  // namespace fsdp
