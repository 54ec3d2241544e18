// Llama 4 (Llama4ForCausalLM, Llama4ForConditionalGeneration) as a mapping onto the composable parts of
// model_spec.hpp. Read: transformers src/transformers/models/llama4/configuration_llama4.py @
// 008e574391258935f3ecc3035c882e73bbcac419 and modeling_llama4.py @ 000c33fdfde12e1ffafbfcdb3c926df5727a00b6.
//
// The text model (Llama4TextModel, Llama4TextDecoderLayer):
//  - attention: q/k/v/o_proj with bias=attention_bias (False), GQA of num_key_value_heads, head_dim given;
//  - rotary on the layers whose no_rope_layers entry is 1; by default every no_rope_layer_interval-th layer (0-based
//    N-1, 2N-1, ...) is a NoPE layer (ModelSpec::nope_layer_every);
//  - use_qk_norm: Llama4TextL2Norm (no weight) on q and k after rotary, on the rotary layers only (QkNorm::L2);
//  - the rotary layers are "chunked_attention" layers: each query attends the earlier keys of its chunk of
//    attention_chunk_size tokens (create_chunked_causal_mask); the NoPE layers attend the whole causal prefix
//    (ModelSpec::sliding_window with chunked_attention, global_layer_every = the NoPE interval);
//  - the MLP: layer i is Llama4TextMoe when i is in moe_layers (default range(step - 1, L, step) for
//    interleave_moe_layer_step: MoeSpec::layer_step), else Llama4TextMLP of intermediate_size_mlp (gate/up/down, no
//    bias). Llama4TextMoe: a router Linear(hidden, num_local_experts, bias=False) whose top-k logits go through a
//    sigmoid (no parameters), Llama4TextExperts (gate_up_proj: E x hidden x 2 intermediate_size, down_proj: E x
//    intermediate_size x hidden) and one shared_expert, Llama4TextMLP of intermediate_size;
//  - input_layernorm, post_attention_layernorm, the final norm: RMSNorm(hidden, rms_norm_eps); embed_tokens and
//    lm_head (vocab x hidden each unless tie_word_embeddings).
// attn_temperature_tuning scales q on the NoPE layers by a per-position factor (a multiply, no parameters): warned.
//
// The vision encoder (Llama4VisionModel) and projector:
//  - patch_embedding: Llama4UnfoldConvolution, unfold + Linear(num_channels x patch^2 -> hidden, bias=False);
//  - class_embedding (hidden) appended to the patches, positional_embedding_vlm ((image / patch)^2 + 1 rows), then
//    layernorm_pre (LayerNorm); the blocks also apply 2-D rotary to q and k (Llama4VisionRotaryEmbedding, no
//    parameters: VisionSpec::block_rotary);
//  - num_hidden_layers Llama4VisionEncoderLayers: input_layernorm, Llama4VisionAttention (q/k/v/o_proj biased, MHA,
//    bidirectional), post_attention_layernorm, Llama4VisionMLP (fc1, fc2 biased, nn.GELU whatever hidden_act says);
//    the norms are nn.LayerNorm(hidden) at its default eps 1e-5 (norm_eps is not read);
//  - layernorm_post (LayerNorm(hidden)) over every token, then the CLS token is dropped: modelled as the projector's
//    per-patch norm before the merge (ProjectorNorm::BeforeMerge; the CLS token's row, 1 of 577, is left out);
//  - vision_adapter (Llama4VisionPixelShuffleMLP): pixel_shuffle by pixel_shuffle_ratio (0.5: 2 x 2 patches become one
//    token of 4 x hidden), then Llama4VisionMLP2: fc1 Linear(intermediate_size -> projector_input_dim, bias=False),
//    GELU, fc2 Linear(projector_output_dim -> projector_output_dim, bias=False), GELU;
//  - multi_modal_projector.linear_1: Linear(vision_output_dim -> the text hidden size, bias=False).
// So the projector is three linears without biases with GELU between them (VisionSpec::projector_layers 3); the
// shapes must chain: intermediate_size = hidden x (1 / ratio)^2 (fc1 reads the shuffled patches), projector_input_dim
// = projector_output_dim, vision_output_dim = projector_output_dim; anything else would not run and is refused.
#include <string>
#include <vector>

#include "model/hf_reader.hpp"

