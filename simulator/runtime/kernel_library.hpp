// Kernel libraries patched into a Hugging Face model before training (Strategy::kernels): what each replaces, as
// fields of the runtime profile the step is emitted with (program/step_program.cpp emit_step_program), and the model
// types each has a patch for (rule KernelLibrary, strategy/capabilities.cpp).
#pragma once

#include <string>
#include <vector>

#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// The runtime `rt` with the kernels of `lib` in place of its own (`rt` itself for KernelLibrary::None). Liger, as
// Transformers applies it (trainer.py _apply_liger_kernel_to_instance; the patch functions' defaults in
// linkedin/Liger-Kernel src/liger_kernel/transformers/monkey_patch.py @ ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c:
// rope, rms_norm, swiglu, fused_linear_cross_entropy true):
//  - RMSNorm: LigerRMSNorm, one Triton kernel each way (ops/rms_norm.py: the forward reads x and writes y, computing
//    in fp32 in registers; it saves x as given and one fp32 rstd a row; the backward reads x and dy and writes dx):
//    norm_kernel single, norm_saves_fp32_input false;
//  - rotary: LigerRopeFunction, q and k rotated in place (rotary_kernel in-place);
//  - the gated MLP's activation: LigerSiLUMulFunction (GEGLU's for Gemma), one kernel each way that saves the gate
//    and up outputs, not the activation's (activation_kernel single, pointwise_outputs_saved false);
//  - the head and the loss: LigerFusedLinearCrossEntropy (loss_kernels fused-linear). Transformers' Trainer runs the
//    patched causal-LM forward, which skips the logits in training (skip_logits), so the caller keeps none.
RuntimeProfile with_kernel_library(const RuntimeProfile& rt, KernelLibrary lib);

// The Hugging Face model types Liger-Kernel patches (monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN at the commit
// above) that fsdp-plan's models can be; a model of another type gets no kernel from it (_apply_liger_kernel logs
// "There are currently no Liger kernels supported for model type" and patches nothing).
const std::vector<std::string>& liger_model_types();
bool liger_patches(const std::string& hf_model_type);

}  // namespace fsdp
