// The planner's choices on known cases, the JSON report's shape, and plan.yaml round trips.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "planfile/plan_file.hpp"
#include "report/plan_report.hpp"
#include "search/plan_search.hpp"
#include "search_space.hpp"

using namespace fsdp;
using fsdp::test::refusal;
using fsdp::test::run_cli;

namespace {

nlohmann::json plan_json(const std::string& args) {
  auto r = run_cli(args + " --json --no-out");
  CAPTURE(args);
  CAPTURE(r.err);
  REQUIRE(r.code <= 1);
  return nlohmann::json::parse(r.out);
}

// A family's verdict; a family the runtime runs identically to another (fsdp and zero3 under fsdp-run) points at
// that one's entry with `same_as` (report/identical_plans.hpp) instead of repeating its numbers.
const nlohmann::json& family_entry(const nlohmann::json& families, const std::string& name) {
  const auto& v = families[name];
  if (v.contains("same_as")) {
    CHECK(families[v["same_as"].get<std::string>()]["strategy_names"].dump().find("\"" + name + "\"") !=
          std::string::npos);
    return families[v["same_as"].get<std::string>()];
  }
  return v;
}

int64_t num_layers(const std::string& model) { return load_model(model, FSDP_SOURCE_ROOT).num_layers; }

// The strategy families in the order the planner prefers them on a near-tie (plan_search.cpp: fewer collectives
// per step and less state first): ddp, no-shard, zero1, zero2, fsdp-grad-op, fsdp, zero3, hsdp.
int simplicity(const std::string& family) {
  const char* order[] = {"ddp", "no-shard", "zero1", "zero2", "fsdp-grad-op", "fsdp", "zero3", "hsdp"};
  for (int i = 0; i < 8; ++i)
    if (family == order[i]) return i;
  FAIL("unknown family " << family);
  return -1;
}

// The family the documented rule chooses (plan_search.cpp, README "Planner defaults"): among the plans within
// 5% of the best throughput, the simplest strategy. A family has such a plan exactly when its best does, and
// the strategy orders the simplicity rank before offload does, so it is the simplest family whose best is
// within 5% of the best family's.
std::string expected_family(const nlohmann::json& families) {
  double top = 0;
  for (const auto& [name, v] : families.items())
    if (v["feasible"] == true && !v.contains("same_as"))
      top = std::max(top, v["best"]["throughput"]["tokens_per_s_per_gpu"].get<double>());
  REQUIRE(top > 0);
  std::string pick;
  for (const auto& [name, v] : families.items()) {
    if (v["feasible"] != true || v.contains("same_as")) continue;
    const double t = v["best"]["throughput"]["tokens_per_s_per_gpu"].get<double>();
    // The rule measures from the top plan after ties within 0.1% are resolved: stay clear of the edge.
    CAPTURE(name);
    REQUIRE(std::fabs(t / top - 0.95) > 2e-3);
    if (t >= 0.95 * top && (pick.empty() || simplicity(name) < simplicity(pick))) pick = name;
  }
  return pick;
}

}  // namespace

TEST_CASE("llama2-7b full fine-tuning on one a100-80gb node: no DDP (112 GB of model states), sharding fits") {
  auto j = plan_json("--model llama2-7b --nodes 1 --tp 1 --pp 1");
  const double P = 6'738'415'616;  // Llama 2 7B (test_model_zoo.cpp)
  const double budget = j["search"]["budget_bytes"].get<double>();
  // 80 GiB usable less the 5% headroom.
  CHECK(budget == doctest::Approx(81920.0 * (1 << 20) * 0.95));
  // Every family has a verdict. Replicas keep 16 bytes per parameter (fp32 params and grads, two Adam
  // states): 6.74e9 x 16 = 100.4 GiB > 76 GiB, so ddp and no-shard cannot fit, and say so with the numbers.
  // hsdp needs a shard group smaller than the world, so more than one node. The other five fit: the
  // replicated-parameter ZeRO stages with the optimizer states on the host hold 8 bytes per parameter
  // (50.2 GiB) and the rest shard more.
  REQUIRE(j["families"].size() == 8);
  for (const std::string f : {"ddp", "no-shard"}) {
    CAPTURE(f);
    const auto& v = family_entry(j["families"], f);
    CHECK(v["feasible"] == false);
    CHECK(v["needed_bytes"].get<double>() > 16.0 * P);
    CHECK(v["needed_bytes"].get<double>() > budget);
    CHECK(v["reason"].get<std::string>().find("does not fit") != std::string::npos);
    CHECK(v["reason"].get<std::string>().find("optimizer_states") != std::string::npos);
  }
  CHECK(j["families"]["hsdp"]["feasible"] == false);
  CHECK(j["families"]["hsdp"]["reason"].get<std::string>().find("needs more than one node") != std::string::npos);
  for (const std::string f : {"zero1", "zero2", "fsdp", "zero3", "fsdp-grad-op"}) {
    CAPTURE(f);
    const auto& v = family_entry(j["families"], f);
    CHECK(v["feasible"] == true);
    const auto& names = v["strategy_names"];
    CHECK(std::find(names.begin(), names.end(), f) != names.end());
    CHECK(v["best"]["config"]["strategy"] == names.front());
    CHECK(v["best"]["memory"]["device_total_bytes"].get<double>() <= budget);
  }
  // fsdp-run runs zero3 as FSDP's FULL_SHARD: one entry, both names (README "Plans under two names").
  CHECK(j["families"]["zero3"]["same_as"] == "fsdp");
  // The chosen plan is the one the near-tie rule picks from these verdicts.
  CHECK(j["chosen"]["config"]["strategy"] == expected_family(j["families"]));
  CHECK(j["chosen"]["fits"] == true);
  CHECK(j["chosen"]["memory"]["peak_bytes"].get<double>() > 0);
  // Exhaustive: every point of the space (search_space.hpp) is evaluated or pruned. On one node of 8 GPUs with
  // a 32-layer model: ddp, no-shard 3 x 3 = 9 each; zero1, zero2 3 ckpt x 2 offloads x 3 dtypes = 18 each;
  // fsdp, zero3 4 wraps x 2 reshards x 3 x 3 x 3 = 216 each; fsdp-grad-op 108; hsdp none; 594 lines of 7
  // micro-batches (1..64): 4,158.
  const int64_t space = fsdp::test::search_space_size(num_layers("llama2-7b"), Cluster{1, 8}, SearchPins{}, 64);
  CHECK(space == 4158);
  CHECK(j["search"]["evaluated"].get<int64_t>() + j["search"]["pruned"].get<int64_t>() == space);
  // Micro-batch 1 is never pruned (nothing is evaluated before it), so every line evaluates at least once.
  CHECK(j["search"]["evaluated"].get<int64_t>() >= space / 7);
}

