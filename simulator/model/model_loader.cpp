#include "model/model_loader.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/errors.hpp"

namespace fsdp {

const char* to_string(NormType n) {
  switch (n) {
    case NormType::RmsNorm:
      return "rmsnorm";
    case NormType::LayerNorm:
      return "layernorm";
    case NormType::LayerNormNoParams:
      return "layernorm_no_params";
  }
  return "?";
}
const char* to_string(QkNorm n) {
  switch (n) {
    case QkNorm::None:
      return "none";
    case QkNorm::PerHead:
      return "per_head";
    case QkNorm::Projection:
      return "projection";
    case QkNorm::L2:
      return "l2";
  }
  return "?";
}
const char* to_string(ActivationFn a) {
  switch (a) {
    case ActivationFn::Silu:
      return "silu";
    case ActivationFn::Gelu:
      return "gelu";
    case ActivationFn::GeluTanh:
      return "gelu_tanh";
    case ActivationFn::QuickGelu:
      return "quick_gelu";
  }
  return "?";
}
const char* to_string(PositionEmbedding p) { return p == PositionEmbedding::Rope ? "rope" : "learned"; }
const char* to_string(ProjectorNorm n) {
  switch (n) {
    case ProjectorNorm::None:
      return "none";
    case ProjectorNorm::BeforeMerge:
      return "before_merge";
    case ProjectorNorm::AfterMerge:
      return "after_merge";
  }
  return "?";
}

namespace {

// The optional layer parts (model_spec.hpp) against each other and the shape.
template <typename Bad>
void validate_layer_parts(const ModelSpec& m, Bad bad) {
  if (m.parallel_block && !m.pre_attention_norm)
    bad("parallel_block", "a parallel block reads the input norm's output (pre_attention_norm: true)");
  if (m.parallel_block && (m.post_attention_norm || m.post_mlp_norm))
    bad("parallel_block", "post-sublayer norms are not defined for a parallel block");
  if (m.rotary_dim != 0) {
    if (m.position_embedding != PositionEmbedding::Rope) bad("rotary_dim", "only meaningful with rope");
    if (m.rotary_dim < 0 || m.rotary_dim > m.head_dim || m.rotary_dim % 2 != 0)
      bad("rotary_dim", "must be even and within 2 .. head_dim (" + std::to_string(m.head_dim) + "), got " +
                            std::to_string(m.rotary_dim));
  }
  if (m.value_views_fused_qkv && m.position_embedding != PositionEmbedding::Rope)
    bad("value_views_fused_qkv", "only meaningful with rope (without it q and k stay views of the output too)");
  if (m.sliding_window < 0 || m.sliding_window > (int64_t{1} << 31))
    bad("sliding_window", "must be within 1 .. 2^31, got " + std::to_string(m.sliding_window));
  if (m.global_layer_every < 0 || m.global_layer_every > m.num_layers)
    bad("global_layer_every", "must be within 0 .. num_layers, got " + std::to_string(m.global_layer_every));
  if (m.sliding_window == 0 && m.global_layer_every != 0) bad("global_layer_every", "only meaningful with a window");
  if (m.sliding_window == 0 && m.chunked_attention) bad("chunked_attention", "only meaningful with a window");
  if (m.nope_layer_every < 0 || m.nope_layer_every > m.num_layers)
    bad("nope_layer_every", "must be within 0 .. num_layers, got " + std::to_string(m.nope_layer_every));
  if (m.nope_layer_every != 0 && m.position_embedding != PositionEmbedding::Rope)
    bad("nope_layer_every", "only meaningful with rope");
  if (m.qk_norm == QkNorm::L2 && m.position_embedding != PositionEmbedding::Rope)
    bad("qk_norm", "l2 normalises the rotated q and k of the rotary layers: only meaningful with rope");
  for (const auto& [key, cap] : {std::pair<const char*, double>{"attn_logit_softcap", m.attn_logit_softcap},
                                 std::pair<const char*, double>{"final_logit_softcap", m.final_logit_softcap}})
    if (!(cap >= 0) || !std::isfinite(cap)) bad(key, "must be a positive number (or absent)");
}

// MoeSpec's layer pattern and sizes, and MlaSpec against the attention shape.
template <typename Bad>
void validate_moe_mla(const ModelSpec& m, Bad bad) {
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  if (m.moe) {
    const MoeSpec& e = *m.moe;
    if (e.shared_expert_ffn_size < 0 || e.shared_expert_ffn_size > kMaxSize)
      bad("moe.shared_expert_ffn_size", "must be within 1 .. 2^31");
    if (e.first_dense_layers < 0 || e.first_dense_layers > m.num_layers)
      bad("moe.first_dense_layers", "must be within 0 .. num_layers, got " + std::to_string(e.first_dense_layers));
    if (e.layer_step < 1 || e.layer_step > m.num_layers)
      bad("moe.layer_step", "must be within 1 .. num_layers, got " + std::to_string(e.layer_step));
    if (m.moe_layers() == 0) bad("moe", "no layer is a MoE layer (first_dense_layers, layer_step)");
  }
  if (!m.mla) return;
  const MlaSpec& a = *m.mla;
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"mla.kv_lora_rank", a.kv_lora_rank},
                               {"mla.qk_nope_head_dim", a.qk_nope_head_dim},
                               {"mla.qk_rope_head_dim", a.qk_rope_head_dim},
                               {"mla.v_head_dim", a.v_head_dim}})
    if (v <= 0 || v > kMaxSize) bad(key, "must be within 1 .. 2^31, got " + std::to_string(v));
  if (a.q_lora_rank < 0 || a.q_lora_rank > kMaxSize) bad("mla.q_lora_rank", "must be within 1 .. 2^31 (or absent)");
  if (a.qk_rope_head_dim % 2 != 0) bad("mla.qk_rope_head_dim", "rotary embeddings need an even size");
  if (m.position_embedding != PositionEmbedding::Rope) bad("mla", "multi-head latent attention needs rope");
  if (m.head_dim != a.qk_head_dim())
    bad("head_dim", "with mla it is the q/k head, qk_nope_head_dim + qk_rope_head_dim = " +
                        std::to_string(a.qk_head_dim()) + ", got " + std::to_string(m.head_dim));
  if (m.num_kv_heads != m.num_heads) bad("num_kv_heads", "with mla every head has its own k and v (= num_heads)");
  if (m.qk_norm != QkNorm::None || m.rotary_dim != 0 || m.sliding_window != 0 || m.attn_logit_softcap > 0 ||
      m.dropout || m.value_views_fused_qkv)
    bad("mla",
        "qk_norm, rotary_dim, sliding_window, attn_logit_softcap, dropout and value_views_fused_qkv are not modelled "
        "with mla");
}

