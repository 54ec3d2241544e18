#pragma once
// The step program beside fsdp-run's recorded step (program/step_trace.hpp), entry by entry: collectives
// (kind, process group, wire dtype, bytes, unit, phase, micro-batch) and, apart, the order of the unit ops.
// What one side has and the other lacks, after the longest common subsequence is matched, is a mismatch.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "program/step_trace.hpp"

namespace fsdp {

struct TraceSide {
  std::vector<TraceEntry> entries;
  std::vector<std::string> unit_names;
};

struct TraceDiff {
  int64_t predicted = 0, measured = 0;                     // entries compared on each side
  int64_t mismatches = 0;                                  // predicted-only + measured-only entries
  std::vector<std::string> predicted_only, measured_only;  // the first few, described
};

struct TraceComparison {
  bool measured = false;  // the report carries a step trace
  int64_t step = 0;       // the step it recorded
  TraceDiff collectives;
  TraceDiff unit_ops;
  double predicted_bytes = 0, measured_bytes = 0;  // collective bytes of the step
};

// `measured` is compared on the micro-batches the program emits (emitted_micro_batches(grad_accum)).
TraceComparison compare_traces(const TraceSide& predicted, const TraceSide& measured, int64_t grad_accum);
// The report's "step_trace" section; InputError naming `path` and the key when it is malformed.
TraceSide measured_trace(const nlohmann::json& step_trace, const std::string& path);
std::string format_trace_comparison(const TraceComparison& c);
nlohmann::json trace_comparison_json(const TraceComparison& c);

}  // namespace fsdp
