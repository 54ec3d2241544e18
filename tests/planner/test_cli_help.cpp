// `fsdp-plan --help` and `fsdp-plan simulate --help` name every flag the commands accept, read from the lists their
// parsers use (plan_value_flags, simulate_value_flags, ...): a new flag cannot be accepted but undocumented.
#include <doctest/doctest.h>
#include <unistd.h>

#include "cli/commands.hpp"
#include "cli/plan_command.hpp"
#include "cli_runner.hpp"

using fsdp::test::run_cli;

namespace {

void expect_names_every_flag(const std::string& command, const std::set<std::string>& values,
                             const std::set<std::string>& switches) {
  const auto r = run_cli(command + " --help");
  CAPTURE(command);
  REQUIRE(r.code == 0);
  for (const std::set<std::string>* flags : {&values, &switches})
    for (const std::string& f : *flags) {
      CAPTURE(f);
      CHECK(r.out.find(f) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("help: simulate and the planner name every flag they accept") {
  expect_names_every_flag("simulate", fsdp::simulate_value_flags(), fsdp::simulate_switch_flags());
  expect_names_every_flag("", fsdp::plan_value_flags(), fsdp::plan_switch_flags());
}

TEST_CASE("help: every subcommand prints its usage, and the planner's lists them all") {
  // `show --help` and `compare --help` were refused as unknown options, and `fsdp-plan --help` did not name compare or
  // validate, the prediction-against-measurement commands (before 2026-12-04).
  const auto top = run_cli("--help");
  REQUIRE(top.code == 0);
  for (const char* sub : {"simulate", "show", "export", "compare", "validate"}) {
    CAPTURE(sub);
    CHECK(top.out.find(std::string("fsdp-plan ") + sub) != std::string::npos);
    const auto r = run_cli(std::string(sub) + " --help");
    CAPTURE(r.err);
    CHECK(r.code == 0);
    CHECK(r.out.rfind(std::string("usage: fsdp-plan ") + sub, 0) == 0);
  }
}