// VisionSpec's sizes, its image geometry and the projector against each other (model_spec.hpp).
template <typename Bad>
void validate_vision(const VisionSpec& v, Bad bad) {
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  const std::pair<const char*, int64_t> sizes[] = {{"vision.hidden_size", v.hidden_size},
                                                   {"vision.num_layers", v.num_layers},
                                                   {"vision.num_heads", v.num_heads},
                                                   {"vision.ffn_size", v.ffn_size},
                                                   {"vision.patch_size", v.patch_size},
                                                   {"vision.temporal_patch_size", v.temporal_patch_size},
                                                   {"vision.num_channels", v.num_channels},
                                                   {"vision.merge", v.merge},
                                                   {"vision.projector_hidden", v.projector_hidden},
                                                   {"vision.run_layers", v.run_layers}};
  for (const auto& [key, n] : sizes)
    if (n <= 0 || n > kMaxSize) bad(key, "must be within 1 .. 2^31, got " + std::to_string(n));
  if (v.run_layers > v.num_layers)
    bad("vision.run_layers", "must be at most vision.num_layers (" + std::to_string(v.num_layers) + "), got " +
                                 std::to_string(v.run_layers));
  if (v.hidden_size % v.num_heads != 0)
    bad("vision.num_heads",
        std::to_string(v.num_heads) + " does not divide vision.hidden_size " + std::to_string(v.hidden_size));
  if (v.position_embedding == PositionEmbedding::Rope && v.head_dim() % 2 != 0)
    bad("vision.num_heads", "2-D rotary embeddings need an even head size, got " + std::to_string(v.head_dim()));
  if (v.image_size < 0 || v.image_size > kMaxSize) bad("vision.image_size", "must be within 1 .. 2^31 (or absent)");
  if (v.image_size > 0) {
    if (v.image_size % v.patch_size != 0)
      bad("vision.image_size",
          std::to_string(v.patch_size) + " (patch_size) does not divide " + std::to_string(v.image_size));
    if ((v.image_size / v.patch_size) % v.merge != 0)
      bad("vision.merge", std::to_string(v.merge) + " does not divide the " +
                              std::to_string(v.image_size / v.patch_size) + " patches of an image side");
  } else if (v.position_embedding == PositionEmbedding::Learned) {
    bad("vision.image_size", "a learned position table needs a fixed image size");
  }
  if (v.image_size == 0 && v.class_token) bad("vision.class_token", "only modelled with a fixed image size");
  if (v.image_tokens < 0 || v.image_tokens > kMaxSize) bad("vision.image_tokens", "must be within 1 .. 2^31");
  if (v.image_tokens > 0 && v.image_size > 0 && v.image_tokens % v.tokens_per_image() != 0)
    bad("vision.image_tokens", std::to_string(v.image_tokens) + " is not a whole number of images of " +
                                   std::to_string(v.tokens_per_image()) + " tokens each");
  if (v.window < 0 || v.window > kMaxSize) bad("vision.window", "must be within 1 .. 2^31 (or absent)");
  if (v.global_layer_every < 0 || v.global_layer_every > v.num_layers)
    bad("vision.global_layer_every", "must be within 0 .. vision.num_layers");
  if (v.window == 0 && v.global_layer_every != 0) bad("vision.global_layer_every", "only meaningful with a window");
  if (v.class_token_to_lm && !v.class_token) bad("vision.class_token_to_lm", "needs vision.class_token");
  if (v.projector_layers < 1 || v.projector_layers > 16)
    bad("vision.projector_layers", "must be within 1 .. 16, got " + std::to_string(v.projector_layers));
  if (v.block_rotary && v.position_embedding != PositionEmbedding::Learned)
    bad("vision.block_rotary", "rotary beside a learned table: only meaningful with position_embedding: learned");
  if (v.qk_norm == QkNorm::L2) bad("vision.qk_norm", "l2 is a language model's norm (its rotary layers)");
  if (!(v.norm_eps > 0)) bad("vision.norm_eps", "must be positive");
}

}  // namespace

