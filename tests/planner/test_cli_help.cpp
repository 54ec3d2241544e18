// `fsdp-plan --help` and `fsdp-plan simulate --help` name every flag the commands accept: the strategy flags come
// from the one list the parser reads (strategy_value_flags), so a new knob cannot be accepted but undocumented.
#include <doctest/doctest.h>
#include <unistd.h>

#include "cli/strategy_flags.hpp"
#include "cli_runner.hpp"

using fsdp::test::run_cli;

namespace {

void expect_names_every_flag(const std::string& command, const std::vector<std::string>& own_flags) {
  const auto r = run_cli(command + " --help");
  CAPTURE(command);
  REQUIRE(r.code == 0);
  for (const std::string& f : fsdp::strategy_value_flags()) {
    CAPTURE(f);
    CHECK(r.out.find(f + " ") != std::string::npos);
  }
  for (const std::string& f : own_flags) {
    CAPTURE(f);
    CHECK(r.out.find(f) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("help: simulate and the planner name every flag they accept") {
  expect_names_every_flag(
      "simulate", {"--model", "--hw", "--nodes", "--gpus-per-node", "--gpus", "--runtime", "--trace", "--config-root",
                   "--image-tokens", "--plan", "--json", "--memory-timeline", "--tp", "--pp"});
  expect_names_every_flag("", {"--model",
                               "--hw",
                               "--nodes",
                               "--gpus-per-node",
                               "--gpus",
                               "--runtime",
                               "--objective",
                               "--tokens",
                               "--memory-headroom",
                               "--top",
                               "--out",
                               "--trace",
                               "--config-root",
                               "--image-tokens",
                               "--global-batch-tokens",
                               "--max-micro-batch",
                               "--html",
                               "--target",
                               "--target-version",
                               "--json",
                               "--no-out"});
}
