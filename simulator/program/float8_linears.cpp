#include "program/float8_linears.hpp"

#include "core/errors.hpp"

namespace fsdp {

namespace {
// Element sizes of torchao's roofline (roofline_utils.py BYTES_PER_EL_FLOAT8, BYTES_PER_EL_BF16).
constexpr double kFp8 = 1.0;
constexpr double kBf16 = 2.0;
// torch._scaled_mm refuses operands whose widths are not multiples of 16.
constexpr int64_t kScaledMmAlignment = 16;
}  // namespace

bool float8_linear(const ModuleNode& n, const Strategy& s) {
  if (s.float8 == Float8Recipe::None || n.kind != ModuleKind::Linear) return false;
  return n.in_features % kScaledMmAlignment == 0 && n.out_features % kScaledMmAlignment == 0;
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
