// parse_hf_config: Hugging Face config.json files give the same ModelSpec as their zoo twins, and
// every way a config.json can be wrong is an InputError naming the file and the key.
//
// Fixtures (tests/data/hf/), the published config.json contents:
//   llama3-8b.json     meta-llama/Meta-Llama-3-8B config.json
//   llama2-7b.json     meta-llama/Llama-2-7b-hf config.json
//   llama2-70b.json    meta-llama/Llama-2-70b-hf config.json as mirrored in TheBloke/Llama-2-70B-fp16
//                      (refs/pr/6; the same keys plus pad_token_id 0)
//   mistral-7b.json    mistralai/Mistral-7B-v0.1 config.json
//   mixtral-8x7b.json  mistralai/Mixtral-8x7B-Instruct-v0.1 config.json @ eba92302 (the base
//                      Mixtral-8x7B-v0.1 config has the same architecture keys and values)
//   qwen2-7b.json      Qwen/Qwen2-7B config.json
//   qwen2-72b.json     Qwen/Qwen2-72B config.json @ c03367ee
//   qwen-72b.json      FreedomIntelligence/Apollo-72B config.json: a full fine-tune of Qwen/Qwen-72B
//                      that keeps Qwen-72B's QWenLMHeadModel config (its _name_or_path is the local
//                      path of the Qwen-72B checkpoint it started from)
//   gpt2.json          openai-community/gpt2 config.json
//   gpt2-xl.json       openai-community/gpt2-xl config.json
//   The families of issue 23 (test_model_families.cpp cites each file's source and published count):
//   qwen3-8b, gemma2-9b, gemma3-1b, phi3-mini-4k, glm4-9b, internlm2-7b, olmo2-7b, falcon-7b, pythia-1b.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"

