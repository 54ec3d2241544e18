// Llama 4 and InternVL (issue M13) from their real config.json files: the published parameter count, exactly; the
// parts each maps onto (chunked attention on the rotary layers, NoPE layers, the weightless L2 q/k norm, interleaved
// MoE and dense layers with a shared expert, a vision encoder with 2-D rotary beside its table, pixel shuffle and a
// three-linear projector; InternViT's layer scales and q/k norms, mlp1); the MoE layers as FSDP units; the image
// tokens; the warnings and refusals; the zoo files.
//
// Fixtures (tests/data/hf/), with where each file's contents and each published count come from:
//   llama4-scout-17b-16e.json  meta-llama/Llama-4-Scout-17B-16E's config as transformers 4.51.0 printed it after
//                      loading the hub checkpoint ("Llama4Config {...}", a public Llama 4 notes page that also links
//                      huggingface.co/meta-llama/Llama-4-Scout-17B-16E): the same keys and values, except that the
//                      print abbreviates "moe_layers" as [0..47], written out here as the 48 indices. Count
//                      108,641,793,536: the Hugging Face Hub's safetensors total of
//                      meta-llama/Llama-4-Scout-17B-16E-Instruct (a license-audit script's KNOWN_MODELS table, "HF Hub
//                      API ... safetensors.total", and a model-size table of unsloth's Llama-4-Scout-17B-16E-Instruct
//                      copy list the same 108641793536); the model card says "109B" total.
//   llama4-maverick-17b-128e.json  meta-llama/Llama-4-Maverick-17B-128E-Instruct config.json as kept in
//                      NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/test_modeling_llama_min_latency.py
//                      (LLAMA_4_MAVERICK_TWO_LAYER_CONFIG: "This is Llama4 Maverick config but with only 2 layers"),
//                      with its three marked edits undone: text_config num_hidden_layers back to 48 ("Reduced to 2
//                      layers from 48 layers"), its added no_rope_layer_interval 2 removed ("Added so that both RoPE
//                      and no-RoPE layers are present"), vision_config num_hidden_layers back to 34 ("Override to 0",
//                      34 being every Llama 4 vision config's); Python literals written as JSON. Count 401,583,781,376:
//                      the parameter_count Fireworks AI's billing export lists for Llama 4 Maverick (its docs' sample
//                      CSV), and a public model-graph test asserting parameterCount 401583781376n for llama4-maverick;
//                      the model card says "400B" total.
//   internvl2-8b.json  OpenGVLab/InternVL2-8B's config.json as kept in a PaddleMIX config table (its "InternVL2-8B"
//                      branch), without the top-level "num_hidden_layers": 32 that table adds for its own use; Python
//                      literals written as JSON. No verbatim OpenGVLab/InternVL2_5-8B config.json was found;
//                      InternVL2.5-8B pairs InternViT-300M-448px-V2_5 with internlm2_5-7b-chat (the InternVL2.5 model
//                      card's table), the same shapes as InternVL2-8B's InternViT-300M-448px and internlm2_5-7b-chat
//                      (and the same mlp1), so the file stands for it. Count 8,075,365,376: the safetensors parameter
//                      count of OpenGVLab/InternVL2_5-8B (HfApi.get_safetensors_metadata, "BF16") in the GIMMICK
//                      benchmark's model registry (get_model_sizes), the registry the Qwen2-VL test cites.
//   internvl2-26b.json the same table's "InternVL2-26B" branch (InternViT-6B-448px: 45 RMSNorm blocks of 3200 with q/k
//                      norms and no qkv bias; internlm2-chat-20b), the added "num_hidden_layers": 48 removed. Count
//                      25,514,186,112: GIMMICK's figure for OpenGVLab/InternVL2_5-26B, whose InternViT-6B-448px-V2_5
//                      and internlm2_5-20b-chat have these shapes (the registry's internlm2_5-20b-chat, 19,861,149,696
//                      with 92544 rows, is this language model with 9 fewer vocabulary rows in its embedding and head).
//   internvl2.5-2b.json OpenGVLab/InternVL2_5-2B's config as PaddleMIX's InternVL2.5 model test inlines it
//                      (InternVLChatModelTester.get_config, model_name_or_path "OpenGVLab/InternVL2_5-2B"; PaddlePaddle
//                      writes "dtype" where transformers writes "torch_dtype"); Python literals written as JSON. Count
//                      2,205,754,368: GIMMICK's safetensors parameter count of OpenGVLab/InternVL2_5-2B.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "compute/compute_cost.hpp"
#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/wrap_units.hpp"
#include "simulate.hpp"

