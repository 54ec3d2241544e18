// The search under --train-vision (Strategy::train_vision): every candidate keeps the pinned value, the throughput
// bound stays a lower bound of the step with frozen vision blocks (a plan faster than its bound is an internal error
// of the search), and the bounded search reports the exhaustive one's plan.
#include <doctest/doctest.h>

#include <memory>

#include "model/model_loader.hpp"
#include "report/prediction_view.hpp"
#include "search/plan_search.hpp"

namespace {

using namespace fsdp;

struct VlmSearch {
  std::unique_ptr<ModuleGraph> graph;
  HardwareProfile hw;
  RuntimeProfile rt;
  SearchRequest req;
};

// Qwen2.5-VL-7B with 1024 image tokens a sample on one node of H100, fsdp-plan's defaults otherwise
// (search_fixtures.hpp), the mesh searched too.
std::unique_ptr<VlmSearch> vlm_search(VisionTraining t) {
  auto s = std::make_unique<VlmSearch>();
  ModelSpec m = load_model("qwen2.5-vl-7b", FSDP_SOURCE_ROOT);
  m.vision->image_tokens = 1024;
  s->graph = std::make_unique<ModuleGraph>(m);
  s->hw = load_hardware("h100-80gb", FSDP_SOURCE_ROOT);
  s->rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  s->req.graph = s->graph.get();
  s->req.hardware = &s->hw;
  s->req.runtime = &s->rt;
  s->req.cluster = Cluster{1, s->hw.gpus_per_node};
  s->req.base.seq_len = 4096;
  s->req.base.train_vision = t;
  s->req.global_batch_tokens = 4'194'304;
  s->req.memory_headroom = 0.05;
  s->req.max_micro_batch = 64;
  s->req.pins.strategy = StrategyKind::Fsdp;
  return s;
}

}  // namespace

TEST_CASE("train-vision: the search keeps the pinned value, and its throughput bound holds with frozen blocks") {
  double rate_all = 0;
  for (VisionTraining t : {VisionTraining::All, VisionTraining::Projector, VisionTraining::None}) {
    CAPTURE(to_string(t));
    auto setup = vlm_search(t);
    setup->req.bound_pruning = true;
    const SearchResult bounded = search_plans(setup->req);  // asserts every plan >= its bound
    setup->req.bound_pruning = false;
    const SearchResult exhaustive = search_plans(setup->req);
    REQUIRE(!bounded.ranked.empty());
    REQUIRE(!exhaustive.ranked.empty());
    CHECK(bounded.pruned_by_throughput > 0);
    for (const Candidate& c : exhaustive.evaluated_sample) CHECK(c.strategy.train_vision == t);
    CHECK(bounded.ranked.front().prediction.tokens_per_s_per_gpu ==
          doctest::Approx(exhaustive.ranked.front().prediction.tokens_per_s_per_gpu).epsilon(1e-3));
    const double rate = bounded.ranked.front().prediction.tokens_per_s_per_gpu;
    // No vision backward: the best plan is faster than with the whole model trained.
    if (t == VisionTraining::All) rate_all = rate;
    if (t != VisionTraining::All) CHECK(rate > rate_all);
  }
}

TEST_CASE("train-vision: LoRA with none searches under the bound too") {
  auto setup = vlm_search(VisionTraining::None);
  setup->req.base.method = Method::Lora;
  setup->req.base.lora.rank = 16;
  setup->req.base.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  setup->req.bound_pruning = true;
  const SearchResult r = search_plans(setup->req);  // asserts every plan >= its bound
  REQUIRE(!r.ranked.empty());
  for (const Candidate& c : r.ranked) {
    CHECK(c.strategy.train_vision == VisionTraining::None);
    CHECK(c.strategy.method == Method::Lora);
  }
}
