#include "report/trace_writer.hpp"

#include <algorithm>
#include <fstream>
#include <map>

#include "core/errors.hpp"

namespace fsdp {

nlohmann::json chrome_trace(const StepProgram& program, const Prediction& p) {
  // Trace Event Format (Google, "Trace Event Format" doc): ph "X" complete events with ts/dur in
  // microseconds, ph "C" counters, ph "M" thread_name metadata.
  constexpr double kUsPerSecond = 1e6;
  nlohmann::json events = nlohmann::json::array();
  for (int s = 0; s < static_cast<int>(Stream::kCount); ++s)
    events.push_back({{"ph", "M"},
                      {"pid", 0},
                      {"tid", s},
                      {"name", "thread_name"},
                      {"args", {{"name", to_string(static_cast<Stream>(s))}}}});
  events.push_back({{"ph", "M"}, {"pid", 0}, {"name", "process_name"}, {"args", {{"name", "rank 0 (simulated)"}}}});
  const auto& timing = p.time.ops;
  // Memory over time: each op's issue-time allocations placed at its simulated start.
  std::vector<std::pair<double, double>> mem;
  for (size_t i = 0; i < program.ops.size() && i < timing.size(); ++i) {
    const Op& op = program.ops[i];
    nlohmann::json ev{{"ph", "X"},
                      {"pid", 0},
                      {"tid", static_cast<int>(op.stream)},
                      {"name", op_label(program, op)},
                      {"cat", to_string(op.kind)},
                      {"ts", timing[i].start * kUsPerSecond},
                      {"dur", (timing[i].end - timing[i].start) * kUsPerSecond},
                      {"args", {{"micro_batch", op.micro_batch + 1}}}};
    if (op.comm_bytes > 0) ev["args"]["bytes"] = op.comm_bytes;
    if (op.matmul_flops > 0) ev["args"]["flops"] = op.matmul_flops + op.attention_flops;
    events.push_back(ev);
  }
  for (const MemorySample& s : p.memory.samples) {
    if (s.op < 0 || static_cast<size_t>(s.op) >= timing.size()) continue;
    mem.emplace_back(timing[static_cast<size_t>(s.op)].start, s.allocated);
  }
  std::stable_sort(mem.begin(), mem.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [t, bytes] : mem)
    events.push_back({{"ph", "C"},
                      {"pid", 0},
                      {"name", "allocated GiB"},
                      {"ts", t * kUsPerSecond},
                      {"args", {{"allocated", bytes / kGiB}}}});
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void write_chrome_trace(const std::string& path, const StepProgram& program, const Prediction& prediction) {
  std::ofstream out(path);
  if (!out) throw InputError("--trace: cannot write '" + path + "'");
  out << chrome_trace(program, prediction).dump() << "\n";
  if (!out) throw InputError("--trace: failed writing '" + path + "'");
}

}  // namespace fsdp
