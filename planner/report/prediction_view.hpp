// Views of a Prediction: JSON for scripts, readable text for people. Both read the same plain data.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "planfile/plan_file.hpp"
#include "simulate.hpp"

namespace fsdp {

struct SimulationContext {
  const ModelSpec* model = nullptr;
  const HardwareProfile* hardware = nullptr;
  const RuntimeProfile* runtime = nullptr;
  Cluster cluster;
  Strategy strategy;
};

nlohmann::json strategy_to_json(const Strategy& s);
nlohmann::json prediction_to_json(const Prediction& p);
// What plan.yaml carries of a prediction, for `fsdp-plan compare` and fsdp-run's closing table.
PlanPrediction plan_prediction(const Prediction& p);
// The full `simulate --json` document: model, inputs, memory, time, throughput, fits.
nlohmann::json simulation_to_json(const SimulationContext& ctx, const Prediction& p);

// Readable breakdown (GiB, peak phase, fits). `color` adds ANSI colour.
std::string format_simulation(const SimulationContext& ctx, const Prediction& p, bool color);
std::string format_gib(double bytes);
std::string one_line_strategy(const Strategy& s);
// The mesh beyond data parallelism: "tp=8+sp pp=2(1f1b)".
std::string mesh_text(const MeshSpec& m);

}  // namespace fsdp
