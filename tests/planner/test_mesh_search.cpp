// The planner's search over mesh shapes (planner/search/plan_search.hpp): 405B on 16 H100 nodes needs tensor (or
// pipeline) parallelism, 70B on 8-64 H100s weighs FSDP alone against FSDP + TP, refusals are counted, and the
// search with its bounds returns exactly what the exhaustive one does.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "report/prediction_view.hpp"
#include "search_fixtures.hpp"
#include "strategy/capabilities.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

std::unique_ptr<SearchSetup> mesh_setup(const std::string& model, int64_t nodes, int64_t seq) {
  auto s = search_setup(model, "h100-80gb", nodes, "fsdp-run", seq);
  s->req.pins.tp.reset();
  s->req.pins.pp.reset();
  s->req.bound_pruning = true;
  return s;
}

}  // namespace

TEST_CASE("mesh search: 405B on 16 H100 nodes at 8k: no data-parallel plan fits, a tp/pp plan does") {
  auto setup = mesh_setup("llama3.1-405b", 16, 8192);
  // Narrowed to what the test is about (FSDP, full checkpointing, bf16 / bf16), to keep it quick.
  setup->req.pins.strategy = StrategyKind::Fsdp;
  setup->req.pins.act_ckpt = ActCkpt::Full;
  setup->req.pins.param_dtype = DType::Bf16;
  setup->req.pins.reduce_dtype = DType::Bf16;
  setup->req.pins.offload = Offload::None;
  const SearchResult r = search_plans(setup->req);
  REQUIRE_FALSE(r.ranked.empty());
  const Strategy& best = r.ranked.front().strategy;
  CHECK(best.mesh.model_parallel() > 1);
  CHECK(r.ranked.front().prediction.memory.device_total <= r.budget_bytes);
  REQUIRE(r.meshes.count("tp=1 pp=1"));
  CHECK_FALSE(r.meshes.at("tp=1 pp=1").feasible);
  MESSAGE("405B / 128 H100 at 8k: " << one_line_strategy(best) << " -> "
                                    << r.ranked.front().prediction.tokens_per_s_per_gpu << " tokens/s/GPU");
}

TEST_CASE("mesh search: 70B on 8 and 64 H100s weighs FSDP alone against FSDP + TP") {
  for (int64_t nodes : {2, 8}) {
    CAPTURE(nodes);
    auto setup = mesh_setup("llama3-70b", nodes, 4096);
    setup->req.pins.strategy = StrategyKind::Fsdp;
    setup->req.pins.act_ckpt = ActCkpt::Full;
    setup->req.pins.param_dtype = DType::Bf16;
    setup->req.pins.reduce_dtype = DType::Fp32;
    setup->req.pins.pp = 1;
    const SearchResult r = search_plans(setup->req);
    REQUIRE(r.meshes.count("tp=1 pp=1"));
    REQUIRE(r.meshes.count("tp=8+sp pp=1"));
    const FamilyVerdict& alone = r.meshes.at("tp=1 pp=1");
    const FamilyVerdict& tp8 = r.meshes.at("tp=8+sp pp=1");
    // On 64 GPUs both fit; on 16, FSDP alone with offload, FSDP + TP 8 (two data-parallel ranks) not without it.
    if (nodes == 8) CHECK((alone.feasible && tp8.feasible));
    REQUIRE_FALSE(r.ranked.empty());
    const double chosen = r.ranked.front().prediction.tokens_per_s_per_gpu;
    // The chosen plan is at least as fast as the best of either (within the near-tie rule's 5%).
    auto rate = [](const FamilyVerdict& v) { return v.feasible ? v.best->prediction.tokens_per_s_per_gpu : 0.0; };
    CHECK(chosen >= 0.95 * rate(tp8));
    CHECK(chosen >= 0.95 * rate(alone));
    MESSAGE("70B on " << nodes * 8 << " H100: FSDP alone " << rate(alone) << ", FSDP + TP 8 " << rate(tp8)
                      << " tokens/s/GPU (0: does not fit); chosen " << one_line_strategy(r.ranked.front().strategy));
  }
}

TEST_CASE("mesh search: shapes the capability table refuses are counted with their reason") {
  // Qwen2 7B: 28 heads, so tp 8 cannot split them.
  auto setup = mesh_setup("qwen2-7b", 1, 4096);
  setup->req.pins.strategy = StrategyKind::Fsdp;
  setup->req.pins.act_ckpt = ActCkpt::Full;
  setup->req.pins.offload = Offload::None;
  const SearchResult r = search_plans(setup->req);
  const std::string heads = to_string(CapabilityRule::TpHeads);
  REQUIRE(r.rejected.count(heads));
  CHECK(r.rejected.at(heads).count == 1);
  CHECK(r.rejected.at(heads).example == "--tp: tp 8 does not divide the 28 attention heads of qwen2-7b");
  for (const Candidate& c : r.evaluated_sample) CHECK(c.strategy.mesh.tp != 8);
}

TEST_CASE("mesh search: the bounds change nothing the search reports (top plans, families, mesh shapes)") {
  auto setup = mesh_setup("llama3-8b", 1, 4096);
  setup->req.pins.strategy = StrategyKind::Fsdp;
  setup->req.pins.act_ckpt = ActCkpt::Full;
  const SearchResult bounded = search_plans(setup->req);
  setup->req.bound_pruning = false;
  const SearchResult exhaustive = search_plans(setup->req);
  CHECK(bounded.evaluated < exhaustive.evaluated);
  CHECK(bounded.pruned_by_throughput > 0);
  // Every plan of the exhaustive top keep_top was simulated by the bounded search too (the bound skips only plans
  // below all of them), and the chosen plan is the same.
  const size_t top = static_cast<size_t>(setup->req.keep_top);
  REQUIRE(exhaustive.ranked.size() >= top);
  std::set<std::string> simulated;
  for (const Candidate& c : bounded.ranked) simulated.insert(one_line_strategy(c.strategy));
  for (size_t i = 0; i < top; ++i) {
    CAPTURE(i);
    CHECK(simulated.count(one_line_strategy(exhaustive.ranked[i].strategy)) == 1);
  }
  // The chosen plan: the same rate within the ranking's 0.1% tie. Plans that close are ordered by memory, and the
  // ranking's tie comparison is not transitive, so which of two tied plans comes first can depend on the slower
  // plans sorted beside them (seen here: wrap layer or every:2, 0.03% apart).
  CHECK(bounded.ranked.front().prediction.tokens_per_s_per_gpu ==
        doctest::Approx(exhaustive.ranked.front().prediction.tokens_per_s_per_gpu).epsilon(1e-3));
  auto same = [](const std::map<std::string, FamilyVerdict>& a, const std::map<std::string, FamilyVerdict>& b) {
    REQUIRE(a.size() == b.size());
    for (const auto& [name, v] : a) {
      CAPTURE(name);
      const FamilyVerdict& w = b.at(name);
      CHECK(v.feasible == w.feasible);
      REQUIRE(v.best.has_value() == w.best.has_value());
      if (v.best) CHECK(one_line_strategy(v.best->strategy) == one_line_strategy(w.best->strategy));
      CHECK(v.needed_bytes == w.needed_bytes);
    }
  };
  same(bounded.families, exhaustive.families);
  same(bounded.meshes, exhaustive.meshes);
}
