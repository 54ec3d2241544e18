// The declarative description of a decoder-only transformer (configs/models/*.yaml
// or a Hugging Face config.json). Plain data; the module graph
// (module_graph.hpp) expands it into modules with parameters, FLOPs and saved bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace fsdp {

// RMSNorm (a weight), LayerNorm (weight and bias), or OLMo 1's LayerNorm without parameters
// (transformers models/olmo/modeling_olmo.py OlmoLayerNorm: F.layer_norm(x, shape, None, None)).
enum class NormType { RmsNorm, LayerNorm, LayerNormNoParams };
// Normalisation of q and k before rotary: none; per head over head_dim with one head_dim-wide weight shared by
// the heads (Qwen3Attention, Gemma3Attention: RMSNorm(head_dim)); or over the whole projection, num_heads *
// head_dim for q and num_kv_heads * head_dim for k (Olmo2Attention: RMSNorm(num_heads * head_dim)); or L2: per head
// without a weight, after rotary and on the rotary layers only (Llama4TextL2Norm, built when use_qk_norm and the
// layer uses rope: transformers models/llama4/modeling_llama4.py Llama4TextAttention @
// 000c33fdfde12e1ffafbfcdb3c926df5727a00b6).
enum class QkNorm { None, PerHead, Projection, L2 };
// QuickGelu: x * sigmoid(1.702 x) (transformers activations.py QuickGELUActivation; CLIP's hidden_act).
enum class ActivationFn { Silu, Gelu, GeluTanh, QuickGelu };
enum class PositionEmbedding { Rope, Learned };

struct MoeSpec {
  int64_t num_experts = 0;        // routed experts per MoE layer
  int64_t experts_per_token = 0;  // top-k
  int64_t shared_experts = 0;     // always-active experts (DeepSeek/Qwen-MoE style)
  int64_t expert_ffn_size = 0;    // intermediate size of one expert
  // The parts below are optional in the YAML schema; each default is Mixtral's block (configs/models/README.md).
  // Intermediate size of each shared expert; 0: expert_ffn_size. Qwen2-MoE: shared_expert_intermediate_size;
  // DeepSeek-V2/V3 build one shared MLP of moe_intermediate_size * n_shared_experts (DeepseekV3MoE).
  int64_t shared_expert_ffn_size = 0;
  // Qwen2MoeSparseMoeBlock: the shared expert's output times sigmoid(shared_expert_gate(x)), a hidden -> 1 Linear.
  bool shared_expert_gate = false;
  // A per-expert bias added to the routing scores for the top-k choice (DeepseekV3TopkRouter's
  // e_score_correction_bias: num_experts parameters, no FLOPs worth counting).
  bool router_bias = false;
  // The top-k routing weights divided by their sum (Mixtral always: MixtralSparseMoeBlock's routing_weights /=
  // routing_weights.sum(dim=-1, keepdim=True); Qwen2-MoE / Qwen3-MoE when config.norm_topk_prob, default False in
  // both config classes, true in Qwen3-30B-A3B's config.json); false: the softmax probabilities as they are.
  bool norm_topk_prob = true;
  // Expert capacity: each expert takes at most capacity_factor x its uniform share of the routed tokens (tokens x
  // top-k / experts); 0: dropless, every routed token computed (Hugging Face's blocks, torchtitan, fsdp-run). With
  // pad_to_capacity every expert computes and buffers exactly that many rows, padding when fewer arrive
  // (DeepSpeed-MoE's dispatch into [experts, capacity, hidden]: deepspeed/moe/sharded_moe.py top1gating / top2gating,
  // capacity = ceil(tokens / experts x capacity_factor) per choice; Megatron-LM --moe-expert-capacity-factor with
  // --moe-pad-expert-input-to-capacity, megatron/core/transformer/moe/moe_utils.py get_capacity); without it an expert
  // computes what arrives up to its capacity, under a uniform load min(1, capacity_factor) of its share (the rest
  // dropped).
  double capacity_factor = 0;
  bool pad_to_capacity = false;
  // The rows each expert computes per routed token of its uniform share (1 dropless): capacity_factor padded, at
  // most 1 when tokens beyond capacity are dropped.
  double expert_load_factor() const {
    if (capacity_factor <= 0) return 1.0;
    return pad_to_capacity ? capacity_factor : (capacity_factor < 1.0 ? capacity_factor : 1.0);
  }
  // Which layers are MoE: layers [0, first_dense_layers) keep the dense MLP (DeepSeek's first_k_dense_replace);
  // after them, every layer_step-th one (0-based indices with (i + 1) % layer_step == 0: Qwen2-MoE's
  // decoder_sparse_step) is MoE and the others dense (ffn_size).
  int64_t first_dense_layers = 0;
  int64_t layer_step = 1;

