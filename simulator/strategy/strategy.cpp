#include "strategy/strategy.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <system_error>
#include <utility>

#include "core/unit_parse.hpp"

namespace fsdp {
namespace {

template <typename E, size_t N>
const char* name_of(E e, const std::array<std::pair<E, const char*>, N>& table) {
  for (const auto& [k, v] : table)
    if (k == e) return v;
  return "?";
}

template <typename E, size_t N>
bool value_of(const std::string& s, E& out, const std::array<std::pair<E, const char*>, N>& table) {
  for (const auto& [k, v] : table)
    if (s == v) {
      out = k;
      return true;
    }
  return false;
}

constexpr std::array<std::pair<StrategyKind, const char*>, 8> kStrategies{{
    {StrategyKind::NoShard, "no-shard"},
    {StrategyKind::Ddp, "ddp"},
    {StrategyKind::Zero1, "zero1"},
    {StrategyKind::Zero2, "zero2"},
    {StrategyKind::Zero3, "zero3"},
    {StrategyKind::Fsdp, "fsdp"},
    {StrategyKind::FsdpGradOp, "fsdp-grad-op"},
    {StrategyKind::Hsdp, "hsdp"},
}};
constexpr std::array<std::pair<ActCkpt, const char*>, 4> kActCkpt{{
    {ActCkpt::None, "none"},
    {ActCkpt::Full, "full"},
    {ActCkpt::Selective, "selective"},
    {ActCkpt::SelectiveOp, "selective-op"},
}};
constexpr const char* kEveryPrefix = "every:";
constexpr const char* kFractionPrefix = "fraction:";
constexpr std::array<std::pair<Offload, const char*>, 3> kOffload{{
    {Offload::None, "none"},
    {Offload::Optimizer, "optimizer"},
    {Offload::Params, "params"},
}};
constexpr std::array<std::pair<DType, const char*>, 3> kDType{{
    {DType::Fp32, "fp32"},
    {DType::Bf16, "bf16"},
    {DType::Fp16, "fp16"},
}};
constexpr std::array<std::pair<Optimizer, const char*>, 2> kOptimizer{{
    {Optimizer::AdamW, "adamw"},
    {Optimizer::Sgd, "sgd"},
}};
constexpr std::array<std::pair<Method, const char*>, 3> kMethod{{
    {Method::Full, "full"},
    {Method::Lora, "lora"},
    {Method::QLora, "qlora"},
}};
constexpr std::array<std::pair<AttentionImpl, const char*>, 5> kAttention{{
    {AttentionImpl::Flash, "flash"},
    {AttentionImpl::Sdpa, "sdpa"},
    {AttentionImpl::Eager, "eager"},
    {AttentionImpl::Flash3, "flash3"},
    {AttentionImpl::Flex, "flex"},
}};

constexpr std::array<std::pair<GradSync, const char*>, 2> kGradSync{{
    {GradSync::EveryMicroBatch, "every-micro-batch"},
    {GradSync::LastMicroBatch, "last-micro-batch"},
}};
constexpr std::array<std::pair<VisionTraining, const char*>, 3> kVisionTraining{{
    {VisionTraining::All, "all"},
    {VisionTraining::Projector, "projector"},
    {VisionTraining::None, "none"},
}};
constexpr std::array<std::pair<Float8Recipe, const char*>, 3> kFloat8{{
    {Float8Recipe::None, "none"},
    {Float8Recipe::Tensorwise, "tensorwise"},
    {Float8Recipe::Rowwise, "rowwise"},
}};

constexpr std::array<std::pair<KernelLibrary, const char*>, 2> kKernelLibrary{{
    {KernelLibrary::None, "none"},
    {KernelLibrary::Liger, "liger"},
}};

bool parse_i64(const std::string& s, int64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

const char* to_string(StrategyKind k) { return name_of(k, kStrategies); }
const char* to_string(ActCkpt k) { return name_of(k, kActCkpt); }
const char* to_string(Offload k) { return name_of(k, kOffload); }
const char* to_string(DType k) { return name_of(k, kDType); }
const char* to_string(Optimizer k) { return name_of(k, kOptimizer); }
const char* to_string(Method k) { return name_of(k, kMethod); }
const char* to_string(AttentionImpl k) { return name_of(k, kAttention); }
const char* to_string(GradSync k) { return name_of(k, kGradSync); }
const char* to_string(Float8Recipe k) { return name_of(k, kFloat8); }
const char* to_string(VisionTraining k) { return name_of(k, kVisionTraining); }
const char* to_string(KernelLibrary k) { return name_of(k, kKernelLibrary); }

std::string to_string(const WrapPolicy& w) {
  switch (w.kind) {
    case WrapKind::Layer:
      return "layer";
    case WrapKind::EveryK:
      return "every:" + std::to_string(w.every_k);
    case WrapKind::Size:
      return "size:" + std::to_string(w.min_params);
    case WrapKind::Model:
      return "model";
  }
  return "?";
}

bool parse_strategy_kind(const std::string& s, StrategyKind& o) { return value_of(s, o, kStrategies); }
std::string act_ckpt_name(ActCkpt mode, int64_t every) {
  if (mode == ActCkpt::Full && every > 1) return kEveryPrefix + std::to_string(every);
  return to_string(mode);
}
std::string act_ckpt_name(const Strategy& s) {
  if (s.act_ckpt == ActCkpt::Full && s.ckpt_fraction > 0) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, s.ckpt_fraction);  // the shortest text that reads back
    return kFractionPrefix + std::string(buf, r.ptr);
  }
  return act_ckpt_name(s.act_ckpt, s.ckpt_every);
}

bool parse_act_ckpt(const std::string& s, Strategy& out) {
  const std::string every = kEveryPrefix, fraction = kFractionPrefix;
  if (s.rfind(every, 0) == 0) {
    int64_t n = 0;
    if (!parse_i64(s.substr(every.size()), n) || n < 1) return false;
    out.act_ckpt = ActCkpt::Full;  // every:1 is full
    out.ckpt_every = n;
    out.ckpt_fraction = 0;
    return true;
  }
  if (s.rfind(fraction, 0) == 0) {
    const std::string v = s.substr(fraction.size());
    double p = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), p);
    if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || !(p > 0) || p > 1) return false;
    out.act_ckpt = ActCkpt::Full;
    out.ckpt_every = 1;
    out.ckpt_fraction = p < 1 ? p : 0;  // fraction:1 is full
    return true;
  }
  ActCkpt m{};
  if (!value_of(s, m, kActCkpt)) return false;
  out.act_ckpt = m;
  out.ckpt_every = 1;
  out.ckpt_fraction = 0;
  return true;
}

