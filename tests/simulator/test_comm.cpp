// CollectiveKind cost model: closed forms, hierarchy, HSDP, monotonicity, and published nccl-tests
// bus bandwidths for DGX A100 and DGX H100 class systems.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "core/errors.hpp"
#include "hardware/hardware_profile.hpp"

using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

// A node with round numbers and flat efficiency curves, so closed forms are exact.
HardwareProfile synthetic_node() {
  HardwareProfile hw;
  hw.name = "synthetic";
  hw.device_kind = "cuda";
  hw.gpus_per_node = 8;
  hw.intra_node.bandwidth = BytesPerSecond(200 * kGB);
  hw.intra_node.latency = Seconds(2 * kMicro);
  hw.intra_node.bus_efficiency = EfficiencyCurve{{1.0}, {0.5}};  // achieved 100 GB/s
  hw.nics_per_node = 8;
  hw.inter_node.bandwidth = BytesPerSecond(25 * kGB);
  hw.inter_node.latency = Seconds(10 * kMicro);
  hw.inter_node.bus_efficiency = EfficiencyCurve{{1.0}, {0.8}};  // achieved 20 GB/s per NIC
  hw.host_to_device = BytesPerSecond(20 * kGB);
  hw.collective_base_latency = Seconds(5 * kMicro);
  return hw;
}

double busbw_factor(CollectiveKind c, int n) {
  switch (c) {
    case CollectiveKind::AllReduce:
      return 2.0 * (n - 1) / n;
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll:  // nccl-tests doc/PERFORMANCE.md: alltoall's busbw factor is (n-1)/n
      return double(n - 1) / n;
    case CollectiveKind::Broadcast:
    case CollectiveKind::SendRecv:  // one hop: the whole buffer over the pair's link
      return 1.0;
    case CollectiveKind::None:
      break;
  }
  FAIL("no bus-bandwidth factor for CollectiveKind::None");
  return 1.0;
}

// What nccl-tests would print as busbw for our predicted time.
double predicted_busbw(const HardwareProfile& hw, CollectiveKind c, Bytes s, const CommGroup& g) {
  return busbw_factor(c, g.size) * s.value / collective_time(hw, c, s, g).value;
}

double rel_error(double predicted, double published) { return std::abs(predicted - published) / published; }

}  // namespace

TEST_CASE("ring all-gather and reduce-scatter inside a node: (N-1)/N * S / busBW + (N-1) alpha") {
  HardwareProfile hw = synthetic_node();
  CommGroup g = make_group(hw, 8, 8);
  Bytes s(1 * kGiB);
  double busbw = 100 * kGB;
  double expected = 5e-6 + 7 * 2e-6 + (7.0 / 8) * s.value / busbw;
  CHECK(collective_time(hw, CollectiveKind::AllGather, s, g).value == doctest::Approx(expected));
  CHECK(collective_time(hw, CollectiveKind::ReduceScatter, s, g).value == doctest::Approx(expected));
  CollectiveCost c = collective_cost(hw, CollectiveKind::AllGather, s, g);
  CHECK(c.bus_bandwidth.value == doctest::Approx(busbw));
  CHECK(c.latency.value == doctest::Approx(5e-6 + 7 * 2e-6));
  CHECK(c.algorithm == CollectiveAlgorithm::Ring);
}

TEST_CASE("ring all-reduce is 2(N-1)/N * S / busBW + 2(N-1) alpha; broadcast S / busBW + (N-1) alpha") {
  HardwareProfile hw = synthetic_node();
  CommGroup g = make_group(hw, 4, 4);
  Bytes s(256 * kMiB);
  CollectiveCost ar = ring_cost(hw, CollectiveKind::AllReduce, s, g);
  CHECK(ar.time.value == doctest::Approx(5e-6 + 6 * 2e-6 + 1.5 * s.value / (100 * kGB)));
  CHECK(collective_time(hw, CollectiveKind::AllReduce, s, g).value == doctest::Approx(ar.time.value));  // ring wins
  CHECK(collective_time(hw, CollectiveKind::Broadcast, s, g).value ==
        doctest::Approx(5e-6 + 3 * 2e-6 + s.value / (100 * kGB)));
}

