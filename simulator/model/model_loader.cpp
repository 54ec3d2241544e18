#include "model/model_loader.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"

namespace fsdp {

const char* to_string(NormType n) { return n == NormType::RmsNorm ? "rmsnorm" : "layernorm"; }
const char* to_string(ActivationFn a) {
  switch (a) {
    case ActivationFn::Silu:
      return "silu";
    case ActivationFn::Gelu:
      return "gelu";
    case ActivationFn::GeluTanh:
      return "gelu_tanh";
  }
  return "?";
}
const char* to_string(PositionEmbedding p) { return p == PositionEmbedding::Rope ? "rope" : "learned"; }

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
  if (m.moe && (m.moe->num_experts > kMaxSize || m.moe->expert_ffn_size > kMaxSize || m.moe->shared_experts > kMaxSize))
    bad("moe", "sizes must be at most 2^31");
  if (m.num_heads % m.num_kv_heads != 0)
    bad("num_kv_heads", std::to_string(m.num_kv_heads) + " does not divide num_heads " + std::to_string(m.num_heads));
  // With an explicit head_dim, attention works on num_heads * head_dim (which may differ from hidden_size,
  // as in Gemma); readers that derive head_dim (config.json without head_dim) require heads to divide hidden.
  if (m.head_dim <= 0) bad("head_dim", "must be positive");
  if (m.position_embedding == PositionEmbedding::Rope && m.head_dim % 2 != 0)
    bad("head_dim", "rotary embeddings need an even head_dim, got " + std::to_string(m.head_dim));
  if (m.moe) {
    if (m.moe->experts_per_token > m.moe->num_experts)
      bad("moe.experts_per_token",
          std::to_string(m.moe->experts_per_token) + " exceeds num_experts " + std::to_string(m.moe->num_experts));
  }
}

ModelSpec parse_model_map(ConfigMap& map) {
  ModelSpec m;
  m.name = map.get_string("name");
  m.family = map.get_enum("family", {"decoder"});
  m.hidden_size = map.get_positive_int("hidden_size");
  m.num_layers = map.get_positive_int("num_layers");
  m.num_heads = map.get_positive_int("num_heads");
  m.num_kv_heads = map.get_positive_int("num_kv_heads");
  m.head_dim = map.get_positive_int("head_dim");
  m.ffn_size = map.get_positive_int("ffn_size");
  m.gated_mlp = map.get_bool("gated_mlp");
  std::string act = map.get_enum("activation", {"silu", "gelu", "gelu_tanh"});
  m.activation = act == "silu" ? ActivationFn::Silu : act == "gelu" ? ActivationFn::Gelu : ActivationFn::GeluTanh;
  m.vocab_size = map.get_positive_int("vocab_size");
  m.tied_embeddings = map.get_bool("tied_embeddings");
  m.norm = map.get_enum("norm", {"rmsnorm", "layernorm"}) == "rmsnorm" ? NormType::RmsNorm : NormType::LayerNorm;
  m.norm_eps = map.get_positive_double("norm_eps");
  m.position_embedding = map.get_enum("position_embedding", {"rope", "learned"}) == "rope" ? PositionEmbedding::Rope
                                                                                           : PositionEmbedding::Learned;
  if (m.position_embedding == PositionEmbedding::Rope) {
    m.rope_theta = map.get_positive_double("rope_theta");
  } else if (map.has("rope_theta")) {
    map.fail("rope_theta", "only meaningful with position_embedding: rope");
  }
  m.max_positions = map.get_positive_int("max_positions");
  m.qkv_bias = map.get_bool("qkv_bias");
  m.attn_out_bias = map.get_bool("attn_out_bias");
  m.mlp_bias = map.get_bool("mlp_bias");
  m.dropout = map.get_bool("dropout");
  if (map.has("moe")) {
    ConfigMap moe = map.get_map("moe");
    MoeSpec s;
    s.num_experts = moe.get_positive_int("num_experts");
    s.experts_per_token = moe.get_positive_int("experts_per_token");
    s.shared_experts = moe.get_int("shared_experts");
    if (s.shared_experts < 0) moe.fail("shared_experts", "must not be negative");
    s.expert_ffn_size = moe.get_positive_int("expert_ffn_size");
    moe.finish();
    m.moe = s;
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
  out << YAML::Key << "qkv_bias" << YAML::Value << m.qkv_bias;
  out << YAML::Key << "attn_out_bias" << YAML::Value << m.attn_out_bias;
  out << YAML::Key << "mlp_bias" << YAML::Value << m.mlp_bias;
  out << YAML::Key << "dropout" << YAML::Value << m.dropout;
  if (m.moe) {
    out << YAML::Key << "moe" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "num_experts" << YAML::Value << m.moe->num_experts;
    out << YAML::Key << "experts_per_token" << YAML::Value << m.moe->experts_per_token;
    out << YAML::Key << "shared_experts" << YAML::Value << m.moe->shared_experts;
    out << YAML::Key << "expert_ffn_size" << YAML::Value << m.moe->expert_ffn_size;
    out << YAML::EndMap;
  }
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

ModelSpec load_model(const std::string& name_or_path, const std::string& config_root) {
  if (name_or_path.empty()) throw InputError("--model: empty model name");
  if (ends_with(name_or_path, ".json")) return parse_hf_config(read_text(name_or_path), name_or_path);
  if (ends_with(name_or_path, ".yaml") || ends_with(name_or_path, ".yml") ||
      name_or_path.find('/') != std::string::npos) {
    ConfigMap map = ConfigMap::load_file(name_or_path);
    return parse_model_map(map);
  }
  std::vector<ZooEntry> zoo = list_zoo(config_root);
  for (const auto& z : zoo) {
    bool match =
        z.name == name_or_path || std::find(z.aliases.begin(), z.aliases.end(), name_or_path) != z.aliases.end();
    if (match) {
      ConfigMap map = ConfigMap::load_file(z.path);
      return parse_model_map(map);
    }
  }
  std::string names;
  for (const auto& z : zoo) names += (names.empty() ? "" : ", ") + z.name;
  throw InputError("--model: unknown model '" + name_or_path + "' (known: " + names +
                   "; or give a path to a .yaml model file or a Hugging Face config.json)");
}

}  // namespace fsdp