bool parse_act_ckpt(const std::string& s, ActCkpt& mode) {
  Strategy st;
  if (!parse_act_ckpt(s, st) || st.ckpt_every != 1 || st.ckpt_fraction != 0) return false;
  mode = st.act_ckpt;
  return true;
}

bool checkpoints_every_layer(const Strategy& s) {
  return s.act_ckpt == ActCkpt::Full && s.ckpt_every <= 1 && s.ckpt_fraction == 0;
}

ActCkpt layer_ckpt(const Strategy& s, int64_t layer) {
  if (s.act_ckpt != ActCkpt::Full) return s.act_ckpt;
  if (s.ckpt_fraction > 0) {
    // fms-fsdp's apply_fsdp_checkpointing (strategy.hpp): the blocks counted from 1, in order.
    double cut_off = 0.5;
    bool checkpointed = false;
    for (int64_t block = 1; block <= layer + 1; ++block) {
      checkpointed = static_cast<double>(block) * s.ckpt_fraction >= cut_off;
      if (checkpointed) cut_off += 1.0;
    }
    return checkpointed ? ActCkpt::Full : ActCkpt::None;
  }
  if (s.ckpt_every <= 1) return s.act_ckpt;
  // torchtitan _apply_layer_sac (torchtitan/distributed/activation_checkpoint.py, pytorch/torchtitan@1f029641):
  //   _layer_sac_count += 1; if not ac_freq or _layer_sac_count % ac_freq == 0: checkpoint_wrapper(block)
  // with the count starting at 0 and the blocks wrapped in order (apply_ac: layers.named_children()).
  return (layer + 1) % s.ckpt_every == 0 ? ActCkpt::Full : ActCkpt::None;
}

bool recomputes_attention(ActCkpt m) { return m == ActCkpt::Full || m == ActCkpt::Selective; }
bool recomputes_layer_forward(ActCkpt m) { return m == ActCkpt::Full || m == ActCkpt::SelectiveOp; }
bool parse_offload(const std::string& s, Offload& o) { return value_of(s, o, kOffload); }
bool parse_dtype(const std::string& s, DType& o) { return value_of(s, o, kDType); }
bool parse_optimizer(const std::string& s, Optimizer& o) { return value_of(s, o, kOptimizer); }
bool parse_method(const std::string& s, Method& o) { return value_of(s, o, kMethod); }
bool parse_attention(const std::string& s, AttentionImpl& o) { return value_of(s, o, kAttention); }
bool parse_grad_sync(const std::string& s, GradSync& o) { return value_of(s, o, kGradSync); }
bool parse_float8(const std::string& s, Float8Recipe& o) { return value_of(s, o, kFloat8); }
bool parse_vision_training(const std::string& s, VisionTraining& o) { return value_of(s, o, kVisionTraining); }
bool parse_kernel_library(const std::string& s, KernelLibrary& o) { return value_of(s, o, kKernelLibrary); }

