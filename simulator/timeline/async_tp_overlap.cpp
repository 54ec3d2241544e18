#include "timeline/async_tp_overlap.hpp"

#include <algorithm>

namespace fsdp {

double async_tp_all_gather_matmul_exposed_s(const AsyncTpGemms& g, const AsyncTpMoves& m, int64_t tp) {
  const double t = static_cast<double>(tp);
  // _pipelined_all_gather_and_consume: stage + barrier, the local chunk's GEMMs with the first pull under them, then
  // the chain of tp - 1 pulls each followed by its chunk's GEMMs; the SMs do tp chunks' GEMMs in all.
  const double pipeline = std::max(t * g.pooled_s, (t - 1.0) * m.copy_s + g.single_s);
  return std::max(0.0, m.latency_s + m.stage_s + pipeline - g.whole_s);
}

double async_tp_matmul_reduce_scatter_exposed_s(const AsyncTpGemms& g, const AsyncTpMoves& m, int64_t tp) {
  const double t = static_cast<double>(tp);
  // _pipelined_produce_and_all2all: the first peer's chunk GEMM, then tp - 1 pulls chained, each after its chunk's
  // GEMM; the local chunk's last, under the final pulls; then the reduction of the partials.
  const double pipeline = std::max(t * g.pooled_s, g.single_s + (t - 1.0) * m.copy_s);
  return std::max(0.0, m.latency_s + pipeline + m.reduce_s - g.whole_s);
}

}  // namespace fsdp
