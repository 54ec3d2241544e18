// parse_hf_config: a Hugging Face config.json -> ModelSpec (declared in model_loader.hpp).
//
// Rules (configs/models/README.md has the key-by-key table):
//  - The shape keys (hidden size, layers, heads, intermediate size, vocab, max positions) are
//    required: a config.json without them is not a model we can size, and falling back to the
//    config class defaults would silently describe some other model.
//  - Keys that Hugging Face's config classes treat as optional take exactly the default of the
//    class that transformers would build for the architecture; each default below cites the file.
//    Versions read: transformers v4.44 src/transformers/models/<arch>/configuration_<arch>.py and
//    modeling_<arch>.py, and Qwen's remote code (Qwen/Qwen-72B configuration_qwen.py, modeling_qwen.py).
//  - Every optional key that is absent (or null) and so takes the transformers default is named in a
//    warning, with the value taken; keys that change memory or time but are not modelled
//    (quantization_config, rope_scaling, Gemma 2's final_logit_softcapping, ...) are named in another.
//    Keys that change no parameter, FLOP or saved tensor (token ids, torch_dtype, ...) are ignored; so are
//    keys this reader does not know, because config.json files carry many tool-specific extras.
//    Further versions read for the families added by issue 23: transformers v4.50 models/{qwen3, gemma2, gemma3,
//    phi3, glm, glm4, olmo, olmo2, falcon, gpt_neox}/configuration_*.py and modeling_*.py, and InternLM's remote
//    code (internlm/internlm2-7b configuration_internlm2.py, modeling_internlm2.py). The MoE families: transformers
//    v4.51 models/{qwen2_moe, qwen3_moe, deepseek_v3}/configuration_*.py and modeling_*.py, and DeepSeek's remote
//    code for V2 (deepseek-ai/DeepSeek-V2-Lite configuration_deepseek.py, modeling_deepseek.py).
//  - Any problem is an InputError naming the file, the line of the key where it can be found in the
//    text, and the key. A key given twice in one object is one (core/duplicate_keys.hpp), not the last
//    value silently taken.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/duplicate_keys.hpp"
#include "core/errors.hpp"
#include "model/hf_reader.hpp"
#include "model/model_loader.hpp"

