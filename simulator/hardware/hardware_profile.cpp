// Loader for hwprofiles/*.yaml (schema and sources: docs/hardware.md).
#include "hardware/hardware_profile.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/config_map.hpp"
#include "core/config_path.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"

namespace fsdp {

double EfficiencyCurve::at(double value) const {
  FSDP_ASSERT(!x.empty() && x.size() == efficiency.size(), "efficiency curve without points");
  if (!(value > x.front())) return efficiency.front();
  if (value >= x.back()) return efficiency.back();
  auto hi = std::upper_bound(x.begin(), x.end(), value);
  size_t i = static_cast<size_t>(hi - x.begin());
  double t0 = std::log2(x[i - 1]), t1 = std::log2(x[i]);
  double w = (std::log2(value) - t0) / (t1 - t0);
  return efficiency[i - 1] + w * (efficiency[i] - efficiency[i - 1]);
}

FlopsPerSecond HardwareProfile::rated_peak_flops(DType d) const {
  switch (d) {
    case DType::Fp32:
      return peak_flops_fp32;
    case DType::Bf16:
      return peak_flops_bf16;
    case DType::Fp16:
      return peak_flops_fp16;
  }
  return peak_flops_fp32;
}

Hertz HardwareProfile::boost_clock_of(DType d) const {
  return d == DType::Fp32 && boost_clock_fp32.value > 0 ? boost_clock_fp32 : boost_clock;
}

double HardwareProfile::clock_scale(DType d) const {
  const Hertz rated = boost_clock_of(d);
  // The loader refuses a sustained clock without a boost clock; a hand-built profile without one is unscaled.
  if (!(sustained_clock.value > 0) || !(rated.value > 0)) return 1.0;
  return std::min(1.0, sustained_clock / rated);
}

FlopsPerSecond HardwareProfile::peak_flops(DType d) const { return rated_peak_flops(d) * clock_scale(d); }

FlopsPerSecond HardwareProfile::float8_peak_flops() const { return peak_flops_fp8 * clock_scale(DType::Bf16); }

const char* to_string(Fabric f) {
  switch (f) {
    case Fabric::InfiniBand:
      return "infiniband";
    case Fabric::RoCE:
      return "roce";
    case Fabric::Efa:
      return "efa";
    case Fabric::Unstated:
      break;
  }
  return "not stated";
}

const char* display_name(Fabric f) {
  switch (f) {
    case Fabric::InfiniBand:
      return "InfiniBand";
    case Fabric::RoCE:
      return "RoCE";
    case Fabric::Efa:
      return "EFA";
    case Fabric::Unstated:
      break;
  }
  return "fabric not stated";
}

namespace {

const EfficiencyCurve& pick(const EfficiencyCurve& shared, const EfficiencyCurve& bf16, const EfficiencyCurve& fp16,
                            DType d) {
  if (d == DType::Bf16 && !bf16.empty()) return bf16;
  if (d == DType::Fp16 && !fp16.empty()) return fp16;
  return shared;
}

}  // namespace

const EfficiencyCurve& HardwareProfile::matmul_curve(DType d) const {
  return pick(matmul_efficiency, matmul_efficiency_bf16, matmul_efficiency_fp16, d);
}
const EfficiencyCurve& HardwareProfile::attention_forward_curve(DType d) const {
  return pick(attention_efficiency, attention_efficiency_bf16, attention_efficiency_fp16, d);
}
const EfficiencyCurve& HardwareProfile::attention_backward_curve(DType d) const {
  return pick(attention_backward_efficiency, attention_backward_efficiency_bf16, attention_backward_efficiency_fp16, d);
}

const HostOverhead& HardwareProfile::host_overhead(DType d) const {
  if (d == DType::Bf16 && !host_overhead_bf16.empty()) return host_overhead_bf16;
  if (d == DType::Fp16 && !host_overhead_fp16.empty()) return host_overhead_fp16;
  return host_overhead_fp32;
}

BytesPerSecond HardwareProfile::elementwise_bandwidth(DType d) const {
  // The dtype's own entry (a rate, or a fraction of the memory's bandwidth), else fp32's, else the memory's.
  if (d == DType::Bf16 && elementwise_bandwidth_bf16.value > 0) return elementwise_bandwidth_bf16;
  if (d == DType::Bf16 && elementwise_efficiency_bf16 > 0) return memory_bandwidth * elementwise_efficiency_bf16;
  if (d == DType::Fp16 && elementwise_bandwidth_fp16.value > 0) return elementwise_bandwidth_fp16;
  if (d == DType::Fp16 && elementwise_efficiency_fp16 > 0) return memory_bandwidth * elementwise_efficiency_fp16;
  if (elementwise_bandwidth_fp32.value > 0) return elementwise_bandwidth_fp32;
  if (elementwise_efficiency_fp32 > 0) return memory_bandwidth * elementwise_efficiency_fp32;
  return memory_bandwidth;
}

BytesPerSecond HardwareProfile::copy_bandwidth(DType d) const {
  if (copy_efficiency > 0) return memory_bandwidth * copy_efficiency;
  return elementwise_bandwidth(d);
}

BytesPerSecond HardwareProfile::softmax_bandwidth(DType d) const {
  if (softmax_efficiency > 0) return memory_bandwidth * softmax_efficiency;
  return elementwise_bandwidth(d);
}

double HardwareProfile::matmul_forward_ratio(DType d) const {
  const double r = d == DType::Bf16   ? matmul_forward_ratio_bf16
                   : d == DType::Fp16 ? matmul_forward_ratio_fp16
                                      : matmul_forward_ratio_fp32;
  return r > 0 ? r : 1.0;
}

double cpu_cores_per_rank(int cpu_cores, int ranks_per_node) {
  const double cores = std::max(1, cpu_cores), ranks = std::max(1, ranks_per_node);
  // torchrun sets OMP_NUM_THREADS=1 per worker when nproc_per_node > 1 (torch/distributed/run.py); fsdp-run
  // gives each local rank floor(cores / ranks) threads (executor/dist/device.cpp). A rank cannot use more
  // threads than it runs, and when ranks outnumber cores the scheduler shares the cores out: cores / ranks.
  return ranks <= cores ? std::floor(cores / ranks) : cores / ranks;
}

bool cpu_ranks_poll(int cpu_cores, int ranks_per_node) { return ranks_per_node <= std::max(1, cpu_cores); }

const std::array<HardwareProfile::InStepFactorField, 4>& HardwareProfile::in_step_factor_fields() {
  static const std::array<InStepFactorField, 4> fields{{
      {"in_step_factor", &HardwareProfile::collective_in_step_factor},
      {"in_step_factor_shared_cores", &HardwareProfile::collective_in_step_factor_shared_cores},
      {"in_step_factor_fp32", &HardwareProfile::collective_in_step_factor_fp32},
      {"in_step_factor_shared_cores_fp32", &HardwareProfile::collective_in_step_factor_shared_cores_fp32},
  }};
  return fields;
}

double HardwareProfile::in_step_factor(int ranks_per_node, DType compute) const {
  const bool fp32 = compute == DType::Fp32;
  if (device_kind == "cpu" && !cpu_ranks_poll(cpu_cores, ranks_per_node)) {
    if (fp32 && collective_in_step_factor_shared_cores_fp32) return *collective_in_step_factor_shared_cores_fp32;
    if (collective_in_step_factor_shared_cores) return *collective_in_step_factor_shared_cores;
  }
  if (fp32 && collective_in_step_factor_fp32) return *collective_in_step_factor_fp32;
  return collective_in_step_factor.value_or(1.0);
}

double cpu_compute_slowdown(const HardwareProfile& hw, int ranks_per_node) {
  if (hw.device_kind != "cpu") return 1.0;
  const double measured = hw.device_cores > 0 ? hw.device_cores : double(std::max(1, hw.cpu_cores));
  return std::max(1.0, measured / cpu_cores_per_rank(hw.cpu_cores, ranks_per_node));
}

namespace {

enum class CurveX { Bytes, Number };

// A curve is a list of {<x_key>: value, efficiency: e} maps. x_key names the unit of x:
// "message" is a size with a unit ("1 MiB"); "gemm_flops" and "attention_flops" are plain
// FLOP counts per call (the key carries the unit).
EfficiencyCurve read_curve(ConfigMap& parent, const std::string& key, const std::string& x_key, CurveX kind) {
  std::vector<ConfigMap> items = parent.get_list_of_maps(key);
  if (items.empty()) parent.fail(key, "an efficiency curve needs at least one point");
  EfficiencyCurve c;
  for (auto& item : items) {
    double xv = 0;
    if (kind == CurveX::Bytes) {
      xv = item.get_bytes(x_key).value;
      if (!(xv > 0)) item.fail(x_key, "must be positive");
    } else {
      xv = item.get_positive_double(x_key);
    }
    double e = item.get_double("efficiency");
    if (!(e > 0 && e <= 1)) item.fail("efficiency", "must be within (0, 1], got " + std::to_string(e));
    if (!c.x.empty()) {
      if (!(xv > c.x.back())) item.fail(x_key, "points must be sorted by strictly increasing " + x_key);
      // Time is proportional to x / e(x); with e linear in log2(x) that is non-decreasing on a
      // segment iff the rise per doubling of x is at most ln(2) * e at the segment's start.
      double rise_per_doubling = (e - c.efficiency.back()) / (std::log2(xv) - std::log2(c.x.back()));
      if (rise_per_doubling > std::log(2.0) * c.efficiency.back() + 1e-12)
        item.fail("efficiency",
                  "rises faster than " + x_key + " from the previous point (more work would take less time)");
    }
    item.finish();
    c.x.push_back(xv);
    c.efficiency.push_back(e);
  }
  return c;
}

int positive_int(ConfigMap& m, const std::string& key) {
  int64_t v = m.get_positive_int(key);
  if (v > (1 << 20)) m.fail(key, "implausibly large: " + std::to_string(v));
  return static_cast<int>(v);
}

Bytes positive_bytes(ConfigMap& m, const std::string& key) {
  Bytes b = m.get_bytes(key);
  if (!(b.value > 0)) m.fail(key, "must be positive");
  return b;
}

// "1830 MHz", "1.98 GHz", "700 W": a positive number and one of `units` (name, factor to the SI base unit).
// Clocks and power are read only here, so their units are interpreted here rather than in core/unit_parse.
double positive_with_unit(ConfigMap& m, const std::string& key,
                          std::initializer_list<std::pair<std::string_view, double>> units, const char* example) {
  const std::string text = m.get_string(key);
  std::string_view s(text);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  std::string_view unit(ptr, static_cast<size_t>(s.data() + s.size() - ptr));
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  if (ec == std::errc() && std::isfinite(v))
    for (const auto& [name, factor] : units)
      if (unit == name) {
        if (!(v > 0)) m.fail(key, "must be positive, got '" + text + "'");
        return v * factor;
      }
  m.fail(key, std::string("expected a value with a unit such as ") + example + ", got '" + text + "'");
}

constexpr double kKilo = 1e3, kMega = 1e6, kGiga = 1e9;

Hertz read_clock(ConfigMap& m, const std::string& key) {
  return Hertz(positive_with_unit(m, key, {{"Hz", 1.0}, {"kHz", kKilo}, {"MHz", kMega}, {"GHz", kGiga}},
                                  "'1830 MHz' or '1.98 GHz'"));
}

Watts read_power(ConfigMap& m, const std::string& key) {
  return Watts(positive_with_unit(m, key, {{"W", 1.0}, {"kW", kKilo}}, "'700 W'"));
}

// `device.matmul_tiles: [[256, 128], [128, 128]]`: a list of [rows, columns] output tile shapes, positive integers.
std::vector<std::pair<int64_t, int64_t>> read_tiles(ConfigMap& m, const std::string& key) {
  const YAML::Node list = m.take_raw(key);
  if (!list.IsSequence() || list.size() == 0) m.fail(key, "expected a list of [rows, columns] tile shapes");
  constexpr int64_t kMaxTileSide = 1 << 16;  // no GEMM kernel's tile is near this: a typo, not a tile
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node t = list[i];
    int64_t side[2] = {0, 0};
    bool ok = t.IsSequence() && t.size() == 2;
    for (size_t j = 0; ok && j < 2; ++j) {
      const YAML::Node v = t[j];
      ok = v.IsScalar();
      if (!ok) break;
      const std::string& text = v.Scalar();
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), side[j]);
      ok = ec == std::errc() && ptr == text.data() + text.size() && side[j] > 0 && side[j] <= kMaxTileSide;
    }
    if (!ok)
      m.fail(key, "item " + std::to_string(i) + ": expected [rows, columns], two positive integers up to " +
                      std::to_string(kMaxTileSide));
    tiles.emplace_back(side[0], side[1]);
  }
  return tiles;
}

