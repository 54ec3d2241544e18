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
//  - Keys that change no parameter, FLOP or saved tensor (token ids, rope_scaling, sliding_window,
//    torch_dtype, ...) are ignored; so are keys this reader does not know, because config.json files
//    carry many tool-specific extras.
//  - Any problem is an InputError naming the file, the line of the key where it can be found in the
//    text, and the key. A key given twice in one object is one (core/duplicate_keys.hpp), not the last
//    value silently taken.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/duplicate_keys.hpp"
#include "core/errors.hpp"
#include "model/model_loader.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

enum class Arch { Llama, Mistral, Mixtral, Qwen2, Qwen, Gpt2 };

struct ArchName {
  const char* architecture;  // the "architectures" entry
  const char* model_type;    // the "model_type" value, used when "architectures" is absent
  Arch arch;
};

constexpr ArchName kArchitectures[] = {
    {"LlamaForCausalLM", "llama", Arch::Llama},       {"MistralForCausalLM", "mistral", Arch::Mistral},
    {"MixtralForCausalLM", "mixtral", Arch::Mixtral}, {"Qwen2ForCausalLM", "qwen2", Arch::Qwen2},
    {"QWenLMHeadModel", "qwen", Arch::Qwen},          {"GPT2LMHeadModel", "gpt2", Arch::Gpt2},
};

// Sizes above this would overflow the parameter arithmetic downstream (vocab * hidden, layers *
// hidden * ffn in int64); no published model comes near it.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();

std::string known_architectures() {
  std::string s;
  for (const auto& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
  return s;
}

// A short, printable rendering of a JSON value for messages.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

class Reader {
 public:
  Reader(const json& root, const std::string& text, const std::string& source)
      : root_(root), text_(text), source_(source) {}

  void set_arch(const std::string& arch) { arch_ = arch; }

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    int line = line_of(key);
    std::string where = line > 0 ? source_ + ":" + std::to_string(line) : source_;
    throw InputError(where + ": key '" + key + "': " + message);
  }

  // Present with a non-null value (HF writes null for "use the default").
  bool has(const std::string& key) const {
    auto it = root_.find(key);
    return it != root_.end() && !it->is_null();
  }

  int64_t required_dim(const std::string& key) const {
    if (!has(key)) {
      if (root_.contains(key)) fail(key, "is null; " + arch_ + " needs a positive integer");
      fail(key, "missing (required for " + arch_ + ")");
    }
    return dim(key);
  }

  int64_t optional_dim(const std::string& key, int64_t fallback) const { return has(key) ? dim(key) : fallback; }

  double optional_positive(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + show(v));
    double d = v.get<double>();
    if (!std::isfinite(d) || !(d > 0)) fail(key, "must be a positive number, got " + show(v));
    return d;
  }

  double optional_probability(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + show(v));
    double d = v.get<double>();
    if (!(d >= 0 && d <= 1)) fail(key, "must be a probability in [0, 1], got " + show(v));
    return d;
  }

  bool optional_bool(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + show(v));
    return v.get<bool>();
  }

  std::string optional_string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = root_.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + show(v));
    return v.get<std::string>();
  }

 private:
  int64_t dim(const std::string& key) const {
    const json& v = root_.at(key);
    if (!v.is_number_integer()) fail(key, "expected a positive integer, got " + show(v));
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
        fail(key, "too large: " + show(v) + " (at most " + std::to_string(kMaxDim) + ")");
    }
    int64_t n = v.get<int64_t>();
    if (n <= 0) fail(key, "must be a positive integer, got " + show(v));
    if (n > kMaxDim) fail(key, "too large: " + show(v) + " (at most " + std::to_string(kMaxDim) + ")");
    return n;
  }

  // The line of the first `"key" :` in the text (top-level keys come first in every config.json
  // we have seen); 0 when it cannot be found.
  int line_of(const std::string& key) const {
    std::string quoted = "\"" + key + "\"";
    for (size_t pos = text_.find(quoted); pos != std::string::npos; pos = text_.find(quoted, pos + 1)) {
      size_t after = pos + quoted.size();
      while (after < text_.size() &&
             (text_[after] == ' ' || text_[after] == '\t' || text_[after] == '\r' || text_[after] == '\n'))
        ++after;
      if (after < text_.size() && text_[after] == ':') {
        int line = 1;
        for (size_t i = 0; i < pos; ++i)
          if (text_[i] == '\n') ++line;
        return line;
      }
    }
    return 0;
  }

  const json& root_;
  const std::string& text_;
  const std::string& source_;
  std::string arch_;
};

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