namespace fsdp::hf {

namespace {

// Llama4TextConfig's defaults of the shape keys: what a text_config written as a diff leaves out.
const std::vector<std::pair<std::string, int64_t>> kLlama4TextShape = {{"vocab_size", 202048},
                                                                       {"hidden_size", 5120},
                                                                       {"intermediate_size", 8192},
                                                                       {"intermediate_size_mlp", 16384},
                                                                       {"num_hidden_layers", 48},
                                                                       {"num_attention_heads", 40},
                                                                       {"max_position_embeddings", 131072}};
// Llama4VisionConfig's.
const std::vector<std::pair<std::string, int64_t>> kLlama4VisionShape = {
    {"hidden_size", 768},          {"num_hidden_layers", 34},
    {"num_attention_heads", 16},   {"intermediate_size", 5632},
    {"image_size", 448},           {"patch_size", 14},
    {"projector_input_dim", 4096}, {"projector_output_dim", 4096},
    {"vision_output_dim", 7680}};

// An integer list entry, 0 or 1 (or a boolean).
bool list_flag(const Reader& r, const std::string& key, const json& v, size_t i) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) return v.get<int64_t>() == 1;
  r.fail(key, "entry " + std::to_string(i) + " is " + show(v) + "; expected 0 or 1");
}

// The NoPE interval: every N-th layer without rotary. no_rope_layers (1: rotary, 0: NoPE; empty or absent: the
// default from no_rope_layer_interval, Llama4TextConfig) must describe "every N-th layer NoPE", the only pattern
// modelled; 0 when every layer rotates.
int64_t nope_interval(const Reader& r, int64_t layers) {
  const auto it = r.root().find("no_rope_layers");
  if (it == r.root().end() || it->is_null() || (it->is_array() && it->empty()))
    return r.optional_dim("no_rope_layer_interval", 4);
  if (!it->is_array() || static_cast<int64_t>(it->size()) < layers)
    r.fail("no_rope_layers", "expected a list of at least num_hidden_layers entries (1: rotary, 0: NoPE)");
  int64_t every = 0;
  for (int64_t i = 0; i < layers && every == 0; ++i)
    if (!list_flag(r, "no_rope_layers", (*it)[static_cast<size_t>(i)], static_cast<size_t>(i))) every = i + 1;
  for (int64_t i = 0; i < layers; ++i) {
    const bool rope = list_flag(r, "no_rope_layers", (*it)[static_cast<size_t>(i)], static_cast<size_t>(i));
    const bool nope_expected = every > 0 && (i + 1) % every == 0;
    if (rope == nope_expected)
      r.fail("no_rope_layers", "the pattern is not \"every N-th layer without rotary\", the only one modelled");
  }
  return every;
}

// The MoE step: moe_layers (a list of layer indices) when given, else interleave_moe_layer_step; the list must be
// range(step - 1, L, step) for some step (MoeSpec::layer_step's pattern). 0: no MoE layer.
int64_t moe_step(const Reader& r, int64_t layers) {
  const auto it = r.root().find("moe_layers");
  if (it == r.root().end() || it->is_null()) return r.optional_dim("interleave_moe_layer_step", 1);
  if (!it->is_array()) r.fail("moe_layers", "expected a list of layer indices, got " + show(*it));
  if (it->empty()) return 0;
  const json& first = it->front();
  if (!first.is_number_integer() || first.get<int64_t>() < 0 || first.get<int64_t>() >= layers)
    r.fail("moe_layers", show(first) + " is not a layer index below num_hidden_layers");
  const int64_t step = first.get<int64_t>() + 1;
  std::vector<int64_t> pattern;
  for (int64_t i = step - 1; i < layers; i += step) pattern.push_back(i);
  bool same = it->size() == pattern.size();
  for (size_t i = 0; same && i < pattern.size(); ++i)
    same = (*it)[i].is_number_integer() && (*it)[i].get<int64_t>() == pattern[i];
  if (!same)
    r.fail("moe_layers", "the list is not \"every N-th layer\" (interleave_moe_layer_step), the only pattern modelled");
  return step;
}

// layer_types (written by newer transformers): "chunked_attention" for the rotary layers, "full_attention" for the
// NoPE ones (Llama4TextConfig's default); another assignment is refused.
void check_layer_types(const Reader& r, const ModelSpec& m) {
  if (!r.has("layer_types")) return;
  const json& types = r.root().at("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != m.num_layers)
    r.fail("layer_types", "expected a list of num_hidden_layers entries");
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const char* expected = m.rotary_layer(i) ? "chunked_attention" : "full_attention";
    if (types[static_cast<size_t>(i)] != expected)
      r.fail("layer_types", "entry " + std::to_string(i) + " is " + show(types[static_cast<size_t>(i)]) +
                                "; only chunked rotary layers and full NoPE layers are modelled (expected \"" +
                                expected + "\")");
  }
}

