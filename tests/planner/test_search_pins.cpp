// Pinned knobs (SearchPins, fsdp-plan's --strategy, --wrap, ... flags) are respected by every candidate the
// search evaluates, not only by the ones it ranks, and they narrow the space to exactly the pinned part of it
// (search_space.hpp counts it from the README's description).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "search_fixtures.hpp"
#include "search_space.hpp"
#include "strategy/capabilities.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

bool same_wrap(const WrapPolicy& a, const WrapPolicy& b) {
  return a.kind == b.kind && (a.kind != WrapKind::EveryK || a.every_k == b.every_k) &&
         (a.kind != WrapKind::Size || a.min_params == b.min_params);
}

// Every evaluated candidate carries each pinned value. A pinned wrap applies where wrapping means something,
// the strategies that shard parameters; the replicated ones have one layout (search_space.hpp).
void check_pins_respected(const SearchRequest& req, const SearchResult& r) {
  const SearchPins& p = req.pins;
  REQUIRE(static_cast<int64_t>(r.evaluated_sample.size()) == r.evaluated);
  REQUIRE(!r.evaluated_sample.empty());
  for (const Candidate& c : r.evaluated_sample) {
    const Strategy& s = c.strategy;
    CAPTURE(point_key(s));
    if (p.strategy) CHECK(s.kind == *p.strategy);
    if (p.wrap && shards_parameters(s.kind)) CHECK(same_wrap(s.wrap, *p.wrap));
    if (p.reshard_after_forward) CHECK(s.reshard_after_forward == *p.reshard_after_forward);
    if (p.act_ckpt) CHECK(s.act_ckpt == *p.act_ckpt);
    if (p.act_ckpt) CHECK(s.ckpt_every == p.ckpt_every.value_or(1));
    if (p.offload) CHECK(s.offload == *p.offload);
    if (p.param_dtype) CHECK(s.param_dtype == *p.param_dtype);
    if (p.reduce_dtype) CHECK(s.reduce_dtype == *p.reduce_dtype);
    if (p.micro_batch) CHECK(s.micro_batch == *p.micro_batch);
    if (p.grad_accum) {
      CHECK(s.grad_accum == *p.grad_accum);
    } else {
      // Unpinned, accumulation reaches the global batch: the nearest whole number of micro-batches.
      const double per_step = static_cast<double>(s.micro_batch * s.seq_len * req.cluster.world_size());
      CHECK(s.grad_accum == std::max<int64_t>(1, std::llround(req.global_batch_tokens / per_step)));
    }
    if (p.hsdp_group && s.kind == StrategyKind::Hsdp) CHECK(s.hsdp_group == *p.hsdp_group);
    // What the request fixes and the search never varies.
    CHECK(s.seq_len == req.base.seq_len);
    CHECK(s.optimizer == req.base.optimizer);
    CHECK(s.attention == req.base.attention);
  }
  for (const Candidate& c : r.ranked) {
    CHECK(c.feasible);
    CHECK(c.prediction.memory.device_total <= r.budget_bytes);
  }
  CHECK(static_cast<int64_t>(r.ranked.size()) == r.feasible);
  const int64_t space = search_space_size(req.graph->spec().num_layers, req.cluster, p, req.max_micro_batch);
  CHECK(r.evaluated + r.pruned == space);
}

}  // namespace

