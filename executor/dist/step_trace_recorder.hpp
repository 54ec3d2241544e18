// What fsdp-run did in one step, entry by entry, in the simulator's words (program/step_trace.hpp):
// every collective the step issues (through Group, which records it with the tag its caller gives)
// and the unit ops ShardedModel's hooks run. The trainer records each step anew; the report carries
// the last one, which `fsdp-plan compare` sets beside the step program.
#pragma once

#include <vector>

#include "program/step_trace.hpp"

namespace fsdp::exec {

// Who issues a collective: the phase (the simulator's op label), the process group's role and the unit.
struct CollectiveTag {
  Phase phase = Phase::Forward;
  GroupKind group = GroupKind::World;
  int unit = -1;
};

class StepTraceRecorder {
 public:
  void begin_step() {
    entries_.clear();
    recording_ = true;
    micro_batch_ = -1;
  }
  void end_step() { recording_ = false; }
  bool recording() const { return recording_; }
  // 0-based micro-batch of the ops recorded from now on.
  void set_micro_batch(int m) { micro_batch_ = m; }
  void unit_op(Phase phase, int unit);
  // A collective over `group_size` ranks moving `bytes` of `dtype` in all. Untagged while recording is a bug
  // (every collective of a step says what it is): an assertion.
  void collective(CollectiveKind kind, const CollectiveTag* tag, int64_t group_size, WireType dtype, int64_t bytes);
  const std::vector<TraceEntry>& entries() const { return entries_; }

 private:
  int micro_batch_for(Phase p) const { return is_step_phase(p) ? -1 : micro_batch_; }
  std::vector<TraceEntry> entries_;
  bool recording_ = false;
  int micro_batch_ = -1;
};

}  // namespace fsdp::exec
