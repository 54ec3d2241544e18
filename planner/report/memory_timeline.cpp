#include "report/memory_timeline.hpp"

#include <cstdio>

#include "core/units.hpp"

namespace fsdp {

namespace {

std::string events(const InlineList<MemEvent, 4>& a, const InlineList<MemEvent, 3>& b) {
  std::string out;
  auto add = [&](const MemEvent& e) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %+.3f", out.empty() ? "" : ", ", std::string(to_string(e.category)).c_str(),
                  e.bytes / kMiB);
    out += buf;
  };
  for (const MemEvent& e : a) add(e);
  for (const MemEvent& e : b) add(e);
  return out;
}

}  // namespace

std::string format_memory_timeline(const StepProgram& p, const MemoryResult& m) {
  std::string out =
      "memory timeline (MiB; allocated = while the op runs, transient included; issue events, then\n"
      "completion events, which for reductions apply after the next compute op)\n";
  char line[512];
  std::snprintf(line, sizeof line, "%5s  %-44s %-14s %10s %12s  %s\n", "op", "phase", "stream", "transient",
                "allocated", "allocates (+) / frees (-)");
  out += line;
  for (const MemorySample& s : m.samples) {
    const Op& op = p.ops[static_cast<size_t>(s.op)];
    const std::string phase = op_phase(p, op);
    std::snprintf(line, sizeof line, "%5d  %-44s %-14s %10.3f %12.3f%s  %s\n", s.op, phase.c_str(),
                  to_string(op.stream), op.transient_bytes / kMiB, s.allocated / kMiB, s.op == m.peak_op ? " *" : "  ",
                  events(op.on_issue, op.on_complete).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "peak %.3f MiB at op %d (%s)\n", m.peak_allocated / kMiB, m.peak_op,
                m.peak_phase.c_str());
  out += line;
  return out;
}

}  // namespace fsdp