void validate_model(const ModelSpec& m, const std::string& source) {
  auto bad = [&](const std::string& key, const std::string& msg) {
    throw InputError(source + ": key '" + key + "': " + msg);
  };
  if (m.family != "decoder") bad("family", "'" + m.family + "' is not supported (only 'decoder')");
  // Sizes beyond 2^31 are typos, and they would overflow the module graph's products.
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  const std::pair<const char*, int64_t> sizes[] = {{"hidden_size", m.hidden_size}, {"num_layers", m.num_layers},
                                                   {"num_heads", m.num_heads},     {"num_kv_heads", m.num_kv_heads},
                                                   {"head_dim", m.head_dim},       {"ffn_size", m.ffn_size},
                                                   {"vocab_size", m.vocab_size},   {"max_positions", m.max_positions}};
  for (const auto& [key, v] : sizes)
    if (v <= 0 || v > kMaxSize) bad(key, "must be within 1 .. 2^31, got " + std::to_string(v));
  if (m.rope_scaled_positions < 0 || m.rope_scaled_positions > kMaxSize)
    bad("rope_scaled_positions", "must be within 1 .. 2^31, got " + std::to_string(m.rope_scaled_positions));
  if (m.moe && (m.moe->num_experts > kMaxSize || m.moe->expert_ffn_size > kMaxSize || m.moe->shared_experts > kMaxSize))
    bad("moe", "sizes must be at most 2^31");
  if (m.num_heads % m.num_kv_heads != 0)
    bad("num_kv_heads", std::to_string(m.num_kv_heads) + " does not divide num_heads " + std::to_string(m.num_heads));
  // With an explicit head_dim, attention works on num_heads * head_dim (which may differ from hidden_size,
  // as in Gemma); readers that derive head_dim (config.json without head_dim) require heads to divide hidden.
  if (m.head_dim <= 0) bad("head_dim", "must be positive");
  if (m.position_embedding == PositionEmbedding::Rope && m.head_dim % 2 != 0)
    bad("head_dim", "rotary embeddings need an even head_dim, got " + std::to_string(m.head_dim));
  validate_layer_parts(m, bad);
  validate_moe_mla(m, bad);
  if (m.vision) validate_vision(*m.vision, bad);
  if (m.moe) {
    if (m.moe->experts_per_token > m.moe->num_experts)
      bad("moe.experts_per_token",
          std::to_string(m.moe->experts_per_token) + " exceeds num_experts " + std::to_string(m.moe->num_experts));
  }
}

