// The vocabulary of one training step, shared by both halves: the simulator's step program
// (step_program.hpp) and fsdp-run (executor/shard, executor/train) name streams, op kinds,
// collectives, process groups and phases with these enums only, so that a memory phase, a
// collective trace entry and a step-program op compare by value, never by a string written twice.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace fsdp {

// TensorParallel: the tensor-parallel collectives of the layers (program/tensor_parallel.hpp); Pipeline: the
// point-to-point transfers between pipeline stages (program/pipeline_parallel.hpp); ExpertParallel: the token
// dispatch and combine all-to-alls of the routed experts (program/expert_parallel.hpp). They block the compute stream
// (Megatron-LM and DTensor wait for them before the next GEMM; torchtitan's dispatch waits for the token counts on the
// host) unless async TP overlaps them (timeline.cpp).
enum class Stream : uint8_t {
  Compute,
  AllGather,
  ReduceScatter,
  HostToDevice,
  DeviceToHost,
  Host,
  TensorParallel,
  Pipeline,
  ExpertParallel,
  kCount
};
const char* to_string(Stream);

enum class OpKind : uint8_t {
  Gather,             // all-gather a unit's parameters (or copy them in from the host first)
  Forward,            // a unit's forward compute
  Reshard,            // free a unit's unsharded parameters
  Loss,               // head output -> loss
  LossBackward,       // loss backward (logit gradients)
  Backward,           // a unit's backward compute (recompute included)
  ReduceScatter,      // a unit's (or bucket's) gradient reduce-scatter
  AllReduce,          // gradient all-reduce (DDP buckets, HSDP replicas, no-shard)
  ParamAllGather,     // ZeRO-1/2: gather updated parameter shards after the step
  CopyToHost,         // gradients to the host (offload)
  CopyToDevice,       // parameters to the device (offload)
  OptimizerStep,      // device optimizer
  HostOptimizerStep,  // host optimizer (offload)
  GradNorm,           // the training loop's whole-gradient passes before the step (norm and clip, averaging)
  ScalarAllReduce,    // one scalar summed over a group (the gradient norm's partial sums, the step's loss)
  TpCollective,       // a unit's tensor-parallel collectives of one kind (program/tensor_parallel.hpp)
  PipelineTransfer,   // a pipeline stage's point-to-point send or receive (program/pipeline_parallel.hpp)
  EpAllToAll,         // a unit's expert-parallel token all-to-alls (program/expert_parallel.hpp)
};
const char* to_string(OpKind);

// SendRecv: a pipeline stage's point-to-point transfer to its neighbour (torch.distributed.pipelining's
// batch_isend_irecv; Megatron-LM p2p_communication.py). AllToAll: every rank sends a slice of its buffer to each
// other rank of the group (all_to_all_single: the expert-parallel token dispatch and combine).
enum class CollectiveKind : uint8_t { None, AllGather, ReduceScatter, AllReduce, Broadcast, SendRecv, AllToAll };
const char* to_string(CollectiveKind);
std::optional<CollectiveKind> collective_kind_from_string(std::string_view);

// Shard: the ranks a parameter/gradient shard is split over (the world, or an HSDP shard group);
// Replica: across shard groups (HSDP); World: every data-parallel rank (DDP buckets, the step's scalars);
// Tensor: the tensor-parallel group (tp ranks inside a node); Pipeline: the pipeline stages (a stage and its
// neighbour for point-to-point transfers); Mesh: every rank of the mesh, dp x tp x pp (the step's loss, which
// fsdp-run sums over all of them: the last stage's loss reaches the first stage's rank 0 in the same call; World
// when the mesh is data parallel only); Expert: the expert-parallel group (ep consecutive ranks of the shard group,
// torchtitan's `ep` mesh dimension), which the routed experts are split over and the tokens dispatched in.
enum class GroupKind : uint8_t { Shard, Replica, World, Tensor, Pipeline, Mesh, Expert };
const char* to_string(GroupKind);
std::optional<GroupKind> group_kind_from_string(std::string_view);

// The element type a collective moves on the wire: the plan's dtypes, and fp64 for the training loop's
// scalars (the gradient norm's partial sums, the step's loss).
enum class WireType : uint8_t { Fp64, Fp32, Bf16, Fp16 };
const char* to_string(WireType);
std::optional<WireType> wire_type_from_string(std::string_view);
double bytes_of(WireType);

// What an op does, in the words of memory phases ("backward layers.3 (micro-batch 1)") and of the
// collective trace. An op's full label is its phase's words, then its unit's name where it has one.
enum class Phase : uint8_t {
  BeforeStep,
  FwdAllGather,
  Forward,
  Free,
  HeadLossForward,
  LossBackward,
  BwdAllGather,
  Backward,
  PostBackward,
  ReduceScatter,
  AllReduce,
  BucketAllReduce,
  ReplicaAllReduce,
  AdapterAllReduce,
  GradientsToHost,
  GradientNorm,
  GradientNormAllReduce,
  OverflowCheckAllReduce,
  OptimizerStep,
  HostOptimizerStep,
  ParamAllGather,
  ParametersToDevice,
  LossAllReduce,
  // Tensor parallelism (program/tensor_parallel.hpp): the sequence-parallel all-gathers and reduce-scatters of a
  // unit's layers (or their all-reduces without sequence parallelism), in forward and in backward; the
  // vocabulary-parallel cross-entropy's all-reduces; the replicated norms' gradients summed over the tp group.
  TpForwardCollectives,
  TpBackwardCollectives,
  TpLossAllReduce,
  TpNormGradAllReduce,
  // Pipeline parallelism (program/pipeline_parallel.hpp): a stage's activations to the next stage and the
  // gradients back.
  PipelineSendActivations,
  PipelineRecvActivations,
  PipelineSendGradients,
  PipelineRecvGradients,
  // Expert parallelism (program/expert_parallel.hpp): the routed tokens sent to the ranks holding their experts and
  // the experts' outputs sent back, in forward (and a recomputed forward) and in backward.
  EpForwardAllToAll,
  EpBackwardAllToAll,
  kCount
};
const char* to_string(Phase);
std::optional<Phase> phase_from_string(std::string_view);
// Phases of the step as a whole (after the last backward): their labels carry no micro-batch.
bool is_step_phase(Phase);
// Phases whose ops belong to no wrap unit in a step trace (the loss ops: the head is the root's, but what runs is
// the loss, not a unit's hook).
inline bool phase_has_unit(Phase p) { return p != Phase::HeadLossForward && p != Phase::LossBackward; }

}  // namespace fsdp