TEST_CASE("hierarchical groups: the bottleneck tier and per-tier latencies") {
  HardwareProfile hw = synthetic_node();
  Bytes s(1 * kGiB);
  SUBCASE("8 ranks on each of 2 nodes: min(NVLink busBW, 8 NICs x 20 GB/s)") {
    CommGroup g = make_group(hw, 16, 8);
    CHECK(g.nodes() == 2);
    CollectiveCost c = ring_cost(hw, CollectiveKind::AllGather, s, g);
    CHECK(c.bus_bandwidth.value == doctest::Approx(100 * kGB));  // NVLink (100) < NICs (160)
    // 15 ring steps, one of which leaves the node.
    CHECK(c.latency.value == doctest::Approx(5e-6 + 14 * 2e-6 + 1 * 10e-6));
    CHECK(c.time.value == doctest::Approx(c.latency.value + (15.0 / 16) * s.value / (100 * kGB)));
  }
  SUBCASE("with 2 NICs per node the network is the bottleneck") {
    hw.nics_per_node = 2;  // each GPU owns 2/8 of a NIC: 8 x 2/8 x 20 GB/s = 40 GB/s per node
    CommGroup g = make_group(hw, 16, 8);
    CHECK(ring_bus_bandwidth(hw, g, s).value == doctest::Approx(40 * kGB));
  }
  SUBCASE("one rank per node (an HSDP replica group): one GPU's share of the NICs") {
    CommGroup g = make_group(hw, 4, 1);
    CHECK(ring_bus_bandwidth(hw, g, s).value == doctest::Approx(20 * kGB));
    CollectiveCost c = ring_cost(hw, CollectiveKind::AllReduce, s, g);
    CHECK(c.latency.value == doctest::Approx(5e-6 + 6 * 10e-6));  // every step crosses nodes
  }
  SUBCASE("two ranks per node use two NICs") {
    CommGroup g = make_group(hw, 8, 2);
    CHECK(ring_bus_bandwidth(hw, g, s).value == doctest::Approx(40 * kGB));
  }
}

TEST_CASE("tree all-reduce wins for small buffers on many nodes, ring for large ones") {
  HardwareProfile hw = synthetic_node();
  CommGroup g = make_group(hw, 8 * 64, 8);  // 64 nodes
  Bytes small(64 * kKiB);
  Bytes large(8 * kGiB);
  CollectiveCost tree = tree_allreduce_cost(hw, small, g);
  // Chain of 8 in the node, binary tree of depth log2(64) = 6 across nodes, up and down.
  CHECK(tree.latency.value == doctest::Approx(5e-6 + 2 * (7 * 2e-6 + 6 * 10e-6)));
  CHECK(tree.transfer.value == doctest::Approx(small.value / (0.5 * 0.92 * 100 * kGB)));
  CHECK(collective_cost(hw, CollectiveKind::AllReduce, small, g).algorithm == CollectiveAlgorithm::Tree);
  CHECK(collective_cost(hw, CollectiveKind::AllReduce, large, g).algorithm == CollectiveAlgorithm::Ring);
  // The choice is the minimum of the two.
  for (Bytes s : {small, Bytes(16 * kMiB), Bytes(512 * kMiB), large}) {
    double t = collective_time(hw, CollectiveKind::AllReduce, s, g).value;
    CHECK(t == doctest::Approx(std::min(ring_cost(hw, CollectiveKind::AllReduce, s, g).time.value,
                                        tree_allreduce_cost(hw, s, g).time.value)));
  }
  // Only all-reduce has a tree: other collectives stay on the ring.
  CHECK(collective_cost(hw, CollectiveKind::AllGather, small, g).algorithm == CollectiveAlgorithm::Ring);
}

