#include "timeline/tp_linear_overlap.hpp"

#include <algorithm>

namespace fsdp {

double tp_async_linear_exposed_s(CollectiveKind kind, bool backward, double one_s, int calls, const TpOverlapGemms& g,
                                 int64_t tp) {
  const double t = static_cast<double>(std::max<int64_t>(1, tp));
  auto exposed = [&](double hidden_s) { return std::max(0.0, one_s - hidden_s); };
  double out = 0;
  int covered = 0;
  for (const std::vector<TpBlockGemms>& blocks : g.layers) {
    for (const TpBlockGemms& b : blocks) {
      if (kind == CollectiveKind::AllGather && !backward) {
        out += exposed(b.column_forward_s / t);  // column input gathered under the rank's own output shard
        covered += 1;
      } else if (kind == CollectiveKind::ReduceScatter && !backward) {
        out += one_s;  // row output reduce-scattered, waited for
        covered += 1;
      } else if (kind == CollectiveKind::AllGather && backward) {
        // The column input gathered again under the input-gradient GEMM; the row output gradient gathered under
        // the rank's own shard of the row input gradient.
        out += exposed(b.column_backward_s) + exposed(b.row_backward_s / t);
        covered += 2;
      } else if (kind == CollectiveKind::ReduceScatter && backward) {
        out += exposed(b.column_backward_s);  // the column input gradient under the weight gradient
        covered += 1;
      }
    }
  }
  if (g.head) {
    if (kind == CollectiveKind::AllGather && !backward) {
      out += exposed(g.head_forward_s / t);
      covered += 1;
    } else if (kind == CollectiveKind::AllGather && backward) {
      out += exposed(g.head_backward_s);
      covered += 1;
    } else if (kind == CollectiveKind::ReduceScatter && backward) {
      out += exposed(g.head_backward_s);
      covered += 1;
    }
  }
  // The calls no linear overlaps (the embedding's), or a layer shape the pairing above does not describe.
  out += std::max(0, calls - covered) * one_s;
  return out;
}

}  // namespace fsdp
