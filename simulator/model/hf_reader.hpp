// The pieces the config.json readers share (internal to simulator/model): the strict key reader with its defaults
// bookkeeping, a few checked conversions, composite models' sub-configs and the warnings. hf_config.cpp holds the
// architecture table and the single-file families; a family whose mapping is large has a file of its own
// (hf_llama4.cpp, hf_internvl.cpp) declared at the end.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "model/model_loader.hpp"

namespace fsdp::hf {

using json = nlohmann::json;

// Sizes above this would overflow the parameter arithmetic downstream (vocab * hidden, layers *
// hidden * ffn in int64); no published model comes near it.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();

// A short, printable rendering of a JSON value for messages.
inline std::string show(const json& v) {
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

  // A sub-config of a composite model (text_config, vision_config) is written as its differences from its class's
  // defaults (transformers PretrainedConfig.to_diff_dict), so its shape keys may be absent: then they take the
  // class's defaults, each named in the warning. `dims`: the class's defaults of the keys required elsewhere.
  void set_class_defaults(const std::vector<std::pair<std::string, int64_t>>* dims) { class_dims_ = dims; }

  int64_t required_dim(const std::string& key) const {
    if (!has(key) && class_dims_ != nullptr && !root_.contains(key))
      for (const auto& [k, v] : *class_dims_)
        if (k == key) return defaulted(key, std::to_string(v), v);
    if (!has(key)) {
      if (root_.contains(key)) fail(key, "is null; " + arch_ + " needs a positive integer");
      fail(key, "missing (required for " + arch_ + ")");
    }
    return dim(key);
  }

  int64_t optional_dim(const std::string& key, int64_t fallback) const {
    if (!has(key)) return defaulted(key, std::to_string(fallback), fallback);
    return dim(key);
  }

  // An integer of either sign (LLaVA's vision_feature_layer: -2 counts from the last hidden state).
  int64_t optional_int(const std::string& key, int64_t fallback) const {
    if (!has(key)) return defaulted(key, std::to_string(fallback), fallback);
    const json& v = root_.at(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + show(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMaxDim)) fail(key, "too large");
    const int64_t n = v.get<int64_t>();
    if (n > kMaxDim || n < -kMaxDim) fail(key, "too large: " + show(v));
    return n;
  }

  double optional_positive(const std::string& key, double fallback) const {
    if (!has(key)) return defaulted(key, number(fallback), fallback);
    const json& v = root_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + show(v));
    double d = v.get<double>();
    if (!std::isfinite(d) || !(d > 0)) fail(key, "must be a positive number, got " + show(v));
    return d;
  }

  double optional_probability(const std::string& key, double fallback) const {
    if (!has(key)) return defaulted(key, number(fallback), fallback);
    const json& v = root_.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + show(v));
    double d = v.get<double>();
    if (!(d >= 0 && d <= 1)) fail(key, "must be a probability in [0, 1], got " + show(v));
    return d;
  }

  bool optional_bool(const std::string& key, bool fallback) const {
    if (!has(key)) return defaulted(key, fallback ? "true" : "false", fallback);
    const json& v = root_.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + show(v));
    return v.get<bool>();
  }

  std::string optional_string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return defaulted(key, "\"" + fallback + "\"", fallback);
    const json& v = root_.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + show(v));
    return v.get<std::string>();
  }

  // A number that may be absent or null (its own default): a cap, a window. Not a default when absent.
  std::optional<double> nullable_positive(const std::string& key, std::optional<double> fallback) const {
    if (root_.contains(key) && root_.at(key).is_null()) return std::nullopt;
    if (!root_.contains(key)) {
      defaulted(key, fallback ? number(*fallback) : "null", 0);
      return fallback;
    }
    return optional_positive(key, 0);
  }

  // A value the modeling code derives when the key is absent (head_dim = hidden / heads), for the warning.
  void note_default(const std::string& key, const std::string& value) const { defaulted(key, value, 0); }

  // "key = value" for every optional key that took its default, in reading order.
  const std::vector<std::string>& defaults() const { return defaults_; }
  const json& root() const { return root_; }

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

  template <typename T>
  T defaulted(const std::string& key, const std::string& shown, T value) const {
    defaults_.push_back(key + " = " + shown);
    return value;
  }

  static std::string number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }

  const json& root_;
  const std::string& text_;
  const std::string& source_;
  std::string arch_;
  const std::vector<std::pair<std::string, int64_t>>* class_dims_ = nullptr;
  mutable std::vector<std::string> defaults_;
};

