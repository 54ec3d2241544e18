// A communicator: which ranks take part in a collective and how they sit on the nodes.
// The cost model only needs the shape: how many ranks, and how many of them share a node
// (the group then spans size / ranks_per_node nodes, the same number on each).
#pragma once

#include <string>

#include "hardware/hardware_profile.hpp"

namespace fsdp {

struct CommGroup {
  int size = 1;            // ranks in the group
  int ranks_per_node = 1;  // group members on each node it spans
  int nodes() const { return size / ranks_per_node; }
  std::string describe() const;  // "16 ranks (8 per node x 2 nodes)"
};

// A group of `size` ranks, `ranks_per_node` on each node. InputError unless ranks_per_node divides
// size and fits the node (at most hw.gpus_per_node).
CommGroup make_group(const HardwareProfile& hw, int size, int ranks_per_node);

// Groups as data-parallel jobs form them from a world of `nodes` x `ranks_per_node_used` ranks
// numbered node-major (rank = node * ranks_per_node_used + local_rank):
//  - contiguous_group: `size` consecutive ranks (an FSDP/HSDP shard group, or the whole world);
//  - strided_group: `size` ranks `stride` apart (an HSDP replica group, stride = shard-group size).
CommGroup contiguous_group(const HardwareProfile& hw, int ranks_per_node_used, int size);
CommGroup strided_group(const HardwareProfile& hw, int ranks_per_node_used, int stride, int size);

}  // namespace fsdp
