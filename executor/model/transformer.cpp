#include "model/transformer.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "model/moe.hpp"

namespace fsdp::exec {

void check_model_supported(const ModelSpec& spec) {
  if (spec.family != "decoder")
    throw InputError("model " + spec.name + ": family '" + spec.family + "' is not supported by fsdp-run");
  if (spec.dropout)
    throw InputError("model " + spec.name + ": dropout is not supported by fsdp-run (set dropout: false)");
  if (spec.num_heads % spec.num_kv_heads != 0)
    throw InputError("model " + spec.name + ": num_heads must be a multiple of num_kv_heads");
  if (spec.position_embedding == PositionEmbedding::Rope && spec.head_dim % 2 != 0)
    throw InputError("model " + spec.name + ": rotary embedding needs an even head_dim");
  // The layer parts of model_spec.hpp this executor does not build (Llama's block is all it runs).
  const ModelSpec llama;
  const std::pair<bool, const char*> unsupported[] = {
      {spec.norm == NormType::LayerNormNoParams, "layer norms without parameters (norm: layernorm_no_params)"},
      {spec.pre_attention_norm != llama.pre_attention_norm || spec.pre_mlp_norm != llama.pre_mlp_norm ||
           spec.post_attention_norm || spec.post_mlp_norm,
       "norm placements other than Llama's pre-norm (pre_/post_attention_norm, pre_/post_mlp_norm)"},
      {spec.parallel_block, "parallel attention + MLP blocks (parallel_block)"},
      {spec.qk_norm == QkNorm::Projection, "q/k norms over the whole projection (qk_norm: projection)"},
      {spec.moe && spec.moe->router_bias, "routers with a score-correction bias (moe.router_bias)"},
      {spec.moe && spec.moe->capacity_factor > 0,
       "expert capacities (moe.capacity_factor): fsdp-run's experts compute every routed token"},
      {spec.rotary_dim != 0, "partial rotary embeddings (rotary_dim)"},
      {spec.sliding_window != 0, "sliding-window and chunked attention (sliding_window, chunked_attention)"},
      {spec.nope_layer_every != 0, "layers without rotary (nope_layer_every)"},
      {spec.attn_logit_softcap > 0 || spec.final_logit_softcap > 0, "logit soft-capping (attn_/final_logit_softcap)"},
      {spec.scaled_embeddings, "scaled embeddings (scaled_embeddings)"},
      {spec.mla.has_value(), "multi-head latent attention layers (mla)"},
      {spec.vision.has_value(), "vision towers (vision)"},
  };
  for (const auto& [used, feature] : unsupported)
    if (used) throw InputError("model " + spec.name + ": " + feature + " are not supported by fsdp-run yet");
}

std::vector<ParamDef> model_param_defs(const ModelSpec& s) {
  std::vector<ParamDef> d;
  const int64_t H = s.hidden_size;
  d.push_back({"model.embed_tokens.weight", {s.vocab_size, H}, ParamInit::Normal, -1});
  if (s.position_embedding == PositionEmbedding::Learned)
    d.push_back({"model.embed_positions.weight", {s.max_positions, H}, ParamInit::Normal, -1});
  const bool ln = s.norm == NormType::LayerNorm;
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto add = [&](const std::string& n, std::vector<int64_t> shape, ParamInit init) {
      d.push_back({p + n, std::move(shape), init, l});
    };
    add("input_layernorm.weight", {H}, ParamInit::Ones);
    if (ln) add("input_layernorm.bias", {H}, ParamInit::Zeros);
    add("self_attn.q_proj.weight", {s.q_dim(), H}, ParamInit::Normal);
    if (s.qkv_bias) add("self_attn.q_proj.bias", {s.q_dim()}, ParamInit::Zeros);
    add("self_attn.k_proj.weight", {s.kv_dim(), H}, ParamInit::Normal);
    if (s.qkv_bias) add("self_attn.k_proj.bias", {s.kv_dim()}, ParamInit::Zeros);
    add("self_attn.v_proj.weight", {s.kv_dim(), H}, ParamInit::Normal);
    if (s.qkv_bias) add("self_attn.v_proj.bias", {s.kv_dim()}, ParamInit::Zeros);
    add("self_attn.o_proj.weight", {H, s.q_dim()}, ParamInit::Normal);
    if (s.attn_out_bias) add("self_attn.o_proj.bias", {H}, ParamInit::Zeros);
    // Qwen3Attention: q_norm and k_norm are Qwen3RMSNorm(head_dim), one weight shared by the heads.
    if (s.qk_norm == QkNorm::PerHead) {
      add("self_attn.q_norm.weight", {s.head_dim}, ParamInit::Ones);
      if (ln) add("self_attn.q_norm.bias", {s.head_dim}, ParamInit::Zeros);
      add("self_attn.k_norm.weight", {s.head_dim}, ParamInit::Ones);
      if (ln) add("self_attn.k_norm.bias", {s.head_dim}, ParamInit::Zeros);
    }
    add("post_attention_layernorm.weight", {H}, ParamInit::Ones);
    if (ln) add("post_attention_layernorm.bias", {H}, ParamInit::Zeros);
    if (s.is_moe_layer(l))
      moe_param_defs(s, p + "mlp", l, d);
    else
      dense_mlp_param_defs(s, p + "mlp", s.ffn_size, l, d);
  }
  d.push_back({"model.norm.weight", {H}, ParamInit::Ones, -1});
  if (ln) d.push_back({"model.norm.bias", {H}, ParamInit::Zeros, -1});
  if (!s.tied_embeddings) d.push_back({"lm_head.weight", {s.vocab_size, H}, ParamInit::Normal, -1});
  return d;
}

