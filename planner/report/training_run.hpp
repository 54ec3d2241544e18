// The training run of `--tokens N` on a plan: its GPU-hours, its days on the cluster and its optimizer steps, from
// the plan's predicted tokens/s per GPU and tokens per step. The plan report (the chosen plan) and the node sweep
// (each size's chosen plan) print it; `--objective cost` ranks by the same GPU-hours (plan_search.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "hardware/cluster.hpp"
#include "simulate.hpp"

namespace fsdp {

struct TrainingRun {
  double gpu_hours = 0;
  double days = 0;   // wall clock on the cluster
  double steps = 0;  // optimizer steps, the last one partial rounded up
};

// `train_tokens` over the plan on `cluster`; the plan's rate must be positive.
TrainingRun training_run(double train_tokens, const Cluster& cluster, const Prediction& p);

// "  training 2.00T tokens: 147.13k GPU-hours, 383.1 days on these 16 GPUs (476838 optimizer steps)".
std::string training_run_line(double train_tokens, const Cluster& cluster, const TrainingRun& t);

// Its --json object: tokens, gpu_hours, days, optimizer_steps.
nlohmann::json training_run_json(double train_tokens, const TrainingRun& t);

// A count with the decimal suffix it is quoted with: 2.00T tokens, 147.13k GPU-hours, 950.
std::string count_text(double v);

}  // namespace fsdp