namespace {

using fsdp::ModelSpec;
using fsdp::ModuleGraph;
using fsdp::ModuleKind;
using fsdp::test::all_warnings;
using fsdp::test::contains;
using fsdp::test::input_error;
using fsdp::test::read_fixture;
using json = nlohmann::json;

fsdp::LoadedModel read(const std::string& stem) { return fsdp::test::read_hf_fixture(stem); }

// The leaf of layer-stack entry `l` with this short name; nullptr when there is none.
const fsdp::ModuleNode* leaf(const ModuleGraph& g, size_t l, const std::string& short_name) {
  for (auto id : g.leaves_under(g.layers()[l]))
    if (g.node(id).short_name == short_name) return &g.node(id);
  return nullptr;
}

int64_t count(const ModuleGraph& g, size_t l, ModuleKind kind) {
  int64_t n = 0;
  for (auto id : g.leaves_under(g.layers()[l])) n += g.node(id).kind == kind ? 1 : 0;
  return n;
}

std::string refusal(json j) {
  return input_error([&] { fsdp::parse_hf_config(j.dump(), "c.json"); });
}

// Llama 4's shapes (modeling_llama4.py): a text layer's attention (q 5120 -> 40 x 128, k and v -> 8 x 128, o back, no
// biases) and its two RMSNorms; a SwiGLU MLP of f (gate, up, down); a vision block (q/k/v/o 1408 x 1408 biased, fc1
// 1408 -> 5632 and fc2 back, biased, two LayerNorms).
constexpr int64_t kL4Attention = 5120 * (5120 + 2 * 1024) + 5120 * 5120 + 2 * 5120;
constexpr int64_t swiglu(int64_t f) { return 3 * 5120 * f; }
constexpr int64_t kL4VisionBlock =
    4 * (1408 * 1408 + 1408) + (1408 * 5632 + 5632) + (5632 * 1408 + 1408) + 2 * 2 * 1408;
// The vision embeddings: the unfold linear 3 x 14 x 14 -> 1408 without bias, class_embedding, the 577-row table,
// layernorm_pre; the projector: layernorm_post, fc1 5632 -> 4096, fc2 4096 -> 4096, linear_1 4096 -> 5120, no biases.
constexpr int64_t kL4VisionEmbeddings = 3 * 14 * 14 * 1408 + 1408 + 577 * 1408 + 2 * 1408;
constexpr int64_t kL4Projector = 2 * 1408 + 5632 * 4096 + 4096 * 4096 + 4096 * 5120;
constexpr int64_t kL4Embeddings = 2 * 202048 * 5120 + 5120;  // embed_tokens, lm_head, the final norm

}  // namespace

