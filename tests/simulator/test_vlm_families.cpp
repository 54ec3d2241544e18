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
//   qwen2-vl-7b.json   Qwen/Qwen2-VL-7B-Instruct config.json. No verbatim copy was found; the keys and values are those
//                      inlined, key for key and in the hub file's order, as `cfg` in VARGPT-family's Qwen2-VL
//                      preparation script (prepare_vargpt_qwen2vl_v1_1, which builds VARGPT-v1.1 from
//                      Qwen/Qwen2-VL-7B-Instruct) with two edits back to the hub file: that copy renames model_type
//                      to "vargpt_qwen2_vl" (here "qwen2_vl") and leaves out the architectures list (here
//                      ["Qwen2VLForConditionalGeneration"]); Python's True/False are written as JSON. Every shape
//                      value is untouched. Count 8,291,375,616: the safetensors metadata parameter count of
//                      Qwen/Qwen2-VL-7B-Instruct (HfApi.get_safetensors_metadata, "BF16"), as tabulated in the GIMMICK
//                      benchmark's model registry (get_model_sizes).
//   qwen2.5-vl-7b.json Qwen/Qwen2.5-VL-7B-Instruct config.json as printed in a layer-skipping study's README (the
//                      "/data/share/Qwen2.5-VL-7B-Instruct/config.json" it edits), without the three keys that study
//                      appends (skip_layer_mlp, skip_layer_attn, mlp_scalars); the same keys and values as
//                      NVIDIA/TensorRT-LLM's Qwen2.5-VL-7B-Instruct test config (tests/unittest/_torch/modeling/
//                      test_modeling_qwen2_5_vl.py, which shrinks num_hidden_layers and depth and says so). Count
//                      8,292,166,656: Hugging Face's numParameters of Qwen/Qwen2.5-VL-7B-Instruct, and the
//                      model.parameters() sum printed by a Qwen2.5-VL fine-tuning script (8292166656 in all,
//                      676550144 in the visual module, 7615616512 left when it is frozen).
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
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using fsdp::test::read_fixture;

using fsdp::InputError;
using fsdp::ModelSpec;
using fsdp::ModuleGraph;
using fsdp::ModuleKind;
using json = nlohmann::json;

using fsdp::test::all_warnings;
using fsdp::test::contains;
using fsdp::test::input_error;

fsdp::LoadedModel read(const std::string& stem) { return fsdp::test::read_hf_fixture(stem); }

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
  CHECK(g.params_under(fsdp::test::root_child(g, "vision_tower.held")) == kClipLayer + 2048);
  CHECK_FALSE(g.node(fsdp::test::root_child(g, "vision_tower.held")).runs);
  // The parts, each from its modeling file: embeddings (patch conv 3 x 14 x 14 -> 1024 without bias, CLS,
  // 577 positions, pre_layrnorm), the blocks, the projector (1024 -> 4096 -> 4096, biased).
  CHECK(g.params_under(fsdp::test::root_child(g, "vision_tower.embeddings")) ==
        3 * 14 * 14 * 1024 + 1024 + 577 * 1024 + 2048);
  CHECK(g.params_under(fsdp::test::root_child(g, "vision_tower.layers")) == 23 * kClipLayer);
  CHECK(g.params_under(fsdp::test::root_child(g, "multi_modal_projector")) ==
        (1024 * 4096 + 4096) + (4096 * 4096 + 4096));
  // The language model alone: Llama-2-7B with the 32064-row embedding and head.
  CHECK(g.params_under(fsdp::test::root_child(g, "layers")) == kLlamaLayers);
}

