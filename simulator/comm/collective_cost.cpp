#include "comm/collective_cost.hpp"

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"

namespace fsdp {

namespace {

// NCCL src/graph/tuning.cc (NVIDIA/nccl b6475625), ncclTopoTuneModel: the tree's bus bandwidth is
// the tier's times 0.92 ("busBw*.92"), and a tree all-reduce moves the buffer at half the bus
// bandwidth ("ratio *= .5"), i.e. 2S/busBW against the ring's 2(N-1)/N * S/busBW.
constexpr double kTreeBusBandwidthFactor = 0.92;
constexpr double kTreeAlgorithmRatio = 0.5;

void require_positive(const HardwareProfile& hw, BytesPerSecond bw, const char* what) {
  if (!(bw.value > 0))
    throw InputError("hardware profile '" + hw.name + "': " + what +
                     " is zero; a collective over it would never finish");
}

// Bytes each rank sends on its bottleneck link, as a multiple of the buffer (nccl-tests'
// busbw correction factors, doc/PERFORMANCE.md).
double ring_bytes_factor(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
      return double(n - 1) / n;
    case CollectiveKind::AllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::Broadcast:
    case CollectiveKind::SendRecv:  // point to point: the sender moves the buffer once
      return 1.0;
    case CollectiveKind::AllToAll:  // all_to_all_cost prices it, link by link
    case CollectiveKind::None:
      break;
  }
  FSDP_ASSERT(false, "a ring cost asked for CollectiveKind::None or AllToAll");
  return 1.0;
}

// Ring steps in total and those crossing a node boundary (tuning.cc: nsteps and nInterSteps).
struct Steps {
  int total;
  int inter;
};
Steps ring_steps(CollectiveKind kind, const CommGroup& g) {
  int passes = kind == CollectiveKind::AllReduce ? 2 : 1;  // reduce-scatter then all-gather
  int nodes = g.nodes();
  // A send-recv is one hop between two ranks (NCCL's p2p: ncclSend/ncclRecv), across nodes when they are.
  if (kind == CollectiveKind::SendRecv) return Steps{1, nodes > 1 ? 1 : 0};
  return Steps{passes * (g.size - 1), passes * (nodes - 1)};
}

}  // namespace

const char* to_string(CollectiveAlgorithm a) { return a == CollectiveAlgorithm::Ring ? "ring" : "tree"; }

const EfficiencyCurve& tier_bus_efficiency(const LinkTier& t, CollectiveKind kind) {
  const EfficiencyCurve* own = nullptr;
  switch (kind) {
    case CollectiveKind::AllGather:
      own = &t.bus_efficiency_all_gather;
      break;
    case CollectiveKind::ReduceScatter:
      own = &t.bus_efficiency_reduce_scatter;
      break;
    case CollectiveKind::AllReduce:
      own = &t.bus_efficiency_all_reduce;
      break;
    case CollectiveKind::Broadcast:
    case CollectiveKind::SendRecv:
    case CollectiveKind::AllToAll:
    case CollectiveKind::None:
      break;
  }
  return own != nullptr && !own->empty() ? *own : t.bus_efficiency;
}

const EfficiencyCurve& tier_bus_efficiency_by_nodes(const LinkTier& t, CollectiveKind kind) {
  const EfficiencyCurve* own = nullptr;
  if (kind == CollectiveKind::AllGather) own = &t.bus_efficiency_by_nodes_all_gather;
  if (kind == CollectiveKind::ReduceScatter) own = &t.bus_efficiency_by_nodes_reduce_scatter;
  return own != nullptr && !own->empty() ? *own : t.bus_efficiency_by_nodes;
}

