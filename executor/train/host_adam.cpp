#include "train/host_adam.hpp"

#include <ATen/Parallel.h>

#include <cmath>

#include "core/errors.hpp"

namespace fsdp::exec {

void host_adamw_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                     const AdamHyper& h) {
  FSDP_ASSERT(param.is_contiguous() && grad.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous(),
              "host AdamW needs contiguous buffers");
  FSDP_ASSERT(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat, "host AdamW works on fp32");
  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  // Scalars rounded to fp32 as ATen does for fp32 tensors.
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float b1 = static_cast<float>(h.beta1), a1 = static_cast<float>(1.0 - h.beta1);
  const float b2 = static_cast<float>(h.beta2), a2 = static_cast<float>(1.0 - h.beta2);
  const float sbc2 = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(h.eps);
  const float step = static_cast<float>(-h.lr / bc1);
  // Grain: 32 Ki elements per task (128 KiB of each buffer), well above thread start-up cost.
  constexpr int64_t kGrain = 32 * 1024;
  at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {  // a plain loop the compiler vectorises
      const float gi = g[i];
      const float pi = p[i] * decay;
      const float mi = m[i] * b1 + a1 * gi;
      const float vi = v[i] * b2 + a2 * gi * gi;
      const float denom = std::sqrt(vi) / sbc2 + eps;
      m[i] = mi;
      v[i] = vi;
      p[i] = pi + step * (mi / denom);
    }
  });
}

}  // namespace fsdp::exec
