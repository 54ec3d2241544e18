// Loader for hwprofiles/*.yaml (schema and sources: docs/hardware.md).
#include "hardware/hardware_profile.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "core/config_map.hpp"
#include "core/config_path.hpp"
#include "core/errors.hpp"

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

FlopsPerSecond HardwareProfile::peak_flops(DType d) const {
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
  if (d == DType::Bf16 && elementwise_bandwidth_bf16.value > 0) return elementwise_bandwidth_bf16;
  if (d == DType::Fp16 && elementwise_bandwidth_fp16.value > 0) return elementwise_bandwidth_fp16;
  if (elementwise_bandwidth_fp32.value > 0) return elementwise_bandwidth_fp32;
  return memory_bandwidth;
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

LinkTier read_tier(ConfigMap& parent, const std::string& key) {
  ConfigMap t = parent.get_map(key);
  LinkTier tier;
  tier.bandwidth = t.get_bandwidth("bandwidth");
  tier.latency = t.get_duration("latency");
  tier.bus_efficiency = read_curve(t, "bus_efficiency", "message", CurveX::Bytes);
  // Optional per-collective curves (docs/hardware.md): absent, the collective uses bus_efficiency.
  auto optional_curve = [&](const std::string& k) {
    return t.has(k) ? read_curve(t, k, "message", CurveX::Bytes) : EfficiencyCurve{};
  };
  tier.bus_efficiency_all_gather = optional_curve("bus_efficiency_all_gather");
  tier.bus_efficiency_reduce_scatter = optional_curve("bus_efficiency_reduce_scatter");
  tier.bus_efficiency_all_reduce = optional_curve("bus_efficiency_all_reduce");
  t.finish();
  return tier;
}

std::filesystem::path profile_dir(const std::string& config_root) {
  return std::filesystem::path(config_root) / "hwprofiles";
}

}  // namespace

std::vector<std::string> list_hardware(const std::string& config_root) {
  return config_names(profile_dir(config_root));
}

