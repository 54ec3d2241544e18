// torchtitan's models beyond Llama 3 (configs/targets/torchtitan/*.yaml, models): Qwen3 on v0.2.2, predicted with its
// own runtime (rotate_half rotary) and refused pipelining, as torchtitan refuses it; DeepSeek-V3 on the Python config
// at a9c5edc with expert parallelism; and that Python config runs what the plan is priced as (SDPA, the whole-logits
// loss, eager) where the model functions set otherwise. A models-table entry's runtime and capabilities
// (TargetSpec::for_model) are what the search, the export and the nearest plan read.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "export/export_plan.hpp"
#include "export/knob_table.hpp"
#include "planfile/plan_file.hpp"
#include "report/plan_simulation.hpp"
#include "runtime/runtime_profile.hpp"
#include "search_fixtures.hpp"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

std::string tmp_dir(const std::string& name) { return test::tmp_dir("fsdp_titan_models", name); }

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = test::slurp(path);
  REQUIRE(text.find(from) != std::string::npos);
  text.replace(text.find(from), from.size(), to);
  std::ofstream(path) << text;
}

// `fsdp-plan --model M --nodes N --hw h100-80gb --target torchtitan --target-version python-a9c5edc --out
// DIR/plan.yaml`: the plan it writes (the Python config beside it).
PlanFile plan_on_python_target(const std::string& model, int nodes, const std::string& dir) {
  auto r =
      test::run_cli("--model " + model + " --nodes " + std::to_string(nodes) +
                    " --hw h100-80gb --target torchtitan --target-version python-a9c5edc --out " + dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  return read_plan_file(dir + "/plan.yaml");
}

}  // namespace

TEST_CASE("torchtitan models: an entry's runtime and knob rules apply to its model alone") {
  const TargetSpec spec = load_target_spec(kRoot, "torchtitan", "v0.2.2");
  for (const char* qwen : {"qwen3-8b", "qwen3-30b-a3b"}) {
    CAPTURE(qwen);
    const TargetSpec q = spec.for_model(qwen);
    CHECK(q.runtime == "torchtitan-2510-qwen3");
    const KnobRule* pp = q.rule("pp", StrategyKind::Fsdp);
    REQUIRE(pp != nullptr);
    CHECK(rule_admits(*pp, "1"));
    CHECK_FALSE(rule_admits(*pp, "2"));
    CHECK(pp->source.path == "torchtitan/models/qwen3/__init__.py");
  }
  // At a9c5edc Qwen3 rotates in fp32 (CosSinRoPE) and pipelines (pipelining_fn pipeline_llm): its entry sets the
  // runtime only.
  const TargetSpec py = load_target_spec(kRoot, "torchtitan", "python-a9c5edc").for_model("qwen3-30b-a3b");
  CHECK(py.runtime == "torchtitan-2606-qwen3");
  CHECK(rule_admits(*py.rule("pp", StrategyKind::Fsdp), "2"));
  // Llama 3 keeps the target's runtime and pipelines.
  const TargetSpec llama = spec.for_model("llama3-70b");
  CHECK(llama.runtime == "torchtitan-2510");
  CHECK(rule_admits(*llama.rule("pp", StrategyKind::Fsdp), "8"));
  // The Qwen3 runtime is the Llama one but for the rotary kernel: rotate_half in the compute dtype, not complex fp32.
  const RuntimeProfile titan = load_runtime("torchtitan-2510", kRoot);
  const RuntimeProfile qwen = load_runtime("torchtitan-2510-qwen3", kRoot);
  CHECK(titan.rotary_kernel == RotaryKernel::Complex);
  CHECK(qwen.rotary_kernel != RotaryKernel::Complex);
  CHECK(qwen.rotary_kernel != RotaryKernel::FlashAttnInPlace);
  CHECK(qwen.adamw_bytes_per_param == titan.adamw_bytes_per_param);
  CHECK(qwen.fragmentation_fraction == titan.fragmentation_fraction);
}

