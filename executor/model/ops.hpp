// The building blocks the decoder's modules are made of, each a function of its parameters (a ParamMap and the
// module's name prefix, Hugging Face's names): parameter lookup, linear with optional LoRA adapters, RMSNorm /
// LayerNorm over the last dimension, the MLP's activation, and the dense MLP itself. transformer.cpp builds the
// attention block and the layer from them, moe.cpp the mixture-of-experts block.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/model_spec.hpp"
#include "model/tensor_parallel.hpp"

namespace fsdp::exec {

enum class ParamInit { Normal, Ones, Zeros, LoraA };

// Whose parts of a replicated tensor-parallel parameter's gradient must be summed (model/tensor_parallel.hpp).
enum class TpGradSum { None, Tensor, KvGroup };

struct ParamDef {
  std::string name;
  std::vector<int64_t> shape;  // as this rank holds it (its tensor-parallel slice)
  ParamInit init = ParamInit::Normal;
  int layer = -1;  // decoder layer index, -1 for the root (embeddings, final norm, head)
  // Tensor parallelism: the whole parameter's shape (empty: `shape`), and the slice this rank holds along
  // tp_dim (-1: all of it) from tp_start.
  std::vector<int64_t> full_shape = {};
  int tp_dim = -1;
  int64_t tp_start = 0;
  TpGradSum grad_sum = TpGradSum::None;
  bool counts_in_norm = true;  // false on all but one of identical copies (the global gradient norm)
  int64_t numel() const;
  const std::vector<int64_t>& whole_shape() const { return full_shape.empty() ? shape : full_shape; }
};

using ParamMap = std::unordered_map<std::string, at::Tensor>;

// The parameter `name`; a missing one is a bug (the unit hands every parameter of its layers).
const at::Tensor& param(const ParamMap& p, const std::string& name);
// The parameter `name`, or nullptr (optional biases and LoRA adapters).
const at::Tensor* find_param(const ParamMap& p, const std::string& name);

// `prefix`.weight (and .bias for LayerNorm) normalising the last dimension of x, whatever its width: the
// hidden size for the layer norms, head_dim for Qwen3's per-head q/k norms.
at::Tensor norm(const ModelSpec& s, const ParamMap& p, const std::string& prefix, const at::Tensor& x);

// y = x W^T + b, plus the LoRA update when the module has adapters.
at::Tensor linear(const ParamMap& p, const std::string& prefix, const at::Tensor& x);

// The MLP's activation function (ModelSpec::activation).
at::Tensor activation(const ModelSpec& s, const at::Tensor& x);

// The parameters of dense_mlp `prefix` (intermediate size `ffn`) of decoder layer `layer`, appended to `out`.
void dense_mlp_param_defs(const ModelSpec& s, const std::string& prefix, int64_t ffn, int layer,
                          std::vector<ParamDef>& out);
// The dense MLP `prefix` (gate_proj, up_proj, down_proj; or up_proj, down_proj when not gated) on x [..., H]; under
// tensor parallelism gate/up column-parallel and down_proj row-parallel (x is the whole sequence, tp_enter's).
at::Tensor dense_mlp(const ModelSpec& s, const ParamMap& p, const std::string& prefix, const at::Tensor& x,
                     const TpContext& tp = TpContext{});

}  // namespace fsdp::exec