TEST_CASE("llama3-70b on 8 a100-80gb nodes: the README's search, every point evaluated or pruned") {
  auto j = plan_json("--model llama3-70b --nodes 8 --tp 1 --pp 1");
  // 64 GPUs: hsdp adds shard groups of 8, 16 and 32: 3 x 4 x 2 x 3 x 3 x 3 = 648 lines to the 594 above.
  const int64_t space = fsdp::test::search_space_size(num_layers("llama3-70b"), Cluster{8, 8}, SearchPins{}, 64);
  CHECK(space == (594 + 648) * 7);
  CHECK(j["search"]["evaluated"].get<int64_t>() + j["search"]["pruned"].get<int64_t>() == space);
  CHECK(j["families"].size() == 8);
  for (const auto& [name, v] : j["families"].items()) {
    CAPTURE(name);
    if (v["feasible"] != true && !v.contains("same_as")) CHECK(!v["reason"].get<std::string>().empty());
  }
  CHECK(j["chosen"]["config"]["strategy"] == expected_family(j["families"]));
}

TEST_CASE("llama2-70b on 8 a100-80gb nodes fits with FSDP and no offload") {
  auto j = plan_json("--model llama2-70b --nodes 8");
  CHECK(j["families"]["fsdp"]["feasible"] == true);
  CHECK(j["families"]["fsdp"]["best"]["config"]["offload"] == "none");
  CHECK(j["chosen"]["config"]["offload"] == "none");
  CHECK(j["chosen"]["time"]["step_s"].get<double>() > 0);
}

TEST_CASE("near-ties: a plan without tp or pp goes before a mesh plan within 5% of its rate") {
  // 70B on 16 A100 nodes: FSDP + TP 4 without checkpointing rates best, 1-D FSDP with full checkpointing within 5%
  // of it.
  auto j = plan_json("--model 70b --nodes 16");
  const auto& chosen = j["chosen"]["config"];
  CHECK(chosen["tp"] == 1);
  CHECK(chosen["pp"] == 1);
  double best_mesh = 0;
  for (const auto& [shape, v] : j["meshes"].items())
    if (v["feasible"] == true && shape != "tp=1 pp=1")
      best_mesh = std::max(best_mesh, v["best"]["throughput"]["tokens_per_s_per_gpu"].get<double>());
  const double rate = j["chosen"]["throughput"]["tokens_per_s_per_gpu"].get<double>();
  CHECK(best_mesh > rate);
  CHECK(rate >= 0.95 * best_mesh);
  // The report says why: the faster plan and the rule.
  CHECK(j["near_tie_faster"]["throughput"]["tokens_per_s_per_gpu"].get<double>() == doctest::Approx(best_mesh));
  auto r = run_cli("--model 70b --nodes 16 --no-out");
  CHECK(r.out.find("near-tie: fsdp wrap=every:2 ckpt=none") != std::string::npos);
  CHECK(r.out.find("within 5% the simpler plan is chosen") != std::string::npos);
  // Not under another objective, which ranks by something else.
  CHECK_FALSE(plan_json("--model 70b --nodes 16 --objective memory").contains("near_tie_faster"));
}

TEST_CASE("offload under tp or pp: searched in a second pass when nothing fits without it, or when pinned") {
  // 70B on 8 nodes fits without offload: the meshes are searched without it (one pass).
  auto fits = plan_json("--model 70b --nodes 8");
  CHECK(fits["search"]["mesh_offload_searched"] == false);
  CHECK(fits["chosen"]["config"]["offload"] == "none");
  // 405B on 4 nodes of H100 at 8k tokens: nothing fits without offload, data parallel alone not even with it; the
  // second pass finds FSDP x TP with the parameters offloaded.
  auto short_of_memory = plan_json("--model 405b --nodes 4 --hw h100-80gb --seq 8192");
  CHECK(short_of_memory["search"]["mesh_offload_searched"] == true);
  CHECK(short_of_memory["chosen"]["config"]["offload"] != "none");
  CHECK(short_of_memory["chosen"]["config"]["tp"].get<int64_t>() > 1);
  // Pinned, one pass searches it everywhere.
  auto pinned = plan_json("--model 70b --nodes 8 --offload optimizer");
  CHECK(pinned["search"]["mesh_offload_searched"] == true);
  CHECK(pinned["chosen"]["config"]["offload"] == "optimizer");
}

TEST_CASE("no plan fits: the report names the parallelism such a model trains with that is not modelled") {
  // DeepSeek-V3 on 32 nodes of H100: a MoE layer's experts gathered whole (11B parameters) do not fit, and the
  // expert parallelism it trains with is not modelled; neither is tp of its MLA.
  auto j = plan_json("--model deepseek-v3 --nodes 32 --hw h100-80gb");
  REQUIRE(j["chosen"].is_null());
  const std::string notes = j["not_modelled"].dump();
  CHECK(notes.find("expert parallelism") != std::string::npos);
  CHECK(notes.find("multi-head latent attention") != std::string::npos);
  auto r = run_cli("--model deepseek-v3 --nodes 32 --hw h100-80gb --no-out");
  CHECK(r.out.find("Not modelled: expert parallelism") != std::string::npos);
  // A dense model has nothing to add.
  CHECK(unmodelled_parallelism(load_model("llama3-70b", FSDP_SOURCE_ROOT)).empty());
}

TEST_CASE("llama2-70b on one a100-80gb node needs offload and says how much host RAM") {
  auto r = run_cli("--model llama2-70b --nodes 1 --no-out --tp 1 --pp 1");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("offload=params") != std::string::npos);
  CHECK(r.out.find("host RAM per node") != std::string::npos);
  auto j = plan_json("--model llama2-70b --nodes 1");
  CHECK(j["chosen"]["config"]["offload"] != "none");
  double host = j["chosen"]["memory"]["host_bytes_per_node"];
  // At least the fp32 master copy and Adam states of 69B parameters: 12 bytes each.
  CHECK(host > 12.0 * 68.9e9);
  CHECK(j["families"]["fsdp"]["best"]["config"]["offload"] != "none");
}

TEST_CASE("gpt2 on one node: every family fits and the near-tie rule picks the simplest") {
  auto j = plan_json("--model gpt2 --nodes 1 --tp 1 --pp 1");
  // 124M parameters: 2 GB of model states even replicated, so every family but hsdp (one node) fits.
  REQUIRE(j["families"].size() == 8);
  for (const auto& [name, v] : j["families"].items()) {
    CAPTURE(name);
    CHECK(v["feasible"] == (name != "hsdp"));
  }
  // ddp is the simplest family, so it is chosen whenever its best is within 5% of the best plan.
  const std::string expected = expected_family(j["families"]);
  CHECK(j["chosen"]["config"]["strategy"] == expected);
  MESSAGE("gpt2 on 8 GPUs: chosen " << expected);
}

