#include "report/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/errors.hpp"
#include "core/units.hpp"
#include "memory/memory_category.hpp"

namespace fsdp {

namespace {

const nlohmann::json& need(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.is_object() || !j.contains(key))
    throw InputError(path + ": not an fsdp-run report: missing key '" + key + "'");
  return j.at(key);
}

double number(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto& v = need(j, key, path);
  if (!v.is_number()) throw InputError(path + ": key '" + std::string(key) + "' is not a number");
  return v.get<double>();
}

}  // namespace

Comparison compare_plan_report(const PlanPrediction& pred, const Strategy& s, const TraceSide& program,
                               const nlohmann::json& report, const std::string& path) {
  Comparison c;
  if (report.is_object() && report.contains("step_trace")) {
    const auto& st = report.at("step_trace");
    c.collectives = compare_traces(program, measured_trace(st, path), s.grad_accum);
    if (st.contains("step") && st.at("step").is_number_integer()) c.collectives.step = st.at("step").get<int64_t>();
  }
  const auto& mem = need(report, "memory", path);
  const auto& bd = need(mem, "breakdown", path);
  auto predicted = [&](MemoryCategory cat) {
    auto it = pred.memory_breakdown.find(std::string(to_string(cat)));
    return it == pred.memory_breakdown.end() ? 0.0 : it->second;
  };
  auto measured = [&](MemoryCategory cat) {
    const std::string name(to_string(cat));
    if (!bd.contains(name)) return 0.0;
    if (!bd.at(name).is_number()) throw InputError(path + ": memory.breakdown." + name + " is not a number");
    return bd.at(name).get<double>();
  };
  for (size_t i = 0; i < kNumMemoryCategories; ++i) {
    const auto cat = static_cast<MemoryCategory>(i);
    if (cat == MemoryCategory::Activations || cat == MemoryCategory::Transient) continue;
    const std::string name(kMemoryCategoryNames[i]);
    const double p = predicted(cat);
    const bool has = bd.contains(name);
    if (p == 0 && !has) continue;
    c.memory.push_back(ComparisonRow{name, "bytes", p, measured(cat), has});
  }
  // A run measures the buffers the executor owns; what autograd holds at the peak (saved activations,
  // backward temporaries, logits) is one untagged rest, which fsdp-run files under activations during
  // forward/backward and under transient elsewhere: the two are compared as one row.
  const double pa = predicted(MemoryCategory::Activations) + predicted(MemoryCategory::Transient);
  const bool has_rest = bd.contains("activations") || bd.contains("transient");
  if (pa > 0 || has_rest)
    c.memory.push_back(ComparisonRow{"activations + transient", "bytes", pa,
                                     measured(MemoryCategory::Activations) + measured(MemoryCategory::Transient),
                                     has_rest});
  const double measured_peak = number(mem, "peak_bytes", path);
  c.memory.push_back(ComparisonRow{"peak allocated", "bytes", pred.peak_bytes, measured_peak, true});
  // A run whose Gloo gathers ended before the compute they overlapped peaked at the floor (memory_walk.hpp).
  if (pred.peak_is_range())
    c.memory.push_back(ComparisonRow{"peak, gathers end early", "bytes", pred.peak_bytes_floor, measured_peak, true});
  const auto& steps = need(report, "steps", path);
  if (!steps.is_array()) throw InputError(path + ": key 'steps' is not a list");
  // Medians over the steps after the first (which warms up), or the only step.
  auto median_of = [&](auto value) {
    std::vector<double> v;
    for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) v.push_back(value(steps[i]));
    std::sort(v.begin(), v.end());
    if (v.empty()) return 0.0;
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  if (!steps.empty()) {
    const double median = median_of([&](const nlohmann::json& st) { return number(st, "time_s", path); });
    c.time.push_back(ComparisonRow{"step time (median)", "s", pred.step_s, median, true});
    // The run's exposed communication is the time it blocked waiting for collectives; the rest of the
    // step is compute (kernels, copies, the optimizer), as the simulator splits it.
    if (steps[0].contains("comm_wait_s")) {
      const double wait = median_of([&](const nlohmann::json& st) { return number(st, "comm_wait_s", path); });
      const double compute = median_of(
          [&](const nlohmann::json& st) { return number(st, "time_s", path) - number(st, "comm_wait_s", path); });
      c.time.push_back(ComparisonRow{"compute (median)", "s", pred.compute_s, compute, true});
      c.time.push_back(ComparisonRow{"exposed comm (median)", "s", pred.exposed_comm_s, wait, true});
    }
    // After the last backward: gradient norm, optimizer, the step's scalar all-reduces.
    if (steps[0].contains("optimizer_phase_s") && pred.optimizer_phase_recorded) {
      const double phase = median_of([&](const nlohmann::json& st) { return number(st, "optimizer_phase_s", path); });
      c.time.push_back(ComparisonRow{"optimizer phase (median)", "s", pred.optimizer_phase_s, phase, true});
    }
    // A data-parallel replica's tokens a step, shared by its tp x pp GPUs (simulate.cpp counts them so).
    const double tokens =
        static_cast<double>(s.micro_batch * s.seq_len * s.grad_accum) / static_cast<double>(s.mesh.model_parallel());
    c.time.push_back(ComparisonRow{"tokens/s per GPU", "tokens/s", pred.tokens_per_s_per_gpu, tokens / median, true});
  }
  return c;
}

std::string format_comparison(const Comparison& c) {
  std::ostringstream o;
  char line[256];
  // GiB for real models, MiB for the small ones CPU runs use.
  double peak = 0;
  for (const auto& r : c.memory) peak = std::max(peak, std::max(r.predicted, r.measured));
  const bool mib = peak < kGiB;
  const double unit = mib ? kMiB : kGiB;
  std::snprintf(line, sizeof line, "%-24s %14s %14s %9s\n", mib ? "memory (MiB)" : "memory (GiB)", "predicted",
                "measured", "error");
  o << line;
  for (const auto& r : c.memory) {
    if (r.has_measured) {
      std::snprintf(line, sizeof line, "%-24s %14.3f %14.3f %+8.1f%%\n", r.name.c_str(), r.predicted / unit,
                    r.measured / unit, r.error() * 100);
    } else {
      std::snprintf(line, sizeof line, "%-24s %14.3f %14s %9s\n", r.name.c_str(), r.predicted / unit, "(not measured)",
                    "");
    }
    o << line;
  }
  if (!c.time.empty()) {
    std::snprintf(line, sizeof line, "\n%-24s %14s %14s %9s\n", "time", "predicted", "measured", "error");
    o << line;
    for (const auto& r : c.time) {
      std::snprintf(line, sizeof line, "%-24s %14.4f %14.4f %+8.1f%%\n", r.name.c_str(), r.predicted, r.measured,
                    r.error() * 100);
      o << line;
    }
  }
  o << format_trace_comparison(c.collectives);
  return o.str();
}

nlohmann::json comparison_json(const Comparison& c) {
  auto rows = [](const std::vector<ComparisonRow>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : v) {
      nlohmann::json e{{"name", r.name}, {"unit", r.unit}, {"predicted", r.predicted}};
      if (r.has_measured) {
        e["measured"] = r.measured;
        e["error"] = r.error();
      }
      a.push_back(e);
    }
    return a;
  };
  return nlohmann::json{
      {"memory", rows(c.memory)}, {"time", rows(c.time)}, {"collectives", trace_comparison_json(c.collectives)}};
}

}  // namespace fsdp