namespace {

using fsdp::test::fixture_path;
using fsdp::test::input_error;
using fsdp::test::read_fixture;

using fsdp::InputError;
using fsdp::ModelSpec;
using fsdp::parse_hf_config;
using json = nlohmann::json;

json fixture_json(const std::string& stem) { return json::parse(read_fixture(stem)); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Field by field, except the name (a hub id or a file stem for config.json, the zoo name for YAML).
void check_same_model(const ModelSpec& hf, const ModelSpec& zoo) {
  CHECK(hf.family == zoo.family);
  CHECK(hf.hidden_size == zoo.hidden_size);
  CHECK(hf.num_layers == zoo.num_layers);
  CHECK(hf.num_heads == zoo.num_heads);
  CHECK(hf.num_kv_heads == zoo.num_kv_heads);
  CHECK(hf.head_dim == zoo.head_dim);
  CHECK(hf.ffn_size == zoo.ffn_size);
  CHECK(hf.gated_mlp == zoo.gated_mlp);
  CHECK(hf.activation == zoo.activation);
  CHECK(hf.vocab_size == zoo.vocab_size);
  CHECK(hf.tied_embeddings == zoo.tied_embeddings);
  CHECK(hf.norm == zoo.norm);
  CHECK(hf.norm_eps == zoo.norm_eps);
  CHECK(hf.position_embedding == zoo.position_embedding);
  CHECK(hf.rope_theta == zoo.rope_theta);
  CHECK(hf.max_positions == zoo.max_positions);
  CHECK(hf.qkv_bias == zoo.qkv_bias);
  CHECK(hf.attn_out_bias == zoo.attn_out_bias);
  CHECK(hf.mlp_bias == zoo.mlp_bias);
  CHECK(hf.dropout == zoo.dropout);
  CHECK(hf.pre_attention_norm == zoo.pre_attention_norm);
  CHECK(hf.pre_mlp_norm == zoo.pre_mlp_norm);
  CHECK(hf.post_attention_norm == zoo.post_attention_norm);
  CHECK(hf.post_mlp_norm == zoo.post_mlp_norm);
  CHECK(hf.parallel_block == zoo.parallel_block);
  CHECK(hf.qk_norm == zoo.qk_norm);
  CHECK(hf.rotary_dim == zoo.rotary_dim);
  CHECK(hf.value_views_fused_qkv == zoo.value_views_fused_qkv);
  CHECK(hf.sliding_window == zoo.sliding_window);
  CHECK(hf.global_layer_every == zoo.global_layer_every);
  CHECK(hf.attn_logit_softcap == zoo.attn_logit_softcap);
  CHECK(hf.final_logit_softcap == zoo.final_logit_softcap);
  CHECK(hf.scaled_embeddings == zoo.scaled_embeddings);
  REQUIRE(hf.moe.has_value() == zoo.moe.has_value());
  if (hf.moe) {
    CHECK(hf.moe->num_experts == zoo.moe->num_experts);
    CHECK(hf.moe->experts_per_token == zoo.moe->experts_per_token);
    CHECK(hf.moe->shared_experts == zoo.moe->shared_experts);
    CHECK(hf.moe->expert_ffn_size == zoo.moe->expert_ffn_size);
  }
}

const std::vector<std::string> kFixtures = {"llama3-8b",    "llama2-7b", "llama2-70b", "mistral-7b",   "mixtral-8x7b",
                                            "qwen2-7b",     "qwen2-72b", "qwen-72b",   "gpt2",         "gpt2-xl",
                                            "qwen3-8b",     "gemma2-9b", "gemma3-1b",  "phi3-mini-4k", "glm4-9b",
                                            "internlm2-7b", "olmo2-7b",  "falcon-7b",  "pythia-1b"};

// A minimal, valid Llama config with the given line replaced; the keys sit one per line so
// tests can check the reported line.
std::string llama_text(const std::string& hidden_line = "  \"hidden_size\": 4096,") {
  return "{\n"
         "  \"architectures\": [\"LlamaForCausalLM\"],\n"
         "  \"num_hidden_layers\": 2,\n" +
         hidden_line +
         "\n"
         "  \"num_attention_heads\": 32,\n"
         "  \"intermediate_size\": 11008,\n"
         "  \"vocab_size\": 32000,\n"
         "  \"max_position_embeddings\": 4096\n"
         "}\n";
}

}  // namespace

TEST_CASE("hf config: each fixture gives the same ModelSpec as its zoo twin") {
  for (const auto& stem : kFixtures) {
    INFO("fixture: " << fixture_path(stem));
    ModelSpec hf = parse_hf_config(read_fixture(stem), fixture_path(stem));
    ModelSpec zoo = fsdp::load_model(stem, FSDP_SOURCE_ROOT);
    check_same_model(hf, zoo);
    // And therefore the same graph: the parameter count matches.
    CHECK(fsdp::build_module_graph(hf).total_params() == fsdp::build_module_graph(zoo).total_params());
  }
}

TEST_CASE("hf config: load_model accepts a config.json path") {
  ModelSpec via_path = fsdp::load_model(fixture_path("mixtral-8x7b"), FSDP_SOURCE_ROOT);
  ModelSpec zoo = fsdp::load_model("mixtral-8x7b", FSDP_SOURCE_ROOT);
  check_same_model(via_path, zoo);
}

TEST_CASE("hf config: the name comes from _name_or_path, else the file stem") {
  CHECK(parse_hf_config(read_fixture("llama2-7b"), fixture_path("llama2-7b")).name == "meta-llama/Llama-2-7b-hf");
  // No _name_or_path in Meta's Llama 3 config.json: the stem of the source name.
  CHECK(parse_hf_config(read_fixture("llama3-8b"), fixture_path("llama3-8b")).name == "llama3-8b");
  CHECK(parse_hf_config(read_fixture("llama3-8b"), "/models/Meta-Llama-3-8B/config.json").name == "config");
  // An empty _name_or_path counts as absent.
  json j = fixture_json("llama3-8b");
  j["_name_or_path"] = "";
  CHECK(parse_hf_config(j.dump(2), "/x/my-model.json").name == "my-model");
}

TEST_CASE("hf config: load_model names a config.json without _name_or_path after its directory") {
  // A snapshot's config.json, given as the file or as the directory: the directory's name, not "config".
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "fsdp-hf-name-test" / "Meta-Llama-3-8B";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "config.json");
    f << read_fixture("llama3-8b");
  }
  CHECK(fsdp::load_model((dir / "config.json").string(), FSDP_SOURCE_ROOT).name == "Meta-Llama-3-8B");
  CHECK(fsdp::load_model(dir.string(), FSDP_SOURCE_ROOT).name == "Meta-Llama-3-8B");
  // Another file name keeps its stem.
  std::filesystem::copy_file(dir / "config.json", dir / "llama3.json",
                             std::filesystem::copy_options::overwrite_existing);
  CHECK(fsdp::load_model((dir / "llama3.json").string(), FSDP_SOURCE_ROOT).name == "llama3");
  std::filesystem::remove_all(dir.parent_path());
}

