// The decoder-only transformer of configs/models, written functionally: every
// forward function takes its parameters as tensors, so the sharding layer
// (shard/) decides where parameters live and when they are gathered. Parameter
// names follow Hugging Face's LlamaForCausalLM (modeling_llama.py; Qwen3's q_norm / k_norm, modeling_qwen3.py;
// the MoE blocks of moe.hpp), so a state dict is directly exportable.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/model_spec.hpp"
#include "model/ops.hpp"
#include "model/tensor_parallel.hpp"
#include "strategy/strategy.hpp"

namespace fsdp::exec {

// All parameters in a fixed canonical order: embeddings, layers 0..L-1, final norm, head.
std::vector<ParamDef> model_param_defs(const ModelSpec& spec);

// LoRA adapters (method: lora): for every 2-D weight of the decoder layers whose module
// name (q_proj, ..., down_proj) is in `targets`, "<module>.lora_A.weight" [r, in] and
// "<module>.lora_B.weight" [out, r]. The plan has no lora_alpha: scaling alpha/r is 1.
std::vector<ParamDef> lora_param_defs(const ModelSpec& spec, int64_t rank, const std::vector<std::string>& targets);

// InputError naming what the executor cannot run (dropout, and the parts beyond Llama's block other than q/k norms
// per head and MoE blocks).
void check_model_supported(const ModelSpec& spec);

// Deterministic initialisation of parameter `index`: a CPU generator seeded from
// (seed, index), so every rank and every world size produces the same values.
// Normal(0, 0.02) for matrices and embeddings (Hugging Face LlamaConfig
// initializer_range = 0.02), ones for norm weights, zeros for biases.
at::Tensor init_param(const ParamDef& def, int64_t index, uint64_t seed);

// The attention core (softmax(QK^T/sqrt(d) + causal mask) V) as a callable, so
// selective activation checkpointing can recompute exactly this part.
// q: [B, nh, T, hd], k/v: [B, nh, T, hd] (kv heads already repeated). Returns [B, nh, T, hd].
using AttentionCore = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

struct ForwardOptions {
  AttentionImpl attention = AttentionImpl::Sdpa;
  AttentionCore core;  // empty: attention_core() directly
  // Rotary tables [T, head_dim] in the compute dtype, computed once per forward and shared by every
  // layer (as Hugging Face's LlamaModel passes position_embeddings); undefined: computed per layer.
  at::Tensor rope_cos, rope_sin;
  TpContext tp;  // this rank's tensor-parallel slice (tensor_parallel.hpp); inactive by default
};

// The rotary cos/sin tables for positions 0..T-1 (rope models only).
void rope_tables(const ModelSpec& spec, int64_t T, const at::Tensor& like, at::Tensor& cos, at::Tensor& sin);

// softmax(QK^T/sqrt(d) + causal mask) V with fp32 softmax; the fused kernel
// (at::scaled_dot_product_attention, LibTorch >= 2.0) unless `eager`.
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool eager);
// The attention this build runs for a plan's `attention`: eager where LibTorch has no fused attention (1.13: no public
// at::scaled_dot_product_attention, so attention_core takes the reference path for every plan), else the plan's.
AttentionImpl executed_attention(AttentionImpl planned);

// tokens [B, T] (int64) -> hidden [B, T, H] in `dtype` ([B, T / tp, H] under sequence parallelism).
at::Tensor embed_forward(const ModelSpec& spec, const ParamMap& p, const at::Tensor& tokens,
                         const TpContext& tp = TpContext{});
// One decoder layer (pre-norm attention + MLP, residuals).
at::Tensor layer_forward(const ModelSpec& spec, const ParamMap& p, int layer, const at::Tensor& x,
                         const ForwardOptions& opts);
// Final norm, head, mean causal-LM cross-entropy over all B*T targets (fp32).
at::Tensor head_loss(const ModelSpec& spec, const ParamMap& p, const at::Tensor& x, const at::Tensor& targets,
                     const TpContext& tp = TpContext{});

}  // namespace fsdp::exec
