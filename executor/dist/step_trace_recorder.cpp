#include "dist/step_trace_recorder.hpp"

#include "core/errors.hpp"

namespace fsdp::exec {

void StepTraceRecorder::unit_op(Phase phase, int unit) {
  if (!recording_) return;
  TraceEntry e;
  e.phase = phase;
  e.unit = phase_has_unit(phase) ? unit : -1;
  e.micro_batch = micro_batch_for(phase);
  if (!entries_.empty() && entries_.back() == e) return;
  entries_.push_back(e);
}

void StepTraceRecorder::collective(CollectiveKind kind, const CollectiveTag* tag, int64_t group_size, WireType dtype,
                                   int64_t bytes) {
  if (!recording_) return;
  FSDP_ASSERT(tag != nullptr, "a collective issued during a training step carries no CollectiveTag");
  TraceEntry e;
  e.collective = kind;
  e.phase = tag->phase;
  e.unit = tag->unit;
  e.micro_batch = micro_batch_for(tag->phase);
  e.group = tag->group;
  e.group_size = group_size;
  e.dtype = dtype;
  e.bytes = bytes;
  entries_.push_back(e);
}

}  // namespace fsdp::exec