TEST_CASE("pins narrow the search to exactly the pinned space") {
  auto j = plan_json("--model llama3-8b --nodes 2 --strategy fsdp --act-ckpt full --micro-batch 1 --tp 1 --pp 1");
  for (const auto& c : j["candidates"]) {
    CHECK(c["config"]["strategy"] == "fsdp");
    CHECK(c["config"]["act_ckpt"] == "full");
    CHECK(c["config"]["micro_batch"] == 1);
  }
  CHECK(j["families"].size() == 1);
  // fsdp alone: 4 wraps x 2 reshards x 1 ckpt x 3 offloads x 3 dtypes x 1 micro-batch = 72 points.
  SearchPins pins;
  pins.strategy = StrategyKind::Fsdp;
  pins.act_ckpt = ActCkpt::Full;
  pins.micro_batch = 1;
  const int64_t space = fsdp::test::search_space_size(num_layers("llama3-8b"), Cluster{2, 8}, pins, 64);
  CHECK(space == 72);
  CHECK(j["search"]["evaluated"].get<int64_t>() + j["search"]["pruned"].get<int64_t>() == space);
}

TEST_CASE("--nodes auto finds the fewest nodes") {
  auto r = run_cli("--model llama3-70b --nodes auto --offload none --tp 1 --pp 1 --no-out --json");
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  int64_t nodes = j["cluster"]["nodes"];
  CHECK(nodes >= 2);
  // One node fewer has no feasible plan without offload.
  auto fewer = run_cli("--model llama3-70b --nodes " + std::to_string(nodes - 1) +
                       " --offload none --tp 1 --pp 1 --no-out --json");
  CHECK(fewer.code == 1);
}