namespace fsdp {

namespace {

using namespace hf;

enum class Arch {
  Llama,
  Mistral,
  Mixtral,
  Qwen2,
  Qwen3,
  Qwen2Moe,
  Qwen3Moe,
  DeepseekV2,
  DeepseekV3,
  Gemma2,
  Gemma3Text,
  Gemma3,  // Gemma3ForConditionalGeneration: the language model of its text_config
  Phi3,
  Glm,
  Glm4,
  InternLM2,
  Olmo,
  Olmo2,
  Falcon,
  GptNeoX,
  Qwen,
  Gpt2,
  Llava,  // LlavaForConditionalGeneration: a CLIP vision tower, a projector and the language model of text_config
  // Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration: a dynamic-resolution ViT with a patch
  // merger in front of a Qwen2 language model (its keys at the top level, or in text_config)
  Qwen2VL,
  Qwen25VL,
  ChatGlm,  // THUDM's ChatGLM2/3 and GLM-4 remote code (ChatGLMModel, ChatGLMForConditionalGeneration)
  // Llama 4 (hf_llama4.cpp): the text model alone, and with its vision encoder and projector
  Llama4Text,
  Llama4,
  InternVLChat,  // InternVL's remote-code InternVLChatModel: InternViT, mlp1 and an llm_config (hf_internvl.cpp)
};

struct ArchName {
  const char* architecture;  // the "architectures" entry
  const char* model_type;    // the "model_type" value, used when "architectures" is absent
  Arch arch;
};

constexpr ArchName kArchitectures[] = {
    {"LlamaForCausalLM", "llama", Arch::Llama},
    {"MistralForCausalLM", "mistral", Arch::Mistral},
    {"MixtralForCausalLM", "mixtral", Arch::Mixtral},
    {"Qwen2ForCausalLM", "qwen2", Arch::Qwen2},
    {"Qwen3ForCausalLM", "qwen3", Arch::Qwen3},
    {"Qwen2MoeForCausalLM", "qwen2_moe", Arch::Qwen2Moe},
    {"Qwen3MoeForCausalLM", "qwen3_moe", Arch::Qwen3Moe},
    {"DeepseekV2ForCausalLM", "deepseek_v2", Arch::DeepseekV2},
    {"DeepseekV3ForCausalLM", "deepseek_v3", Arch::DeepseekV3},
    {"Gemma2ForCausalLM", "gemma2", Arch::Gemma2},
    {"Gemma3ForCausalLM", "gemma3_text", Arch::Gemma3Text},
    {"Gemma3ForConditionalGeneration", "gemma3", Arch::Gemma3},
    {"Phi3ForCausalLM", "phi3", Arch::Phi3},
    {"GlmForCausalLM", "glm", Arch::Glm},
    {"Glm4ForCausalLM", "glm4", Arch::Glm4},
    {"InternLM2ForCausalLM", "internlm2", Arch::InternLM2},
    {"OlmoForCausalLM", "olmo", Arch::Olmo},
    {"Olmo2ForCausalLM", "olmo2", Arch::Olmo2},
    {"FalconForCausalLM", "falcon", Arch::Falcon},
    {"GPTNeoXForCausalLM", "gpt_neox", Arch::GptNeoX},
    {"QWenLMHeadModel", "qwen", Arch::Qwen},
    {"GPT2LMHeadModel", "gpt2", Arch::Gpt2},
    {"LlavaForConditionalGeneration", "llava", Arch::Llava},
    {"Qwen2VLForConditionalGeneration", "qwen2_vl", Arch::Qwen2VL},
    {"Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", Arch::Qwen25VL},
    {"ChatGLMModel", "chatglm", Arch::ChatGlm},
    {"ChatGLMForConditionalGeneration", "chatglm", Arch::ChatGlm},
    {"Llama4ForCausalLM", "llama4_text", Arch::Llama4Text},
    {"Llama4ForConditionalGeneration", "llama4", Arch::Llama4},
    {"InternVLChatModel", "internvl_chat", Arch::InternVLChat},
};

std::string known_architectures() {
  std::string s;
  for (const auto& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
  return s;
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return parse_json_unique_keys(text, source);
  } catch (const json::parse_error& e) {
    // e.byte is the 1-based offset where the parser stopped.
    size_t end = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    int line = 1;
    for (size_t i = 0; i < end; ++i)
      if (text[i] == '\n') ++line;
    std::string what = e.what();
    size_t cut = what.find("] ");
    if (cut != std::string::npos) what = what.substr(cut + 2);
    throw InputError(source + ":" + std::to_string(line) + ": not valid JSON: " + what);
  } catch (const json::exception& e) {
    // out_of_range 406: a number literal that overflows a double.
    std::string what = e.what();
    size_t cut = what.find("] ");
    if (cut != std::string::npos) what = what.substr(cut + 2);
    throw InputError(source + ": not valid JSON: " + what);
  }
}

// The table row of the config's class: its first "architectures" entry the table knows, else its model_type's row.
const ArchName& find_arch(const json& root, const Reader& r) {
  auto it = root.find("architectures");
  if (it != root.end() && !it->is_null()) {
    if (!it->is_array()) r.fail("architectures", "expected a list of class names, got " + show(*it));
    if (it->empty()) r.fail("architectures", "is empty; expected one of: " + known_architectures());
    for (const auto& entry : *it) {
      if (!entry.is_string()) r.fail("architectures", "expected class names (strings), got " + show(entry));
      for (const auto& a : kArchitectures)
        if (entry.get<std::string>() == a.architecture) return a;
    }
    r.fail("architectures", show(*it) + " is not supported; supported: " + known_architectures());
  }
  // Old config.json files (before transformers wrote "architectures") only have model_type.
  if (r.has("model_type")) {
    std::string type = r.optional_string("model_type", "");
    for (const auto& a : kArchitectures)
      if (type == a.model_type) return a;
    r.fail("model_type",
           "'" + type + "' is not supported and there is no 'architectures' list; supported: " + known_architectures());
  }
  r.fail("architectures", "missing (and no model_type either); expected one of: " + known_architectures());
}

// The defaults of one transformers config class for the keys the Llama-style readers share, and the
// optional layer parts its modeling file builds. Each row cites its configuration_<arch>.py (see the top).
struct LlamaStyle {
  int64_t kv_heads;        // num_key_value_heads when absent; 0: = num_attention_heads (MHA)
  int64_t head_dim;        // head_dim when absent; 0: hidden_size / num_attention_heads; -1: set by the family (MLA)
  const char* eps_key;     // the norm epsilon's key; nullptr: fixed by the modeling code (OLMo 1: 1e-5)
  double eps;              // and its default
  double rope_theta;       // rope_theta's default
  bool tied;               // tie_word_embeddings' default
  const char* act_key;     // hidden_act, or Gemma's hidden_activation
  const char* act;         // and its default
  int64_t sliding_window;  // the window when sliding_window is absent (0: none), for the families that use it
};

LlamaStyle llama_style(Arch arch) {
  switch (arch) {
    // LlamaConfig: num_key_value_heads None (-> heads), rms_norm_eps 1e-6, rope_theta 10000.
    case Arch::Llama:
      return {0, 0, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    // MistralConfig: 8 kv heads, 1e-6, 10000, sliding_window 4096.
    case Arch::Mistral:
      return {8, 0, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 4096};
    // MixtralConfig: 8 kv heads, 1e-5, 1e6, sliding_window None.
    case Arch::Mixtral:
      return {8, 0, "rms_norm_eps", 1e-5, 1e6, false, "hidden_act", "silu", 0};
    // Qwen2Config: 32 kv heads, 1e-6, 10000 (its sliding window only with use_sliding_window).
    case Arch::Qwen2:
      return {32, 0, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    // Qwen2VLConfig / Qwen2_5_VLConfig (their text config, transformers v4.51 configuration_qwen2_vl.py,
    // configuration_qwen2_5_vl.py): 8 kv heads, rms_norm_eps 1e-5, rope_theta 1e6.
    case Arch::Qwen2VL:
    case Arch::Qwen25VL:
      return {8, 0, "rms_norm_eps", 1e-5, 1e6, false, "hidden_act", "silu", 0};
    // Qwen3Config: 32 kv heads, head_dim 128, 1e-6, 10000.
    case Arch::Qwen3:
      return {32, 128, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    // Qwen2MoeConfig: 16 kv heads, 1e-6, 10000. Qwen3MoeConfig: 4 kv heads, 1e-6, 10000; its head_dim when
    // absent is hidden / heads (Qwen3MoeAttention: getattr(config, "head_dim", hidden_size // num_heads)).
    case Arch::Qwen2Moe:
      return {16, 0, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    case Arch::Qwen3Moe:
      return {4, 0, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    // DeepseekV2Config (the remote configuration_deepseek.py of deepseek-ai/DeepSeek-V2-Lite) and
    // DeepseekV3Config (transformers models/deepseek_v3/configuration_deepseek_v3.py): kv heads = heads,
    // rms_norm_eps 1e-6, rope_theta 10000 (head_dim is MLA's q/k head: read_mla).
    case Arch::DeepseekV2:
    case Arch::DeepseekV3:
      return {0, -1, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    // Gemma2Config: 4 kv heads, head_dim 256, 1e-6, 10000, tied, gelu_pytorch_tanh, sliding_window 4096.
    case Arch::Gemma2:
      return {4, 256, "rms_norm_eps", 1e-6, 10000.0, true, "hidden_activation", "gelu_pytorch_tanh", 4096};
    // Gemma3TextConfig: 4 kv heads, head_dim 256, 1e-6, rope_theta 1e6, tied, sliding_window 4096.
    case Arch::Gemma3Text:
    case Arch::Gemma3:
      return {4, 256, "rms_norm_eps", 1e-6, 1e6, true, "hidden_activation", "gelu_pytorch_tanh", 4096};
    // Phi3Config: num_key_value_heads None (-> heads), rms_norm_eps 1e-5, 10000, sliding_window None.
    case Arch::Phi3:
      return {0, 0, "rms_norm_eps", 1e-5, 10000.0, false, "hidden_act", "silu", 0};
    // GlmConfig / Glm4Config: 2 kv heads, head_dim 128, rms_norm_eps 1.5625e-07, 10000.
    case Arch::Glm:
    case Arch::Glm4:
      return {2, 128, "rms_norm_eps", 1.5625e-07, 10000.0, false, "hidden_act", "silu", 0};
    // InternLM2Config: num_key_value_heads None (-> heads), rms_norm_eps 1e-6, rope_theta 10000.
    case Arch::InternLM2:
      return {0, 0, "rms_norm_eps", 1e-6, 10000.0, false, "hidden_act", "silu", 0};
    // OlmoConfig: kv None (-> heads), 10000; OlmoLayerNorm's eps is 1e-5 in modeling_olmo.py.
    case Arch::Olmo:
      return {0, 0, nullptr, 1e-5, 10000.0, false, "hidden_act", "silu", 0};
    // Olmo2Config: kv None (-> heads), rms_norm_eps 1e-5, 10000.
    case Arch::Olmo2:
      return {0, 0, "rms_norm_eps", 1e-5, 10000.0, false, "hidden_act", "silu", 0};
    default:
      break;
  }
  FSDP_ASSERT(false, "llama_style: not a Llama-style architecture");
  return {};
}

// The shape and the keys every Llama-style config shares, with the class's defaults.
void read_llama_shape(const Reader& r, const LlamaStyle& d, ModelSpec& m) {
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_hidden_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  m.num_kv_heads = r.optional_dim("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : m.num_heads);
  if (d.head_dim < 0) {
    // read_llama_parts sets it.
  } else if (d.head_dim > 0) {
    m.head_dim = r.optional_dim("head_dim", d.head_dim);
  } else if (r.has("head_dim")) {
    m.head_dim = r.optional_dim("head_dim", 0);
  } else {
    m.head_dim = head_dim_of(r, "num_attention_heads", m.hidden_size, m.num_heads);
    r.note_default("head_dim", "hidden_size / num_attention_heads = " + std::to_string(m.head_dim));
  }
  m.ffn_size = r.required_dim("intermediate_size");
  m.gated_mlp = true;  // gate and up projections (fused gate_up_proj in Phi3 and GLM; InternLM2 w1 / w3)
  m.activation = activation_of(r, d.act_key, d.act);
  m.vocab_size = r.required_dim("vocab_size");
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", d.tied);
  m.norm = NormType::RmsNorm;
  m.norm_eps = d.eps_key ? r.optional_positive(d.eps_key, d.eps) : d.eps;
  m.position_embedding = PositionEmbedding::Rope;
  m.rope_theta = r.optional_positive("rope_theta", d.rope_theta);
  m.max_positions = r.required_dim("max_position_embeddings");
  m.dropout = r.optional_probability("attention_dropout", 0.0) > 0;  // 0.0 in every one of these classes
}

// A window read from sliding_window (null: none). Integers only; the class default when absent.
int64_t window_of(const Reader& r, int64_t fallback) {
  if (r.root().contains("sliding_window") && r.root().at("sliding_window").is_null()) return 0;
  if (!r.has("sliding_window") && fallback == 0) return 0;
  return r.optional_dim("sliding_window", fallback);
}

// Gemma 3's sliding/global pattern: layer_types (transformers >= 4.53 writes it) or sliding_window_pattern
// (default 6: Gemma3TextConfig); both must describe "every N-th layer global" (model_spec.hpp).
int64_t gemma3_global_every(const Reader& r, int64_t layers) {
  if (!r.has("layer_types")) return r.optional_dim("sliding_window_pattern", 6);
  const json& types = r.root().at("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != layers)
    r.fail("layer_types", "expected a list of num_hidden_layers entries");
  int64_t every = 0;
  for (int64_t i = 0; i < layers; ++i)
    if (types[static_cast<size_t>(i)] == "full_attention") {
      every = i + 1;
      break;
    }
  ModelSpec probe;
  probe.sliding_window = 1;
  probe.global_layer_every = every;
  for (int64_t i = 0; i < layers; ++i) {
    const json& t = types[static_cast<size_t>(i)];
    if (t != "full_attention" && t != "sliding_attention")
      r.fail("layer_types", "entry " + std::to_string(i) + " is " + show(t) +
                                "; expected \"full_attention\" or \"sliding_attention\"");
    if ((t == "full_attention") != (probe.attention_window(i) == 0))
      r.fail("layer_types", "the pattern is not \"every N-th layer global\", the only one modelled");
  }
  return every;
}

// Sequential layers with Gemma's four norms: input, post-attention, pre-feedforward, post-feedforward
// (Gemma2DecoderLayer, Gemma3DecoderLayer; Glm4DecoderLayer's post_self_attn / post_mlp layernorms).
void sandwich_norms(ModelSpec& m) {
  m.post_attention_norm = true;
  m.post_mlp_norm = true;
}

// A rank that null switches off (DeepSeek's q_lora_rank: null is a plain q_proj), and that takes `fallback` when
// absent.
int64_t nullable_dim(const Reader& r, const std::string& key, int64_t fallback) {
  if (r.root().contains(key) && r.root().at(key).is_null()) return 0;
  return r.optional_dim(key, fallback);
}

// A count that may be 0 (first_k_dense_replace), `fallback` when absent.
int64_t count_or_zero(const Reader& r, const std::string& key, int64_t fallback) {
  const auto it = r.root().find(key);
  if (it != r.root().end() && it->is_number_integer() && it->get<int64_t>() == 0) return 0;
  if (!r.has(key) && fallback == 0) {
    r.note_default(key, "0");
    return 0;
  }
  return r.optional_dim(key, fallback);
}

// DeepseekV2Attention / DeepseekV3Attention (model_spec.hpp MlaSpec): q_lora_rank 1536, kv_lora_rank 512,
// qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128 (both config classes); q_a_proj, kv_a_proj_with_mqa
// and o_proj bias=config.attention_bias (False), q_b_proj and kv_b_proj without.
void read_mla(const Reader& r, ModelSpec& m) {
  MlaSpec a;
  a.q_lora_rank = nullable_dim(r, "q_lora_rank", 1536);
  a.kv_lora_rank = r.optional_dim("kv_lora_rank", 512);
  a.qk_nope_head_dim = r.optional_dim("qk_nope_head_dim", 128);
  a.qk_rope_head_dim = r.optional_dim("qk_rope_head_dim", 64);
  a.v_head_dim = r.optional_dim("v_head_dim", 128);
  m.head_dim = a.qk_head_dim();
  m.num_kv_heads = m.num_heads;  // num_key_value_heads is not read by the attention: each head has its k and v
  m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", false);
  m.mla = a;
}

// The parts each Llama-style family adds to Llama's block.
void read_llama_parts(Arch arch, const Reader& r, const LlamaStyle& d, ModelSpec& m) {
  switch (arch) {
    case Arch::Llama: {
      // LlamaAttention: q/k/v/o_proj bias=config.attention_bias; LlamaMLP: bias=config.mlp_bias; both default False.
      const bool attention_bias = r.optional_bool("attention_bias", false);
      m.qkv_bias = m.attn_out_bias = attention_bias;
      m.mlp_bias = r.optional_bool("mlp_bias", false);
      break;
    }
    case Arch::Qwen2:
    case Arch::Qwen2VL:
    case Arch::Qwen25VL:
      // Qwen2Attention, Qwen2VLAttention, Qwen2_5_VLAttention: q/k/v_proj bias=True, o_proj bias=False.
      m.qkv_bias = true;
      break;
    case Arch::Mistral:
    case Arch::Mixtral:
    case Arch::Phi3:
      // No biases (Phi3Attention's qkv_proj and o_proj: bias=False). Phi3's flash attention slides over
      // config.sliding_window (modeling_phi3.py), as Mistral's does.
      m.sliding_window = window_of(r, d.sliding_window);
      if (arch == Arch::Phi3) {
        m.dropout = m.dropout || r.optional_probability("resid_pdrop", 0.0) > 0 ||
                    r.optional_probability("embd_pdrop", 0.0) > 0;
        // Phi3Attention.forward: query, key and value are slices of qkv_proj's output viewed per head; the rotary
        // writes q and k anew (apply_rotary_pos_emb's torch.cat), the value goes to the kernel as the view.
        m.value_views_fused_qkv = true;
      }
      break;
    case Arch::Qwen3:
    case Arch::Qwen3Moe:
      // Qwen3Attention / Qwen3MoeAttention: q/k/v/o_proj bias=config.attention_bias (False); q_norm, k_norm =
      // RMSNorm(head_dim).
      m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", false);
      m.qk_norm = QkNorm::PerHead;
      break;
    case Arch::Qwen2Moe:
      m.qkv_bias = true;  // Qwen2MoeAttention: q/k/v_proj bias=True, o_proj bias=False
      break;
    case Arch::DeepseekV2:
    case Arch::DeepseekV3:
      read_mla(r, m);
      break;
    case Arch::Gemma2:
    case Arch::Gemma3Text:
    case Arch::Gemma3: {
      // GemmaXAttention: q/k/v/o_proj bias=config.attention_bias (False); the embedding is scaled by
      // sqrt(hidden_size). Gemma 2 soft-caps the scores (attn_logit_softcapping 50.0) and the logits (30.0);
      // Gemma 3 caps neither by default and normalises q and k per head (q_norm, k_norm: RMSNorm(head_dim)).
      m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", false);
      sandwich_norms(m);
      m.scaled_embeddings = true;
      const bool gemma2 = arch == Arch::Gemma2;
      m.attn_logit_softcap =
          r.nullable_positive("attn_logit_softcapping", gemma2 ? 50.0 : std::optional<double>{}).value_or(0.0);
      m.final_logit_softcap =
          r.nullable_positive("final_logit_softcapping", gemma2 ? 30.0 : std::optional<double>{}).value_or(0.0);
      m.sliding_window = window_of(r, d.sliding_window);
      if (m.sliding_window > 0) m.global_layer_every = gemma2 ? 2 : gemma3_global_every(r, m.num_layers);
      if (!gemma2) m.qk_norm = QkNorm::PerHead;
      break;
    }
    case Arch::Glm:
    case Arch::Glm4: {
      // GlmAttention: q/k/v_proj bias=config.attention_bias (True), o_proj bias=False; rotary over
      // int(head_dim * partial_rotary_factor) dims (0.5). Glm4DecoderLayer adds post_self_attn_layernorm
      // and post_mlp_layernorm.
      m.qkv_bias = r.optional_bool("attention_bias", true);
      const double fraction = r.optional_positive("partial_rotary_factor", 0.5);
      if (fraction > 1) r.fail("partial_rotary_factor", "must be at most 1");
      m.rotary_dim = static_cast<int64_t>(std::floor(static_cast<double>(m.head_dim) * fraction));
      if (arch == Arch::Glm4) sandwich_norms(m);
      break;
    }
    case Arch::InternLM2: {
      // InternLM2Attention: wqkv and wo bias=config.bias (default True); InternLM2MLP w1/w2/w3 bias=False.
      const bool bias = r.optional_bool("bias", true);
      m.qkv_bias = m.attn_out_bias = bias;
      break;
    }
    case Arch::Olmo:
      // OlmoLayerNorm has neither weight nor bias; q/k/v/o_proj bias=config.attention_bias (False).
      m.norm = NormType::LayerNormNoParams;
      m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", false);
      break;
    case Arch::Olmo2:
      // Olmo2DecoderLayer: post_attention_layernorm and post_feedforward_layernorm only (norms after the
      // sublayers); Olmo2Attention: q_norm = RMSNorm(heads * head_dim), k_norm = RMSNorm(kv_heads * head_dim).
      m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", false);
      m.pre_attention_norm = m.pre_mlp_norm = false;
      m.post_attention_norm = m.post_mlp_norm = true;
      m.qk_norm = QkNorm::Projection;
      break;
    default:
      FSDP_ASSERT(false, "read_llama_parts: not a Llama-style architecture");
  }
}

// Routed experts and top-k from `experts_key` and num_experts_per_tok, with the class's defaults.
MoeSpec routed_experts(const Reader& r, const std::string& experts_key, int64_t experts, int64_t top_k) {
  MoeSpec moe;
  moe.num_experts = r.optional_dim(experts_key, experts);
  moe.experts_per_token = r.optional_dim("num_experts_per_tok", top_k);
  if (moe.experts_per_token > moe.num_experts)
    r.fail("num_experts_per_tok",
           std::to_string(moe.experts_per_token) + " exceeds " + experts_key + " " + std::to_string(moe.num_experts));
  return moe;
}

// Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock: a layer is sparse when it is not in mlp_only_layers and
// (layer_idx + 1) % decoder_sparse_step == 0 (Qwen2MoeDecoderLayer); the others keep a dense MLP of
// intermediate_size. Qwen2MoeConfig: 60 experts, top-4, moe_intermediate_size 1408, one shared expert of
// shared_expert_intermediate_size 5632 with its sigmoid shared_expert_gate. Qwen3MoeConfig: 128 experts, top-8,
// moe_intermediate_size 768, no shared expert. norm_topk_prob (default False in both classes) renormalises the top-k
// weights (no parameters: MoeSpec::norm_topk_prob).
MoeSpec read_qwen_moe(Arch arch, const Reader& r) {
  const bool qwen2 = arch == Arch::Qwen2Moe;
  MoeSpec moe = routed_experts(r, "num_experts", qwen2 ? 60 : 128, qwen2 ? 4 : 8);
  moe.norm_topk_prob = r.optional_bool("norm_topk_prob", false);
  moe.expert_ffn_size = r.optional_dim("moe_intermediate_size", qwen2 ? 1408 : 768);
  if (qwen2) {
    moe.shared_experts = 1;
    moe.shared_expert_ffn_size = r.optional_dim("shared_expert_intermediate_size", 5632);
    moe.shared_expert_gate = true;
  }
  moe.layer_step = r.optional_dim("decoder_sparse_step", 1);
  const json* only = r.root().contains("mlp_only_layers") ? &r.root().at("mlp_only_layers") : nullptr;
  if (only && !only->is_null() && !(only->is_array() && only->empty()))
    r.fail("mlp_only_layers", "a list of dense layers is not modelled (only decoder_sparse_step's pattern)");
  return moe;
}

// DeepseekV2MoE / DeepseekV3MoE: layers from first_k_dense_replace on (when layer_idx % moe_layer_freq == 0) are
// MoE, the first ones a dense MLP of intermediate_size; n_shared_experts are one MLP of moe_intermediate_size *
// n_shared_experts. V3's router (MoEGate with topk_method "noaux_tc") holds e_score_correction_bias, one per
// expert. Defaults: V2 (remote configuration_deepseek.py) n_routed_experts None (dense), moe_intermediate_size
// 1407, n_shared_experts None, first_k_dense_replace 0, topk_method "greedy"; V3 (configuration_deepseek_v3.py)
// 256 experts, top-8, moe_intermediate_size 2048, 1 shared expert, first_k_dense_replace 3, "noaux_tc".
std::optional<MoeSpec> read_deepseek_moe(Arch arch, const Reader& r) {
  const bool v3 = arch == Arch::DeepseekV3;
  if (!v3 && !r.has("n_routed_experts")) {
    r.note_default("n_routed_experts", "null (every layer dense)");
    return std::nullopt;
  }
  if (r.optional_dim("moe_layer_freq", 1) != 1)
    r.fail("moe_layer_freq", "MoE layers other than every layer after first_k_dense_replace are not modelled");
  MoeSpec moe = routed_experts(r, "n_routed_experts", 256, 8);
  // norm_topk_prob: default False in DeepSeek-V2's remote configuration_deepseek.py, True in DeepseekV3Config.
  moe.norm_topk_prob = r.optional_bool("norm_topk_prob", v3);
  moe.expert_ffn_size = r.optional_dim("moe_intermediate_size", v3 ? 2048 : 1407);
  moe.shared_experts = r.has("n_shared_experts") || v3 ? 1 : 0;
  if (moe.shared_experts > 0)
    moe.shared_expert_ffn_size =
        checked_mul(r, "n_shared_experts", r.optional_dim("n_shared_experts", 1), moe.expert_ffn_size);
  else
    r.note_default("n_shared_experts", "null (no shared experts)");
  moe.first_dense_layers = count_or_zero(r, "first_k_dense_replace", v3 ? 3 : 0);
  moe.router_bias = r.optional_string("topk_method", v3 ? "noaux_tc" : "greedy") == "noaux_tc";
  return moe;
}

void read_llama_like(Arch arch, const Reader& r, ModelSpec& m) {
  const LlamaStyle d = llama_style(arch);
  read_llama_shape(r, d, m);
  read_llama_parts(arch, r, d, m);
  if (arch == Arch::Mixtral) {
    // MixtralConfig: num_local_experts=8, num_experts_per_tok=2; each expert's w1/w3 are
    // hidden -> intermediate_size. Mixtral has no shared experts.
    MoeSpec moe = routed_experts(r, "num_local_experts", 8, 2);
    moe.shared_experts = 0;
    moe.expert_ffn_size = m.ffn_size;
    m.moe = moe;
  }
  if (arch == Arch::Qwen2Moe || arch == Arch::Qwen3Moe) m.moe = read_qwen_moe(arch, r);
  if (arch == Arch::DeepseekV2 || arch == Arch::DeepseekV3) m.moe = read_deepseek_moe(arch, r);
}

// FalconForCausalLM. FalconConfig defaults: num_kv_heads None (-> heads), layer_norm_epsilon 1e-5,
// hidden_dropout / attention_dropout 0.0, alibi False, new_decoder_architecture False, multi_query True,
// parallel_attn True, bias False, max_position_embeddings 2048, rope_theta 10000, ffn_hidden_size None
// (-> 4 * hidden_size), activation "gelu"; tie_word_embeddings comes from PretrainedConfig (True).
// FalconAttention: kv heads = num_kv_heads with the new decoder architecture or without multi_query, else 1
// (MQA); query_key_value and dense bias=config.bias. FalconDecoderLayer: sequential with input_layernorm and
// post_attention_layernorm without parallel_attn; parallel with ln_attn and ln_mlp under the new decoder
// architecture when num_ln_in_parallel_attn is 2 (its default there), otherwise one shared input_layernorm.
void read_falcon(const Reader& r, ModelSpec& m) {
  if (r.optional_bool("alibi", false)) r.fail("alibi", "ALiBi position biases (Falcon-RW) are not modelled");
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_hidden_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  m.head_dim = head_dim_of(r, "num_attention_heads", m.hidden_size, m.num_heads);
  const bool new_arch = r.optional_bool("new_decoder_architecture", false);
  const bool multi_query = r.optional_bool("multi_query", true);
  const int64_t kv = r.optional_dim("num_kv_heads", m.num_heads);
  m.num_kv_heads = new_arch || !multi_query ? kv : 1;
  m.ffn_size = r.optional_dim("ffn_hidden_size", checked_mul(r, "hidden_size", 4, m.hidden_size));
  m.gated_mlp = false;
  m.activation = activation_of(r, "activation", "gelu");
  m.vocab_size = r.required_dim("vocab_size");
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", true);
  m.norm = NormType::LayerNorm;
  m.norm_eps = r.optional_positive("layer_norm_epsilon", 1e-5);
  m.position_embedding = PositionEmbedding::Rope;
  m.rope_theta = r.optional_positive("rope_theta", 10000.0);
  m.max_positions = r.optional_dim("max_position_embeddings", 2048);
  const bool bias = r.optional_bool("bias", false);
  m.qkv_bias = m.attn_out_bias = m.mlp_bias = bias;
  m.parallel_block = new_arch || r.optional_bool("parallel_attn", true);
  m.pre_mlp_norm = !m.parallel_block || (new_arch && r.optional_dim("num_ln_in_parallel_attn", 2) == 2);
  m.dropout = r.optional_probability("hidden_dropout", 0.0) > 0 || r.optional_probability("attention_dropout", 0.0) > 0;
}

// GPTNeoXForCausalLM. GPTNeoXConfig defaults: hidden_act "gelu", rotary_pct 0.25, rotary_emb_base 10000,
// attention_dropout / hidden_dropout 0.0, layer_norm_eps 1e-5, tie_word_embeddings False,
// use_parallel_residual True, attention_bias True. GPTNeoXAttention: query_key_value and dense
// bias=config.attention_bias, rotary_ndims = int(head_size * rotary_pct); GPTNeoXMLP dense_h_to_4h /
// dense_4h_to_h with biases; GPTNeoXLayer: input_layernorm and post_attention_layernorm (LayerNorm), in
// parallel with use_parallel_residual.
void read_gpt_neox(const Reader& r, ModelSpec& m) {
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_hidden_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  m.num_kv_heads = m.num_heads;
  m.head_dim = head_dim_of(r, "num_attention_heads", m.hidden_size, m.num_heads);
  m.ffn_size = r.required_dim("intermediate_size");
  m.gated_mlp = false;
  m.activation = activation_of(r, "hidden_act", "gelu");
  m.vocab_size = r.required_dim("vocab_size");
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", false);
  m.norm = NormType::LayerNorm;
  m.norm_eps = r.optional_positive("layer_norm_eps", 1e-5);
  m.position_embedding = PositionEmbedding::Rope;
  // rotary_emb_base, which newer configs call rope_theta.
  m.rope_theta =
      r.has("rope_theta") ? r.optional_positive("rope_theta", 0) : r.optional_positive("rotary_emb_base", 10000.0);
  const double pct = r.optional_positive("rotary_pct", 0.25);
  if (pct > 1) r.fail("rotary_pct", "must be at most 1");
  m.rotary_dim = static_cast<int64_t>(std::floor(static_cast<double>(m.head_dim) * pct));
  m.max_positions = r.required_dim("max_position_embeddings");
  m.qkv_bias = m.attn_out_bias = r.optional_bool("attention_bias", true);
  m.mlp_bias = true;
  m.parallel_block = r.optional_bool("use_parallel_residual", true);
  m.dropout = r.optional_probability("attention_dropout", 0.0) > 0 || r.optional_probability("hidden_dropout", 0.0) > 0;
  // GPTNeoXAttention.forward: query_key_value's output viewed (..., heads, 3 x head_size) and chunked in three; the
  // partial rotary writes q and k anew (torch.cat of the rotated and passed dims), the value stays the chunk's view.
  m.value_views_fused_qkv = true;
}

// QWenLMHeadModel (Qwen 1, remote code). configuration_qwen.py defaults: kv_channels=128,
// layer_norm_epsilon=1e-6, rotary_emb_base=10000, no_bias=True, tie_word_embeddings=False,
// emb_dropout_prob=0.0, attn_dropout_prob=0.0.
void read_qwen(const Reader& r, ModelSpec& m) {
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_hidden_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  m.num_kv_heads = m.num_heads;  // one fused c_attn: hidden -> 3 * kv_channels * heads (MHA)
  m.head_dim = r.optional_dim("kv_channels", 128);
  checked_mul(r, "kv_channels", m.head_dim, m.num_heads);
  // QWenMLP: w1 and w2 are hidden -> intermediate_size // 2, c_proj is intermediate_size // 2 -> hidden.
  int64_t intermediate = r.required_dim("intermediate_size");
  if (intermediate % 2 != 0)
    r.fail("intermediate_size",
           "QWenMLP splits it into two halves (w1, w2); got the odd value " + std::to_string(intermediate));
  m.ffn_size = intermediate / 2;
  m.gated_mlp = true;
  m.activation = ActivationFn::Silu;  // QWenMLP: a1 * F.silu(a2)
  m.vocab_size = r.required_dim("vocab_size");
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", false);
  m.norm = NormType::RmsNorm;
  m.norm_eps = r.optional_positive("layer_norm_epsilon", 1e-6);
  m.position_embedding = PositionEmbedding::Rope;
  m.rope_theta = r.optional_positive("rotary_emb_base", 10000.0);  // what modeling_qwen.py reads
  // max_position_embeddings, or seq_length in the oldest Qwen configs.
  if (r.has("max_position_embeddings"))
    m.max_positions = r.required_dim("max_position_embeddings");
  else if (r.has("seq_length"))
    m.max_positions = r.required_dim("seq_length");
  else
    m.max_positions = r.required_dim("max_position_embeddings");  // reports it missing
  bool no_bias = r.optional_bool("no_bias", true);
  m.qkv_bias = true;  // c_attn is built with bias=True whatever no_bias says
  m.attn_out_bias = !no_bias;
  m.mlp_bias = !no_bias;
  m.dropout =
      r.optional_probability("attn_dropout_prob", 0.0) > 0 || r.optional_probability("emb_dropout_prob", 0.0) > 0;
}

// ChatGLMModel / ChatGLMForConditionalGeneration (THUDM's remote code, THUDM/glm-4-9b-chat and THUDM/chatglm3-6b
// configuration_chatglm.py, modeling_chatglm.py). ChatGLMConfig defaults: num_layers 28, padded_vocab_size 65024,
// hidden_size 4096, ffn_hidden_size 13696, kv_channels 128, num_attention_heads 32, seq_length 2048,
// hidden_dropout 0.0, attention_dropout 0.0, layernorm_epsilon 1e-5, rmsnorm True,
// apply_residual_connection_post_layernorm False, post_layer_norm True, add_bias_linear False, add_qkv_bias False,
// multi_query_attention False, multi_query_group_num 1, rope_ratio 1 (GLM-4's file; ChatGLM2's has none: base
// 10000), fp32_residual_connection False, quantization_bit 0, pre_seq_len None. The modules: embedding
// word_embeddings (padded_vocab_size x hidden); GLMBlock: input_layernorm, SelfAttention (query_key_value: hidden ->
// heads x kv_channels + 2 x multi_query_group_num x kv_channels with multi_query_attention, else 3 x heads x
// kv_channels, bias = add_bias_linear or add_qkv_bias; dense: heads x kv_channels -> hidden, bias = add_bias_linear),
// post_attention_layernorm, MLP (dense_h_to_4h: hidden -> 2 x ffn_hidden_size, swiglu, dense_4h_to_h, bias =
// add_bias_linear); RMSNorm with rmsnorm, else LayerNorm; final_layernorm with post_layer_norm; output_layer
// (hidden -> padded_vocab_size, no bias, its own weight). RotaryEmbedding(rotary_dim // 2) with rotary_dim =
// kv_channels: the first half of each head is rotated, with base 10000 x rope_ratio.
void read_chatglm(const Reader& r, ModelSpec& m) {
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  m.head_dim = r.optional_dim("kv_channels", 128);
  checked_mul(r, "kv_channels", m.head_dim, m.num_heads);
  const bool mqa = r.optional_bool("multi_query_attention", false);
  m.num_kv_heads = mqa ? r.optional_dim("multi_query_group_num", 1) : m.num_heads;
  m.ffn_size = r.required_dim("ffn_hidden_size");
  m.gated_mlp = true;                 // dense_h_to_4h is gate and up side by side; swiglu = silu(x1) * x2
  m.activation = ActivationFn::Silu;  // modeling_chatglm.py swiglu: F.silu
  m.vocab_size = r.required_dim("padded_vocab_size");
  m.tied_embeddings = false;  // output_layer is a Linear of its own (tie_word_embeddings is not read)
  m.norm = r.optional_bool("rmsnorm", true) ? NormType::RmsNorm : NormType::LayerNorm;
  m.norm_eps = r.optional_positive("layernorm_epsilon", 1e-5);
  m.position_embedding = PositionEmbedding::Rope;
  m.rope_theta = 10000.0 * r.optional_positive("rope_ratio", 1.0);  // RotaryEmbedding base = 10000 * rope_ratio
  m.rotary_dim = m.head_dim / 2;
  m.max_positions = r.required_dim("seq_length");
  const bool bias = r.optional_bool("add_bias_linear", false);
  m.qkv_bias = bias || r.optional_bool("add_qkv_bias", false);
  m.attn_out_bias = m.mlp_bias = bias;
  m.dropout = r.optional_probability("hidden_dropout", 0.0) > 0 || r.optional_probability("attention_dropout", 0.0) > 0;
  if (r.optional_bool("apply_residual_connection_post_layernorm", false))
    r.fail("apply_residual_connection_post_layernorm", "a residual taken after the norm is not modelled");
  if (!r.optional_bool("post_layer_norm", true))
    r.fail("post_layer_norm", "a model without the final norm is not modelled");
  if (r.optional_bool("fp32_residual_connection", false))
    r.fail("fp32_residual_connection", "an fp32 residual stream is not modelled");
  if (r.has("pre_seq_len"))
    r.fail("pre_seq_len", "P-tuning v2's prefix encoder (its parameters and prefix keys) is not modelled");
}

// GPT2LMHeadModel. GPT2Config defaults (configuration_gpt2.py): n_inner=None (-> 4 * n_embd in
// GPT2Block), activation_function="gelu_new", resid_pdrop=embd_pdrop=attn_pdrop=0.1,
// layer_norm_epsilon=1e-5; tie_word_embeddings comes from PretrainedConfig (True).
void read_gpt2(const Reader& r, ModelSpec& m) {
  m.hidden_size = r.required_dim("n_embd");
  m.num_layers = r.required_dim("n_layer");
  m.num_heads = r.required_dim("n_head");
  m.num_kv_heads = m.num_heads;
  m.head_dim = head_dim_of(r, "n_head", m.hidden_size, m.num_heads);
  m.ffn_size = r.has("n_inner") ? r.optional_dim("n_inner", 0) : checked_mul(r, "n_embd", 4, m.hidden_size);
  m.gated_mlp = false;
  m.activation = activation_of(r, "activation_function", "gelu_new");
  m.vocab_size = r.required_dim("vocab_size");
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", true);
  m.norm = NormType::LayerNorm;
  m.norm_eps = r.optional_positive("layer_norm_epsilon", 1e-5);
  m.position_embedding = PositionEmbedding::Learned;
  m.rope_theta = 0;
  m.max_positions = r.required_dim("n_positions");
  m.qkv_bias = true;  // Conv1D c_attn, c_proj, c_fc, mlp.c_proj all have a bias
  m.attn_out_bias = true;
  m.mlp_bias = true;
  double attn = r.optional_probability("attn_pdrop", 0.1);
  double resid = r.optional_probability("resid_pdrop", 0.1);
  double embd = r.optional_probability("embd_pdrop", 0.1);
  m.dropout = attn > 0 || resid > 0 || embd > 0;
  // GPT2Block adds a cross-attention block (and its parameters) when add_cross_attention is set;
  // a decoder-only LM never has it.
  if (r.optional_bool("add_cross_attention", false))
    r.fail("add_cross_attention", "cross-attention (encoder-decoder use) is not supported");
}

// Keys that change memory or time and that the model does not describe: named in a warning when they are set.
// use_sliding_window with Qwen2/Qwen3 slides only the layers from max_window_layers on: not modelled.
constexpr Unmodelled kQwenWindow = {"use_sliding_window",
                                    "sliding-window layers are not modelled: every layer is planned with global "
                                    "attention"};

// ChatGLM's quantization_bit: the remote code quantizes the weights to 4 or 8 bits on load (quantization.py).
constexpr Unmodelled kChatGlmQuant = {"quantization_bit",
                                      "the weights are quantized on load; memory is planned for the plan's parameter "
                                      "dtype (for a 4-bit frozen base, --method qlora)"};

// DeepSeek-V3's multi-token-prediction module (the checkpoint's model.layers.61, deepseek-ai/DeepSeek-V3
// README_WEIGHTS.md): DeepseekV3ForCausalLM does not build it, and the published 671B leaves it out.
constexpr Unmodelled kMtp = {"num_nextn_predict_layers",
                             "the multi-token-prediction module (its extra decoder layer, eh_proj and norms) is "
                             "neither counted nor trained: the plan is for the 671B main model"};

// Qwen2-VL's multimodal rotary embedding (M-RoPE: rope_scaling {"type": "mrope", "mrope_section": [t, h, w]};
// Qwen2VLRotaryEmbedding, apply_multimodal_rotary_pos_emb in modeling_qwen2_vl.py): the rotary dims of each head are
// split into sections rotated by the temporal, height and width positions. The same rotary work on q and k, and no
// parameters: modelled as rotary, so its rope_scaling is not warned as an unmodelled scaling.
bool is_mrope(Arch arch, const json& root) {
  if (arch != Arch::Qwen2VL && arch != Arch::Qwen25VL) return false;
  auto it = root.find("rope_scaling");
  return it != root.end() && it->is_object() && it->contains("mrope_section");
}

std::vector<std::string> unmodelled_warnings(const Reader& r, Arch arch, const std::string& source) {
  std::vector<std::string> out;
  auto add = [&](const Unmodelled& u) { warn_if_set(r, u, source, out); };
  warn_common_unmodelled(r, source, is_mrope(arch, r.root()), out);
  if (arch == Arch::Qwen2 || arch == Arch::Qwen3 || arch == Arch::Qwen2Moe || arch == Arch::Qwen3Moe ||
      arch == Arch::Qwen2VL || arch == Arch::Qwen25VL)
    add(kQwenWindow);
  if (arch == Arch::DeepseekV3) add(kMtp);
  if (arch == Arch::ChatGlm) add(kChatGlmQuant);
  if (arch == Arch::Llama4Text) warn_llama4_text(r, source, out);
  return out;
}

// Gemma3ForConditionalGeneration: the language model is the text_config object.
const json& text_config_of(const Reader& r) {
  auto it = r.root().find("text_config");
  if (it == r.root().end() || !it->is_object())
    r.fail("text_config", "missing or not an object (Gemma3ForConditionalGeneration keeps the language model there)");
  return *it;
}

void read_arch(Arch arch, const Reader& r, ModelSpec& m) {
  switch (arch) {
    case Arch::Qwen:
      read_qwen(r, m);
      break;
    case Arch::Gpt2:
      read_gpt2(r, m);
      break;
    case Arch::Falcon:
      read_falcon(r, m);
      break;
    case Arch::GptNeoX:
      read_gpt_neox(r, m);
      break;
    case Arch::ChatGlm:
      read_chatglm(r, m);
      break;
    case Arch::Llama4Text:
      read_llama4_text(r, m);
      break;
    default:
      read_llama_like(arch, r, m);
  }
}

// A family's mapping (read_arch) and what every decoder's reading ends with: rope_scaling's extension of the positions,
// a rotary dimension of the whole head written as 0 (model_spec.hpp), and the query width within range.
void read_decoder(Arch arch, const Reader& r, ModelSpec& m) {
  read_arch(arch, r, m);
  if (m.position_embedding == PositionEmbedding::Rope)
    m.rope_scaled_positions = rope_scaled_positions(r, m.max_positions);
  if (m.rotary_dim == m.head_dim) m.rotary_dim = 0;
  checked_mul(r, "head_dim", m.head_dim, m.num_heads);
}

// LlamaConfig's defaults of the shape keys (configuration_llama.py): what a text_config that leaves them out gets.
const std::vector<std::pair<std::string, int64_t>> kLlamaShape = {
    {"vocab_size", 32000},     {"hidden_size", 4096},       {"intermediate_size", 11008},
    {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"max_position_embeddings", 2048}};

// CLIPVisionConfig's defaults (transformers models/clip/configuration_clip.py): hidden_size 768,
// intermediate_size 3072, num_hidden_layers 12, num_attention_heads 12, num_channels 3, image_size 224,
// patch_size 32, hidden_act "quick_gelu", layer_norm_eps 1e-5, attention_dropout 0.0. Without any vision_config,
// LlavaConfig builds CLIPVisionConfig(intermediate_size=4096, hidden_size=1024, patch_size=14, image_size=336,
// num_hidden_layers=24, num_attention_heads=16): CLIP ViT-L/14-336.
const std::vector<std::pair<std::string, int64_t>> kClipVisionShape = {
    {"hidden_size", 768},        {"intermediate_size", 3072}, {"num_hidden_layers", 12},
    {"num_attention_heads", 12}, {"image_size", 224},         {"patch_size", 32}};
const std::vector<std::pair<std::string, int64_t>> kLlavaClipShape = {
    {"hidden_size", 1024},       {"intermediate_size", 4096}, {"num_hidden_layers", 24},
    {"num_attention_heads", 16}, {"image_size", 336},         {"patch_size", 14}};

// CLIPVisionModel (modeling_clip.py, the layout in vision_tower.cpp): LayerNorm blocks with biased q/k/v/out_proj
// and fc1/fc2, a Conv2d patch embedding without bias, a CLS token, a learned position table, pre_layrnorm and
// post_layernorm.
VisionSpec read_clip_vision(const Reader& r) {
  VisionSpec v = read_vit_shape(r, "clip_vision_model", "CLIPVisionModel");
  v.image_size = r.required_dim("image_size");
  v.patch_size = r.required_dim("patch_size");
  if (v.image_size % v.patch_size != 0)
    r.fail("patch_size", std::to_string(v.patch_size) + " does not divide image_size " + std::to_string(v.image_size));
  v.num_channels = r.optional_dim("num_channels", 3);
  v.activation = activation_of(r, "hidden_act", "quick_gelu");
  v.norm = NormType::LayerNorm;
  v.norm_eps = r.optional_positive("layer_norm_eps", 1e-5);
  if (r.optional_probability("attention_dropout", 0.0) > 0)
    r.fail("attention_dropout", "dropout in the vision tower is not modelled");
  v.qkv_bias = v.attn_out_bias = v.mlp_bias = true;
  v.position_embedding = PositionEmbedding::Learned;
  v.patch_bias = false;
  v.class_token = true;
  v.pre_norm = v.post_norm = true;
  return v;
}

// LlavaForConditionalGeneration (transformers models/llava/configuration_llava.py, modeling_llava.py). LlavaConfig
// defaults: vision_config None (-> CLIP ViT-L/14-336, kLlavaClipShape), text_config None (-> LlamaConfig; a dict
// without model_type is "llama"), projector_hidden_act "gelu", vision_feature_select_strategy "default",
// vision_feature_layer -2, multimodal_projector_bias True. LlavaMultiModalProjector: linear_1 (vision hidden ->
// text hidden), act, linear_2 (text hidden -> text hidden), both biased. get_image_features runs the tower with
// output_hidden_states and takes hidden_states[vision_feature_layer] (hidden_states[0] is the embeddings', [i]
// the output of block i); "default" drops the CLS token's feature, "full" keeps it.
//
// vision_feature_layer -2 is the output of the second-to-last block: the last block and post_layernorm do not
// reach the language model. They are counted (the checkpoint and LlavaForConditionalGeneration hold them) and
// held with the root unit, but not run: transformers does run the last block in forward and drops its output, a
// forward of 1 of 24 blocks that this plan does not price; no backward reaches it.
void read_llava(const json& root, const std::string& text, const std::string& source, LoadedModel& out) {
  ModelSpec& m = out.spec;
  Reader top(root, text, source);
  top.set_arch("LlavaForConditionalGeneration");
  const json& tc = sub_config(top, "text_config");
  Reader tr(tc, text, source);
  tr.set_class_defaults(&kLlamaShape);
  std::vector<std::string> text_unmodelled;
  const std::string text_arch = read_language_model(tr, "LlamaForCausalLM", m, text_unmodelled, source);

  const bool given = top.has("vision_config");
  const json& vc = sub_config(top, "vision_config");
  Reader vr(vc, text, source);
  vr.set_arch("CLIPVisionModel");
  vr.set_class_defaults(given ? &kClipVisionShape : &kLlavaClipShape);
  VisionSpec v = read_clip_vision(vr);

  const json* layer = top.has("vision_feature_layer") ? &top.root().at("vision_feature_layer") : nullptr;
  if (layer && layer->is_array())
    top.fail("vision_feature_layer", "features from several layers (a list) are not modelled");
  const int64_t fl = top.optional_int("vision_feature_layer", -2);
  v.run_layers = feature_layer_blocks(top, "vision_feature_layer", fl, v.num_layers);
  const std::string select = top.optional_string("vision_feature_select_strategy", "default");
  if (select != "default" && select != "full")
    top.fail("vision_feature_select_strategy", "'" + select + "' is not one of default, full");
  v.class_token_to_lm = select == "full";
  if (!top.optional_bool("multimodal_projector_bias", true))
    top.fail("multimodal_projector_bias", "a projector without biases is not modelled");
  v.merge = 1;
  v.projector_norm = ProjectorNorm::None;
  v.projector_hidden = m.hidden_size;
  v.projector_activation = activation_of(top, "projector_hidden_act", "gelu");
  v.image_tokens = v.tokens_per_image();  // one image; --image-tokens gives more
  m.vision = v;

  warn_defaults(top, source, "", "LlavaConfig", out.warnings);
  warn_defaults(tr, source, "text_config: ", text_arch, out.warnings);
  warn_defaults(vr, source, "vision_config: ", "CLIPVisionConfig", out.warnings);
  for (auto& w : unmodelled_warnings(top, Arch::Llava, source)) out.warnings.push_back(std::move(w));
  for (auto& w : text_unmodelled) out.warnings.push_back(std::move(w));
  if (v.run_layers < v.num_layers)
    out.warnings.push_back(source + ": vision_feature_layer " + std::to_string(fl) + ": the vision tower's last " +
                           std::to_string(v.num_layers - v.run_layers) +
                           " block(s) and post_layernorm are counted but not run (transformers runs them in "
                           "forward and drops their output; that forward is not priced, and no backward reaches "
                           "them)");
  out.warnings.push_back(source + ": " + std::to_string(v.image_tokens) + " image tokens per sample (one " +
                         std::to_string(v.image_size) + "x" + std::to_string(v.image_size) +
                         " image) join the language model's sequence; --image-tokens N sets another count");
}

// Qwen2VLVisionConfig's defaults (transformers v4.51 models/qwen2_vl/configuration_qwen2_vl.py): depth 32, embed_dim
// 1280, hidden_size 3584 (the merger's output: the language model's width), hidden_act "quick_gelu", mlp_ratio 4,
// num_heads 16, in_channels 3, patch_size 14, spatial_merge_size 2, temporal_patch_size 2. Qwen2_5_VLVisionConfig's
// (models/qwen2_5_vl/configuration_qwen2_5_vl.py): depth 32, hidden_size 3584 (the tower's width), hidden_act "silu",
// intermediate_size 3420, num_heads 16, in_channels 3, patch_size 14, spatial_merge_size 2, temporal_patch_size 2,
// window_size 112, out_hidden_size 3584, fullatt_block_indexes [7, 15, 23, 31]. The hub's config.json files also
// carry in_chans and spatial_patch_size, which neither class reads (the patch embedding takes in_channels and
// patch_size): they are ignored.
const std::vector<std::pair<std::string, int64_t>> kQwen2VlVisionShape = {
    {"depth", 32}, {"embed_dim", 1280}, {"hidden_size", 3584}, {"num_heads", 16}, {"patch_size", 14}};
const std::vector<std::pair<std::string, int64_t>> kQwen25VlVisionShape = {
    {"depth", 32},     {"hidden_size", 3584}, {"intermediate_size", 3420},
    {"num_heads", 16}, {"patch_size", 14},    {"out_hidden_size", 3584}};
// Qwen2VLTextConfig's / Qwen2_5_VLTextConfig's shape defaults: what a text_config (transformers >= 4.53 writes one)
// leaves out.
const std::vector<std::pair<std::string, int64_t>> kQwen2VlTextShape = {
    {"vocab_size", 152064},    {"hidden_size", 8192},       {"intermediate_size", 29568},
    {"num_hidden_layers", 80}, {"num_attention_heads", 64}, {"max_position_embeddings", 32768}};

// Qwen2.5-VL's fullatt_block_indexes: the blocks that attend the whole image; the others attend their window. Only
// "every N-th block" (0-based N-1, 2N-1, ...) is modelled (VisionSpec::global_layer_every); an empty list: none.
int64_t full_attention_every(const Reader& r, int64_t depth) {
  std::vector<int64_t> blocks;
  if (!r.has("fullatt_block_indexes")) {
    r.note_default("fullatt_block_indexes", "[7, 15, 23, 31]");
    blocks = {7, 15, 23, 31};
  } else {
    const json& list = r.root().at("fullatt_block_indexes");
    if (!list.is_array()) r.fail("fullatt_block_indexes", "expected a list of block indices, got " + show(list));
    for (const json& b : list) {
      if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() >= depth)
        r.fail("fullatt_block_indexes", show(b) + " is not a block index below depth " + std::to_string(depth));
      blocks.push_back(b.get<int64_t>());
    }
  }
  if (blocks.empty()) return 0;
  const int64_t every = blocks.front() + 1;
  std::vector<int64_t> pattern;
  for (int64_t i = every - 1; i < depth; i += every) pattern.push_back(i);
  if (blocks != pattern)
    r.fail("fullatt_block_indexes",
           "the pattern is not \"every N-th block attends the whole image\", the only one modelled");
  return every;
}

// Qwen2VLForConditionalGeneration and Qwen2_5_VLForConditionalGeneration (transformers v4.51
// models/qwen2_vl/{configuration,modeling}_qwen2_vl.py, models/qwen2_5_vl/{configuration,modeling}_qwen2_5_vl.py).
// The language model is Qwen2's decoder (Qwen2VLDecoderLayer: q/k/v biased, o_proj not; M-RoPE, is_mrope), its keys
// at the top level (the hub's files; Qwen2VLConfig builds its text config from them) or in text_config. The tower
// (vision_tower.cpp): PatchEmbed, a Conv3d of in_channels x temporal_patch_size x patch^2 -> width without bias; 2-D
// rotary (VisionRotaryEmbedding, no parameters); `depth` blocks: Qwen2-VL's Qwen2VLVisionBlock (norm1, norm2 =
// LayerNorm(embed_dim, eps=1e-6); attn.qkv (width -> 3 x width) and attn.proj biased; VisionMlp fc1 (width ->
// int(embed_dim * mlp_ratio)), act, fc2, biased), Qwen2.5-VL's Qwen2_5_VLVisionBlock (Qwen2RMSNorm(hidden_size,
// eps=1e-6); the same attention; Qwen2_5_VLMLP gate/up/down_proj with bias=True); the merger PatchMerger(dim =
// hidden_size (2.5: out_hidden_size), context_dim = the width): ln_q over each patch (LayerNorm(context_dim,
// eps=1e-6); 2.5: Qwen2RMSNorm), then spatial_merge_size^2 patches side by side through Linear(width x merge^2 -> the
// same), nn.GELU(), Linear(-> dim), biased. Qwen2.5-VL's blocks attend windows of (window_size // spatial_merge_size
// // patch_size) merged tokens a side (get_window_index), except fullatt_block_indexes. Dynamic resolution: no image
// size, so the image tokens of a sample are the run's to give (--image-tokens).
void read_qwen2_vl(Arch arch, const json& root, const std::string& text, const std::string& source, LoadedModel& out) {
  ModelSpec& m = out.spec;
  const bool v25 = arch == Arch::Qwen25VL;
  const std::string cls = v25 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration";
  Reader top(root, text, source);
  top.set_arch(cls);
  const bool nested = top.has("text_config");
  const json& tc = nested ? sub_config(top, "text_config") : root;
  Reader tr(tc, text, source);
  tr.set_arch(cls);
  if (nested) tr.set_class_defaults(&kQwen2VlTextShape);
  read_llama_like(arch, tr, m);
  checked_mul(tr, "num_attention_heads", m.head_dim, m.num_heads);

  const json& vc = sub_config(top, "vision_config");
  Reader vr(vc, text, source);
  const std::string vcls = v25 ? "Qwen2_5_VLVisionConfig" : "Qwen2VLVisionConfig";
  vr.set_arch(vcls);
  vr.set_class_defaults(v25 ? &kQwen25VlVisionShape : &kQwen2VlVisionShape);
  const std::string expected = v25 ? "qwen2_5_vl" : "qwen2_vl";
  const std::string type = vr.optional_string("model_type", expected);
  if (type != expected) vr.fail("model_type", "vision tower '" + type + "' is not " + cls + "'s (" + expected + ")");
  VisionSpec v;
  v.num_layers = v.run_layers = vr.required_dim("depth");
  std::string out_key;
  int64_t out_dim = 0;
  if (v25) {
    v.hidden_size = vr.required_dim("hidden_size");
    v.ffn_size = vr.required_dim("intermediate_size");
    v.gated_mlp = true;
    v.activation = activation_of(vr, "hidden_act", "silu");
    v.norm = NormType::RmsNorm;
    out_key = "out_hidden_size";
  } else {
    v.hidden_size = vr.required_dim("embed_dim");
    const double ratio = vr.optional_positive("mlp_ratio", 4.0);
    const double ffn = std::floor(static_cast<double>(v.hidden_size) * ratio);  // int(embed_dim * mlp_ratio)
    if (!(ffn >= 1) || ffn > static_cast<double>(kMaxDim)) vr.fail("mlp_ratio", "gives no MLP width");
    v.ffn_size = static_cast<int64_t>(ffn);
    v.gated_mlp = false;
    v.activation = activation_of(vr, "hidden_act", "quick_gelu");
    v.norm = NormType::LayerNorm;
    out_key = "hidden_size";
  }
  out_dim = vr.required_dim(out_key);
  if (out_dim != m.hidden_size)
    vr.fail(out_key, "the merger's output (" + std::to_string(out_dim) + ") must be the language model's hidden_size " +
                         std::to_string(m.hidden_size));
  v.num_heads = vr.required_dim("num_heads");
  head_dim_of(vr, "num_heads", v.hidden_size, v.num_heads);
  v.norm_eps = 1e-6;  // fixed in the modeling code (both blocks and ln_q)
  v.qkv_bias = v.attn_out_bias = v.mlp_bias = true;
  v.position_embedding = PositionEmbedding::Rope;
  v.num_channels = vr.optional_dim("in_channels", 3);
  v.patch_size = vr.required_dim("patch_size");
  v.temporal_patch_size = vr.optional_dim("temporal_patch_size", 2);
  v.image_size = 0;  // dynamic resolution
  v.patch_bias = v.class_token = v.pre_norm = v.post_norm = false;
  v.merge = vr.optional_dim("spatial_merge_size", 2);
  if (v25) {
    const int64_t window_size = vr.optional_dim("window_size", 112);
    const int64_t side = window_size / v.merge / v.patch_size;  // vit_merger_window_size
    if (side == 0)
      vr.fail("window_size", std::to_string(window_size) + " pixels is less than one merged token (" +
                                 std::to_string(v.merge * v.patch_size) + ")");
    v.window = checked_mul(vr, "window_size", side * v.merge, side * v.merge);
    v.global_layer_every = full_attention_every(vr, v.num_layers);
  }
  v.projector_norm = ProjectorNorm::BeforeMerge;
  v.projector_norm_type = v.norm;
  v.projector_hidden = checked_mul(vr, "spatial_merge_size", v.hidden_size, v.merge * v.merge);
  v.projector_activation = ActivationFn::Gelu;  // nn.GELU(): erf
  v.image_tokens = 0;                           // the run's --image-tokens
  m.vision = v;

  warn_defaults(top, source, "", v25 ? "Qwen2_5_VLConfig" : "Qwen2VLConfig", out.warnings);
  warn_defaults(tr, source, nested ? "text_config: " : "", cls, out.warnings);
  warn_defaults(vr, source, "vision_config: ", vcls, out.warnings);
  if (nested)
    for (auto& w : unmodelled_warnings(top, arch, source)) out.warnings.push_back(std::move(w));
  for (auto& w : unmodelled_warnings(tr, arch, source)) out.warnings.push_back(std::move(w));
  out.warnings.push_back(source + ": dynamic resolution: the image tokens of a sample (each " +
                         std::to_string(v.merge) + "x" + std::to_string(v.merge) + " patches of " +
                         std::to_string(v.patch_size) + "x" + std::to_string(v.patch_size) +
                         " pixels) are not in "
                         "the config; give --image-tokens N (simulate refuses without it)");
}

}  // namespace

std::string hf::read_language_model(Reader& r, const std::string& fallback, ModelSpec& m,
                                    std::vector<std::string>& unmodelled, const std::string& source) {
  std::string name = fallback;
  Arch arch = Arch::Llama;
  bool found = false;
  if (r.has("architectures") || r.has("model_type")) {
    const ArchName& row = find_arch(r.root(), r);
    arch = row.arch;
    name = row.architecture;
    found = true;
  }
  if (!found) {
    for (const auto& a : kArchitectures)
      if (fallback == a.architecture) {
        arch = a.arch;
        r.note_default("model_type", "\"" + std::string(a.model_type) + "\"");
        found = true;
      }
    FSDP_ASSERT(found, "read_language_model: the fallback is a class of the table");
  }
  if (arch == Arch::Llava || arch == Arch::Gemma3 || arch == Arch::Qwen2VL || arch == Arch::Qwen25VL ||
      arch == Arch::Llama4 || arch == Arch::InternVLChat)
    r.fail("architectures", "a composite model cannot be a composite model's language model");
  r.set_arch(name);
  read_decoder(arch, r, m);
  for (auto& w : unmodelled_warnings(r, arch, source)) unmodelled.push_back(std::move(w));
  return name;
}

LoadedModel read_hf_config(const std::string& json_text, const std::string& source_name) {
  json root = parse_json(json_text, source_name);
  if (!root.is_object()) throw InputError(source_name + ":1: expected a JSON object (a config.json) at the top level");
  Reader top(root, json_text, source_name);

  const ArchName& row = find_arch(root, top);
  const Arch arch = row.arch;
  const std::string arch_name = row.architecture;
  top.set_arch(arch_name);

  LoadedModel out;
  ModelSpec& m = out.spec;
  // The name: _name_or_path when the file records one (a hub id such as "meta-llama/Llama-2-7b-hf"),
  // otherwise the file's stem ("config" for .../config.json).
  std::string name = top.optional_string("_name_or_path", "");
  m.name = name.empty() ? std::filesystem::path(source_name).stem().string() : name;
  if (m.name.empty()) m.name = source_name;
  m.family = "decoder";
  // The class's model_type (its row of kArchitectures), whatever the file's model_type says of a remote-code class.
  m.hf_model_type = row.model_type;

  if (arch == Arch::Llava) {
    read_llava(root, json_text, source_name, out);
    validate_model(m, source_name);
    return out;
  }
  if (arch == Arch::Qwen2VL || arch == Arch::Qwen25VL) {
    read_qwen2_vl(arch, root, json_text, source_name, out);
    validate_model(m, source_name);
    return out;
  }
  if (arch == Arch::Llama4 || arch == Arch::InternVLChat) {
    (arch == Arch::Llama4 ? read_llama4 : read_internvl)(root, json_text, source_name, out);
    validate_model(m, source_name);
    return out;
  }
  const json& body = arch == Arch::Gemma3 ? text_config_of(top) : root;
  Reader r(body, json_text, source_name);
  r.set_arch(arch_name);
  read_decoder(arch, r, m);
  validate_model(m, source_name);

  if (!r.defaults().empty()) {
    std::string list;
    for (const auto& d : r.defaults()) list += (list.empty() ? "" : ", ") + d;
    out.warnings.push_back(source_name + ": not given, so the " + arch_name +
                           " defaults of transformers are taken: " + list);
  }
  for (auto& w : unmodelled_warnings(r, arch, source_name)) out.warnings.push_back(std::move(w));
  if (arch == Arch::Gemma3)
    out.warnings.push_back(source_name +
                           ": the vision tower (vision_config) and the multi-modal projector are not counted: the "
                           "plan is for the language model of text_config");
  return out;
}

ModelSpec parse_hf_config(const std::string& json_text, const std::string& source_name) {
  return read_hf_config(json_text, source_name).spec;
}

}  // namespace fsdp
