// The shared pieces of the config.json readers (hf_reader.hpp).
#include "model/hf_reader.hpp"

#include <cmath>

namespace fsdp::hf {

ActivationFn activation_of(const Reader& r, const std::string& key, const std::string& fallback) {
  std::string act = r.optional_string(key, fallback);
  // Names from transformers src/transformers/activations.py ACT2CLS.
  if (act == "silu" || act == "swish") return ActivationFn::Silu;
  if (act == "gelu") return ActivationFn::Gelu;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") return ActivationFn::GeluTanh;
  if (act == "quick_gelu") return ActivationFn::QuickGelu;
  r.fail(key, "activation '" + act +
                  "' is not supported (silu, swish, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, quick_gelu)");
}

int64_t checked_mul(const Reader& r, const std::string& key, int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out) || out > kMaxDim)
    r.fail(key,
           std::to_string(a) + " * " + std::to_string(b) + " is too large (at most " + std::to_string(kMaxDim) + ")");
  return out;
}

int64_t head_dim_of(const Reader& r, const std::string& heads_key, int64_t hidden, int64_t heads) {
  if (hidden % heads != 0)
    r.fail(heads_key, std::to_string(heads) + " does not divide the hidden size " + std::to_string(hidden));
  return hidden / heads;
}

const json& sub_config(const Reader& top, const std::string& key) {
  static const json kEmpty = json::object();
  auto it = top.root().find(key);
  if (it == top.root().end() || it->is_null()) {
    top.note_default(key, "{} (every key at its class's default)");
    return kEmpty;
  }
  if (!it->is_object()) top.fail(key, "expected an object (a sub-config), got " + show(*it));
  return *it;
}

void warn_defaults(const Reader& r, const std::string& source, const std::string& where, const std::string& cls,
                   std::vector<std::string>& out) {
  if (r.defaults().empty()) return;
  std::string list;
  for (const auto& d : r.defaults()) list += (list.empty() ? "" : ", ") + d;
  out.push_back(source + ": " + where + "not given, so the " + cls + " defaults of transformers are taken: " + list);
}

VisionSpec read_vit_shape(const Reader& r, const std::string& type, const std::string& cls) {
  const std::string given = r.optional_string("model_type", type);
  if (given != type) r.fail("model_type", "vision tower '" + given + "' is not " + cls + "'s (" + type + ")");
  VisionSpec v;
  v.hidden_size = r.required_dim("hidden_size");
  v.num_layers = v.run_layers = r.required_dim("num_hidden_layers");
  v.num_heads = r.required_dim("num_attention_heads");
  head_dim_of(r, "num_attention_heads", v.hidden_size, v.num_heads);
  v.ffn_size = r.required_dim("intermediate_size");
  v.gated_mlp = false;
  return v;
}

int64_t feature_layer_blocks(const Reader& r, const std::string& key, int64_t given, int64_t num_layers) {
  const int64_t index = given < 0 ? num_layers + 1 + given : given;
  if (index < 1 || index > num_layers)
    r.fail(key, std::to_string(given) + " is not the output of one of the " + std::to_string(num_layers) + " blocks");
  return index;
}

int64_t merge_of_ratio(const Reader& r, const std::string& key, double fallback) {
  const double ratio = r.optional_positive(key, fallback);
  const double merge = std::round(1.0 / ratio);
  if (!(merge >= 1) || merge * ratio != 1.0 || merge > 64)
    r.fail(key, "only 1 / N for a whole N is modelled (N x N patches become one token)");
  return static_cast<int64_t>(merge);
}

bool is_set(const json& root, const char* key) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_number()) return it->get<double>() != 0;
  return !(it->is_object() && it->empty());
}

void warn_if_set(const Reader& r, const Unmodelled& u, const std::string& source, std::vector<std::string>& out) {
  if (is_set(r.root(), u.key)) out.push_back(source + ": key '" + u.key + "' is set: " + u.why);
}

namespace {

constexpr Unmodelled kUnmodelled[] = {
    {"quantization_config",
     "the checkpoint is quantized; memory is planned for the plan's parameter dtype (for a 4-bit frozen base, "
     "--method qlora)"},
    {"rope_scaling",
     "RoPE scaling changes no parameter, FLOP or saved tensor; its factor x original_max_position_embeddings is the "
     "longest --seq the model is planned for (rope_scaled_positions)"},
    {"final_logit_softcapping",
     "the tanh over the logits keeps one more logits-sized tensor for backward, which is not counted"},
    {"clip_qkv", "the clamp of q, k and v is not modelled"},
};

}  // namespace

int64_t rope_scaled_positions(const Reader& r, int64_t max_positions) {
  auto it = r.root().find("rope_scaling");
  if (it == r.root().end() || !it->is_object()) return 0;
  const json& rs = *it;
  auto f = rs.find("factor");
  if (f == rs.end() || f->is_null()) return 0;
  if (!f->is_number() || !(f->get<double>() > 0))
    r.fail("rope_scaling", "factor must be a positive number, got " + f->dump());
  int64_t original = max_positions;
  for (const json* where : {&rs, &r.root()}) {
    auto o = where->find("original_max_position_embeddings");
    if (o != where->end() && o->is_number_integer() && o->get<int64_t>() > 0) {
      original = o->get<int64_t>();
      break;
    }
  }
  const double scaled = std::floor(f->get<double>() * static_cast<double>(original));
  constexpr double kMaxSize = static_cast<double>(int64_t{1} << 31);
  if (scaled > kMaxSize) r.fail("rope_scaling", "factor x original_max_position_embeddings exceeds 2^31");
  const int64_t n = static_cast<int64_t>(scaled);
  return n > max_positions ? n : 0;
}

void warn_common_unmodelled(const Reader& r, const std::string& source, bool mrope, std::vector<std::string>& out) {
  for (const auto& u : kUnmodelled)
    if (!(mrope && std::string(u.key) == "rope_scaling")) warn_if_set(r, u, source, out);
}

}  // namespace fsdp::hf
