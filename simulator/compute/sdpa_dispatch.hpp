// The kernel torch.nn.functional.scaled_dot_product_attention runs on a CUDA device, as PyTorch's runtime dispatch
// chooses it: select_sdp_backend walks a priority order and takes the first backend whose constraints all pass
// (pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp @ 001f694aef6f922b4fdf6d27d59162d27bf3df58,
// Note [SDPA Runtime Dispatch], select_sdp_backend, priority_order, can_use_flash_attention,
// can_use_mem_efficient_attention, can_use_cudnn_attention). A pure function of the inputs below: the planner's
// reading of that source, not a call into PyTorch. The CPU device has its own dispatch (math / the flash CPU kernel)
// and is not modelled here (docs/hardware.md "Attention kernels").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/versions.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

enum class SdpaKernel { Flash, MemoryEfficient, Cudnn, Math };
const char* to_string(SdpaKernel);  // "flash", "memory-efficient", "cudnn", "math"

struct SdpaInputs {
  DType dtype = DType::Bf16;
  int64_t head_dim_qk = 0;  // q and k's last dimension
  int64_t head_dim_v = 0;   // v's (MLA: v_head_dim; otherwise head_dim_qk)
  ComputeCapability cc;
  bool causal = true;           // is_causal=True with seq_q == seq_k (a decoder's training step)
  bool arbitrary_mask = false;  // an attn_mask tensor is passed (Hugging Face's sdpa path builds one for a sliding
                                // window or padding; a plain causal batch goes through is_causal)
  double dropout_p = 0;         // attention-probability dropout in training
  bool requires_grad = true;    // training: the inputs require grad
  std::optional<TorchVersion> torch;  // the torch release that runs; nullopt: not stated
  std::optional<int> cudnn;           // the cuDNN runtime it loads (parse_cudnn_version); nullopt: not stated
};

struct SdpaChoice {
  SdpaKernel kernel = SdpaKernel::Flash;
  std::string reason;              // why this kernel (and why not the ones before it in the order), one line
  std::vector<std::string> notes;  // what the choice assumed for an input not stated (a torch or cuDNN version)
};

// The backend select_sdp_backend returns for these inputs with every backend enabled (the default
// torch.backends.cuda flags) and deterministic algorithms off. Requires inputs.cc.known() (a CUDA device).
SdpaChoice select_sdpa_kernel(const SdpaInputs& inputs);

// "sdpa -> flash", "sdpa -> memory-efficient (fp32)": what the reports print for attention sdpa.
std::string describe(const SdpaChoice& c, DType dtype);

}  // namespace fsdp