TEST_CASE("HSDP: reduce-scatter in the shard group, all-reduce of the shard across replicas") {
  HardwareProfile hw = synthetic_node();
  // 4 nodes x 8 GPUs, shard groups of 8 (one node), replica groups of 4 (one rank per node).
  CommGroup shard = contiguous_group(hw, 8, 8);
  CommGroup replica = strided_group(hw, 8, 8, 4);
  CHECK(shard.ranks_per_node == 8);
  CHECK(shard.nodes() == 1);
  CHECK(replica.ranks_per_node == 1);
  CHECK(replica.nodes() == 4);
  Bytes grads(2 * kGiB);
  HsdpReduceCost c = hsdp_gradient_reduction(hw, grads, shard, replica);
  CHECK(c.shard_reduce_scatter.time.value ==
        doctest::Approx(collective_time(hw, CollectiveKind::ReduceScatter, grads, shard).value));
  CHECK(c.replica_all_reduce.time.value ==
        doctest::Approx(collective_time(hw, CollectiveKind::AllReduce, grads / 8.0, replica).value));
  CHECK(c.total().value == doctest::Approx(c.shard_reduce_scatter.time.value + c.replica_all_reduce.time.value));
  // Closed form of the replica part: ring over 4 nodes, every step on the network at 20 GB/s.
  CHECK(c.replica_all_reduce.time.value == doctest::Approx(5e-6 + 6 * 10e-6 + 1.5 * (grads.value / 8) / (20 * kGB)));
  // Shard groups of 4 on 8-GPU nodes: replica members sit 2 per node.
  CommGroup replica4 = strided_group(hw, 8, 4, 8);
  CHECK(replica4.ranks_per_node == 2);
  CHECK(replica4.nodes() == 4);
}

TEST_CASE("groups of one rank and empty buffers cost nothing; bad groups and zero bandwidth are errors") {
  HardwareProfile hw = synthetic_node();
  CHECK(collective_time(hw, CollectiveKind::AllReduce, Bytes(kGiB), make_group(hw, 1, 1)).value == 0);
  CHECK(collective_time(hw, CollectiveKind::AllGather, Bytes(0), make_group(hw, 8, 8)).value == 0);
  CHECK_THROWS_AS(make_group(hw, 12, 8), InputError);   // 8 per node does not divide 12
  CHECK_THROWS_AS(make_group(hw, 16, 16), InputError);  // more per node than the node has
  CHECK_THROWS_AS(make_group(hw, 0, 1), InputError);
  CHECK_THROWS_AS(contiguous_group(hw, 8, 12), InputError);
  CHECK_THROWS_AS(contiguous_group(hw, 8, 3), InputError);

  HardwareProfile broken = hw;
  broken.intra_node.bandwidth = BytesPerSecond(0);
  CHECK_THROWS_WITH_AS(collective_time(broken, CollectiveKind::AllGather, Bytes(kMiB), make_group(hw, 8, 8)),
                       doctest::Contains("intra_node.bandwidth is zero"), InputError);
  broken = hw;
  broken.inter_node.bandwidth = BytesPerSecond(0);
  CHECK_THROWS_AS(collective_time(broken, CollectiveKind::AllReduce, Bytes(kMiB), make_group(hw, 16, 8)), InputError);
  broken = hw;
  broken.host_to_device = BytesPerSecond(0);
  CHECK_THROWS_AS(host_device_copy_time(broken, Bytes(kMiB)), InputError);
}

TEST_CASE("host <-> device copies run at the profile's PCIe rate") {
  HardwareProfile hw = synthetic_node();
  CHECK(host_device_copy_time(hw, Bytes(10 * kGB)).value == doctest::Approx(0.5));
  HardwareProfile h100 = load_hardware("h100-80gb", kRoot);
  CHECK(host_device_copy_time(h100, Bytes(54.8 * kGB)).value == doctest::Approx(1.0));
}

