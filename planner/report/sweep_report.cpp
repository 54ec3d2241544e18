#include "report/sweep_report.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/format.hpp"
#include "report/training_run.hpp"

namespace fsdp {

namespace {

const Candidate* chosen(const SweepPoint& pt) {
  return pt.result && !pt.result->ranked.empty() ? &pt.result->ranked.front() : nullptr;
}

// The rate the efficiency column divides by: the chosen plan's at the smallest size that has one.
double base_rate(const std::vector<SweepPoint>& points) {
  for (const SweepPoint& pt : points)
    if (const Candidate* c = chosen(pt)) return c->prediction.tokens_per_s_per_gpu;
  return 0.0;
}

// Why a size has no plan: the smallest memory any family's smallest plan needs, against the budget.
std::string no_plan_text(const SweepPoint& pt) {
  if (!pt.result) return "refused: " + pt.refused;
  double least = 0;
  for (const auto& [name, v] : pt.result->families)
    if (v.needed_bytes > 0 && (least == 0 || v.needed_bytes < least)) least = v.needed_bytes;
  if (least == 0) return "no plan fits";
  return "no plan fits: the smallest needs " + format_gib(least) + " GiB per GPU > " +
         format_gib(pt.result->budget_bytes) + " GiB";
}

}  // namespace

std::string format_sweep_report(const PlanReportContext& ctx, const std::vector<SweepPoint>& points, bool color) {
  const char* bold = color ? "\033[1m" : "";
  const char* reset = color ? "\033[0m" : "";
  std::ostringstream o;
  o << bold << "model   " << reset << model_summary(*ctx.model, ctx.model_params) << "\n"
    << bold << "sweep   " << reset << points.size() << " cluster sizes of " << ctx.cluster.gpus_per_node << " x "
    << ctx.hardware->name << " a node (" << format_gib(ctx.hardware->usable_device_memory.value)
    << " GiB usable each); runtime " << ctx.runtime->name << "; objective " << ctx.objective << "\n";
  if (!ctx.hardware->device_is_host()) o << bold << "network " << reset << network_summary(*ctx.hardware) << "\n";
  double seconds = 0;
  for (const SweepPoint& pt : points)
    if (pt.result) seconds += pt.result->seconds;
  o << "searched each size exhaustively, " << fmt("%.3f", seconds) << " s in all\n\n";
  const bool training = ctx.train_tokens > 0;
  o << bold << "the chosen plan at each size" << reset
    << (training ? " (training " + count_text(ctx.train_tokens) + " tokens)" : std::string()) << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %5s %6s %9s %10s %8s %11s %9s%s\n", "nodes", "GPUs", "peak GiB", "tok/s/GPU",
                "scaling", "tok/s", "step s", training ? "      days   GPU-hours" : "");
  o << line;
  const double base = base_rate(points);
  std::vector<std::string> plans;
  for (const SweepPoint& pt : points) {
    const long long nodes = static_cast<long long>(pt.cluster.nodes);
    const long long gpus = static_cast<long long>(pt.cluster.world_size());
    const Candidate* c = chosen(pt);
    if (!c) {
      std::snprintf(line, sizeof line, "  %5lld %6lld  %s\n", nodes, gpus, no_plan_text(pt).c_str());
      o << line;
      continue;
    }
    const Prediction& p = c->prediction;
    char run[64] = "";
    if (training) {
      const TrainingRun t = training_run(ctx.train_tokens, pt.cluster, p);
      std::snprintf(run, sizeof run, " %9.1f %11s", t.days, count_text(t.gpu_hours).c_str());
    }
    std::snprintf(line, sizeof line, "  %5lld %6lld %9s %10.0f %7.1f%% %11s %9.3f%s\n", nodes, gpus,
                  format_gib(p.memory.device_total).c_str(), p.tokens_per_s_per_gpu,
                  base > 0 ? p.tokens_per_s_per_gpu / base * 100.0 : 0.0,
                  count_text(p.tokens_per_s_per_gpu * static_cast<double>(gpus)).c_str(), p.time.step_s, run);
    o << line;
    plans.push_back(fmt("%5.0f", static_cast<double>(nodes)) + " nodes: " + one_line_strategy(c->strategy));
  }
  o << "  (scaling: tokens/s per GPU against the smallest size with a plan; peak: device total per GPU)\n";
  if (!plans.empty()) {
    o << "\n" << bold << "the plans" << reset << "\n";
    for (const std::string& s : plans) o << "  " << s << "\n";
  }
  o << "\nA sweep writes no plan file: run again with one --nodes to write plan.yaml (or --target's files).\n";
  return o.str();
}

nlohmann::json sweep_report_json(const PlanReportContext& ctx, const std::vector<SweepPoint>& points) {
  nlohmann::json rows = nlohmann::json::array();
  const double base = base_rate(points);
  for (const SweepPoint& pt : points) {
    nlohmann::json r;
    r["nodes"] = pt.cluster.nodes;
    r["gpus"] = pt.cluster.world_size();
    if (!pt.result) {
      r["refused"] = pt.refused;
      r["chosen"] = nullptr;
      rows.push_back(r);
      continue;
    }
    r["searched"] = pt.result->evaluated;
    r["feasible"] = pt.result->feasible;
    r["seconds"] = pt.result->seconds;
    PlanReportContext at = ctx;
    at.cluster = pt.cluster;
    if (const Candidate* c = chosen(pt)) {
      r["chosen"] = candidate_json(at, *c);
      r["scaling_efficiency"] = base > 0 ? c->prediction.tokens_per_s_per_gpu / base : 0.0;
      if (ctx.train_tokens > 0)
        r["training"] = training_run_json(ctx.train_tokens, training_run(ctx.train_tokens, pt.cluster, c->prediction));
    } else {
      r["chosen"] = nullptr;
      r["reason"] = no_plan_text(pt);
    }
    rows.push_back(r);
  }
  return {{"sweep", rows}};
}

}  // namespace fsdp