// Whether to read `key` of `m`: always when the mapping is a file's own (every required key must be there), and
// only when present when it overrides a base's mapping (an absent key keeps the base's value).
bool given(const ConfigMap& m, const std::string& key, bool inherit) { return !inherit || m.has(key); }

// Reads tier `key` of `parent` onto `tier` (`inherit`: a base's tier, overridden key by key). `fabric`, for the
// inter-node tier only, receives the optional `fabric` key.
void read_tier(ConfigMap& parent, const std::string& key, bool inherit, LinkTier& tier, Fabric* fabric) {
  if (!given(parent, key, inherit)) return;
  ConfigMap t = parent.get_map(key);
  if (given(t, "bandwidth", inherit)) tier.bandwidth = t.get_bandwidth("bandwidth");
  if (given(t, "latency", inherit)) tier.latency = t.get_duration("latency");
  if (given(t, "bus_efficiency", inherit))
    tier.bus_efficiency = read_curve(t, "bus_efficiency", "message", CurveX::Bytes);
  // Optional per-collective curves (docs/hardware.md): absent, the collective uses bus_efficiency.
  for (auto [k, curve] : {std::pair{"bus_efficiency_all_gather", &tier.bus_efficiency_all_gather},
                          std::pair{"bus_efficiency_reduce_scatter", &tier.bus_efficiency_reduce_scatter},
                          std::pair{"bus_efficiency_all_reduce", &tier.bus_efficiency_all_reduce}})
    if (t.has(k)) *curve = read_curve(t, k, "message", CurveX::Bytes);
  if (t.has("bus_efficiency_by_nodes"))
    tier.bus_efficiency_by_nodes = read_curve(t, "bus_efficiency_by_nodes", "nodes", CurveX::Number);
  // Optional per-collective factors by node count (docs/hardware.md): absent, the collective uses
  // bus_efficiency_by_nodes.
  for (auto [k, curve] :
       {std::pair{"bus_efficiency_by_nodes_all_gather", &tier.bus_efficiency_by_nodes_all_gather},
        std::pair{"bus_efficiency_by_nodes_reduce_scatter", &tier.bus_efficiency_by_nodes_reduce_scatter}})
    if (t.has(k)) *curve = read_curve(t, k, "nodes", CurveX::Number);
  if (fabric != nullptr && t.has("fabric")) {
    const std::string f = t.get_enum("fabric", {"infiniband", "roce", "efa"});
    *fabric = f == "infiniband" ? Fabric::InfiniBand : f == "roce" ? Fabric::RoCE : Fabric::Efa;
  }
  t.finish();
}

