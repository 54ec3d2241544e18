#include "report/identical_plans.hpp"

#include <algorithm>

namespace fsdp {

bool same_execution(const Candidate& a, const Candidate& b) {
  if (a.strategy.kind == b.strategy.kind || a.feasible != b.feasible) return false;
  Strategy renamed = b.strategy;
  renamed.kind = a.strategy.kind;
  if (strategy_identity(a.strategy) != strategy_identity(renamed)) return false;
  const Prediction& p = a.prediction;
  const Prediction& q = b.prediction;
  return p.memory.peak_allocated == q.memory.peak_allocated && p.memory.reserved_peak == q.memory.reserved_peak &&
         p.memory.device_total == q.memory.device_total && p.time.step_s == q.time.step_s &&
         p.time.exposed_comm_s == q.time.exposed_comm_s;
}

std::string PlanRow::name_text() const {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : " = ") + n;
  return out;
}

std::vector<PlanRow> merge_identical(const std::vector<Candidate>& ranked, size_t max_rows) {
  std::vector<PlanRow> rows;
  std::vector<bool> used(ranked.size(), false);
  for (size_t i = 0; i < ranked.size() && rows.size() < max_rows; ++i) {
    if (used[i]) continue;
    PlanRow row{&ranked[i], {to_string(ranked[i].strategy.kind)}};
    // Twins tie on every number, so they sit next to each other or within the tie window of the ranking.
    for (size_t j = i + 1; j < ranked.size(); ++j) {
      if (used[j] || !same_execution(ranked[i], ranked[j])) continue;
      used[j] = true;
      row.names.push_back(to_string(ranked[j].strategy.kind));
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<FamilyRow> merge_families(const std::map<std::string, FamilyVerdict>& families) {
  std::vector<FamilyRow> rows;
  std::vector<std::string> folded;
  for (auto it = families.begin(); it != families.end(); ++it) {
    if (std::find(folded.begin(), folded.end(), it->first) != folded.end()) continue;
    FamilyRow row{it->first, {it->first}, &it->second};
    if (it->second.best)
      for (auto jt = std::next(it); jt != families.end(); ++jt)
        if (jt->second.best && jt->second.feasible == it->second.feasible &&
            same_execution(*it->second.best, *jt->second.best)) {
          row.names.push_back(jt->first);
          folded.push_back(jt->first);
        }
    for (size_t k = 1; k < row.names.size(); ++k) row.name += " = " + row.names[k];
    rows.push_back(row);
  }
  return rows;
}

}  // namespace fsdp