ActivationFn activation_of(const Reader& r, const std::string& key, const std::string& fallback);
// a * b, refused (naming `key`) beyond kMaxDim.
int64_t checked_mul(const Reader& r, const std::string& key, int64_t a, int64_t b);
// head_dim when the config does not give one: hidden_size / num_attention_heads, which every
// supported modeling file requires to divide (e.g. GPT2Attention raises otherwise).
int64_t head_dim_of(const Reader& r, const std::string& heads_key, int64_t hidden, int64_t heads);
// A composite model's sub-config (text_config, vision_config): the object, or an empty one (every key at its
// class's default) when the key is absent or null, as the composite config classes build it.
const json& sub_config(const Reader& top, const std::string& key);
// The shape every ViT config shares (CLIPVisionConfig, Llama4VisionConfig, InternVisionConfig): model_type, which must
// be `type` (`cls`'s), hidden_size, num_hidden_layers (all of them run), num_attention_heads (dividing the hidden
// size), intermediate_size (a plain fc1, act, fc2 MLP).
VisionSpec read_vit_shape(const Reader& r, const std::string& type, const std::string& cls);
// The blocks that run when the features are taken from hidden_states[key] (LLaVA's vision_feature_layer, InternVL's
// select_layer, its value `given`; hidden_states has num_layers + 1 entries, a negative index counts from the end):
// the index, refused
// (naming `key`) unless it is the output of one of the blocks.
int64_t feature_layer_blocks(const Reader& r, const std::string& key, int64_t given, int64_t num_layers);
// N for a pixel shuffle by the ratio under `key` (Llama 4's pixel_shuffle_ratio, InternVL's downsample_ratio): N x N
// patches become one token; only 1 / N for a whole N is modelled.
int64_t merge_of_ratio(const Reader& r, const std::string& key, double fallback);
// The warning naming the keys of one reader that took their defaults.
void warn_defaults(const Reader& r, const std::string& source, const std::string& where, const std::string& cls,
                   std::vector<std::string>& out);

// A key that changes memory or time and that the model does not describe: named in a warning when it is set.
struct Unmodelled {
  const char* key;
  const char* why;
};
bool is_set(const json& root, const char* key);
void warn_if_set(const Reader& r, const Unmodelled& u, const std::string& source, std::vector<std::string>& out);
// The positions a config's rope_scaling extends RoPE to (ModelSpec::rope_scaled_positions): factor x
// original_max_position_embeddings (in rope_scaling, or beside it, Phi-3's), else x max_positions; 0 without a
// rope_scaling, for M-RoPE and for one without a factor (LongRoPE's long_factor / short_factor lists: the
// max_position_embeddings such a config gives is already the extended length). A factor that is not a positive
// number is an error naming rope_scaling.factor.
int64_t rope_scaled_positions(const Reader& r, int64_t max_positions);

// The keys every family warns about (quantization_config, rope_scaling, ...); `mrope`: rope_scaling is Qwen2-VL's
// M-RoPE (rotary, modelled), not a scaling.
void warn_common_unmodelled(const Reader& r, const std::string& source, bool mrope, std::vector<std::string>& out);

// A composite model's language model (LLaVA's text_config, InternVL's llm_config) read by the mapping of the
// causal-LM class its "architectures" (or "model_type") names, `fallback` when it names neither (noted as a default);
// composite classes are refused. Its unmodelled keys' warnings go to `unmodelled`. Returns the class's name.
std::string read_language_model(Reader& r, const std::string& fallback, ModelSpec& m,
                                std::vector<std::string>& unmodelled, const std::string& source);

// Llama 4 (hf_llama4.cpp): Llama4ForCausalLM's text model from its config object, with the warnings of its
// unmodelled keys; Llama4ForConditionalGeneration whole.
void read_llama4_text(const Reader& r, ModelSpec& m);
void warn_llama4_text(const Reader& r, const std::string& source, std::vector<std::string>& out);
void read_llama4(const json& root, const std::string& text, const std::string& source, LoadedModel& out);
// InternVL's remote-code InternVLChatModel (hf_internvl.cpp).
void read_internvl(const json& root, const std::string& text, const std::string& source, LoadedModel& out);

}  // namespace fsdp::hf
