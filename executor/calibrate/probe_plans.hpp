// The models and plans `fsdp-run calibrate` runs as probes (LibTorch-free): the host-overhead probes' decoder
// shapes, the step probe's plan, and the elementwise bytes the simulator counts for a probe's passes.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "model/model_spec.hpp"
#include "planfile/plan_file.hpp"
#include "runtime/runtime_profile.hpp"

namespace fsdp::exec::cal {

// The probes of host_overhead and elementwise_bandwidth: decoder layers of the zoo's Llama shape (RMSNorm,
// RoPE, grouped-query attention, SwiGLU; configs/models/README.md). The first is so narrow that its
// arithmetic is negligible (the per-pass host time); the others widen the tokens, the hidden size, the FFN
// and the vocabulary apart so that the elementwise bytes the simulator counts for each pass vary
// independently of each other.
struct ProbeShape {
  int64_t tokens, hidden, heads, kv_heads, head_dim, ffn, vocab;
  int layers;  // layers of the long run; per layer = (long - 0-layer run) / layers
};
constexpr std::array<ProbeShape, 4> kProbeShapes{{{32, 32, 2, 1, 16, 32, 64, 4},
                                                  {96, 160, 5, 1, 32, 432, 768, 2},
                                                  {256, 64, 4, 2, 16, 128, 256, 2},
                                                  {64, 256, 8, 4, 32, 640, 2048, 2}}};

// The probe's model (configs/models schema), parsed.
ModelSpec probe_model(const ProbeShape& p);

// The elementwise bytes the simulator charges each pass of the probe (simulator/program/step_program.cpp:
// one layer's forward and backward, the head + loss forward and backward), for the runtime `rt` at batch 1 x
// `tokens`: the same accounting the predictions will use.
std::array<double, 4> simulated_elementwise_bytes(const ModelSpec& spec, DType dt, int64_t tokens,
                                                  const RuntimeProfile& rt);

// The step probe's plan over `ranks` local ranks on `device` ("cpu" or "cuda"), computing in `compute`: the plan
// whose measured steps give collectives.in_step_factor (over the node's ranks) and in_step_factor_shared_cores
// (over twice the CPUs), with the suffix _fp32 for the fp32 probe's.
PlanFile step_probe_plan(int ranks, const std::string& device, DType compute);

}  // namespace fsdp::exec::cal