void read_device(ConfigMap& dev, bool inherit, HardwareProfile& hw) {
  auto required = [&](const char* key) { return given(dev, key, inherit); };
  if (required("memory")) hw.device_memory = positive_bytes(dev, "memory");
  if (required("usable_memory")) hw.usable_device_memory = positive_bytes(dev, "usable_memory");
  if (required("peak_flops")) {
    ConfigMap peak = dev.get_map("peak_flops");
    for (auto [key, field] : {std::pair{"fp32", &hw.peak_flops_fp32}, std::pair{"bf16", &hw.peak_flops_bf16},
                              std::pair{"fp16", &hw.peak_flops_fp16}})
      if (given(peak, key, inherit)) *field = peak.get_flops_rate(key);
    if (peak.has("fp8")) hw.peak_flops_fp8 = peak.get_flops_rate("fp8");
    peak.finish();
  }
  // Clocks and power (optional, docs/hardware.md "Clocks and power"); their consistency is checked once the
  // profile is whole (check_profile).
  for (auto [key, field] :
       {std::pair{"boost_clock", &hw.boost_clock}, std::pair{"boost_clock_fp32", &hw.boost_clock_fp32},
        std::pair{"sustained_clock", &hw.sustained_clock}})
    if (dev.has(key)) *field = read_clock(dev, key);
  for (auto [key, field] : {std::pair{"tdp", &hw.tdp}, std::pair{"power_limit", &hw.power_limit}})
    if (dev.has(key)) *field = read_power(dev, key);
  if (dev.has("sm_count")) hw.sm_count = positive_int(dev, "sm_count");
  // `device.compute_capability: "9.0"`: strictly major.minor as NVIDIA's CUDA GPUs page lists it (a quoted string,
  // so that YAML does not read 9.0 as the number 9).
  if (dev.has("compute_capability")) {
    const std::string text = dev.get_string("compute_capability");
    const std::optional<ComputeCapability> cc = parse_compute_capability(text);
    if (!cc)
      dev.fail(
          "compute_capability",
          "'" + text + "' is not a compute capability: expected major.minor, e.g. \"9.0\" (NVIDIA's CUDA GPUs page)");
    hw.compute_capability = *cc;
  }
  // A kernel's {forward, backward} throughput ratio to the flash curves, given whole.
  auto read_kernel_ratio = [](ConfigMap e, HardwareProfile::KernelRatio& field) {
    for (auto [k, dst] : {std::pair{"forward", &field.forward}, std::pair{"backward", &field.backward}}) {
      *dst = e.get_double(k);
      // A kernel's throughput relative to flash's: positive; within (0, 4] keeps a typo (a percentage) out.
      if (!(*dst > 0 && *dst <= 4)) e.fail(k, "must be within (0, 4]: a throughput ratio to the flash curve");
    }
    e.finish();
  };
  // `device.sdpa_kernel_ratio`: {memory_efficient, cudnn} -> {forward, backward}.
  if (dev.has("sdpa_kernel_ratio")) {
    ConfigMap ratios = dev.get_map("sdpa_kernel_ratio");
    for (auto [key, field] :
         {std::pair{"memory_efficient", &hw.sdpa_memory_efficient_ratio}, std::pair{"cudnn", &hw.sdpa_cudnn_ratio}})
      if (ratios.has(key)) read_kernel_ratio(ratios.get_map(key), *field);
    ratios.finish();
  }
  if (dev.has("flash_attention_3_ratio")) read_kernel_ratio(dev.get_map("flash_attention_3_ratio"), hw.flash3_ratio);
  if (dev.has("flex_attention_ratio")) read_kernel_ratio(dev.get_map("flex_attention_ratio"), hw.flex_ratio);
  if (dev.has("matmul_tiles")) hw.matmul_tiles = read_tiles(dev, "matmul_tiles");
  if (dev.has("attention_reference")) {
    ConfigMap ref = dev.get_map("attention_reference");
    hw.attention_reference_tokens = positive_int(ref, "tokens_per_call");
    hw.attention_reference_heads = positive_int(ref, "heads");
    ref.finish();
  }
  if (required("memory_bandwidth")) hw.memory_bandwidth = dev.get_bandwidth("memory_bandwidth");
  for (auto [key, x_key, curve] :
       {std::tuple{"matmul_efficiency", "gemm_flops", &hw.matmul_efficiency},
        std::tuple{"attention_forward_efficiency", "attention_flops", &hw.attention_efficiency},
        std::tuple{"attention_backward_efficiency", "attention_flops", &hw.attention_backward_efficiency}})
    if (required(key)) *curve = read_curve(dev, key, x_key, CurveX::Number);
  // Optional per-dtype curves (docs/hardware.md): absent, the dtype uses the shared curve.
  for (auto [key, x_key, curve] :
       {std::tuple{"matmul_efficiency_bf16", "gemm_flops", &hw.matmul_efficiency_bf16},
        std::tuple{"matmul_efficiency_fp16", "gemm_flops", &hw.matmul_efficiency_fp16},
        std::tuple{"attention_forward_efficiency_bf16", "attention_flops", &hw.attention_efficiency_bf16},
        std::tuple{"attention_forward_efficiency_fp16", "attention_flops", &hw.attention_efficiency_fp16},
        std::tuple{"attention_backward_efficiency_bf16", "attention_flops", &hw.attention_backward_efficiency_bf16},
        std::tuple{"attention_backward_efficiency_fp16", "attention_flops", &hw.attention_backward_efficiency_fp16}})
    if (dev.has(key)) *curve = read_curve(dev, key, x_key, CurveX::Number);
  // Optional maps by dtype ({fp32: ..., bf16: ..., fp16: ...}, docs/hardware.md): `read` takes each entry given.
  auto per_dtype = [&](const char* key, auto&& read) {
    if (!dev.has(key)) return;
    ConfigMap m = dev.get_map(key);
    for (DType d : {DType::Fp32, DType::Bf16, DType::Fp16})
      if (m.has(to_string(d))) read(m, to_string(d), d);
    m.finish();
  };
  per_dtype("host_overhead", [&](ConfigMap& m, const char* key, DType d) {
    HostOverhead& dst = d == DType::Bf16   ? hw.host_overhead_bf16
                        : d == DType::Fp16 ? hw.host_overhead_fp16
                                           : hw.host_overhead_fp32;
    // An entry the base has is overridden key by key; a new one is complete.
    const bool entry_inherited = inherit && !dst.empty();
    ConfigMap e = m.get_map(key);
    for (auto [k, field] :
         {std::pair{"layer_forward", &dst.layer_forward}, std::pair{"layer_backward", &dst.layer_backward},
          std::pair{"head_forward", &dst.head_forward}, std::pair{"head_backward", &dst.head_backward}})
      if (given(e, k, entry_inherited)) *field = e.get_duration(k);
    if (e.has("unit")) dst.unit = e.get_duration("unit");
    e.finish();
  });
  // A dtype's elementwise rate is given absolute (a measured rate: a CPU) or as a fraction of memory_bandwidth (a
  // GPU's eager kernels, which a derived profile with another memory keeps): one of the two per file, the file's
  // own replacing what its base gave.
  auto rate_of = [&hw](DType d) -> BytesPerSecond& {
    return d == DType::Bf16   ? hw.elementwise_bandwidth_bf16
           : d == DType::Fp16 ? hw.elementwise_bandwidth_fp16
                              : hw.elementwise_bandwidth_fp32;
  };
  auto efficiency_of = [&hw](DType d) -> double& {
    return d == DType::Bf16   ? hw.elementwise_efficiency_bf16
           : d == DType::Fp16 ? hw.elementwise_efficiency_fp16
                              : hw.elementwise_efficiency_fp32;
  };
  per_dtype("elementwise_bandwidth", [&](ConfigMap& m, const char* key, DType d) {
    rate_of(d) = m.get_bandwidth(key);
    efficiency_of(d) = 0;
  });
  if (dev.has("elementwise_efficiency") && dev.has("elementwise_bandwidth")) {
    ConfigMap rates = dev.get_map("elementwise_bandwidth");
    ConfigMap fractions = dev.get_map("elementwise_efficiency");
    for (DType d : {DType::Fp32, DType::Bf16, DType::Fp16})
      if (rates.has(to_string(d)) && fractions.has(to_string(d)))
        fractions.fail(to_string(d), "is also given as device.elementwise_bandwidth: give one of the two");
  }
  per_dtype("elementwise_efficiency", [&](ConfigMap& m, const char* key, DType d) {
    double& dst = efficiency_of(d);
    dst = m.get_double(key);
    if (!(dst > 0 && dst <= 1)) m.fail(key, "must be within (0, 1]: a fraction of device.memory_bandwidth");
    rate_of(d) = BytesPerSecond(0);
  });
  per_dtype("matmul_forward_ratio", [&](ConfigMap& m, const char* key, DType d) {
    double& dst = d == DType::Bf16   ? hw.matmul_forward_ratio_bf16
                  : d == DType::Fp16 ? hw.matmul_forward_ratio_fp16
                                     : hw.matmul_forward_ratio_fp32;
    dst = m.get_double(key);
    // The forward is one of three GEMMs whose mean is 1: it cannot take 3x the mean or nothing.
    if (!(dst > 0 && dst < 3)) m.fail(key, "must be within (0, 3)");
  });
  // Optional fractions of device.memory_bandwidth that one family of kernels reaches.
  auto bandwidth_fraction = [&](const char* key, double& dst) {
    if (!dev.has(key)) return;
    dst = dev.get_double(key);
    if (!(dst > 0 && dst <= 1)) dev.fail(key, "must be within (0, 1]: a fraction of device.memory_bandwidth");
  };
  bandwidth_fraction("copy_efficiency", hw.copy_efficiency);
  bandwidth_fraction("softmax_efficiency", hw.softmax_efficiency);
  bandwidth_fraction("float8_cast_efficiency", hw.float8_cast_efficiency);
  if (dev.has("float8_matmul_ratio")) {
    hw.float8_matmul_ratio = dev.get_double("float8_matmul_ratio");
    if (!(hw.float8_matmul_ratio > 0 && hw.float8_matmul_ratio <= 1.5))
      dev.fail("float8_matmul_ratio", "must be within (0, 1.5]: FP8 GEMMs' efficiency over the bf16 curve's");
  }
  if (dev.has("cores")) hw.device_cores = dev.get_positive_double("cores");
  dev.finish();
}

