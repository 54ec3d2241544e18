#include "search/plan_search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <tuple>

#include "core/errors.hpp"
#include "program/pipeline_parallel.hpp"
#include "report/prediction_view.hpp"
#include "strategy/capabilities.hpp"
#include "strategy/placement.hpp"

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

// No host offload ranks lower (simpler) than any offload, then data parallelism alone than tp or pp (and one of them
// than both), then fewer collectives per step and less state to manage: offload adds the host's memory, its CPU
// optimizer and the PCIe copies to what a run depends on, tp adds collectives on every layer's critical path and pp
// a schedule, a bubble and stage transfers, where the simulator's errors are largest (README "Accuracy": the
// published pipeline rows' are 12-45%, the data-parallel rows' median 3%).
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
  constexpr int kStrategyKinds = 8, kMeshLevels = 4;
  const int mesh = (s.mesh.tp > 1 ? 1 : 0) + (s.mesh.pp > 1 ? 1 : 0) + (s.mesh.ep > 1 ? 1 : 0);
  return ((s.offload == Offload::None        ? 0
           : s.offload == Offload::Optimizer ? 1
                                             : 2) *
              kMeshLevels +
          mesh) *
             kStrategyKinds +
         base;
}

// Sum of the persistent (model-state) allocations: a lower bound on the peak for any micro-batch.
double persistent_bytes(const StepProgram& p) {
  double t = 0;
  for (const MemEvent& e : p.persistent) t += e.bytes;
  return t;
}

// A lower bound on the step time of every plan that shares this program's mesh, checkpointing, micro-batch,
// accumulation and compute dtype (plan_search.hpp, "the throughput bound"): every such plan's compute stream runs,
// per micro-batch, a forward over each of its stage's decoder layers (one GEMM pass, one attention forward), a
// backward over each (its gradient passes, the recomputation its mode adds, one attention backward) and, on the
// stage holding the head (the last, or nanotron's head stage before the loss's), the head's GEMMs, whatever its
// data-parallel strategy, wrap, resharding or offload; these ops cost what op_duration prices for their layers' shapes,
// which those knobs do not change. The timeline's compute stream runs its ops one after another (and the accumulation's
// middle micro-batches at least as long as their compute), so the step is at least K x that. Interleaved 1F1B's bubble
// adds (pp - 1) / v x at least that much again; GPipe's and 1F1B's fill and drain run through the other stages at their
// own paces (simulate.cpp, pipeline_fill_drain_s), which may hold fewer layers and no head, so nothing is added for
// them.
double step_compute_lower_bound(const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s) {
  const OpPrices prices = price_layers(p, hw, s);
  Op f;
  f.kind = OpKind::Forward;
  f.first_layer = p.layout.stage_first_layer;
  f.last_layer = p.layout.stage_last_layer;
  f.gemm_passes = 1;
  f.attn_fwd_passes = 1;
  Op b = f;
  b.kind = OpKind::Backward;
  // Frozen vision blocks run no backward (StepProgram::frozen_layers).
  b.first_layer = std::max(b.first_layer, p.frozen_layers);
  if (b.first_layer > b.last_layer) b.first_layer = b.last_layer = -1;
  b.gemm_passes = s.method == Method::Full ? 2.0 : 1.0;
  b.attn_fwd_passes = 0;
  b.attn_bwd_passes = 1;
  double micro_batch = op_duration(f, p, hw, c, s, prices) + op_duration(b, p, hw, c, s, prices);
  if (p.layout.holds_head()) {
    Op l;
    l.kind = OpKind::Loss;
    l.head_passes = 1;
    Op lb;
    lb.kind = OpKind::LossBackward;
    lb.head_passes = 2;
    micro_batch += op_duration(l, p, hw, c, s, prices) + op_duration(lb, p, hw, c, s, prices);
  }
  const bool interleaved = s.mesh.pp_schedule == PipelineSchedule::Interleaved1F1B;
  return static_cast<double>(s.grad_accum) * micro_batch + (interleaved ? pipeline_bubble_s(s.mesh, micro_batch) : 0.0);
}

std::string gib_text(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", b / kGiB);
  return buf;
}

}  // namespace

