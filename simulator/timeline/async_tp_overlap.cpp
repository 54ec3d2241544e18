#include "timeline/async_tp_overlap.hpp"

#include <algorithm>
#include <cmath>

#include "compute/compute_cost.hpp"
#include "timeline/timeline.hpp"

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

bool async_tp_fused_exposed_s(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Strategy& s,
                              const AsyncTpMoves& moves, double& exposed_s) {
  const DType dt = s.param_dtype;
  const int64_t tp = s.mesh.tp, hidden = p.head_gemm.k;
  const bool gather = op.collective == CollectiveKind::AllGather;
  if (!gather && op.collective != CollectiveKind::ReduceScatter) return false;
  const bool backward = op.phase == Phase::TpBackwardCollectives;
  // A GEMM's time on the cost path by pass, its rows weighted as the layer's shape says (op_cost.cpp
  // gemm_pass_times, which prices the layers' GEMMs).
  enum class Pass { Forward, Gradient };
  auto gemm_s = [&](const GemmShape& g, Pass pass) {
    const GemmPassTimes t = gemm_pass_times(hw, g, dt);
    return pass == Pass::Forward ? t.forward : t.gradient;
  };
  auto add = [&](AsyncTpGemms& acc, const GemmShape& gs, Pass pass) {
    acc.whole_s += gemm_s(gs, pass);
    GemmShape part = gs;
    part.m = std::max<int64_t>(1, gs.m / tp);
    acc.single_s += gemm_s(part, pass);
    part.m = std::min(gs.m, std::max<int64_t>(1, 2 * gs.m / tp));
    acc.pooled_s += gemm_s(part, pass) / 2.0;
  };
  int calls = 0;
  double total = 0;
  auto price = [&](const AsyncTpGemms& g) {
    ++calls;
    total += gather ? async_tp_all_gather_matmul_exposed_s(g, moves, tp)
                    : async_tp_matmul_reduce_scatter_exposed_s(g, moves, tp);
  };
  // A block's column GEMMs (all, or those the per-op policy recomputes) in one fused call.
  auto columns = [&](const std::vector<GemmShape>& gm, size_t first, size_t end, Pass pass, bool recomputed_only) {
    AsyncTpGemms g;
    for (size_t i = first; i < end; ++i)
      if (!recomputed_only || gm[i].op_sac_recomputed) add(g, gm[i], pass);
    price(g);
  };
  auto single = [&](const GemmShape& gs, Pass pass) {
    AsyncTpGemms g;
    add(g, gs, pass);
    price(g);
  };
  for (int64_t l = op.first_layer; l >= 0 && l <= op.last_layer; ++l) {
    const std::vector<GemmShape>& gm =
        p.layer_shapes[static_cast<size_t>(p.layer_shape_of[static_cast<size_t>(l)])].gemms;
    if (gm.size() < 4) return false;
    // The blocks, read from the end as tp_overlap_gemms does: the MLP's row GEMM, its column GEMMs, the attention's
    // row GEMM, its column GEMMs [0, attn_row).
    const size_t mlp_row = gm.size() - 1;
    size_t j = mlp_row;
    while (j > 0 && gm[j - 1].k == hidden && gm[j - 1].n * tp != hidden) --j;
    if (j == mlp_row || j < 2) return false;
    const size_t mlp_first = j, attn_row = j - 1;
    const ActCkpt mode = layer_ckpt(s, l);
    const bool full = mode == ActCkpt::Full, sac_op = mode == ActCkpt::SelectiveOp;
    if (!backward && gather) {
      columns(gm, 0, attn_row, Pass::Forward, false);
      columns(gm, mlp_first, mlp_row, Pass::Forward, false);
    } else if (!backward) {
      single(gm[attn_row], Pass::Forward);
      single(gm[mlp_row], Pass::Forward);
    } else if (gather) {
      single(gm[attn_row], Pass::Gradient);
      single(gm[mlp_row], Pass::Gradient);
      if (full || sac_op) {
        columns(gm, 0, attn_row, Pass::Forward, sac_op);
        columns(gm, mlp_first, mlp_row, Pass::Forward, sac_op);
      }
    } else {
      if (attn_row == 1) single(gm[0], Pass::Gradient);
      if (mlp_row - mlp_first == 1) single(gm[mlp_first], Pass::Gradient);
      if (full) {
        single(gm[attn_row], Pass::Forward);
        single(gm[mlp_row], Pass::Forward);
      }
    }
  }
  const bool head = op.unit >= 0 && p.units[static_cast<size_t>(op.unit)].is_root && p.layout.holds_head();
  if (head && gather && !backward) single(p.head_gemm, Pass::Forward);
  if (head && !gather && backward) single(p.head_gemm, Pass::Gradient);
  if (calls != op.async_tp_fused_calls) return false;
  exposed_s = total;
  return true;
}

}  // namespace fsdp
