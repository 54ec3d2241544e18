// The planner's exhaustive search over one cost model (simulate()).
// Space: mesh shape (tp x pp) x strategy x wrap x reshard-after-forward x activation checkpointing x offload x
// (param, reduce) dtypes x micro-batch (accumulation reaches the global batch) x HSDP group. Combinations the
// capability table refuses are counted, not simulated.
// Pruning uses only proven bounds:
//  - model states (the step program's persistent allocations) are a lower bound on the peak for every
//    micro-batch, so a combination whose persistent bytes exceed the budget is infeasible for all;
//  - peak memory never decreases with the micro-batch (activations, logits and working memory scale
//    with tokens), so once a micro-batch does not fit, larger ones are skipped.
//  - the model-state bound: a plan's persistent allocations (parameters, gradients and optimizer states kept through
//    the step) depend on the mesh, the strategy, its HSDP group, offload and dtypes, not on the wrap but for the
//    padding of each unit's flat buffer to the shard group (under 32 B per element of padding, at most shard-size
//    elements per unit, units at most layers + 1), nor on checkpointing or the micro-batch; they are alive at the
//    peak, so once one plan of such a line is simulated, a line whose persistent bytes less that padding exceed the
//    budget is skipped whole (every plan the search simulates after the first of its key checks the premise); and
//    with them what the first micro-batch's forward saves (alive at its last forward op), per (mesh, checkpointing,
//    micro-batch, accumulation, compute dtype, sharded or not, wrap), skips single plans. Either skips only where
//    the plan cannot be the smallest unfit plan its family or mesh shape reports when none of theirs fits.
//  - the throughput bound (objective throughput or cost, which ranks as throughput does): a plan's step is at least
//    the compute its stage's layers, head and loss must run on the compute stream, K times, plus interleaved 1F1B's
//    bubble over it (plan_search.cpp step_compute_lower_bound, with the proof); that compute depends only on the
//    mesh, checkpointing, micro-batch, accumulation and compute dtype, so it is priced once per such key, from the
//    first plan simulated there. A plan is skipped only if that bound keeps it below every result it could change:
//    the keep_top best rates so far (less the 0.1% within which ties are decided by memory), the best rate less the
//    5% near-tie within which a simpler plan is preferred, and the best feasible plan of its strategy family and of
//    its mesh shape. Rates only rise as the search goes on, so a skipped plan stays below them: the ranked top
//    keep_top, the chosen plan and every family's and mesh shape's verdict are those of the exhaustive search
//    (tests/planner/test_mesh_search.cpp compares both).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "simulate.hpp"

namespace fsdp {

// The ranking's ties: objective scores within this fraction of each other are ordered by memory headroom.
inline constexpr double kRankingTieFraction = 1e-3;
// The near-tie: under the throughput objective, the simplest plan within this fraction of the best rate is chosen
// (plan_search.cpp simplicity_rank).
inline constexpr double kNearTieFraction = 0.05;

enum class Objective { Throughput, Memory, Cost };

// Knobs the user pinned on the command line; unset = searched.
struct SearchPins {
  std::optional<StrategyKind> strategy;
  std::optional<WrapPolicy> wrap;
  std::optional<bool> reshard_after_forward;
  std::optional<ActCkpt> act_ckpt;
  std::optional<int64_t> ckpt_every;    // with act_ckpt Full: every:N (absent: 1)
  std::optional<double> ckpt_fraction;  // with act_ckpt Full: fraction:P (absent: 0, not used)
  std::optional<Offload> offload;
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<int64_t> micro_batch;
  std::optional<int64_t> grad_accum;
  std::optional<int64_t> hsdp_group;
  std::optional<int64_t> tp;  // tensor-parallel degree (searched: 1, 2, 4, 8 up to the GPUs per node)
  std::optional<int64_t> pp;  // pipeline stages (searched: powers of two up to the layers and the world / tp)
  // expert-parallel degree (searched for a model with routed experts: powers of two dividing them, up to a node;
  // rule ExpertParallel refuses the rest)
  std::optional<int64_t> ep;
};

// How far a plan's step may exceed the requested global batch: the search skips micro-batches above 1 whose single
// accumulation step takes more than this times the batch (not the batch the user asked for), and the report says
// where even micro-batch 1 does (plan_command.cpp).
inline constexpr double kGlobalBatchOvershoot = 1.5;

struct SearchRequest {
  const ModuleGraph* graph = nullptr;
  const HardwareProfile* hardware = nullptr;
  const RuntimeProfile* runtime = nullptr;
  Cluster cluster;
  Strategy base;  // seq, optimizer, method, attention, prefetch: not searched
  SearchPins pins;
  double global_batch_tokens = 0;  // target tokens per optimizer step
  double memory_headroom = 0.05;   // fraction of usable memory kept free
  Objective objective = Objective::Throughput;
  double train_tokens = 0;  // for Objective::Cost
  int64_t max_micro_batch = 64;
  // Candidates this returns false for are skipped before they are simulated (counted in `filtered`): how a caller
  // restricts the search to what a framework can run (planner/export/target_search.hpp) without the search knowing
  // about frameworks.
  std::function<bool(const Strategy&)> accept;
  // The model-state, activation and throughput bounds (above): the results they keep exact, and whether to use them
  // (tests compare both; the micro-batch bound is always on).
  int64_t keep_top = 10;
  bool bound_pruning = true;
  // fsdp-grad-op plans priced as their fsdp twin without resharding after forward, not simulated again (the same
  // execution; tests compare both).
  bool price_twins = true;
};

struct Candidate {
  Strategy strategy;
  Prediction prediction;
  bool feasible = false;
  std::string infeasible_reason;
  double gpu_hours = 0;  // for --tokens
};

struct FamilyVerdict {
  bool feasible = false;
  std::optional<Candidate> best;  // best feasible, or the smallest-memory infeasible one
  std::string reason;             // why none fits (with numbers)
  double needed_bytes = 0;
};

// Combinations the capability table (simulator/strategy/capabilities.hpp) refuses: counted per rule, never
// simulated, with the first refusal's reason as the example the report shows.
struct RejectedRule {
  int64_t count = 0;
  std::string example;
};

struct SearchResult {
  std::vector<Candidate> ranked;                  // feasible candidates, best first
  std::vector<Candidate> evaluated_sample;        // every evaluated candidate (feasible or not), for scatter plots
  std::map<std::string, FamilyVerdict> families;  // strategy name -> verdict
  std::map<std::string, FamilyVerdict> meshes;    // mesh shape ("tp=8+sp pp=2(1f1b)", mesh_text) -> verdict
  std::map<std::string, RejectedRule> rejected;   // capability rule summary -> count and example
  int64_t evaluated = 0;
  int64_t feasible = 0;
  int64_t filtered = 0;              // rejected by SearchRequest::accept
  int64_t pruned = 0;                // by the bounds, all of them
  int64_t pruned_by_throughput = 0;  // of which by the throughput bound
  // Of the evaluated, the fsdp-grad-op plans priced as their fsdp twin without resharding after forward (the same
  // execution: plan_search.cpp), not simulated again.
  int64_t priced_as_twin = 0;
  double seconds = 0;
  double budget_bytes = 0;
  // Whether tp/pp meshes were tried with offload: when --offload is pinned, or in a second pass when no plan fit
  // without it (search_plans; `seconds` counts both passes).
  bool mesh_offload_searched = false;
};

SearchResult search_plans(const SearchRequest& req);

// Sort key per objective (lower is better).
double objective_score(const Candidate& c, Objective o);

}  // namespace fsdp
