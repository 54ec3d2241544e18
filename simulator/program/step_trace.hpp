// One step as a sequence of entries that both halves produce: the simulator from its step program
// (program_trace), fsdp-run by recording what it does (executor/dist/collective_trace.hpp). An entry is a
// collective (kind, process group, wire dtype, bytes, unit, phase, micro-batch) or a unit op (forward,
// free, backward, post-backward, the loss ops: CollectiveKind::None), in issue order; `fsdp-plan compare`
// sets the two side by side (planner/report/trace_compare.hpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "program/op_kinds.hpp"

namespace fsdp {

struct StepProgram;

struct TraceEntry {
  CollectiveKind collective = CollectiveKind::None;  // None: a unit op
  Phase phase = Phase::Forward;
  int unit = -1;         // index into the wrap units (root 0); -1 for ops of no unit
  int micro_batch = -1;  // 0-based; -1 for the step's own phases (is_step_phase)
  // Collectives only:
  GroupKind group = GroupKind::World;
  int64_t group_size = 0;
  WireType dtype = WireType::Fp32;  // on the wire (a backend without bf16 sends fp32)
  int64_t bytes = 0;                // the whole buffer (all-gather output, reduce-scatter input, all-reduce buffer)
  bool is_collective() const { return collective != CollectiveKind::None; }
};

bool operator==(const TraceEntry& a, const TraceEntry& b);
inline bool operator!=(const TraceEntry& a, const TraceEntry& b) { return !(a == b); }

// The entries of a step program in issue order: its collectives and the unit ops a runtime can observe
// (consecutive ops of one phase and unit, e.g. the per-layer backward ops of a multi-layer unit, are one).
std::vector<TraceEntry> program_trace(const StepProgram& program);

// Micro-batches a program emits out of `grad_accum` (StepLayout::micro_batches_emitted: first, one
// representative middle, last); a measured trace is compared on these.
std::vector<int> emitted_micro_batches(int64_t grad_accum);

// "all-gather shard[2] bf16 12.0 KiB unit 3 bwd all-gather (micro-batch 1)", for mismatch messages.
std::string describe(const TraceEntry& e, const std::vector<std::string>& unit_names);

nlohmann::json trace_entry_json(const TraceEntry& e);
// Strict: InputError naming `where` and the key for a missing, unknown or ill-typed key.
TraceEntry trace_entry_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace fsdp
