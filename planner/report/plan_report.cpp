#include "report/plan_report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/format.hpp"
#include "report/identical_plans.hpp"
#include "report/training_run.hpp"

namespace fsdp {

namespace {

std::string wrap_name(const Strategy& s) { return shards_params(s.kind) ? to_string(s.wrap) : "-"; }

}  // namespace

nlohmann::json candidate_json(const PlanReportContext& ctx, const Candidate& c) {
  SimulationContext sc{ctx.model, ctx.hardware, ctx.runtime, ctx.cluster, c.strategy};
  nlohmann::json j = simulation_to_json(sc, c.prediction);
  j["feasible"] = c.feasible;
  if (!c.feasible) j["reason"] = c.infeasible_reason;
  if (c.gpu_hours > 0) j["gpu_hours"] = c.gpu_hours;
  return j;
}

namespace {

// The categories of a breakdown that make up most of it, largest first, by their names (memory_category.hpp),
// so that a verdict reads like the memory table: the ones of at least 1 GiB (at least the largest), the rest
// summed.
std::string largest_categories(const MemoryBreakdown& b) {
  constexpr std::size_t kMostListed = 5;
  std::array<std::size_t, kNumMemoryCategories> order{};
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return b[x] > b[y]; });
  std::ostringstream o;
  double rest = 0;
  std::size_t listed = 0;
  for (std::size_t i : order) {
    if (listed < kMostListed && (listed == 0 || b[i] >= kGiB)) {
      o << (listed++ ? ", " : "") << to_string(static_cast<MemoryCategory>(i)) << " " << fmt("%.0f", b[i] / kGiB);
    } else {
      rest += b[i];
    }
  }
  if (rest >= kGiB / 2) o << ", the rest " << fmt("%.0f", rest / kGiB);
  return o.str();
}

}  // namespace

std::string family_line(const std::string& name, const FamilyVerdict& v) {
  std::ostringstream o;
  if (v.feasible && v.best) {
    const Candidate& c = *v.best;
    o << name << ": best " << one_line_strategy(c.strategy) << " -> " << fmt("%.0f", c.prediction.tokens_per_s_per_gpu)
      << " tokens/s/GPU, " << format_gib(c.prediction.memory.device_total) << " GiB";
  } else if (v.best) {
    const Prediction& p = v.best->prediction;
    o << name << ": does not fit; the smallest (" << one_line_strategy(v.best->strategy) << ") ";
    if (p.fits && !p.host_fits) {
      // The GPU holds it; the host does not (offloaded state): say which, not "39 GiB > 45 GiB".
      o << "fits the GPU at " << fmt("%.0f", p.memory.device_total / kGiB) << " of "
        << fmt("%.0f", p.usable_bytes / kGiB) << " GiB but " << v.reason;
    } else {
      o << "needs " << fmt("%.0f", p.memory.device_total / kGiB) << " GiB per GPU > "
        << fmt("%.0f", p.usable_bytes / kGiB) << " GiB: " << largest_categories(p.memory.breakdown);
    }
  } else {
    o << name << ": not applicable: " << v.reason;
  }
  return o.str();
}

const Candidate* faster_near_tie(const PlanReportContext& ctx, const SearchResult& r) {
  if (ctx.objective != "throughput" || r.ranked.empty()) return nullptr;
  const Candidate* fastest = &r.ranked.front();
  for (const Candidate& c : r.ranked)
    if (c.prediction.tokens_per_s_per_gpu > fastest->prediction.tokens_per_s_per_gpu) fastest = &c;
  // The ranking's own ties are not a choice to explain.
  const double chosen = r.ranked.front().prediction.tokens_per_s_per_gpu;
  return fastest->prediction.tokens_per_s_per_gpu > chosen * (1.0 + kRankingTieFraction) ? fastest : nullptr;
}

std::vector<std::string> unmodelled_parallelism(const ModelSpec& m) {
  std::vector<std::string> out;
  if (m.moe)
    out.push_back(
        "expert parallelism beside tensor parallelism (--ep is priced with FSDP at tp 1, on "
        "runtimes that dispatch tokens: torchtitan's), and expert parallelism under DeepSpeed-MoE or Megatron-LM");
  if (m.mla) out.push_back("tensor parallelism of multi-head latent attention (the search ran " + m.name + " at tp 1)");
  if (m.vision) out.push_back("tensor parallelism of a vision tower (the search ran " + m.name + " at tp 1)");
  return out;
}

