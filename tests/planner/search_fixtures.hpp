// Shared set-up for the direct tests of the search (planner/search/plan_search.hpp): a request as fsdp-plan
// builds it (its defaults: README "Planner defaults"), over profiles loaded from the source tree.
#pragma once

#include <memory>
#include <string>

#include "model/model_loader.hpp"
#include "search/plan_search.hpp"

namespace fsdp::test {

struct SearchSetup {
  std::unique_ptr<ModuleGraph> graph;
  HardwareProfile hw;
  RuntimeProfile rt;
  SearchRequest req;
};

// fsdp-plan's defaults: sequence 4096, 4,194,304 tokens per optimizer step, 5% headroom, micro-batches to 64.
inline std::unique_ptr<SearchSetup> search_setup(const std::string& model, const std::string& hw, int64_t nodes,
                                                 const std::string& runtime = "fsdp-run", int64_t seq = 4096) {
  auto s = std::make_unique<SearchSetup>();
  s->graph = std::make_unique<ModuleGraph>(load_model(model, FSDP_SOURCE_ROOT));
  s->hw = load_hardware(hw, FSDP_SOURCE_ROOT);
  s->rt = load_runtime(runtime, FSDP_SOURCE_ROOT);
  s->req.graph = s->graph.get();
  s->req.hardware = &s->hw;
  s->req.runtime = &s->rt;
  s->req.cluster = Cluster{nodes, s->hw.gpus_per_node};
  s->req.base.seq_len = seq;
  s->req.global_batch_tokens = 4'194'304;
  s->req.memory_headroom = 0.05;
  s->req.max_micro_batch = 64;
  // The data-parallel space these tests describe (search_space.hpp); test_mesh_search.cpp searches the mesh. The
  // bounds beyond the micro-batch's are compared with the exhaustive search there too.
  s->req.pins.tp = 1;
  s->req.pins.pp = 1;
  s->req.bound_pruning = false;
  return s;
}

// Everything that identifies a point of the search space but the micro-batch (and the accumulation it implies).
inline std::string line_key(const Strategy& s) {
  return std::string(to_string(s.kind)) + " g" + std::to_string(s.hsdp_group) + " " + to_string(s.wrap) +
         (s.reshard_after_forward ? " reshard" : " keep") + " " + to_string(s.act_ckpt) + " " + to_string(s.offload) +
         " " + to_string(s.param_dtype) + "/" + to_string(s.reduce_dtype);
}

// An FSDP plan with every layer checkpointed and SDPA attention, one sequence a micro-batch, over a tp x pp mesh: the
// shape the export tests write to targets.
inline Strategy fsdp_full_ckpt_plan(int64_t grad_accum, int64_t tp, int64_t pp) {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.act_ckpt = ActCkpt::Full;
  s.attention = AttentionImpl::Sdpa;
  s.micro_batch = 1;
  s.grad_accum = grad_accum;
  s.mesh.tp = tp;
  s.mesh.pp = pp;
  return s;
}

inline std::string point_key(const Strategy& s) {
  return line_key(s) + " mb" + std::to_string(s.micro_batch) + " x" + std::to_string(s.grad_accum);
}

}  // namespace fsdp::test