// Llama4VisionModel and its projector (the top of this file) from vision_config.
VisionSpec read_llama4_vision(const Reader& r) {
  VisionSpec v = read_vit_shape(r, "llama4_vision_model", "Llama4VisionModel");
  v.activation = ActivationFn::Gelu;  // Llama4VisionMLP: nn.GELU(), hidden_act is not read
  v.norm = NormType::LayerNorm;
  v.norm_eps = 1e-5;  // nn.LayerNorm(hidden)'s default: norm_eps is not read
  v.qkv_bias = v.attn_out_bias = v.mlp_bias = true;
  v.position_embedding = PositionEmbedding::Learned;
  v.block_rotary = true;
  if (r.has("image_size") && !r.root().at("image_size").is_number_integer())
    r.fail("image_size", "only a square image (one integer) is modelled");
  v.image_size = r.required_dim("image_size");
  v.patch_size = r.required_dim("patch_size");
  v.num_channels = r.optional_dim("num_channels", 3);
  v.patch_bias = false;
  v.class_token = true;
  v.pre_norm = true;    // layernorm_pre
  v.post_norm = false;  // layernorm_post is on the image path: the projector's norm below
  for (const char* key : {"attention_dropout", "projector_dropout"})
    if (r.optional_probability(key, 0.0) > 0) r.fail(key, "dropout in the vision encoder is not modelled");
  v.merge = merge_of_ratio(r, "pixel_shuffle_ratio", 0.5);
  const int64_t shuffled = checked_mul(r, "pixel_shuffle_ratio", v.hidden_size, v.merge * v.merge);
  if (v.ffn_size != shuffled)
    r.fail("intermediate_size",
           "the vision adapter's fc1 reads it and the pixel-shuffled patches are hidden_size x (1 / "
           "pixel_shuffle_ratio)^2 = " +
               std::to_string(shuffled) + " wide: they must be equal");
  const int64_t adapter_in = r.required_dim("projector_input_dim");
  const int64_t adapter_out = r.required_dim("projector_output_dim");
  if (adapter_in != adapter_out)
    r.fail("projector_output_dim",
           "fc2 reads fc1's output (projector_input_dim " + std::to_string(adapter_in) + "): they must be equal");
  if (r.required_dim("vision_output_dim") != adapter_out)
    r.fail("vision_output_dim", "multi_modal_projector.linear_1 reads the adapter's output (projector_output_dim " +
                                    std::to_string(adapter_out) + "): they must be equal");
  v.projector_norm = ProjectorNorm::BeforeMerge;
  v.projector_norm_type = NormType::LayerNorm;
  v.projector_layers = 3;  // fc1, fc2, multi_modal_projector.linear_1
  v.projector_bias = false;
  v.projector_hidden = adapter_in;
  v.projector_activation = ActivationFn::Gelu;
  v.image_tokens = v.tokens_per_image();  // one tile; --image-tokens gives more
  return v;
}

}  // namespace

void read_llama4_text(const Reader& r, ModelSpec& m) {
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_hidden_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  m.num_kv_heads = r.optional_dim("num_key_value_heads", 8);
  m.head_dim = r.optional_dim("head_dim", 128);
  checked_mul(r, "head_dim", m.head_dim, m.num_heads);
  const int64_t expert_ffn = r.required_dim("intermediate_size");
  m.ffn_size = r.required_dim("intermediate_size_mlp");  // the dense layers' Llama4TextMLP
  m.gated_mlp = true;
  m.activation = activation_of(r, "hidden_act", "silu");
  m.vocab_size = r.required_dim("vocab_size");
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", false);
  m.norm = NormType::RmsNorm;
  m.norm_eps = r.optional_positive("rms_norm_eps", 1e-5);
  m.position_embedding = PositionEmbedding::Rope;
  m.rope_theta = r.optional_positive("rope_theta", 500000.0);
  m.max_positions = r.required_dim("max_position_embeddings");
  m.rope_scaled_positions = rope_scaled_positions(r, m.max_positions);
  m.dropout = r.optional_probability("attention_dropout", 0.0) > 0;
  m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", false);
  m.nope_layer_every = nope_interval(r, m.num_layers);
  m.qk_norm = r.optional_bool("use_qk_norm", true) ? QkNorm::L2 : QkNorm::None;
  // attention_chunk_size: null is no chunking (every layer attends its whole causal prefix).
  const bool no_chunk = r.root().contains("attention_chunk_size") && r.root().at("attention_chunk_size").is_null();
  const int64_t chunk = no_chunk ? 0 : r.optional_dim("attention_chunk_size", 8192);
  if (chunk > 0) {
    m.sliding_window = chunk;
    m.global_layer_every = m.nope_layer_every;
    m.chunked_attention = true;
  }
  check_layer_types(r, m);
  const int64_t step = moe_step(r, m.num_layers);
  if (step == 0) return;
  MoeSpec moe;
  moe.num_experts = r.optional_dim("num_local_experts", 16);
  moe.experts_per_token = r.optional_dim("num_experts_per_tok", 1);
  if (moe.experts_per_token > moe.num_experts)
    r.fail("num_experts_per_tok",
           std::to_string(moe.experts_per_token) + " exceeds num_local_experts " + std::to_string(moe.num_experts));
  moe.expert_ffn_size = expert_ffn;
  moe.shared_experts = 1;  // Llama4TextMoe.shared_expert: Llama4TextMLP of intermediate_size
  if (step > m.num_layers)
    r.fail("interleave_moe_layer_step",
           std::to_string(step) + " leaves every layer dense (num_hidden_layers " + std::to_string(m.num_layers) + ")");
  moe.layer_step = step;
  m.moe = moe;
}

