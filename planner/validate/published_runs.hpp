// Published training runs of other teams (tests/accuracy/published/*.yaml, format in SCHEMA.md there) and the
// simulator's prediction for each: the validation set of step time and memory. Pure functions over plain data:
// load the rows, map each onto the three inputs (model, hardware, strategy), simulate, summarise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory/memory_walk.hpp"

namespace fsdp {

// One measured run, with the knobs its source states (null in the file: nullopt / empty here).
struct PublishedRow {
  std::string source_id;  // the file's source.id
  std::string cite;       // the row's own citation, where a source file gathers several publications
  std::string id;
  std::string file;  // where it was read, for messages
  int line = 0;
  std::string model;       // a configs/models name (or a path), or a shape given in model_shape
  std::string model_yaml;  // model_shape rendered as a model file's keys (empty: `model` names one)
  std::string gpu;
  std::string hw;  // optional: the hardware profile of the row's cluster (hwprofiles/), else the GPU's
  std::optional<double> power_limit_w;
  int64_t gpus = 0;
  int64_t nodes = 0, gpus_per_node = 0;  // 0: not stated
  std::string intra_node;
  std::optional<int64_t> nics_per_node;
  std::optional<double> nic_bandwidth_gbps;
  std::optional<double> node_bandwidth_gbps;  // when the source states the node's total ("400 Gbps" a node)
  std::string fabric;
  std::string framework, framework_version, torch_version;
  std::string runtime;   // fsdp2 | fsdp1 | deepspeed | ddp
  std::string strategy;  // ddp | zero1 | zero2 | zero3 | fsdp | fsdp-grad-op | hsdp
  std::optional<int64_t> hsdp_shard_group;
  bool compile = false;
  std::string act_ckpt;
  // Where the source does not state the checkpointing but publishes what implies it (a hardware-FLOPs utilisation
  // beside the model-FLOPs one: their ratio counts the recomputed forward), how act_ckpt was inferred; the table
  // names it as an approximation ("" when act_ckpt is stated).
  std::string act_ckpt_inferred;
  // How micro_batch and grad_accum were inferred where the source does not state them but names the framework's
  // default that sets them (a pipeline's micro-batch count); empty: stated.
  std::string micro_batch_inferred;
  std::string param_dtype, reduce_dtype;
  // Optional: the dtype of the parameters the optimizer updates and of its states (LitGPT's bf16-true, DeepSpeed's
  // bf16 master weights); absent, fp32 masters, mixed precision's default in every framework of the set.
  std::string master_dtype;
  // Optional: a kernel library the run swaps into the model (liger: Strategy::kernels); another is not modelled.
  std::string kernel_library;
  std::string grad_sync;  // optional: "last-micro-batch" (no_sync accumulation); absent: every micro-batch
  // The device mesh beyond data parallelism (optional keys; absent: 1, i.e. data parallel alone): the
  // tensor-parallel degree with or without sequence parallelism and async TP, the pipeline stages and schedule.
  int64_t tp = 1;
  bool sequence_parallel = true;
  bool async_tp = false;
  int64_t pp = 1;
  std::string pp_schedule;  // gpipe, 1f1b, interleaved-1f1b (required with pp > 1)
  int64_t pp_virtual_stages = 1;
  bool fp8 = false;
  // With fp8: torchao's recipe ("tensorwise", "rowwise") and whether FSDP all-gathers the weights in float8, where the
  // source states them (empty / nullopt: not stated, priced as torchao's and torchtitan's defaults and said).
  std::string float8_recipe;
  // The shipped runtime profile describing the source's framework at its stated commit, where the framework's default
  // profile (the framework and compile flag's) describes another (configs/runtimes/torchtitan-2506-compile.yaml for
  // torchtitan six months after torchtitan-compile's commit); empty: the default.
  std::string runtime_profile;
  std::optional<bool> float8_all_gather;
  int64_t micro_batch = 0, seq = 0;  // 0: not stated
  std::optional<int64_t> grad_accum;
  std::string attention, optimizer, offload;
  struct Measured {
    std::optional<double> tokens_per_s_per_gpu, step_time_s, mfu, tflops_per_gpu, peak_memory_gib;
    std::string memory_kind;  // reserved | allocated | nvidia-smi | empty
    // Optional: the peak allocated from the end of the micro-batches' backward through the optimizer step (a
    // max_memory_allocated() read after reset_peak_memory_stats() there: nanotron's "Mem Alloc").
    std::optional<double> step_peak_allocated_gib;
    // Whose memory a pipeline row's figures are (pp > 1, required there): the first stage's (the rank that logged it:
    // nanotron's benchmark CSV is written by world rank 0, pipeline stage 0) or the largest over the stages (a
    // source that reports the maximum over ranks). Empty on a row without pipeline stages.
    std::string memory_of;
  } measured;
};

struct PublishedSource {
  std::string id, title, cite, url, file;
  std::vector<std::string> independent_of;
  std::vector<PublishedRow> rows;
};

// Every *.yaml of `dir` (SCHEMA.md is not one); strict: an unknown or missing key is an InputError naming the
// file, line and key. Row ids are unique over the whole set.
std::vector<PublishedSource> load_published_runs(const std::string& dir);

// The constants of the cost model that were fitted on published rows: tests/accuracy/published/fitted.txt, one
// "<row id> <constant>" a line. A row listed there is an in-sample check and is reported apart: for the quantity
// the constant names by its prefix ("time: ...", "memory: ..."), for both without one.
std::vector<std::pair<std::string, std::string>> load_fitted_rows(const std::string& dir);

struct RowResult {
  const PublishedRow* row = nullptr;
  bool simulated = false;
  std::string not_simulated;  // why, when a knob the row states is not modelled (fp8, a GPU without a profile)
  std::string hardware, runtime, plan;      // what it was priced with
  std::vector<std::string> approximations;  // knobs priced by a neighbour (named in the table, never silent)
  std::string attention;                    // attention sdpa: the kernel its dispatch chose ("sdpa -> flash")
  std::optional<double> predicted_tokens_per_s, measured_tokens_per_s, time_error;
  std::optional<double> predicted_memory_gib, measured_memory_gib, memory_error;
  // The step window's allocated peak (Measured::step_peak_allocated_gib; MemoryResult::peak_allocated_after_backward).
  std::optional<double> predicted_step_allocated_gib, measured_step_allocated_gib, step_allocated_error;
  bool fits = true;
  // Where the predicted step goes (simulator/timeline/timeline.hpp TimelineResult) and the predicted device memory
  // against the GPU's usable memory: whether a row is bound by compute or by communication, and how close to full;
  // where its allocated peak happens and what is live then, by category (fragmentation, NCCL and workspace included).
  // `fsdp-plan validate --breakdown TEXT` prints it (validate/row_breakdown.hpp).
  struct Breakdown {
    double step_s = 0, compute_s = 0, comm_s = 0, exposed_comm_s = 0, contention_s = 0, optimizer_phase_s = 0;
    // A mesh row's parts of the step (TimelineResult): tp collectives and pipeline transfers (in exposed_comm_s),
    // the schedule's fill and drain and the other stages' reduction tails (neither in exposed_comm_s).
    double tp_comm_s = 0, pp_comm_s = 0, pipeline_bubble_s = 0, pipeline_reduction_chain_s = 0;
    bool mesh = false;
    double device_total_gib = 0, usable_gib = 0;
    double peak_allocated_gib = 0, reserved_peak_gib = 0;
    std::string peak_phase;
    MemoryBreakdown memory{};  // bytes
  };
  std::optional<Breakdown> breakdown;
  bool fitted = false;         // some constant was fitted on this row
  bool fitted_time = false;    // on its step time (a constant without a "memory:" prefix)
  bool fitted_memory = false;  // on its memory (a constant without a "time:" prefix)
};

// Simulates one row with the profiles under `config_root`; never throws for a knob it does not model (that row
// is returned not simulated, with the reason) but does for malformed input.
RowResult evaluate_published_row(const PublishedRow& row, const std::string& config_root);

struct ErrorSummary {
  int rows = 0;
  double median_abs = 0, max_abs = 0, mean = 0;
};
ErrorSummary summarise(const std::vector<double>& errors);

struct ValidationReport {
  std::vector<PublishedSource> sources;
  std::vector<RowResult> results;
};
ValidationReport validate_published(const std::string& dir, const std::string& config_root);

// The table (one line a row: source, row, knobs, predicted, measured, error), the rows with a second memory
// measurement (the step window's allocated peak), then format_validation_summary; the rows not simulated with their
// reasons.
std::string format_validation(const ValidationReport& r);
// The median and max lines: all rows, held-out rows only, every knob stated, how many rows are within the goal
// (time 10%, memory 8%), and by source, for time and for memory; the step window's allocated peak over its rows.
// README "Accuracy on published runs" holds a copy (a test keeps it equal; `fsdp-plan validate --summary`).
std::string format_validation_summary(const ValidationReport& r);

}  // namespace fsdp
