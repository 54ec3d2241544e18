// The planner's report: the top plans, the chosen plan's breakdowns, and each strategy family's
// verdict in numbers. Text (aligned, coloured on a terminal) and JSON views of one SearchResult.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "report/prediction_view.hpp"
#include "search/plan_search.hpp"

namespace fsdp {

struct PlanReportContext {
  const ModelSpec* model = nullptr;
  const HardwareProfile* hardware = nullptr;
  const RuntimeProfile* runtime = nullptr;
  Cluster cluster;
  int top_n = 10;
  std::string objective;
  double global_batch_tokens = 0;
  double train_tokens = 0;   // --tokens: the training run's tokens (0: not given)
  int64_t model_params = 0;  // ModuleGraph::total_params of the planned model (the caller's graph, built once)
};

std::string format_plan_report(const PlanReportContext& ctx, const SearchResult& r, bool color);
// "llama3-70b: 70.55B params, 80 layers, hidden 8192, heads 64/8, vocab 128256": the reports' model line.
std::string model_summary(const ModelSpec& m, int64_t params);
// The parallelism a model of this kind is trained with that the simulator does not model, named when no plan fits
// (expert parallelism for MoE models, tensor parallelism of MLA and of vision towers): "No plan fits" is then this
// planner's limit, not necessarily the cluster's.
std::vector<std::string> unmodelled_parallelism(const ModelSpec& m);
// Under the throughput objective: the fastest ranked plan where the search's near-tie rule chose a simpler one within
// kNearTieFraction of it (plan_search.cpp simplicity_rank), or nullptr: the report says why the chosen plan is not the
// fastest (`--json` near_tie_faster). Other objectives rank by something else: nullptr.
const Candidate* faster_near_tie(const PlanReportContext& ctx, const SearchResult& r);
nlohmann::json plan_report_json(const PlanReportContext& ctx, const SearchResult& r);
// One plan's --json entry: its simulation (prediction_view.hpp simulation_to_json), feasibility and GPU-hours.
nlohmann::json candidate_json(const PlanReportContext& ctx, const Candidate& c);
std::string family_line(const std::string& name, const FamilyVerdict& v);

}  // namespace fsdp