TEST_CASE("vlm families: the vision blocks open the layer stack as units of their own") {
  const ModelSpec m = read("llava-1.5-7b").spec;
  const ModuleGraph g(m);
  REQUIRE(g.layers().size() == 23 + 32);
  CHECK(g.node(g.layers()[0]).name == "vision_tower.layers.0");
  CHECK(g.node(g.layers()[23]).name == "layers.0");
  // A layer node's index is its place in the stack; the vision blocks are one class, the decoder layers another (the
  // first of each stack, whose input norm reads the embeddings, one of its own).
  CHECK(g.node(g.layers()[23]).layer == 23);
  CHECK(g.layer_classes()[22] == 1);
  CHECK(g.layer_classes()[23] == 23);
  CHECK(g.layer_classes()[54] == 24);
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

TEST_CASE("vlm families: pipeline stages split the decoder layers, the vision blocks with the first stage") {
  // The layer stack indexes the vision blocks first (ModuleGraph::first_decoder_layer): a stage's decoder layers are
  // shifted past them, and the first stage holds them too. Before (2026-12-04) the split indexed the stack from 0, so
  // stage 0 ran vision blocks only and the decoder layers past the stack's end were in no stage: LLaVA-1.5-7B at pp 2
  // priced at MFU 66.6% against 37.5% at pp 1, Qwen2-VL-7B at 158.7%.
  const ModelSpec m = read("llava-1.5-7b").spec;
  const ModuleGraph g(m);
  const int64_t vision = g.first_decoder_layer();
  REQUIRE(vision ==
          23);  // CLIP ViT-L/14's 24 blocks, the features read at the second-to-last (vision_feature_layer -2)
  REQUIRE(static_cast<int64_t>(g.layers().size()) == vision + 32);
  const fsdp::RuntimeProfile rt = fsdp::load_runtime("pytorch", FSDP_SOURCE_ROOT);
  const fsdp::HardwareProfile hw = fsdp::test::hardware("h100-80gb");
  fsdp::Strategy s;
  s.kind = fsdp::StrategyKind::Fsdp;
  s.micro_batch = 1;
  s.grad_accum = 8;
  s.seq_len = 4096;
  fsdp::Strategy one = s;
  const fsdp::Prediction whole = fsdp::simulate(fsdp::SimulationInput{&g, &hw, &rt, fsdp::Cluster{2, 8}, one});
  for (int64_t pp : {2, 4}) {
    CAPTURE(pp);
    s.mesh.pp = pp;
    std::vector<int> held(g.layers().size(), 0);
    double params = 0;
    for (int64_t stage = 0; stage < pp; ++stage) {
      const fsdp::StepProgram p =
          fsdp::emit_stage_program(fsdp::SimulationInput{&g, &hw, &rt, fsdp::Cluster{2, 8}, s}, stage);
      CHECK(p.layout.stage_first_layer == (stage == 0 ? 0 : vision + stage * 32 / pp));
      CHECK(p.layout.stage_last_layer == vision + (stage + 1) * 32 / pp - 1);
      for (const fsdp::WrapUnit& u : p.units) {
        for (int64_t l = u.first_layer; l >= 0 && l <= u.last_layer; ++l) ++held[static_cast<size_t>(l)];
        params += static_cast<double>(u.params);
      }
    }
    // Every layer of the stack in one stage exactly, and every parameter of the model in one.
    for (size_t l = 0; l < held.size(); ++l) CHECK(held[l] == 1);
    CHECK(params == doctest::Approx(static_cast<double>(g.total_params())));
    // A pipeline does not beat the work: at most the MFU of the plan without one.
    const fsdp::Prediction piped = fsdp::simulate(fsdp::SimulationInput{&g, &hw, &rt, fsdp::Cluster{2, 8}, s});
    CHECK(piped.mfu <= whole.mfu);
    CHECK(piped.mfu > 0.5 * whole.mfu);
  }
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
  const double vision_run = static_cast<double>(g.params_under(fsdp::test::root_child(g, "vision_tower.layers")) +
                                                g.params_under(fsdp::test::root_child(g, "vision_tower.embeddings")));
  const double projector = static_cast<double>(g.params_under(fsdp::test::root_child(g, "multi_modal_projector")));
  const double lm = static_cast<double>(g.params_under(fsdp::test::root_child(g, "layers")) + 4096 + 32064 * 4096);
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

namespace {

// Qwen2-VL-7B's vision block (modeling_qwen2_vl.py Qwen2VLVisionBlock): qkv 1280 -> 3840 + bias, proj 1280 x 1280 +
// bias, fc1 1280 -> 5120 + bias, fc2 5120 -> 1280 + bias, norm1/norm2 LayerNorm (weight and bias).
constexpr int64_t kQwen2VlBlock =
    (1280 * 3840 + 3840) + (1280 * 1280 + 1280) + (1280 * 5120 + 5120) + (5120 * 1280 + 1280) + 2 * 2 * 1280;
// Qwen2.5-VL-7B's (Qwen2_5_VLVisionBlock): the same attention, gate/up 1280 -> 3420 and down 3420 -> 1280 all biased,
// two RMSNorm weights.
constexpr int64_t kQwen25VlBlock =
    (1280 * 3840 + 3840) + (1280 * 1280 + 1280) + 2 * (1280 * 3420 + 3420) + (3420 * 1280 + 1280) + 2 * 1280;
// The Conv3d patch embedding: 3 channels x 2 frames x 14 x 14 -> 1280, no bias.
constexpr int64_t kQwenPatchEmbed = 3 * 2 * 14 * 14 * 1280;
// The merger's two linears: 5120 -> 5120 and 5120 -> 3584, biased.
constexpr int64_t kQwenMergerLinears = (5120 * 5120 + 5120) + (5120 * 3584 + 3584);
// The language model: Qwen2-7B's (its zoo count, Qwen/Qwen2-7B safetensors total_size / 2), the same shapes.
constexpr int64_t kQwen2_7b = 7'615'616'512;

}  // namespace

TEST_CASE("vlm families: Qwen2-VL-7B and Qwen2.5-VL-7B from their config.json give their published counts exactly") {
  const ModelSpec q2 = read("qwen2-vl-7b").spec;
  const ModuleGraph g2(q2);
  CHECK(g2.total_params() == 8'291'375'616);
  CHECK(g2.params_under(fsdp::test::root_child(g2, "vision_tower.embeddings")) ==
        kQwenPatchEmbed);  // rotary: no position table
  CHECK(g2.params_under(fsdp::test::root_child(g2, "vision_tower.layers")) == 32 * kQwen2VlBlock);
  CHECK(g2.params_under(fsdp::test::root_child(g2, "multi_modal_projector")) ==
        2 * 1280 + kQwenMergerLinears);  // ln_q LayerNorm
  CHECK(g2.total_params() - g2.params_under(fsdp::test::root_child(g2, "vision_tower.embeddings")) -
            g2.params_under(fsdp::test::root_child(g2, "vision_tower.layers")) -
            g2.params_under(fsdp::test::root_child(g2, "multi_modal_projector")) ==
        kQwen2_7b);
  for (auto c : g2.children(g2.root())) CHECK(g2.node(c).name != "vision_tower.held");  // every block runs
  const fsdp::VisionSpec& v2 = *q2.vision;
  CHECK(v2.activation == fsdp::ActivationFn::QuickGelu);
  CHECK(v2.norm == fsdp::NormType::LayerNorm);
  CHECK_FALSE(v2.gated_mlp);
  CHECK(v2.ffn_size == 5120);
  CHECK(v2.window == 0);
  CHECK(v2.image_size == 0);  // dynamic resolution
  CHECK(q2.max_positions == 32768);
  CHECK(q2.qkv_bias);
  CHECK_FALSE(q2.attn_out_bias);

  const ModelSpec q25 = read("qwen2.5-vl-7b").spec;
  const ModuleGraph g25(q25);
  CHECK(g25.total_params() == 8'292'166'656);
  // The published split: 676,550,144 in the visual module (patch embedding, blocks, merger), 7,615,616,512 in the rest.
  const int64_t visual = g25.params_under(fsdp::test::root_child(g25, "vision_tower.embeddings")) +
                         g25.params_under(fsdp::test::root_child(g25, "vision_tower.layers")) +
                         g25.params_under(fsdp::test::root_child(g25, "multi_modal_projector"));
  CHECK(visual == 676'550'144);
  CHECK(visual == kQwenPatchEmbed + 32 * kQwen25VlBlock + 1280 + kQwenMergerLinears);  // ln_q RMSNorm
  CHECK(g25.total_params() - visual == kQwen2_7b);
  const fsdp::VisionSpec& v25 = *q25.vision;
  CHECK(v25.gated_mlp);
  CHECK(v25.norm == fsdp::NormType::RmsNorm);
  CHECK(v25.projector_norm_type == fsdp::NormType::RmsNorm);
  // window_size 112 // spatial_merge_size 2 // patch 14 = 4 merged tokens a side: 8 x 8 patches; blocks 7, 15, 23, 31
  // attend the whole image.
  CHECK(v25.window == 64);
  CHECK(v25.global_layer_every == 8);
  CHECK(q25.max_positions == 128000);
}

TEST_CASE("vlm families: Qwen2-VL's dynamic resolution takes its image tokens from --image-tokens") {
  ModelSpec m = read("qwen2.5-vl-7b").spec;
  fsdp::Strategy s;
  s.seq_len = 2048;
  CHECK(contains(input_error([&] { fsdp::language_model_strategy(s, m); }), "--image-tokens"));
  // 1024 image tokens: one image of 1024 x 2 x 2 = 4096 patches in the tower, 1024 tokens in the language model.
  m.vision->image_tokens = 1024;
  fsdp::validate_model(m, "q.json");
  CHECK(fsdp::language_model_strategy(s, m).seq_len == 2048 + 1024);
  CHECK(m.vision->vision_tokens() == 4096);
  const ModuleGraph g(m);
  REQUIRE(g.layers().size() == 32 + 28);
  CHECK(g.node(g.layers()[0]).tokens_per_sample == 4096);
  CHECK(g.node(fsdp::test::root_child(g, "multi_modal_projector")).tokens_per_sample == 1024);
  // A windowed block attends its 64 patches, a full-attention block (7, 15, ...) all 4096; they are different layer
  // classes, and the windowed blocks share one.
  CHECK(core_of(g, 0).attention_keys == 64);
  CHECK(core_of(g, 6).attention_keys == 64);
  CHECK(core_of(g, 7).attention_keys == 4096);
  CHECK(core_of(g, 31).attention_keys == 4096);
  CHECK(g.layer_classes()[6] == 1);  // block 0, reading the patch embeddings, is a class of its own
  CHECK(g.layer_classes()[7] == 7);
  CHECK(g.layer_classes()[15] == 7);
  CHECK(g.layer_classes()[32] == 32);
  // Its rotary is 2-D rotary on q and k: FLOPs, no parameters.
  bool rotary = false;
  for (auto leaf : g.leaves_under(g.layers()[0])) rotary = rotary || g.node(leaf).kind == ModuleKind::Rotary;
  CHECK(rotary);
  // A windowed block's attention FLOPs per vision token are its 64 keys', whatever the sequence.
  CHECK(fsdp::seq_flops_per_token(core_of(g, 0), 8192) == 4.0 * 1280 * 64);
  // The merger's norm runs per patch: a weight of the tower's width, over the 4 patches of each image token.
  bool merger_norm = false;
  for (auto leaf : g.leaves_under(fsdp::test::root_child(g, "multi_modal_projector")))
    if (g.node(leaf).kind == ModuleKind::Norm) {
      merger_norm = true;
      CHECK(g.node(leaf).params == 1280);
      CHECK(g.node(leaf).output_elems_per_token == 4 * 1280);
    }
  CHECK(merger_norm);
}

TEST_CASE("vlm families: Qwen2-VL's warnings, and what its reader refuses") {
  const std::string w2 = all_warnings(read("qwen2-vl-7b"));
  CHECK(contains(w2, "vision_config: not given, so the Qwen2VLVisionConfig defaults of transformers are taken"));
  CHECK(contains(w2, "hidden_act = \"quick_gelu\""));
  CHECK(contains(w2, "in_channels = 3"));
  CHECK(contains(w2, "dynamic resolution"));
  CHECK(contains(w2, "--image-tokens"));
  // M-RoPE is rotary: its rope_scaling is not an unmodelled scaling.
  CHECK_FALSE(contains(w2, "'rope_scaling'"));
  const std::string w25 = all_warnings(read("qwen2.5-vl-7b"));
  CHECK(contains(w25, "Qwen2_5_VLVisionConfig defaults"));
  CHECK_FALSE(contains(w25, "fullatt_block_indexes"));
  CHECK_FALSE(contains(w25, "'rope_scaling'"));

  json j = json::parse(read_fixture("qwen2.5-vl-7b"));
  j["rope_scaling"] = json{{"type", "yarn"}, {"factor", 4.0}};  // not M-RoPE: warned as for the other families
  CHECK(contains(all_warnings(fsdp::read_hf_config(j.dump(), "q.json")), "'rope_scaling'"));
  j = json::parse(read_fixture("qwen2.5-vl-7b"));
  j["vision_config"]["fullatt_block_indexes"] = json::array({7, 15, 31});
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "q.json"); }), "'fullatt_block_indexes'"));
  j["vision_config"]["fullatt_block_indexes"] = json::array();  // every block windowed
  CHECK(fsdp::parse_hf_config(j.dump(), "q.json").vision->global_layer_every == 0);
  j["vision_config"]["out_hidden_size"] = 4096;
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "q.json"); }), "'out_hidden_size'"));
  j = json::parse(read_fixture("qwen2-vl-7b"));
  j["vision_config"]["hidden_size"] = 1536;
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "q.json"); }), "'hidden_size'"));
  j = json::parse(read_fixture("qwen2-vl-7b"));
  j["vision_config"]["model_type"] = "siglip_vision_model";
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "q.json"); }), "siglip_vision_model"));
  // Newer transformers write the language model into text_config: the same model.
  j = json::parse(read_fixture("qwen2-vl-7b"));
  json text = json::object();
  for (const char* k :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings", "tie_word_embeddings"}) {
    text[k] = j[k];
    j.erase(k);
  }
  j["text_config"] = text;
  CHECK(ModuleGraph(fsdp::parse_hf_config(j.dump(), "q.json")).total_params() == 8'291'375'616);
}