TEST_CASE("llama4: Scout and Maverick from their config.json give their published counts exactly") {
  const ModelSpec scout = read("llama4-scout-17b-16e").spec;
  const ModuleGraph gs(scout);
  CHECK(gs.total_params() == 108'641'793'536);
  // Every layer MoE: the router (5120 x 16), 16 routed experts and one shared expert of 8192.
  const int64_t scout_layer = kL4Attention + 5120 * 16 + 17 * swiglu(8192);
  CHECK(gs.params_under(fsdp::test::root_child(gs, "layers")) == 48 * scout_layer);
  CHECK(gs.params_under(fsdp::test::root_child(gs, "vision_tower.layers")) == 34 * kL4VisionBlock);
  CHECK(gs.params_under(fsdp::test::root_child(gs, "vision_tower.embeddings")) == kL4VisionEmbeddings);
  CHECK(gs.params_under(fsdp::test::root_child(gs, "multi_modal_projector")) == kL4Projector);
  CHECK(gs.total_params() ==
        48 * scout_layer + 34 * kL4VisionBlock + kL4VisionEmbeddings + kL4Projector + kL4Embeddings);

  const ModelSpec maverick = read("llama4-maverick-17b-128e").spec;
  const ModuleGraph gm(maverick);
  CHECK(gm.total_params() == 401'583'781'376);
  // interleave_moe_layer_step 2: 24 MoE layers of 128 experts and a shared one, 24 dense of intermediate_size_mlp.
  const int64_t moe_layer = kL4Attention + 5120 * 128 + 129 * swiglu(8192);
  const int64_t dense_layer = kL4Attention + swiglu(16384);
  CHECK(gm.params_under(fsdp::test::root_child(gm, "layers")) == 24 * moe_layer + 24 * dense_layer);
  CHECK(maverick.moe_layers() == 24);
  CHECK_FALSE(maverick.is_moe_layer(0));
  CHECK(maverick.is_moe_layer(1));
}

TEST_CASE("llama4: NoPE layers, chunked attention and the L2 q/k norm come from the layer parts") {
  const ModelSpec m = read("llama4-scout-17b-16e").spec;
  CHECK(m.nope_layer_every == 4);
  CHECK(m.sliding_window == 8192);
  CHECK(m.global_layer_every == 4);
  CHECK(m.chunked_attention);
  CHECK(m.qk_norm == fsdp::QkNorm::L2);
  const ModuleGraph g(m);
  const size_t first = 34;  // the vision blocks open the stack
  // Layer 0 rotates, normalises q and k per head without a weight, and attends within its chunk; layer 3 is NoPE:
  // no rotary, no q/k norm, the whole causal prefix.
  REQUIRE(leaf(g, first + 0, "q_norm") != nullptr);
  CHECK(leaf(g, first + 0, "q_norm")->params == 0);
  CHECK(leaf(g, first + 0, "q_norm")->output_elems_per_token == 40 * 128);
  CHECK(count(g, first + 0, ModuleKind::Rotary) == 1);
  CHECK(count(g, first + 3, ModuleKind::Rotary) == 0);
  CHECK(leaf(g, first + 3, "q_norm") == nullptr);
  const fsdp::ModuleNode* chunked = leaf(g, first + 0, "attention");
  const fsdp::ModuleNode* global = leaf(g, first + 3, "attention");
  REQUIRE((chunked && global));
  CHECK(chunked->window == 8192);
  CHECK(chunked->chunked);
  CHECK(global->window == 0);
  // Per query at 16384 tokens, two chunks of 8192: 8192^2 / 2 pairs each, 4096 keys on average; a window sliding over
  // 8192 keys would give 8192 - 8192^2 / (2 x 16384) = 6144; the NoPE layer 8192 (half the prefix).
  CHECK(fsdp::seq_flops_per_token(*chunked, 16384) == doctest::Approx(4.0 * 5120 * 4096));
  CHECK(fsdp::causal_keys_per_query(16384, 8192, false) == doctest::Approx(6144));
  CHECK(fsdp::seq_flops_per_token(*global, 16384) == doctest::Approx(4.0 * 5120 * 8192));
  // Within one chunk it is causal attention; a partial last chunk counts its own triangle.
  CHECK(fsdp::seq_flops_per_token(*chunked, 4096) == doctest::Approx(4.0 * 5120 * 2048));
  CHECK(fsdp::causal_keys_per_query(20000, 8192, true) ==
        doctest::Approx((2.0 * 8192 * 8192 + 3616.0 * 3616) / (2 * 20000.0)));
  // Rotary chunked layers and NoPE global layers are two layer classes, each costed once (and the first layer, whose
  // input norm reads the embedding's output, one of its own).
  CHECK(g.layer_classes()[first] == static_cast<int64_t>(first));
  CHECK(g.layer_classes()[first + 2] == static_cast<int64_t>(first + 1));
  CHECK(g.layer_classes()[first + 3] == static_cast<int64_t>(first + 3));
  CHECK(g.layer_classes()[first + 7] == static_cast<int64_t>(first + 3));
  // The L2 norm keeps its input and statistics, not a normalised tensor for a weight it does not have.
  const fsdp::ModuleNode* kn = leaf(g, first + 0, "k_norm");
  REQUIRE(kn != nullptr);
  for (const auto& t : kn->saved) CHECK(t.cls != fsdp::TensorClass::NormInternal);

  // Maverick: no q/k norm (use_qk_norm false); dense and MoE layers, rotary and NoPE, are three classes here.
  const ModelSpec mav = read("llama4-maverick-17b-128e").spec;
  const ModuleGraph gm(mav);
  CHECK(mav.qk_norm == fsdp::QkNorm::None);
  CHECK(leaf(gm, first + 0, "q_norm") == nullptr);
  CHECK(leaf(gm, first + 0, "gate_proj")->out_features == 16384);
  CHECK(leaf(gm, first + 1, "gate")->out_features == 128);
  CHECK(gm.layer_classes()[first + 4] == static_cast<int64_t>(first + 2));
  CHECK(gm.layer_classes()[first + 5] == static_cast<int64_t>(first + 1));
  CHECK(gm.layer_classes()[first + 3] == static_cast<int64_t>(first + 3));
}

TEST_CASE("llama4: the MoE layers are units of the FSDP wrap, and the image tokens join the sequence") {
  const ModelSpec m = read("llama4-scout-17b-16e").spec;
  const ModuleGraph g(m);
  fsdp::WrapPolicy by_layer;
  by_layer.kind = fsdp::WrapKind::Layer;
  const auto units = fsdp::build_wrap_units(g, by_layer);
  REQUIRE(units.size() == 1 + 34 + 48);
  CHECK(units[1].name == "vision_tower.layers.0");
  CHECK(units[35].name == "layers.0");
  // Each decoder unit holds its layer whole: attention, router, the 16 experts and the shared one.
  CHECK(units[35].params == kL4Attention + 5120 * 16 + 17 * swiglu(8192));
  CHECK(units[0].params == kL4VisionEmbeddings + kL4Projector + kL4Embeddings);
  // One 336 x 336 tile: 24 x 24 patches and the CLS token in the tower, 12 x 12 = 144 tokens after pixel shuffle.
  const fsdp::VisionSpec& v = *m.vision;
  CHECK(v.seq_per_image() == 577);
  CHECK(v.image_tokens == 144);
  CHECK(v.merge == 2);
  fsdp::Strategy s;
  s.seq_len = 2048;
  CHECK(fsdp::language_model_strategy(s, m).seq_len == 2048 + 144);
  // The blocks rotate q and k beside the learned table; the projector is three linears without biases.
  CHECK(count(g, 0, ModuleKind::Rotary) == 1);
  int64_t linears = 0;
  for (auto id : g.leaves_under(fsdp::test::root_child(g, "multi_modal_projector")))
    if (g.node(id).kind == ModuleKind::Linear) {
      ++linears;
      CHECK(g.node(id).params == g.node(id).in_features * g.node(id).out_features);
    }
  CHECK(linears == 3);
}

TEST_CASE("llama4: warnings, and the layouts the mapping refuses by key") {
  const std::string w = all_warnings(read("llama4-scout-17b-16e"));
  CHECK(contains(w, "'attn_temperature_tuning' is set"));
  CHECK(contains(w, "'rope_scaling' is set"));
  CHECK(contains(w, "every expert on every token"));
  CHECK(contains(w, "144 image tokens per sample"));
  const std::string wm = all_warnings(read("llama4-maverick-17b-128e"));
  CHECK(contains(wm, "no_rope_layer_interval = 4"));        // Maverick's file leaves it to the class default
  CHECK(contains(wm, "'attn_temperature_tuning' is set"));  // absent: True by default
  CHECK_FALSE(contains(wm, "'rope_scaling'"));              // null

  const json scout = json::parse(read_fixture("llama4-scout-17b-16e"));
  json j = scout;
  j["text_config"]["no_rope_layers"][5] = 0;  // NoPE at 3 and 5: not "every N-th"
  CHECK(contains(refusal(j), "'no_rope_layers'"));
  j = scout;
  j["text_config"]["moe_layers"] = json::array({1, 2, 5});
  CHECK(contains(refusal(j), "'moe_layers'"));
  j = scout;
  j["text_config"]["layer_types"] = json::array();
  for (int i = 0; i < 48; ++i) j["text_config"]["layer_types"].push_back("full_attention");
  CHECK(contains(refusal(j), "'layer_types'"));
  j = scout;
  j["vision_config"]["projector_output_dim"] = 2048;
  CHECK(contains(refusal(j), "'projector_output_dim'"));
  j = scout;
  j["vision_config"]["intermediate_size"] = 4096;
  CHECK(contains(refusal(j), "'intermediate_size'"));
  j = scout;
  j["vision_config"]["pixel_shuffle_ratio"] = 0.3;
  CHECK(contains(refusal(j), "'pixel_shuffle_ratio'"));
  // moe_layers as the interleaved pattern reads the same as interleave_moe_layer_step; no chunks without a size.
  j = scout;
  j["text_config"]["moe_layers"] = json::array();
  for (int i = 1; i < 48; i += 2) j["text_config"]["moe_layers"].push_back(i);
  CHECK(fsdp::parse_hf_config(j.dump(), "c.json").moe->layer_step == 2);
  j = scout;
  j["text_config"]["attention_chunk_size"] = nullptr;
  CHECK(fsdp::parse_hf_config(j.dump(), "c.json").sliding_window == 0);
  // Llama4ForCausalLM: the text model alone.
  json text = scout["text_config"];
  text["architectures"] = json::array({"Llama4ForCausalLM"});
  const ModelSpec t = fsdp::parse_hf_config(text.dump(), "t.json");
  CHECK_FALSE(t.vision);
  CHECK(ModuleGraph(t).total_params() == 108'641'793'536 - 34 * kL4VisionBlock - kL4VisionEmbeddings - kL4Projector);
}

namespace {

// InternViT-300M's block (modeling_intern_vit.py): qkv 1024 -> 3072 biased, proj 1024 x 1024 biased, fc1 1024 -> 4096
// and fc2 back, biased, norm1/norm2 LayerNorm, ls1 and ls2 (1024 each); its embeddings: class_embedding, the biased
// Conv2d patch embedding 3 x 14 x 14 -> 1024, the 1025-row position table.
constexpr int64_t kVit300Block =
    (1024 * 3072 + 3072) + (1024 * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 2 * 2048 + 2 * 1024;
constexpr int64_t kVit300Embeddings = 1024 + (3 * 14 * 14 * 1024 + 1024) + 1025 * 1024;
// mlp1: LayerNorm(4096), Linear(4096 -> h), GELU, Linear(h -> h), biased.
constexpr int64_t mlp1(int64_t h) { return 2 * 4096 + (4096 * h + h) + (h * h + h); }

}  // namespace

TEST_CASE("internvl: InternVL2.5-8B, -2B and -26B from their config.json give their published counts exactly") {
  const ModelSpec m8 = read("internvl2-8b").spec;
  const ModuleGraph g8(m8);
  CHECK(g8.total_params() == 8'075'365'376);
  CHECK(g8.params_under(fsdp::test::root_child(g8, "vision_tower.layers")) == 24 * kVit300Block);
  CHECK(g8.params_under(fsdp::test::root_child(g8, "vision_tower.embeddings")) == kVit300Embeddings);
  CHECK(g8.params_under(fsdp::test::root_child(g8, "multi_modal_projector")) == mlp1(4096));
  // The language model is internlm2_5-7b-chat: InternLM2ForCausalLM read by its own mapping, 92553 rows.
  CHECK(m8.vocab_size == 92553);
  CHECK(m8.num_kv_heads == 8);
  CHECK(m8.ffn_size == 14336);

  const ModuleGraph g2(read("internvl2.5-2b").spec);
  CHECK(g2.total_params() == 2'205'754'368);
  CHECK(g2.params_under(fsdp::test::root_child(g2, "multi_modal_projector")) == mlp1(2048));

  // InternViT-6B: RMSNorm blocks of 3200 with q/k RMSNorms over the projection and no qkv bias.
  const ModelSpec m26 = read("internvl2-26b").spec;
  const ModuleGraph g26(m26);
  CHECK(g26.total_params() == 25'514'186'112);
  const int64_t vit6b_block = 3200 * 9600 + 2 * 3200 + (3200 * 3200 + 3200) + (3200 * 12800 + 12800) +
                              (12800 * 3200 + 3200) + 2 * 3200 + 2 * 3200;
  CHECK(g26.params_under(fsdp::test::root_child(g26, "vision_tower.layers")) == 45 * vit6b_block);
  CHECK(m26.vision->qk_norm == fsdp::QkNorm::Projection);
  CHECK(leaf(g26, 0, "q_norm")->params == 3200);
}

TEST_CASE("internvl: layer scales, pixel shuffle and mlp1 are parts of the graph; 256 image tokens per tile") {
  const ModelSpec m = read("internvl2-8b").spec;
  const ModuleGraph g(m);
  const fsdp::VisionSpec& v = *m.vision;
  CHECK(v.layer_scale);
  CHECK(v.merge == 2);
  CHECK(v.seq_per_image() == 1025);
  CHECK(v.image_tokens == 256);
  CHECK(v.run_layers == 24);
  CHECK(count(g, 0, ModuleKind::Scale) == 2);
  const fsdp::ModuleNode* ls1 = leaf(g, 0, "ls1");
  REQUIRE(ls1 != nullptr);
  CHECK(ls1->params == 1024);
  CHECK(ls1->saved.at(0).elems_per_token == 1024);
  CHECK(count(g, 0, ModuleKind::Rotary) == 0);  // a learned table only
  // mlp1's LayerNorm over each merged token of 4 x 1024.
  for (auto id : g.leaves_under(fsdp::test::root_child(g, "multi_modal_projector")))
    if (g.node(id).kind == ModuleKind::Norm) CHECK(g.node(id).output_elems_per_token == 4096);
  fsdp::Strategy s;
  s.seq_len = 2048;
  CHECK(fsdp::language_model_strategy(s, m).seq_len == 2048 + 256);
  fsdp::WrapPolicy by_layer;
  by_layer.kind = fsdp::WrapKind::Layer;
  CHECK(fsdp::build_wrap_units(g, by_layer).size() == 1 + 24 + 32);
}

TEST_CASE("internvl: warnings, and what the mapping refuses by key") {
  const std::string w = all_warnings(read("internvl2-8b"));
  CHECK(contains(w, "'rope_scaling' is set"));  // the language model's dynamic scaling
  CHECK(contains(w, "256 image tokens per sample"));
  const json base = json::parse(read_fixture("internvl2-8b"));
  json j = base;
  j["force_image_size"] = 224;
  CHECK(contains(refusal(j), "'force_image_size'"));
  j = base;
  j["use_llm_lora"] = 16;
  CHECK(contains(refusal(j), "'use_llm_lora'"));
  j = base;
  j["vision_config"]["qk_normalization"] = true;  // RMSNorm q/k norms in LayerNorm blocks
  CHECK(contains(refusal(j), "'qk_normalization'"));
  j = base;
  j["llm_config"].erase("architectures");
  CHECK(contains(refusal(j), "'architectures'"));
  j = base;
  j["llm_config"]["architectures"] = json::array({"LlavaForConditionalGeneration"});
  CHECK(contains(refusal(j), "composite"));
  j = base;
  j["downsample_ratio"] = 0.25;  // 4 x 4 patches: 64 tokens per tile, mlp1 over 16 x 1024
  const ModelSpec quarter = fsdp::parse_hf_config(j.dump(), "c.json");
  CHECK(quarter.vision->image_tokens == 64);
  CHECK(quarter.vision->merged_width() == 16 * 1024);
  j = base;
  j["select_layer"] = -2;  // hidden_states[-2]: the last block is held, not run
  const fsdp::LoadedModel held = fsdp::read_hf_config(j.dump(), "c.json");
  CHECK(held.spec.vision->run_layers == 23);
  CHECK(contains(all_warnings(held), "counted but not run"));
  CHECK(ModuleGraph(held.spec).total_params() == 8'075'365'376);
}

TEST_CASE("llama4 and internvl: the zoo files read the same as their config.json and write back") {
  const std::pair<const char*, const char*> zoo_of[] = {{"llama4-scout-17b-16e", "llama4-scout-17b-16e"},
                                                        {"llama4-maverick-17b-128e", "llama4-maverick-17b-128e"},
                                                        {"internvl2.5-8b", "internvl2-8b"},
                                                        {"internvl2.5-2b", "internvl2.5-2b"}};
  for (const auto& [name, stem] : zoo_of) {
    INFO(name);
    const ModelSpec zoo = fsdp::load_model(name, FSDP_SOURCE_ROOT);
    const ModelSpec hf = read(stem).spec;
    CHECK(ModuleGraph(zoo).total_params() == ModuleGraph(hf).total_params());
    CHECK(zoo.chunked_attention == hf.chunked_attention);
    CHECK(zoo.nope_layer_every == hf.nope_layer_every);
    CHECK(zoo.qk_norm == hf.qk_norm);
    CHECK(zoo.vision->layer_scale == hf.vision->layer_scale);
    CHECK(zoo.vision->block_rotary == hf.vision->block_rotary);
    CHECK(zoo.vision->projector_layers == hf.vision->projector_layers);
    YAML::Emitter out;
    fsdp::emit_model_map(zoo, out);
    fsdp::ConfigMap map = fsdp::ConfigMap::load_string(out.c_str(), "emitted.yaml");
    const ModelSpec back = fsdp::parse_model_map(map);
    CHECK(ModuleGraph(back).total_params() == ModuleGraph(zoo).total_params());
    CHECK(back.chunked_attention == zoo.chunked_attention);
    CHECK(back.vision->projector_bias == zoo.vision->projector_bias);
  }
  CHECK(fsdp::load_model("scout", FSDP_SOURCE_ROOT).name == "llama4-scout-17b-16e");
  CHECK(fsdp::load_model("maverick", FSDP_SOURCE_ROOT).name == "llama4-maverick-17b-128e");
  // The schema's new keys are checked as the others: chunked_attention needs a window, an unknown vision key is
  // refused.
  auto yaml_error = [](const std::string& from, const std::string& to) {
    return fsdp::test::zoo_edit_error("llama4-scout-17b-16e", from, to);
  };
  CHECK(contains(yaml_error("sliding_window: 8192\nglobal_layer_every: 4\n", ""), "chunked_attention"));
  CHECK(contains(yaml_error("  block_rotary: true", "  block_rotary: true\n  block_rotry: true"), "block_rotry"));
  CHECK(contains(yaml_error("  projector_layers: 3", "  projector_layers: 0"), "projector_layers"));
}
