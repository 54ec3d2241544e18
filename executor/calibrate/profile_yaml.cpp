// hwprofiles/*.yaml writer (docs/hardware.md schema; the strict reader is
// simulator/hardware/hardware_profile.cpp).
#include "calibrate/profile_yaml.hpp"

#include <array>
#include <cstdio>
#include <sstream>
#include <utility>

#include "core/format.hpp"

namespace fsdp::exec::cal {

namespace {

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

class Writer {
 public:
  explicit Writer(const ProfileNotes& n) : notes_(n) {}
  void comment(int indent, const std::string& key) {
    auto it = notes_.note.find(key);
    if (it == notes_.note.end()) return;
    std::istringstream lines(it->second);
    std::string line;
    while (std::getline(lines, line))
      out_ << std::string(static_cast<std::size_t>(indent), ' ') << "# " << line << "\n";
  }
  void field(int indent, const std::string& key, const std::string& name, const std::string& value) {
    comment(indent, key);
    out_ << std::string(static_cast<std::size_t>(indent), ' ') << name << ": " << value << "\n";
  }
  void open(int indent, const std::string& key, const std::string& name) {
    comment(indent, key);
    out_ << std::string(static_cast<std::size_t>(indent), ' ') << name << ":\n";
  }
  void curve(int indent, const std::string& key, const std::string& name, const std::string& xkey,
             const EfficiencyCurve& c, bool bytes) {
    open(indent, key, name);
    for (std::size_t i = 0; i < c.x.size(); ++i)
      out_ << std::string(static_cast<std::size_t>(indent + 2), ' ') << "- {" << xkey << ": "
           << (bytes ? quoted(fmt("%.0f B", c.x[i])) : fmt("%.6e", c.x[i]))
           << ", efficiency: " << fmt("%.6g", c.efficiency[i]) << "}\n";
  }
  std::ostringstream& out() { return out_; }

