// Plans one runtime executes identically under two strategy names (fsdp and zero3 under fsdp-run, whose ZeRO-3 is
// FSDP's FULL_SHARD with fp32 masters) are one row with both names in the text, JSON and HTML reports, not two rows
// with the same numbers. Identical means: every knob but the strategy name equal, and the same prediction (peak,
// reserved and device memory, step time) to the bit: the step program the runtime emits for both is the same.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "search/plan_search.hpp"

namespace fsdp {

bool same_execution(const Candidate& a, const Candidate& b);

struct PlanRow {
  const Candidate* plan = nullptr;
  std::vector<std::string> names;  // the strategy names it runs under, first the plan's own
  std::string name_text() const;   // "fsdp = zero3"
};

// The ranked plans with identical twins folded into the first, up to `max_rows` rows.
std::vector<PlanRow> merge_identical(const std::vector<Candidate>& ranked, size_t max_rows);

struct FamilyRow {
  std::string name;  // "fsdp" or "fsdp = zero3"
  std::vector<std::string> names;
  const FamilyVerdict* verdict = nullptr;
};

// The family verdicts with families whose best (or smallest) plans execute identically on one row.
std::vector<FamilyRow> merge_families(const std::map<std::string, FamilyVerdict>& families);

}  // namespace fsdp