BytesPerSecond ring_bus_bandwidth(const HardwareProfile& hw, const CommGroup& g, Bytes message, CollectiveKind kind) {
  double s = message.value;
  bool uses_intra = g.ranks_per_node > 1;
  bool uses_inter = g.nodes() > 1;
  double bw = 0;
  bool have = false;
  if (uses_intra) {
    require_positive(hw, hw.intra_node.bandwidth, "intra_node.bandwidth");
    bw = hw.intra_node.bandwidth.value * tier_bus_efficiency(hw.intra_node, kind).at(s);
    have = true;
  }
  if (uses_inter) {
    require_positive(hw, hw.inter_node.bandwidth, "inter_node.bandwidth");
    // NCCL builds one ring channel per NIC and routes each ring out of the node through the NIC of
    // the GPU that leaves it (rail-aligned), so a node's members together drive their share of the
    // node's NICs. Every GPU of a node runs its own data-parallel collective at the same time
    // (SPMD), so each GPU owns nics_per_node / gpus_per_node of the NIC bandwidth.
    double nic_share = hw.nics_per_node * hw.inter_node.bandwidth.value / hw.gpus_per_node;
    double net = g.ranks_per_node * nic_share * tier_bus_efficiency(hw.inter_node, kind).at(s);
    // A fabric whose measured bus bandwidth falls with the node count (the profile's bus_efficiency_by_nodes,
    // e.g. EFA on p5: hwprofiles/p5-h100-80gb.yaml) scales the network's share by its factor at this group's nodes,
    // the collective's own factor where the profile measured one (bus_efficiency_by_nodes_all_gather, ...).
    const EfficiencyCurve& by_nodes = tier_bus_efficiency_by_nodes(hw.inter_node, kind);
    if (!by_nodes.empty()) net *= by_nodes.at(static_cast<double>(g.nodes()));
    bw = have ? std::min(bw, net) : net;
    have = true;
  }
  FSDP_ASSERT(have, "bus bandwidth of a one-rank group");
  return BytesPerSecond(bw);
}

CollectiveCost ring_cost(const HardwareProfile& hw, CollectiveKind kind, Bytes buffer_bytes, const CommGroup& g) {
  CollectiveCost c;
  c.algorithm = CollectiveAlgorithm::Ring;
  if (g.size <= 1 || buffer_bytes.value <= 0) return c;
  Steps st = ring_steps(kind, g);
  // tuning.cc: latency = baseLat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat.
  c.latency = hw.collective_base_latency + hw.intra_node.latency * double(st.total - st.inter) +
              hw.inter_node.latency * double(st.inter);
  c.bus_bandwidth = ring_bus_bandwidth(hw, g, buffer_bytes, kind);
  c.transfer = Bytes(ring_bytes_factor(kind, g.size) * buffer_bytes.value) / c.bus_bandwidth;
  c.time = c.latency + c.transfer;
  return c;
}

CollectiveCost tree_allreduce_cost(const HardwareProfile& hw, Bytes buffer_bytes, const CommGroup& g) {
  CollectiveCost c;
  c.algorithm = CollectiveAlgorithm::Tree;
  if (g.size <= 1 || buffer_bytes.value <= 0) return c;
  // tuning.cc: a chain inside each node, a double binary tree across nodes, traversed up and down:
  // latency = baseLat + 2 * ((ranks per node - 1) * intraLat + log2(nodes) * interLat).
  int depth = g.nodes() > 1 ? static_cast<int>(std::ceil(std::log2(double(g.nodes())))) : 0;
  c.latency = hw.collective_base_latency +
              (hw.intra_node.latency * double(g.ranks_per_node - 1) + hw.inter_node.latency * double(depth)) * 2.0;
  c.bus_bandwidth = ring_bus_bandwidth(hw, g, buffer_bytes, CollectiveKind::AllReduce) * kTreeBusBandwidthFactor;
  c.transfer = buffer_bytes / (c.bus_bandwidth * kTreeAlgorithmRatio);
  c.time = c.latency + c.transfer;
  return c;
}

