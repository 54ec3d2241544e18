// The vision-language families of issue M13 from their real config.json files: the published parameter count,
// the vision tower's blocks as units of the layer stack (a heterogeneous stack ahead of the decoder layers), their
// work priced on the vision tokens, the image tokens joining the language model's sequence, --image-tokens, the
// warnings, and the YAML schema's vision map.
//
// Fixtures (tests/data/hf/), with where each file's contents and each published count come from:
//   llava-1.5-7b.json  llava-hf/llava-1.5-7b-hf config.json, verbatim as inlined in lite_llama's LLaVA config test
//                      (tests/test_llava_config.py) and printed by transformers when loading the hub snapshot
//                      05ae2434cbb430be33edcba0c5203e7023f785b7 (a fine-tuning log: the same keys and values, with
//                      transformers_version 4.41.1 and no top-level vocab_size). Count 7,063,427,072: the sum of
//                      LlavaForConditionalGeneration.from_pretrained("llava-hf/llava-1.5-7b-hf").parameters()
//                      (Hugging Face's "Fine-tuning LLaVA" notes, and a test of the dxz serving engine asserting
//                      count_parameters(model) == 7063427072).
#include <doctest/doctest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/errors.hpp"
#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/step_program.hpp"
#include "program/wrap_units.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"

namespace {

using fsdp::test::read_fixture;

using fsdp::InputError;
using fsdp::ModelSpec;
using fsdp::ModuleGraph;
using fsdp::ModuleKind;
using json = nlohmann::json;

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

// The root's child of this name.
fsdp::ModuleId child(const ModuleGraph& g, const std::string& name) {
  for (auto c : g.children(g.root()))
    if (g.node(c).name == name) return c;
  FAIL("no " << name);
  return g.root();
}

const fsdp::ModuleNode& core_of(const ModuleGraph& g, size_t l) {
  for (auto leaf : g.leaves_under(g.layers()[l]))
    if (g.node(leaf).kind == ModuleKind::AttentionCore) return g.node(leaf);
  FAIL("no attention core");
  return g.node(g.root());
}

// CLIP ViT-L/14's encoder layer (modeling_clip.py CLIPEncoderLayer): q/k/v/out_proj 1024 x 1024 + bias, fc1
// 1024 -> 4096 + bias, fc2 4096 -> 1024 + bias, layer_norm1/2 (weight and bias).
constexpr int64_t kClipLayer = 4 * (1024 * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 2 * 2048;
// Llama-2-7B's 32 decoder layers: q/k/v/o 4096 x 4096, gate/up/down 4096 x 11008, two RMSNorm weights.
constexpr int64_t kLlamaLayers = int64_t{32} * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096);

}  // namespace

