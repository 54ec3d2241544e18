// Checkpointing modes on the command line, in plan.yaml and in the reports (issue M12): every name round-trips
// exactly, a bad value is one line naming the flag or key with exit 2.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "planfile/plan_file.hpp"

using namespace fsdp;
using fsdp::test::run_cli;
using fsdp::test::slurp;

namespace {

const std::string kSim = "simulate --model llama3-8b --hw h100-80gb --gpus 8 --strategy fsdp --micro-batch 1 ";

std::string tmp(const std::string& name) { return "/tmp/fsdp_ckpt_" + std::to_string(::getpid()) + "_" + name; }

}  // namespace

TEST_CASE("--act-ckpt: a bad value is one line naming the flag, exit 2") {
  for (const std::string bad : {"every:0", "every:x", "every:", "every:-1", "bogus", "every:33"}) {
    const auto r = run_cli(kSim + "--act-ckpt " + bad);
    CAPTURE(bad);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("--act-ckpt") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("internal error") == std::string::npos);
  }
  // Naming the values it takes (and the layer count where N is too large).
  CHECK(run_cli(kSim + "--act-ckpt every:x").err.find("selective-op") != std::string::npos);
  CHECK(run_cli(kSim + "--act-ckpt every:33").err.find("32 layers") != std::string::npos);
}

TEST_CASE("--act-ckpt: every name reaches the JSON and text reports as given; every:1 is full") {
  for (const auto& [given, shown] : std::vector<std::pair<std::string, std::string>>{{"none", "none"},
                                                                                     {"full", "full"},
                                                                                     {"selective", "selective"},
                                                                                     {"selective-op", "selective-op"},
                                                                                     {"every:2", "every:2"},
                                                                                     {"every:1", "full"}}) {
    CAPTURE(given);
    const auto r = run_cli(kSim + "--act-ckpt " + given + " --json");
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["config"]["act_ckpt"] == shown);
    const auto text = run_cli(kSim + "--act-ckpt " + given);
    REQUIRE(text.code == 0);
    CHECK(text.out.find("ckpt=" + shown) != std::string::npos);
  }
}

TEST_CASE("plan.yaml and the HTML report carry every:N and selective-op; plan.yaml round-trips exactly") {
  for (const std::string mode : {"every:2", "selective-op"}) {
    CAPTURE(mode);
    const std::string plan = tmp("plan.yaml"), html = tmp("report.html");
    const auto r = run_cli("--model llama3-8b --hw h100-80gb --gpus 8 --strategy fsdp --micro-batch 1 --act-ckpt " +
                           mode + " --out " + plan + " --html " + html + " --json");
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    for (const auto& c : j["candidates"]) CHECK(c["config"]["act_ckpt"] == mode);
    const std::string text = slurp(plan);
    CHECK(text.find("act_ckpt: " + mode + "\n") != std::string::npos);
    const PlanFile p = read_plan_file(plan);
    CHECK(act_ckpt_name(p.strategy) == mode);
    CHECK(write_plan_text(parse_plan_text(write_plan_text(p), "again")) == write_plan_text(p));
    CHECK(slurp(html).find(mode) != std::string::npos);
    // Re-simulating the plan gives the prediction it carries.
    const auto sim = run_cli("simulate --plan " + plan + " --json");
    REQUIRE(sim.code == 0);
    CHECK(nlohmann::json::parse(sim.out)["memory"]["peak_bytes"].get<double>() ==
          doctest::Approx(j["chosen"]["memory"]["peak_bytes"].get<double>()));
    // A bad value in the file names the key.
    std::string bad = text;
    bad.replace(bad.find("act_ckpt: " + mode), 10 + mode.size(), "act_ckpt: every:0");
    CHECK_THROWS_WITH_AS(parse_plan_text(bad, "p.yaml"), doctest::Contains("act_ckpt"), InputError);
    std::remove(plan.c_str());
    std::remove(html.c_str());
  }
}
