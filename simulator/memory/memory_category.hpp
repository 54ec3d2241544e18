// Named memory categories, the same names in prediction (simulator) and
// measurement (fsdp-run reports), so the two compare line by line.
// Modelled on torch.distributed._tools.fsdp2_mem_tracker's _FSDPRefType.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace fsdp {

enum class MemoryCategory : int {
  ShardedParams = 0,  // this rank's parameter shards (or full replicas when not sharded), in storage dtype
  UnshardedParams,    // all-gathered (or cast) full parameters of live units, prefetched ones included
  MasterParams,       // fp32 master copy when params are stored in a lower precision
  UnshardedGrads,     // full gradients of a unit before reduce-scatter (or DDP's full grads)
  ShardedGrads,       // this rank's gradient shards (kept until the optimizer step)
  OptimizerStates,    // Adam exp_avg / exp_avg_sq, SGD momentum
  Activations,        // tensors saved for backward
  Transient,          // working memory: logits, loss, backward temporaries of the live unit
  CommBuffers,        // DDP buckets, all-gather / reduce-scatter staging buffers
  Nccl,               // NCCL communicator and channel buffers
  Workspace,          // CUDA context, cuBLAS/cuDNN workspaces
  Fragmentation,      // reserved minus allocated in the caching allocator
  kCount
};

inline constexpr std::size_t kNumMemoryCategories = static_cast<std::size_t>(MemoryCategory::kCount);

inline constexpr std::array<std::string_view, kNumMemoryCategories> kMemoryCategoryNames{
    "sharded_params",   "unsharded_params", "master_params", "unsharded_grads", "sharded_grads",
    "optimizer_states", "activations",      "transient",     "comm_buffers",    "nccl",
    "workspace",        "fragmentation"};

constexpr std::string_view to_string(MemoryCategory c) { return kMemoryCategoryNames[static_cast<std::size_t>(c)]; }

constexpr std::optional<MemoryCategory> memory_category_from_string(std::string_view s) {
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (kMemoryCategoryNames[i] == s) return static_cast<MemoryCategory>(i);
  return std::nullopt;
}

}  // namespace fsdp
