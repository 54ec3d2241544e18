// `--kernels liger` through the CLI and the targets: plan.yaml carries it (and a plan without a library reads as
// before, no key), the report's plan line names it, ms-swift writes --use_liger_kernel true and reads it back, and the
// targets whose launch config cannot patch the model refuse it by knob with the nearest plan (kernels none).
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "export/target.hpp"
#include "planfile/plan_file.hpp"
#include "search_fixtures.hpp"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

std::string tmp_dir(const std::string& name) { return test::tmp_dir("fsdp_kernels", name); }

// `args` planned with --target `target` into a fresh directory `name`: the run required to succeed, its plan.yaml
// read, and the target's files read back into a strategy (Target::read).
struct Exported {
  std::string dir, out;
  PlanFile plan;
  Strategy back;
};
Exported exported(const std::string& args, const std::string& target, const std::string& version,
                  const std::string& name) {
  Exported e;
  e.dir = tmp_dir(name);
  auto r = test::run_cli(args + " --target " + target + " --out " + e.dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  e.out = r.out;
  e.plan = read_plan_file(e.dir + "/plan.yaml");
  e.back = target_by_name(target).read(e.dir, load_target_spec(FSDP_SOURCE_ROOT, target, version), e.plan.cluster);
  return e;
}

}  // namespace

TEST_CASE("kernels CLI: plan.yaml carries liger, swift writes --use_liger_kernel and reads it back") {
  const Exported sw = exported("--model qwen2-7b --hw a100-80gb --nodes 1 --gpus-per-node 4 --seq 8192 --kernels liger",
                               "swift", "v4.5", "swift");
  CHECK(sw.out.find("kernels=liger") != std::string::npos);
  CHECK(sw.plan.strategy.kernels == KernelLibrary::Liger);
  CHECK(test::slurp(sw.dir + "/plan.yaml").find("kernels: liger\n") != std::string::npos);
  CHECK(test::slurp(sw.dir + "/swift_sft.sh").find("--use_liger_kernel true") != std::string::npos);
  CHECK(sw.back.kernels == KernelLibrary::Liger);
  fs::remove_all(sw.dir);

  // accelerate: TrainingArguments use_liger_kernel in training_args.json, read back.
  const Exported acc = exported("--model qwen2-7b --hw a100-80gb --nodes 1 --seq 8192 --kernels liger", "accelerate",
                                "v1.14", "accelerate");
  CHECK(nlohmann::json::parse(test::slurp(acc.dir + "/training_args.json"))["use_liger_kernel"] == true);
  CHECK(acc.back.kernels == KernelLibrary::Liger);
  fs::remove_all(acc.dir);

  // Without a library: no key in plan.yaml, none in the script.
  const Exported plain =
      exported("--model qwen2-7b --hw a100-80gb --nodes 1 --gpus-per-node 4 --seq 8192", "swift", "v4.5", "plain");
  CHECK(test::slurp(plain.dir + "/plan.yaml").find("kernels: ") == std::string::npos);
  CHECK(test::slurp(plain.dir + "/swift_sft.sh").find("use_liger_kernel") == std::string::npos);
  CHECK(plain.plan.strategy.kernels == KernelLibrary::None);
  CHECK(plain.back.kernels == KernelLibrary::None);
  fs::remove_all(plain.dir);
}

TEST_CASE("kernels CLI: refused with the reason where the target, runtime or model cannot patch it") {
  // DeepSpeed's script_args.json names no kernel library: refused by knob, the nearest plan named.
  test::refusal(
      "--model qwen2-7b --hw a100-80gb --nodes 1 --seq 8192 --kernels liger --target "
      "deepspeed --no-out",
      {"deepspeed v0.19 cannot express kernels liger"});
  test::refusal("--model 8b --nodes 1 --kernels liger --runtime torchtitan --no-out",
                {"torchtitan does not apply Liger-Kernel"});
  test::refusal("--model deepseek-v2-lite --nodes 1 --kernels liger --runtime pytorch --no-out",
                {"Liger-Kernel has no patch for deepseek-v2-lite (model_type deepseek_v2)"});
  test::refusal("--model 8b --nodes 1 --kernels ligr --no-out", {"--kernels", "none, liger"});
}

TEST_CASE("kernels CLI: the plan report offers Liger where the runtime and model take it, --kernels left out") {
  const std::string args =
      "--model qwen2-7b --hw a100-80gb --nodes 1 --gpus-per-node 4 --seq 8192 --runtime "
      "transformers-deepspeed --tp 1 --pp 1 --no-out";
  auto j = test::run_cli(args + " --json");
  REQUIRE(j.code == 0);
  const nlohmann::json r = nlohmann::json::parse(j.out);
  REQUIRE(r.contains("liger_what_if"));
  CHECK(r["liger_what_if"]["config"]["kernels"] == "liger");
  // Leaner: the chosen plan's peak is its loss's backward over the fp32 logits, which Liger never builds.
  CHECK(r["liger_what_if"]["memory"]["device_total_bytes"].get<double>() <
        r["chosen"]["memory"]["device_total_bytes"].get<double>());
  auto text = test::run_cli(args);
  CHECK(text.out.find("--kernels liger would run this plan at") != std::string::npos);
  // Not offered where it cannot run (torchtitan's own model), nor where the user chose.
  for (const char* other : {"--model 8b --nodes 1 --runtime torchtitan --tp 1 --pp 1 --no-out --json",
                            "--model qwen2-7b --nodes 1 --runtime deepspeed --tp 1 --kernels none --no-out --json"}) {
    CAPTURE(other);
    auto x = test::run_cli(other);
    REQUIRE(x.code == 0);
    CHECK_FALSE(nlohmann::json::parse(x.out).contains("liger_what_if"));
  }
}