namespace {

// One pass over the space; `mesh_offload`: whether tp/pp meshes are tried with offload too (search_plans).
SearchResult search_pass(const SearchRequest& req, bool mesh_offload) {
  FSDP_ASSERT(req.graph && req.hardware && req.runtime, "search needs graph, hardware, runtime");
  auto t0 = std::chrono::steady_clock::now();
  SearchResult res;
  const int64_t world = req.cluster.world_size();
  const double usable = req.hardware->usable_device_memory.value;
  const double budget = usable * (1.0 - req.memory_headroom);
  res.budget_bytes = budget;
  const ModelSpec& m = req.graph->spec();
  // What the plans' step programs derive alike (wrap units, layer-class costs), once for the search
  // (program/emit_memo.hpp): exact, keyed by every input of those derivations.
  EmitMemo memo;

  std::vector<StrategyKind> kinds = pinned_or(
      req.pins.strategy, {StrategyKind::Ddp, StrategyKind::NoShard, StrategyKind::Zero1, StrategyKind::Zero2,
                          StrategyKind::Fsdp, StrategyKind::Zero3, StrategyKind::FsdpGradOp, StrategyKind::Hsdp});
  // Unpinned, the strategies and offload modes the runtime runs (its profile's `runs`); a pinned one it does not run is
  // refused by the capability table below, by name.
  const RuntimeSupport runtime_support = req.runtime ? req.runtime->support : RuntimeSupport{};
  if (!req.pins.strategy) std::erase_if(kinds, [&](StrategyKind k) { return !runtime_support.runs(k); });
  std::vector<WrapPolicy> wraps;
  if (req.pins.wrap) {
    wraps = {*req.pins.wrap};
  } else {
    wraps.push_back(WrapPolicy{WrapKind::Layer, 1, 0});
    for (int64_t k : {2, 4})
      if (k < m.num_layers) wraps.push_back(WrapPolicy{WrapKind::EveryK, k, 0});
    wraps.push_back(WrapPolicy{WrapKind::Model, 1, 0});
    // Those the runtime builds (its profile's runs.wrap): torchtitan and DeepSpeed one decoder layer a unit.
    std::erase_if(wraps, [&](const WrapPolicy& w) { return !runtime_support.runs(w.kind); });
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
    double fraction;
  };
  std::vector<Ckpt> ckpts;
  if (req.pins.act_ckpt) {
    ckpts = {{*req.pins.act_ckpt, req.pins.ckpt_every.value_or(1), req.pins.ckpt_fraction.value_or(0.0)}};
  } else {
    ckpts = {{ActCkpt::None, 1, 0.0}, {ActCkpt::Selective, 1, 0.0}, {ActCkpt::Full, 1, 0.0}};
    // Those the runtime runs (its profile's runs.act_ckpt): the attention-core policy is fsdp-run's.
    std::erase_if(ckpts, [&](const Ckpt& c) {
      Strategy probe;
      probe.act_ckpt = c.mode;
      return !runtime_support.runs(policy_of(probe));
    });
  }
  std::vector<Offload> offloads = pinned_or(req.pins.offload, {Offload::None, Offload::Optimizer, Offload::Params});
  if (!req.pins.offload) std::erase_if(offloads, [&](Offload o) { return !runtime_support.runs(o); });
  struct Dt {
    DType param, reduce;
  };
  // The compute dtypes bf16 and fp32 (or the pinned one: fp16 too), each reducing in fp32 or in itself.
  std::vector<Dt> dtypes;
  const std::vector<DType> params =
      req.pins.param_dtype ? std::vector<DType>{*req.pins.param_dtype} : std::vector<DType>{DType::Bf16, DType::Fp32};
  for (DType p : params) {
    std::vector<DType> reduces{DType::Fp32};
    if (p != DType::Fp32) reduces.push_back(p);
    for (DType r : reduces)
      if (!req.pins.reduce_dtype || *req.pins.reduce_dtype == r) dtypes.push_back({p, r});
  }
  if (dtypes.empty() && req.pins.param_dtype && req.pins.reduce_dtype)
    dtypes.push_back({*req.pins.param_dtype, *req.pins.reduce_dtype});
  std::vector<int64_t> micro_batches;
  if (req.pins.micro_batch) {
    micro_batches = {*req.pins.micro_batch};
  } else {
    for (int64_t b = 1; b <= req.max_micro_batch; b *= 2) micro_batches.push_back(b);
  }

  auto consider_verdict = [&](FamilyVerdict& v, const Candidate& c) {
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
  auto consider_family = [&](const Candidate& c) {
    consider_verdict(res.families[to_string(c.strategy.kind)], c);
    consider_verdict(res.meshes[mesh_text(c.strategy.mesh)], c);
  };
  // The throughput bound: per (mesh, checkpointing, micro-batch, accumulation, compute dtype), a lower bound on the
  // step time from the first plan simulated there (step_compute_lower_bound), and the results a plan could join.
  const bool bound_pruning =
      req.bound_pruning && (req.objective == Objective::Throughput || req.objective == Objective::Cost);
  using BoundKey = std::tuple<int64_t, int64_t, ActCkpt, int64_t, int64_t, int64_t, DType, int64_t>;
  std::map<BoundKey, double> compute_bound;
  std::vector<double> top_rates;  // the req.keep_top best feasible rates so far, a min-heap
  double best_rate = 0;
  auto note_feasible = [&](double rate) {
    best_rate = std::max(best_rate, rate);
    top_rates.push_back(rate);
    std::push_heap(top_rates.begin(), top_rates.end(), std::greater<>());
    if (static_cast<int64_t>(top_rates.size()) > req.keep_top) {
      std::pop_heap(top_rates.begin(), top_rates.end(), std::greater<>());
      top_rates.pop_back();
    }
  };
  auto cannot_matter = [&](const Strategy& s, double step_lower_bound_s) {
    if (!bound_pruning || step_lower_bound_s <= 0) return false;
    // tokens/s per GPU the plan cannot exceed (simulate.cpp: tokens per replica over its tp x pp ranks).
    const double ceiling = static_cast<double>(s.micro_batch * s.seq_len * s.grad_accum) /
                           static_cast<double>(s.mesh.model_parallel()) / step_lower_bound_s;
    // Below what ties and near-ties compare: the ranking's 0.1% ties, the 5% near-tie of the simpler plan.
    auto below = [&](double rate) { return ceiling < rate * (1.0 - kRankingTieFraction); };
    if (static_cast<int64_t>(top_rates.size()) < req.keep_top || !below(top_rates.front())) return false;
    if (!(ceiling < best_rate * (1.0 - kNearTieFraction))) return false;
    for (const FamilyVerdict* v : {&res.families[to_string(s.kind)], &res.meshes[mesh_text(s.mesh)]})
      if (!v->feasible || !v->best || !below(v->best->prediction.tokens_per_s_per_gpu)) return false;
    return true;
  };
  // The model-state bound: per (mesh, strategy, HSDP group, offload, dtypes) the persistent allocations of the first
  // plan simulated there, less what padding can change between wraps (plan_search.hpp).
  using StatesKey = std::tuple<int64_t, int64_t, StrategyKind, int64_t, Offload, DType, DType, int64_t>;
  auto states_key = [](StrategyKind k, int64_t group, Offload off, DType p, DType r, const MeshSpec& ms) {
    return StatesKey{ms.tp, ms.pp, k, group, off, p, r, ms.ep};
  };
  std::map<StatesKey, double> states_bound;
  const double padding_bytes_per_element = 32.0;  // every persistent copy of one element: params, grads, states
  auto note_states = [&](const StatesKey& key, double persistent, double device_total, int64_t shard_size) {
    const double padding =
        static_cast<double>(m.num_layers + 1) * static_cast<double>(shard_size) * padding_bytes_per_element;
    auto it = states_bound.find(key);
    if (it == states_bound.end()) {
      states_bound[key] = persistent - padding;
      return;
    }
    // The bound's premise, checked on every plan simulated after the first of its key.
    FSDP_ASSERT(device_total >= it->second,
                "a plan below its line's model-state bound: persistent allocations "
                "depend on a knob the bound assumes they do not");
  };
  // Whether a plan of this strategy and mesh whose device total is at least `lower_bound` bytes cannot change the
  // result: over the budget, and not below the smallest unfit plan its family and its mesh shape report (when they
  // have no plan that fits).
  auto unfit_cannot_matter = [&](StrategyKind kind, const MeshSpec& ms, double lower_bound) {
    constexpr double kRoundingSlack = 64.0 * 1024.0;
    if (!req.bound_pruning || !(lower_bound > budget + kRoundingSlack)) return false;
    for (const FamilyVerdict* v : {&res.families[to_string(kind)], &res.meshes[mesh_text(ms)]})
      if (!v->feasible && (!v->best || lower_bound < v->needed_bytes)) return false;
    return true;
  };
  auto states_exceed = [&](const StatesKey& key, double plus, StrategyKind kind, const MeshSpec& ms) {
    const auto it = states_bound.find(key);
    return it != states_bound.end() && unfit_cannot_matter(kind, ms, it->second + plus);
  };
  // The activation bound: what the first micro-batch's forward saves is alive, with the states, when its last
  // forward op has run; per (mesh, checkpointing, micro-batch, accumulation, compute dtype, sharded or replicated
  // parameters, wrap) it is the same for every plan (the wrap decides a unit-wide checkpoint region; sharding the
  // parameters decides autocast's fp32 residual stream).
  using ActKey =
      std::tuple<int64_t, int64_t, ActCkpt, int64_t, int64_t, int64_t, DType, bool, WrapKind, int64_t, int64_t>;
  std::map<ActKey, double> act_bound;
  // What the first micro-batch's forward saves (the activation bound's measure of a program).
  auto forward_activation_bytes = [](const StepProgram& prog) {
    double act = 0;
    for (const Op& op : prog.ops) {
      if (op.kind == OpKind::Backward || op.kind == OpKind::LossBackward) break;
      for (const MemEvent& e : op.on_issue)
        if (e.category == MemoryCategory::Activations) act += e.bytes;
    }
    return act;
  };
  auto note_activations = [&](const ActKey& key, double act, double above_states) {
    auto it = act_bound.find(key);
    if (it == act_bound.end()) {
      act_bound[key] = act;
      return;
    }
    // The bound's premise, checked on every later plan of its key.
    FSDP_ASSERT(above_states >= it->second * (1.0 - 1e-9), "a plan below its activation bound");
  };
  // The fragmentation-aware activation bound, the activation bound made stronger by what the memory walk adds to
  // the peak it allocates (memory/memory_walk.cpp walk): on a CUDA device the device total is the allocated peak,
  // plus fragmentation_fraction x the dynamic memory at that peak (allocated less the persistent states; the reduce
  // stream's cached pool only adds), plus the NCCL communicators' buffers (>= 0) and the CUDA context; or the usable
  // memory where cap_reserved_at_device cut the fragmentation (the cap applies only where the peak itself fits, so
  // the total is never below the smaller of the two). The peak is at least the allocation when the first
  // micro-batch's last forward op has run, where the states and what that forward saved are alive (the activation
  // bound's premise): the dynamic memory at the peak is at least those activations, so the device total is at least
  // min(usable, states + activations x (1 + fragmentation_fraction) + context). On a host device (a CPU run) the walk
  // adds none of these: states + activations. Less the search's 64 KiB allocator-rounding slack (a few KiB of
  // rounding on frees). With the line's model-state bound for the states, and asserted on every plan simulated
  // where both of its keys are known.
  const bool cuda_device = !req.hardware->device_is_host();
  auto act_lower_bound = [&](double states, double act) {
    constexpr double kRoundingSlack = 64.0 * 1024.0;
    const double plain = states + act;  // the activation bound as it was (no cap: it holds uncapped)
    if (!cuda_device) return plain;
    const double walked = std::min(usable, states + act * (1.0 + req.runtime->fragmentation_fraction) +
                                               req.runtime->context_memory.value) -
                          kRoundingSlack;
    return std::max(plain, walked);
  };
  // The capability table's refusals: counted per rule, the first one's reason kept as the report's example.
  const MeshWorld mesh_world{world, req.cluster.gpus_per_node};
  // What the runtime runs (its profile's `mesh` and `runs` sections): the search never proposes a plan it refuses.
  const RuntimeSupport& support = runtime_support;
  // A mesh shape is probed under plain FSDP without offload, whatever strategies the runtime runs.
  RuntimeSupport shape_support = support;
  shape_support.strategies.clear();
  shape_support.offloads.clear();
  // The model's FLOPs per token (MFU) are the same for every plan: the language model's sequence and the method.
  const double flops_per_token =
      model_flops_per_token(*req.graph, language_model_strategy(req.base, m).seq_len, req.base.method != Method::Full,
                            req.base.train_vision, req.base.doc_len);
  auto refused_by = [&](const Strategy& s, const RuntimeSupport& by) {
    const std::optional<CapabilityViolation> v = first_violation(s, m, mesh_world, by);
    if (!v) return false;
    RejectedRule& r = res.rejected[to_string(v->rule)];
    if (r.count++ == 0) r.example = v->flag + ": " + v->reason;
    return true;
  };
  auto refused = [&](const Strategy& s) { return refused_by(s, support); };

  // What the search reads of a simulated plan's program beyond its prediction: the bounds' measures and the stopping
  // rule's.
  struct ProgramFacts {
    double states_bytes = 0;         // persistent (model-state) bytes
    double grads_bytes = 0;          // of which the gradients
    int64_t shard_size = 1;          // the data-parallel shard group's size
    double forward_activations = 0;  // what the first micro-batch's forward saves
  };
  struct Twin {
    Prediction prediction;
    ProgramFacts facts;
  };
  auto search_mesh = [&](const MeshSpec& mesh) {
    // fsdp's plans without resharding after forward, by the text of their fsdp-grad-op twin (strategy_identity).
    std::map<std::string, Twin> grad_op_twins;
    const int64_t dp = mesh.dp(world);
    for (StrategyKind kind : kinds) {
      const bool sharded = shards_params(kind);
      std::vector<int64_t> groups{0};
      if (uses_shard_groups(kind)) {
        groups.clear();
        if (req.pins.hsdp_group) {
          groups.push_back(*req.pins.hsdp_group);
        } else {
          // Node-aligned shard groups strictly smaller than the data-parallel ranks (a group of all of them is plain
          // FSDP): a node holds gpus_per_node / tp of them.
          const int64_t g = std::max<int64_t>(2, req.cluster.gpus_per_node / mesh.tp);
          for (int64_t size = g; size < dp; size *= 2)
            if (dp % size == 0) groups.push_back(size);
        }
        if (groups.empty()) {
          res.families[to_string(kind)].reason = "needs more than one node (a shard group smaller than the world)";
          continue;
        }
      }
      std::vector<WrapPolicy> kind_wraps = sharded ? wraps : std::vector<WrapPolicy>{WrapPolicy{WrapKind::Layer, 1, 0}};
      std::vector<bool> reshards = reshard_choices(kind);
      if (req.pins.reshard_after_forward) reshards = {*req.pins.reshard_after_forward};
      for (int64_t group : groups)
        for (const WrapPolicy& wrap : kind_wraps)
          for (bool reshard : reshards)
            for (const Ckpt& ck : ckpts)
              for (Offload off : offloads) {
                if (off != Offload::None && !mesh_offload && !mesh.is_data_parallel_only()) continue;
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
                  double stopped_excess = 0;  // how far over the budget less the gradients the stopping plan was
                  for (int64_t mb : micro_batches) {
                    const double per_step_tokens = static_cast<double>(mb * req.base.seq_len * dp);
                    const int64_t accum =
                        req.pins.grad_accum
                            ? *req.pins.grad_accum
                            : std::max<int64_t>(1, std::llround(req.global_batch_tokens / per_step_tokens));
                    Strategy s = req.base;
                    s.kind = kind;
                    s.hsdp_group = group;
                    s.wrap = wrap;
                    s.reshard_after_forward = reshard;
                    s.act_ckpt = ck.mode;
                    s.ckpt_every = ck.every;
                    s.ckpt_fraction = ck.fraction;
                    s.offload = off;
                    s.param_dtype = dt.param;
                    s.reduce_dtype = dt.reduce;
                    s.micro_batch = mb;
                    s.grad_accum = accum;
                    s.mesh = mesh;
                    // The user's grad_sync last-micro-batch holds for the candidates it applies to (plan_command
                    // says so); the others reduce as they always do.
                    if (!grad_sync_applies(s)) s.grad_sync = GradSync::EveryMicroBatch;
                    // So does the float8 all-gather, for FSDP's candidates (fsdp, fsdp-grad-op, hsdp); the others
                    // gather nothing or gather ZeRO-3 partitions in the compute dtype.
                    if (!fsdp_family(kind)) s.float8_all_gather = false;
                    // What the capability table refuses (offload without a ZeRO stage, ZeRO-2/3 with pp, ...): not a
                    // point of the space (search_space.hpp), counted apart.
                    if (refused(s)) continue;
                    // What the caller's filter refuses (a framework that cannot express the plan: --target).
                    if (req.accept && !req.accept(s)) {
                      ++res.filtered;
                      continue;
                    }
                    if (stop_micro && stopped_accumulating && accum == 1 && stopped_excess <= 0) stop_micro = false;
                    const StatesKey skey = states_key(kind, group, off, dt.param, dt.reduce, mesh);
                    if (!stop_micro && states_exceed(skey, 0.0, kind, mesh)) {
                      // The model-state bound: the line's states alone exceed the budget, at every micro-batch.
                      stop_micro = true;
                      stopped_accumulating = false;
                    }
                    const ActKey akey{mesh.tp,  mesh.pp, ck.mode,   ck.every,     mb,     accum,
                                      dt.param, sharded, wrap.kind, wrap.every_k, mesh.ep};
                    if (!stop_micro) {
                      // States and this micro-batch's forward activations together: this plan does not fit (larger
                      // micro-batches are left to the memory bound along the line once one of them is simulated).
                      const auto a = act_bound.find(akey);
                      const auto st = states_bound.find(skey);
                      if (a != act_bound.end() && st != states_bound.end() &&
                          unfit_cannot_matter(kind, mesh, act_lower_bound(st->second, a->second))) {
                        ++res.pruned;
                        continue;
                      }
                    }
                    if (stop_micro) {
                      ++res.pruned;
                      continue;
                    }
                    if (!req.pins.micro_batch && !req.pins.grad_accum && mb > 1 &&
                        per_step_tokens > req.global_batch_tokens * kGlobalBatchOvershoot) {
                      ++res.pruned;  // overshoots the global batch: not the batch the user asked for
                      continue;
                    }
                    SimulationInput in{req.graph, req.hardware, req.runtime, req.cluster, s, flops_per_token};
                    in.memo = &memo;
                    in.memory_samples = false;  // dropped below: per-op detail is for the chosen plan's trace
                    // The throughput bound (plan_search.hpp): a plan whose pure compute already makes it slower
                    // than every result it could join is not simulated.
                    const BoundKey bkey{mesh.tp, mesh.pp, s.act_ckpt, s.ckpt_every, mb, accum, s.param_dtype, mesh.ep};
                    if (const auto it = compute_bound.find(bkey);
                        it != compute_bound.end() && cannot_matter(s, it->second)) {
                      ++res.pruned;
                      ++res.pruned_by_throughput;
                      continue;
                    }
                    Candidate c;
                    c.strategy = s;
                    ProgramFacts facts;
                    const auto twin = req.price_twins && kind == StrategyKind::FsdpGradOp
                                          ? grad_op_twins.find(strategy_identity(s))
                                          : grad_op_twins.end();
                    if (twin != grad_op_twins.end()) {
                      // fsdp-grad-op runs as fsdp without resharding after forward (strategy/placement.cpp
                      // unit_placement: every other field of the placement, and so the step program, the same):
                      // its twin's prediction and program facts, bit for bit (tests/planner/test_search_twins.cpp).
                      c.prediction = twin->second.prediction;
                      facts = twin->second.facts;
                      ++res.priced_as_twin;
                    } else {
                      StepProgram prog;
                      c.prediction = simulate(in, &prog);
                      facts.states_bytes = persistent_bytes(prog);
                      const MemoryBreakdown st = model_state_bytes(prog);
                      facts.grads_bytes = st[static_cast<size_t>(MemoryCategory::ShardedGrads)] +
                                          st[static_cast<size_t>(MemoryCategory::UnshardedGrads)];
                      facts.shard_size = prog.layout.shard_size;
                      facts.forward_activations = forward_activation_bytes(prog);
                      if (bound_pruning && compute_bound.find(bkey) == compute_bound.end())
                        compute_bound[bkey] = step_compute_lower_bound(prog, *req.hardware, req.cluster, s);
                      // Per-op detail is only needed for the chosen plan's trace; drop it here.
                      c.prediction.memory.samples = {};
                      c.prediction.time.ops = {};
                      if (req.price_twins && kind == StrategyKind::Fsdp && !s.reshard_after_forward) {
                        Strategy grad_op = s;
                        grad_op.kind = StrategyKind::FsdpGradOp;
                        grad_op_twins[strategy_identity(grad_op)] = Twin{c.prediction, facts};
                      }
                    }
                    note_states(skey, facts.states_bytes, c.prediction.memory.device_total, facts.shard_size);
                    note_activations(akey, facts.forward_activations,
                                     c.prediction.memory.device_total - facts.states_bytes);
                    // The fragmentation-aware activation bound's premise, on every plan evaluated (both keys are
                    // known now: this plan's or an earlier one's).
                    FSDP_ASSERT(c.prediction.memory.device_total >=
                                    act_lower_bound(states_bound.at(skey), act_bound.at(akey)) * (1.0 - 1e-9),
                                "a plan below its line's states plus its key's activations, fragmented");
                    // The compute bound's premise, on every plan of its key.
                    if (const auto known = compute_bound.find(bkey); bound_pruning && known != compute_bound.end())
                      FSDP_ASSERT(c.prediction.time.step_s >= known->second * (1.0 - 1e-9),
                                  "a plan faster than its key's compute lower bound");
                    ++res.evaluated;
                    const Prediction& p = c.prediction;
                    // A few KiB of allocator rounding can make the peak dip as the micro-batch doubles (rounded
                    // categories clamped at zero); a plan within that of the budget does not prune its line.
                    constexpr double kRoundingSlack = 64.0 * 1024.0;
                    if (p.memory.device_total > budget) {
                      c.feasible = false;
                      c.infeasible_reason = "needs " + gib_text(p.memory.device_total) + " GiB per GPU (model states " +
                                            gib_text(facts.states_bytes) + ", peak in " + p.memory.peak_phase + ") > " +
                                            gib_text(budget) + " GiB budget";
                      // Proven: larger micro-batches in this accumulation regime only add memory. Less the step
                      // segments (memory_walk.hpp MemoryResult::step_segments): a larger micro-batch's larger blocks
                      // may hold the step's blocks that needed segments of their own, so only the rest is proven.
                      const double proven = p.memory.device_total - p.memory.step_segments;
                      if (proven > budget + kRoundingSlack) {
                        stop_micro = true;
                        stopped_accumulating = s.grad_accum > 1;
                        stopped_excess =
                            proven - facts.grads_bytes * (1.0 + req.runtime->fragmentation_fraction) - budget;
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
                    if (c.feasible && bound_pruning) note_feasible(c.prediction.tokens_per_s_per_gpu);
                    res.evaluated_sample.push_back(c);
                    if (c.feasible) res.ranked.push_back(std::move(c));
                  }
                }
              }
    }
  };
  // Mesh shapes: tensor parallelism inside a node (1, 2, 4, 8 up to its GPUs), pipeline stages in powers of two up
  // to the layers and the GPUs; the schedule, virtual stages, sequence parallelism and async TP are the base's
  // (CLI flags). A shape the table refuses (heads, kv heads, the MLP width or the GPUs not divided) is counted once.
  std::vector<int64_t> tps, pps;
  if (req.pins.tp) {
    tps = {*req.pins.tp};
  } else {
    constexpr int64_t kMaxSearchedTp = 8;
    for (int64_t t = 1; t <= std::min(kMaxSearchedTp, req.cluster.gpus_per_node); t *= 2) tps.push_back(t);
  }
  if (req.pins.pp) {
    pps = {*req.pins.pp};
  } else {
    for (int64_t p = 1; p <= m.num_layers && p <= world; p *= 2) pps.push_back(p);
  }
  // Expert parallelism for a model with routed experts: powers of two that divide them, up to the GPUs of a node
  // (torchtitan's ep groups are consecutive ranks; a larger one crosses the NICs on every MoE block), beside tp 1
  // only (ep beside tp is not priced: not tried, and a pinned one is refused by rule ExpertParallel,
  // as a runtime that dispatches no tokens refuses every ep shape, counted once per shape).
  std::vector<int64_t> eps{1};
  if (req.pins.ep) {
    eps = {*req.pins.ep};
  } else if (m.moe && m.moe->num_experts > 1) {
    for (int64_t e = 2; e <= std::min(m.moe->num_experts, req.cluster.gpus_per_node); e *= 2)
      if (m.moe->num_experts % e == 0) eps.push_back(e);
  }
  for (int64_t tp : tps)
    for (int64_t pp : pps)
      for (int64_t ep : eps) {
        MeshSpec mesh = req.base.mesh;
        mesh.tp = tp;
        mesh.pp = pp;
        mesh.ep = ep;
        if (ep > 1 && tp > 1 && !req.pins.ep) continue;
        {
          // The shape itself, under a plain FSDP plan: a refusal here is the shape's, whatever the other knobs.
          Strategy probe = req.base;
          probe.mesh = mesh;
          probe.kind = StrategyKind::Fsdp;
          probe.hsdp_group = 0;
          probe.offload = Offload::None;
          probe.grad_sync = GradSync::EveryMicroBatch;
          probe.grad_accum = mesh.pp_schedule == PipelineSchedule::Interleaved1F1B ? pp : 1;
          if (refused_by(probe, shape_support)) continue;
        }
        if (!req.pins.pp && m.num_layers % (pp * mesh.pp_virtual_stages) != 0) {
          // Searched: stages of equal layers (the brief's and Megatron-LM's rule: num_layers divisible by pp); an
          // uneven split (torchtitan's, pipeline_parallel.hpp stage_layers) is priced when --pp pins it.
          RejectedRule& r = res.rejected["pipeline stages of unequal layers (priced when --pp pins them)"];
          if (r.count++ == 0)
            r.example = "--pp: " + std::to_string(m.num_layers) + " layers do not split evenly over pp " +
                        std::to_string(pp) + " x " + std::to_string(mesh.pp_virtual_stages) + " virtual stages";
          continue;
        }
        search_mesh(mesh);
      }
  // Ties (within 0.1%) go to the plan with more memory headroom; under the memory objective, whose score is that
  // headroom, to the faster plan (plans of one footprint can differ many times in speed: fp32 against bf16 compute).
  std::stable_sort(res.ranked.begin(), res.ranked.end(), [&](const Candidate& a, const Candidate& b) {
    double sa = objective_score(a, req.objective), sb = objective_score(b, req.objective);
    if (std::fabs(sa - sb) > kRankingTieFraction * std::max(std::fabs(sa), std::fabs(sb))) return sa < sb;
    if (req.objective == Objective::Memory)
      return a.prediction.tokens_per_s_per_gpu > b.prediction.tokens_per_s_per_gpu;
    return a.prediction.memory.device_total < b.prediction.memory.device_total;
  });
  // Near-ties go to the simpler plan (simplicity_rank): within kNearTieFraction of the best throughput, a plan with
  // fewer collectives per step (no mesh before a mesh, DDP before ZeRO-1/2, before full sharding) is chosen, since the
  // simulator's step-time error is larger than the difference (README "Accuracy") and the simpler plan has less to go
  // wrong; the FSDP paper (Zhao et al. 2023, arXiv 2304.11277, sec. 7) likewise recommends DDP when the model fits.
  if (req.objective == Objective::Throughput && res.ranked.size() > 1) {
    const double best = res.ranked.front().prediction.tokens_per_s_per_gpu;
    size_t pick = 0;
    for (size_t i = 1; i < res.ranked.size(); ++i) {
      const Candidate& c = res.ranked[i];
      if (c.prediction.tokens_per_s_per_gpu < best * (1.0 - kNearTieFraction)) break;
      if (simplicity_rank(c.strategy) < simplicity_rank(res.ranked[pick].strategy)) pick = i;
    }
    if (pick != 0)
      std::rotate(res.ranked.begin(), res.ranked.begin() + static_cast<long>(pick),
                  res.ranked.begin() + static_cast<long>(pick) + 1);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Nothing held offload back from a mesh where the search tries no offload at all (the runtime runs none).
  res.mesh_offload_searched =
      mesh_offload || std::none_of(offloads.begin(), offloads.end(), [](Offload o) { return o != Offload::None; });
  return res;
}

}  // namespace

SearchResult search_plans(const SearchRequest& req) {
  // Offload under tp/pp triples the meshes' part of the space (70B on 8 nodes: 5,672 -> 15,561 configurations) and
  // wins where memory is short: it is searched when --offload is pinned, or in a second pass when no plan fits
  // without it.
  const bool pinned = req.pins.offload.has_value();
  SearchResult res = search_pass(req, pinned);
  if (!res.ranked.empty() || pinned) return res;
  SearchResult wide = search_pass(req, true);
  wide.seconds += res.seconds;
  return wide;
}

}  // namespace fsdp
