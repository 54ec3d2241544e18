#include "comm/comm_group.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace fsdp {

std::string CommGroup::describe() const {
  return std::to_string(size) + " ranks (" + std::to_string(ranks_per_node) + " per node x " + std::to_string(nodes()) +
         (nodes() == 1 ? " node)" : " nodes)");
}

CommGroup make_group(const HardwareProfile& hw, int size, int ranks_per_node) {
  if (size < 1 || ranks_per_node < 1)
    throw InputError("communicator of " + std::to_string(size) + " ranks with " + std::to_string(ranks_per_node) +
                     " per node: both must be at least 1");
  if (size % ranks_per_node != 0)
    throw InputError("communicator of " + std::to_string(size) + " ranks cannot spread " +
                     std::to_string(ranks_per_node) + " per node evenly");
  if (ranks_per_node > hw.gpus_per_node)
    throw InputError("communicator with " + std::to_string(ranks_per_node) + " ranks per node, but hardware '" +
                     hw.name + "' has " + std::to_string(hw.gpus_per_node) + " GPUs per node");
  return CommGroup{size, ranks_per_node};
}

CommGroup contiguous_group(const HardwareProfile& hw, int ranks_per_node_used, int size) {
  if (ranks_per_node_used < 1) throw InputError("ranks per node must be at least 1");
  if (size <= ranks_per_node_used) {
    if (ranks_per_node_used % size != 0)
      throw InputError("a group of " + std::to_string(size) + " consecutive ranks would straddle nodes of " +
                       std::to_string(ranks_per_node_used) + " ranks");
    return make_group(hw, size, size);
  }
  if (size % ranks_per_node_used != 0)
    throw InputError("a group of " + std::to_string(size) + " consecutive ranks does not cover whole nodes of " +
                     std::to_string(ranks_per_node_used) + " ranks");
  return make_group(hw, size, ranks_per_node_used);
}

CommGroup strided_group(const HardwareProfile& hw, int ranks_per_node_used, int stride, int size) {
  if (ranks_per_node_used < 1 || stride < 1) throw InputError("ranks per node and stride must be at least 1");
  // Members are stride apart: a node of ranks_per_node_used ranks holds ranks_per_node_used / stride of
  // them when the stride is shorter than a node, otherwise one.
  int per_node = stride < ranks_per_node_used ? ranks_per_node_used / stride : 1;
  if (stride < ranks_per_node_used && ranks_per_node_used % stride != 0)
    throw InputError("stride " + std::to_string(stride) + " does not divide the " +
                     std::to_string(ranks_per_node_used) + " ranks of a node");
  per_node = std::min(per_node, size);
  return make_group(hw, size, per_node);
}

}  // namespace fsdp