void read_node(ConfigMap& node, bool inherit, HardwareProfile& hw) {
  auto required = [&](const char* key) { return given(node, key, inherit); };
  if (required("gpus_per_node")) hw.gpus_per_node = positive_int(node, "gpus_per_node");
  read_tier(node, "intra_node", inherit, hw.intra_node, nullptr);
  if (required("nics_per_node")) hw.nics_per_node = positive_int(node, "nics_per_node");
  read_tier(node, "inter_node", inherit, hw.inter_node, &hw.fabric);
  if (required("host_to_device")) hw.host_to_device = node.get_bandwidth("host_to_device");
  if (required("host_memory")) hw.host_memory = positive_bytes(node, "host_memory");
  if (required("cpu_cores")) hw.cpu_cores = positive_int(node, "cpu_cores");
  if (required("host_memory_bandwidth")) hw.host_memory_bandwidth = node.get_bandwidth("host_memory_bandwidth");
  if (required("cpu_peak_flops_per_core")) hw.host_flops_per_core = node.get_flops_rate("cpu_peak_flops_per_core");
  node.finish();
}

void read_collectives(ConfigMap& coll, bool inherit, HardwareProfile& hw) {
  if (given(coll, "base_latency", inherit)) hw.collective_base_latency = coll.get_duration("base_latency");
  if (given(coll, "compute_slowdown_during_comm", inherit)) {
    hw.compute_slowdown_during_comm = coll.get_double("compute_slowdown_during_comm");
    if (hw.compute_slowdown_during_comm < 0 || hw.compute_slowdown_during_comm >= 1)
      coll.fail("compute_slowdown_during_comm", "must be within [0, 1)");
  }
  for (const auto& [key, field] : HardwareProfile::in_step_factor_fields()) {
    if (!coll.has(key)) continue;
    const double f = coll.get_double(key);
    // A measured ratio (fsdp-run calibrate: the probe's in-step collective time over its price): any non-negative
    // finite value; calibrate warns when it writes one above 10 (a busy machine).
    if (!(f >= 0 && std::isfinite(f)))
      coll.fail(key, "must be a non-negative number (the in-step collective time over the priced one)");
    hw.*field = f;
  }
  coll.finish();
}

