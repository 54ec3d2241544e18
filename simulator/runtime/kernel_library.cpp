#include "runtime/kernel_library.hpp"

#include <algorithm>

namespace fsdp {

RuntimeProfile with_kernel_library(const RuntimeProfile& rt, KernelLibrary lib) {
  RuntimeProfile r = rt;
  switch (lib) {
    case KernelLibrary::None:
      break;
    case KernelLibrary::Liger:
      r.norm_single_kernel = true;
      r.norm_saves_fp32_input = false;
      r.norm_mean_keeps_input = false;
      r.rotary_kernel = RotaryKernel::InPlace;
      r.glu_single_kernel = true;
      r.pointwise_outputs_saved = false;
      r.loss_fused_linear = true;
      r.loss_vocab_parallel_kernels = false;
      r.loss_compiled = false;
      r.logits_kept_by_caller = false;
      r.logits_upcast_fp32 = false;
      break;
  }
  return r;
}

const std::vector<std::string>& liger_model_types() {
  // MODEL_TYPE_TO_APPLY_LIGER_FN's keys that name a Hugging Face class fsdp-plan reads (model/hf_config.cpp
  // kArchitectures); Qwen2-MoE, DeepSeek-V2/V3, InternLM2, Falcon, GPT-2, GPT-NeoX, Qwen 1, ChatGLM, GLM (glm, not
  // glm4) and InternVL's remote-code InternVLChatModel have no entry there.
  static const std::vector<std::string> types{"gemma2",   "gemma3_text", "gemma3",  "glm4",     "llama", "llama4",
                                              "llava",    "mistral",     "mixtral", "olmo2",    "phi3",  "qwen2",
                                              "qwen2_vl", "qwen2_5_vl",  "qwen3",   "qwen3_moe"};
  return types;
}

bool liger_patches(const std::string& hf_model_type) {
  const std::vector<std::string>& t = liger_model_types();
  return std::find(t.begin(), t.end(), hf_model_type) != t.end();
}

}  // namespace fsdp