namespace {

// The optional keys (configs/models/README.md): absent means Llama's block.
bool optional_bool(ConfigMap& map, const std::string& key, bool absent) {
  return map.has(key) ? map.get_bool(key) : absent;
}

// qk_norm's names (model_spec.hpp QkNorm); l2 only for a language model's layers.
QkNorm qk_norm_key(ConfigMap& map, const std::string& key, bool l2) {
  const std::string q = l2 ? map.get_enum(key, {"none", "per_head", "projection", "l2"})
                           : map.get_enum(key, {"none", "per_head", "projection"});
  return q == "none" ? QkNorm::None : q == "per_head" ? QkNorm::PerHead : q == "l2" ? QkNorm::L2 : QkNorm::Projection;
}

void parse_layer_parts(ConfigMap& map, ModelSpec& m) {
  m.pre_attention_norm = optional_bool(map, "pre_attention_norm", true);
  m.pre_mlp_norm = optional_bool(map, "pre_mlp_norm", true);
  m.post_attention_norm = optional_bool(map, "post_attention_norm", false);
  m.post_mlp_norm = optional_bool(map, "post_mlp_norm", false);
  m.parallel_block = optional_bool(map, "parallel_block", false);
  if (map.has("qk_norm")) {
    m.qk_norm = qk_norm_key(map, "qk_norm", true);
  }
  if (map.has("rotary_dim")) {
    if (m.position_embedding != PositionEmbedding::Rope) map.fail("rotary_dim", "only meaningful with rope");
    m.rotary_dim = map.get_positive_int("rotary_dim");
    if (m.rotary_dim == m.head_dim) m.rotary_dim = 0;  // the whole head: the same as absent
  }
  if (map.has("value_views_fused_qkv")) {
    if (m.position_embedding != PositionEmbedding::Rope) map.fail("value_views_fused_qkv", "only meaningful with rope");
    m.value_views_fused_qkv = map.get_bool("value_views_fused_qkv");
  }
  if (map.has("sliding_window")) {
    m.sliding_window = map.get_positive_int("sliding_window");
    m.global_layer_every = map.get_int("global_layer_every");  // required with a window: no silent pattern
    m.chunked_attention = optional_bool(map, "chunked_attention", false);
  } else {
    for (const char* key : {"global_layer_every", "chunked_attention"})
      if (map.has(key)) map.fail(key, "only meaningful with sliding_window");
  }
  if (map.has("nope_layer_every")) {
    if (m.position_embedding != PositionEmbedding::Rope) map.fail("nope_layer_every", "only meaningful with rope");
    m.nope_layer_every = map.get_positive_int("nope_layer_every");
  }
  if (map.has("attn_logit_softcap")) m.attn_logit_softcap = map.get_positive_double("attn_logit_softcap");
  if (map.has("final_logit_softcap")) m.final_logit_softcap = map.get_positive_double("final_logit_softcap");
  m.scaled_embeddings = optional_bool(map, "scaled_embeddings", false);
}

// Writes the optional keys that differ from their defaults, so a Llama-shaped model is written as before.
void emit_layer_parts(const ModelSpec& m, YAML::Emitter& out) {
  const ModelSpec d;  // the defaults
  auto flag = [&](const char* key, bool v, bool def) {
    if (v != def) out << YAML::Key << key << YAML::Value << v;
  };
  flag("pre_attention_norm", m.pre_attention_norm, d.pre_attention_norm);
  flag("pre_mlp_norm", m.pre_mlp_norm, d.pre_mlp_norm);
  flag("post_attention_norm", m.post_attention_norm, d.post_attention_norm);
  flag("post_mlp_norm", m.post_mlp_norm, d.post_mlp_norm);
  flag("parallel_block", m.parallel_block, d.parallel_block);
  if (m.qk_norm != QkNorm::None) out << YAML::Key << "qk_norm" << YAML::Value << to_string(m.qk_norm);
  if (m.rotary_dim != 0) out << YAML::Key << "rotary_dim" << YAML::Value << m.rotary_dim;
  flag("value_views_fused_qkv", m.value_views_fused_qkv, d.value_views_fused_qkv);
  if (m.sliding_window != 0) {
    out << YAML::Key << "sliding_window" << YAML::Value << m.sliding_window;
    out << YAML::Key << "global_layer_every" << YAML::Value << m.global_layer_every;
    flag("chunked_attention", m.chunked_attention, d.chunked_attention);
  }
  if (m.nope_layer_every != 0) out << YAML::Key << "nope_layer_every" << YAML::Value << m.nope_layer_every;
  if (m.attn_logit_softcap > 0) out << YAML::Key << "attn_logit_softcap" << YAML::Value << m.attn_logit_softcap;
  if (m.final_logit_softcap > 0) out << YAML::Key << "final_logit_softcap" << YAML::Value << m.final_logit_softcap;
  flag("scaled_embeddings", m.scaled_embeddings, d.scaled_embeddings);
}

// The moe map: Mixtral's four keys, and the optional parts of MoeSpec (absent: Mixtral's block).
MoeSpec parse_moe(ConfigMap& moe) {
  MoeSpec s;
  s.num_experts = moe.get_positive_int("num_experts");
  s.experts_per_token = moe.get_positive_int("experts_per_token");
  s.shared_experts = moe.get_int("shared_experts");
  if (s.shared_experts < 0) moe.fail("shared_experts", "must not be negative");
  s.expert_ffn_size = moe.get_positive_int("expert_ffn_size");
  if (moe.has("shared_expert_ffn_size")) {
    if (s.shared_experts == 0) moe.fail("shared_expert_ffn_size", "only meaningful with shared_experts");
    s.shared_expert_ffn_size = moe.get_positive_int("shared_expert_ffn_size");
  }
  s.shared_expert_gate = optional_bool(moe, "shared_expert_gate", false);
  if (s.shared_expert_gate && s.shared_experts == 0)
    moe.fail("shared_expert_gate", "only meaningful with shared_experts");
  s.router_bias = optional_bool(moe, "router_bias", false);
  s.norm_topk_prob = optional_bool(moe, "norm_topk_prob", true);
  if (moe.has("capacity_factor")) {
    s.capacity_factor = moe.get_positive_double("capacity_factor");
    // A factor beyond the experts' count would give an expert more rows than there are routed tokens.
    if (s.capacity_factor > static_cast<double>(s.num_experts))
      moe.fail("capacity_factor", "must be within (0, num_experts]");
  }
  s.pad_to_capacity = optional_bool(moe, "pad_to_capacity", false);
  if (s.pad_to_capacity && s.capacity_factor == 0) moe.fail("pad_to_capacity", "only meaningful with capacity_factor");
  if (moe.has("first_dense_layers")) s.first_dense_layers = moe.get_int("first_dense_layers");
  if (s.first_dense_layers < 0) moe.fail("first_dense_layers", "must not be negative");
  if (moe.has("layer_step")) s.layer_step = moe.get_positive_int("layer_step");
  moe.finish();
  return s;
}

MlaSpec parse_mla(ConfigMap& mla) {
  MlaSpec a;
  if (mla.has("q_lora_rank")) a.q_lora_rank = mla.get_positive_int("q_lora_rank");
  a.kv_lora_rank = mla.get_positive_int("kv_lora_rank");
  a.qk_nope_head_dim = mla.get_positive_int("qk_nope_head_dim");
  a.qk_rope_head_dim = mla.get_positive_int("qk_rope_head_dim");
  a.v_head_dim = mla.get_positive_int("v_head_dim");
  mla.finish();
  return a;
}

ActivationFn activation_key(ConfigMap& map, const std::string& key) {
  const std::string act = map.get_enum(key, {"silu", "gelu", "gelu_tanh", "quick_gelu"});
  return act == "silu"        ? ActivationFn::Silu
         : act == "gelu"      ? ActivationFn::Gelu
         : act == "gelu_tanh" ? ActivationFn::GeluTanh
                              : ActivationFn::QuickGelu;
}

NormType norm_key(ConfigMap& map, const std::string& key) {
  const std::string norm = map.get_enum(key, {"rmsnorm", "layernorm", "layernorm_no_params"});
  return norm == "rmsnorm"     ? NormType::RmsNorm
         : norm == "layernorm" ? NormType::LayerNorm
                               : NormType::LayerNormNoParams;
}

// The vision map (configs/models/README.md "Vision towers"): the blocks' shape and parts, the image geometry and
// the projector; the optional keys default to a ViT without windows, merge or projector norm.
VisionSpec parse_vision(ConfigMap& map) {
  VisionSpec v;
  v.hidden_size = map.get_positive_int("hidden_size");
  v.num_layers = map.get_positive_int("num_layers");
  v.run_layers = map.has("run_layers") ? map.get_positive_int("run_layers") : v.num_layers;
  v.num_heads = map.get_positive_int("num_heads");
  v.ffn_size = map.get_positive_int("ffn_size");
  v.gated_mlp = map.get_bool("gated_mlp");
  v.activation = activation_key(map, "activation");
  v.norm = norm_key(map, "norm");
  v.norm_eps = map.get_positive_double("norm_eps");
  v.qkv_bias = map.get_bool("qkv_bias");
  v.attn_out_bias = map.get_bool("attn_out_bias");
  v.mlp_bias = map.get_bool("mlp_bias");
  v.position_embedding = map.get_enum("position_embedding", {"rope", "learned"}) == "rope" ? PositionEmbedding::Rope
                                                                                           : PositionEmbedding::Learned;
  v.block_rotary = optional_bool(map, "block_rotary", false);
  if (map.has("qk_norm")) v.qk_norm = qk_norm_key(map, "qk_norm", false);
  v.layer_scale = optional_bool(map, "layer_scale", false);
  v.patch_size = map.get_positive_int("patch_size");
  if (map.has("temporal_patch_size")) v.temporal_patch_size = map.get_positive_int("temporal_patch_size");
  if (map.has("num_channels")) v.num_channels = map.get_positive_int("num_channels");
  if (map.has("image_size")) v.image_size = map.get_positive_int("image_size");
  v.patch_bias = map.get_bool("patch_bias");
  v.class_token = map.get_bool("class_token");
  v.pre_norm = map.get_bool("pre_norm");
  v.post_norm = map.get_bool("post_norm");
  if (map.has("window")) {
    v.window = map.get_positive_int("window");
    v.global_layer_every = map.get_int("global_layer_every");  // required with a window: no silent pattern
  } else if (map.has("global_layer_every")) {
    map.fail("global_layer_every", "only meaningful with window");
  }
  if (map.has("merge")) v.merge = map.get_positive_int("merge");
  if (map.has("projector_norm")) {
    const std::string n = map.get_enum("projector_norm", {"none", "before_merge", "after_merge"});
    v.projector_norm = n == "none"           ? ProjectorNorm::None
                       : n == "before_merge" ? ProjectorNorm::BeforeMerge
                                             : ProjectorNorm::AfterMerge;
  }
  if (map.has("projector_norm_type")) {
    if (v.projector_norm == ProjectorNorm::None) map.fail("projector_norm_type", "only meaningful with projector_norm");
    v.projector_norm_type = norm_key(map, "projector_norm_type");
  }
  if (map.has("projector_layers")) v.projector_layers = map.get_positive_int("projector_layers");
  v.projector_bias = optional_bool(map, "projector_bias", true);
  v.projector_hidden = map.get_positive_int("projector_hidden");
  v.projector_activation = activation_key(map, "projector_activation");
  v.class_token_to_lm = optional_bool(map, "class_token_to_lm", false);
  if (map.has("image_tokens")) v.image_tokens = map.get_positive_int("image_tokens");
  map.finish();
  // One image at the fixed size when the file gives no count (the reader of config.json does the same).
  if (v.image_tokens == 0 && v.image_size > 0 && v.patch_size > 0 && v.merge > 0 &&
      v.image_size % (v.patch_size * v.merge) == 0)
    v.image_tokens = v.tokens_per_image();
  return v;
}

void emit_vision(const VisionSpec& v, YAML::Emitter& out) {
  const VisionSpec d;
  out << YAML::Key << "vision" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "hidden_size" << YAML::Value << v.hidden_size;
  out << YAML::Key << "num_layers" << YAML::Value << v.num_layers;
  if (v.run_layers != v.num_layers) out << YAML::Key << "run_layers" << YAML::Value << v.run_layers;
  out << YAML::Key << "num_heads" << YAML::Value << v.num_heads;
  out << YAML::Key << "ffn_size" << YAML::Value << v.ffn_size;
  out << YAML::Key << "gated_mlp" << YAML::Value << v.gated_mlp;
  out << YAML::Key << "activation" << YAML::Value << to_string(v.activation);
  out << YAML::Key << "norm" << YAML::Value << to_string(v.norm);
  out << YAML::Key << "norm_eps" << YAML::Value << v.norm_eps;
  out << YAML::Key << "qkv_bias" << YAML::Value << v.qkv_bias;
  out << YAML::Key << "attn_out_bias" << YAML::Value << v.attn_out_bias;
  out << YAML::Key << "mlp_bias" << YAML::Value << v.mlp_bias;
  out << YAML::Key << "position_embedding" << YAML::Value << to_string(v.position_embedding);
  if (v.block_rotary) out << YAML::Key << "block_rotary" << YAML::Value << true;
  if (v.qk_norm != QkNorm::None) out << YAML::Key << "qk_norm" << YAML::Value << to_string(v.qk_norm);
  if (v.layer_scale) out << YAML::Key << "layer_scale" << YAML::Value << true;
  out << YAML::Key << "patch_size" << YAML::Value << v.patch_size;
  if (v.temporal_patch_size != d.temporal_patch_size)
    out << YAML::Key << "temporal_patch_size" << YAML::Value << v.temporal_patch_size;
  if (v.num_channels != d.num_channels) out << YAML::Key << "num_channels" << YAML::Value << v.num_channels;
  if (v.image_size > 0) out << YAML::Key << "image_size" << YAML::Value << v.image_size;
  out << YAML::Key << "patch_bias" << YAML::Value << v.patch_bias;
  out << YAML::Key << "class_token" << YAML::Value << v.class_token;
  out << YAML::Key << "pre_norm" << YAML::Value << v.pre_norm;
  out << YAML::Key << "post_norm" << YAML::Value << v.post_norm;
  if (v.window > 0) {
    out << YAML::Key << "window" << YAML::Value << v.window;
    out << YAML::Key << "global_layer_every" << YAML::Value << v.global_layer_every;
  }
  if (v.merge != d.merge) out << YAML::Key << "merge" << YAML::Value << v.merge;
  if (v.projector_norm != ProjectorNorm::None) {
    out << YAML::Key << "projector_norm" << YAML::Value << to_string(v.projector_norm);
    out << YAML::Key << "projector_norm_type" << YAML::Value << to_string(v.projector_norm_type);
  }
  if (v.projector_layers != d.projector_layers)
    out << YAML::Key << "projector_layers" << YAML::Value << v.projector_layers;
  if (!v.projector_bias) out << YAML::Key << "projector_bias" << YAML::Value << false;
  out << YAML::Key << "projector_hidden" << YAML::Value << v.projector_hidden;
  out << YAML::Key << "projector_activation" << YAML::Value << to_string(v.projector_activation);
  if (v.class_token_to_lm) out << YAML::Key << "class_token_to_lm" << YAML::Value << true;
  if (v.image_tokens > 0) out << YAML::Key << "image_tokens" << YAML::Value << v.image_tokens;
  out << YAML::EndMap;
}

// The optional MoE keys that differ from Mixtral's block, and the mla map.
void emit_moe_mla(const ModelSpec& m, YAML::Emitter& out) {
  if (m.moe) {
    const MoeSpec& e = *m.moe;
    const MoeSpec d;
    out << YAML::Key << "moe" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "num_experts" << YAML::Value << e.num_experts;
    out << YAML::Key << "experts_per_token" << YAML::Value << e.experts_per_token;
    out << YAML::Key << "shared_experts" << YAML::Value << e.shared_experts;
    out << YAML::Key << "expert_ffn_size" << YAML::Value << e.expert_ffn_size;
    if (e.shared_expert_ffn_size != 0)
      out << YAML::Key << "shared_expert_ffn_size" << YAML::Value << e.shared_expert_ffn_size;
    if (e.shared_expert_gate) out << YAML::Key << "shared_expert_gate" << YAML::Value << true;
    if (e.router_bias) out << YAML::Key << "router_bias" << YAML::Value << true;
    if (e.norm_topk_prob != d.norm_topk_prob) out << YAML::Key << "norm_topk_prob" << YAML::Value << e.norm_topk_prob;
    if (e.capacity_factor > 0) out << YAML::Key << "capacity_factor" << YAML::Value << e.capacity_factor;
    if (e.pad_to_capacity) out << YAML::Key << "pad_to_capacity" << YAML::Value << true;
    if (e.first_dense_layers != d.first_dense_layers)
      out << YAML::Key << "first_dense_layers" << YAML::Value << e.first_dense_layers;
    if (e.layer_step != d.layer_step) out << YAML::Key << "layer_step" << YAML::Value << e.layer_step;
    out << YAML::EndMap;
  }
  if (m.mla) {
    const MlaSpec& a = *m.mla;
    out << YAML::Key << "mla" << YAML::Value << YAML::BeginMap;
    if (a.q_lora_rank > 0) out << YAML::Key << "q_lora_rank" << YAML::Value << a.q_lora_rank;
    out << YAML::Key << "kv_lora_rank" << YAML::Value << a.kv_lora_rank;
    out << YAML::Key << "qk_nope_head_dim" << YAML::Value << a.qk_nope_head_dim;
    out << YAML::Key << "qk_rope_head_dim" << YAML::Value << a.qk_rope_head_dim;
    out << YAML::Key << "v_head_dim" << YAML::Value << a.v_head_dim;
    out << YAML::EndMap;
  }
}

}  // namespace

