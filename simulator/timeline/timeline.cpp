#include "timeline/timeline.hpp"

#include <algorithm>
#include <array>

#include "core/errors.hpp"

namespace fsdp {

TimelineResult run_timeline(const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s) {
  TimelineResult r;
  r.ops.resize(p.ops.size());
  constexpr size_t kStreams = static_cast<size_t>(Stream::kCount);
  std::array<double, kStreams> stream_free{};
  // Ops are issued in program order (the CPU issue order); each stream is a FIFO, so scheduling in
  // program order with "start = max(stream free, deps done)" is an exact event simulation of in-order streams.
  double compute_busy = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    double ready = stream_free[static_cast<size_t>(op.stream)];
    for (int d : op.deps) {
      FSDP_ASSERT(d >= 0 && static_cast<size_t>(d) < i, "dependencies point backwards in program order");
      ready = std::max(ready, r.ops[static_cast<size_t>(d)].end);
    }
    double dur = op_duration(op, p, hw, c, s);
    FSDP_ASSERT(dur >= 0, "negative op duration");
    r.ops[i] = OpTiming{ready, ready + dur};
    stream_free[static_cast<size_t>(op.stream)] = ready + dur;
    switch (op.stream) {
      case Stream::Compute:
        compute_busy += dur;
        if (op.kind == OpKind::OptimizerStep) r.optimizer_s += dur;
        break;
      case Stream::AllGather:
      case Stream::ReduceScatter: r.comm_s += dur; break;
      case Stream::HostToDevice:
      case Stream::DeviceToHost:
      case Stream::Host:
        r.offload_s += dur;
        if (op.kind == OpKind::HostOptimizerStep) r.optimizer_s += dur;
        break;
      case Stream::kCount: break;
    }
  }
  double end = 0;
  for (const auto& t : r.ops) end = std::max(end, t.end);
  r.step_s = end;
  r.compute_s = compute_busy;
  // Everything that is not compute-stream work is exposed time; split it between communication and
  // offload by which kind of op the compute stream was waiting for.
  double idle = std::max(0.0, end - compute_busy);
  double exposed_offload = 0;
  double compute_end = 0;
  for (size_t i = 0; i < p.ops.size(); ++i)
    if (p.ops[i].stream == Stream::Compute) compute_end = std::max(compute_end, r.ops[i].end);
  // Tail after the last compute op is offload time when an offload op ends the step.
  for (size_t i = 0; i < p.ops.size(); ++i) {
    Stream st = p.ops[i].stream;
    if ((st == Stream::HostToDevice || st == Stream::DeviceToHost || st == Stream::Host) && r.ops[i].end > compute_end)
      exposed_offload = std::max(exposed_offload, r.ops[i].end - compute_end);
  }
  exposed_offload = std::min(exposed_offload, idle);
  r.exposed_offload_s = exposed_offload;
  r.exposed_comm_s = idle - exposed_offload;
  return r;
}

}  // namespace fsdp