TEST_CASE("monotonicity on every shipped profile: more bytes never faster, more nodes never faster") {
  for (const auto& name : list_hardware(kRoot)) {
    CAPTURE(name);
    HardwareProfile hw = load_hardware(name, kRoot);
    int g = hw.gpus_per_node;
    for (CollectiveKind c : {CollectiveKind::AllGather, CollectiveKind::ReduceScatter, CollectiveKind::AllReduce,
                             CollectiveKind::Broadcast}) {
      CAPTURE(to_string(c));
      for (CommGroup grp : {make_group(hw, g, g), make_group(hw, g * 4, g), make_group(hw, 16, 1)}) {
        CAPTURE(grp.describe());
        double prev = 0;
        for (double s = 1024; s <= 64 * kGiB; s *= 2) {
          double t = collective_time(hw, c, Bytes(s), grp).value;
          CHECK(t >= prev);
          prev = t;
        }
      }
      // Bigger groups across nodes: bus bandwidth never rises, time for the same buffer never falls.
      for (double s : {1.0 * kMiB, 64.0 * kMiB, 4.0 * kGiB}) {
        double prev_bw = ring_bus_bandwidth(hw, make_group(hw, g, g), Bytes(s)).value;
        double prev_t = 0;
        for (int nodes = 2; nodes <= 256; nodes *= 2) {
          CommGroup grp = make_group(hw, g * nodes, g);
          double bw = ring_bus_bandwidth(hw, grp, Bytes(s)).value;
          double t = collective_time(hw, c, Bytes(s), grp).value;
          CHECK(bw <= prev_bw * (1 + 1e-12));
          CHECK(t >= prev_t);
          prev_bw = bw;
          prev_t = t;
        }
      }
    }
  }
}

// Published nccl-tests bus bandwidths against the model (predicted busbw = nccl-tests' formula applied
// to the predicted time). Tolerance 15% unless stated. Table with errors: docs/hardware.md.
TEST_CASE("published nccl-tests bus bandwidths: DGX A100 class") {
  HardwareProfile a100 = load_hardware("a100-80gb", kRoot);
  SUBCASE("1 node x 8 A100, all_reduce_perf up to 4 GB: 232.54 GB/s") {
    // NVIDIA/nccl-tests#175: "singleNode, ./build/all_reduce_perf -b 8 -e 4G -f 2 -g 8, result: 232.54GB/s".
    double p = predicted_busbw(a100, CollectiveKind::AllReduce, Bytes(4 * kGiB), make_group(a100, 8, 8));
    MESSAGE("DGX A100 1x8 all-reduce: predicted " << p / kGB << " GB/s, published 232.54");
    CHECK(rel_error(p, 232.54 * kGB) < 0.15);
  }
  SUBCASE("DGX A100 nodes, 8x HDR 200 Gb/s: 192 GB/s all-reduce busbw") {
    // NVIDIA/nccl#812, NVIDIA (AddyLaddy): "On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we
    // measure 192GB/s AllReduce BusBW" (ring regime, more than two nodes; 4 nodes and 8 GiB used here).
    double p = predicted_busbw(a100, CollectiveKind::AllReduce, Bytes(8 * kGiB), make_group(a100, 32, 8));
    MESSAGE("DGX A100 4x8 all-reduce: predicted " << p / kGB << " GB/s, published 192");
    CHECK(rel_error(p, 192 * kGB) < 0.15);
  }
  SUBCASE("2 HGX A100 nodes with only 4 HDR NICs each: 91 GB/s") {
    // NVIDIA/nccl-tests#100: two HGX-A100 (A100-SXM-80GB), four ConnectX-6 200 Gb/s,
    // all_reduce_perf -b 1G -e 8G on 16 ranks: "the testing result can reach 91GB/s in busbw".
    HardwareProfile hw = a100;
    hw.nics_per_node = 4;
    double p = predicted_busbw(hw, CollectiveKind::AllReduce, Bytes(8 * kGiB), make_group(hw, 16, 8));
    MESSAGE("HGX A100 2x8, 4 NICs, all-reduce: predicted " << p / kGB << " GB/s, published 91");
    CHECK(rel_error(p, 91 * kGB) < 0.15);
  }
  SUBCASE("3 nodes x 8 A100-40GB, 4 HDR NICs, 131 MB all-reduce: 96.45 GB/s (mid-size, 20%)") {
    // NVIDIA/nccl-tests#119: 24 ranks, row "131072008 ... 2604.6 us ... busbw 96.45".
    // Mid-size buffers are where the model is weakest (latency + the derived curve); tolerance 20%.
    HardwareProfile hw = load_hardware("a100-40gb", kRoot);
    hw.nics_per_node = 4;
    double p = predicted_busbw(hw, CollectiveKind::AllReduce, Bytes(131072008), make_group(hw, 24, 8));
    MESSAGE("A100 3x8, 4 NICs, 131 MB all-reduce: predicted " << p / kGB << " GB/s, published 96.45");
    CHECK(rel_error(p, 96.45 * kGB) < 0.20);
  }
}