void warn_llama4_text(const Reader& r, const std::string& source, std::vector<std::string>& out) {
  // attn_temperature_tuning: on by default (True; the hub's files write 4), off when false or 0.
  const auto it = r.root().find("attn_temperature_tuning");
  if (it == r.root().end() || it->is_null() || is_set(r.root(), "attn_temperature_tuning"))
    out.push_back(source +
                  ": key 'attn_temperature_tuning' is set: the NoPE layers scale q by a per-position factor "
                  "(Llama4TextAttention: log1p(floor((position + 1) / floor_scale)) x attn_scale + 1), one "
                  "multiply of q without parameters, which is not priced");
  if (moe_step(r, r.required_dim("num_hidden_layers")) > 0)
    out.push_back(source +
                  ": the MoE layers are planned with top-k routing (each expert's GEMMs on num_experts_per_tok / "
                  "num_local_experts of the tokens, as grouped-GEMM kernels run them); transformers' eager "
                  "Llama4TextExperts runs every expert on every token (the unrouted with a zero score): "
                  "num_local_experts / num_experts_per_tok times the routed FLOPs and saved inputs, not priced");
}

// Llama4ForConditionalGeneration: vision_model, multi_modal_projector and language_model (Llama4ForCausalLM of
// text_config). Llama4Config builds both sub-configs from their dicts (written as differences from their classes'
// defaults), and the defaults of an absent one.
void read_llama4(const json& root, const std::string& text, const std::string& source, LoadedModel& out) {
  ModelSpec& m = out.spec;
  Reader top(root, text, source);
  top.set_arch("Llama4ForConditionalGeneration");
  const json& tc = sub_config(top, "text_config");
  Reader tr(tc, text, source);
  tr.set_arch("Llama4ForConditionalGeneration");
  tr.set_class_defaults(&kLlama4TextShape);
  const std::string text_type = tr.optional_string("model_type", "llama4_text");
  if (text_type != "llama4_text")
    tr.fail("model_type", "language model '" + text_type + "' is not Llama4TextModel's (llama4_text)");
  read_llama4_text(tr, m);

  const json& vc = sub_config(top, "vision_config");
  Reader vr(vc, text, source);
  vr.set_arch("Llama4VisionModel");
  vr.set_class_defaults(&kLlama4VisionShape);
  m.vision = read_llama4_vision(vr);
  const VisionSpec& v = *m.vision;

  warn_defaults(top, source, "", "Llama4Config", out.warnings);
  warn_defaults(tr, source, "text_config: ", "Llama4TextConfig", out.warnings);
  warn_defaults(vr, source, "vision_config: ", "Llama4VisionConfig", out.warnings);
  warn_common_unmodelled(top, source, false, out.warnings);
  warn_common_unmodelled(tr, source, false, out.warnings);
  warn_llama4_text(tr, source, out.warnings);
  out.warnings.push_back(source + ": " + std::to_string(v.image_tokens) + " image tokens per sample (one " +
                         std::to_string(v.image_size) + "x" + std::to_string(v.image_size) +
                         " tile; the processor cuts an image into up to max_patches tiles and a global one) join the "
                         "language model's sequence; --image-tokens N sets another count");
}

}  // namespace fsdp::hf
