// The node sweep (`fsdp-plan --model M --nodes 2,4,8,16`): the search at each cluster size and the plan it chooses
// there, one row a size, so that a team sees what each reservation buys before making it: tokens/s per GPU and its
// scaling efficiency against the smallest size with a plan, the whole cluster's tokens/s, the step, the peak memory,
// and with --tokens the run's days and GPU-hours. A size where no plan fits says what its smallest plan needs; a size
// the pinned knobs cannot run on (a --tp or --pp that does not divide its GPUs) says why.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "report/plan_report.hpp"
#include "search/plan_search.hpp"

namespace fsdp {

struct SweepPoint {
  Cluster cluster;
  std::optional<SearchResult> result;  // absent where the pins were refused at this size
  std::string refused;                 // that refusal's message
};

// `ctx` as for one size (its cluster's gpus_per_node; its nodes are each point's).
std::string format_sweep_report(const PlanReportContext& ctx, const std::vector<SweepPoint>& points, bool color);
nlohmann::json sweep_report_json(const PlanReportContext& ctx, const std::vector<SweepPoint>& points);

}  // namespace fsdp