std::vector<ParamDef> lora_param_defs(const ModelSpec& s, int64_t rank, const std::vector<std::string>& targets) {
  static const std::vector<std::string> kKnown{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                               "gate_proj", "up_proj", "down_proj"};
  for (const auto& t : targets)
    if (std::find(kKnown.begin(), kKnown.end(), t) == kKnown.end())
      throw InputError("lora_targets: unknown module '" + t +
                       "' (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  if (targets.empty()) throw InputError("method lora needs lora_targets");
  if (rank <= 0) throw InputError("method lora needs lora_rank > 0");
  std::vector<ParamDef> out;
  for (const auto& d : model_param_defs(s)) {
    if (d.layer < 0 || d.shape.size() != 2) continue;
    const auto dot = d.name.rfind(".weight");
    const std::string module = d.name.substr(0, dot);
    const std::string leaf = module.substr(module.rfind('.') + 1);
    if (std::find(targets.begin(), targets.end(), leaf) == targets.end()) continue;
    // A: [r, in] Kaiming-uniform-like, B: [out, r] zeros, so training starts at the base model (PEFT's init).
    out.push_back({module + ".lora_A.weight", {rank, d.shape[1]}, ParamInit::LoraA, d.layer});
    out.push_back({module + ".lora_B.weight", {d.shape[0], rank}, ParamInit::Zeros, d.layer});
  }
  // A known name the model has no linear of (gate_proj on a plain MLP) would add no adapter there.
  for (const auto& t : targets)
    if (std::none_of(out.begin(), out.end(),
                     [&](const ParamDef& a) { return a.name.find("." + t + ".lora_A.") != std::string::npos; }))
      throw InputError("lora_targets: model " + s.name + " has no linear '" + t + "'");
  return out;
}

at::Tensor init_param(const ParamDef& def, int64_t index, uint64_t seed) {
  // Hugging Face PretrainedConfig.initializer_range default (LlamaConfig: 0.02).
  constexpr double kInitStd = 0.02;
  // The whole parameter, then this rank's tensor-parallel slice of it: every mesh initialises alike.
  const std::vector<int64_t>& shape = def.whole_shape();
  switch (def.init) {
    case ParamInit::Ones:
      return at::ones(def.shape, at::kFloat);
    case ParamInit::Zeros:
      return at::zeros(def.shape, at::kFloat);
    case ParamInit::Normal:
    case ParamInit::LoraA:
      break;
  }
  // splitmix64-style mixing of (seed, index) so neighbouring seeds give unrelated streams.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(z);
  if (def.init == ParamInit::LoraA) {
    // PEFT: kaiming_uniform_(a=sqrt(5)) on [r, in] = U(-1/sqrt(in), 1/sqrt(in)).
    const double bound = 1.0 / std::sqrt(static_cast<double>(shape[1]));
    return tp_slice(def, at::empty(shape, at::kFloat).uniform_(-bound, bound, gen)).contiguous();
  }
  return tp_slice(def, at::normal(0.0, kInitStd, shape, gen, at::TensorOptions().dtype(at::kFloat))).contiguous();
}

namespace {

// Rotary embedding (Su et al. 2021, arXiv:2104.09864) in the rotate_half layout of
// Hugging Face modeling_llama.py: x*cos + rotate_half(x)*sin, inv_freq = theta^(-2i/d).
at::Tensor apply_rope(const ModelSpec& s, const at::Tensor& x /*[B, h, T, d]*/, const ForwardOptions& opts) {
  const int64_t d = x.size(3);
  at::Tensor cos = opts.rope_cos, sin = opts.rope_sin;
  if (!cos.defined()) rope_tables(s, x.size(2), x, cos, sin);
  at::Tensor x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
  at::Tensor rot = at::cat({-x2, x1}, -1);
  return x * cos + rot * sin;
}

}  // namespace

void rope_tables(const ModelSpec& s, int64_t T, const at::Tensor& like, at::Tensor& cos, at::Tensor& sin) {
  const int64_t d = s.head_dim;
  auto fopt = at::TensorOptions().dtype(at::kFloat).device(like.device());
  at::Tensor inv = at::pow(s.rope_theta, -at::arange(0, d, 2, fopt) / static_cast<double>(d));
  at::Tensor freqs = at::outer(at::arange(0, T, fopt), inv);  // [T, d/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);               // [T, d]
  cos = emb.cos().to(like.scalar_type());
  sin = emb.sin().to(like.scalar_type());
}

at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool eager) {
#if TORCH_VERSION_MAJOR >= 2
  if (!eager) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
  (void)eager;  // LibTorch 1.13 has no public fused SDPA: always the reference path.
#endif
  const int64_t T = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).to(at::kFloat) * scale;
  at::Tensor mask = at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
  return at::matmul(probs, v);
}

