// A RoPE model planned beyond its max_positions is a warning, not an error (issue M11): fsdp-plan says once, on
// stderr, that the model was not trained for that length and that RoPE scaling is not modelled, and the exit
// status is what it would be without it. (Learned positions beyond the table are an error: test_cli_errors.cpp.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "cli_runner.hpp"

using fsdp::test::run_cli;

namespace {

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

// One warning naming the model, its max_positions and the length, from `seq_source`.
void check_one_warning(const fsdp::test::CliResult& r, const std::string& seq_source, const std::string& model,
                       int64_t max_positions) {
  CAPTURE(r.err);
  CHECK(count(r.err, "warning:") == 1);
  CHECK(r.err.find("fsdp-plan: warning: " + seq_source + " exceeds " + model + "'s max_positions " +
                   "(max_position_embeddings) of " + std::to_string(max_positions) +
                   ": the model was not trained for that length") != std::string::npos);
  CHECK(r.err.find("RoPE scaling / long-context settings") != std::string::npos);
  CHECK(r.err.find("not modelled") != std::string::npos);
}

}  // namespace

TEST_CASE("simulate: --seq beyond a RoPE model's max_positions warns once, the run goes on") {
  auto r = run_cli("simulate --model llama2-7b --gpus 8 --seq 8192 --json");
  CHECK(r.code == 0);
  check_one_warning(r, "--seq 8192", "llama2-7b", 4096);
  CHECK(r.out.find("\"memory\"") != std::string::npos);

  auto at_limit = run_cli("simulate --model llama2-7b --gpus 8 --seq 4096 --json");
  CHECK(at_limit.code == 0);
  CHECK(at_limit.err.find("warning") == std::string::npos);

  // The default --seq (4096) is said to be the default.
  auto tiny = run_cli("simulate --model tiny --hw cpu --gpus 2 --json");
  CHECK(tiny.code == 0);
  check_one_warning(tiny, "the default --seq 4096", "tiny", 512);
}

TEST_CASE("plan: --seq beyond a RoPE model's max_positions warns once; the plan file carries it to simulate --plan") {
  const std::string path = "/tmp/fsdp_long_ctx_" + std::to_string(::getpid()) + ".yaml";
  auto r = run_cli("--model tiny --hw cpu --gpus 2 --seq 1024 --out " + path);
  CHECK(r.code == 0);
  check_one_warning(r, "--seq 1024", "tiny", 512);

  auto sim = run_cli("simulate --plan " + path + " --json");
  CHECK(sim.code == 0);
  check_one_warning(sim, path + ": strategy.seq_len 1024", "tiny", 512);
  std::remove(path.c_str());

  auto fits = run_cli("--model tiny --hw cpu --gpus 2 --seq 512 --no-out");
  CHECK(fits.code == 0);
  CHECK(fits.err.find("warning") == std::string::npos);
}

TEST_CASE(
    "a vision-language model's positions hold its image tokens: the default --seq leaves room, a longer one warns") {
  // llava-1.5-7b: 4096 positions, 576 image tokens (one 336 px image of 14 px patches).
  auto plan = run_cli("--model llava-1.5-7b --gpus 8 --no-out");
  CAPTURE(plan.err);
  CHECK(plan.code == 0);
  CHECK(plan.err.find("(576 of them for the image tokens); planning with --seq 3520") != std::string::npos);
  CHECK(plan.err.find("warning:") == std::string::npos);
  auto sim = run_cli("simulate --model llava-1.5-7b --gpus 8 --seq 4096 --json");
  CHECK(sim.code == 0);
  CHECK(count(sim.err, "warning: --seq 4096 plus 576 image tokens (4672) exceeds llava-1.5-7b's max_positions") == 1);
}