ModelSpec parse_model_map(ConfigMap& map) {
  ModelSpec m;
  m.name = map.get_string("name");
  m.family = map.get_enum("family", {"decoder"});
  if (map.has("hf_model_type")) {
    m.hf_model_type = map.get_string("hf_model_type");
    if (m.hf_model_type.empty()) map.fail("hf_model_type", "is empty; leave the key out where the model has none");
  }
  m.hidden_size = map.get_positive_int("hidden_size");
  m.num_layers = map.get_positive_int("num_layers");
  m.num_heads = map.get_positive_int("num_heads");
  m.num_kv_heads = map.get_positive_int("num_kv_heads");
  m.head_dim = map.get_positive_int("head_dim");
  m.ffn_size = map.get_positive_int("ffn_size");
  m.gated_mlp = map.get_bool("gated_mlp");
  m.activation = activation_key(map, "activation");
  m.vocab_size = map.get_positive_int("vocab_size");
  m.tied_embeddings = map.get_bool("tied_embeddings");
  const std::string norm = map.get_enum("norm", {"rmsnorm", "layernorm", "layernorm_no_params"});
  m.norm = norm == "rmsnorm"     ? NormType::RmsNorm
           : norm == "layernorm" ? NormType::LayerNorm
                                 : NormType::LayerNormNoParams;
  m.norm_eps = map.get_positive_double("norm_eps");
  m.position_embedding = map.get_enum("position_embedding", {"rope", "learned"}) == "rope" ? PositionEmbedding::Rope
                                                                                           : PositionEmbedding::Learned;
  if (m.position_embedding == PositionEmbedding::Rope) {
    m.rope_theta = map.get_positive_double("rope_theta");
  } else if (map.has("rope_theta")) {
    map.fail("rope_theta", "only meaningful with position_embedding: rope");
  }
  m.max_positions = map.get_positive_int("max_positions");
  if (map.has("rope_scaled_positions")) {
    if (m.position_embedding != PositionEmbedding::Rope)
      map.fail("rope_scaled_positions", "only meaningful with position_embedding: rope");
    m.rope_scaled_positions = map.get_positive_int("rope_scaled_positions");
  }
  m.qkv_bias = map.get_bool("qkv_bias");
  m.attn_out_bias = map.get_bool("attn_out_bias");
  m.mlp_bias = map.get_bool("mlp_bias");
  m.dropout = map.get_bool("dropout");
  parse_layer_parts(map, m);
  if (map.has("moe")) {
    ConfigMap moe = map.get_map("moe");
    m.moe = parse_moe(moe);
  }
  if (map.has("mla")) {
    ConfigMap mla = map.get_map("mla");
    m.mla = parse_mla(mla);
  }
  if (map.has("vision")) {
    ConfigMap vision = map.get_map("vision");
    m.vision = parse_vision(vision);
  }
  map.finish();
  if (m.num_heads % m.num_kv_heads != 0)
    map.fail("num_kv_heads",
             std::to_string(m.num_kv_heads) + " does not divide num_heads " + std::to_string(m.num_heads));
  if (m.moe && m.moe->experts_per_token > m.moe->num_experts) map.fail("moe", "experts_per_token exceeds num_experts");
  validate_model(m, map.source());
  return m;
}

