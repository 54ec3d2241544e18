#include "shard/mesh.hpp"

#include <string>
#include <vector>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "model/tensor_parallel.hpp"

namespace fsdp::exec {

std::pair<int, int> stage_layers(int64_t num_layers, int pp, int stage) {
  const RowRange r = split_rows(num_layers, pp, stage);
  return {static_cast<int>(r.start), static_cast<int>(r.start + r.size - 1)};
}

void check_mesh_supported(const ModelSpec& spec, const Strategy& s, int world) {
  const MeshSpec& m = s.mesh;
  const std::string tp = std::to_string(m.tp), pp = std::to_string(m.pp);
  if (world % m.model_parallel() != 0)
    throw InputError("strategy.tp x strategy.pp = " + tp + " x " + pp + " does not divide the world size " +
                     std::to_string(world));
  const int64_t dp = m.dp(world);
  if (s.kind == StrategyKind::Hsdp && (s.hsdp_group <= 0 || dp % s.hsdp_group != 0))
    throw InputError("hsdp_group " + std::to_string(s.hsdp_group) + " must divide the data-parallel size " +
                     std::to_string(dp) + (m.is_data_parallel_only() ? "" : " (world / (tp x pp))"));
  if (m.is_data_parallel_only()) return;
  if (m.tp > 1) {
    if (spec.num_heads % m.tp != 0)
      throw InputError("strategy.tp " + tp + " does not divide the model's num_heads " +
                       std::to_string(spec.num_heads) + " (each rank computes whole attention heads)");
    if (spec.num_kv_heads % m.tp != 0 && m.tp % spec.num_kv_heads != 0)
      throw InputError("strategy.tp " + tp + " and the model's num_kv_heads " + std::to_string(spec.num_kv_heads) +
                       ": one must divide the other (kv heads split over tp, or each replicated over tp / kv_heads "
                       "ranks)");
    if (spec.vocab_size < m.tp || spec.ffn_size < m.tp)
      throw InputError("strategy.tp " + tp + " exceeds the model's vocab_size or ffn_size (every rank needs a row)");
    if (m.sequence_parallel && s.seq_len % m.tp != 0)
      throw InputError("strategy.seq_len " + std::to_string(s.seq_len) + " is not divisible by strategy.tp " + tp +
                       " (strategy.sequence_parallel splits the sequence over tp)");
    if (m.async_tp)
      throw InputError(
          "strategy.async_tp: fsdp-run runs the tp collectives as they are (no decomposition into the GEMMs); "
          "set async_tp: false");
    if (spec.moe)
      throw InputError("strategy.tp " + tp +
                       " with MoE layers: fsdp-run splits dense layers only (no expert "
                       "parallelism); use tp 1");
  }
  if (m.pp > 1) {
    if (m.pp > spec.num_layers)
      throw InputError("strategy.pp " + pp + " exceeds the model's num_layers " + std::to_string(spec.num_layers) +
                       " (every stage needs a decoder layer)");
    if (m.pp_schedule == PipelineSchedule::Interleaved1F1B || m.pp_virtual_stages != 1)
      throw InputError(
          "strategy.pp_schedule interleaved-1f1b (pp_virtual_stages > 1) is not run by fsdp-run; use 1f1b or gpipe");
    if (spec.tied_embeddings)
      throw InputError("strategy.pp " + pp +
                       " with tied embeddings: the embedding (first stage) and the head (last stage) would share a "
                       "weight across stages, which fsdp-run does not synchronise; use pp 1 or an untied head");
  }
  if (s.method != Method::Full)
    throw InputError(std::string("method ") + to_string(s.method) + " with strategy.tp " + tp + ", strategy.pp " + pp +
                     ": fsdp-run runs adapters on data-parallel plans only");
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