// A check between keys, made once the profile is whole: fails on the first candidate key that this file gives. A
// profile whose base passed every check fails one only through a key it overrides, so one of them is here.
struct Culprit {
  const ConfigMap* map;
  const char* key;
};
[[noreturn]] void fail_on_given(std::initializer_list<Culprit> candidates, const std::string& message) {
  for (const Culprit& c : candidates)
    if (c.map != nullptr && c.map->has(c.key)) c.map->fail(c.key, message);
  FSDP_ASSERT(false, "a check between keys failed on values that all came from a base that passed it");
  throw InputError(message);  // not reached
}

std::string mhz(Hertz f) { return fmt("%.4g MHz", f.value / kMega); }
std::string watts(Watts w) { return fmt("%.4g W", w.value); }

void check_profile(const HardwareProfile& hw, const ConfigMap& top, const ConfigMap* dev, const ConfigMap* node) {
  if (hw.usable_device_memory > hw.device_memory)
    fail_on_given({{dev, "usable_memory"}, {dev, "memory"}}, "device.usable_memory exceeds device.memory");
  if (hw.device_cores > 0 && hw.device_kind != "cpu")
    fail_on_given({{dev, "cores"}, {&top, "device_kind"}}, "only a cpu device is a number of cores (device.cores)");
  if (hw.device_cores > hw.cpu_cores)
    fail_on_given({{dev, "cores"}, {node, "cpu_cores"}}, "device.cores (" + fmt("%.6g", hw.device_cores) +
                                                             ") exceeds node.cpu_cores (" +
                                                             std::to_string(hw.cpu_cores) + ")");
  // A compute capability is a CUDA device's; a CPU's SDPA has its own kernels (docs/hardware.md "Attention kernels").
  if (hw.compute_capability.known() && hw.device_kind != "cuda")
    fail_on_given({{dev, "compute_capability"}, {&top, "device_kind"}},
                  "only a cuda device has a compute capability (device.compute_capability)");
  // A ratio applied to the flash curves must keep them within the peak: ratio x the curve's highest efficiency <= 1.
  for (auto [section, key, r] : {std::tuple{"sdpa_kernel_ratio", ".memory_efficient", &hw.sdpa_memory_efficient_ratio},
                                 std::tuple{"sdpa_kernel_ratio", ".cudnn", &hw.sdpa_cudnn_ratio},
                                 std::tuple{"flash_attention_3_ratio", "", &hw.flash3_ratio},
                                 std::tuple{"flex_attention_ratio", "", &hw.flex_ratio}}) {
    if (!r->given()) continue;
    for (auto [which, ratio, curve] : {std::tuple{"forward", r->forward, &hw.attention_efficiency},
                                       std::tuple{"backward", r->backward, &hw.attention_backward_efficiency}}) {
      double top_eff = 0;
      for (double e : curve->efficiency) top_eff = std::max(top_eff, e);
      if (ratio * top_eff > 1)
        fail_on_given(
            {{dev, section}, {dev, which[0] == 'f' ? "attention_forward_efficiency" : "attention_backward_efficiency"}},
            std::string("device.") + section + key + "." + which + " (" + fmt("%.4g", ratio) +
                ") takes the attention curve above the peak (highest "
                "efficiency " +
                fmt("%.4g", top_eff) + ")");
    }
  }
  // Tile and wave quantization needs both the SMs and the tiles.
  if ((hw.sm_count > 0) != !hw.matmul_tiles.empty())
    fail_on_given({{dev, "sm_count"}, {dev, "matmul_tiles"}},
                  "device.sm_count and device.matmul_tiles go together (tile and wave quantization needs both)");
  // Clocks: a sustained clock is a fraction of the clock the peaks are quoted at, which must be given.
  if (hw.boost_clock_fp32.value > 0 && !(hw.boost_clock.value > 0))
    fail_on_given({{dev, "boost_clock_fp32"}}, "needs device.boost_clock (the tensor-core peaks' clock)");
  if (hw.sustained_clock.value > 0) {
    if (!(hw.boost_clock.value > 0))
      fail_on_given({{dev, "sustained_clock"}},
                    "needs device.boost_clock, the clock device.peak_flops are quoted at (the datasheet's)");
    const Hertz highest = std::max(hw.boost_clock, hw.boost_clock_fp32);
    if (hw.sustained_clock > highest)
      fail_on_given({{dev, "sustained_clock"}, {dev, "boost_clock"}, {dev, "boost_clock_fp32"}},
                    "device.sustained_clock (" + mhz(hw.sustained_clock) + ") exceeds the boost clock (" +
                        mhz(highest) + "): a GPU does not hold more than its boost clock");
  }
  // Power: a limit is compared with the board's rating (nvidia-smi -pl accepts up to power.max_limit).
  if (hw.power_limit.value > 0) {
    if (!(hw.tdp.value > 0))
      fail_on_given({{dev, "power_limit"}}, "needs device.tdp (the board's rated power) to compare it with");
    if (hw.power_limit > hw.tdp)
      fail_on_given({{dev, "power_limit"}, {dev, "tdp"}}, "device.power_limit (" + watts(hw.power_limit) +
                                                              ") exceeds device.tdp (" + watts(hw.tdp) +
                                                              "): a board cannot be set above its rated power");
  }
}

