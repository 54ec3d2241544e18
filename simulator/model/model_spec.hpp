// The declarative description of a decoder-only transformer (configs/models/*.yaml
// or a Hugging Face config.json). Plain data; the module graph
// (module_graph.hpp) expands it into modules with parameters, FLOPs and saved bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fsdp {

enum class NormType { RmsNorm, LayerNorm };
enum class ActivationFn { Silu, Gelu, GeluTanh };
enum class PositionEmbedding { Rope, Learned };

struct MoeSpec {
  int64_t num_experts = 0;        // routed experts per MoE layer
  int64_t experts_per_token = 0;  // top-k
  int64_t shared_experts = 0;     // always-active experts (DeepSeek/Qwen-MoE style)
  int64_t expert_ffn_size = 0;    // intermediate size of one expert
};

struct ModelSpec {
  std::string name;
  std::string family;  // "decoder" (decoder-only causal LM); the only family so far
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads: MHA; 1: MQA; otherwise GQA
  int64_t head_dim = 0;      // usually hidden_size / num_heads
  int64_t ffn_size = 0;      // dense MLP intermediate size (unused in MoE layers)
  bool gated_mlp = false;    // SwiGLU / GeGLU: gate, up and down projections
  ActivationFn activation = ActivationFn::Silu;
  int64_t vocab_size = 0;
  bool tied_embeddings = false;
  NormType norm = NormType::RmsNorm;
  double norm_eps = 0;
  PositionEmbedding position_embedding = PositionEmbedding::Rope;
  double rope_theta = 0;  // only for rope
  int64_t max_positions = 0;
  bool qkv_bias = false;       // Qwen, GPT-2
  bool attn_out_bias = false;  // GPT-2
  bool mlp_bias = false;       // GPT-2
  bool dropout = false;        // GPT-2 style dropout after attention softmax, attention output and MLP
  std::optional<MoeSpec> moe;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

const char* to_string(NormType);
const char* to_string(ActivationFn);
const char* to_string(PositionEmbedding);

}  // namespace fsdp