TEST_CASE("hf config: optional keys take the defaults of the transformers config classes") {
  SUBCASE("Llama: no num_key_value_heads means MHA, no rope_theta means 10000, no eps means 1e-6") {
    ModelSpec m = parse_hf_config(llama_text(), "minimal.json");
    CHECK(m.num_kv_heads == m.num_heads);
    CHECK(m.rope_theta == 10000.0);
    CHECK(m.norm_eps == 1e-6);
    CHECK(m.head_dim == 4096 / 32);
    CHECK_FALSE(m.tied_embeddings);
    CHECK_FALSE(m.qkv_bias);
    CHECK_FALSE(m.mlp_bias);
    CHECK_FALSE(m.dropout);
  }
  SUBCASE("Llama: null num_key_value_heads also means MHA") {
    json j = json::parse(llama_text());
    j["num_key_value_heads"] = nullptr;
    CHECK(parse_hf_config(j.dump(), "null-kv.json").num_kv_heads == 32);
  }
  SUBCASE("Llama: attention_bias sets q/k/v and o biases, mlp_bias the MLP's, head_dim overrides") {
    json j = json::parse(llama_text());
    j["attention_bias"] = true;
    j["mlp_bias"] = true;
    j["head_dim"] = 64;
    ModelSpec m = parse_hf_config(j.dump(), "bias.json");
    CHECK(m.qkv_bias);
    CHECK(m.attn_out_bias);
    CHECK(m.mlp_bias);
    CHECK(m.head_dim == 64);
  }
  SUBCASE("Mistral and Mixtral: num_key_value_heads defaults to 8; Mixtral to 8 experts, top-2") {
    json j = fixture_json("mixtral-8x7b");
    j.erase("num_key_value_heads");
    j.erase("num_local_experts");
    j.erase("num_experts_per_tok");
    j.erase("rope_theta");
    ModelSpec m = parse_hf_config(j.dump(), "mixtral-defaults.json");
    CHECK(m.num_kv_heads == 8);
    REQUIRE(m.moe);
    CHECK(m.moe->num_experts == 8);
    CHECK(m.moe->experts_per_token == 2);
    CHECK(m.rope_theta == 1e6);
    json mistral = fixture_json("mistral-7b");
    mistral.erase("num_key_value_heads");
    CHECK(parse_hf_config(mistral.dump(), "mistral.json").num_kv_heads == 8);
  }
  SUBCASE("GPT-2: no tie_word_embeddings means tied; n_inner null or absent means 4 * n_embd") {
    json j = fixture_json("gpt2");
    REQUIRE_FALSE(j.contains("tie_word_embeddings"));
    ModelSpec m = parse_hf_config(j.dump(), "gpt2.json");
    CHECK(m.tied_embeddings);
    CHECK(m.ffn_size == 4 * m.hidden_size);
    j["n_inner"] = nullptr;
    CHECK(parse_hf_config(j.dump(), "gpt2.json").ffn_size == 4 * 768);
    j["n_inner"] = 1000;
    CHECK(parse_hf_config(j.dump(), "gpt2.json").ffn_size == 1000);
    j["attn_pdrop"] = 0.0;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    CHECK_FALSE(parse_hf_config(j.dump(), "gpt2.json").dropout);
  }
  SUBCASE("Qwen 1: no_bias false adds the attention c_proj and MLP biases") {
    json j = fixture_json("qwen-72b");
    j["no_bias"] = false;
    ModelSpec m = parse_hf_config(j.dump(), "qwen.json");
    CHECK(m.qkv_bias);
    CHECK(m.attn_out_bias);
    CHECK(m.mlp_bias);
  }
  SUBCASE("without architectures, model_type names the class") {
    json j = json::parse(llama_text());
    j.erase("architectures");
    j["model_type"] = "llama";
    CHECK(parse_hf_config(j.dump(), "old.json").hidden_size == 4096);
  }
}

TEST_CASE("hf config: invalid JSON names the file and the line") {
  std::string msg = input_error([] { parse_hf_config("{\n  \"hidden_size\": 4096,\n  oops\n}\n", "broken.json"); });
  CHECK(contains(msg, "broken.json:3:"));
  CHECK(contains(msg, "not valid JSON"));
  CHECK(contains(input_error([] { parse_hf_config("", "empty.json"); }), "empty.json"));
  CHECK(contains(input_error([] { parse_hf_config("{\"a\": 1e999}", "big.json"); }), "big.json"));
  CHECK(contains(input_error([] { parse_hf_config("[1, 2]", "list.json"); }), "list.json:1"));
}

