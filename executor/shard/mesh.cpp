#include "shard/mesh.hpp"

#include <string>
#include <vector>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "model/tensor_parallel.hpp"
#include "planfile/plan_keys.hpp"

namespace fsdp::exec {

std::pair<int, int> stage_layers(int64_t num_layers, int pp, int stage) {
  const RowRange r = split_rows(num_layers, pp, stage);
  return {static_cast<int>(r.start), static_cast<int>(r.start + r.size - 1)};
}

RuntimeSupport fsdp_run_support() {
  RuntimeSupport rt;
  rt.runtime_name = "fsdp-run";
  // model/tensor_parallel.cpp runs the tp collectives as they are, not decomposed into the GEMMs.
  rt.async_tp = false;
  // train/pipeline.cpp runs one model chunk per stage: 1f1b and gpipe.
  rt.interleaved_pipeline = false;
  // The embedding (first stage) and the head (last stage) would share one weight; nothing synchronises it.
  rt.pipeline_tied_embeddings = false;
  // Each stage's ShardedModel reduce-scatters its own units' gradients over its data-parallel group, whatever the
  // strategy (tests/executor/test_mesh.cpp runs zero2 and fsdp-grad-op with pp against one process).
  rt.pipeline_partitioned_gradients = true;
  // model/tensor_parallel.cpp split_rows: an MLP width tp does not divide splits into rows as even as they go (every
  // rank needs one).
  rt.uneven_ffn_split = true;
  // shard/sharded_model.cpp offloads the shards a rank owns, whatever its stage and tp slice.
  rt.mesh_offload = true;
  // LibTorch's linears only: no float8 tensor type in 1.13, and no torch._scaled_mm path in the executor.
  rt.float8_linears = false;
  rt.float8_all_gather = false;
  // model/moe.cpp runs every routed expert on the rank: no token dispatch to other ranks.
  rt.expert_parallel = false;
  return rt;
}

void check_mesh_supported(const ModelSpec& spec, const Strategy& s, int world) {
  // fsdp-run runs a tp group across nodes (its collectives are slower there, not different): the node is the
  // whole world for the table's within-node rule, which is the simulator's pricing premise (NVLink).
  const MeshWorld w{world, world};
  if (auto v = first_violation(s, spec, w, fsdp_run_support()))
    throw InputError(plan_key_of_flag(v->flag) + ": " + v->reason);
}

Mesh make_mesh(Comm& comm, const ModelSpec& spec, const Strategy& s) {
  Mesh m;
  m.tp = static_cast<int>(s.mesh.tp);
  m.pp = static_cast<int>(s.mesh.pp);
  m.dp = comm.size() / (m.tp * m.pp);
  m.sequence_parallel = m.tp > 1 && s.mesh.sequence_parallel;
  m.schedule = s.mesh.pp_schedule;
  if (m.pp > 1 && comm.world().is_local() && comm.size() > 1)
    throw InputError("--emulate-world-size rehearses rank 0 alone; a pipeline (strategy.pp " + std::to_string(m.pp) +
                     ") needs its other stages to run");
  const int r = comm.rank();
  m.tp_rank = r % m.tp;
  m.dp_rank = (r / m.tp) % m.dp;
  m.pp_rank = r / (m.tp * m.dp);
  std::tie(m.first_layer, m.last_layer) = stage_layers(spec.num_layers, m.pp, m.pp_rank);
  // Every rank creates its groups in the same order (tp, dp, pp, kv): creation is collective among the members.
  auto group = [&](const char* kind, std::vector<int> members) {
    std::string tag = kind;
    for (int x : members) tag += "." + std::to_string(x);
    return comm.subgroup(tag, members);
  };
  std::vector<int> tp_m, dp_m, pp_m, kv_m;
  for (int i = 0; i < m.tp; ++i) tp_m.push_back(m.rank_of(m.pp_rank, m.dp_rank, i));
  for (int i = 0; i < m.dp; ++i) dp_m.push_back(m.rank_of(m.pp_rank, i, m.tp_rank));
  for (int i = 0; i < m.pp; ++i) pp_m.push_back(m.rank_of(i, m.dp_rank, m.tp_rank));
  const int kv = m.tp > 1 ? kv_group_size(spec, m.tp) : 1;
  for (int i = 0; i < kv; ++i) kv_m.push_back(m.rank_of(m.pp_rank, m.dp_rank, m.tp_rank / kv * kv + i));
  m.tp_group = group("tp", tp_m);
  m.dp_group = group("dp", dp_m);
  m.pp_group = group("pp", pp_m);
  m.kv_group = group("kv", kv_m);
  return m;
}

}  // namespace fsdp::exec
