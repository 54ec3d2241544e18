// `--attention flash3` (FlashAttention-3) and `--attention flex` (torch's flex_attention) through the CLI and the
// targets: the search counts the candidates FA3 cannot run (fp32), plan.yaml carries them, the plan report offers FA3
// as a what-if where the runtime and the GPU run it, and the targets write them as their framework calls them: ms-swift
// --attn_impl flash_attention_3, Transformers' attn_implementation "flash_attention_3" (accelerate), torchtitan
// a9c5edc's attn_backend "varlen" (FA3 on Hopper) and "flex", both block-causal over packed documents; the others
// refuse them by knob with the nearest plan.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "export/target.hpp"
#include "planfile/plan_file.hpp"
#include "search_fixtures.hpp"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

std::string tmp_dir(const std::string& name) { return test::tmp_dir("fsdp_attn", name); }

// `args` planned into `dir` (plan.yaml and the target's files): the plan, the run required to succeed.
PlanFile planned(const std::string& args, const std::string& dir) {
  auto r = test::run_cli(args + " --out " + dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  return read_plan_file(dir + "/plan.yaml");
}

}  // namespace

TEST_CASE("flash3 CLI: searched with its refusals counted, kept in plan.yaml, offered where it would run") {
  const std::string dir = tmp_dir("plan");
  auto r = test::run_cli("--model 8b --nodes 1 --hw h100-80gb --seq 8192 --runtime pytorch --attention flash3 --out " +
                         dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("x an attention kernel the runtime, dtype or head width do not run (--param-dtype: "
                   "FlashAttention-3 trains in bf16 or fp16, not fp32)") != std::string::npos);
  CHECK(r.out.find("attention flash3") != std::string::npos);
  CHECK(read_plan_file(dir + "/plan.yaml").strategy.attention == AttentionImpl::Flash3);
  CHECK(test::slurp(dir + "/plan.yaml").find("  attention: flash3\n") != std::string::npos);
  auto again = test::run_cli("simulate --plan " + dir + "/plan.yaml --json");
  REQUIRE(again.code == 0);
  CHECK(nlohmann::json::parse(again.out)["config"]["attention"] == "flash3");
  fs::remove_all(dir);
  // Left out on a Hopper with a runtime that calls FA3: the report says what it would give, faster at the same memory.
  auto offer = test::run_cli("--model 8b --nodes 1 --hw h100-80gb --seq 8192 --runtime pytorch --no-out --json");
  REQUIRE(offer.code == 0);
  const auto j = nlohmann::json::parse(offer.out);
  REQUIRE(j.contains("flash3_what_if"));
  const auto& chosen = j["chosen"];
  const auto& fa3 = j["flash3_what_if"];
  CHECK(fa3["attention"]["kernel"] == "flash3");
  CHECK(fa3["throughput"]["tokens_per_s_per_gpu"].get<double>() >
        chosen["throughput"]["tokens_per_s_per_gpu"].get<double>());
  CHECK(fa3["memory"]["device_total_bytes"] == chosen["memory"]["device_total_bytes"]);
  auto text = test::run_cli("--model 8b --nodes 1 --hw h100-80gb --seq 8192 --runtime pytorch --no-out");
  CHECK(text.out.find("--attention flash3 would run this plan at") != std::string::npos);
  // Not offered where it cannot run: an A100, fsdp-run.
  for (const char* other : {"--hw a100-80gb --runtime pytorch", "--hw h100-80gb"}) {
    CAPTURE(other);
    auto x = test::run_cli(std::string("--model 8b --nodes 1 --seq 8192 --no-out --json ") + other);
    REQUIRE(x.code == 0);
    CHECK_FALSE(nlohmann::json::parse(x.out).contains("flash3_what_if"));
  }
  // Asked for where it cannot run: the GPU named, exit 2.
  test::refusal("--model 8b --nodes 1 --hw a100-80gb --runtime pytorch --attention flash3 --no-out",
                {"a100-80gb has compute capability 8.0; FlashAttention-3 is built for Hopper"});
}

