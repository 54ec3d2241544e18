// Chrome trace-event JSON of one simulated step (opens in Perfetto / chrome://tracing):
// one track per stream, one slice per op, and the allocated memory as a counter track.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "simulate.hpp"

namespace fsdp {

nlohmann::json chrome_trace(const StepProgram& program, const Prediction& prediction);
void write_chrome_trace(const std::string& path, const StepProgram& program, const Prediction& prediction);

}  // namespace fsdp