HardwareProfile load_hardware(const std::string& name_or_path, const std::string& config_root) {
  std::string path = name_or_path;
  bool is_path = name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".yaml") == 0;
  if (!is_path) {
    path = (profile_dir(config_root) / (name_or_path + ".yaml")).string();
    if (name_or_path.find('/') != std::string::npos || !std::filesystem::exists(path)) {
      std::string known;
      for (const auto& n : list_hardware(config_root)) known += (known.empty() ? "" : ", ") + n;
      throw InputError("--hw: unknown hardware '" + name_or_path + "' (known: " + known +
                       "; or give a path to a .yaml file)");
    }
  }
  ConfigMap map = ConfigMap::load_file(path);
  HardwareProfile hw;
  hw.source = path;
  hw.name = map.get_string("name");
  hw.device_kind = map.get_enum("device_kind", {"cuda", "cpu"});
  {
    const std::string backend = map.get_string("backend");
    try {
      hw.backend = load_backend(backend, config_root);
    } catch (const InputError& e) {
      map.fail("backend", e.what());
    }
  }
  if (map.has("calibrated")) {
    ConfigMap c = map.get_map("calibrated");
    HardwareProfile::Calibration cal;
    cal.runtime = c.get_string("runtime");
    cal.runtime_build = c.get_string("runtime_build");
    cal.cost_model_version = c.get_int("cost_model_version");
    if (cal.cost_model_version < 1) c.fail("cost_model_version", "must be a positive integer");
    c.finish();
    hw.calibrated = cal;
  }

  ConfigMap dev = map.get_map("device");
  hw.device_memory = positive_bytes(dev, "memory");
  hw.usable_device_memory = positive_bytes(dev, "usable_memory");
  if (hw.usable_device_memory > hw.device_memory) dev.fail("usable_memory", "exceeds device.memory");
  ConfigMap peak = dev.get_map("peak_flops");
  hw.peak_flops_fp32 = peak.get_flops_rate("fp32");
  hw.peak_flops_bf16 = peak.get_flops_rate("bf16");
  hw.peak_flops_fp16 = peak.get_flops_rate("fp16");
  peak.finish();
  hw.memory_bandwidth = dev.get_bandwidth("memory_bandwidth");
  hw.matmul_efficiency = read_curve(dev, "matmul_efficiency", "gemm_flops", CurveX::Number);
  hw.attention_efficiency = read_curve(dev, "attention_forward_efficiency", "attention_flops", CurveX::Number);
  hw.attention_backward_efficiency =
      read_curve(dev, "attention_backward_efficiency", "attention_flops", CurveX::Number);
  // Optional per-dtype curves (docs/hardware.md): absent, the dtype uses the shared curve.
  auto optional_curve = [&](const std::string& key, const std::string& x_key) {
    return dev.has(key) ? read_curve(dev, key, x_key, CurveX::Number) : EfficiencyCurve{};
  };
  hw.matmul_efficiency_bf16 = optional_curve("matmul_efficiency_bf16", "gemm_flops");
  hw.matmul_efficiency_fp16 = optional_curve("matmul_efficiency_fp16", "gemm_flops");
  hw.attention_efficiency_bf16 = optional_curve("attention_forward_efficiency_bf16", "attention_flops");
  hw.attention_efficiency_fp16 = optional_curve("attention_forward_efficiency_fp16", "attention_flops");
  hw.attention_backward_efficiency_bf16 = optional_curve("attention_backward_efficiency_bf16", "attention_flops");
  hw.attention_backward_efficiency_fp16 = optional_curve("attention_backward_efficiency_fp16", "attention_flops");
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
    ConfigMap e = m.get_map(key);
    dst.layer_forward = e.get_duration("layer_forward");
    dst.layer_backward = e.get_duration("layer_backward");
    dst.head_forward = e.get_duration("head_forward");
    dst.head_backward = e.get_duration("head_backward");
    if (e.has("unit")) dst.unit = e.get_duration("unit");
    e.finish();
  });
  per_dtype("elementwise_bandwidth", [&](ConfigMap& m, const char* key, DType d) {
    (d == DType::Bf16   ? hw.elementwise_bandwidth_bf16
     : d == DType::Fp16 ? hw.elementwise_bandwidth_fp16
                        : hw.elementwise_bandwidth_fp32) = m.get_bandwidth(key);
  });
  per_dtype("matmul_forward_ratio", [&](ConfigMap& m, const char* key, DType d) {
    double& dst = d == DType::Bf16   ? hw.matmul_forward_ratio_bf16
                  : d == DType::Fp16 ? hw.matmul_forward_ratio_fp16
                                     : hw.matmul_forward_ratio_fp32;
    dst = m.get_double(key);
    // The forward is one of three GEMMs whose mean is 1: it cannot take 3x the mean or nothing.
    if (!(dst > 0 && dst < 3)) m.fail(key, "must be within (0, 3)");
  });
  if (dev.has("cores")) {
    if (hw.device_kind != "cpu") dev.fail("cores", "only a cpu device is a number of cores");
    hw.device_cores = dev.get_positive_double("cores");
  }
  dev.finish();

  ConfigMap node = map.get_map("node");
  hw.gpus_per_node = positive_int(node, "gpus_per_node");
  hw.intra_node = read_tier(node, "intra_node");
  hw.nics_per_node = positive_int(node, "nics_per_node");
  hw.inter_node = read_tier(node, "inter_node");
  hw.host_to_device = node.get_bandwidth("host_to_device");
  hw.host_memory = positive_bytes(node, "host_memory");
  hw.cpu_cores = positive_int(node, "cpu_cores");
  if (hw.device_cores > hw.cpu_cores)
    dev.fail("cores", "exceeds node.cpu_cores (" + std::to_string(hw.cpu_cores) + ")");
  hw.host_memory_bandwidth = node.get_bandwidth("host_memory_bandwidth");
  hw.host_flops_per_core = node.get_flops_rate("cpu_peak_flops_per_core");
  node.finish();

  ConfigMap coll = map.get_map("collectives");
  hw.collective_base_latency = coll.get_duration("base_latency");
  hw.compute_slowdown_during_comm = coll.get_double("compute_slowdown_during_comm");
  if (hw.compute_slowdown_during_comm < 0 || hw.compute_slowdown_during_comm >= 1)
    coll.fail("compute_slowdown_during_comm", "must be within [0, 1)");
  for (const auto& [key, field] : HardwareProfile::in_step_factor_fields()) {
    if (!coll.has(key)) continue;
    const double f = coll.get_double(key);
    if (!(f >= 0 && f <= 10)) coll.fail(key, "must be within [0, 10]");
    hw.*field = f;
  }
  coll.finish();
  map.finish();
  return hw;
}

}  // namespace fsdp
