// plan.yaml: the versioned file fsdp-plan writes and fsdp-run executes.
// Schema: docs/plan-format.md. Self-contained: it embeds the full model description.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "model/model_spec.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// Version 2 added strategy.grad_sync; a version-1 file reduces on every micro-batch, the only behaviour it could
// describe. Version 3 added the mesh beyond data parallelism (strategy.tp, sequence_parallel, async_tp, pp,
// pp_schedule, pp_virtual_stages); an older file is data parallel only. Version 4 added float8 linears
// (strategy.float8, float8_all_gather); an older file trains its linears in the compute dtype. Version 5 added
// strategy.train_vision (a vision-language model's trained vision parts); an older file trains them all. Version 6
// added strategy.ep (expert parallelism); an older file holds every routed expert on each rank. Version 7 added
// strategy.doc_len (packed documents attended one by one; 0: one a sequence); an older file has none.
inline constexpr int kPlanSchemaVersion = 7;

struct TrainingHyperparams {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  double momentum = 0.9;   // for sgd
};

struct ClusterShape {
  std::string hardware;  // hwprofile name, e.g. a100-80gb or cpu
  std::string device;    // "cuda" or "cpu"
  int64_t nodes = 1;
  int64_t gpus_per_node = 1;
  // Descriptive, for the reader (optional; fsdp-run does not use them): the profile's network between nodes and
  // the clocks it prices (hardware_profile.hpp network_summary, clock_summary), as the text report prints them.
  std::string network;
  std::string clocks;
  int64_t world_size() const { return nodes * gpus_per_node; }
};

// Predictions carried for comparison with a measured report (all bytes / seconds).
struct PlanPrediction {
  double peak_bytes = 0;
  // MemoryResult::peak_allocated_floor: the peak when the backend's gather buffers end before the compute they
  // overlap (CPU/Gloo plans). Key `peak_bytes_floor`, written only where it is below peak_bytes; absent: equal.
  double peak_bytes_floor = 0;
  // Whether the peak is predicted as a range, peak_bytes_floor to peak_bytes.
  bool peak_is_range() const { return peak_bytes_floor > 0 && peak_bytes_floor < peak_bytes; }
  double reserved_peak_bytes = 0;
  std::map<std::string, double> memory_breakdown;  // category name -> bytes at the peak
  double step_s = 0;
  double compute_s = 0;
  double exposed_comm_s = 0;
  double optimizer_phase_s = 0;  // TimelineResult::optimizer_phase_s
  // Whether the file recorded optimizer_phase_s: plans written before the key (schema 1, before 2026-11-30, 4ac5f3b)
  // lack it; `compare` then leaves that row out, and writing such a plan again leaves the key out.
  bool optimizer_phase_recorded = true;
  double tokens_per_s_per_gpu = 0;
};

struct PlanFile {
  int version = kPlanSchemaVersion;
  std::string model_name;
  // The Hugging Face model directory the model was read from (hf_model_directory; plan.yaml `model.path`, optional):
  // the exporters whose launchers load a local path name the model by it where their table has no name for it.
  std::string model_path;
  ModelSpec model;
  ClusterShape cluster;
  std::string runtime = "fsdp-run";
  Strategy strategy;
  TrainingHyperparams training;
  std::optional<PlanPrediction> prediction;
  std::string fsdp_run_command;
  std::string torchrun_command;
};

// Strict read: unknown keys, a newer version, missing keys -> InputError naming file:line:key.
PlanFile read_plan_file(const std::string& path);
PlanFile parse_plan_text(const std::string& text, const std::string& source_name);
std::string write_plan_text(const PlanFile& plan);
void write_plan_file(const PlanFile& plan, const std::string& path);

}  // namespace fsdp
