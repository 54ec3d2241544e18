// The host AdamW step of optimizer offload (issue 6; ZeRO-Offload's CPU Adam, Ren et al.
// 2021, arXiv:2101.06840): a multi-threaded loop over fp32 host buffers, in the
// operation order of torch.optim.AdamW (_single_tensor_adamw), so that offloaded and
// on-device steps agree to rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fsdp::exec {

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based
};

// param, grad, exp_avg, exp_avg_sq: contiguous fp32 CPU tensors of equal size.
void host_adamw_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                     const AdamHyper& h);

}  // namespace fsdp::exec
