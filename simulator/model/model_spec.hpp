// The declarative description of a decoder-only transformer (configs/models/*.yaml
// or a Hugging Face config.json). Plain data; the module graph
// (module_graph.hpp) expands it into modules with parameters, FLOPs and saved bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fsdp {

// RMSNorm (a weight), LayerNorm (weight and bias), or OLMo 1's LayerNorm without parameters
// (transformers models/olmo/modeling_olmo.py OlmoLayerNorm: F.layer_norm(x, shape, None, None)).
enum class NormType { RmsNorm, LayerNorm, LayerNormNoParams };
// Normalisation of q and k before rotary: none; per head over head_dim with one head_dim-wide weight shared by
// the heads (Qwen3Attention, Gemma3Attention: RMSNorm(head_dim)); or over the whole projection, num_heads *
// head_dim for q and num_kv_heads * head_dim for k (Olmo2Attention: RMSNorm(num_heads * head_dim)).
enum class QkNorm { None, PerHead, Projection };
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

  // The parts below are optional in the YAML schema; each default is Llama's block (configs/models/README.md).
  // A decoder layer's norms. Llama: input_layernorm before attention and post_attention_layernorm before the
  // MLP (pre_attention_norm, pre_mlp_norm). Gemma 2/3 add norms on the attention and MLP outputs before their
  // residual adds (post_attention_layernorm, post_feedforward_layernorm; the pre-MLP one is then
  // pre_feedforward_layernorm); OLMo 2 has only those two (Olmo2DecoderLayer).
  bool pre_attention_norm = true;
  bool pre_mlp_norm = true;
  bool post_attention_norm = false;
  bool post_mlp_norm = false;
  // Attention and MLP both read the layer input and their outputs join one residual add: x + attn(n1(x)) +
  // mlp(n2(x)) (GPTNeoXLayer with use_parallel_residual: two norms; FalconDecoderLayer with parallel_attn:
  // without pre_mlp_norm the MLP reads the input norm's output, Falcon-7B's single shared norm).
  bool parallel_block = false;
  QkNorm qk_norm = QkNorm::None;
  // Dimensions of each q/k head that rotary rotates (rope only), when fewer than head_dim (GPT-NeoX
  // rotary_ndims = head_dim * rotary_pct, GLM head_dim * partial_rotary_factor); 0: all of head_dim. FLOPs only.
  int64_t rotary_dim = 0;
  // Local attention: the layers that are sliding attend to at most `sliding_window` earlier keys (0: none, every
  // layer global). With a window, every `global_layer_every`-th layer (0-based indices N-1, 2N-1, ...) stays
  // global, as Gemma 2 (N = 2: Gemma2DecoderLayer is_sliding = not bool(layer_idx % 2)) and Gemma 3 (N = 6:
  // is_sliding = bool((layer_idx + 1) % sliding_window_pattern)); 0: every layer slides (Mistral).
  int64_t sliding_window = 0;
  int64_t global_layer_every = 0;
  // tanh soft-capping, cap * tanh(x / cap), of the attention scores and of the final logits (Gemma 2); 0: none.
  // No parameters; the attention cap keeps one more score-sized tensor under eager attention.
  double attn_logit_softcap = 0;
  double final_logit_softcap = 0;
  // The embedding output is multiplied by sqrt(hidden_size) (GemmaModel's normalizer): no parameters.
  bool scaled_embeddings = false;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // The attention window of decoder layer `layer`: the sliding window, or 0 for a global layer.
  int64_t attention_window(int64_t layer) const {
    if (sliding_window == 0) return 0;
    const bool global = global_layer_every > 0 && (layer + 1) % global_layer_every == 0;
    return global ? 0 : sliding_window;
  }
};

const char* to_string(NormType);
const char* to_string(QkNorm);
const char* to_string(ActivationFn);
const char* to_string(PositionEmbedding);

}  // namespace fsdp
