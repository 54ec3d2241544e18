#include "validate/row_breakdown.hpp"

#include <cstdio>
#include <sstream>

#include "core/errors.hpp"
#include "core/units.hpp"

namespace fsdp {

std::string format_breakdown(const ValidationReport& r, const std::string& match) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-50s %8s %8s %8s %8s %8s %8s %8s %8s\n", "row", "step s", "compute", "comm",
                "exposed", "contend", "opt tail", "mem GiB", "usable");
  o << line;
  int n = 0;
  for (const RowResult& x : r.results) {
    if (!x.simulated || !x.breakdown || x.row->id.find(match) == std::string::npos) continue;
    const RowResult::Breakdown& b = *x.breakdown;
    std::snprintf(line, sizeof line, "%-50s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.1f %8.1f\n", x.row->id.c_str(),
                  b.step_s, b.compute_s, b.comm_s, b.exposed_comm_s, b.contention_s, b.optimizer_phase_s,
                  b.device_total_gib, b.usable_gib);
    o << line;
    if (b.mesh) {
      std::snprintf(
          line, sizeof line,
          "  mesh: tp collectives %.3f s, pipeline send-recv %.3f s (both in exposed), pipeline bubble %.3f s, "
          "reduction chain %.3f s\n",
          b.tp_comm_s, b.pp_comm_s, b.pipeline_bubble_s, b.pipeline_reduction_chain_s);
      o << line;
    }
    // The memory line: the allocated peak, where it happens, and what is live then by category.
    std::snprintf(line, sizeof line, "  memory: allocated %.2f GiB at %s, reserved %.2f GiB;", b.peak_allocated_gib,
                  b.peak_phase.c_str(), b.reserved_peak_gib);
    o << line;
    for (size_t c = 0; c < kNumMemoryCategories; ++c) {
      if (b.memory[c] <= 0) continue;
      std::snprintf(line, sizeof line, " %s %.2f", std::string(kMemoryCategoryNames[c]).c_str(), b.memory[c] / kGiB);
      o << line;
    }
    o << "\n";
    ++n;
  }
  if (n == 0) throw InputError("--breakdown: no simulated row's id contains '" + match + "'");
  return o.str();
}

}  // namespace fsdp