std::string model_summary(const ModelSpec& m, int64_t params) {
  return m.name + ": " + fmt("%.2fB", static_cast<double>(params) / kGB) + " params, " + std::to_string(m.num_layers) +
         " layers, hidden " + std::to_string(m.hidden_size) + ", heads " + std::to_string(m.num_heads) + "/" +
         std::to_string(m.num_kv_heads) + ", vocab " + std::to_string(m.vocab_size);
}

std::string format_plan_report(const PlanReportContext& ctx, const SearchResult& r, bool color) {
  const char* bold = color ? "\033[1m" : "";
  const char* dim = color ? "\033[2m" : "";
  const char* green = color ? "\033[32m" : "";
  const char* red = color ? "\033[31m" : "";
  const char* reset = color ? "\033[0m" : "";
  std::ostringstream o;
  const ModelSpec& m = *ctx.model;
  o << bold << "model   " << reset << model_summary(m, ctx.model_params) << "\n";
  o << bold << "cluster " << reset << ctx.cluster.nodes << " node(s) x " << ctx.cluster.gpus_per_node << " "
    << ctx.hardware->name << " = " << ctx.cluster.world_size() << " GPUs, "
    << format_gib(ctx.hardware->usable_device_memory.value) << " GiB usable each; runtime " << ctx.runtime->name
    << "; objective " << ctx.objective << "\n";
  // What the runtime runs, where its profile restricts it (section `runs`): the search tries nothing else.
  const RuntimeSupport& sup = ctx.runtime->support;
  if (!sup.strategies.empty() || !sup.offloads.empty() || !sup.ckpt_policies.empty() || !sup.wraps.empty())
    o << dim << "runtime " << ctx.runtime->name << " runs "
      << (sup.strategies.empty() ? std::string("every strategy") : sup.strategies_text()) << "; offload "
      << (sup.offloads.empty() ? std::string("none, optimizer, params") : sup.offloads_text()) << "; checkpointing "
      << (sup.ckpt_policies.empty() ? std::string("every policy") : sup.ckpt_policies_text()) << "; wrap "
      << (sup.wraps.empty() ? std::string("layer, every, size, model") : sup.wraps_text())
      << " (configs/runtimes, section runs: nothing else is searched)" << reset << "\n";
  // The links between nodes and the clock the profile prices, where they matter (docs/hardware.md).
  if (!ctx.hardware->device_is_host() && ctx.cluster.nodes > 1)
    o << bold << "network " << reset << network_summary(*ctx.hardware) << "\n";
  if (const std::string clocks = clock_summary(*ctx.hardware); !clocks.empty())
    o << bold << "clocks  " << reset << clocks << "\n";
  o << dim << "searched " << r.evaluated << " configurations (" << r.feasible << " feasible, " << r.pruned
    << " pruned by proven bounds) in " << fmt("%.3f", r.seconds) << " s; memory budget " << format_gib(r.budget_bytes)
    << " GiB per GPU" << reset << "\n";
  if (r.priced_as_twin > 0)
    o << dim << "  of them " << r.priced_as_twin
      << " fsdp-grad-op plans priced as their fsdp twin without resharding after forward (the same execution)" << reset
      << "\n";
  if (!r.mesh_offload_searched)
    o << dim
      << "offload was tried with data parallelism alone (no plan needed it under tp or pp; pin --offload to "
         "search it there)"
      << reset << "\n";
  // What the capability table (simulator/strategy/capabilities.hpp) refused, per rule, with one example.
  for (const auto& [rule, rr] : r.rejected)
    o << dim << "refused " << rr.count << " x " << rule << " (" << rr.example << ")" << reset << "\n";
  o << "\n";
  if (r.ranked.empty()) {
    o << red << bold << "No plan fits." << reset << " Per strategy family:\n";
    for (const FamilyRow& f : merge_families(r.families)) o << "  " << family_line(f.name, *f.verdict) << "\n";
    o << "Try more nodes (--nodes auto finds the fewest), a shorter --seq"
      << (sup.runs(Offload::Params) ? ", or --offload params.\n" : ".\n");
    // A model with routed experts on a runtime that dispatches no tokens: every rank gathers a layer's experts whole.
    if (ctx.model->moe && ctx.model->moe->num_experts > 1 && !sup.expert_parallel)
      o << "Expert parallelism (--ep) splits the routed experts over ranks; " << ctx.runtime->name
        << " does not run it, torchtitan's runtimes do (--runtime torchtitan).\n";
    for (const std::string& n : unmodelled_parallelism(*ctx.model)) o << "Not modelled: " << n << "\n";
    return o.str();
  }
  o << bold << "top plans" << reset << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-3s %-13s %-6s %-8s %-7s %-12s %-9s %-9s %-9s %9s %9s %8s %8s %6s %9s\n", "#",
                "strategy", "tp x pp", "wrap", "reshard", "ckpt", "offload", "dtypes", "mb x acc", "peak GiB",
                "headroom", "exposed", "step s", "MFU", "tok/s/GPU");
  o << line;
  const std::vector<PlanRow> rows = merge_identical(r.ranked, static_cast<size_t>(ctx.top_n));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Candidate& c = *rows[i].plan;
    const Strategy& s = c.strategy;
    const Prediction& p = c.prediction;
    std::string kind = rows[i].name_text();
    if (s.kind == StrategyKind::Hsdp) kind += ":" + std::to_string(s.hsdp_group);
    std::string dt = std::string(to_string(s.param_dtype)) + "/" + to_string(s.reduce_dtype);
    if (s.float8 != Float8Recipe::None) dt = std::string("f8") + (s.float8_all_gather ? "ag" : "") + "/" + dt;
    std::string mbacc = std::to_string(s.micro_batch) + " x " + std::to_string(s.grad_accum);
    // tp x pp, and the expert-parallel degree where the routed experts are split (1x1e8).
    const std::string mesh_cell = std::to_string(s.mesh.tp) + "x" + std::to_string(s.mesh.pp) +
                                  (s.mesh.ep > 1 ? "e" + std::to_string(s.mesh.ep) : "");
    double headroom = (p.usable_bytes - p.memory.device_total) / p.usable_bytes * 100.0;
    std::snprintf(line, sizeof line,
                  "  %s%-3zu %-13s %-6s %-8s %-7s %-12s %-9s %-9s %-9s %9s %8.1f%% %7.1f%% %8.3f %5.1f%% %9.0f%s\n",
                  i == 0 ? green : "", i + 1, kind.c_str(), mesh_cell.c_str(), wrap_name(s).c_str(),
                  shards_params(s.kind) ? (s.reshard_after_forward ? "yes" : "no") : "-", act_ckpt_name(s).c_str(),
                  to_string(s.offload), dt.c_str(), mbacc.c_str(), format_gib(p.memory.device_total).c_str(), headroom,
                  p.time.step_s > 0 ? p.time.exposed_comm_s / p.time.step_s * 100.0 : 0.0, p.time.step_s, p.mfu * 100.0,
                  p.tokens_per_s_per_gpu, i == 0 ? reset : "");
    o << line;
  }
  o << dim
    << "  (peak = device total incl. fragmentation, NCCL and context; exposed = communication not hidden"
       " behind compute, share of the step; a = b: the runtime runs both names identically)"
    << reset << "\n\n";
  const Candidate& best = r.ranked.front();
  SimulationContext sc{ctx.model, ctx.hardware, ctx.runtime, ctx.cluster, best.strategy};
  o << bold << "chosen plan" << reset << "\n" << format_simulation(sc, best.prediction, color);
  if (ctx.train_tokens > 0 && best.prediction.tokens_per_s_per_gpu > 0)
    o << training_run_line(ctx.train_tokens, ctx.cluster, training_run(ctx.train_tokens, ctx.cluster, best.prediction))
      << "\n";
  o << "\n";
  if (const Candidate* faster = faster_near_tie(ctx, r)) {
    o << "  near-tie: " << one_line_strategy(faster->strategy) << " rates "
      << fmt("%.1f", (faster->prediction.tokens_per_s_per_gpu / best.prediction.tokens_per_s_per_gpu - 1.0) * 100.0)
      << "% higher; within " << fmt("%.0f", kNearTieFraction * 100.0)
      << "% the simpler plan is chosen (no offload before offload, data parallelism alone before "
         "tp or pp, fewer collectives per step): the simulator's error is larger than the difference (README "
         "\"Accuracy\")\n\n";
  }
  o << bold << "why the others lose (best of each strategy family)" << reset << "\n";
  for (const FamilyRow& f : merge_families(r.families)) o << "  " << family_line(f.name, *f.verdict) << "\n";
  if (r.meshes.size() > 1) {
    o << bold << "best of each mesh shape (data parallel alone against tensor and pipeline parallelism)" << reset
      << "\n";
    for (const auto& [name, v] : r.meshes) o << "  " << family_line(name, v) << "\n";
  }
  return o.str();
}

