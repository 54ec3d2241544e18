// The search prunes with one bound (plan_search.hpp): peak memory never falls as the micro-batch grows, so
// once a micro-batch does not fit, the larger ones of that line (every other knob the same) are skipped.
//  1. The bound itself, simulated directly over every strategy and knob of several zoo models, the
//     accumulation held fixed.
//  2. The search's skipped points are exactly the ones the bound (or the global batch) rules out, and none of
//     them fits, on fsdp-plan's default batch.
//  3. Along the search's own lines the accumulation is not fixed: it falls as the micro-batch grows (it reaches
//     the global batch), and the step from 2 to 1 micro-batches drops the accumulated gradient shard, which can
//     lower the peak. The search takes a pruned line up again where the accumulation reaches 1; the last two
//     tests pin both the physics and the search's handling of it.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "search_fixtures.hpp"
#include "search_space.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

// The accumulation the search sets for a micro-batch: the nearest whole number reaching the global batch.
int64_t accumulation(const SearchRequest& req, int64_t mb) {
  const double per_step = static_cast<double>(mb * req.base.seq_len * req.cluster.world_size());
  return std::max<int64_t>(1, std::llround(req.global_batch_tokens / per_step));
}

Prediction simulate_at(const SearchRequest& req, Strategy s, int64_t mb, int64_t accum) {
  s.micro_batch = mb;
  s.grad_accum = accum;
  validate_strategy(s, req.graph->spec(), req.cluster);
  return simulate(SimulationInput{req.graph, req.hardware, req.runtime, req.cluster, s});
}

// The walk rounds every allocation up to the allocator's block (512 B) but a free that sums several allocations
// once, so a category can end a few blocks below its true value (memory_walk.cpp) and the peak can move by a few
// KiB either way between two micro-batches whose peak is the same op (seen: up to 16 KiB). 128 blocks of slack,
// grown by the fragmentation on top of it for the device total: far below anything a fit decision turns on.
double rounding_slack(const RuntimeProfile& rt) { return 128.0 * rt.allocation_rounding.value; }

// Every line of the search's space for one strategy kind (wraps: layer and model), dtype bf16/fp32 or fp32/fp32.
template <typename F>
void for_each_line(const SearchRequest& req, F&& f) {
  for (StrategyKind k : all_strategy_kinds()) {
    const bool sharded = shards_parameters(k);
    for (WrapKind w : {WrapKind::Layer, WrapKind::Model}) {
      if (w == WrapKind::Model && !sharded) continue;
      for (bool reshard : {true, false}) {
        if (!reshard && !(k == StrategyKind::Fsdp || k == StrategyKind::Zero3 || k == StrategyKind::Hsdp)) continue;
        for (ActCkpt ck : {ActCkpt::None, ActCkpt::Selective, ActCkpt::Full})
          for (Offload off : {Offload::None, Offload::Optimizer, Offload::Params}) {
            if (off != Offload::None && (k == StrategyKind::Ddp || k == StrategyKind::NoShard)) continue;
            if (off == Offload::Params && !sharded) continue;
            for (DType dt : {DType::Bf16, DType::Fp32}) {
              Strategy s = req.base;
              s.kind = k;
              s.hsdp_group = k == StrategyKind::Hsdp ? req.cluster.gpus_per_node : 0;
              s.wrap = WrapPolicy{w, 1, 0};
              s.reshard_after_forward = k == StrategyKind::FsdpGradOp ? false : reshard;
              s.act_ckpt = ck;
              s.offload = off;
              s.param_dtype = dt;
              s.reduce_dtype = DType::Fp32;
              f(s);
            }
          }
      }
    }
  }
}

}  // namespace

