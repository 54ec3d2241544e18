#include "program/step_trace.hpp"

#include <cstdio>

#include "core/errors.hpp"
#include "program/step_program.hpp"

namespace fsdp {

bool operator==(const TraceEntry& a, const TraceEntry& b) {
  if (a.collective != b.collective || a.phase != b.phase || a.unit != b.unit || a.micro_batch != b.micro_batch)
    return false;
  if (!a.is_collective()) return true;
  return a.group == b.group && a.group_size == b.group_size && a.dtype == b.dtype && a.bytes == b.bytes;
}

namespace {

// The unit ops a runtime observes: its hooks around a unit's forward and backward, the reshard after
// forward, and the loss ops.
bool is_unit_op(const Op& op) {
  switch (op.phase) {
    case Phase::Forward:
    case Phase::Free:
    case Phase::Backward:
    case Phase::PostBackward:
    case Phase::HeadLossForward:
    case Phase::LossBackward:
      return op.stream == Stream::Compute;
    default:
      return false;
  }
}

}  // namespace

std::vector<TraceEntry> program_trace(const StepProgram& p) {
  std::vector<TraceEntry> out;
  for (const Op& op : p.ops) {
    const bool collective = op.collective != CollectiveKind::None;
    if (!collective && !is_unit_op(op)) continue;
    TraceEntry e;
    e.collective = op.collective;
    e.phase = op.phase;
    e.unit = phase_has_unit(op.phase) ? op.unit : -1;
    e.micro_batch = is_step_phase(op.phase) ? -1 : op.micro_batch;
    if (collective) {
      e.group = op.group;
      e.group_size = p.layout.group_size(op.group);
      e.dtype = op.comm_dtype;
      e.bytes = static_cast<int64_t>(op.comm_bytes);
    } else if (!out.empty() && out.back() == e) {
      continue;  // one unit's backward emitted layer by layer
    }
    out.push_back(e);
  }
  return out;
}

std::vector<int> emitted_micro_batches(int64_t grad_accum) {
  FSDP_ASSERT(grad_accum >= 1, "grad_accum >= 1");
  const int K = static_cast<int>(grad_accum);
  std::vector<int> m{0};
  if (K >= 3) m.push_back(1);
  if (K >= 2) m.push_back(K - 1);
  return m;
}

std::string describe(const TraceEntry& e, const std::vector<std::string>& unit_names) {
  std::string s = e.is_collective() ? std::string(to_string(e.collective)) : std::string("op");
  if (e.is_collective()) {
    char b[96];
    std::snprintf(b, sizeof b, " %s[%lld] %s %lld B", to_string(e.group), static_cast<long long>(e.group_size),
                  to_string(e.dtype), static_cast<long long>(e.bytes));
    s += b;
  }
  s += std::string(" ") + to_string(e.phase);
  if (e.unit >= 0)
    s += " " + (static_cast<size_t>(e.unit) < unit_names.size() ? unit_names[static_cast<size_t>(e.unit)]
                                                                : "unit " + std::to_string(e.unit));
  if (e.micro_batch >= 0) s += " (micro-batch " + std::to_string(e.micro_batch + 1) + ")";
  return s;
}

nlohmann::json trace_entry_json(const TraceEntry& e) {
  nlohmann::json j{{"phase", to_string(e.phase)}, {"unit", e.unit}, {"micro_batch", e.micro_batch}};
  if (e.is_collective()) {
    j["collective"] = to_string(e.collective);
    j["group"] = to_string(e.group);
    j["group_size"] = e.group_size;
    j["dtype"] = to_string(e.dtype);
    j["bytes"] = e.bytes;
  }
  return j;
}

TraceEntry trace_entry_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": a trace entry is not an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const char* kKeys[] = {"phase", "unit",       "micro_batch", "collective",
                                  "group", "group_size", "dtype",       "bytes"};
    bool known = false;
    for (const char* k : kKeys) known = known || it.key() == k;
    if (!known) throw InputError(where + ": unknown key '" + it.key() + "' in a trace entry");
  }
  auto str = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_string())
      throw InputError(where + ": trace entry key '" + key + "' is missing or not a string");
    return j.at(key).get<std::string>();
  };
  auto integer = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_number_integer())
      throw InputError(where + ": trace entry key '" + key + "' is missing or not an integer");
    return j.at(key).get<int64_t>();
  };
  auto bad = [&](const char* key, const std::string& v) {
    return InputError(where + ": trace entry key '" + key + "' has the unknown value '" + v + "'");
  };
  TraceEntry e;
  const std::string phase = str("phase");
  auto ph = phase_from_string(phase);
  if (!ph) throw bad("phase", phase);
  e.phase = *ph;
  e.unit = static_cast<int>(integer("unit"));
  e.micro_batch = static_cast<int>(integer("micro_batch"));
  if (!j.contains("collective")) return e;
  const std::string c = str("collective");
  auto ck = collective_kind_from_string(c);
  if (!ck || *ck == CollectiveKind::None) throw bad("collective", c);
  e.collective = *ck;
  const std::string g = str("group");
  auto gk = group_kind_from_string(g);
  if (!gk) throw bad("group", g);
  e.group = *gk;
  const std::string d = str("dtype");
  auto wt = wire_type_from_string(d);
  if (!wt) throw bad("dtype", d);
  e.dtype = *wt;
  e.group_size = integer("group_size");
  e.bytes = integer("bytes");
  return e;
}

}  // namespace fsdp