Arch find_arch(const json& root, const Reader& r, std::string* name) {
  auto it = root.find("architectures");
  if (it != root.end() && !it->is_null()) {
    if (!it->is_array()) r.fail("architectures", "expected a list of class names, got " + show(*it));
    if (it->empty()) r.fail("architectures", "is empty; expected one of: " + known_architectures());
    for (const auto& entry : *it) {
      if (!entry.is_string()) r.fail("architectures", "expected class names (strings), got " + show(entry));
      for (const auto& a : kArchitectures)
        if (entry.get<std::string>() == a.architecture) {
          *name = a.architecture;
          return a.arch;
        }
    }
    r.fail("architectures", show(*it) + " is not supported; supported: " + known_architectures());
  }
  // Old config.json files (before transformers wrote "architectures") only have model_type.
  if (r.has("model_type")) {
    std::string type = r.optional_string("model_type", "");
    for (const auto& a : kArchitectures)
      if (type == a.model_type) {
        *name = a.architecture;
        return a.arch;
      }
    r.fail("model_type",
           "'" + type + "' is not supported and there is no 'architectures' list; supported: " + known_architectures());
  }
  r.fail("architectures", "missing (and no model_type either); expected one of: " + known_architectures());
}

ActivationFn activation_of(const Reader& r, const std::string& key, const std::string& fallback) {
  std::string act = r.optional_string(key, fallback);
  // Names from transformers src/transformers/activations.py ACT2CLS.
  if (act == "silu" || act == "swish") return ActivationFn::Silu;
  if (act == "gelu") return ActivationFn::Gelu;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") return ActivationFn::GeluTanh;
  r.fail(key, "activation '" + act + "' is not supported (silu, swish, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)");
}

int64_t checked_mul(const Reader& r, const std::string& key, int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out) || out > kMaxDim)
    r.fail(key,
           std::to_string(a) + " * " + std::to_string(b) + " is too large (at most " + std::to_string(kMaxDim) + ")");
  return out;
}

// head_dim when the config does not give one: hidden_size / num_attention_heads, which every
// supported modeling file requires to divide (e.g. GPT2Attention raises otherwise).
int64_t head_dim_of(const Reader& r, const std::string& heads_key, int64_t hidden, int64_t heads) {
  if (hidden % heads != 0)
    r.fail(heads_key, std::to_string(heads) + " does not divide the hidden size " + std::to_string(hidden));
  return hidden / heads;
}

// LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM: the same key names.
void read_llama_like(Arch arch, const Reader& r, ModelSpec& m) {
  m.hidden_size = r.required_dim("hidden_size");
  m.num_layers = r.required_dim("num_hidden_layers");
  m.num_heads = r.required_dim("num_attention_heads");
  // num_key_value_heads defaults: LlamaConfig takes None and then "if num_key_value_heads is None:
  // num_key_value_heads = num_attention_heads" (configuration_llama.py); MistralConfig and
  // MixtralConfig default to 8 (configuration_mistral.py, configuration_mixtral.py); Qwen2Config
  // defaults to 32 (configuration_qwen2.py). null means "the default" in all four.
  int64_t kv_default = arch == Arch::Llama ? m.num_heads : arch == Arch::Qwen2 ? 32 : 8;
  m.num_kv_heads = r.optional_dim("num_key_value_heads", kv_default);
  // head_dim: optional in all four (None -> hidden_size // num_attention_heads).
  m.head_dim = r.has("head_dim") ? r.optional_dim("head_dim", 0)
                                 : head_dim_of(r, "num_attention_heads", m.hidden_size, m.num_heads);
  m.ffn_size = r.required_dim("intermediate_size");
  m.gated_mlp = true;  // gate_proj / up_proj / down_proj (MixtralBlockSparseTop2MLP: w1 / w3 / w2)
  m.activation = activation_of(r, "hidden_act", "silu");  // every one of the four defaults to "silu"
  m.vocab_size = r.required_dim("vocab_size");
  // tie_word_embeddings: False in all four config classes.
  m.tied_embeddings = r.optional_bool("tie_word_embeddings", false);
  m.norm = NormType::RmsNorm;
  // rms_norm_eps defaults: Llama 1e-6, Mistral 1e-6, Mixtral 1e-5, Qwen2 1e-6.
  m.norm_eps = r.optional_positive("rms_norm_eps", arch == Arch::Mixtral ? 1e-5 : 1e-6);
  m.position_embedding = PositionEmbedding::Rope;
  // rope_theta defaults: Llama 10000.0, Mistral 10000.0, Mixtral 1e6, Qwen2 10000.0.
  m.rope_theta = r.optional_positive("rope_theta", arch == Arch::Mixtral ? 1e6 : 10000.0);
  m.max_positions = r.required_dim("max_position_embeddings");
  if (arch == Arch::Llama) {
    // LlamaAttention: q/k/v/o_proj bias=config.attention_bias; LlamaMLP: bias=config.mlp_bias; both default False.
    bool attention_bias = r.optional_bool("attention_bias", false);
    m.qkv_bias = attention_bias;
    m.attn_out_bias = attention_bias;
    m.mlp_bias = r.optional_bool("mlp_bias", false);
  } else {
    // Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False; Mistral / Mixtral: no bias anywhere.
    m.qkv_bias = arch == Arch::Qwen2;
    m.attn_out_bias = false;
    m.mlp_bias = false;
  }
  // attention_dropout (on the softmax) defaults to 0.0 in all four.
  m.dropout = r.optional_probability("attention_dropout", 0.0) > 0;
  if (arch == Arch::Mixtral) {
    MoeSpec moe;
    // MixtralConfig: num_local_experts=8, num_experts_per_tok=2; each expert's w1/w3 are
    // hidden -> intermediate_size. Mixtral has no shared experts.
    moe.num_experts = r.optional_dim("num_local_experts", 8);
    moe.experts_per_token = r.optional_dim("num_experts_per_tok", 2);
    if (moe.experts_per_token > moe.num_experts)
      r.fail("num_experts_per_tok",
             std::to_string(moe.experts_per_token) + " exceeds num_local_experts " + std::to_string(moe.num_experts));
    moe.shared_experts = 0;
    moe.expert_ffn_size = m.ffn_size;
    m.moe = moe;
  }
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

}  // namespace

ModelSpec parse_hf_config(const std::string& json_text, const std::string& source_name) {
  json root = parse_json(json_text, source_name);
  if (!root.is_object()) throw InputError(source_name + ":1: expected a JSON object (a config.json) at the top level");
  Reader r(root, json_text, source_name);

  std::string arch_name;
  Arch arch = find_arch(root, r, &arch_name);
  r.set_arch(arch_name);

  ModelSpec m;
  // The name: _name_or_path when the file records one (a hub id such as "meta-llama/Llama-2-7b-hf"),
  // otherwise the file's stem ("config" for .../config.json).
  std::string name = r.optional_string("_name_or_path", "");
  m.name = name.empty() ? std::filesystem::path(source_name).stem().string() : name;
  if (m.name.empty()) m.name = source_name;
  m.family = "decoder";

  switch (arch) {
    case Arch::Llama:
    case Arch::Mistral:
    case Arch::Mixtral:
    case Arch::Qwen2:
      read_llama_like(arch, r, m);
      break;
    case Arch::Qwen:
      read_qwen(r, m);
      break;
    case Arch::Gpt2:
      read_gpt2(r, m);
      break;
  }
  checked_mul(r, "head_dim", m.head_dim, m.num_heads);
  validate_model(m, source_name);
  return m;
}

}  // namespace fsdp
