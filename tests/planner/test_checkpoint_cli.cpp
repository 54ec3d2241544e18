// Checkpointing modes on the command line, in plan.yaml and in the reports (issue M12): every name round-trips
// exactly, a bad value is one line naming the flag or key with exit 2.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "planfile/plan_file.hpp"

using namespace fsdp;
using fsdp::test::refusal;
using fsdp::test::run_cli;
using fsdp::test::slurp;

namespace {

const std::string kSim = "simulate --model llama3-8b --hw h100-80gb --gpus 8 --strategy fsdp --micro-batch 1 ";

std::string tmp(const std::string& name) { return "/tmp/fsdp_ckpt_" + std::to_string(::getpid()) + "_" + name; }

}  // namespace

TEST_CASE("--act-ckpt: a bad value is one line naming the flag, exit 2") {
  for (const std::string bad :
       {"every:0", "every:x", "every:", "every:-1", "bogus", "every:33", "fraction:0", "fraction:2", "fraction:0.01"}) {
    CAPTURE(bad);
    const std::string err = refusal(kSim + "--act-ckpt " + bad, {"--act-ckpt"});
    CAPTURE(err);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }
  // Naming the values it takes (and the layer count where N is too large).
  CHECK(run_cli(kSim + "--act-ckpt every:x").err.find("selective-op") != std::string::npos);
  CHECK(run_cli(kSim + "--act-ckpt every:33").err.find("32 layers") != std::string::npos);
  CHECK(run_cli(kSim + "--act-ckpt every:x").err.find("fraction:P") != std::string::npos);
  // fms-fsdp's spacing checkpoints no layer of 32 below P = 1/64.
  CHECK(run_cli(kSim + "--act-ckpt fraction:0.01").err.find("checkpoints none of the model's 32 layers") !=
        std::string::npos);
}

TEST_CASE("--act-ckpt: every name reaches the JSON and text reports as given; every:1 is full") {
  for (const auto& [given, shown] : std::vector<std::pair<std::string, std::string>>{{"none", "none"},
                                                                                     {"full", "full"},
                                                                                     {"selective", "selective"},
                                                                                     {"selective-op", "selective-op"},
                                                                                     {"every:2", "every:2"},
                                                                                     {"every:1", "full"},
                                                                                     {"fraction:0.4", "fraction:0.4"},
                                                                                     {"fraction:1", "full"}}) {
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

TEST_CASE("plan.yaml and the HTML report carry every:N, fraction:P and selective-op; plan.yaml round-trips exactly") {
  for (const std::string mode : {"every:2", "fraction:0.4", "selective-op"}) {
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

TEST_CASE("fraction:P sits between none and full, and exports only where the framework runs it") {
  // Memory and time between none and full: 13 of 32 layers checkpointed (floor(32 x 0.4 + 1/2)).
  auto sim = [](const std::string& ck) {
    const auto r = run_cli(kSim + "--act-ckpt " + ck + " --json");
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  const auto none = sim("none"), part = sim("fraction:0.4"), full = sim("full");
  const double pn = none["memory"]["peak_bytes"], pp = part["memory"]["peak_bytes"], pf = full["memory"]["peak_bytes"];
  CHECK(pf < pp);
  CHECK(pp < pn);
  const double tn = none["time"]["step_s"], tp = part["time"]["step_s"], tf = full["time"]["step_s"];
  CHECK(tn < tp);
  CHECK(tp < tf);
  // fsdp-run runs it (its target lists fraction:P); torchtitan has no fractional mode: refused naming the knob.
  const std::string dir = tmp("export");
  std::filesystem::create_directories(dir);
  const auto ok = run_cli(
      "--model llama3-8b --hw h100-80gb --gpus 8 --strategy fsdp --micro-batch 1 --act-ckpt "
      "fraction:0.4 --target fsdp-run --out " +
      dir + "/plan.yaml");
  CAPTURE(ok.err);
  CHECK(ok.code == 0);
  CHECK(slurp(dir + "/plan.yaml").find("act_ckpt: fraction:0.4\n") != std::string::npos);
  const auto refused = run_cli(
      "--model llama3-8b --hw h100-80gb --gpus 8 --strategy fsdp --micro-batch 1 "
      "--act-ckpt fraction:0.4 --target torchtitan --out " +
      dir + "/plan.yaml");
  CHECK(refused.code != 0);
  CHECK(refused.err.find("fraction:0.4") != std::string::npos);
  std::filesystem::remove_all(dir);
}