TEST_CASE("hf config: unknown or missing architecture is an InputError naming the key") {
  json j = fixture_json("llama3-8b");
  j["architectures"] = {"BertForMaskedLM"};
  std::string msg = input_error([&] { parse_hf_config(j.dump(2), "bert.json"); });
  CHECK(contains(msg, "bert.json:"));
  CHECK(contains(msg, "'architectures'"));
  CHECK(contains(msg, "BertForMaskedLM"));

  j.erase("architectures");
  j.erase("model_type");
  msg = input_error([&] { parse_hf_config(j.dump(2), "none.json"); });
  CHECK(contains(msg, "none.json"));
  CHECK(contains(msg, "'architectures'"));

  j["model_type"] = "t5";
  msg = input_error([&] { parse_hf_config(j.dump(2), "t5.json"); });
  CHECK(contains(msg, "'model_type'"));
  CHECK(contains(msg, "t5"));

  j.erase("model_type");
  j["architectures"] = "LlamaForCausalLM";  // a string, not a list
  CHECK(contains(input_error([&] { parse_hf_config(j.dump(2), "str.json"); }), "'architectures'"));
  j["architectures"] = json::array();
  CHECK(contains(input_error([&] { parse_hf_config(j.dump(2), "empty-list.json"); }), "'architectures'"));
  j["architectures"] = {42};
  CHECK(contains(input_error([&] { parse_hf_config(j.dump(2), "num.json"); }), "'architectures'"));
}