CollectiveCost all_to_all_cost(const HardwareProfile& hw, Bytes buffer_bytes, const CommGroup& g) {
  CollectiveCost c;
  c.algorithm = CollectiveAlgorithm::Ring;
  if (g.size <= 1 || buffer_bytes.value <= 0) return c;
  // NCCL runs an all-to-all as one group of ncclSend / ncclRecv to every peer at once (nccl-tests
  // src/alltoall.cu): one hop of latency, across nodes when the group spans them.
  const bool inter = g.nodes() > 1;
  c.latency = hw.collective_base_latency + (inter ? hw.inter_node.latency : hw.intra_node.latency);
  // Of the buffer, 1/n stays on the rank, (ranks per node - 1)/n goes to peers of its node over NVLink and the rest
  // through the rank's share of the node's NICs (every rank of the node sends at once); the two links run together,
  // the network's part setting the time: "On 2 nodes, 50% of the traffic is inter-node so you should see BusBW = 2x
  // network bandwidth per GPU" (NCCL's maintainer, NVIDIA/nccl-tests#130), and an all-to-all "cannot aggregate the
  // bandwidth of multiple NICs" (NVIDIA/nccl-tests#267).
  const double n = static_cast<double>(g.size), local = static_cast<double>(g.ranks_per_node);
  const double s = buffer_bytes.value;
  double intra_s = 0, inter_s = 0;
  if (g.ranks_per_node > 1) {
    require_positive(hw, hw.intra_node.bandwidth, "intra_node.bandwidth");
    const double bw =
        hw.intra_node.bandwidth.value * tier_bus_efficiency(hw.intra_node, CollectiveKind::AllToAll).at(s);
    intra_s = s * (local - 1.0) / n / bw;
    c.bus_bandwidth = BytesPerSecond(bw);
  }
  if (inter) {
    require_positive(hw, hw.inter_node.bandwidth, "inter_node.bandwidth");
    const double nic_share = hw.nics_per_node * hw.inter_node.bandwidth.value / hw.gpus_per_node;
    const double bw = nic_share * tier_bus_efficiency(hw.inter_node, CollectiveKind::AllToAll).at(s);
    inter_s = s * (n - local) / n / bw;
    if (inter_s >= intra_s) c.bus_bandwidth = BytesPerSecond(bw);
  }
  c.transfer = Seconds(std::max(intra_s, inter_s));
  c.time = c.latency + c.transfer;
  return c;
}

CollectiveCost collective_cost(const HardwareProfile& hw, CollectiveKind kind, Bytes buffer_bytes, const CommGroup& g) {
  if (kind == CollectiveKind::AllToAll) return all_to_all_cost(hw, buffer_bytes, g);
  CollectiveCost ring = ring_cost(hw, kind, buffer_bytes, g);
  if (kind != CollectiveKind::AllReduce || g.size <= 1 || buffer_bytes.value <= 0) return ring;
  CollectiveCost tree = tree_allreduce_cost(hw, buffer_bytes, g);
  return tree.time < ring.time ? tree : ring;
}

Seconds collective_time(const HardwareProfile& hw, CollectiveKind kind, Bytes buffer_bytes, const CommGroup& g) {
  return collective_cost(hw, kind, buffer_bytes, g).time;
}

HsdpReduceCost hsdp_gradient_reduction(const HardwareProfile& hw, Bytes full_gradient_bytes,
                                       const CommGroup& shard_group, const CommGroup& replica_group) {
  HsdpReduceCost c;
  c.shard_reduce_scatter = collective_cost(hw, CollectiveKind::ReduceScatter, full_gradient_bytes, shard_group);
  c.replica_all_reduce =
      collective_cost(hw, CollectiveKind::AllReduce, full_gradient_bytes / double(shard_group.size), replica_group);
  return c;
}

Seconds host_device_copy_time(const HardwareProfile& hw, Bytes bytes) {
  if (bytes.value <= 0) return Seconds(0);
  require_positive(hw, hw.host_to_device, "host_to_device");
  return bytes / hw.host_to_device;
}

}  // namespace fsdp