std::filesystem::path profile_dir(const std::string& config_root) {
  return std::filesystem::path(config_root) / "hwprofiles";
}

bool is_yaml_path(const std::string& s) { return s.size() > 5 && s.compare(s.size() - 5, 5, ".yaml") == 0; }

std::string known_names(const std::string& config_root) {
  std::string known;
  for (const auto& n : config_names(profile_dir(config_root))) known += (known.empty() ? "" : ", ") + n;
  return known;
}

// The shipped profile NAME (config_root/hwprofiles/NAME.yaml), or "" when there is none.
std::string shipped_path(const std::string& name, const std::string& config_root) {
  if (name.find('/') != std::string::npos) return "";
  const std::string path = (profile_dir(config_root) / (name + ".yaml")).string();
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ? path : "";
}

struct LoadContext {
  std::string config_root;
  bool follow_base_paths = true;  // false: `base:` may name only a shipped profile (parse_hardware_text)
  // The files being loaded, the outermost first: their canonical paths (cycle detection) and as written.
  std::vector<std::pair<std::string, std::string>> chain;
};

std::string canonical(const std::string& path) {
  std::error_code ec;
  auto c = std::filesystem::weakly_canonical(path, ec);
  return ec ? std::filesystem::absolute(path, ec).lexically_normal().string() : c.string();
}

