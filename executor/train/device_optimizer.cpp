#include "train/device_optimizer.hpp"

#include <ATen/ATen.h>

#include <cmath>

namespace fsdp::exec {

void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const OptimizerConfig& c, int64_t step) {
  p.mul_(1.0 - c.lr * c.weight_decay);
  exp_avg.mul_(c.beta1).add_(g, 1.0 - c.beta1);
  exp_avg_sq.mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(c.eps);
  p.addcdiv_(exp_avg, denom, -c.lr / bc1);
}

void sgd_update(at::Tensor& p, const at::Tensor& g, at::Tensor& momentum, const OptimizerConfig& c, int64_t step) {
  at::Tensor d = c.weight_decay != 0 ? g + c.weight_decay * p : g;
  if (step == 1)
    momentum.copy_(d);
  else
    momentum.mul_(c.momentum).add_(d);
  p.add_(momentum, -c.lr);
}

}  // namespace fsdp::exec