TEST_CASE("the pruning bound: peak memory never falls as the micro-batch grows, on every strategy and knob") {
  // Dense and MoE, GQA and MHA, gated and GELU MLPs, tied and untied heads; two nodes so that hsdp has a group.
  struct Model {
    const char* name;
    int64_t seq;  // gpt2-xl's learned positions stop at 1024
  };
  const Model models[] = {{"llama3-8b", 4096}, {"llama2-13b", 4096},   {"mistral-7b", 4096},
                          {"qwen2-7b", 4096},  {"mixtral-8x7b", 4096}, {"gpt2-xl", 1024}};
  int64_t lines = 0;
  for (const Model& m : models) {
    for (const char* runtime : {"fsdp-run", "pytorch"}) {
      auto setup = search_setup(m.name, "a100-80gb", 2, runtime, m.seq);
      const SearchRequest& req = setup->req;
      const double slack = rounding_slack(setup->rt);
      for_each_line(req, [&](const Strategy& s) {
        for (int64_t accum : {1, 4}) {
          double prev_total = 0, prev_alloc = 0;
          for (int64_t mb = 1; mb <= req.max_micro_batch; mb *= 2) {
            const Prediction p = simulate_at(req, s, mb, accum);
            CAPTURE(std::string(m.name));
            CAPTURE(std::string(runtime));
            CAPTURE(line_key(s));
            CAPTURE(accum);
            CAPTURE(mb);
            CAPTURE(p.memory.peak_phase);
            CHECK(p.memory.peak_allocated >= prev_alloc - slack);
            CHECK(p.memory.device_total >= prev_total - slack * (1.0 + setup->rt.fragmentation_fraction));
            prev_total = p.memory.device_total;
            prev_alloc = p.memory.peak_allocated;
          }
        }
        ++lines;
      });
    }
  }
  // Per model and runtime: ddp, no-shard 3 ckpt x 2 dtypes; zero1, zero2 x 2 offloads; fsdp, zero3, hsdp
  // 2 wraps x 2 reshards x 3 ckpt x 3 offloads x 2 dtypes; fsdp-grad-op one reshard.
  CHECK(lines == 6 * 2 * (6 + 6 + 12 + 12 + 72 + 72 + 36 + 72));
}

TEST_CASE("the search skips only points the bound or the global batch rules out, and none of them fits") {
  struct Case {
    const char* model;
    int64_t nodes;
  };
  // One node of a 7B (ddp and no-shard never fit, others stop at various micro-batches), a 13B on two nodes,
  // and a 70B on four.
  for (const Case& cs : {Case{"llama2-7b", 1}, Case{"llama2-13b", 2}, Case{"llama3-70b", 4}}) {
    CAPTURE(std::string(cs.model));
    auto setup = search_setup(cs.model, "a100-80gb", cs.nodes);
    const SearchRequest& req = setup->req;
    const SearchResult r = search_plans(req);
    // The evaluated micro-batches of each line, in order.
    std::map<std::string, std::vector<const Candidate*>> by_line;
    for (const Candidate& c : r.evaluated_sample) by_line[line_key(c.strategy)].push_back(&c);
    int64_t skipped_by_memory = 0, skipped_by_batch = 0;
    for (const auto& [key, evaluated] : by_line) {
      CAPTURE(key);
      bool stopped = false, stopped_accumulating = false;
      size_t next = 0;
      for (int64_t mb = 1; mb <= req.max_micro_batch; mb *= 2) {
        CAPTURE(mb);
        // A line pruned while it accumulates may be taken up again where the accumulation reaches 1 (unless the
        // plan that stopped it was over the budget by more than its gradients): evaluated, or skipped and unfit.
        if (stopped && stopped_accumulating && accumulation(req, mb) == 1) {
          const bool resumed = next < evaluated.size() && evaluated[next]->strategy.micro_batch == mb;
          if (resumed) stopped = false;
        }
        const bool overshoots = mb > 1 && static_cast<double>(mb * req.base.seq_len * req.cluster.world_size()) >
                                              1.5 * req.global_batch_tokens;
        const bool was_evaluated = next < evaluated.size() && evaluated[next]->strategy.micro_batch == mb;
        if (stopped) {
          // After a micro-batch that did not fit: skipped, and it does not fit either.
          CHECK_FALSE(was_evaluated);
          ++skipped_by_memory;
          const Prediction p = simulate_at(req, evaluated.front()->strategy, mb, accumulation(req, mb));
          CHECK(p.memory.device_total > r.budget_bytes);
          continue;
        }
        if (overshoots) {
          CHECK_FALSE(was_evaluated);
          ++skipped_by_batch;
          continue;
        }
        REQUIRE(was_evaluated);
        const Candidate& c = *evaluated[next++];
        CHECK(c.strategy.grad_accum == accumulation(req, mb));
        if (c.prediction.memory.device_total > r.budget_bytes) CHECK_FALSE(c.feasible);
        // The search prunes past a plan more than its rounding slack (64 KiB) over the budget.
        if (c.prediction.memory.device_total > r.budget_bytes + 64.0 * 1024.0) {
          stopped = true;
          stopped_accumulating = c.strategy.grad_accum > 1;
        }
      }
      CHECK(next == evaluated.size());
    }
    CHECK(r.pruned == skipped_by_memory + skipped_by_batch);
    CHECK(r.evaluated + r.pruned ==
          search_space_size(req.graph->spec().num_layers, req.cluster, req.pins, req.max_micro_batch));
    MESSAGE(std::string(cs.model) << " on " << cs.nodes << " node(s): " << r.evaluated << " evaluated, "
                                  << skipped_by_memory << " skipped past a micro-batch that did not fit, "
                                  << skipped_by_batch << " beyond the global batch");
    CHECK(skipped_by_memory > 0);  // the bound is exercised
  }
}

