#include "program/float8_linears.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "program/tensor_parallel.hpp"

namespace fsdp {

namespace {
// Element sizes of torchao's roofline (roofline_utils.py BYTES_PER_EL_FLOAT8, BYTES_PER_EL_BF16).
constexpr double kFp8 = kFloat8ElementBytes;
constexpr double kBf16 = 2.0;
// torch._scaled_mm refuses operands whose widths are not multiples of 16.
constexpr int64_t kScaledMmAlignment = 16;
}  // namespace

bool float8_linear(const ModuleNode& n, const Strategy& s) {
  if (s.float8 == Float8Recipe::None || n.kind != ModuleKind::Linear) return false;
  return n.in_features % kScaledMmAlignment == 0 && n.out_features % kScaledMmAlignment == 0;
}

Float8CastElems float8_cast_elems_per_token(const ModuleGraph& g, ModuleId layer, const Strategy& s) {
  Float8CastElems e;
  const ModelSpec& m = g.spec();
  const int64_t tp = s.mesh.tp;
  const double t = static_cast<double>(tp), h = static_cast<double>(m.hidden_size);
  std::vector<std::string> cast_inputs;  // the column blocks' inputs cast once (tensorwise under tp)
  const std::vector<ModuleId> columns = tp > 1 ? tp_column_linears(g, layer) : std::vector<ModuleId>{};
  for (ModuleId leaf : g.leaves_under(layer)) {
    const ModuleNode& n = g.node(leaf);
    if (!float8_linear(n, s)) continue;
    const double in = static_cast<double>(n.in_features), out = static_cast<double>(n.out_features);
    // Without tp no linear is column-parallel and every share is 1: each linear casts its whole input and gradient.
    const bool column = std::find(columns.begin(), columns.end(), leaf) != columns.end();
    const double share = tp > 1 ? tp_linear_share(m, n, tp) : 1.0;
    if (tp > 1 && s.float8 == Float8Recipe::Tensorwise) {
      if (column) {
        const std::string input = n.saved.empty() ? n.name : n.saved.front().id;
        if (std::find(cast_inputs.begin(), cast_inputs.end(), input) == cast_inputs.end()) {
          cast_inputs.push_back(input);
          e.forward_shard += h / t;
        }
        e.backward += out * share;
        e.transposed += h;
      } else {
        e.forward += in * share;
        e.backward_shard += h / t;
        e.transposed += h;
      }
      continue;
    }
    if (column) {
      e.forward += in;
      e.backward += out * share;
      e.rescale += in;
    } else {
      e.forward += in * share;
      e.backward += out;
      e.rescale += in * share;
    }
  }
  return e;
}

double float8_activation_cast_bytes_per_element(Float8Recipe recipe) {
  switch (recipe) {
    case Float8Recipe::None:
      return 0;
    case Float8Recipe::Tensorwise:
      return kBf16 + kBf16 + 2.0 * kFp8;
    case Float8Recipe::Rowwise:
      return kBf16 + kFp8 + kBf16 + kBf16 + kFp8;
  }
  return 0;
}

double float8_shard_cast_bytes_per_element() { return kBf16 + kBf16 + kFp8; }

double float8_transpose_bytes_per_element() { return 2.0 * kFp8; }

double float8_backward_rescale_bytes_per_element(Float8Recipe recipe) {
  return recipe == Float8Recipe::Rowwise ? 2.0 * kBf16 : 0.0;
}

Float8WeightCastBytes float8_weight_cast_bytes_per_element(Float8Recipe recipe, bool float8_all_gather,
                                                           double shard_size) {
  FSDP_ASSERT(shard_size >= 1, "a shard group of at least one rank");
  Float8WeightCastBytes b;
  switch (recipe) {
    case Float8Recipe::None:
      break;
    case Float8Recipe::Tensorwise:
      if (float8_all_gather) {
        b.forward = (kBf16 + kFp8) / shard_size;
        b.backward = (kBf16 + kFp8) / shard_size + 2.0 * kFp8;
      } else {
        b.forward = kBf16 + kBf16 + kFp8;
        b.backward = kBf16 + kFp8;
      }
      break;
    case Float8Recipe::Rowwise:
      b.forward = kBf16 + kFp8;
      b.backward = 2.0 * kBf16 + kBf16 + kFp8 + float8_backward_rescale_bytes_per_element(recipe);
      break;
  }
  return b;
}

}  // namespace fsdp