TEST_CASE("flash3 export: swift and accelerate write flash_attention_3, torchtitan a9c5edc varlen") {
  const std::string dir = tmp_dir("swift");
  planned(
      "--model qwen2-7b --nodes 1 --hw h100-80gb --method lora --lora-rank 16 --target swift --attention flash3 "
      "--doc-len 1024",
      dir);
  const std::string script = test::slurp(dir + "/swift_sft.sh");
  CHECK(script.find("--attn_impl flash_attention_3") != std::string::npos);
  CHECK(script.find("--packing true") != std::string::npos);
  fs::remove_all(dir);

  const std::string acc = tmp_dir("accelerate");
  planned("--model 8b --nodes 1 --hw h100-80gb --target accelerate --attention flash3", acc);
  CHECK(nlohmann::json::parse(test::slurp(acc + "/script_args.json"))["attn_implementation"] == "flash_attention_3");
  fs::remove_all(acc);

  const std::string tt = tmp_dir("torchtitan");
  const PlanFile plan = planned(
      "--model 8b --nodes 1 --hw h100-80gb --seq 8192 --target torchtitan --target-version python-a9c5edc "
      "--attention flash3 --doc-len 1024",
      tt);
  CHECK(plan.runtime == "torchtitan-2606");
  CHECK(plan.strategy.doc_len == 1024);
  const std::string py = test::slurp(tt + "/fsdp_plan_config.py");
  CHECK(py.find("config.model_spec = model_registry(\"8B\", attn_backend=\"varlen\")") != std::string::npos);
  // Read back: varlen is flash3.
  const TargetSpec spec = load_target_spec(FSDP_SOURCE_ROOT, "torchtitan", "python-a9c5edc");
  const Strategy back = target_by_name("torchtitan").read(tt, spec, plan.cluster);
  CHECK(back.attention == AttentionImpl::Flash3);
  fs::remove_all(tt);

  // torchtitan with sdpa (its causal mask) keeps one document a sequence; DeepSeek-V3's MLA heads stay on sdpa.
  test::refusal(
      "--model 8b --nodes 1 --hw h100-80gb --seq 8192 --target torchtitan --target-version python-a9c5edc "
      "--attention sdpa --doc-len 1024 --no-out",
      {"use --attention flash (or flash3, flex) with --doc-len"});
  test::refusal(
      "--model deepseek-v3 --nodes 32 --hw h100-80gb --target torchtitan --target-version python-a9c5edc "
      "--attention flash3 --no-out",
      {"cannot express attention flash3", "it expresses sdpa, flex"});
  // Targets whose framework does not call FA3 refuse it by knob, naming the nearest.
  for (const char* target : {"torchtune", "torchtitan"}) {
    CAPTURE(target);
    test::refusal(std::string("--model 8b --nodes 1 --hw h100-80gb --attention flash3 --no-out --target ") + target,
                  {"cannot express attention flash3"});
  }
}

TEST_CASE("flex export: torchtitan a9c5edc writes attn_backend flex, DeepSeek-V3's own, and reads it back") {
  const std::string tt = tmp_dir("flex");
  const PlanFile plan = planned(
      "--model 8b --nodes 1 --hw a100-80gb --seq 8192 --target torchtitan --target-version python-a9c5edc "
      "--attention flex --doc-len 2048",
      tt);
  CHECK(plan.strategy.attention == AttentionImpl::Flex);
  CHECK(plan.strategy.doc_len == 2048);
  CHECK(test::slurp(tt + "/fsdp_plan_config.py").find("model_registry(\"8B\", attn_backend=\"flex\")") !=
        std::string::npos);
  const TargetSpec spec = load_target_spec(FSDP_SOURCE_ROOT, "torchtitan", "python-a9c5edc");
  CHECK(target_by_name("torchtitan").read(tt, spec, plan.cluster).attention == AttentionImpl::Flex);
  fs::remove_all(tt);
  // DeepSeek-V3: flex is its function's own backend; flash3 (varlen) is refused with flex as the nearest.
  auto dsv3 = test::run_cli(
      "--model deepseek-v3 --nodes 32 --hw h100-80gb --target torchtitan --target-version python-a9c5edc "
      "--attention flex --no-out");
  CAPTURE(dsv3.err);
  CHECK(dsv3.code == 0);
  // Runtimes that do not call it refuse it before the search, naming the flag.
  test::refusal("--model 8b --nodes 1 --hw h100-80gb --runtime pytorch --attention flex --no-out",
                {"--attention: pytorch does not run flex_attention"});
  test::refusal("--model qwen2-7b --nodes 1 --hw h100-80gb --target swift --attention flex --no-out",
                {"cannot express attention flex"});
}
