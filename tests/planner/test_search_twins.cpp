// The search prices an fsdp-grad-op plan as its fsdp twin without resharding after forward (plan_search.cpp): the
// runtime executes both the same (strategy/placement.cpp unit_placement differs only in reshard_after_forward, which
// fsdp-grad-op forces off). Checked here against the search that simulates every plan: the same plans ranked in the
// same order with the same numbers to the bit, the same family and mesh verdicts and counts, on several runtimes,
// models and meshes.
#include <doctest/doctest.h>

#include <string>

#include "search_fixtures.hpp"

using namespace fsdp;

namespace {

bool same_prediction(const Prediction& a, const Prediction& b) {
  return a.memory.device_total == b.memory.device_total && a.memory.peak_allocated == b.memory.peak_allocated &&
         a.memory.reserved_peak == b.memory.reserved_peak && a.memory.peak_phase == b.memory.peak_phase &&
         a.time.step_s == b.time.step_s && a.time.exposed_comm_s == b.time.exposed_comm_s &&
         a.tokens_per_s_per_gpu == b.tokens_per_s_per_gpu && a.memory.breakdown == b.memory.breakdown;
}

void check_same_search(const SearchResult& twins, const SearchResult& all) {
  CHECK(twins.evaluated == all.evaluated);
  CHECK(twins.feasible == all.feasible);
  CHECK(twins.pruned == all.pruned);
  CHECK(all.priced_as_twin == 0);
  REQUIRE(twins.ranked.size() == all.ranked.size());
  for (size_t i = 0; i < all.ranked.size(); ++i) {
    CAPTURE(i);
    CHECK(strategy_identity(twins.ranked[i].strategy) == strategy_identity(all.ranked[i].strategy));
    CHECK(same_prediction(twins.ranked[i].prediction, all.ranked[i].prediction));
  }
  REQUIRE(twins.evaluated_sample.size() == all.evaluated_sample.size());
  for (size_t i = 0; i < all.evaluated_sample.size(); ++i) {
    CHECK(strategy_identity(twins.evaluated_sample[i].strategy) == strategy_identity(all.evaluated_sample[i].strategy));
    CHECK(twins.evaluated_sample[i].feasible == all.evaluated_sample[i].feasible);
    CHECK(twins.evaluated_sample[i].infeasible_reason == all.evaluated_sample[i].infeasible_reason);
  }
  for (const auto* verdicts : {&all.families, &all.meshes}) {
    const auto& other = verdicts == &all.families ? twins.families : twins.meshes;
    REQUIRE(other.size() == verdicts->size());
    for (const auto& [name, v] : *verdicts) {
      CAPTURE(name);
      const FamilyVerdict& w = other.at(name);
      CHECK(w.feasible == v.feasible);
      CHECK(w.needed_bytes == v.needed_bytes);
      CHECK(w.best.has_value() == v.best.has_value());
      if (w.best && v.best) CHECK(same_prediction(w.best->prediction, v.best->prediction));
    }
  }
}

}  // namespace

TEST_CASE("search twins: fsdp-grad-op priced as fsdp without resharding gives the search that simulates both") {
  struct Case {
    const char* model;
    const char* hw;
    int64_t nodes;
    const char* runtime;
    bool mesh;
  };
  int64_t priced = 0;
  for (const Case& cs :
       {Case{"llama3-70b", "a100-80gb", 8, "fsdp-run", true}, Case{"llama2-13b", "h100-80gb", 2, "pytorch", false},
        Case{"llama3-8b", "h100-80gb", 1, "pytorch-fsdp1", false},
        Case{"mixtral-8x7b", "h100-80gb", 2, "torchtitan", true}}) {
    CAPTURE(std::string(cs.model));
    CAPTURE(std::string(cs.runtime));
    auto setup = test::search_setup(cs.model, cs.hw, cs.nodes, cs.runtime);
    if (cs.mesh) {
      setup->req.pins.tp.reset();
      setup->req.pins.pp.reset();
    }
    setup->req.bound_pruning = true;
    const SearchResult twins = search_plans(setup->req);
    setup->req.price_twins = false;
    const SearchResult all = search_plans(setup->req);
    check_same_search(twins, all);
    priced += twins.priced_as_twin;
  }
  CHECK(priced > 1000);  // the rule ran: a sixth or so of each search
}