HardwareProfile parse_profile(ConfigMap& map, const std::string& path, LoadContext& ctx);

HardwareProfile load_profile_file(const std::string& path, LoadContext& ctx) {
  ConfigMap map = ConfigMap::load_file(path);
  ctx.chain.emplace_back(canonical(path), path);
  HardwareProfile hw = parse_profile(map, path, ctx);
  ctx.chain.pop_back();
  return hw;
}

// `base: NAME_OR_PATH` of the profile in `map` (file `path`): the base, loaded whole.
HardwareProfile load_base(ConfigMap& map, const std::string& path, LoadContext& ctx) {
  const std::string base = map.get_string("base");
  std::string base_path;
  if (is_yaml_path(base)) {
    if (!ctx.follow_base_paths)
      map.fail("base", "only a shipped profile's name is followed here, not a path (known: " +
                           known_names(ctx.config_root) + ")");
    std::filesystem::path p(base);
    if (p.is_relative()) p = std::filesystem::path(path).parent_path() / p;  // relative to this file
    base_path = p.lexically_normal().string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(base_path, ec)) map.fail("base", "no such file: " + base_path);
  } else {
    base_path = shipped_path(base, ctx.config_root);
    if (base_path.empty())
      map.fail("base", "unknown hardware '" + base + "' (known: " + known_names(ctx.config_root) +
                           "; or a path to a .yaml file, relative to this one)");
  }
  const std::string key = canonical(base_path);
  for (size_t i = 0; i < ctx.chain.size(); ++i)
    if (ctx.chain[i].first == key) {
      std::string cycle;
      for (size_t j = i; j < ctx.chain.size(); ++j) cycle += ctx.chain[j].second + " -> ";
      map.fail("base", "the bases form a cycle: " + cycle + base_path);
    }
  try {
    HardwareProfile hw = load_profile_file(base_path, ctx);
    hw.base_source = base_path;
    return hw;
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + " (in " + base_path + ", the base of " + path + ")");
  }
}

