#include "model/ops.hpp"

#include <ATen/ATen.h>

#include "core/errors.hpp"

namespace fsdp::exec {

int64_t ParamDef::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

const at::Tensor& param(const ParamMap& p, const std::string& name) {
  auto it = p.find(name);
  FSDP_ASSERT(it != p.end(), "missing parameter " + name);
  return it->second;
}

const at::Tensor* find_param(const ParamMap& p, const std::string& name) {
  auto it = p.find(name);
  return it == p.end() ? nullptr : &it->second;
}

// RMSNorm in fp32, as Hugging Face LlamaRMSNorm (and Qwen3RMSNorm, the same module for q_norm / k_norm):
// x * rsqrt(mean(x^2) + eps), then cast back and scale by the weight (Zhang & Sennrich 2019, arXiv:1910.07467).
at::Tensor norm(const ModelSpec& s, const ParamMap& p, const std::string& prefix, const at::Tensor& x) {
  const at::Tensor& w = param(p, prefix + ".weight");
  if (s.norm == NormType::LayerNorm) return at::layer_norm(x, {x.size(-1)}, w, param(p, prefix + ".bias"), s.norm_eps);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, true) + s.norm_eps);
  return w * (xf * r).to(x.scalar_type());
}

// y = x W^T + b, plus the LoRA update x A^T B^T when the module has adapters (Hu et al.
// 2021, arXiv:2106.09685; scaling alpha/r = 1, see lora_param_defs).
at::Tensor linear(const ParamMap& p, const std::string& prefix, const at::Tensor& x) {
  const at::Tensor* b = find_param(p, prefix + ".bias");
  at::Tensor y = at::linear(x, param(p, prefix + ".weight"), b ? *b : at::Tensor());
  const at::Tensor* A = find_param(p, prefix + ".lora_A.weight");
  // The adapters are fp32 leaves; they compute in the activations' dtype (autocast's cast of the weights, as
  // PyTorch runs PEFT under bf16 autocast), their gradients flow back to the fp32 leaves through the cast.
  if (A != nullptr) {
    const at::ScalarType dt = x.scalar_type();
    y = y + at::linear(at::linear(x, A->to(dt)), param(p, prefix + ".lora_B.weight").to(dt));
  }
  return y;
}

at::Tensor activation(const ModelSpec& s, const at::Tensor& x) {
  switch (s.activation) {
    case ActivationFn::Silu:
      return at::silu(x);
    case ActivationFn::Gelu:
      return at::gelu(x, "none");
    case ActivationFn::GeluTanh:
      return at::gelu(x, "tanh");
    case ActivationFn::QuickGelu:  // transformers activations.py QuickGELUActivation
      return x * at::sigmoid(1.702 * x);
  }
  return x;
}

void dense_mlp_param_defs(const ModelSpec& s, const std::string& prefix, int64_t ffn, int layer,
                          std::vector<ParamDef>& out) {
  const int64_t H = s.hidden_size;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, ParamInit init) {
    out.push_back({prefix + "." + n, std::move(shape), init, layer});
  };
  if (s.gated_mlp) {
    add("gate_proj.weight", {ffn, H}, ParamInit::Normal);
    if (s.mlp_bias) add("gate_proj.bias", {ffn}, ParamInit::Zeros);
  }
  add("up_proj.weight", {ffn, H}, ParamInit::Normal);
  if (s.mlp_bias) add("up_proj.bias", {ffn}, ParamInit::Zeros);
  add("down_proj.weight", {H, ffn}, ParamInit::Normal);
  if (s.mlp_bias) add("down_proj.bias", {H}, ParamInit::Zeros);
}

// Hugging Face LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)); GPT-2-style: down(act(up(x))).
at::Tensor dense_mlp(const ModelSpec& s, const ParamMap& p, const std::string& prefix, const at::Tensor& x,
                     const TpContext& tp) {
  at::Tensor m = s.gated_mlp ? activation(s, linear(p, prefix + ".gate_proj", x)) * linear(p, prefix + ".up_proj", x)
                             : activation(s, linear(p, prefix + ".up_proj", x));
  return row_parallel_linear(tp, p, prefix + ".down_proj", m);
}

}  // namespace fsdp::exec
