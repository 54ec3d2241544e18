// Alpha-beta cost of NCCL collectives, per tier (intra-node NVLink/PCIe, inter-node NICs).
//
// Conventions follow nccl-tests (doc/PERFORMANCE.md): buffer_bytes S is the full buffer, i.e. the
// all-gather output / reduce-scatter input (S = per-rank shard x ranks), and the buffer for
// all-reduce and broadcast. Bus bandwidth (busBW) is what nccl-tests reports: the ring needs
//   all-gather, reduce-scatter: (N-1)/N * S / busBW      all-reduce: 2(N-1)/N * S / busBW
//   broadcast: S / busBW                                all-to-all: (N-1)/N * S / busBW
// plus latency terms. Formulas, sources and the comparison with published nccl-tests numbers are
// in docs/hardware.md.
#pragma once

#include <string>

#include "comm/comm_group.hpp"
#include "core/units.hpp"
#include "hardware/hardware_profile.hpp"
#include "program/op_kinds.hpp"

namespace fsdp {

enum class CollectiveAlgorithm { Ring, Tree };

const char* to_string(CollectiveAlgorithm);

struct CollectiveCost {
  Seconds time{0};                  // latency + transfer
  Seconds latency{0};               // base + per-step latencies
  Seconds transfer{0};              // bytes on the bottleneck link / bus bandwidth
  BytesPerSecond bus_bandwidth{0};  // achieved busBW of the bottleneck tier at this size
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::Ring;
};

// Achieved bus bandwidth of a ring over `group` for a buffer of `message` bytes: the slower of the
// intra-node tier (when more than one member shares a node) and, for groups spanning nodes, the
// NIC bandwidth available to the members of one node (rail-aligned rings, one channel per NIC).
// Each tier's efficiency is the collective's own curve when the profile has one (bus_efficiency_<kind>).
BytesPerSecond ring_bus_bandwidth(const HardwareProfile& hw, const CommGroup& group, Bytes message,
                                  CollectiveKind kind = CollectiveKind::AllReduce);

// The tier's bus-efficiency curve for `kind`: its own when present, else the shared bus_efficiency.
const EfficiencyCurve& tier_bus_efficiency(const LinkTier& tier, CollectiveKind kind);
// The tier's factor by node count for `kind`: its own (bus_efficiency_by_nodes_<kind>) when present, else the shared
// bus_efficiency_by_nodes (empty: no factor).
const EfficiencyCurve& tier_bus_efficiency_by_nodes(const LinkTier& tier, CollectiveKind kind);

// One algorithm, priced as NCCL's tuning model does (src/graph/tuning.cc). Tree exists only for
// all-reduce (as in NCCL); asking for another collective is a bug.
CollectiveCost ring_cost(const HardwareProfile& hw, CollectiveKind kind, Bytes buffer_bytes, const CommGroup& group);
CollectiveCost tree_allreduce_cost(const HardwareProfile& hw, Bytes buffer_bytes, const CommGroup& group);
// An all-to-all of a `buffer_bytes` buffer per rank (nccl-tests' alltoall size: each rank sends buffer / n to every
// rank): the slices to the rank's node peers over NVLink and those to other nodes over the rank's share of the
// node's NICs, concurrently, each at its tier's bus efficiency; one hop of latency.
CollectiveCost all_to_all_cost(const HardwareProfile& hw, Bytes buffer_bytes, const CommGroup& group);

// The faster of the algorithms NCCL may pick for `kind` (ring for all of them, tree for
// all-reduce), like NCCL's tuner. Zero for a group of one rank or an empty buffer.
// InputError when a bandwidth the collective needs is not positive.
CollectiveCost collective_cost(const HardwareProfile& hw, CollectiveKind kind, Bytes buffer_bytes,
                               const CommGroup& group);
Seconds collective_time(const HardwareProfile& hw, CollectiveKind kind, Bytes buffer_bytes, const CommGroup& group);

// HSDP's two-level gradient reduction (PyTorch FSDP HYBRID_SHARD / FSDP2 on a 2-D mesh):
// reduce-scatter of the full gradient buffer within the shard group, then all-reduce of the
// resulting shard (buffer / shard size) across the replica group.
struct HsdpReduceCost {
  CollectiveCost shard_reduce_scatter;
  CollectiveCost replica_all_reduce;
  Seconds total() const { return shard_reduce_scatter.time + replica_all_reduce.time; }
};
HsdpReduceCost hsdp_gradient_reduction(const HardwareProfile& hw, Bytes full_gradient_bytes,
                                       const CommGroup& shard_group, const CommGroup& replica_group);

// Host <-> device copy over the PCIe link of one GPU (pinned memory): bytes / host_to_device.
Seconds host_device_copy_time(const HardwareProfile& hw, Bytes bytes);

}  // namespace fsdp
