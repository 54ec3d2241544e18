// One configuration in, one prediction out: the simulator's public entry point.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compute/sdpa_dispatch.hpp"
#include "hardware/cluster.hpp"
#include "hardware/hardware_profile.hpp"
#include "memory/memory_walk.hpp"
#include "model/module_graph.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"
#include "timeline/timeline.hpp"

namespace fsdp {

struct SimulationInput {
  const ModuleGraph* graph = nullptr;
  const HardwareProfile* hardware = nullptr;
  const RuntimeProfile* runtime = nullptr;
  Cluster cluster;
  Strategy strategy;
  // model_flops_per_token of the graph at the strategy's sequence and method, when the caller has it (the search
  // prices thousands of plans of one model and sequence); 0: simulate computes it.
  double model_flops_per_token = 0;
  // What the programs of many plans derive alike (program/emit_memo.hpp), kept across the caller's simulations of
  // one graph and runtime (the search's); null: kept across the stages of this plan only.
  EmitMemo* memo = nullptr;
  // Record the per-op memory samples (MemoryResult::samples, for the trace); false: they stay empty and every other
  // field of the prediction is the same, bit for bit (the planner's search keeps no per-op detail).
  bool memory_samples = true;
};

// A configuration that cannot run at all (not a user typo: a value the planner counts and explains).
struct Infeasible {
  std::string reason;
  double needed_bytes = 0;
  double available_bytes = 0;
};

struct Prediction {
  MemoryResult memory;  // with pipeline stages, the stage that needs the most device memory
  // With pipeline stages (pp > 1): the first stage's own walk (its peak phase named with the stage), for a
  // measurement logged by that stage's rank; nullopt otherwise.
  std::optional<MemoryResult> first_stage_memory;
  TimelineResult time;
  bool fits = false;      // device_total within the GPU's usable memory
  bool host_fits = true;  // offload state within host RAM
  double usable_bytes = 0;
  int64_t params = 0;
  double tokens_per_step = 0;  // global
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;
  double model_flops_per_token = 0;  // 6N + attention (see README "MFU")
  // The attention the step runs, as the reports name it: "flash", "eager", "sdpa -> flash",
  // "sdpa -> memory-efficient (fp32)" (resolve_sdpa); `attention_notes`: what its dispatch assumed.
  std::string attention;
  std::vector<std::string> attention_notes;
};

// With attention sdpa on a CUDA device, the kernels PyTorch's SDPA dispatch runs (compute/sdpa_dispatch.hpp).
struct SdpaResolution {
  SdpaChoice global;                   // layers given is_causal and no mask
  std::optional<SdpaChoice> windowed;  // sliding-window layers (an attention mask), where the model has any
  std::string description;             // "sdpa -> flash", or both kinds of layer where their kernels differ
  std::vector<std::string> notes;      // what the dispatch assumed (a torch or cuDNN version not stated)
};

// The kernels for the plan: from the model's head dims and attention dropout, the compute dtype, the device's
// compute capability and the runtime's torch and cuDNN versions (RuntimeProfile::torch_version, cudnn_version).
// nullopt where the strategy's attention is not sdpa, or on a CPU device (SDPA's CPU kernels: priced as flash,
// as before the dispatch was modelled). InputError where a CUDA profile lacks device.compute_capability, or the
// device.sdpa_kernel_ratio the chosen kernel is priced by.
std::optional<SdpaResolution> resolve_sdpa(const ModuleGraph& g, const HardwareProfile& hw, const RuntimeProfile& rt,
                                           const Strategy& s);

// The strategy the language model runs: a vision-language model's sequence is the sample's text tokens (--seq)
// and its image tokens (VisionSpec::image_tokens, or --image-tokens), so tokens per step and MFU count both.
// InputError where the image tokens are not known (a dynamic-resolution tower without --image-tokens).
Strategy language_model_strategy(const Strategy& s, const ModelSpec& m);

// Checks the strategy against the model and cluster; throws InputError naming the flag for a strategy
// that cannot be built (HSDP group not dividing the world size, sequence beyond max positions, ...), or that the
// runtime `rt` does not run (its profile's `mesh` section: RuntimeProfile::support). `name_of` turns the flag into
// what the message names, for a strategy read from a file ("plan.yaml: strategy.tp"); the flag itself by default.
void validate_strategy(const Strategy& s, const ModelSpec& m, const Cluster& c,
                       const RuntimeSupport& rt = RuntimeSupport{},
                       const std::function<std::string(const std::string&)>& name_of = nullptr);

// A RoPE model's sequence (text plus a vision-language model's image tokens) beyond the positions it was trained for,
// max_positions (max_position_embeddings), or beyond what its rope_scaling extends them to (rope_scaled_positions),
// is an InputError naming `seq_source` ("--seq", "plan.yaml: strategy.seq_len"), the model and both limits: the
// model was not trained for that length, the same for every family. (Learned positions beyond their table are
// refused by validate_strategy.)
void check_trained_length(const ModelSpec& m, int64_t seq_len, const std::string& seq_source);

// Under LoRA every name of the strategy's target modules must name a linear of the model that LoRA adapts
// (ModuleNode::lora_target short names): one that names none (a typo, the MoE router `gate`, Mixtral's Hugging Face
// `w1`) would add no adapter, and the plan would train less than asked. An InputError naming the flag (through
// `name_of`, as validate_strategy), the name, the model and its adaptable linears. Nothing under full training.
void check_lora_targets(const Strategy& s, const ModuleGraph& g,
                        const std::function<std::string(const std::string&)>& name_of = nullptr);

// Checks that the hardware profile may price the runtime: a calibrated profile's fitted overheads belong to
// the runtime and the cost-model version it was fitted against; InputError naming the profile and the reason.
void validate_profiles(const HardwareProfile& hw, const RuntimeProfile& rt);

// Why the profile cannot price float8 linears (Strategy::float8), or nullopt: float8 GEMMs (torch._scaled_mm) need FP8
// tensor cores, compute capability 8.9 (Ada) or later, which PyTorch checks before running them
// (aten/src/ATen/native/cuda/Blas.cpp _scaled_mm_out_cuda: "torch._scaled_mm is only supported on CUDA devices with
// compute capability >= 9.0 or 8.9"), and the profile's FP8 peak and float8 cast rate to price them. simulate throws it
// as an InputError for a float8 plan.
std::optional<std::string> float8_hardware_refusal(const HardwareProfile& hw);

// Why the profile cannot price the attention kernel `a`, or nullopt (always for flash, sdpa and eager, which every
// profile prices). flash3: FlashAttention-3 is built for Hopper (flash-attention hopper/README.md: "Requirements:
// H100 / H800 GPU, CUDA >= 12.3"; its setup.py compiles sm_90a) and is priced by device.flash_attention_3_ratio.
// flex: torch's flex_attention is a compiled Triton kernel of CUDA devices here, priced by device.flex_attention_ratio.
// simulate throws it as an InputError. What the kernels need of the plan itself (dtype, head dims, runtime) is rule
// AttentionKernel's.
std::optional<std::string> attention_hardware_refusal(const HardwareProfile& hw, AttentionImpl a);

// Simulates memory and time. The input must be valid (validate_strategy). `program_out`: the program whose time
// the prediction reports (under pipeline parallelism the slower of the first and the last stage).
Prediction simulate(const SimulationInput& in, StepProgram* program_out = nullptr);

// The step program of pipeline rank `stage` (0 without pipeline parallelism): what that rank runs, e.g. the first
// stage's, rank 0's, whose step fsdp-run records in its report.
StepProgram emit_stage_program(const SimulationInput& in, int64_t stage);

// Model FLOPs per token used for MFU: 6N (forward + backward GEMMs over all N parameters, Kaplan et al.
// 2020 / PaLM arXiv 2204.02311 App. B) plus causal attention 6 * L * s * d_q (12 * L * s * d_q halved by
// the causal mask), independent of recomputation; 4N instead of 6N for a frozen (LoRA) base, 2N (and its
// attention once) for a frozen vision tower or projector (`vision`, Strategy::train_vision); with packed documents
// (`doc_len`, Strategy::doc_len) the attention each document's queries do (seq_flops_per_token).
double model_flops_per_token(const ModuleGraph& g, int64_t seq_len, bool frozen_base = false,
                             VisionTraining vision = VisionTraining::All, int64_t doc_len = 0);

}  // namespace fsdp
