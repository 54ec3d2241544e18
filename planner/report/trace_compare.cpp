#include "report/trace_compare.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/errors.hpp"

namespace fsdp {

namespace {

// Mismatched entries listed per side in a report (the count is always whole).
constexpr size_t kListed = 8;

// Longest common subsequence of a and b (entries equal as operator== says); what is outside it is a mismatch.
TraceDiff diff(const std::vector<TraceEntry>& a, const std::vector<std::string>& a_units,
               const std::vector<TraceEntry>& b, const std::vector<std::string>& b_units) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  TraceDiff d;
  d.predicted = static_cast<int64_t>(n);
  d.measured = static_cast<int64_t>(m);
  size_t i = 0, j = 0;
  auto only_a = [&](size_t k) {
    ++d.mismatches;
    if (d.predicted_only.size() < kListed)
      d.predicted_only.push_back("#" + std::to_string(k) + " " + describe(a[k], a_units));
  };
  auto only_b = [&](size_t k) {
    ++d.mismatches;
    if (d.measured_only.size() < kListed)
      d.measured_only.push_back("#" + std::to_string(k) + " " + describe(b[k], b_units));
  };
  while (i < n && j < m) {
    if (a[i] == b[j]) {
      ++i;
      ++j;
    } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
      only_a(i++);
    } else {
      only_b(j++);
    }
  }
  while (i < n) only_a(i++);
  while (j < m) only_b(j++);
  return d;
}

void split(const std::vector<TraceEntry>& all, const std::vector<int>& micro_batches, std::vector<TraceEntry>& coll,
           std::vector<TraceEntry>& ops, double& bytes) {
  for (const TraceEntry& e : all) {
    if (e.micro_batch >= 0 &&
        std::find(micro_batches.begin(), micro_batches.end(), e.micro_batch) == micro_batches.end())
      continue;
    if (e.is_collective()) {
      coll.push_back(e);
      bytes += static_cast<double>(e.bytes);
    } else {
      ops.push_back(e);
    }
  }
}

}  // namespace

TraceComparison compare_traces(const TraceSide& predicted, const TraceSide& measured, int64_t grad_accum) {
  const std::vector<int> mbs = emitted_micro_batches(grad_accum);
  TraceComparison c;
  c.measured = true;
  std::vector<TraceEntry> pc, po, mc, mo;
  split(predicted.entries, mbs, pc, po, c.predicted_bytes);
  split(measured.entries, mbs, mc, mo, c.measured_bytes);
  c.collectives = diff(pc, predicted.unit_names, mc, measured.unit_names);
  c.unit_ops = diff(po, predicted.unit_names, mo, measured.unit_names);
  return c;
}

TraceSide measured_trace(const nlohmann::json& st, const std::string& path) {
  const std::string where = path + ": step_trace";
  if (!st.is_object()) throw InputError(where + " is not an object");
  for (auto it = st.begin(); it != st.end(); ++it)
    if (it.key() != "step" && it.key() != "units" && it.key() != "entries")
      throw InputError(where + ": unknown key '" + it.key() + "'");
  if (!st.contains("units") || !st.at("units").is_array()) throw InputError(where + ".units is missing or not a list");
  if (!st.contains("entries") || !st.at("entries").is_array())
    throw InputError(where + ".entries is missing or not a list");
  TraceSide s;
  for (const auto& u : st.at("units")) {
    if (!u.is_string()) throw InputError(where + ".units holds a value that is not a string");
    s.unit_names.push_back(u.get<std::string>());
  }
  size_t k = 0;
  for (const auto& e : st.at("entries"))
    s.entries.push_back(trace_entry_from_json(e, where + ".entries[" + std::to_string(k++) + "]"));
  return s;
}

std::string format_trace_comparison(const TraceComparison& c) {
  std::ostringstream o;
  if (!c.measured) {
    o << "collectives: the report has no step trace (an fsdp-run older than the step trace)\n";
    return o.str();
  }
  char line[256];
  std::snprintf(line, sizeof line, "\n%-24s %14s %14s %9s\n", "step program vs run", "predicted", "measured",
                "mismatches");
  o << line;
  auto row = [&](const char* name, const TraceDiff& d) {
    std::snprintf(line, sizeof line, "%-24s %14lld %14lld %9lld\n", name, static_cast<long long>(d.predicted),
                  static_cast<long long>(d.measured), static_cast<long long>(d.mismatches));
    o << line;
  };
  row("collectives", c.collectives);
  row("unit ops (in order)", c.unit_ops);
  std::snprintf(line, sizeof line, "%-24s %14.0f %14.0f\n", "collective bytes", c.predicted_bytes, c.measured_bytes);
  o << line;
  auto list = [&](const char* what, const TraceDiff& d) {
    for (const auto& s : d.predicted_only) o << "  " << what << " only predicted: " << s << "\n";
    for (const auto& s : d.measured_only) o << "  " << what << " only measured:  " << s << "\n";
  };
  list("collective", c.collectives);
  list("unit op", c.unit_ops);
  return o.str();
}

nlohmann::json trace_comparison_json(const TraceComparison& c) {
  if (!c.measured) return nlohmann::json{{"measured", false}};
  auto side = [](const TraceDiff& d) {
    return nlohmann::json{{"predicted", d.predicted},
                          {"measured", d.measured},
                          {"mismatches", d.mismatches},
                          {"predicted_only", d.predicted_only},
                          {"measured_only", d.measured_only}};
  };
  nlohmann::json j = side(c.collectives);
  j["measured"] = true;
  j["step"] = c.step;
  j["predicted_bytes"] = c.predicted_bytes;
  j["measured_bytes"] = c.measured_bytes;
  j["unit_ops"] = side(c.unit_ops);
  return j;
}

}  // namespace fsdp