TEST_CASE("plan.yaml round-trips: write, read, re-simulate gives the same numbers") {
  std::string path = "/tmp/fsdp_plan_rt_" + std::to_string(::getpid()) + ".yaml";
  auto r = run_cli("--model llama3-8b --nodes 2 --out " + path + " --json");
  REQUIRE(r.code == 0);
  auto chosen = nlohmann::json::parse(r.out)["chosen"];
  PlanFile plan = read_plan_file(path);
  CHECK(plan.model.name == "llama3-8b");
  CHECK(plan.cluster.nodes == 2);
  CHECK(plan.cluster.gpus_per_node == 8);
  // The network between the nodes, as the text report names it (a100-80gb: 8 HDR NICs).
  CHECK(plan.cluster.network == "8 x 200 Gb/s InfiniBand per node (200 Gb/s per GPU)");
  REQUIRE(plan.prediction.has_value());
  CHECK(plan.prediction->peak_bytes == doctest::Approx(chosen["memory"]["peak_bytes"].get<double>()));
  CHECK(plan.fsdp_run_command.find("fsdp-run") != std::string::npos);
  CHECK(plan.torchrun_command.find("torchrun --nnodes 2 --nproc-per-node 8 --no-python fsdp-run") != std::string::npos);
  // Writing what we read gives the same text.
  CHECK(write_plan_text(plan) == write_plan_text(parse_plan_text(write_plan_text(plan), "again")));
  auto again = run_cli("simulate --plan " + path + " --json");
  REQUIRE(again.code == 0);
  auto sim = nlohmann::json::parse(again.out);
  CHECK(sim["memory"]["peak_bytes"].get<double>() == doctest::Approx(chosen["memory"]["peak_bytes"].get<double>()));
  CHECK(sim["time"]["step_s"].get<double>() == doctest::Approx(chosen["time"]["step_s"].get<double>()));
  auto show = run_cli("show " + path);
  CHECK(show.code == 0);
  CHECK(show.out.find("llama3-8b") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("--float8: every candidate trains float8 linears, plan.yaml carries them, and what cannot is refused") {
  std::string path = "/tmp/fsdp_plan_f8_" + std::to_string(::getpid()) + ".yaml";
  auto r = run_cli(
      "--model llama3-8b --nodes 1 --hw h100-80gb --runtime torchtitan-compile --seq 8192 --float8 "
      "tensorwise --float8-all-gather true --tp 1 --pp 1 --out " +
      path + " --json");
  REQUIRE(r.code == 0);
  auto chosen = nlohmann::json::parse(r.out)["chosen"];
  CHECK(chosen["config"]["float8"] == "tensorwise");
  // The float8 all-gather holds for FSDP's candidates (the chosen one here); ZeRO / DDP candidates gather nothing.
  CHECK(chosen["config"]["float8_all_gather"] ==
        (chosen["config"]["strategy"] == "fsdp" || chosen["config"]["strategy"] == "fsdp-grad-op" ||
         chosen["config"]["strategy"] == "hsdp"));
  const PlanFile plan = read_plan_file(path);
  CHECK(plan.strategy.float8 == Float8Recipe::Tensorwise);
  auto again = run_cli("simulate --plan " + path + " --json");
  REQUIRE(again.code == 0);
  CHECK(nlohmann::json::parse(again.out)["time"]["step_s"].get<double>() ==
        doctest::Approx(chosen["time"]["step_s"].get<double>()));
  CHECK_FALSE(nlohmann::json::parse(r.out).contains("float8_what_if"));  // pinned: nothing to add
  // The same search in bf16 is slower; its report adds the chosen plan with float8 (not searched), since the runtime
  // runs float8 on this GPU.
  auto bf16 = run_cli(
      "--model llama3-8b --nodes 1 --hw h100-80gb --runtime torchtitan-compile --seq 8192 --tp 1 --pp 1 "
      "--no-out --json");
  REQUIRE(bf16.code == 0);
  const auto bf16_json = nlohmann::json::parse(bf16.out);
  CHECK(bf16_json["chosen"]["throughput"]["tokens_per_s_per_gpu"].get<double>() <
        chosen["throughput"]["tokens_per_s_per_gpu"].get<double>());
  REQUIRE(bf16_json.contains("float8_what_if"));
  CHECK(bf16_json["float8_what_if"]["config"]["float8"] == "tensorwise");
  CHECK(bf16_json["float8_what_if"]["throughput"]["tokens_per_s_per_gpu"].get<double>() >
        bf16_json["chosen"]["throughput"]["tokens_per_s_per_gpu"].get<double>());
  auto text = run_cli(
      "--model llama3-8b --nodes 1 --hw h100-80gb --runtime torchtitan-compile --seq 8192 --tp 1 --pp 1 --no-out");
  CHECK(text.out.find("float8 (not searched: it changes the numerics): --float8 tensorwise") != std::string::npos);
  // fsdp-run (the default runtime) runs no float8: no such line.
  CHECK(run_cli("--model llama3-8b --nodes 1 --hw h100-80gb --tp 1 --pp 1 --no-out").out.find("float8 (not") ==
        std::string::npos);
  // A GPU without FP8 tensor cores, a runtime that does not run float8, an unknown recipe: one message, exit 2.
  refusal("--model llama3-8b --nodes 1 --runtime torchtitan-compile --float8 tensorwise --no-out",
          {"--float8: a100-80gb has compute capability 8.0"});
  refusal("simulate --model llama3-8b --gpus 8 --hw h100-80gb --runtime torchtitan --float8 tensorwise",
          {"--float8: torchtitan runs eagerly and fsdp-plan prices float8 linears compiled only; use --runtime "
           "torchtitan-compile, or --float8 none"});
  refusal("--model llama3-8b --nodes 1 --float8 fp8 --no-out",
          {"--float8: 'fp8' is not one of: none, tensorwise, rowwise"});
  // fsdp-run is not a float8 target: exporting this plan there is refused with the knob and why.
  refusal("export " + path + " --to fsdp-run --out /tmp", {"float8"});
  std::remove(path.c_str());
}

TEST_CASE("plan files from a newer schema or with unknown keys are refused") {
  std::string path = "/tmp/fsdp_plan_bad_" + std::to_string(::getpid()) + ".yaml";
  REQUIRE(run_cli("--model tiny --gpus 2 --hw cpu --out " + path).code == 0);
  std::string text = fsdp::test::slurp(path);
  std::string newer = text;
  newer.replace(newer.find("fsdp_plan_version: 7"), 20, "fsdp_plan_version: 9");
  // Version 7 requires strategy.doc_len; a version-6 file has none and packs one document a sequence. The older
  // files below are built from a version-6 one.
  const std::string doc_key = "  doc_len: 0\n";
  REQUIRE(text.find(doc_key) != std::string::npos);
  text.erase(text.find(doc_key), doc_key.size());
  CHECK_THROWS_WITH_AS(parse_plan_text(text, "p.yaml"), doctest::Contains("strategy.doc_len"), InputError);
  text.replace(text.find("fsdp_plan_version: 7"), 20, "fsdp_plan_version: 6");
  CHECK(parse_plan_text(text, "p.yaml").strategy.doc_len == 0);
  // Version 6 requires strategy.ep; a version-5 file has none and holds every routed expert on each rank. The older
  // files below are built from a version-5 one.
  const std::string ep_key = "  ep: 1\n";
  REQUIRE(text.find(ep_key) != std::string::npos);
  text.erase(text.find(ep_key), ep_key.size());
  CHECK_THROWS_WITH_AS(parse_plan_text(text, "p.yaml"), doctest::Contains("strategy.ep"), InputError);
  text.replace(text.find("fsdp_plan_version: 6"), 20, "fsdp_plan_version: 5");
  CHECK(parse_plan_text(text, "p.yaml").strategy.mesh.ep == 1);
  // Version 5 requires strategy.train_vision; a version-4 file has none and trains every vision part. The older
  // files below are built from this one without it.
  const std::string vision_key = "  train_vision: all\n";
  REQUIRE(text.find(vision_key) != std::string::npos);
  std::string v5_without_vision = text;
  v5_without_vision.erase(text.find(vision_key), vision_key.size());
  CHECK_THROWS_WITH_AS(parse_plan_text(v5_without_vision, "p.yaml"), doctest::Contains("strategy.train_vision"),
                       InputError);
  std::string v4 = v5_without_vision;
  v4.replace(v4.find("fsdp_plan_version: 5"), 20, "fsdp_plan_version: 4");
  CHECK(parse_plan_text(v4, "p.yaml").strategy.train_vision == VisionTraining::All);
  const std::string with_vision = text;
  text = v5_without_vision;
  CHECK_THROWS_WITH_AS(parse_plan_text(newer, "p.yaml"), doctest::Contains("schema version 9"), InputError);
  // Version 2 requires strategy.grad_sync; a version-1 file has none and reduces on every micro-batch.
  std::string v1 = text;
  const size_t mesh_keys = v1.find("  tp: 1\n");
  REQUIRE(mesh_keys != std::string::npos);
  const size_t mesh_end = v1.find("training:", mesh_keys);
  REQUIRE(mesh_end != std::string::npos);
  const std::string v3_mesh = v1.substr(mesh_keys, mesh_end - mesh_keys);
  v1.erase(mesh_keys, mesh_end - mesh_keys);
  v1.replace(v1.find("fsdp_plan_version: 5"), 20, "fsdp_plan_version: 1");
  const size_t gs = v1.find("  grad_sync: every-micro-batch\n");
  REQUIRE(gs != std::string::npos);
  std::string v1_without = v1;
  v1_without.erase(gs, std::string("  grad_sync: every-micro-batch\n").size());
  CHECK(parse_plan_text(v1_without, "p.yaml").strategy.grad_sync == GradSync::EveryMicroBatch);
  CHECK_THROWS_WITH_AS(parse_plan_text(v1, "p.yaml"), doctest::Contains("unknown key 'strategy.grad_sync'"),
                       InputError);
  // Version 3 requires the mesh keys; a version-2 file has none and is data parallel only.
  std::string v2 = text;
  v2.erase(v2.find(v3_mesh), v3_mesh.size());
  v2.replace(v2.find("fsdp_plan_version: 5"), 20, "fsdp_plan_version: 2");
  CHECK(parse_plan_text(v2, "p.yaml").strategy.mesh.is_data_parallel_only());
  std::string v3_without_tp = text;
  v3_without_tp.erase(text.find("  tp: 1\n"), std::string("  tp: 1\n").size());
  CHECK_THROWS_WITH_AS(parse_plan_text(v3_without_tp, "p.yaml"), doctest::Contains("strategy.tp"), InputError);
  // Version 4 requires the float8 keys; a version-3 file has none and trains its linears in the compute dtype.
  const std::string f8_keys = "  float8: none\n  float8_all_gather: false\n";
  REQUIRE(text.find(f8_keys) != std::string::npos);
  std::string v3 = text;
  v3.erase(v3.find(f8_keys), f8_keys.size());
  std::string v4_without_float8 = v3;
  v3.replace(v3.find("fsdp_plan_version: 5"), 20, "fsdp_plan_version: 3");
  CHECK(parse_plan_text(v3, "p.yaml").strategy.float8 == Float8Recipe::None);
  CHECK_THROWS_WITH_AS(parse_plan_text(v4_without_float8, "p.yaml"), doctest::Contains("strategy.float8"), InputError);
  std::string v2_without = v2;
  v2_without.erase(v2.find("  grad_sync: every-micro-batch\n"), std::string("  grad_sync: every-micro-batch\n").size());
  CHECK_THROWS_WITH_AS(parse_plan_text(v2_without, "p.yaml"), doctest::Contains("grad_sync"), InputError);
  CHECK_THROWS_WITH_AS(parse_plan_text(with_vision + "extra: 1\n", "p.yaml"), doctest::Contains("unknown key 'extra'"),
                       InputError);
  // A plan written before the prediction recorded its optimizer phase (2026-11-30) loads, says so, and is written
  // again without the key (no invented value).
  const size_t op = v1_without.find("  optimizer_phase_s: ");
  REQUIRE(op != std::string::npos);
  std::string v1_old = v1_without;
  v1_old.erase(op, v1_old.find('\n', op) + 1 - op);
  const PlanFile old = parse_plan_text(v1_old, "p.yaml");
  REQUIRE(old.prediction);
  CHECK_FALSE(old.prediction->optimizer_phase_recorded);
  const std::string again = write_plan_text(old);
  CHECK(again.find("optimizer_phase_s") == std::string::npos);
  CHECK_FALSE(parse_plan_text(again, "again.yaml").prediction->optimizer_phase_recorded);
  CHECK(parse_plan_text(with_vision, "p.yaml").prediction->optimizer_phase_recorded);
  std::remove(path.c_str());
}

TEST_CASE("--trace writes a Chrome trace: one track per stream, one slice per op, memory as a counter") {
  std::string path = "/tmp/fsdp_trace_" + std::to_string(::getpid()) + ".json";
  auto r = run_cli("simulate --model llama3-8b --gpus 16 --strategy fsdp --grad-accum 2 --trace " + path + " --json");
  REQUIRE(r.code == 0);
  auto t = nlohmann::json::parse(fsdp::test::slurp(path));
  std::set<std::string> threads;
  int slices = 0, counters = 0;
  double last_end = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") threads.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "X") {
      ++slices;
      CHECK(e["dur"].get<double>() >= 0.0);
      last_end = std::max(last_end, e["ts"].get<double>() + e["dur"].get<double>());
    }
    if (e["ph"] == "C") ++counters;
  }
  for (const char* s : {"compute", "all-gather", "reduce"}) CHECK(threads.count(s) == 1);
  CHECK(slices > 3 * 33);  // gathers, forwards, backwards, reduce-scatters for 33 units
  CHECK(counters == slices);
  // The trace covers the emitted micro-batches; the step time also counts the repeated middle ones.
  double step_us = nlohmann::json::parse(r.out)["time"]["step_s"].get<double>() * 1e6;
  CHECK(last_end <= step_us * (1 + 1e-9));
  std::remove(path.c_str());
}