TEST_CASE("vlm families: LLaVA-1.5-7B from its config.json gives its published count exactly") {
  const fsdp::LoadedModel loaded = read("llava-1.5-7b");
  const ModelSpec& m = loaded.spec;
  REQUIRE(m.vision);
  const fsdp::VisionSpec& v = *m.vision;
  const ModuleGraph g(m);
  CHECK(g.total_params() == 7'063'427'072);
  // The language model is Llama-2-7B's shape (LlamaConfig defaults) with vicuna's 32064-token vocabulary.
  CHECK(m.hidden_size == 4096);
  CHECK(m.num_layers == 32);
  CHECK(m.vocab_size == 32064);
  CHECK(m.max_positions == 4096);
  // CLIP ViT-L/14-336: 24 x 24 patches and a CLS token; "default" feeds the 576 patches to the projector.
  CHECK(v.seq_per_image() == 577);
  CHECK(v.image_tokens == 576);
  CHECK(v.activation == fsdp::ActivationFn::QuickGelu);
  // vision_feature_layer -2: 23 blocks run, the 24th and post_layernorm are held.
  CHECK(v.run_layers == 23);
  CHECK(g.params_under(child(g, "vision_tower.held")) == kClipLayer + 2048);
  CHECK_FALSE(g.node(child(g, "vision_tower.held")).runs);
  // The parts, each from its modeling file: embeddings (patch conv 3 x 14 x 14 -> 1024 without bias, CLS,
  // 577 positions, pre_layrnorm), the blocks, the projector (1024 -> 4096 -> 4096, biased).
  CHECK(g.params_under(child(g, "vision_tower.embeddings")) == 3 * 14 * 14 * 1024 + 1024 + 577 * 1024 + 2048);
  CHECK(g.params_under(child(g, "vision_tower.layers")) == 23 * kClipLayer);
  CHECK(g.params_under(child(g, "multi_modal_projector")) == (1024 * 4096 + 4096) + (4096 * 4096 + 4096));
  // The language model alone: Llama-2-7B with the 32064-row embedding and head.
  CHECK(g.params_under(child(g, "layers")) == kLlamaLayers);
}

TEST_CASE("vlm families: the vision blocks open the layer stack as units of their own") {
  const ModelSpec m = read("llava-1.5-7b").spec;
  const ModuleGraph g(m);
  REQUIRE(g.layers().size() == 23 + 32);
  CHECK(g.node(g.layers()[0]).name == "vision_tower.layers.0");
  CHECK(g.node(g.layers()[23]).name == "layers.0");
  // A layer node's index is its place in the stack; the vision blocks are one class, the decoder layers another.
  CHECK(g.node(g.layers()[23]).layer == 23);
  CHECK(g.layer_classes()[22] == 0);
  CHECK(g.layer_classes()[23] == 23);
  CHECK(g.layer_classes()[54] == 23);
  CHECK(g.params_under(g.layers()[0]) == kClipLayer);
  // A vision block attends all 577 keys of its image, both ways, whatever the sequence; no rotary (CLIP's
  // positions are a learned table added once).
  const fsdp::ModuleNode& core = core_of(g, 0);
  CHECK(core.attention_keys == 577);
  CHECK(fsdp::seq_flops_per_token(core, 1) == 4.0 * 1024 * 577);
  CHECK(fsdp::seq_flops_per_token(core, 8192) == 4.0 * 1024 * 577);
  for (auto leaf : g.leaves_under(g.layers()[0])) CHECK(g.node(leaf).kind != ModuleKind::Rotary);
  // FSDP wraps each block as a unit, named after it.
  fsdp::WrapPolicy by_layer;
  by_layer.kind = fsdp::WrapKind::Layer;
  const auto units = fsdp::build_wrap_units(g, by_layer);
  REQUIRE(units.size() == 1 + 55);
  CHECK(units[1].name == "vision_tower.layers.0");
  CHECK(units[1].params == kClipLayer);
  CHECK(units[24].name == "layers.0");
  // The root holds the embeddings, the projector, the held block and the language model's embedding, norm, head.
  CHECK(units[0].params == 7'063'427'072 - 23 * kClipLayer - kLlamaLayers);
  // A size threshold between a vision block and a decoder layer is refused, not planned wrongly.
  fsdp::WrapPolicy by_size;
  by_size.kind = fsdp::WrapKind::Size;
  by_size.min_params = 100'000'000;
  CHECK(contains(input_error([&] { fsdp::build_wrap_units(g, by_size); }), "--wrap size"));
}

TEST_CASE("vlm families: a vision block is priced on the vision tokens, not the language model's sequence") {
  const ModelSpec m = read("llava-1.5-7b").spec;
  const ModuleGraph g(m);
  const fsdp::RuntimeProfile rt = fsdp::load_runtime("pytorch", FSDP_SOURCE_ROOT);
  auto cost = [&](int64_t seq, size_t layer) {
    fsdp::Strategy s;
    s.micro_batch = 2;
    s.seq_len = seq;
    fsdp::LayerCostInput in{&g, &s, &rt, fsdp::activation_query(s, rt), 2.0 * static_cast<double>(seq)};
    return fsdp::layer_cost(in, g.layers()[layer]);
  };
  const fsdp::LayerCost short_seq = cost(1024, 0), long_seq = cost(4096, 0);
  // Its GEMMs run on 2 x 577 tokens; its attention on 2 images of 577 keys, bidirectional.
  REQUIRE(short_seq.shape.gemms.size() == 6);  // q, k, v, o, fc1, fc2
  for (const auto& gemm : short_seq.shape.gemms) CHECK(gemm.m == 2 * 577);
  CHECK(short_seq.shape.attn_seq == 577);
  CHECK(short_seq.shape.attn_batch == 2);
  // The same bytes whatever the sequence; per sequence token, its FLOPs scale as 577 / seq.
  CHECK(long_seq.saved_bytes == doctest::Approx(short_seq.saved_bytes));
  CHECK(long_seq.saved_bytes > 0);
  CHECK(short_seq.matmul_flops_per_token * 1024 == doctest::Approx(long_seq.matmul_flops_per_token * 4096));
  // Per vision token: 2 FLOPs per linear weight, the two LayerNorms' 5 per element and the activation's 4
  // (module_parts.hpp kNormFlopsPerElem, kActFlopsPerElem).
  const double linears = 2.0 * (4 * 1024 * 1024 + 2 * 1024 * 4096), pointwise = 2 * 5.0 * 1024 + 4.0 * 4096;
  CHECK(short_seq.matmul_flops_per_token * 1024 / 577 == doctest::Approx(linears + pointwise).epsilon(1e-12));
  CHECK(short_seq.attention_flops_per_token * 1024 == doctest::Approx(577.0 * 4.0 * 1024 * 577));
  // A decoder layer's bytes grow with the sequence.
  CHECK(cost(4096, 23).saved_bytes == doctest::Approx(4.0 * cost(1024, 23).saved_bytes));
}

TEST_CASE("vlm families: the image tokens join the language model's sequence, and --image-tokens sets them") {
  ModelSpec m = read("llava-1.5-7b").spec;
  fsdp::Strategy s;
  s.seq_len = 2048;
  CHECK(fsdp::language_model_strategy(s, m).seq_len == 2048 + 576);
  CHECK(fsdp::language_model_strategy(s, read("llama2-7b").spec).seq_len == 2048);
  // Two images: two towers' sequences of 577, 1152 image tokens.
  m.vision->image_tokens = 1152;
  fsdp::validate_model(m, "two.json");
  CHECK(m.vision->images() == 2);
  CHECK(m.vision->vision_tokens() == 2 * 577);
  const ModuleGraph two(m);
  CHECK(two.node(two.layers()[0]).tokens_per_sample == 1154);
  CHECK(core_of(two, 0).attention_keys == 577);
  // A dynamic-resolution tower (no image_size) has no count of its own: simulate asks for --image-tokens.
  ModelSpec dynamic = m;
  dynamic.vision->image_tokens = 0;
  CHECK(contains(input_error([&] { fsdp::language_model_strategy(s, dynamic); }), "--image-tokens"));
  m.vision->image_tokens = 1000;  // not whole images
  CHECK(contains(input_error([&] { fsdp::validate_model(m, "x.json"); }), "vision.image_tokens"));
  // 6N counts the tower's parameters on its own tokens: at seq 2048 + 576 the 23 blocks and embeddings see 577
  // tokens, the projector 576, the held block none.
  const ModelSpec one = read("llava-1.5-7b").spec;
  const ModuleGraph g(one);
  const int64_t seq = 2048 + 576;
  const double vision_run = static_cast<double>(g.params_under(child(g, "vision_tower.layers")) +
                                                g.params_under(child(g, "vision_tower.embeddings")));
  const double projector = static_cast<double>(g.params_under(child(g, "multi_modal_projector")));
  const double lm = static_cast<double>(g.params_under(child(g, "layers")) + 4096 + 32064 * 4096);
  const double attention = 3.0 * 32 * 4.0 * 4096 * (seq / 2.0) + 3.0 * 23 * 4.0 * 1024 * 577 * 577.0 / seq;
  const double expected = 6.0 * (lm + vision_run * 577.0 / seq + projector * 576.0 / seq) + attention;
  CHECK(fsdp::model_flops_per_token(g, seq, false) == doctest::Approx(expected).epsilon(1e-9));
}

TEST_CASE("vlm families: LLaVA's warnings, and what the reader refuses") {
  const std::string w = all_warnings(read("llava-1.5-7b"));
  // text_config is written as a diff to LlamaConfig: its shape keys take the class's defaults, each named.
  CHECK(contains(w, "text_config: not given, so the LlamaForCausalLM defaults of transformers are taken"));
  CHECK(contains(w, "hidden_size = 4096"));
  CHECK(contains(w, "intermediate_size = 11008"));
  CHECK(contains(w, "vision_config: not given, so the CLIPVisionConfig defaults"));
  CHECK(contains(w, "hidden_act = \"quick_gelu\""));
  CHECK(contains(w, "last 1 block(s) and post_layernorm are counted but not run"));
  CHECK(contains(w, "576 image tokens per sample"));
  json j = json::parse(read_fixture("llava-1.5-7b"));
  j["vision_feature_layer"] = json::array({-2, -5});
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "l.json"); }), "'vision_feature_layer'"));
  j["vision_feature_layer"] = 25;
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "l.json"); }), "'vision_feature_layer'"));
  // vision_feature_layer -1 runs every block; "full" keeps the CLS token's feature as an image token.
  j["vision_feature_layer"] = -1;
  j["vision_feature_select_strategy"] = "full";
  const ModelSpec full = fsdp::parse_hf_config(j.dump(), "l.json");
  CHECK(full.vision->run_layers == 24);
  CHECK(full.vision->image_tokens == 577);
  j["vision_config"]["model_type"] = "siglip_vision_model";
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "l.json"); }), "siglip_vision_model"));
  // Without any vision_config LlavaConfig builds CLIP ViT-L/14-336: the same count.
  j = json::parse(read_fixture("llava-1.5-7b"));
  j.erase("vision_config");
  CHECK(ModuleGraph(fsdp::parse_hf_config(j.dump(), "l.json")).total_params() == 7'063'427'072);
}