HardwareProfile parse_profile(ConfigMap& map, const std::string& path, LoadContext& ctx) {
  // A derived profile starts from its base: each key below overrides it, mapping by mapping, key by key.
  const bool derived = map.has("base");
  HardwareProfile hw = derived ? load_base(map, path, ctx) : HardwareProfile{};
  hw.source = path;
  hw.name = map.get_string("name");  // always the file's own
  if (given(map, "device_kind", derived)) hw.device_kind = map.get_enum("device_kind", {"cuda", "cpu"});
  if (given(map, "backend", derived)) {
    const std::string backend = map.get_string("backend");
    try {
      hw.backend = load_backend(backend, ctx.config_root);
    } catch (const InputError& e) {
      map.fail("backend", e.what());
    }
  }
  if (map.has("calibrated")) {
    const bool inherit = hw.calibrated.has_value();
    HardwareProfile::Calibration cal = hw.calibrated.value_or(HardwareProfile::Calibration{});
    ConfigMap c = map.get_map("calibrated");
    if (given(c, "runtime", inherit)) cal.runtime = c.get_string("runtime");
    if (given(c, "runtime_build", inherit)) cal.runtime_build = c.get_string("runtime_build");
    if (given(c, "cost_model_version", inherit)) {
      cal.cost_model_version = c.get_int("cost_model_version");
      if (cal.cost_model_version < 1) c.fail("cost_model_version", "must be a positive integer");
    }
    c.finish();
    hw.calibrated = cal;
  }
  std::optional<ConfigMap> dev, node;
  if (given(map, "device", derived)) {
    dev = map.get_map("device");
    read_device(*dev, derived, hw);
  }
  if (given(map, "node", derived)) {
    node = map.get_map("node");
    read_node(*node, derived, hw);
  }
  if (given(map, "collectives", derived)) {
    ConfigMap coll = map.get_map("collectives");
    read_collectives(coll, derived, hw);
  }
  map.finish();
  check_profile(hw, map, dev ? &*dev : nullptr, node ? &*node : nullptr);
  return hw;
}

}  // namespace

std::vector<std::string> list_hardware(const std::string& config_root) {
  return config_names(profile_dir(config_root));
}

HardwareProfile load_hardware(const std::string& name_or_path, const std::string& config_root,
                              const std::string& flag) {
  std::string path = name_or_path;
  if (!is_yaml_path(name_or_path)) {
    path = shipped_path(name_or_path, config_root);
    if (path.empty())
      throw InputError(flag + ": unknown hardware '" + name_or_path + "' (known: " + known_names(config_root) +
                       "; or give a path to a .yaml file)");
  }
  LoadContext ctx{config_root, true, {}};
  HardwareProfile hw = load_profile_file(path, ctx);
  for (const std::string& w : hardware_warnings(hw)) std::cerr << "fsdp-plan: warning: " << w << "\n";
  return hw;
}

HardwareProfile parse_hardware_text(const std::string& text, const std::string& source_name,
                                    const std::string& config_root) {
  ConfigMap map = ConfigMap::load_string(text, source_name);
  LoadContext ctx{config_root, false, {}};
  return parse_profile(map, source_name, ctx);
}

std::vector<std::string> hardware_warnings(const HardwareProfile& hw) {
  std::vector<std::string> out;
  if (hw.power_limit.value > 0 && hw.power_limit < hw.tdp && !(hw.sustained_clock.value > 0))
    out.push_back(hw.source + ": device.power_limit (" + watts(hw.power_limit) + ") is below device.tdp (" +
                  watts(hw.tdp) +
                  "), but a power limit is not converted to a clock, so the peak FLOP/s stay the boost clock's. "
                  "Give device.sustained_clock: the SM clock measured under a training load, e.g. "
                  "nvidia-smi --query-gpu=clocks.sm --format=csv -l 1 while a step runs");
  return out;
}

std::string network_summary(const HardwareProfile& hw) {
  constexpr double kBitsPerByte = 8.0;
  const double gbps = hw.inter_node.bandwidth.value * kBitsPerByte / kGB;
  const double per_gpu = hw.nics_per_node * gbps / std::max(1, hw.gpus_per_node);
  const bool stated = hw.fabric != Fabric::Unstated;
  return std::to_string(hw.nics_per_node) + " x " + fmt("%.4g", gbps) + " Gb/s " +
         (stated ? std::string(display_name(hw.fabric)) + " " : "") + "per node (" + fmt("%.4g", per_gpu) +
         " Gb/s per GPU)" + (stated ? "" : ", fabric not stated");
}

std::string clock_summary(const HardwareProfile& hw) {
  std::string out;
  if (hw.sustained_clock.value > 0)
    out = "sustained " + mhz(hw.sustained_clock) + " of " + mhz(hw.boost_clock) + " boost (" +
          fmt("%.3g", hw.clock_scale(DType::Bf16)) + " x tensor-core peak)";
  if (hw.power_limit.value > 0)
    out += (out.empty() ? "" : ", ") + std::string("power limit ") + watts(hw.power_limit) + " of " + watts(hw.tdp);
  return out;
}

}  // namespace fsdp