void emit_model_map(const ModelSpec& m, YAML::Emitter& out) {
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << m.name;
  out << YAML::Key << "family" << YAML::Value << m.family;
  if (!m.hf_model_type.empty()) out << YAML::Key << "hf_model_type" << YAML::Value << m.hf_model_type;
  out << YAML::Key << "hidden_size" << YAML::Value << m.hidden_size;
  out << YAML::Key << "num_layers" << YAML::Value << m.num_layers;
  out << YAML::Key << "num_heads" << YAML::Value << m.num_heads;
  out << YAML::Key << "num_kv_heads" << YAML::Value << m.num_kv_heads;
  out << YAML::Key << "head_dim" << YAML::Value << m.head_dim;
  out << YAML::Key << "ffn_size" << YAML::Value << m.ffn_size;
  out << YAML::Key << "gated_mlp" << YAML::Value << m.gated_mlp;
  out << YAML::Key << "activation" << YAML::Value << to_string(m.activation);
  out << YAML::Key << "vocab_size" << YAML::Value << m.vocab_size;
  out << YAML::Key << "tied_embeddings" << YAML::Value << m.tied_embeddings;
  out << YAML::Key << "norm" << YAML::Value << to_string(m.norm);
  out << YAML::Key << "norm_eps" << YAML::Value << m.norm_eps;
  out << YAML::Key << "position_embedding" << YAML::Value << to_string(m.position_embedding);
  if (m.position_embedding == PositionEmbedding::Rope) out << YAML::Key << "rope_theta" << YAML::Value << m.rope_theta;
  out << YAML::Key << "max_positions" << YAML::Value << m.max_positions;
  if (m.rope_scaled_positions > 0)
    out << YAML::Key << "rope_scaled_positions" << YAML::Value << m.rope_scaled_positions;
  out << YAML::Key << "qkv_bias" << YAML::Value << m.qkv_bias;
  out << YAML::Key << "attn_out_bias" << YAML::Value << m.attn_out_bias;
  out << YAML::Key << "mlp_bias" << YAML::Value << m.mlp_bias;
  out << YAML::Key << "dropout" << YAML::Value << m.dropout;
  emit_layer_parts(m, out);
  emit_moe_mla(m, out);
  if (m.vision) emit_vision(*m.vision, out);
  out << YAML::EndMap;
}