// The accumulation changes the peak too: with 2 or more micro-batches FSDP holds the accumulated gradient shard
// while the next reduce-scatter's output arrives (sharded_grads at the root's post-backward); with one it does
// not. So where the peak is that post-backward (a whole-model unit, full checkpointing: activations small) the
// peak falls from 2 micro-batches to 1, and the search must not prune across that step.
TEST_CASE("along a search line the peak can fall where the accumulation reaches 1") {
  // mixtral-8x7b, 16 A100s, pytorch runtime, fsdp-plan's default batch: micro-batch 32 (2 micro-batches) to 64 (1).
  auto setup = search_setup("mixtral-8x7b", "a100-80gb", 2, "pytorch");
  const SearchRequest& req = setup->req;
  Strategy s = req.base;
  s.kind = StrategyKind::Fsdp;
  s.wrap = WrapPolicy{WrapKind::Model, 1, 0};
  s.reshard_after_forward = false;
  s.act_ckpt = ActCkpt::Full;
  REQUIRE(accumulation(req, 32) == 2);
  REQUIRE(accumulation(req, 64) == 1);
  const Prediction two = simulate_at(req, s, 32, 2), one = simulate_at(req, s, 64, 1);
  MESSAGE("mixtral-8x7b micro-batch 32 x 2: " << two.memory.device_total / kGiB
                                              << " GiB, 64 x 1: " << one.memory.device_total / kGiB << " GiB");
  CHECK(one.memory.device_total < two.memory.device_total);
}

TEST_CASE("the search finds a plan that fits after one that does not, where the accumulation reaches 1") {
  // llama3-8b on 16 H200s, pytorch runtime, 32 sequences per step: micro-batch 1 runs 2 micro-batches,
  // micro-batch 2 runs one. A headroom that puts the budget between their peaks (89.7 and 87.2 GiB today).
  auto setup = search_setup("llama3-8b", "h200-141gb", 2, "pytorch");
  SearchRequest& req = setup->req;
  req.global_batch_tokens = 32 * 4096;
  req.pins.strategy = StrategyKind::Fsdp;
  req.pins.wrap = WrapPolicy{WrapKind::Model, 1, 0};
  req.pins.reshard_after_forward = false;
  req.pins.act_ckpt = ActCkpt::Full;
  req.pins.offload = Offload::None;
  req.pins.param_dtype = DType::Bf16;
  req.pins.reduce_dtype = DType::Fp32;
  Strategy s = req.base;
  s.kind = StrategyKind::Fsdp;
  s.wrap = *req.pins.wrap;
  s.reshard_after_forward = false;
  s.act_ckpt = ActCkpt::Full;
  const Prediction two = simulate_at(req, s, 1, 2), one = simulate_at(req, s, 2, 1);
  REQUIRE(one.memory.device_total < two.memory.device_total);
  const double budget = (one.memory.device_total + two.memory.device_total) / 2;
  req.memory_headroom = 1.0 - budget / setup->hw.usable_device_memory.value;
  const SearchResult r = search_plans(req);
  MESSAGE("budget " << r.budget_bytes / kGiB << " GiB: micro-batch 1 x 2 needs " << two.memory.device_total / kGiB
                    << ", 2 x 1 needs " << one.memory.device_total / kGiB << "; the search found " << r.feasible
                    << " feasible of " << r.evaluated << " evaluated, " << r.pruned << " pruned");
  CHECK(r.feasible == 1);  // micro-batch 2 fits
}