TEST_CASE("vlm families: the Qwen2-VL zoo files read the same as their config.json and write back") {
  for (const auto& [name, count] : {std::pair<std::string, int64_t>{"qwen2-vl-7b", 8'291'375'616},
                                    std::pair<std::string, int64_t>{"qwen2.5-vl-7b", 8'292'166'656}}) {
    INFO(name);
    const ModelSpec zoo = fsdp::load_model(name, FSDP_SOURCE_ROOT);
    CHECK(ModuleGraph(zoo).total_params() == count);
    const ModelSpec hf = read(name).spec;
    CHECK(zoo.vision->window == hf.vision->window);
    CHECK(zoo.vision->global_layer_every == hf.vision->global_layer_every);
    CHECK(zoo.vision->projector_norm == hf.vision->projector_norm);
    CHECK(zoo.vision->projector_norm_type == hf.vision->projector_norm_type);
    CHECK(zoo.vision->image_tokens == 0);
    YAML::Emitter out;
    fsdp::emit_model_map(zoo, out);
    fsdp::ConfigMap map = fsdp::ConfigMap::load_string(out.c_str(), "emitted.yaml");
    const ModelSpec back = fsdp::parse_model_map(map);
    CHECK(ModuleGraph(back).total_params() == count);
    CHECK(back.vision->window == zoo.vision->window);
    CHECK(back.vision->temporal_patch_size == 2);
  }
}