TEST_CASE("torchtitan models: Qwen3-30B-A3B plans on its runtime, exports ep to job.toml and reads back") {
  const std::string dir = tmp_dir("qwen3_moe");
  auto r =
      test::run_cli("--model qwen3-30b-a3b --nodes 2 --hw h100-80gb --target torchtitan --out " + dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("predicted with runtime torchtitan-2510-qwen3") != std::string::npos);
  const PlanFile plan = read_plan_file(dir + "/plan.yaml");
  CHECK(plan.runtime == "torchtitan-2510-qwen3");
  CHECK(plan.strategy.mesh.pp == 1);
  const TargetSpec spec = load_target_spec(kRoot, "torchtitan", "v0.2.2");
  const auto files = read_export(dir, spec);
  const FlatDoc& d = files.at("job.toml");
  CHECK(doc_get(d, "model.name", "job.toml") == "qwen3");
  CHECK(doc_get(d, "model.flavor", "job.toml") == "30B-A3B");
  CHECK(doc_get(d, "model.hf_assets_path", "job.toml") == "./assets/hf/Qwen3-30B-A3B");
  CHECK(doc_get(d, "parallelism.expert_parallel_degree", "job.toml") == plan.strategy.mesh.ep);
  CHECK(strategy_identity(import_export(dir, spec, plan.cluster)) == strategy_identity(plan.strategy));
  // Exported later from plan.yaml, the same runtime predicts it.
  auto ex = test::run_cli("export " + dir + "/plan.yaml --to torchtitan --out " + dir + "/again");
  CAPTURE(ex.err);
  REQUIRE(ex.code == 0);
  CHECK(ex.out.find("predicted with runtime torchtitan-2510-qwen3") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("torchtitan models: a pipeline for Qwen3 is refused by name, on the search and on export") {
  test::refusal("--model qwen3-8b --nodes 2 --hw h100-80gb --target torchtitan --pp 2 --no-out",
                {"--pp: torchtitan v0.2.2 cannot express pp 2", "Qwen3's TrainSpec has no pipelining_fn"});
  // A pp plan made without the target is refused at export, with the nearest plan torchtitan runs for the model.
  auto setup = test::search_setup("qwen3-8b", "h100-80gb", 2, "torchtitan-2510-qwen3");
  const Strategy s = test::fsdp_full_ckpt_plan(8, 1, 2);
  const PlanFile plan = plan_file_for(setup->graph->spec(), setup->hw, setup->req.cluster, "torchtitan-2510-qwen3", s);
  const TargetSpec spec = load_target_spec(kRoot, "torchtitan", "v0.2.2");
  CHECK_THROWS_WITH_AS(export_plan(plan, spec, kRoot),
                       doctest::Contains("pp 2: Qwen3's TrainSpec has no pipelining_fn"), InputError);
  CHECK_THROWS_WITH_AS(export_plan(plan, spec, kRoot), doctest::Contains("on runtime torchtitan-2510-qwen3"),
                       InputError);
}

TEST_CASE("torchtitan a9c5edc: the Python config runs what the plan is priced as, 405B's compile and async TP off") {
  // llama3_405b() compiles the model with async tensor parallelism and Float8 linears, and every config function
  // chunks the loss: the written function puts back SDPA, the whole-logits cross-entropy and eager execution.
  auto setup = test::search_setup("llama3.1-405b", "h100-80gb", 16, "torchtitan-2510");
  const Strategy s = test::fsdp_full_ckpt_plan(16, 8, 2);
  const TargetSpec py = load_target_spec(kRoot, "torchtitan", "python-a9c5edc");
  const PlanFile plan = plan_file_for(setup->graph->spec(), setup->hw, setup->req.cluster, py.runtime, s);
  const ExportResult ex = export_plan(plan, py, kRoot);
  const WrittenFile& f = ex.files.front();
  const FlatDoc& d = f.keys;
  CHECK(doc_get(d, "config", "p") == "llama3_405b()");
  CHECK(doc_get(d, "model_spec", "p") == "model_registry(\"405B\", attn_backend=\"sdpa\")");
  CHECK(doc_get(d, "loss", "p") == "CrossEntropyLoss.Config()");
  CHECK(doc_get(d, "compile", "p") == "CompileConfig()");
  CHECK(doc_get(d, "parallelism.enable_async_tensor_parallel", "p") == false);
  CHECK(doc_get(d, "parallelism.enable_sequence_parallel", "p") == true);
  CHECK(doc_get(d, "hf_assets_path", "p") == "./assets/hf/Llama-3.1-405B");
  // The schedule's micro-batches: 16 of one sequence in local_batch_size, pipeline_parallel_microbatch_size 1.
  CHECK(doc_get(d, "training.local_batch_size", "p") == 16);
  CHECK(doc_get(d, "parallelism.pipeline_parallel_microbatch_size", "p") == 1);
  CHECK(doc_get(d, "training.global_batch_size", "p") == 16 * 8);
  CHECK(doc_get(d, "activation_checkpoint.mode", "p") == "full");
  bool imports_loss = false, imports_compile = false;
  for (const auto& line : f.header) {
    imports_loss |= line == "from torchtitan.components.loss import CrossEntropyLoss";
    imports_compile |= line == "from torchtitan.config import CompileConfig";
  }
  CHECK(imports_loss);
  CHECK(imports_compile);
  const std::string dir = tmp_dir("py405");
  write_export(ex, py, dir);
  CHECK(strategy_identity(import_export(dir, py, plan.cluster)) == strategy_identity(s));
  // A function edited to compile, or to let the compiler choose what to save, is not the plan: refused by name.
  const std::string path = dir + "/fsdp_plan_config.py";
  const std::string text = test::slurp(path);
  replace_in_file(path, "config.compile = CompileConfig()", "config.compile = CompileConfig(enable=True)");
  CHECK_THROWS_WITH_AS(import_export(dir, py, plan.cluster), doctest::Contains("compile"), InputError);
  std::ofstream(path) << text;
  replace_in_file(path, "config.activation_checkpoint.mode = \"full\"",
                  "config.activation_checkpoint.mode = \"memory_budget\"");
  CHECK_THROWS_WITH_AS(import_export(dir, py, plan.cluster),
                       doctest::Contains("activation_checkpoint.mode = \"memory_budget\""), InputError);
  fs::remove_all(dir);
}

TEST_CASE("torchtitan a9c5edc: DeepSeek-V3 on 32 H100 nodes plans with experts split and exports its function") {
  const std::string dir = tmp_dir("dsv3");
  const PlanFile plan = plan_on_python_target("deepseek-v3", 32, dir);
  CHECK(plan.runtime == "torchtitan-2606");
  REQUIRE(plan.strategy.mesh.ep > 1);
  const TargetSpec py = load_target_spec(kRoot, "torchtitan", "python-a9c5edc");
  const auto files = read_export(dir, py);
  const FlatDoc& d = files.at("fsdp_plan_config.py");
  CHECK(doc_get(d, "config", "p") == "deepseek_v3_671b()");
  CHECK(doc_get(d, "model_spec", "p") == "model_registry(\"671B\", attn_backend=\"sdpa\")");
  CHECK(doc_get(d, "parallelism.expert_parallel_degree", "p") == plan.strategy.mesh.ep);
  const std::string text = test::slurp(dir + "/fsdp_plan_config.py");
  CHECK(text.find("from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_671b") != std::string::npos);
  CHECK(strategy_identity(import_export(dir, py, plan.cluster)) == strategy_identity(plan.strategy));
  // Qwen3-30B-A3B exports there too, by its own function, on its own runtime (plan.yaml's directory created).
  CHECK(plan_on_python_target("qwen3-30b-a3b", 2, dir + "/qwen").runtime == "torchtitan-2606-qwen3");
  const std::string qtext = test::slurp(dir + "/qwen/fsdp_plan_config.py");
  CHECK(qtext.find("config = qwen3_30b_a3b()") != std::string::npos);
  CHECK(qtext.find("config.model_spec = model_registry(\"30B-A3B\", attn_backend=\"sdpa\")") != std::string::npos);
  // The TOML release runs DeepSeek-V3 with flex attention only (its flavors fix attn_type "flex"): not named there.
  test::refusal("--model deepseek-v3 --nodes 32 --hw h100-80gb --target torchtitan --no-out",
                {"has no name for model 'deepseek-v3'",
                 // The version that names it is said.
                 "--target-version python-a9c5edc names it"});
  fs::remove_all(dir);
}