AttentionImpl executed_attention(AttentionImpl planned) {
#if TORCH_VERSION_MAJOR >= 2
  return planned;
#else
  (void)planned;
  return AttentionImpl::Eager;
#endif
}

at::Tensor embed_forward(const ModelSpec& s, const ParamMap& p, const at::Tensor& tokens, const TpContext& tp) {
  at::Tensor h = vocab_parallel_embedding(tp, param(p, "model.embed_tokens.weight"), tokens);
  if (s.position_embedding == PositionEmbedding::Learned) {
    // Replicated positions, added to this rank's part of the sequence (all of it without sequence parallelism).
    const int64_t T = h.size(1), first = tp.active() && tp.sequence_parallel ? tp.rank * T : 0;
    h = h + param(p, "model.embed_positions.weight").narrow(0, first, T).unsqueeze(0);
  }
  return h;
}

at::Tensor layer_forward(const ModelSpec& s, const ParamMap& p, int layer, const at::Tensor& x,
                         const ForwardOptions& opts) {
  const std::string pre = "model.layers." + std::to_string(layer) + ".";
  const TpContext& tp = opts.tp;
  // Under tensor parallelism this rank's heads and kv heads (tensor_parallel.hpp).
  const int64_t nh = tp.active() ? tp.heads : s.num_heads, nkv = tp.active() ? tp.kv_heads : s.num_kv_heads;
  const int64_t hd = s.head_dim;
  // The column-parallel block's input: the whole sequence (gathered under sequence parallelism).
  at::Tensor h = tp_enter(tp, norm(s, p, pre + "input_layernorm", x));
  const int64_t B = h.size(0), T = h.size(1);
  at::Tensor q = linear(p, pre + "self_attn.q_proj", h).view({B, T, nh, hd});
  at::Tensor k = linear(p, pre + "self_attn.k_proj", h).view({B, T, nkv, hd});
  at::Tensor v = linear(p, pre + "self_attn.v_proj", h).view({B, T, nkv, hd}).transpose(1, 2);
  // Qwen3Attention: q_norm / k_norm over each head's head_dim, before rotary (modeling_qwen3.py).
  if (s.qk_norm == QkNorm::PerHead) {
    q = norm(s, p, pre + "self_attn.q_norm", q);
    k = norm(s, p, pre + "self_attn.k_norm", k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  if (s.position_embedding == PositionEmbedding::Rope) {
    q = apply_rope(s, q, opts);
    k = apply_rope(s, k, opts);
  }
  if (nkv != nh) {  // grouped-query attention: each kv head serves nh/nkv query heads
    k = k.repeat_interleave(nh / nkv, 1);
    v = v.repeat_interleave(nh / nkv, 1);
  }
  at::Tensor o = opts.core ? opts.core(q, k, v) : attention_core(q, k, v, opts.attention == AttentionImpl::Eager);
  o = o.transpose(1, 2).reshape({B, T, nh * hd});
  at::Tensor x1 = x + row_parallel_linear(tp, p, pre + "self_attn.o_proj", o);
  at::Tensor h2 = tp_enter(tp, norm(s, p, pre + "post_attention_layernorm", x1));
  return x1 + (s.is_moe_layer(layer) ? moe_forward(s, p, pre + "mlp", h2, tp) : dense_mlp(s, p, pre + "mlp", h2, tp));
}

at::Tensor head_loss(const ModelSpec& s, const ParamMap& p, const at::Tensor& x, const at::Tensor& targets,
                     const TpContext& tp) {
  at::Tensor h = tp_enter(tp, norm(s, p, "model.norm", x));
  const at::Tensor& w = s.tied_embeddings ? param(p, "model.embed_tokens.weight") : param(p, "lm_head.weight");
  at::Tensor logits = at::linear(h, w).to(at::kFloat);
  // Under tensor parallelism this rank's vocabulary columns only: the loss without gathering them.
  if (tp.active()) return vocab_parallel_cross_entropy(tp, logits.view({-1, w.size(0)}), targets.reshape({-1}));
  return at::cross_entropy_loss(logits.view({-1, s.vocab_size}), targets.reshape({-1}));
}

}  // namespace fsdp::exec