nlohmann::json plan_report_json(const PlanReportContext& ctx, const SearchResult& r) {
  nlohmann::json j;
  if (!r.ranked.empty()) {
    nlohmann::json chosen = candidate_json(ctx, r.ranked.front());
    j["chosen"] = chosen;
    if (ctx.train_tokens > 0 && r.ranked.front().prediction.tokens_per_s_per_gpu > 0) {
      j["training"] =
          training_run_json(ctx.train_tokens, training_run(ctx.train_tokens, ctx.cluster, r.ranked.front().prediction));
    }
    if (const Candidate* faster = faster_near_tie(ctx, r)) j["near_tie_faster"] = candidate_json(ctx, *faster);
  } else {
    j["chosen"] = nullptr;
    j["not_modelled"] = unmodelled_parallelism(*ctx.model);
  }
  nlohmann::json cands = nlohmann::json::array();
  // One entry per plan the runtime runs identically under several names: `strategy_names` lists them.
  for (const PlanRow& row : merge_identical(r.ranked, static_cast<size_t>(ctx.top_n))) {
    nlohmann::json c = candidate_json(ctx, *row.plan);
    c["strategy_names"] = row.names;
    cands.push_back(c);
  }
  j["candidates"] = cands;
  nlohmann::json fam = nlohmann::json::object();
  for (const FamilyRow& f : merge_families(r.families)) {
    const FamilyVerdict& v = *f.verdict;
    const std::string& name = f.names.front();
    if (v.feasible && v.best) {
      fam[name] = {{"feasible", true}, {"best", candidate_json(ctx, *v.best)}};
    } else {
      fam[name] = {{"feasible", false}, {"reason", family_line(f.name, v)}, {"needed_bytes", v.needed_bytes}};
    }
    fam[name]["strategy_names"] = f.names;
    // The other names point at it rather than repeating its numbers.
    for (size_t k = 1; k < f.names.size(); ++k) fam[f.names[k]] = {{"feasible", v.feasible}, {"same_as", name}};
  }
  j["families"] = fam;
  nlohmann::json meshes = nlohmann::json::object();
  for (const auto& [name, v] : r.meshes) {
    if (v.feasible && v.best) {
      meshes[name] = {{"feasible", true}, {"best", candidate_json(ctx, *v.best)}};
    } else {
      meshes[name] = {{"feasible", false}, {"reason", family_line(name, v)}, {"needed_bytes", v.needed_bytes}};
    }
  }
  j["meshes"] = meshes;
  nlohmann::json refused = nlohmann::json::object();
  for (const auto& [rule, rr] : r.rejected) refused[rule] = {{"count", rr.count}, {"example", rr.example}};
  j["refused"] = refused;
  j["search"] = {{"evaluated", r.evaluated},
                 {"feasible", r.feasible},
                 {"pruned", r.pruned},
                 {"pruned_by_throughput", r.pruned_by_throughput},
                 {"priced_as_twin", r.priced_as_twin},
                 {"filtered", r.filtered},
                 {"seconds", r.seconds},
                 {"budget_bytes", r.budget_bytes},
                 {"mesh_offload_searched", r.mesh_offload_searched}};
  return j;
}

}  // namespace fsdp