namespace {

std::string models_dir(const std::string& root) {
  return (std::filesystem::path(root) / "configs" / "models").string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<ZooEntry> list_zoo(const std::string& config_root) {
  std::vector<ZooEntry> out;
  std::string dir = models_dir(config_root);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string file = e.path().filename().string();
    if (!ends_with(file, ".yaml") || file == "aliases.yaml") continue;
    out.push_back(ZooEntry{e.path().stem().string(), {}, e.path().string()});
  }
  if (ec) throw InputError(dir + ": cannot list the model zoo (" + ec.message() + ")");
  std::sort(out.begin(), out.end(), [](const ZooEntry& a, const ZooEntry& b) { return a.name < b.name; });
  std::string alias_file = dir + "/aliases.yaml";
  if (std::filesystem::exists(alias_file)) {
    ConfigMap aliases = ConfigMap::load_file(alias_file);
    for (const auto& key : aliases.keys()) {
      std::string target = aliases.get_string(key);
      auto it = std::find_if(out.begin(), out.end(), [&](const ZooEntry& z) { return z.name == target; });
      if (it == out.end()) aliases.fail(key, "alias points to unknown model '" + target + "'");
      it->aliases.push_back(key);
    }
  }
  return out;
}

namespace {

// A hub id: "owner/name" with no file behind it (load_model tries local paths first).
bool looks_like_hub_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size()) return false;
  if (s.find('/', slash + 1) != std::string::npos || s[0] == '.' || s[0] == '~') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '-' || c == '_' || c == '.';
  });
}