TEST_CASE("hf config: every required key, when missing, is an InputError naming the file and key") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> required = {
      {"llama3-8b",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        "max_position_embeddings"}},
      {"mistral-7b",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        "max_position_embeddings"}},
      {"mixtral-8x7b", {"hidden_size", "intermediate_size", "vocab_size"}},
      {"qwen2-72b", {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"}},
      {"qwen-72b", {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"}},
      {"gpt2", {"n_embd", "n_layer", "n_head", "vocab_size", "n_positions"}},
  };
  for (const auto& [stem, keys] : required) {
    for (const auto& key : keys) {
      INFO(stem << " without " << key);
      json j = fixture_json(stem);
      REQUIRE(j.contains(key));
      j.erase(key);
      std::string msg = input_error([&] { parse_hf_config(j.dump(2), stem + "-cut.json"); });
      CHECK(contains(msg, stem + "-cut.json"));
      CHECK(contains(msg, "'" + key + "'"));
      CHECK(contains(msg, "missing"));
    }
  }
  // Qwen 1 accepts seq_length for max_position_embeddings, and needs one of them.
  json q = fixture_json("qwen-72b");
  q.erase("max_position_embeddings");
  CHECK(parse_hf_config(q.dump(2), "qwen.json").max_positions == 32768);  // from seq_length
  q.erase("seq_length");
  CHECK(contains(input_error([&] { parse_hf_config(q.dump(2), "qwen.json"); }), "'max_position_embeddings'"));
}

TEST_CASE("hf config: a wrong JSON type is an InputError naming the file, line and key") {
  // hidden_size sits on line 4 of llama_text().
  std::string msg = input_error([] { parse_hf_config(llama_text("  \"hidden_size\": \"4096\","), "typed.json"); });
  CHECK(contains(msg, "typed.json:4: key 'hidden_size'"));
  CHECK(contains(msg, "integer"));

  msg = input_error([] { parse_hf_config(llama_text("  \"hidden_size\": 4096.0,"), "float.json"); });
  CHECK(contains(msg, "float.json:4: key 'hidden_size'"));
  msg = input_error([] { parse_hf_config(llama_text("  \"hidden_size\": null,"), "null.json"); });
  CHECK(contains(msg, "null.json:4: key 'hidden_size'"));
  msg = input_error([] { parse_hf_config(llama_text("  \"hidden_size\": [4096],"), "list.json"); });
  CHECK(contains(msg, "list.json:4: key 'hidden_size'"));

  struct Bad {
    const char* stem;
    const char* key;
    json value;
  };
  const std::vector<Bad> bad = {
      {"llama3-8b", "rms_norm_eps", "1e-5"},
      {"llama3-8b", "rope_theta", true},
      {"llama3-8b", "tie_word_embeddings", "false"},
      {"llama3-8b", "attention_bias", 0},
      {"llama3-8b", "hidden_act", 3},
      {"llama3-8b", "num_key_value_heads", 8.5},
      {"llama3-8b", "attention_dropout", "0"},
      {"mixtral-8x7b", "num_local_experts", "8"},
      {"qwen-72b", "no_bias", "yes"},
      {"qwen-72b", "kv_channels", 128.0},
      {"gpt2", "n_inner", "3072"},
      {"gpt2", "activation_function", json::array()},
      {"gpt2", "layer_norm_epsilon", json::object()},
      {"llama2-7b", "_name_or_path", 7},
  };
  for (const auto& b : bad) {
    INFO(b.stem << ": " << b.key << " = " << b.value.dump());
    json j = fixture_json(b.stem);
    j[b.key] = b.value;
    std::string m = input_error([&] { parse_hf_config(j.dump(2), std::string(b.stem) + "-typed.json"); });
    CHECK(contains(m, std::string(b.stem) + "-typed.json:"));
    CHECK(contains(m, "'" + std::string(b.key) + "'"));
  }
}

TEST_CASE("hf config: values out of range are InputErrors naming the key") {
  struct Bad {
    const char* stem;
    const char* key;
    json value;
  };
  const std::vector<Bad> bad = {
      {"llama3-8b", "num_hidden_layers", 0},
      {"llama3-8b", "hidden_size", -4096},
      {"llama3-8b", "vocab_size", 99999999999LL},
      {"llama3-8b", "intermediate_size", json::parse("18446744073709551615")},
      {"llama3-8b", "rms_norm_eps", 0.0},
      {"llama3-8b", "rope_theta", -1.0},
      {"llama3-8b", "attention_dropout", 1.5},
      {"llama3-8b", "hidden_act", "relu6"},
      {"gpt2", "activation_function", "laplace"},
      {"gpt2", "resid_pdrop", -0.1},
  };
  for (const auto& b : bad) {
    INFO(b.stem << ": " << b.key << " = " << b.value.dump());
    json j = fixture_json(b.stem);
    j[b.key] = b.value;
    std::string m = input_error([&] { parse_hf_config(j.dump(2), "range.json"); });
    CHECK(contains(m, "range.json"));
    CHECK(contains(m, "'" + std::string(b.key) + "'"));
  }
}

TEST_CASE("hf config: shapes the modeling code cannot build are InputErrors") {
  SUBCASE("heads not dividing the hidden size") {
    std::string m = input_error([] {
      json j = json::parse(llama_text());
      j["num_attention_heads"] = 33;
      parse_hf_config(j.dump(2), "heads.json");
    });
    CHECK(contains(m, "heads.json"));
    CHECK(contains(m, "'num_attention_heads'"));
  }
  SUBCASE("kv heads not dividing the heads") {
    std::string m = input_error([] {
      json j = fixture_json("llama3-8b");
      j["num_key_value_heads"] = 5;
      parse_hf_config(j.dump(2), "kv.json");
    });
    CHECK(contains(m, "kv.json"));
    CHECK(contains(m, "kv_heads"));
  }
  SUBCASE("GPT-2 heads not dividing n_embd") {
    std::string m = input_error([] {
      json j = fixture_json("gpt2");
      j["n_head"] = 7;
      parse_hf_config(j.dump(2), "gpt2-heads.json");
    });
    CHECK(contains(m, "'n_head'"));
  }
  SUBCASE("more experts per token than experts") {
    std::string m = input_error([] {
      json j = fixture_json("mixtral-8x7b");
      j["num_experts_per_tok"] = 9;
      parse_hf_config(j.dump(2), "moe.json");
    });
    CHECK(contains(m, "moe.json"));
    CHECK(contains(m, "'num_experts_per_tok'"));
  }
  SUBCASE("Qwen 1 intermediate_size must split into two halves") {
    std::string m = input_error([] {
      json j = fixture_json("qwen-72b");
      j["intermediate_size"] = 49151;
      parse_hf_config(j.dump(2), "qwen-odd.json");
    });
    CHECK(contains(m, "'intermediate_size'"));
  }
  SUBCASE("GPT-2 with cross-attention") {
    std::string m = input_error([] {
      json j = fixture_json("gpt2");
      j["add_cross_attention"] = true;
      parse_hf_config(j.dump(2), "xattn.json");
    });
    CHECK(contains(m, "'add_cross_attention'"));
  }
}
