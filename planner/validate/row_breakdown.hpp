// `fsdp-plan validate --breakdown TEXT`: for each simulated published row whose id contains TEXT, where its predicted
// step goes (compute, collectives, how much of them the compute stream waits for, the compute slowed beside them)
// and its predicted device memory against the GPU's usable memory (RowResult::Breakdown); under each row, its
// allocated peak, the phase it falls in, the reserved peak and the categories live at the peak.
#pragma once

#include <string>

#include "validate/published_runs.hpp"

namespace fsdp {

// One header line and one line a matching row; throws InputError when no simulated row's id contains `match`.
std::string format_breakdown(const ValidationReport& r, const std::string& match);

}  // namespace fsdp