// A Hugging Face config.json; without _name_or_path the model is named after the directory holding the file (the
// snapshot's, Qwen2.5-7B/config.json -> Qwen2.5-7B), not "config".
LoadedModel read_hf_config_named_by_directory(const std::string& path) {
  LoadedModel loaded = read_hf_config(read_text(path), path);
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::weakly_canonical(path, ec);
  if (loaded.spec.name == "config" && !ec && file.has_parent_path() && !file.parent_path().filename().empty())
    loaded.spec.name = file.parent_path().filename().string();
  return loaded;
}

LoadedModel from_yaml(const std::string& path) {
  ConfigMap map = ConfigMap::load_file(path);
  return LoadedModel{parse_model_map(map), {}};
}

}  // namespace

LoadedModel load_model_with_warnings(const std::string& name_or_path, const std::string& config_root) {
  if (name_or_path.empty()) throw InputError("--model: empty model name");
  std::error_code ec;
  if (std::filesystem::is_directory(name_or_path, ec)) {
    // A Hugging Face model directory (a snapshot, a save_pretrained output): its config.json.
    const std::string config = (std::filesystem::path(name_or_path) / "config.json").string();
    if (!std::filesystem::exists(config, ec))
      throw InputError("--model: " + name_or_path + " is a directory without a config.json");
    return read_hf_config_named_by_directory(config);
  }
  if (ends_with(name_or_path, ".json")) return read_hf_config_named_by_directory(name_or_path);
  const bool exists = std::filesystem::exists(name_or_path, ec);
  if (!exists && looks_like_hub_id(name_or_path) && !ends_with(name_or_path, ".yaml") &&
      !ends_with(name_or_path, ".yml"))
    throw InputError("--model: '" + name_or_path +
                     "' looks like a Hugging Face hub id, and there is no network here: give the config.json "
                     "path or a model directory (e.g. the snapshot that huggingface-cli download wrote)");
  if (ends_with(name_or_path, ".yaml") || ends_with(name_or_path, ".yml") ||
      name_or_path.find('/') != std::string::npos)
    return from_yaml(name_or_path);
  std::vector<ZooEntry> zoo = list_zoo(config_root);
  for (const auto& z : zoo) {
    bool match =
        z.name == name_or_path || std::find(z.aliases.begin(), z.aliases.end(), name_or_path) != z.aliases.end();
    if (match) return from_yaml(z.path);
  }
  std::string names;
  for (const auto& z : zoo) names += (names.empty() ? "" : ", ") + z.name;
  throw InputError("--model: unknown model '" + name_or_path + "' (known: " + names +
                   "; or give a path to a .yaml model file, a Hugging Face config.json or a model directory)");
}

std::string hf_model_directory(const std::string& name_or_path) {
  std::error_code ec;
  std::filesystem::path dir;
  if (std::filesystem::is_directory(name_or_path, ec)) {
    dir = name_or_path;
  } else if (ends_with(name_or_path, ".json") && std::filesystem::is_regular_file(name_or_path, ec)) {
    dir = std::filesystem::path(name_or_path).parent_path();
    if (dir.empty()) dir = ".";
  } else {
    return "";
  }
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
  return ec ? "" : canonical.string();
}

ModelSpec load_model(const std::string& name_or_path, const std::string& config_root) {
  LoadedModel loaded = load_model_with_warnings(name_or_path, config_root);
  for (const auto& w : loaded.warnings) std::cerr << "fsdp-plan: warning: " << w << "\n";
  return std::move(loaded.spec);
}

}  // namespace fsdp
