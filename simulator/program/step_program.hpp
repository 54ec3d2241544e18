// The step program: the ordered operations of one training step on one rank
// (DESIGN.md "The middle"). The memory walk replays its allocations and frees;
// the timeline schedules the same operations on their streams. A strategy is
// "how to emit the program" (step_program.cpp has one emitter per family).
#pragma once

#include <string>
#include <vector>

#include "hardware/cluster.hpp"
#include "memory/memory_category.hpp"
#include "model/module_graph.hpp"
#include "program/wrap_units.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

enum class Stream { Compute, AllGather, ReduceScatter, HostToDevice, DeviceToHost, Host, kCount };
const char* to_string(Stream);

enum class OpKind {
  Gather,         // all-gather a unit's parameters (or copy them in from the host first)
  Forward,        // a unit's forward compute
  Reshard,        // free a unit's unsharded parameters
  Loss,           // head output -> loss
  LossBackward,   // loss backward (logit gradients)
  Backward,       // a unit's backward compute (recompute included)
  ReduceScatter,  // a unit's (or bucket's) gradient reduce-scatter
  AllReduce,      // gradient all-reduce (DDP buckets, HSDP replicas, no-shard)
  ParamAllGather, // ZeRO-1/2: gather updated parameter shards after the step
  CopyToHost,     // gradients to the host (offload)
  CopyToDevice,   // parameters to the device (offload)
  OptimizerStep,  // device optimizer
  HostOptimizerStep,  // host optimizer (offload)
};
const char* to_string(OpKind);

enum class CollectiveKind { None, AllGather, ReduceScatter, AllReduce, Broadcast };
enum class GroupKind { Shard, Replica, World };

struct MemEvent {
  MemoryCategory category;
  double bytes;  // > 0 allocates, < 0 frees
};

struct Op {
  OpKind kind = OpKind::Forward;
  Stream stream = Stream::Compute;
  int unit = -1;        // index into StepProgram::units
  int micro_batch = 0;  // 0-based
  std::string label;
  std::vector<MemEvent> on_issue;     // applied when the op is issued (CPU order)
  double transient_bytes = 0;         // live only while the op runs (Transient category)
  std::vector<MemEvent> on_complete;  // applied when it completes
  // Cost (read by the timeline)
  double matmul_flops = 0;
  double attention_flops = 0;
  double elementwise_bytes = 0;  // memory-bound traffic
  CollectiveKind collective = CollectiveKind::None;
  GroupKind group = GroupKind::Shard;
  double comm_bytes = 0;  // full buffer size of the collective
  double copy_bytes = 0;  // host<->device
  double host_optimizer_params = 0;
  std::vector<int> deps;  // ops that must complete before this one starts
};

struct StepLayout {
  int64_t world = 1;
  int64_t shard_size = 1;   // ranks a parameter/gradient/optimizer shard is split over
  int64_t replicas = 1;     // world / shard_size
  int64_t tokens_per_micro_batch = 0;
};

struct StepProgram {
  StepLayout layout;
  std::vector<WrapUnit> units;
  std::vector<MemEvent> persistent;  // allocated before the step and alive throughout (steady state)
  std::vector<Op> ops;
  double host_bytes_per_rank = 0;    // host-resident state for offload (pinned buffers included)
  double pinned_bytes_per_rank = 0;
  int communicators = 0;             // NCCL communicators this rank holds
};

struct ProgramInput {
  const ModuleGraph* graph = nullptr;
  Cluster cluster;
  Strategy strategy;
  const RuntimeProfile* runtime = nullptr;
};

StepProgram emit_step_program(const ProgramInput& in);

// Activation query for this strategy and runtime (dtype, attention, autocast, runtime module behaviour).
ActivationQuery activation_query(const Strategy& s, const RuntimeProfile& rt);

}  // namespace fsdp
