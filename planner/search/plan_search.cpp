#include "search/plan_search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/errors.hpp"
#include "report/prediction_view.hpp"

namespace fsdp {

double objective_score(const Candidate& c, Objective o) {
  switch (o) {
    case Objective::Throughput:
      return c.prediction.tokens_per_s_per_gpu > 0 ? -c.prediction.tokens_per_s_per_gpu : 0;
    case Objective::Memory:
      return c.prediction.memory.device_total;
    case Objective::Cost:
      return c.gpu_hours;
  }
  return 0;
}

namespace {

template <typename T>
std::vector<T> pinned_or(const std::optional<T>& pin, std::vector<T> all) {
  if (pin) return {*pin};
  return all;
}

// Fewer collectives per step and less state to manage ranks lower (simpler).
int simplicity_rank(const Strategy& s) {
  int base = 0;
  switch (s.kind) {
    case StrategyKind::Ddp:
      base = 0;
      break;
    case StrategyKind::NoShard:
      base = 1;
      break;
    case StrategyKind::Zero1:
      base = 2;
      break;
    case StrategyKind::Zero2:
      base = 3;
      break;
    case StrategyKind::FsdpGradOp:
      base = 4;
      break;
    case StrategyKind::Fsdp:
      base = 5;
      break;
    case StrategyKind::Zero3:
      base = 6;
      break;
    case StrategyKind::Hsdp:
      base = 7;
      break;
  }
  return base * 4 + (s.offload == Offload::None ? 0 : s.offload == Offload::Optimizer ? 1 : 2);
}

// Sum of the persistent (model-state) allocations: a lower bound on the peak for any micro-batch.
double persistent_bytes(const StepProgram& p) {
  double t = 0;
  for (const MemEvent& e : p.persistent) t += e.bytes;
  return t;
}

std::string gib_text(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", b / kGiB);
  return buf;
}

}  // namespace

SearchResult search_plans(const SearchRequest& req) {
  FSDP_ASSERT(req.graph && req.hardware && req.runtime, "search needs graph, hardware, runtime");
  auto t0 = std::chrono::steady_clock::now();
  SearchResult res;
  const int64_t world = req.cluster.world_size();
  const double usable = req.hardware->usable_device_memory.value;
  const double budget = usable * (1.0 - req.memory_headroom);
  res.budget_bytes = budget;
  const ModelSpec& m = req.graph->spec();

  std::vector<StrategyKind> kinds = pinned_or(
      req.pins.strategy, {StrategyKind::Ddp, StrategyKind::NoShard, StrategyKind::Zero1, StrategyKind::Zero2,
                          StrategyKind::Fsdp, StrategyKind::Zero3, StrategyKind::FsdpGradOp, StrategyKind::Hsdp});
  std::vector<WrapPolicy> wraps;
  if (req.pins.wrap) {
    wraps = {*req.pins.wrap};
  } else {
    wraps.push_back(WrapPolicy{WrapKind::Layer, 1, 0});
    for (int64_t k : {2, 4})
      if (k < m.num_layers) wraps.push_back(WrapPolicy{WrapKind::EveryK, k, 0});
    wraps.push_back(WrapPolicy{WrapKind::Model, 1, 0});
  }
  // Checkpointing policies searched: none, ours (selective: the attention core) and full; torchtitan's every:N and
  // per-op policy (selective-op) only when pinned (--act-ckpt every:2, selective-op). Searching every:2 and
  // selective-op too makes `fsdp-plan --model 70b --nodes 8` evaluate 2,314 configurations instead of 1,460 (+58%,
  // measured one pinned search per mode on the 2-core build machine: 5 modes took 1.8x the time of today's 3), so
  // the README's 0.45 s search would take about 0.8 s: not well under a second. Each sits between none and full in
  // memory and time (tests/simulator/test_checkpoint_modes.cpp), so pinning one is a question of matching a
  // framework's run, not of finding a plan the three searched modes miss.
  struct Ckpt {
    ActCkpt mode;
    int64_t every;
  };
  std::vector<Ckpt> ckpts;
  if (req.pins.act_ckpt) {
    ckpts = {{*req.pins.act_ckpt, req.pins.ckpt_every.value_or(1)}};
  } else {
    ckpts = {{ActCkpt::None, 1}, {ActCkpt::Selective, 1}, {ActCkpt::Full, 1}};
  }
  std::vector<Offload> offloads = pinned_or(req.pins.offload, {Offload::None, Offload::Optimizer, Offload::Params});
  struct Dt {
    DType param, reduce;
  };
  std::vector<Dt> dtypes;
  for (DType p : {DType::Bf16, DType::Fp32})
    for (DType r : {DType::Fp32, DType::Bf16}) {
      if (p == DType::Fp32 && r != DType::Fp32) continue;
      if (req.pins.param_dtype && *req.pins.param_dtype != p) continue;
      if (req.pins.reduce_dtype && *req.pins.reduce_dtype != r) continue;
      dtypes.push_back({p, r});
    }
  if (dtypes.empty() && req.pins.param_dtype && req.pins.reduce_dtype)
    dtypes.push_back({*req.pins.param_dtype, *req.pins.reduce_dtype});
  std::vector<int64_t> micro_batches;
  if (req.pins.micro_batch) {
    micro_batches = {*req.pins.micro_batch};
  } else {
    for (int64_t b = 1; b <= req.max_micro_batch; b *= 2) micro_batches.push_back(b);
  }

  auto consider_family = [&](const Candidate& c) {
    std::string fam = to_string(c.strategy.kind);
    FamilyVerdict& v = res.families[fam];
    if (c.feasible) {
      if (!v.feasible || objective_score(c, req.objective) < objective_score(*v.best, req.objective)) v.best = c;
      v.feasible = true;
      v.reason.clear();
    } else if (!v.feasible) {
      if (!v.best || c.prediction.memory.device_total < v.best->prediction.memory.device_total) {
        v.best = c;
        v.reason = c.infeasible_reason;
        v.needed_bytes = c.prediction.memory.device_total;
      }
    }
  };

  for (StrategyKind kind : kinds) {
    const bool sharded = shards_params(kind);
    std::vector<int64_t> groups{0};
    if (kind == StrategyKind::Hsdp) {
      groups.clear();
      if (req.pins.hsdp_group) {
        groups.push_back(*req.pins.hsdp_group);
      } else {
        // Node-aligned shard groups strictly smaller than the world (a full-world group is plain FSDP).
        const int64_t g = req.cluster.gpus_per_node;
        for (int64_t size = g; size < world; size *= 2)
          if (world % size == 0) groups.push_back(size);
      }
      if (groups.empty()) {
        res.families[to_string(kind)].reason = "needs more than one node (a shard group smaller than the world)";
        continue;
      }
    }
    std::vector<WrapPolicy> kind_wraps = sharded ? wraps : std::vector<WrapPolicy>{WrapPolicy{WrapKind::Layer, 1, 0}};
    std::vector<bool> reshards{true};
    if (kind == StrategyKind::Fsdp || kind == StrategyKind::Zero3 || kind == StrategyKind::Hsdp)
      reshards = {true, false};
    if (kind == StrategyKind::FsdpGradOp) reshards = {false};
    if (req.pins.reshard_after_forward) reshards = {*req.pins.reshard_after_forward};
    for (int64_t group : groups)
      for (const WrapPolicy& wrap : kind_wraps)
        for (bool reshard : reshards)
          for (const Ckpt& ck : ckpts)
            for (Offload off : offloads) {
              // Param offload needs sharded params (FSDP CPUOffload); DDP and no-shard have no offload at all
              // (ZeRO-Offload needs a ZeRO stage: DeepSpeed docs, "ZeRO-Offload").
              if (off == Offload::Params && !sharded) continue;
              if (off != Offload::None && (kind == StrategyKind::Ddp || kind == StrategyKind::NoShard)) continue;
              for (const Dt& dt : dtypes) {
                // The pruning bound: at a fixed accumulation regime (one micro-batch per step, or several) the peak
                // never falls as the micro-batch grows (tests/planner/test_search_pruning.cpp checks it over every
                // knob of six zoo models). Across regimes it can: with several micro-batches the accumulated
                // gradient shard is held through the next reduction, with one it is not: by at most the step's
                // gradient storage (and its share of fragmentation). So a line pruned while it accumulates is
                // taken up again where the accumulation reaches 1, unless the plan that stopped it was over the
                // budget by more than that.
                bool stop_micro = false;
                bool stopped_accumulating = false;  // the regime the line was pruned in
                double stopped_excess = 0;          // how far over the budget less the gradients the stopping plan was
                for (int64_t mb : micro_batches) {
                  const double per_step_tokens = static_cast<double>(mb * req.base.seq_len * world);
                  const int64_t accum =
                      req.pins.grad_accum
                          ? *req.pins.grad_accum
                          : std::max<int64_t>(1, std::llround(req.global_batch_tokens / per_step_tokens));
                  if (stop_micro && stopped_accumulating && accum == 1 && stopped_excess <= 0) stop_micro = false;
                  if (stop_micro) {
                    ++res.pruned;
                    continue;
                  }
                  Strategy s = req.base;
                  s.kind = kind;
                  s.hsdp_group = group;
                  s.wrap = wrap;
                  s.reshard_after_forward = reshard;
                  s.act_ckpt = ck.mode;
                  s.ckpt_every = ck.every;
                  s.offload = off;
                  s.param_dtype = dt.param;
                  s.reduce_dtype = dt.reduce;
                  s.micro_batch = mb;
                  s.grad_accum = accum;
                  // The user's grad_sync last-micro-batch holds for the candidates it applies to (plan_command
                  // says so); the others reduce as they always do.
                  if (!grad_sync_applies(s)) s.grad_sync = GradSync::EveryMicroBatch;
                  if (req.accept && !req.accept(s)) {
                    ++res.filtered;
                    continue;
                  }
                  if (!req.pins.micro_batch && !req.pins.grad_accum && mb > 1 &&
                      per_step_tokens > req.global_batch_tokens * 1.5) {
                    ++res.pruned;  // overshoots the global batch: not the batch the user asked for
                    continue;
                  }
                  SimulationInput in{req.graph, req.hardware, req.runtime, req.cluster, s};
                  StepProgram prog;
                  Candidate c;
                  c.strategy = s;
                  c.prediction = simulate(in, &prog);
                  // Per-op detail is only needed for the chosen plan's trace; drop it here.
                  c.prediction.memory.samples = {};
                  c.prediction.time.ops = {};
                  ++res.evaluated;
                  const Prediction& p = c.prediction;
                  // A few KiB of allocator rounding can make the peak dip as the micro-batch doubles (rounded
                  // categories clamped at zero); a plan within that of the budget does not prune its line.
                  constexpr double kRoundingSlack = 64.0 * 1024.0;
                  if (p.memory.device_total > budget) {
                    c.feasible = false;
                    double states = persistent_bytes(prog);
                    c.infeasible_reason = "needs " + gib_text(p.memory.device_total) + " GiB per GPU (model states " +
                                          gib_text(states) + ", peak in " + p.memory.peak_phase + ") > " +
                                          gib_text(budget) + " GiB budget";
                    // Proven: larger micro-batches in this accumulation regime only add memory.
                    if (p.memory.device_total > budget + kRoundingSlack) {
                      stop_micro = true;
                      stopped_accumulating = s.grad_accum > 1;
                      const MemoryBreakdown st = model_state_bytes(prog);
                      const double grads = st[static_cast<size_t>(MemoryCategory::ShardedGrads)] +
                                           st[static_cast<size_t>(MemoryCategory::UnshardedGrads)];
                      stopped_excess =
                          p.memory.device_total - grads * (1.0 + req.runtime->fragmentation_fraction) - budget;
                    }
                  } else if (!p.host_fits) {
                    c.feasible = false;
                    c.infeasible_reason = "needs " + gib_text(p.memory.host_bytes_per_node) +
                                          " GiB of host RAM per node > " + gib_text(req.hardware->host_memory.value) +
                                          " GiB";
                  } else {
                    c.feasible = true;
                    ++res.feasible;
                  }
                  if (req.train_tokens > 0 && p.tokens_per_s_per_gpu > 0) {
                    constexpr double kSecondsPerHour = 3600.0;
                    c.gpu_hours = req.train_tokens / (p.tokens_per_s_per_gpu * static_cast<double>(world)) *
                                  static_cast<double>(world) / kSecondsPerHour;
                  }
                  consider_family(c);
                  res.evaluated_sample.push_back(c);
                  if (c.feasible) res.ranked.push_back(std::move(c));
                }
              }
            }
  }
  // Ties (within 0.1%) go to the plan with more memory headroom.
  std::stable_sort(res.ranked.begin(), res.ranked.end(), [&](const Candidate& a, const Candidate& b) {
    double sa = objective_score(a, req.objective), sb = objective_score(b, req.objective);
    constexpr double kTieFraction = 1e-3;
    if (std::fabs(sa - sb) > kTieFraction * std::max(std::fabs(sa), std::fabs(sb))) return sa < sb;
    return a.prediction.memory.device_total < b.prediction.memory.device_total;
  });
  // Near-ties go to the simpler strategy: within kNearTie of the best throughput, a plan with fewer
  // collectives per step (DDP before ZeRO-1/2, before full sharding) is chosen, since the simulator's
  // step-time error is larger than the difference (README "Accuracy") and the simpler plan has less to
  // go wrong; the FSDP paper (Zhao et al. 2023, arXiv 2304.11277, sec. 7) likewise recommends DDP when
  // the model fits.
  if (req.objective == Objective::Throughput && res.ranked.size() > 1) {
    constexpr double kNearTie = 0.05;
    const double best = res.ranked.front().prediction.tokens_per_s_per_gpu;
    size_t pick = 0;
    for (size_t i = 1; i < res.ranked.size(); ++i) {
      const Candidate& c = res.ranked[i];
      if (c.prediction.tokens_per_s_per_gpu < best * (1.0 - kNearTie)) break;
      if (simplicity_rank(c.strategy) < simplicity_rank(res.ranked[pick].strategy)) pick = i;
    }
    if (pick != 0)
      std::rotate(res.ranked.begin(), res.ranked.begin() + static_cast<long>(pick),
                  res.ranked.begin() + static_cast<long>(pick) + 1);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace fsdp