 private:
  const ProfileNotes& notes_;
  std::ostringstream out_;
};

std::string bytes(Bytes b) { return quoted(fmt("%.0f B", b.value)); }
std::string bw(BytesPerSecond b) { return quoted(fmt("%.6g GB/s", b.value / 1e9)); }
std::string dur(Seconds s) { return quoted(fmt("%.6g us", s.value * 1e6)); }
std::string flops(FlopsPerSecond f) { return quoted(fmt("%.6g GFLOP/s", f.value / 1e9)); }

void tier(Writer& w, const std::string& key, const std::string& name, const LinkTier& t) {
  w.open(2, key, name);
  w.field(4, key + ".bandwidth", "bandwidth", bw(t.bandwidth));
  w.field(4, key + ".latency", "latency", dur(t.latency));
  w.curve(4, key + ".bus_efficiency", "bus_efficiency", "message", t.bus_efficiency, true);
  for (const auto& [name, curve] :
       {std::pair<const char*, const EfficiencyCurve*>{"bus_efficiency_all_gather", &t.bus_efficiency_all_gather},
        {"bus_efficiency_reduce_scatter", &t.bus_efficiency_reduce_scatter},
        {"bus_efficiency_all_reduce", &t.bus_efficiency_all_reduce}})
    if (!curve->empty()) w.curve(4, key + "." + name, name, "message", *curve, true);
}

// The optional per-dtype curves, by key under device (docs/hardware.md), in file order.
std::vector<std::pair<std::string, const EfficiencyCurve*>> optional_curves(const HardwareProfile& hw) {
  return {{"matmul_efficiency_bf16", &hw.matmul_efficiency_bf16},
          {"matmul_efficiency_fp16", &hw.matmul_efficiency_fp16},
          {"attention_forward_efficiency_bf16", &hw.attention_efficiency_bf16},
          {"attention_forward_efficiency_fp16", &hw.attention_efficiency_fp16},
          {"attention_backward_efficiency_bf16", &hw.attention_backward_efficiency_bf16},
          {"attention_backward_efficiency_fp16", &hw.attention_backward_efficiency_fp16}};
}

// The optional maps by dtype under device (docs/hardware.md), in file order: each dtype's value as written
// (fp32, bf16, fp16), empty where the profile has none; a map is written when any dtype has a value.
struct DtypeMap {
  std::string key;
  std::array<std::string, 3> value;
  bool any() const { return !value[0].empty() || !value[1].empty() || !value[2].empty(); }
};
constexpr std::array<const char*, 3> kDtypeNames{"fp32", "bf16", "fp16"};

std::vector<DtypeMap> dtype_maps(const HardwareProfile& hw) {
  auto overhead = [](const HostOverhead& h) {
    if (h.empty()) return std::string();
    return "{layer_forward: " + dur(h.layer_forward) + ", layer_backward: " + dur(h.layer_backward) +
           ", head_forward: " + dur(h.head_forward) + ", head_backward: " + dur(h.head_backward) +
           (h.unit.value > 0 ? ", unit: " + dur(h.unit) : std::string()) + "}";
  };
  auto rate = [](BytesPerSecond b) { return b.value > 0 ? bw(b) : std::string(); };
  auto ratio = [](double r) { return r > 0 ? fmt("%.4g", r) : std::string(); };
  return {
      {"host_overhead",
       {overhead(hw.host_overhead_fp32), overhead(hw.host_overhead_bf16), overhead(hw.host_overhead_fp16)}},
      {"elementwise_bandwidth",
       {rate(hw.elementwise_bandwidth_fp32), rate(hw.elementwise_bandwidth_bf16), rate(hw.elementwise_bandwidth_fp16)}},
      // A dtype's fraction of the memory's bandwidth, where it has no rate of its own (the base's, a GPU's eager
      // kernels: hardware_profile.hpp elementwise_efficiency).
      {"elementwise_efficiency",
       {hw.elementwise_bandwidth_fp32.value > 0 ? std::string() : ratio(hw.elementwise_efficiency_fp32),
        hw.elementwise_bandwidth_bf16.value > 0 ? std::string() : ratio(hw.elementwise_efficiency_bf16),
        hw.elementwise_bandwidth_fp16.value > 0 ? std::string() : ratio(hw.elementwise_efficiency_fp16)}},
      {"matmul_forward_ratio",
       {ratio(hw.matmul_forward_ratio_fp32), ratio(hw.matmul_forward_ratio_bf16),
        ratio(hw.matmul_forward_ratio_fp16)}}};
}

// The optional fractions of device.memory_bandwidth (hardware_profile.hpp), each written where it is set.
std::array<std::pair<const char*, double HardwareProfile::*>, 3> bandwidth_fractions() {
  return {{{"copy_efficiency", &HardwareProfile::copy_efficiency},
           {"softmax_efficiency", &HardwareProfile::softmax_efficiency},
           {"float8_cast_efficiency", &HardwareProfile::float8_cast_efficiency}}};
}

}  // namespace

std::vector<std::string> profile_note_keys(const HardwareProfile& hw) {
  std::vector<std::string> keys{
      "name",
      "device_kind",
      "backend",
      "device.memory",
      "device.usable_memory",
      "device.peak_flops.fp32",
      "device.peak_flops.bf16",
      "device.peak_flops.fp16",
      "device.memory_bandwidth",
      "device.matmul_efficiency",
      "device.attention_forward_efficiency",
      "device.attention_backward_efficiency",
  };
  if (hw.peak_flops_fp8.value > 0) keys.push_back("device.peak_flops.fp8");
  for (const auto& [key, curve] : optional_curves(hw))
    if (!curve->empty()) keys.push_back("device." + key);
  for (const DtypeMap& m : dtype_maps(hw))
    if (m.any()) keys.push_back("device." + m.key);
  for (const auto& [key, field] : bandwidth_fractions())
    if (hw.*field > 0) keys.push_back(std::string("device.") + key);
  if (hw.float8_matmul_ratio > 0) keys.emplace_back("device.float8_matmul_ratio");
  if (hw.device_cores > 0) keys.push_back("device.cores");
  if (hw.compute_capability.known()) keys.push_back("device.compute_capability");
  if (hw.calibrated)
    for (const char* k : {"calibrated.runtime", "calibrated.runtime_build", "calibrated.cost_model_version"})
      keys.emplace_back(k);
  for (const char* k :
       {"node.gpus_per_node", "node.intra_node", "node.nics_per_node", "node.inter_node", "node.host_to_device",
        "node.host_memory", "node.cpu_cores", "node.host_memory_bandwidth", "node.cpu_peak_flops_per_core",
        "collectives.base_latency", "collectives.compute_slowdown_during_comm"})
    keys.emplace_back(k);
  for (const auto& [key, field] : HardwareProfile::in_step_factor_fields())
    if (hw.*field) keys.push_back(std::string("collectives.") + key);
  return keys;
}

std::string hardware_profile_yaml(const HardwareProfile& hw, const ProfileNotes& notes) {
  Writer w(notes);
  for (const std::string& h : notes.header) w.out() << "# " << h << "\n";
  w.field(0, "name", "name", quoted(hw.name));
  w.field(0, "device_kind", "device_kind", hw.device_kind);
  w.field(0, "backend", "backend", hw.backend.name);
  if (hw.calibrated) {
    w.open(0, "calibrated", "calibrated");
    w.field(2, "calibrated.runtime", "runtime", quoted(hw.calibrated->runtime));
    w.field(2, "calibrated.runtime_build", "runtime_build", quoted(hw.calibrated->runtime_build));
    w.field(2, "calibrated.cost_model_version", "cost_model_version",
            std::to_string(hw.calibrated->cost_model_version));
  }
  w.open(0, "device", "device");
  w.field(2, "device.memory", "memory", bytes(hw.device_memory));
  w.field(2, "device.usable_memory", "usable_memory", bytes(hw.usable_device_memory));
  w.open(2, "device.peak_flops", "peak_flops");
  w.field(4, "device.peak_flops.fp32", "fp32", flops(hw.peak_flops_fp32));
  w.field(4, "device.peak_flops.bf16", "bf16", flops(hw.peak_flops_bf16));
  w.field(4, "device.peak_flops.fp16", "fp16", flops(hw.peak_flops_fp16));
  if (hw.peak_flops_fp8.value > 0) w.field(4, "device.peak_flops.fp8", "fp8", flops(hw.peak_flops_fp8));
  w.field(2, "device.memory_bandwidth", "memory_bandwidth", bw(hw.memory_bandwidth));
  w.curve(2, "device.matmul_efficiency", "matmul_efficiency", "gemm_flops", hw.matmul_efficiency, false);
  w.curve(2, "device.attention_forward_efficiency", "attention_forward_efficiency", "attention_flops",
          hw.attention_efficiency, false);
  w.curve(2, "device.attention_backward_efficiency", "attention_backward_efficiency", "attention_flops",
          hw.attention_backward_efficiency, false);
  for (const auto& [key, curve] : optional_curves(hw))
    if (!curve->empty())
      w.curve(2, "device." + key, key, key.rfind("matmul", 0) == 0 ? "gemm_flops" : "attention_flops", *curve, false);
  for (const DtypeMap& m : dtype_maps(hw)) {
    if (!m.any()) continue;
    w.open(2, "device." + m.key, m.key);
    for (std::size_t d = 0; d < kDtypeNames.size(); ++d)
      if (!m.value[d].empty()) w.out() << "    " << kDtypeNames[d] << ": " << m.value[d] << "\n";
  }
  for (const auto& [key, field] : bandwidth_fractions())
    if (hw.*field > 0) w.field(2, std::string("device.") + key, key, fmt("%.4g", hw.*field));
  if (hw.float8_matmul_ratio > 0)
    w.field(2, "device.float8_matmul_ratio", "float8_matmul_ratio", fmt("%.4g", hw.float8_matmul_ratio));
  if (hw.device_cores > 0) w.field(2, "device.cores", "cores", fmt("%.6g", hw.device_cores));
  if (hw.compute_capability.known())
    w.field(2, "device.compute_capability", "compute_capability", quoted(to_string(hw.compute_capability)));
  w.open(0, "node", "node");
  w.field(2, "node.gpus_per_node", "gpus_per_node", std::to_string(hw.gpus_per_node));
  tier(w, "node.intra_node", "intra_node", hw.intra_node);
  w.field(2, "node.nics_per_node", "nics_per_node", std::to_string(hw.nics_per_node));
  tier(w, "node.inter_node", "inter_node", hw.inter_node);
  w.field(2, "node.host_to_device", "host_to_device", bw(hw.host_to_device));
  w.field(2, "node.host_memory", "host_memory", bytes(hw.host_memory));
  w.field(2, "node.cpu_cores", "cpu_cores", std::to_string(hw.cpu_cores));
  w.field(2, "node.host_memory_bandwidth", "host_memory_bandwidth", bw(hw.host_memory_bandwidth));
  w.field(2, "node.cpu_peak_flops_per_core", "cpu_peak_flops_per_core", flops(hw.host_flops_per_core));
  w.open(0, "collectives", "collectives");
  w.field(2, "collectives.base_latency", "base_latency", dur(hw.collective_base_latency));
  w.field(2, "collectives.compute_slowdown_during_comm", "compute_slowdown_during_comm",
          fmt("%.6g", hw.compute_slowdown_during_comm));
  for (const auto& [key, field] : HardwareProfile::in_step_factor_fields())
    if (hw.*field) w.field(2, std::string("collectives.") + key, key, fmt("%.4g", *(hw.*field)));
  return w.out().str();
}

}  // namespace fsdp::exec::cal