TEST_CASE("vlm families: the zoo's vision models read the same as their config.json and write back") {
  const ModelSpec zoo = fsdp::load_model("llava-1.5-7b", FSDP_SOURCE_ROOT);
  CHECK(ModuleGraph(zoo).total_params() == 7'063'427'072);
  CHECK(zoo.vision->run_layers == 23);
  YAML::Emitter out;
  fsdp::emit_model_map(zoo, out);
  fsdp::ConfigMap map = fsdp::ConfigMap::load_string(out.c_str(), "emitted.yaml");
  const ModelSpec back = fsdp::parse_model_map(map);
  CHECK(ModuleGraph(back).total_params() == 7'063'427'072);
  CHECK(back.vision->image_tokens == 576);
  CHECK(back.vision->activation == fsdp::ActivationFn::QuickGelu);
  // An unknown key of the vision map is refused, as at the top level.
  std::string text = out.c_str();
  const std::string from = "  patch_size: 14";
  REQUIRE(text.find(from) != std::string::npos);
  text.replace(text.find(from), from.size(), from + "\n  patch_sise: 14");
  CHECK(contains(input_error([&] {
                   fsdp::ConfigMap bad = fsdp::ConfigMap::load_string(text, "m.yaml");
                   fsdp::parse_model_map(bad);
                 }),
                 "patch_sise"));
}
