// The planner's HTML report (`fsdp-plan ... --html FILE`, `fsdp-plan show plan.yaml --html FILE`): one
// self-contained page (inline CSS and SVG drawn here, no scripts, no network; a Content-Security-Policy
// forbids loading anything) with the chosen plan and cluster, a stacked bar chart of per-GPU memory by
// category, the chosen plan's step timeline (the same StepProgram and op timings as --trace), a scatter
// of every evaluated candidate, and the per-family verdicts. Another view of the same plain data as the
// text and JSON reports.
#pragma once

#include <string>
#include <vector>

#include "planfile/plan_file.hpp"
#include "report/compare.hpp"
#include "search/plan_search.hpp"

namespace fsdp {

struct HtmlReportInput {
  const ModelSpec* model = nullptr;
  const HardwareProfile* hardware = nullptr;
  const RuntimeProfile* runtime = nullptr;
  Cluster cluster;
  std::string objective;  // "throughput", "memory" or "cost"; empty when there was no search
  double global_batch_tokens = 0;
  int top_n = 5;  // bars in the memory chart and rows in the top-plans table
  // The search, or null for a single plan (`show`): then no ranking, scatter or verdicts are drawn.
  const SearchResult* search = nullptr;
  // The chosen plan re-simulated with its program: Prediction::memory.samples and time.ops filled
  // (the search drops them). Null when no plan fits.
  const Strategy* chosen = nullptr;
  const Prediction* prediction = nullptr;
  const StepProgram* program = nullptr;
  // A second bar next to the chosen plan, e.g. the prediction recorded in plan.yaml (by category name).
  std::string recorded_label;
  std::vector<std::pair<std::string, double>> recorded_breakdown;
  std::vector<std::string> notes;  // extra lines under the header (source file, run commands)
};

// One bar of the memory chart: a label, bytes by category, and whether the plan fits.
struct MemoryBar {
  std::string label;
  std::string tooltip;
  MemoryBreakdown bytes{};
  bool feasible = true;
  bool chosen = false;
  std::string group;  // rows are grouped under this heading ("top plans", "strategy families")
};

// The charts, each one <svg> element (exposed for tests).
std::string memory_chart_svg(const std::vector<MemoryBar>& bars, double usable_bytes, double budget_bytes);
std::string timeline_svg(const StepProgram& program, const Prediction& prediction, double usable_bytes);
std::string scatter_svg(const SearchResult& search, const Strategy* chosen, double usable_bytes);

// The whole page.
std::string render_html_report(const HtmlReportInput& in);
// Writes the page; throws InputError naming --html when the file cannot be written.
void write_html_report(const std::string& path, const HtmlReportInput& in);

// `fsdp-plan compare plan.yaml report.json --html FILE`: predicted against measured, per memory category
// (a pair of bars per category with the error), and the time rows, on one self-contained page.
std::string comparison_chart_svg(const Comparison& c);
std::string render_comparison_html(const PlanFile& plan, const Comparison& c, const std::string& plan_path,
                                   const std::string& report_path);
void write_comparison_html(const std::string& path, const PlanFile& plan, const Comparison& c,
                           const std::string& plan_path, const std::string& report_path);

}  // namespace fsdp
