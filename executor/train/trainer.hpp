// The training loop of fsdp-run: plan -> model + strategy -> steps -> measured report.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "memory/memory_category.hpp"
#include "planfile/plan_file.hpp"
#include "program/step_trace.hpp"

namespace fsdp::exec {

class Comm;
class ShardedModel;

struct RunConfig {
  int64_t steps = 10;  // total steps to reach (counted from the start, also on resume)
  uint64_t seed = 0;
  int64_t log_every = 1;
  std::string data = "synthetic";
  std::string data_dtype = "uint16";
  int emulate_world_size = 0;  // > 0: rehearsal of rank 0 of a plan of this world size
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep_checkpoints = 2;
  std::string resume_dir;
  bool resume_any = false;  // --resume-any: continue a checkpoint of another seed or plan
  std::string init_from;    // safetensors file or directory with an index json
  std::string plan_path;    // for the report and checkpoint manifests
};

struct StepStat {
  int64_t step = 0;
  double loss = 0;
  double time_s = 0;
  double tokens_per_s = 0;
  double grad_norm = 0;
  double comm_wait_s = 0;  // blocked waiting for collectives (exposed communication)
  // From the last backward's return to the step's end: gradient clipping (its norm and all-reduce), the
  // optimizer, zero_grad and the loss all-reduce (the simulator's optimizer phase).
  double optimizer_phase_s = 0;
  bool skipped = false;  // fp16 overflow: step skipped, loss scale lowered
};

struct RunResult {
  std::vector<StepStat> steps;
  int world_size = 1;
  bool emulated = false;
  int64_t peak_bytes = 0;  // max over ranks
  std::vector<int64_t> peak_bytes_per_rank;
  std::string peak_phase;                                 // rank 0's phase at its peak (MemTracker::set_phase)
  std::array<int64_t, kNumMemoryCategories> breakdown{};  // of the rank with the highest peak
  bool comm_upcast = false;
  std::string backend;
  int64_t num_params = 0;
  double loss_scale = 0;  // fp16 only
  int64_t resumed_from = 0;
  // The plan's attention and what this build ran of it (model/transformer.hpp executed_attention: eager where
  // LibTorch has no fused attention).
  AttentionImpl attention_planned = AttentionImpl::Sdpa;
  AttentionImpl attention_ran = AttentionImpl::Sdpa;
  // The last step's collectives and unit ops, in issue order (rank 0), and the wrap units' names.
  std::vector<TraceEntry> trace;
  std::vector<std::string> unit_names;
};

// InputError naming what fsdp-run cannot run in this plan (model, strategy, dtype on this device):
// the launcher checks it once before starting ranks, and every rank again.
void check_plan_runnable(const PlanFile& plan);
// InputError for flags that contradict each other (a checkpoint interval without a directory, ...): checked like
// check_plan_runnable, before any rank starts.
void check_run_config(const RunConfig& cfg);

class Trainer {
 public:
  // Validates the plan against this launch (world size, device) and, before the first step, every input it will
  // use (issue M11): the data file's ids against the vocabulary (each rank scans its share), the checkpoint
  // directory (rank 0 takes its lock, which also proves it writable, and checks the free space for one
  // checkpoint), the --init-from weights, the checkpoint resumed. InputError on every rank if any rank refuses.
  Trainer(const PlanFile& plan, const RunConfig& cfg, Comm& comm);
  ~Trainer();
  RunResult run(std::ostream* log);
  ShardedModel& model();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The JSON report of a run (issue 5 "CLI and report").
std::string report_json(const PlanFile& plan, const RunConfig& cfg, const RunResult& r);

}  // namespace fsdp::exec
