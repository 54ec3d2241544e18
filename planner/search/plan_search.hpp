// The planner's exhaustive search over one cost model (simulate()).
// Space: strategy x wrap x reshard-after-forward x activation checkpointing x offload x
// (param, reduce) dtypes x micro-batch (accumulation reaches the global batch) x HSDP group.
// Pruning uses only proven bounds:
//  - model states (the step program's persistent allocations) are a lower bound on the peak for every
//    micro-batch, so a combination whose persistent bytes exceed the budget is infeasible for all;
//  - peak memory never decreases with the micro-batch (activations, logits and working memory scale
//    with tokens), so once a micro-batch does not fit, larger ones are skipped.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "simulate.hpp"

namespace fsdp {

enum class Objective { Throughput, Memory, Cost };

// Knobs the user pinned on the command line; unset = searched.
struct SearchPins {
  std::optional<StrategyKind> strategy;
  std::optional<WrapPolicy> wrap;
  std::optional<bool> reshard_after_forward;
  std::optional<ActCkpt> act_ckpt;
  std::optional<int64_t> ckpt_every;  // with act_ckpt Full: every:N (absent: 1)
  std::optional<Offload> offload;
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<int64_t> micro_batch;
  std::optional<int64_t> grad_accum;
  std::optional<int64_t> hsdp_group;
};

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

struct SearchResult {
  std::vector<Candidate> ranked;                  // feasible candidates, best first
  std::vector<Candidate> evaluated_sample;        // every evaluated candidate (feasible or not), for scatter plots
  std::map<std::string, FamilyVerdict> families;  // strategy name -> verdict
  int64_t evaluated = 0;
  int64_t feasible = 0;
  int64_t pruned = 0;
  int64_t filtered = 0;  // rejected by SearchRequest::accept
  double seconds = 0;
  double budget_bytes = 0;
};

SearchResult search_plans(const SearchRequest& req);

// Sort key per objective (lower is better).
double objective_score(const Candidate& c, Objective o);

}  // namespace fsdp
