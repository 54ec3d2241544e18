// How many GPUs (or CPU ranks), and how they are grouped into nodes.
#pragma once

#include <cstdint>

namespace fsdp {

struct Cluster {
  int64_t nodes = 1;
  int64_t gpus_per_node = 1;
  int64_t world_size() const { return nodes * gpus_per_node; }
};

}  // namespace fsdp