TEST_CASE("search: a pinned fp16 compute dtype is searched with fp32 and fp16 reductions (it searched nothing)") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", " fp16/"}, {" --reduce-dtype fp16", " fp16/fp16 "}, {" --reduce-dtype fp32", " fp16/fp32 "}};
  for (const auto& [reduce, plan] : cases) {
    CAPTURE(reduce);
    auto r = run_cli("--model tiny --hw cpu --gpus 2 --seq 64 --global-batch-tokens 1024 --no-out --param-dtype fp16" +
                     reduce);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("searched 0 configurations") == std::string::npos);
    CHECK(r.out.find(plan) != std::string::npos);
  }
}

TEST_CASE("simulate: a pipeline plan's step line adds up (compute, exposed comm, offload, bubble, reduction chain)") {
  // torchtitan reduces each stage's gradients after its backward: the chain is on the step's line and its own line.
  auto r = run_cli(
      "simulate --model 8b --gpus 2 --hw h100-80gb --strategy fsdp --reshard-after-forward false --pp 2 "
      "--micro-batch 1 --grad-accum 4 --seq 2048 --runtime torchtitan");
  REQUIRE(r.code == 0);
  const auto at = r.out.find("  step ");
  REQUIRE(at != std::string::npos);
  double step = 0, compute = 0, exposed = 0, offload = 0, bubble = 0, chain = 0, comm = 0;
  REQUIRE(std::sscanf(r.out.c_str() + at,
                      "  step %lf s = compute %lf s + exposed comm %lf s + exposed offload %lf s + pipeline bubble %lf "
                      "s + reduction chain %lf s  (comm total %lf s)",
                      &step, &compute, &exposed, &offload, &bubble, &chain, &comm) == 7);
  CHECK(bubble > 0);
  CHECK(chain > 0);
  CHECK(compute + exposed + offload + bubble + chain == doctest::Approx(step).epsilon(0.002));
  CHECK(r.out.find("  pipeline reduction chain ") != std::string::npos);
}