TEST_CASE("published nccl-tests bus bandwidths: DGX H100 / H200 class") {
  HardwareProfile h100 = load_hardware("h100-80gb", kRoot);
  HardwareProfile h200 = load_hardware("h200-141gb", kRoot);
  SUBCASE("4 H100 nodes (32 GPU-NIC pairs, NDR 400G): 365.84 GB/s all-reduce") {
    // NVIDIA/nccl-tests#309: "I run on 4 nodes on 32 GPU-NIC pairs ... max busbw can get 365.84 GB/s".
    double p = predicted_busbw(h100, CollectiveKind::AllReduce, Bytes(8 * kGiB), make_group(h100, 32, 8));
    MESSAGE("DGX H100 4x8 all-reduce: predicted " << p / kGB << " GB/s, published 365.84");
    CHECK(rel_error(p, 365.84 * kGB) < 0.15);
  }
  SUBCASE("1 node x 8 H200, ring all-reduce (NVLink SHARP disabled): 367.61 GB/s") {
    // stas00/ml-engineering network/benchmarks/results/all-reduce-8xH200.md: "what the same node measures
    // with SHARP disabled (367.61GBps, or 82% of spec)"; 16 GiB is the largest size of that sweep.
    double p = predicted_busbw(h200, CollectiveKind::AllReduce, Bytes(16 * kGiB), make_group(h200, 8, 8));
    MESSAGE("HGX H200 1x8 ring all-reduce: predicted " << p / kGB << " GB/s, published 367.61");
    CHECK(rel_error(p, 367.61 * kGB) < 0.15);
  }
  SUBCASE("1 node x 8 H100, all-gather (ring): about 370 GB/s") {
    // NVIDIA/nccl-tests#212 (S. Jeaugey): "NCCL can get an effective NVLink bandwidth of 370GB/s, which you
    // can observe as BusBw when running non-allreduce operations". The profile's plateau comes from NCCL's
    // own per-link figure (topo.h), so this checks consistency rather than an independent measurement.
    double p = predicted_busbw(h100, CollectiveKind::AllGather, Bytes(16 * kGiB), make_group(h100, 8, 8));
    MESSAGE("DGX H100 1x8 all-gather: predicted " << p / kGB << " GB/s, published ~370");
    CHECK(rel_error(p, 370 * kGB) < 0.15);
  }
}

