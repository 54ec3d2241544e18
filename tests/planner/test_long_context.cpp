// A RoPE model planned beyond the positions it was trained for is an error (issue M13), the same for every family:
// beyond max_positions (max_position_embeddings), or, where the config's rope_scaling extends them, beyond factor x
// original_max_position_embeddings. The message names where the length came from, the model and its limits; exit 2.
// The default --seq never runs into it: it is capped at the model's text positions, with a note. (Learned positions
// beyond the table: test_cli_errors.cpp.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli_runner.hpp"

using fsdp::test::refusal;
using fsdp::test::run_cli;
using fsdp::test::slurp;

namespace {

// One error naming the length's source, the model and its max_positions, and nothing on stdout.
void check_refused(const fsdp::test::CliResult& r, const std::string& seq_source, const std::string& model,
                   int64_t max_positions) {
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("fsdp-plan: error: " + seq_source + " exceeds " + model + "'s max_positions " +
                   "(max_position_embeddings) of " + std::to_string(max_positions)) != std::string::npos);
  CHECK(r.err.find("the model was not trained for that length") != std::string::npos);
}

std::string scratch(const std::string& name) { return "/tmp/fsdp_long_ctx_" + std::to_string(::getpid()) + name; }

// llama3-8b's config.json (8192 positions) with its "rope_scaling": null replaced by `rope_scaling`.
std::string llama3_with_rope_scaling(const std::string& rope_scaling, const std::string& name) {
  std::string text = slurp(std::string(FSDP_SOURCE_ROOT) + "/tests/data/hf/llama3-8b.json");
  const std::string from = "\"rope_scaling\": null";
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), "\"rope_scaling\": " + rope_scaling);
  const std::string path = scratch(name + ".json");
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("simulate and plan: --seq beyond a RoPE model's max_positions is refused, naming the model and the limit") {
  check_refused(run_cli("simulate --model llama2-7b --gpus 8 --seq 8192 --json"), "--seq 8192", "llama2-7b", 4096);
  check_refused(run_cli("--model llama2-7b --gpus 8 --seq 8192 --no-out"), "--seq 8192", "llama2-7b", 4096);
  // The same words for every family: a config.json of another one (Qwen2, 131072 positions).
  check_refused(run_cli("simulate --model " + std::string(FSDP_SOURCE_ROOT) +
                        "/tests/data/hf/qwen2-7b.json --gpus 8 --seq 131073 --json"),
                "--seq 131073", "qwen2-7b", 131072);

  auto at_limit = run_cli("simulate --model llama2-7b --gpus 8 --seq 4096 --json");
  CHECK(at_limit.code == 0);
  CHECK(at_limit.err.find("error") == std::string::npos);
}

TEST_CASE("the default --seq is capped at the model's positions, with a note, in simulate and plan") {
  auto sim = run_cli("simulate --model tiny --hw cpu --gpus 2 --json");
  CAPTURE(sim.err);
  CHECK(sim.code == 0);
  CHECK(sim.err.find("note: tiny has 512 positions; planning with --seq 512") != std::string::npos);
  CHECK(sim.out.find("\"seq_len\": 512") != std::string::npos);
  auto plan = run_cli("--model tiny --hw cpu --gpus 2 --no-out");
  CHECK(plan.code == 0);
  CHECK(plan.err.find("planning with --seq 512") != std::string::npos);
}

TEST_CASE("a plan file beyond the model's positions is refused by simulate --plan, naming the file") {
  const std::string path = scratch("_plan.yaml");
  REQUIRE(run_cli("--model tiny --hw cpu --gpus 2 --seq 512 --out " + path).code == 0);
  std::string text = slurp(path);
  const auto at = text.find("seq_len: 512");
  REQUIRE(at != std::string::npos);
  text.replace(at, 12, "seq_len: 1024");
  std::ofstream(path) << text;
  check_refused(run_cli("simulate --plan " + path + " --json"), path + ": strategy.seq_len 1024", "tiny", 512);
  std::remove(path.c_str());
}

TEST_CASE("rope_scaling with a factor extends the positions a --seq may use to factor x the original ones") {
  // Llama 3's 8192 positions, YaRN x4 of them: 32768 allowed, one more refused naming the extension.
  const std::string yarn = llama3_with_rope_scaling(
      "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 8192}", "_yarn");
  auto within = run_cli("simulate --model " + yarn + " --gpus 8 --seq 32768 --act-ckpt full --json");
  CAPTURE(within.err);
  CHECK(within.code == 0);
  CHECK(within.err.find("rope_scaling") != std::string::npos);  // still named as a key that changes no cost
  auto beyond = run_cli("simulate --model " + yarn + " --gpus 8 --seq 32769 --json");
  // No _name_or_path in the file: the model is named by the file's stem.
  check_refused(beyond, "--seq 32769", yarn.substr(5, yarn.size() - 5 - 5), 8192);
  CHECK(beyond.err.find("and its rope_scaling's extension to 32768") != std::string::npos);
  // Without original_max_position_embeddings the factor scales max_position_embeddings (linear x2: 16384).
  const std::string linear = llama3_with_rope_scaling("{\"type\": \"linear\", \"factor\": 2.0}", "_linear");
  CHECK(run_cli("simulate --model " + linear + " --gpus 8 --seq 16384 --act-ckpt full --json").code == 0);
  refusal("simulate --model " + linear + " --gpus 8 --seq 16385 --json");
  // Llama 3.1's own "llama3" scaling (factor 8 of 8192 = 65536) is below its max_position_embeddings: no extension.
  const std::string l31 = llama3_with_rope_scaling(
      "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"original_max_position_embeddings\": 8192, "
      "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}",
      "_l31");
  CHECK(run_cli("simulate --model " + l31 + " --gpus 8 --seq 65536 --act-ckpt full --json").code == 0);
  // A factor that is not a positive number is an error naming the key.
  const std::string bad = llama3_with_rope_scaling("{\"type\": \"linear\", \"factor\": -2}", "_bad");
  refusal("simulate --model " + bad + " --gpus 8 --json", {"rope_scaling", "factor must be a positive number"});
  for (const auto& p : {yarn, linear, l31, bad}) std::remove(p.c_str());
}

TEST_CASE("a model file's rope_scaled_positions is the same extension") {
  const std::string path = scratch("_model.yaml");
  std::string text = slurp(std::string(FSDP_SOURCE_ROOT) + "/configs/models/tiny.yaml");
  const auto at = text.find("max_positions: 512");
  REQUIRE(at != std::string::npos);
  text.insert(at, "rope_scaled_positions: 2048\n");
  std::ofstream(path) << text;
  CHECK(run_cli("simulate --model " + path + " --hw cpu --gpus 2 --seq 2048 --json").code == 0);
  refusal("simulate --model " + path + " --hw cpu --gpus 2 --seq 2049 --json",
          {"its rope_scaling's extension to 2048"});
  std::remove(path.c_str());
}

TEST_CASE(
    "a vision-language model's positions hold its image tokens: the default --seq leaves room, a longer one is "
    "refused") {
  // llava-1.5-7b: 4096 positions, 576 image tokens (one 336 px image of 14 px patches).
  auto plan = run_cli("--model llava-1.5-7b --gpus 8 --no-out");
  CAPTURE(plan.err);
  CHECK(plan.code == 0);
  CHECK(plan.err.find("(576 of them for the image tokens); planning with --seq 3520") != std::string::npos);
  auto sim = run_cli("simulate --model llava-1.5-7b --gpus 8 --seq 4096 --json");
  check_refused(sim, "--seq 4096 plus 576 image tokens (4672)", "llava-1.5-7b", 4096);
}