TEST_CASE("compare: predicted vs measured per category, step time from the median, bad reports refused") {
  const std::string base = "/tmp/fsdp_cmp_" + std::to_string(::getpid());
  REQUIRE(
      run_cli(
          "--model tiny --gpus 2 --hw cpu --strategy fsdp --wrap layer --micro-batch 2 --seq 64 --grad-accum 1 --out " +
          base + ".yaml")
          .code == 0);
  PlanFile plan = read_plan_file(base + ".yaml");
  REQUIRE(plan.prediction.has_value());
  const double pred_peak = plan.prediction->peak_bytes;
  nlohmann::json report;
  report["memory"]["peak_bytes"] = pred_peak * 1.10;  // measured 10% above the prediction
  report["memory"]["breakdown"]["optimizer_states"] = plan.prediction->memory_breakdown.at("optimizer_states");
  // The run's untagged rest, filed under activations: compared with predicted activations + transient.
  const double rest =
      plan.prediction->memory_breakdown.at("activations") + plan.prediction->memory_breakdown.at("transient");
  REQUIRE(rest > 0);
  report["memory"]["breakdown"]["activations"] = rest * 1.25;
  report["steps"] = nlohmann::json::array({{{"time_s", 9.0}}, {{"time_s", 2.0}}, {{"time_s", 1.0}}, {{"time_s", 3.0}}});
  std::ofstream(base + ".json") << report.dump();
  auto r = run_cli("compare " + base + ".yaml " + base + ".json --json");
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  bool saw_peak = false, saw_opt = false, saw_rest = false;
  for (const auto& row : j["memory"]) {
    if (row["name"] == "peak allocated") {
      saw_peak = true;
      CHECK(row["error"].get<double>() == doctest::Approx(1.0 / 1.1 - 1.0));
    }
    CHECK(row["name"] != "activations");  // never compared alone: the run cannot tell it from transient
    if (row["name"] == "activations + transient") {
      saw_rest = true;
      CHECK(row["error"].get<double>() == doctest::Approx(1.0 / 1.25 - 1.0));
    }
    if (row["name"] == "optimizer_states") {
      saw_opt = true;
      CHECK(row["error"].get<double>() == doctest::Approx(0.0));
    }
  }
  CHECK(saw_peak);
  CHECK(saw_opt);
  CHECK(saw_rest);
  // Steps after the first: 2, 1, 3 -> median 2 s. No comm_wait_s in the steps: no compute/comm rows.
  CHECK(j["time"][0]["measured"].get<double>() == doctest::Approx(2.0));
  CHECK(j["time"].size() == 2);
  // With the time blocked on collectives: exposed comm is its median, compute the median of the rest.
  report["steps"] = nlohmann::json::array({{{"time_s", 9.0}, {"comm_wait_s", 5.0}, {"optimizer_phase_s", 4.0}},
                                           {{"time_s", 2.0}, {"comm_wait_s", 0.5}, {"optimizer_phase_s", 0.2}},
                                           {{"time_s", 1.0}, {"comm_wait_s", 0.25}, {"optimizer_phase_s", 0.1}},
                                           {{"time_s", 3.0}, {"comm_wait_s", 2.5}, {"optimizer_phase_s", 0.3}}});
  std::ofstream(base + ".json") << report.dump();
  auto t = run_cli("compare " + base + ".yaml " + base + ".json --json");
  REQUIRE(t.code == 0);
  auto jt = nlohmann::json::parse(t.out);
  std::map<std::string, double> measured;
  for (const auto& row : jt["time"]) measured[row["name"].get<std::string>()] = row["measured"].get<double>();
  CHECK(measured.at("exposed comm (median)") == doctest::Approx(0.5));  // 0.5, 0.25, 2.5
  CHECK(measured.at("compute (median)") == doctest::Approx(0.75));      // 1.5, 0.75, 0.5
  CHECK(measured.at("step time (median)") == doctest::Approx(2.0));
  CHECK(measured.at("optimizer phase (median)") == doctest::Approx(0.2));  // 0.2, 0.1, 0.3
  for (const auto& row : jt["time"])
    if (row["name"] == "optimizer phase (median)") CHECK(row["predicted"].get<double>() > 0);
  // tokens/s per GPU: a replica's micro_batch x seq x grad_accum tokens over the median step; data parallel, one GPU
  // a replica.
  CHECK(measured.at("tokens/s per GPU") == doctest::Approx(2.0 * 64.0 * 1.0 / 2.0));
  {
    // Two pipeline stages: the replica's 2 x 64 x 4 tokens are its 2 GPUs', as the prediction counts them.
    REQUIRE(run_cli("--model tiny --gpus 2 --hw cpu --strategy fsdp --pp 2 --micro-batch 2 --seq 64 --grad-accum 4 "
                    "--out " +
                    base + ".pp.yaml")
                .code == 0);
    auto pp = run_cli("compare " + base + ".pp.yaml " + base + ".json --json");
    REQUIRE(pp.code == 0);
    // A named document: a range-for over a member of parse()'s temporary would read it after its end.
    const auto pj = nlohmann::json::parse(pp.out);
    int rows = 0;
    for (const auto& row : pj["time"])
      if (row["name"] == "tokens/s per GPU") {
        CHECK(row["measured"].get<double>() == doctest::Approx(2.0 * 64 * 4 / 2.0 / 2.0));
        ++rows;
      }
    CHECK(rows == 1);
    std::remove((base + ".pp.yaml").c_str());
  }
  std::ofstream(base + ".bad.json") << "{\"steps\": []}";
  refusal("compare " + base + ".yaml " + base + ".bad.json", {"missing key 'memory'"});
  for (const char* ext : {".yaml", ".json", ".bad.json"}) std::remove((base + ext).c_str());
}

