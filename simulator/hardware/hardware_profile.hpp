// A cluster's hardware (hwprofiles/*.yaml): one node type, repeated.
// All quantities in SI base units (units.hpp); parsing converts once.
#pragma once

#include <string>
#include <vector>

#include "core/units.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// Piecewise-linear efficiency curve: points (x, efficiency in (0,1]) sorted by x;
// evaluated by linear interpolation in log2(x), clamped at both ends.
// The loader also refuses a curve that rises faster than its argument between two
// points (x / efficiency(x) must not decrease), so more work never takes less time.
struct EfficiencyCurve {
  std::vector<double> x;
  std::vector<double> efficiency;
  double at(double value) const;
};

struct LinkTier {
  BytesPerSecond bandwidth{0};  // per-GPU unidirectional bandwidth into the tier
  Seconds latency{0};           // per-hop latency (alpha)
  // Achieved bus bandwidth as a fraction of `bandwidth`, by message size in bytes.
  EfficiencyCurve bus_efficiency;
};

struct HardwareProfile {
  std::string name;
  std::string source;       // file it came from
  std::string device_kind;  // "cuda" or "cpu"
  // Device
  Bytes device_memory{0};             // total memory per GPU
  Bytes usable_device_memory{0};      // what the runtime can allocate (after driver/ECC reservations)
  FlopsPerSecond peak_flops_fp32{0};  // dense (TF32 tensor cores where applicable is NOT used for fp32 here)
  FlopsPerSecond peak_flops_bf16{0};  // dense tensor-core
  FlopsPerSecond peak_flops_fp16{0};
  BytesPerSecond memory_bandwidth{0};             // HBM
  EfficiencyCurve matmul_efficiency;              // by GEMM FLOPs per call
  EfficiencyCurve attention_efficiency;           // by attention FLOPs per call (forward kernel)
  EfficiencyCurve attention_backward_efficiency;  // by attention FLOPs per call (backward kernel)
  // Node
  int gpus_per_node = 0;
  LinkTier intra_node;  // NVLink/NVSwitch or PCIe
  int nics_per_node = 0;
  LinkTier inter_node;               // per NIC
  BytesPerSecond host_to_device{0};  // PCIe per GPU, pinned
  Bytes host_memory{0};              // per node
  int cpu_cores = 0;                 // per node
  BytesPerSecond host_memory_bandwidth{0};
  FlopsPerSecond host_flops_per_core{0};  // peak fp32 FLOP/s of one host CPU core
  // Collectives
  Seconds collective_base_latency{0};       // fixed cost of launching one collective (NCCL's baseLat)
  double compute_slowdown_during_comm = 0;  // fraction of compute throughput lost while collectives run

  FlopsPerSecond peak_flops(DType) const;
};

// Strict parse; InputError names file, line and key.
HardwareProfile load_hardware(const std::string& name_or_path, const std::string& config_root);
std::vector<std::string> list_hardware(const std::string& config_root);

}  // namespace fsdp
