// The device mesh of a plan (simulator/strategy/mesh.hpp MeshSpec) as this rank's process groups. The world of
// pp x dp x tp ranks is laid out as torchtitan's ParallelDims builds it (torchtitan/distributed/parallel_dims.py:
// pp outermost, then the data-parallel dimensions, tp innermost so that a tensor-parallel group is consecutive
// ranks, inside a node): rank = (pp_rank x dp + dp_rank) x tp + tp_rank. The plan's data-parallel strategy (ddp,
// zero*, fsdp, hsdp) runs over the dp group: the ranks holding the same tensor-parallel slice of the same stage.
#pragma once

#include <memory>
#include <utility>

#include "model/model_spec.hpp"
#include "strategy/capabilities.hpp"
#include "strategy/strategy.hpp"

namespace fsdp::exec {

class Comm;
class Group;

struct Mesh {
  int tp = 1, dp = 1, pp = 1;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  bool sequence_parallel = false;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  std::shared_ptr<Group> tp_group, dp_group, pp_group;
  // The tp ranks sharing one kv head when kv_heads < tp (their k/v gradients are summed); size 1 otherwise.
  std::shared_ptr<Group> kv_group;
  int first_layer = 0, last_layer = -1;  // this stage's decoder layers [first, last]

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  // The global rank of mesh coordinates.
  int rank_of(int pp_r, int dp_r, int tp_r) const { return (pp_r * dp + dp_r) * tp + tp_r; }
};

// The layers of pipeline stage `stage` of `pp`: contiguous, the first L mod pp stages one layer more.
std::pair<int, int> stage_layers(int64_t num_layers, int pp, int stage);

// What fsdp-run runs of the capability table's mesh (simulator/strategy/capabilities.hpp): tp with or without
// sequence parallelism, pp with the 1f1b and gpipe schedules (train/pipeline.cpp), ZeRO-2/3 and FSDP per stage; not
// the interleaved schedule, not async TP and not tied embeddings over stages. configs/runtimes/fsdp-run.yaml's `mesh`
// section says the same to fsdp-plan (tests/executor/test_mesh_unit.cpp checks that they agree).
RuntimeSupport fsdp_run_support();

// The capability table's first violation for this plan on `world` ranks with fsdp_run_support(), as one InputError
// naming the plan key of the flag it blames ("strategy.tp: tp 2 does not divide the 3 attention heads of ...").
void check_mesh_supported(const ModelSpec& spec, const Strategy& strategy, int world);

// This rank's coordinates and groups; collective: every rank of the world calls it, in the same order.
Mesh make_mesh(Comm& comm, const ModelSpec& spec, const Strategy& strategy);

}  // namespace fsdp::exec