// The Ultra-Scale Playbook's own p5 cluster: median all-reduce bus bandwidth of 1 GiB (256M fp32 elements, nanotron
// trainer.py measure_bandwidth) by node count, vinjn/nanotron-ultrascale-playbook
// assets/data/benchmarks/pp_comm_bandwidth.html @ 924e4d0b88e065a9a5198d75b113da1cf3bd4473. The p5 profile's
// bus_efficiency_by_nodes was derived from these medians (hwprofiles/p5-h100-80gb.yaml), so this checks the
// derivation and the mechanism (the factor scales the network's share in ring and tree alike), not a prediction.
TEST_CASE("p5 EFA: all-reduce bus bandwidth by node count reproduces the playbook's measured medians") {
  HardwareProfile p5 = load_hardware("p5-h100-80gb", kRoot);
  const Bytes gib(1024.0 * 1024.0 * 1024.0);
  struct Point {
    int nodes;
    double busbw_gbs;
  };
  for (Point pt : {Point{2, 361.7}, Point{4, 160.1}, Point{8, 99.6}, Point{16, 84.7}, Point{32, 64.9}}) {
    CAPTURE(pt.nodes);
    const int n = pt.nodes * 8;
    CommGroup g = make_group(p5, n, 8);
    const double t = collective_time(p5, CollectiveKind::AllReduce, gib, g).value;
    const double busbw = 2.0 * (n - 1) / n * gib.value / t / kGB;
    // At 2 nodes no factor applies: the NVLink share binds, and the ring's latency leaves the model 7% under the
    // measured median (NCCL reaches more there than the ring model's NVLink bound).
    CHECK(busbw == doctest::Approx(pt.busbw_gbs).epsilon(pt.nodes == 2 ? 0.08 : 0.03));
  }
  // Without the factor the same profile's model is 2-5x faster beyond 2 nodes (the base's InfiniBand-derived curve).
  HardwareProfile ib = p5;
  ib.inter_node.bus_efficiency_by_nodes = EfficiencyCurve{};
  CommGroup g32 = make_group(p5, 256, 8);
  CHECK(collective_time(ib, CollectiveKind::AllReduce, gib, g32).value <
        0.5 * collective_time(p5, CollectiveKind::AllReduce, gib, g32).value);
  // One node never crosses the network: the factor does not apply.
  CommGroup g1 = make_group(p5, 8, 8);
  CHECK(collective_time(ib, CollectiveKind::AllReduce, gib, g1).value ==
        doctest::Approx(collective_time(p5, CollectiveKind::AllReduce, gib, g1).value));
}

// A profile may give all-gather and reduce-scatter their own factor by node count (docs/hardware.md, "The network
// between nodes": the playbook's p5 cluster measured them at 0.43 of the all-reduce's bus bandwidth on 32 nodes).
TEST_CASE("a collective's own factor by node count replaces the shared one; absent, the shared one applies") {
  HardwareProfile hw = synthetic_node();
  // 2 nodes of 8: the network's share is 8 x 25 x 0.8 = 160 GB/s, over NVLink's 100; a factor of 0.25 makes it 40.
  hw.inter_node.bus_efficiency_by_nodes = EfficiencyCurve{{2.0}, {0.5}};  // 80 GB/s: NVLink's 100 no longer binds
  hw.inter_node.bus_efficiency_by_nodes_all_gather = EfficiencyCurve{{2.0}, {0.25}};  // 40 GB/s
  CommGroup g = make_group(hw, 16, 8);
  const Bytes s(1.0 * kGiB);
  CHECK(ring_bus_bandwidth(hw, g, s, CollectiveKind::AllGather).value == doctest::Approx(40 * kGB));
  CHECK(ring_bus_bandwidth(hw, g, s, CollectiveKind::ReduceScatter).value == doctest::Approx(80 * kGB));
  CHECK(ring_bus_bandwidth(hw, g, s, CollectiveKind::AllReduce).value == doctest::Approx(80 * kGB));
  // Inside one node no factor applies.
  CHECK(ring_bus_bandwidth(hw, make_group(hw, 8, 8), s, CollectiveKind::AllGather).value == doctest::Approx(100 * kGB));
}
