// Expert parallelism in the planner: the search tries ep for a model with routed experts on a runtime that runs it
// (its throughput bound stays a lower bound: a plan faster than its bound is an internal error of the search, and the
// bounded search reports the exhaustive one's plan), DeepSeek-V3 plans where no plan fitted before, plan.yaml keeps
// ep, and the targets that do not run it refuse it by name (torchtitan's round trip of the degree is test_export.cpp's,
// knob by knob).
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <set>

#include "cli_runner.hpp"
#include "model/model_loader.hpp"
#include "planfile/plan_file.hpp"
#include "search/plan_search.hpp"

namespace {

using namespace fsdp;

struct MoeSearch {
  std::unique_ptr<ModuleGraph> graph;
  HardwareProfile hw;
  RuntimeProfile rt;
  SearchRequest req;
};

// Mixtral 8x7B on 2 nodes of H100 under `runtime`, fsdp-plan's defaults otherwise, FSDP pinned (its ep and mesh
// searched).
std::unique_ptr<MoeSearch> mixtral_search(const std::string& runtime) {
  auto s = std::make_unique<MoeSearch>();
  s->graph = std::make_unique<ModuleGraph>(load_model("mixtral-8x7b", FSDP_SOURCE_ROOT));
  s->hw = load_hardware("h100-80gb", FSDP_SOURCE_ROOT);
  s->rt = load_runtime(runtime, FSDP_SOURCE_ROOT);
  s->req.graph = s->graph.get();
  s->req.hardware = &s->hw;
  s->req.runtime = &s->rt;
  s->req.cluster = Cluster{2, s->hw.gpus_per_node};
  s->req.base.seq_len = 4096;
  s->req.global_batch_tokens = 4'194'304;
  s->req.memory_headroom = 0.05;
  s->req.max_micro_batch = 8;
  s->req.pins.strategy = StrategyKind::Fsdp;
  s->req.pins.tp = 1;
  s->req.pins.pp = 1;
  return s;
}

}  // namespace

TEST_CASE("expert parallel search: torchtitan's Mixtral plans try ep 1-8, the bound holds, the best uses experts") {
  auto setup = mixtral_search("torchtitan");
  setup->req.bound_pruning = true;
  const SearchResult bounded = search_plans(setup->req);  // asserts every plan >= its bound
  setup->req.bound_pruning = false;
  const SearchResult exhaustive = search_plans(setup->req);
  REQUIRE(!bounded.ranked.empty());
  std::set<int64_t> eps;
  for (const Candidate& c : exhaustive.evaluated_sample) eps.insert(c.strategy.mesh.ep);
  CHECK(eps == std::set<int64_t>{1, 2, 4, 8});
  CHECK(bounded.ranked.front().prediction.tokens_per_s_per_gpu ==
        doctest::Approx(exhaustive.ranked.front().prediction.tokens_per_s_per_gpu));
  // Splitting the experts gathers an eighth of each layer's 1.4B routed parameters and moves an eighth over the
  // network: the best plan uses it.
  CHECK(exhaustive.ranked.front().strategy.mesh.ep > 1);
  // A runtime that dispatches no tokens never tries it.
  auto plain = mixtral_search("pytorch");
  plain->req.bound_pruning = false;
  for (const Candidate& c : search_plans(plain->req).evaluated_sample) CHECK(c.strategy.mesh.ep == 1);
}

TEST_CASE("expert parallel CLI: DeepSeek-V3 on 32 H100 nodes plans under torchtitan, and plan.yaml keeps ep") {
  // Before expert parallelism no plan fitted: every rank gathered all 256 experts of a layer (22.5 GB in bf16).
  const std::string dir = "/tmp/fsdp_ep_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto r = test::run_cli("--model deepseek-v3 --nodes 32 --hw h100-80gb --runtime torchtitan --json --out " + dir +
                         "/plan.yaml");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const PlanFile plan = read_plan_file(dir + "/plan.yaml");
  CHECK(plan.strategy.mesh.ep > 1);
  CHECK(test::slurp(dir + "/plan.yaml").find("  ep: " + std::to_string(plan.strategy.mesh.ep) + "\n") !=
        std::string::npos);
  // Re-simulated from the file, the same plan.
  auto again = test::run_cli("simulate --plan " + dir + "/plan.yaml");
  CHECK(again.code == 0);
  CHECK(again.out.find("ep=" + std::to_string(plan.strategy.mesh.ep)) != std::string::npos);
  CHECK(again.out.find("token all-to-alls") != std::string::npos);
  // Targets without expert parallelism refuse it by knob, with the nearest plan.
  test::refusal("export " + dir + "/plan.yaml --to deepspeed --out " + dir + "/ds",
                {"ep " + std::to_string(plan.strategy.mesh.ep)});
  std::filesystem::remove_all(dir);
  // On fsdp-run, which dispatches no tokens, no plan fits, and the report says which runtime would split the experts.
  auto no_ep = test::run_cli("--model deepseek-v3 --nodes 32 --hw h100-80gb --no-out");
  CHECK(no_ep.out.find("No plan fits") != std::string::npos);
  CHECK(no_ep.out.find("fsdp-run does not run it, torchtitan's runtimes do (--runtime torchtitan)") !=
        std::string::npos);
  // --ep on a dense model, or on a runtime that does not run it: one message naming the flag, exit 2.
  test::refusal("simulate --model llama3-8b --gpus 16 --strategy fsdp --runtime torchtitan --ep 2",
                {"--ep: llama3-8b has no routed experts"});
  test::refusal("simulate --model mixtral-8x7b --gpus 16 --strategy fsdp --ep 2",
                {"--ep: fsdp-run does not run expert parallelism"});
}