TEST_CASE("a CPU plan that reshards after forward predicts a range: plan.yaml keeps it, compare checks both ends") {
  const std::string base = "/tmp/fsdp_floor_" + std::to_string(::getpid());
  const std::string knobs =
      "--model tiny --gpus 2 --hw cpu --runtime fsdp-run --strategy fsdp --wrap layer --act-ckpt full "
      "--param-dtype fp32 --offload none --micro-batch 2 --seq 64 --grad-accum 1 --reshard-after-forward true";
  REQUIRE(run_cli(knobs + " --out " + base + ".yaml").code == 0);
  const PlanFile plan = read_plan_file(base + ".yaml");
  REQUIRE(plan.prediction.has_value());
  const double bound = plan.prediction->peak_bytes, floor = plan.prediction->peak_bytes_floor;
  CHECK(floor > 0);
  CHECK(floor < bound);  // Gloo's gather buffer may or may not overlap the backward peak
  // The same numbers as `simulate --json`.
  auto sim = run_cli("simulate " + knobs + " --json");
  REQUIRE(sim.code == 0);
  const auto mem = nlohmann::json::parse(sim.out).at("memory");
  CHECK(mem.at("peak_bytes_floor").get<double>() == doctest::Approx(floor));
  CHECK(mem.at("peak_bytes").get<double>() == doctest::Approx(bound));
  // A run that peaked at the floor: the bound's row is above it, the floor's row exact.
  nlohmann::json report;
  report["memory"]["peak_bytes"] = floor;
  report["memory"]["breakdown"] = nlohmann::json::object();
  report["steps"] = nlohmann::json::array();
  std::ofstream(base + ".json") << report.dump();
  auto r = run_cli("compare " + base + ".yaml " + base + ".json --json");
  REQUIRE(r.code == 0);
  std::map<std::string, double> err;
  const auto rows = nlohmann::json::parse(r.out).at("memory");
  for (const auto& row : rows)
    if (row.contains("error")) err[row["name"].get<std::string>()] = row["error"].get<double>();
  CHECK(err.at("peak allocated") == doctest::Approx(bound / floor - 1));
  CHECK(err.at("peak, gathers end early") == doctest::Approx(0.0));
  // A floor above the bound is refused, naming the key.
  std::string text;
  {
    std::ifstream in(base + ".yaml");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("peak_bytes_floor:");
  REQUIRE(at != std::string::npos);
  const auto eol = text.find('\n', at);
  text.replace(at, eol - at, "peak_bytes_floor: " + std::to_string(bound * 2));
  std::ofstream(base + ".yaml") << text;
  refusal("compare " + base + ".yaml " + base + ".json", {"peak_bytes_floor"});
  for (const char* ext : {".yaml", ".json"}) std::remove((base + ext).c_str());
}

TEST_CASE("compare re-simulates a plan without a prediction: the same predictions plan.yaml would carry") {
  const std::string base = "/tmp/fsdp_resim_" + std::to_string(::getpid());
  REQUIRE(run_cli("--model tiny --gpus 2 --hw cpu --runtime fsdp-run --strategy fsdp --wrap layer --act-ckpt full "
                  "--param-dtype fp32 --offload none --micro-batch 2 --seq 64 --grad-accum 1 "
                  "--reshard-after-forward true --out " +
                  base + ".yaml")
              .code == 0);
  PlanFile plan = read_plan_file(base + ".yaml");
  REQUIRE(plan.prediction.has_value());
  const PlanPrediction carried = *plan.prediction;
  plan.prediction.reset();
  write_plan_file(plan, base + ".bare.yaml");
  nlohmann::json report;
  report["memory"]["peak_bytes"] = carried.peak_bytes;
  report["memory"]["breakdown"] = nlohmann::json::object();
  report["steps"] = nlohmann::json::array({{{"time_s", 2.0}, {"comm_wait_s", 0.5}, {"optimizer_phase_s", 0.2}},
                                           {{"time_s", 1.0}, {"comm_wait_s", 0.25}, {"optimizer_phase_s", 0.1}}});
  std::ofstream(base + ".json") << report.dump();
  auto with = run_cli("compare " + base + ".yaml " + base + ".json --json");
  auto bare = run_cli("compare " + base + ".bare.yaml " + base + ".json --json");
  REQUIRE(with.code == 0);
  REQUIRE(bare.code == 0);
  const auto a = nlohmann::json::parse(with.out), b = nlohmann::json::parse(bare.out);
  for (const char* part : {"memory", "time"}) {
    REQUIRE(a.at(part).size() == b.at(part).size());
    for (size_t i = 0; i < a.at(part).size(); ++i) {
      CAPTURE(a.at(part)[i].at("name").get<std::string>());
      CHECK(b.at(part)[i].at("name") == a.at(part)[i].at("name"));
      CHECK(b.at(part)[i].at("predicted").get<double>() ==
            doctest::Approx(a.at(part)[i].at("predicted").get<double>()).epsilon(1e-6));
      if (std::string(part) == "time") CHECK(b.at(part)[i].at("predicted").get<double>() > 0);
    }
  }
  for (const char* ext : {".yaml", ".bare.yaml", ".json"}) std::remove((base + ext).c_str());
}

TEST_CASE("simulate --memory-timeline: the walk op by op, its peak marked and equal to the reported peak") {
  auto j = run_cli(
      "simulate --model tiny --gpus 2 --hw cpu --strategy fsdp --act-ckpt full --micro-batch 2 --seq 64 "
      "--grad-accum 2 --json");
  REQUIRE(j.code == 0);
  const auto mem = nlohmann::json::parse(j.out).at("memory");
  auto r = run_cli(
      "simulate --model tiny --gpus 2 --hw cpu --strategy fsdp --act-ckpt full --micro-batch 2 --seq 64 "
      "--grad-accum 2 --memory-timeline");
  REQUIRE(r.code == 0);
  std::istringstream in(r.out);
  std::string line, marked;
  int ops = 0, stars = 0;
  while (std::getline(in, line)) {
    if (line.find("(micro-batch ") == std::string::npos || line.rfind("peak ", 0) == 0) continue;
    ++ops;
    if (line.find(" * ") != std::string::npos) {
      ++stars;
      marked = line;
    }
  }
  CHECK(ops > 20);  // gathers, forwards, loss, backwards, reductions of two micro-batches, optimizer
  REQUIRE(stars == 1);
  const std::string phase = mem.at("peak_phase").get<std::string>();
  CHECK(marked.find(phase) != std::string::npos);
  char peak[64];
  std::snprintf(peak, sizeof peak, "peak %.3f MiB", mem.at("peak_bytes").get<double>() / (1024.0 * 1024.0));
  CHECK(r.out.find(peak) != std::string::npos);
}

TEST_CASE("planner: --tokens gives the chosen plan's GPU-hours, days and optimizer steps, under every objective") {
  for (const char* objective : {"throughput", "memory", "cost"}) {
    CAPTURE(objective);
    auto j = plan_json(std::string("--model llama2-7b --nodes 2 --tokens 2T --objective ") + objective);
    REQUIRE(j.contains("training"));
    const auto& t = j["training"];
    const double rate = j["chosen"]["throughput"]["tokens_per_s_per_gpu"].get<double>();
    const double per_step = j["chosen"]["throughput"]["tokens_per_step"].get<double>();
    const double gpus = 16, tokens = 2e12;
    CHECK(t["tokens"].get<double>() == tokens);
    CHECK(t["gpu_hours"].get<double>() == doctest::Approx(tokens / rate / 3600.0).epsilon(1e-9));
    CHECK(t["days"].get<double>() == doctest::Approx(tokens / (rate * gpus) / 86400.0).epsilon(1e-9));
    CHECK(t["optimizer_steps"].get<double>() == std::ceil(tokens / per_step));
    CHECK(j["chosen"]["gpu_hours"].get<double>() == doctest::Approx(t["gpu_hours"].get<double>()).epsilon(1e-9));
  }
  // Suffixes as token counts are quoted: 2T, 300B, 5e11.
  CHECK(plan_json("--model llama2-7b --nodes 1 --tokens 300B")["training"]["tokens"].get<double>() == 3e11);
  CHECK(plan_json("--model llama2-7b --nodes 1 --tokens 5e11")["training"]["tokens"].get<double>() == 5e11);
  CHECK_FALSE(plan_json("--model llama2-7b --nodes 1").contains("training"));
  // The text report says it under the chosen plan.
  auto r = run_cli("--model llama2-7b --nodes 2 --tokens 2T --no-out");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("training 2.00T tokens: ") != std::string::npos);
  CHECK(r.out.find(" days on these 16 GPUs (") != std::string::npos);
  // simulate takes it too, for one configuration or a plan file.
  auto sim = run_cli("simulate --model llama2-7b --micro-batch 2 --grad-accum 8 --tokens 1T --json");
  REQUIRE(sim.code == 0);
  const auto js = nlohmann::json::parse(sim.out);
  const double rate = js["throughput"]["tokens_per_s_per_gpu"].get<double>();
  CHECK(js["training"]["gpu_hours"].get<double>() == doctest::Approx(1e12 / rate / 3600.0).epsilon(1e-9));
  CHECK(js["training"]["optimizer_steps"].get<double>() == std::ceil(1e12 / (2.0 * 8 * 4096 * 8)));
  CHECK(run_cli("simulate --model llama2-7b --tokens 1T").out.find("  training 1.00T tokens: ") != std::string::npos);
}