TEST_CASE("pins: every evaluated candidate has the pinned values, and the pinned space is searched whole") {
  auto setup = search_setup("llama3-8b", "a100-80gb", 2);
  SearchRequest& req = setup->req;

  SUBCASE("strategy, checkpointing and micro-batch (the README's example)") {
    req.pins.strategy = StrategyKind::Fsdp;
    req.pins.act_ckpt = ActCkpt::Full;
    req.pins.micro_batch = 1;
    const SearchResult r = search_plans(req);
    check_pins_respected(req, r);
    CHECK(r.evaluated + r.pruned == 72);  // 4 wraps x 2 reshards x 3 offloads x 3 dtypes
    CHECK(r.families.size() == 1);
    CHECK(r.families.count("fsdp") == 1);
  }
  SUBCASE("torchtitan's checkpointing modes, pinned: every:2 and selective-op") {
    req.pins.strategy = StrategyKind::Fsdp;
    req.pins.micro_batch = 1;
    req.pins.act_ckpt = ActCkpt::Full;
    req.pins.ckpt_every = 2;
    SearchResult r = search_plans(req);
    check_pins_respected(req, r);
    CHECK(r.evaluated + r.pruned == 72);
    req.pins.act_ckpt = ActCkpt::SelectiveOp;
    req.pins.ckpt_every.reset();
    r = search_plans(req);
    check_pins_respected(req, r);
    CHECK(r.evaluated + r.pruned == 72);
  }
  SUBCASE("wrap, reshard-after-forward and offload, strategy free") {
    req.pins.wrap = WrapPolicy{WrapKind::EveryK, 2, 0};
    req.pins.reshard_after_forward = false;
    req.pins.offload = Offload::Optimizer;
    const SearchResult r = search_plans(req);
    check_pins_respected(req, r);
    // ddp and no-shard have no offload: no candidate of theirs exists.
    for (const Candidate& c : r.evaluated_sample) {
      CHECK(c.strategy.kind != StrategyKind::Ddp);
      CHECK(c.strategy.kind != StrategyKind::NoShard);
    }
  }
  SUBCASE("hsdp with a pinned group, fp32 parameters (which leave only fp32 reduction)") {
    req.pins.strategy = StrategyKind::Hsdp;
    req.pins.hsdp_group = 8;
    req.pins.param_dtype = DType::Fp32;
    const SearchResult r = search_plans(req);
    check_pins_respected(req, r);
    for (const Candidate& c : r.evaluated_sample) CHECK(c.strategy.reduce_dtype == DType::Fp32);
    // 4 wraps x 2 reshards x 3 ckpt x 3 offloads x 1 dtype x 7 micro-batches.
    CHECK(r.evaluated + r.pruned == 4 * 2 * 3 * 3 * 7);
  }
  SUBCASE("accumulation and the reduce dtype") {
    req.pins.grad_accum = 4;
    req.pins.reduce_dtype = DType::Bf16;
    req.pins.act_ckpt = ActCkpt::Selective;
    const SearchResult r = search_plans(req);
    check_pins_respected(req, r);
    for (const Candidate& c : r.evaluated_sample) CHECK(c.strategy.param_dtype == DType::Bf16);  // bf16/bf16 only
  }
  SUBCASE("nothing pinned: the whole space, accumulation reaching the global batch") {
    const SearchResult r = search_plans(req);
    check_pins_respected(req, r);
  }
}

TEST_CASE(
    "a runtime's runs section: the search evaluates only the strategies, offload, checkpointing and wraps it runs") {
  // 70B on one A100 node needs offload; under PyTorch (FSDP2: CPUOffloadPolicy only) no plan offloads the optimizer
  // alone and none is ZeRO-1/2 or no-shard; under nanotron only DDP and ZeRO-1, never offloaded (Pythia 1B on one
  // node); under torchtitan one decoder layer a unit (Llama 3 8B on two nodes).
  for (const auto& [model, nodes, runtime] :
       {std::tuple{"llama3-70b", 1, "pytorch"}, std::tuple{"pythia-1b", 1, "nanotron"},
        std::tuple{"llama3-8b", 2, "torchtitan"}}) {
    CAPTURE(runtime);
    auto setup = search_setup(model, "a100-80gb", nodes, runtime);
    const SearchResult r = search_plans(setup->req);
    REQUIRE(!r.ranked.empty());
    CHECK(r.evaluated_sample.size() > 0);
    for (const Candidate& c : r.evaluated_sample) {
      CHECK(setup->rt.support.runs(c.strategy.kind));
      CHECK(setup->rt.support.runs(c.strategy.offload));
      CHECK(setup->rt.support.runs(policy_of(c.strategy)));
      if (shards_params(c.strategy.kind)) CHECK(setup->rt.support.runs(c.strategy.wrap.kind));
    }
    // Nothing it does not run is counted as refused either: it is not in the space.
    for (const auto& [rule, rr] : r.rejected) CHECK(rule != to_string(CapabilityRule::RuntimeStrategy));
    for (const auto& [family, verdict] : r.families) {
      StrategyKind k;
      REQUIRE(parse_strategy_kind(family, k));
      CHECK(setup->rt.support.runs(k));
    }
  }
  // The PyTorch plan for 70B on 8 GPUs offloads parameters, as FSDP2 does.
  auto setup = search_setup("llama3-70b", "a100-80gb", 1, "pytorch");
  CHECK(search_plans(setup->req).ranked.front().strategy.offload == Offload::Params);
}
