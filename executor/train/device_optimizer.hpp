// The on-device optimizer step over one flat fp32 parameter buffer, as LibTorch elementwise kernels (the
// executor's step when the optimizer is not offloaded; train/host_adam.hpp is the offloaded one).
// configs/runtimes/fsdp-run.yaml (training_loop) counts the bytes these kernels move.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "strategy/strategy.hpp"

namespace fsdp::exec {

struct OptimizerConfig {
  Optimizer kind = Optimizer::AdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.9;
};

// torch.optim.AdamW (_single_tensor_adamw in torch/optim/adamw.py; Loshchilov & Hutter 2019,
// arXiv:1711.05101): decoupled decay, bias-corrected moments. In place on p and the states; step is 1-based.
void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const OptimizerConfig& c, int64_t step);

// torch.optim.SGD with momentum, dampening 0: d = g + wd*p; buf = m*buf + d; p -= lr*buf.
void sgd_update(at::Tensor& p, const at::Tensor& g, at::Tensor& momentum, const OptimizerConfig& c, int64_t step);

}  // namespace fsdp::exec