  int64_t shared_ffn() const { return shared_expert_ffn_size > 0 ? shared_expert_ffn_size : expert_ffn_size; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_dense_layers && (layer + 1) % layer_step == 0; }
};

// Multi-head latent attention (DeepSeek-V2 paper, arXiv:2405.04434 sec. 2.1; transformers
// models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3Attention). q: q_a_proj (hidden -> q_lora_rank),
// q_a_layernorm, q_b_proj (-> heads x (nope + rope)), or one q_proj when q_lora_rank is 0 (DeepSeek-V2-Lite);
// kv: kv_a_proj_with_mqa (hidden -> kv_lora_rank + rope: the compressed latent c_KV and the shared rotary key
// k_R), kv_a_layernorm over the latent, kv_b_proj (kv_lora_rank -> heads x (nope + v)); o_proj (heads x v ->
// hidden). The spec's head_dim is the q/k head (nope + rope) and num_kv_heads = num_heads.
struct MlaSpec {
  int64_t q_lora_rank = 0;  // 0: no q compression (a plain q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// How a vision tower's projector normalises its input (VisionSpec): not at all (LlavaMultiModalProjector); each
// patch over the tower's width before the merge (Qwen2VL PatchMerger's ln_q); or each merged token over width x
// merge^2 after it (InternVL's mlp1, LayerNorm(vit_hidden * (1 / downsample_ratio)^2)).
enum class ProjectorNorm { None, BeforeMerge, AfterMerge };

// A vision tower (ViT) in front of the language model, and the projector that maps its patches to image tokens
// of the language model's width. Its blocks are decoder-style layers (pre-norm attention and MLP) of their own
// width, built into the module graph's layer stack ahead of the decoder layers (module_graph.hpp), so FSDP wraps
// them as units like decoder layers; they run on the vision tokens of a sample (vision_tokens()), with
// bidirectional attention within each image (or each window), not on the language model's sequence.
struct VisionSpec {
  int64_t hidden_size = 0;
  int64_t num_layers = 0;  // the blocks the checkpoint holds
  int64_t run_layers = 0;  // the blocks that run: those up to the feature layer (LLaVA's vision_feature_layer)
  int64_t num_heads = 0;
  int64_t ffn_size = 0;
  bool gated_mlp = false;  // Qwen2.5-VL's SwiGLU blocks; CLIP and Qwen2-VL: fc1, act, fc2
  ActivationFn activation = ActivationFn::Gelu;
  NormType norm = NormType::LayerNorm;
  double norm_eps = 0;
  bool qkv_bias = false;
  bool attn_out_bias = false;
  bool mlp_bias = false;
  // Learned: a (patches + class token) x hidden table (CLIP, InternViT); Rope: 2-D rotary on q and k without
  // parameters (Qwen2-VL VisionRotaryEmbedding).
  PositionEmbedding position_embedding = PositionEmbedding::Learned;
  // The blocks also rotate q and k (2-D rotary, no parameters) beside a learned table (Llama 4's vision encoder:
  // positional_embedding_vlm and Llama4VisionRotaryEmbedding, modeling_llama4.py @ 000c33fd).
  bool block_rotary = false;
  // q/k norms of the blocks (InternViT-6B's qk_normalization: RMSNorm over the whole projection, Projection).
  QkNorm qk_norm = QkNorm::None;
  // Layer scale: each sublayer's output times a learned hidden-wide vector before its residual add (InternViT's
  // ls1, ls2: InternVisionEncoderLayer, OpenGVLab/InternVL internvl_chat/internvl/model/internvl_chat/
  // modeling_intern_vit.py @ 2d93b099ffbbf45d1db59710914f26fce4494104).
  bool layer_scale = false;
  int64_t patch_size = 0;
  int64_t temporal_patch_size = 1;  // Qwen2-VL's Conv3d over 2 frames (an image is repeated)
  int64_t num_channels = 3;
  int64_t image_size = 0;  // 0: dynamic resolution (Qwen2-VL): the image tokens are the run's to give
  bool patch_bias = false;
  bool class_token = false;  // a learned CLS token in front of the patches (CLIP)
  bool pre_norm = false;     // a norm over the embeddings before the first block (CLIP's pre_layrnorm)
  bool post_norm = false;    // CLIP's post_layernorm: over the pooled CLS token, held but not on the image path
  // Windowed attention (Qwen2.5-VL): each query attends the `window` patches of its window, except in every
  // `global_layer_every`-th block (0-based N-1, 2N-1, ...), which attends the whole image. 0: every block global.
  int64_t window = 0;
  int64_t global_layer_every = 0;
  // The projector: `merge` x `merge` neighbouring patches become one image token of width hidden x merge^2
  // (1: none), an optional norm, then `projector_layers` linears with the activation between each two:
  // Linear(hidden x merge^2 -> projector_hidden), act, [Linear(projector_hidden -> projector_hidden), act, ...]
  // Linear(projector_hidden -> the language model's hidden size); biased unless projector_bias is false. LLaVA,
  // Qwen2-VL, InternVL: 2 biased linears; Llama 4: 3 without biases (its vision adapter's fc1 and fc2, each followed
  // by GELU, and multi_modal_projector.linear_1).
  int64_t merge = 1;
  int64_t projector_layers = 2;
  bool projector_bias = true;
  ProjectorNorm projector_norm = ProjectorNorm::None;
  NormType projector_norm_type = NormType::LayerNorm;
  int64_t projector_hidden = 0;
  ActivationFn projector_activation = ActivationFn::Gelu;
  bool class_token_to_lm = false;  // the CLS token's feature is an image token too (LLaVA's select strategy "full")
  // Image tokens per sample in the language model's sequence (the run's --image-tokens, else one image at
  // image_size); 0: not known (dynamic resolution without --image-tokens: simulate refuses it).
  int64_t image_tokens = 0;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t merged_width() const { return hidden_size * merge * merge; }
  // Patches of one image at image_size, and its image tokens; 0 with dynamic resolution.
  int64_t patches_per_image() const {
    return image_size > 0 ? (image_size / patch_size) * (image_size / patch_size) : 0;
  }
  int64_t tokens_per_image() const {
    return image_size > 0 ? patches_per_image() / (merge * merge) + (class_token_to_lm ? 1 : 0) : 0;
  }
  // Images per sample: image_tokens of fixed-size images; with dynamic resolution one image of image_tokens.
  int64_t images() const { return image_size > 0 ? image_tokens / tokens_per_image() : 1; }
  // The tower's sequence for one image (its attention's keys): patches, and the CLS token.
  int64_t seq_per_image() const {
    const int64_t patches = image_size > 0 ? patches_per_image() : image_tokens * merge * merge;
    return patches + (class_token ? 1 : 0);
  }
  int64_t vision_tokens() const { return images() * seq_per_image(); }
  // The keys each query of block `layer` attends: its window, or the whole image.
  int64_t attention_keys(int64_t layer) const {
    const bool global = window == 0 || (global_layer_every > 0 && (layer + 1) % global_layer_every == 0);
    return global ? seq_per_image() : std::min(window, seq_per_image());
  }
};

struct ModelSpec {
  std::string name;
  std::string family;  // "decoder" (decoder-only causal LM); the only family so far
  // The Hugging Face model_type of the checkpoint the shape is (config.json "model_type": "llama", "qwen2"), which
  // kernel libraries patch by (runtime/kernel_library.hpp); "" where the file names none (a shape of no Hugging Face
  // class, or not stated).
  std::string hf_model_type;
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
  // RoPE models whose config extends the rotary positions (Hugging Face rope_scaling with a factor: linear, dynamic,
  // yarn, llama3): factor x the positions it was trained at (original_max_position_embeddings, else max_positions),
  // the longest sequence the extension is for. 0: no extension. A sequence beyond max(max_positions, this) is refused
  // (check_trained_length, simulate.hpp); the extension changes no parameter, FLOP or saved tensor.
  int64_t rope_scaled_positions = 0;
  bool qkv_bias = false;       // Qwen, GPT-2
  bool attn_out_bias = false;  // GPT-2
  bool mlp_bias = false;       // GPT-2
  bool dropout = false;        // GPT-2 style dropout after attention softmax, attention output and MLP
  std::optional<MoeSpec> moe;
  std::optional<MlaSpec> mla;        // multi-head latent attention instead of q/k/v projections
  std::optional<VisionSpec> vision;  // a vision tower and projector in front (vision-language models)

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
  // The attention projects q, k and v with one fused linear and hands the kernel its value as a view of that output,
  // while the rotary writes q and k anew (Hugging Face Phi3Attention: qkv_proj sliced; GPTNeoXAttention:
  // query_key_value chunked per head): a kernel that saves the value keeps the whole output alive, its q and k parts
  // too (ModuleGraph::build_attention, TensorClass::FusedQkvQk). Rope only. Not for a fused projection whose value
  // is a copy (Falcon's and ChatGLM's index and expand copies) or whose q and k stay views (GPT-2: no rotary).
  bool value_views_fused_qkv = false;
  // Local attention: the layers that are sliding attend to at most `sliding_window` earlier keys (0: none, every
  // layer global). With a window, every `global_layer_every`-th layer (0-based indices N-1, 2N-1, ...) stays
  // global, as Gemma 2 (N = 2: Gemma2DecoderLayer is_sliding = not bool(layer_idx % 2)) and Gemma 3 (N = 6:
  // is_sliding = bool((layer_idx + 1) % sliding_window_pattern)); 0: every layer slides (Mistral).
  int64_t sliding_window = 0;
  int64_t global_layer_every = 0;
  // With a window: the local layers attend within fixed chunks of sliding_window tokens (query t the keys from
  // t - t mod w to t) instead of a window sliding with the query (Llama 4's attention_chunk_size,
  // create_chunked_causal_mask).
  bool chunked_attention = false;
  // Every N-th layer (0-based N-1, 2N-1, ...) applies no rotary (NoPE; Llama 4's no_rope_layers, default
  // no_rope_layer_interval 4); 0: every layer rotates (rope only).
  int64_t nope_layer_every = 0;
  // tanh soft-capping, cap * tanh(x / cap), of the attention scores and of the final logits (Gemma 2); 0: none.
  // No parameters; the attention cap keeps one more score-sized tensor under eager attention.
  double attn_logit_softcap = 0;
  double final_logit_softcap = 0;
  // The embedding output is multiplied by sqrt(hidden_size) (GemmaModel's normalizer): no parameters.
  bool scaled_embeddings = false;

  int64_t q_dim() const { return num_heads * head_dim; }
  // Whether decoder layer `layer`'s MLP is a mixture of experts (MoeSpec::is_moe_layer), and how many are.
  bool is_moe_layer(int64_t layer) const { return moe && moe->is_moe_layer(layer); }
  int64_t moe_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < num_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
    return n;
  }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // Whether decoder layer `layer` applies rotary (rope models; not its NoPE layers).
  bool rotary_layer(int64_t layer) const {
    return position_embedding == PositionEmbedding::Rope &&
           (nope_layer_every == 0 || (layer + 1) % nope_layer_every != 0);
  }
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
const char* to_string(ProjectorNorm);

}  // namespace fsdp