TEST_CASE("planner: --nodes 2,4 sweeps the cluster sizes, each row the plan a search at that size chooses") {
  auto sweep = plan_json("--model llama2-7b --nodes 2,1,4 --tokens 1T");
  const auto& rows = sweep["sweep"];
  REQUIRE(rows.size() == 3);
  double first_rate = 0;
  int64_t expected_nodes[] = {1, 2, 4};  // ascending, whatever the order given
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const int64_t nodes = row["nodes"].get<int64_t>();
    CAPTURE(nodes);
    CHECK(nodes == expected_nodes[i]);
    CHECK(row["gpus"].get<int64_t>() == nodes * 8);
    // The same plan and numbers as the search at that one size.
    auto one = plan_json("--model llama2-7b --nodes " + std::to_string(nodes) + " --tokens 1T");
    REQUIRE_FALSE(row["chosen"].is_null());
    CHECK(row["chosen"]["config"] == one["chosen"]["config"]);
    const double rate = row["chosen"]["throughput"]["tokens_per_s_per_gpu"].get<double>();
    CHECK(rate == one["chosen"]["throughput"]["tokens_per_s_per_gpu"].get<double>());
    CHECK(row["training"] == one["training"]);
    if (i == 0) first_rate = rate;
    CHECK(row["scaling_efficiency"].get<double>() == doctest::Approx(rate / first_rate).epsilon(1e-12));
  }
  // A size the pinned knobs cannot run on is a row that says why; the others are searched.
  auto pinned = run_cli("--model llama2-7b --nodes 1,2 --pp 16");
  CHECK(pinned.code == 0);
  CHECK(pinned.out.find("refused: --pp: tp 1 x pp 16 = 16 does not divide the 8 GPUs") != std::string::npos);
  CHECK(pinned.out.find("2 nodes: ") != std::string::npos);
  CHECK(pinned.out.find("A sweep writes no plan file") != std::string::npos);
  // No size with a plan: exit 1.
  CHECK(run_cli("--model llama3.1-405b --nodes 1,2 --hw a100-40gb --no-out").code == 1);
}

TEST_CASE("planner: a --nodes sweep refuses a bad size and the files only one size writes") {
  refusal("--model llama2-7b --nodes 1,x",
          {"--nodes: '1,x': each size of a sweep must be a node count of at least 1, got 'x'"});
  refusal("--model llama2-7b --nodes 0,2");
  // Pins no size of the sweep can run: one message, exit 2.
  refusal("--model llama2-7b --nodes 1,2 --tp 3", {"--tp"});
  refusal("--model llama2-7b --nodes 1,,2");
  for (const char* flag : {"--out p.yaml", "--target torchtitan", "--html r.html", "--trace t.json"}) {
    CAPTURE(flag);
    refusal(std::string("--model llama2-7b --nodes 1,2 ") + flag,
            {"a --nodes sweep (1,2) writes no plan, report or trace file"});
  }
}

TEST_CASE("planner: a tp plan's report says how the heads split, and when the kv heads are fewer than tp") {
  auto gqa = nlohmann::json::parse(run_cli("simulate --model qwen3-30b-a3b --tp 8 --strategy fsdp --json").out);
  CHECK(gqa["tensor_parallel"]["query_heads_per_rank"] == 4);
  CHECK(gqa["tensor_parallel"]["kv_heads_per_rank"] == 1);
  CHECK(gqa["tensor_parallel"]["kv_head_replicas"] == 2);  // 4 kv heads over 8 ranks
  auto even = nlohmann::json::parse(run_cli("simulate --model llama3-70b --nodes 2 --tp 8 --json").out);
  CHECK(even["tensor_parallel"]["query_heads_per_rank"] == 8);
  CHECK(even["tensor_parallel"]["kv_heads_per_rank"] == 1);
  CHECK(even["tensor_parallel"]["kv_head_replicas"] == 1);
  CHECK_FALSE(nlohmann::json::parse(run_cli("simulate --model llama3-8b --json").out).contains("tensor_parallel"));
  CHECK(run_cli("simulate --model qwen3-30b-a3b --tp 8 --strategy fsdp")
            .out.find("4 kv heads: fewer than tp, each held by 2 ranks") != std::string::npos);
}

TEST_CASE("compare: a run that executed another attention than the plan's is compared with the plan re-simulated so") {
  // fsdp-run on a LibTorch without fused attention runs a flash plan as eager and says so in its report
  // (executor/io/report.cpp plan.attention); compare prices what ran.
  const std::string base = "/tmp/fsdp_cmp_attn_" + std::to_string(::getpid());
  const std::string knobs =
      "--model tiny --gpus 2 --hw cpu --strategy fsdp --wrap layer --micro-batch 2 --seq 256 "
      "--grad-accum 1 --out ";
  REQUIRE(run_cli(knobs + base + ".flash.yaml --attention flash").code == 0);
  REQUIRE(run_cli(knobs + base + ".eager.yaml --attention eager").code == 0);
  const PlanFile eager = read_plan_file(base + ".eager.yaml");
  REQUIRE(eager.prediction.has_value());
  nlohmann::json report;
  report["memory"]["peak_bytes"] = eager.prediction->peak_bytes;  // measured as the eager prediction
  report["memory"]["breakdown"] = nlohmann::json::object();
  report["steps"] = nlohmann::json::array({{{"time_s", 1.0}}, {{"time_s", 1.0}}});
  report["plan"]["attention"] = "eager";
  report["plan"]["attention_planned"] = "flash";
  std::ofstream(base + ".json") << report.dump();
  auto r = run_cli("compare " + base + ".flash.yaml " + base + ".json --json");
  REQUIRE(r.code == 0);
  CHECK(r.err.find("compare: the run executed eager attention") != std::string::npos);
  auto peak_error = [](const std::string& out) {
    const auto j = nlohmann::json::parse(out);
    for (const auto& row : j["memory"])
      if (row["name"] == "peak allocated") return row["error"].get<double>();
    FAIL("no peak allocated row in " << out);
    return 0.0;
  };
  CHECK(peak_error(r.out) == doctest::Approx(0.0));
  // Without the key (an older report) the plan's own prediction, which the eager run exceeds.
  report["plan"].erase("attention");
  std::ofstream(base + ".json") << report.dump();
  auto old = run_cli("compare " + base + ".flash.yaml " + base + ".json --json");
  REQUIRE(old.code == 0);
  CHECK(peak_error(old.out) < -0.05);  // the flash prediction below what the eager run measured
  report["plan"]["attention"] = "quantum";
  std::ofstream(base + ".json") << report.dump();
  refusal("compare " + base + ".flash.yaml " + base + ".json",
          {"plan.attention: 'quantum' is not an attention implementation"});
  for (const char* ext : {".flash.yaml", ".eager.yaml", ".json"}) std::remove((base + ext).c_str());
}

TEST_CASE("planner: a CPU plan under the default global batch says how many micro-batches a step that is") {
  auto r = run_cli("--model tiny --hw cpu --gpus 2 --no-out");
  REQUIRE(r.code == 0);
  CHECK(r.err.find("note: the default global batch (4194304 tokens") != std::string::npos);
  CHECK(r.err.find("for a rehearsal give --global-batch-tokens") != std::string::npos);
  CHECK(run_cli("--model tiny --hw cpu --gpus 2 --global-batch-tokens 4096 --no-out").err.find("note: the default") ==
        std::string::npos);
  CHECK(run_cli("--model llama2-7b --nodes 1 --no-out").err.find("note: the default global batch") ==
        std::string::npos);  // a GPU cluster: the default is what it trains with
}