bool fsdp_family(StrategyKind k) {
  return k == StrategyKind::Fsdp || k == StrategyKind::FsdpGradOp || k == StrategyKind::Hsdp;
}

bool grad_sync_applies(const Strategy& s) { return fsdp_family(s.kind) && s.offload == Offload::None; }

bool parse_wrap(const std::string& s, WrapPolicy& w) {
  if (s == "layer") {
    w = WrapPolicy{WrapKind::Layer, 1, 0};
    return true;
  }
  if (s == "model") {
    w = WrapPolicy{WrapKind::Model, 1, 0};
    return true;
  }
  int64_t n = 0;
  if (s.rfind("every:", 0) == 0 && parse_i64(s.substr(6), n) && n > 0) {
    w = WrapPolicy{WrapKind::EveryK, n, 0};
    return true;
  }
  // size:N, N a parameter count as --tokens takes one (a number, or K, M, B: size:100M), a whole number of them.
  if (s.rfind("size:", 0) == 0) {
    const std::optional<double> v = parse_count(s.substr(5));
    if (!v || *v < 1 || *v >= static_cast<double>(std::numeric_limits<int64_t>::max()) || std::floor(*v) != *v)
      return false;
    w = WrapPolicy{WrapKind::Size, 1, static_cast<int64_t>(*v)};
    return true;
  }
  return false;
}

int dtype_bytes(DType d) {
  switch (d) {
    case DType::Fp32:
      return 4;
    case DType::Bf16:
    case DType::Fp16:
      return 2;
  }
  return 4;
}

bool shards_params(StrategyKind k) {
  return k == StrategyKind::Zero3 || k == StrategyKind::Fsdp || k == StrategyKind::FsdpGradOp ||
         k == StrategyKind::Hsdp;
}
bool shards_grads(StrategyKind k) { return k == StrategyKind::Zero2 || shards_params(k); }
bool shards_optimizer(StrategyKind k) { return k == StrategyKind::Zero1 || shards_grads(k); }

std::string strategy_identity(const Strategy& s) {
  std::vector<std::string> mods = s.lora.target_modules;
  std::sort(mods.begin(), mods.end());
  std::string m;
  for (const auto& x : mods) m += x + ",";
  return std::string(to_string(s.kind)) + " group=" + std::to_string(s.hsdp_group) + " wrap=" + to_string(s.wrap) +
         " reshard=" + (s.reshard_after_forward ? "1" : "0") + " ckpt=" + act_ckpt_name(s) +
         " offload=" + to_string(s.offload) + " dtypes=" + to_string(s.param_dtype) + "/" + to_string(s.reduce_dtype) +
         "/" + to_string(s.master_dtype) + " mb=" + std::to_string(s.micro_batch) +
         " seq=" + std::to_string(s.seq_len) + " doc=" + std::to_string(s.doc_len) +
         " acc=" + std::to_string(s.grad_accum) + " opt=" + to_string(s.optimizer) + " method=" + to_string(s.method) +
         " r=" + std::to_string(s.lora.rank) + " mods=" + m + " attn=" + to_string(s.attention) +
         " fp=" + std::to_string(s.forward_prefetch) + " bp=" + std::to_string(s.backward_prefetch) +
         " bucket=" + std::to_string(s.ddp_bucket_mb) + " sync=" + to_string(s.grad_sync) +
         " tp=" + std::to_string(s.mesh.tp) + " sp=" + (s.mesh.sequence_parallel ? "1" : "0") +
         " async_tp=" + (s.mesh.async_tp ? "1" : "0") + " pp=" + std::to_string(s.mesh.pp) +
         " schedule=" + to_string(s.mesh.pp_schedule) + " v=" + std::to_string(s.mesh.pp_virtual_stages) +
         " ep=" + std::to_string(s.mesh.ep) + " float8=" + to_string(s.float8) +
         " f8ag=" + (s.float8_all_gather ? "1" : "0") + " vision=" + to_string(s.train_vision) +
         " kernels=" + to_string(s.kernels);
}

}  // namespace fsdp
