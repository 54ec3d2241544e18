#include "program/op_kinds.hpp"

#include <array>

namespace fsdp {

namespace {

template <typename E, std::size_t N>
std::optional<E> from_names(const std::array<const char*, N>& names, std::string_view s) {
  for (std::size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

constexpr std::array<const char*, static_cast<std::size_t>(Stream::kCount)> kStreamNames{
    "compute", "all-gather", "reduce", "h2d", "d2h", "host", "tensor-parallel", "pipeline", "expert-parallel"};

constexpr std::array<const char*, 18> kOpKindNames{"gather",
                                                   "forward",
                                                   "reshard",
                                                   "loss",
                                                   "loss-backward",
                                                   "backward",
                                                   "reduce-scatter",
                                                   "all-reduce",
                                                   "param-all-gather",
                                                   "copy-to-host",
                                                   "copy-to-device",
                                                   "optimizer-step",
                                                   "host-optimizer-step",
                                                   "grad-norm",
                                                   "scalar-all-reduce",
                                                   "tp-collective",
                                                   "pipeline-transfer",
                                                   "ep-all-to-all"};

constexpr std::array<const char*, 7> kCollectiveNames{"none",      "all-gather", "reduce-scatter", "all-reduce",
                                                      "broadcast", "send-recv",  "all-to-all"};
constexpr std::array<const char*, 7> kGroupNames{"shard", "replica", "world", "tensor", "pipeline", "mesh", "expert"};

constexpr std::array<const char*, 4> kWireNames{"fp64", "fp32", "bf16", "fp16"};

constexpr std::array<const char*, static_cast<std::size_t>(Phase::kCount)> kPhaseNames{"before the step",
                                                                                       "fwd all-gather",
                                                                                       "forward",
                                                                                       "free",
                                                                                       "head+loss forward",
                                                                                       "loss backward",
                                                                                       "bwd all-gather",
                                                                                       "backward",
                                                                                       "post-backward",
                                                                                       "reduce-scatter",
                                                                                       "all-reduce",
                                                                                       "bucket all-reduce",
                                                                                       "replica all-reduce",
                                                                                       "adapter all-reduce",
                                                                                       "gradients to host",
                                                                                       "gradient norm",
                                                                                       "gradient-norm all-reduce",
                                                                                       "overflow-check all-reduce",
                                                                                       "optimizer step",
                                                                                       "host optimizer step",
                                                                                       "all-gather updated parameters",
                                                                                       "parameters to device",
                                                                                       "loss all-reduce",
                                                                                       "tp forward collectives",
                                                                                       "tp backward collectives",
                                                                                       "vocab-parallel loss all-reduce",
                                                                                       "tp norm-gradient all-reduce",
                                                                                       "pp send activations",
                                                                                       "pp receive activations",
                                                                                       "pp send gradients",
                                                                                       "pp receive gradients",
                                                                                       "ep forward all-to-all",
                                                                                       "ep backward all-to-all"};

}  // namespace

const char* to_string(Stream s) {
  const auto i = static_cast<std::size_t>(s);
  return i < kStreamNames.size() ? kStreamNames[i] : "?";
}
const char* to_string(OpKind k) {
  const auto i = static_cast<std::size_t>(k);
  return i < kOpKindNames.size() ? kOpKindNames[i] : "?";
}
const char* to_string(CollectiveKind k) {
  const auto i = static_cast<std::size_t>(k);
  return i < kCollectiveNames.size() ? kCollectiveNames[i] : "?";
}
std::optional<CollectiveKind> collective_kind_from_string(std::string_view s) {
  return from_names<CollectiveKind>(kCollectiveNames, s);
}
const char* to_string(GroupKind g) {
  const auto i = static_cast<std::size_t>(g);
  return i < kGroupNames.size() ? kGroupNames[i] : "?";
}
std::optional<GroupKind> group_kind_from_string(std::string_view s) { return from_names<GroupKind>(kGroupNames, s); }
const char* to_string(WireType w) {
  const auto i = static_cast<std::size_t>(w);
  return i < kWireNames.size() ? kWireNames[i] : "?";
}
std::optional<WireType> wire_type_from_string(std::string_view s) { return from_names<WireType>(kWireNames, s); }
double bytes_of(WireType w) {
  switch (w) {
    case WireType::Fp64:
      return 8.0;
    case WireType::Fp32:
      return 4.0;
    case WireType::Bf16:
    case WireType::Fp16:
      return 2.0;
  }
  return 0.0;
}

const char* to_string(Phase p) {
  const auto i = static_cast<std::size_t>(p);
  return i < kPhaseNames.size() ? kPhaseNames[i] : "?";
}
std::optional<Phase> phase_from_string(std::string_view s) { return from_names<Phase>(kPhaseNames, s); }

bool is_step_phase(Phase p) {
  switch (p) {
    case Phase::BeforeStep:
    case Phase::GradientNorm:
    case Phase::GradientNormAllReduce:
    case Phase::OverflowCheckAllReduce:
    case Phase::OptimizerStep:
    case Phase::HostOptimizerStep:
    case Phase::ParamAllGather:
    case Phase::ParametersToDevice:
    case Phase::LossAllReduce:
      return true;
    default:
      return false;
  }
}

}  // namespace fsdp
