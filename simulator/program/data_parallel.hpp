// Data parallelism as a transform of the step, beside tensor_parallel.hpp and pipeline_parallel.hpp: what the
// data-parallel dimension of the mesh (Strategy::kind over the dp = world / (tp x pp) ranks that hold the same model
// slice) does to each unit and to the step. Its behaviour is data, a DataParallelPlan derived once from the strategy
// and the runtime profile (where a unit's state lives: strategy/placement.hpp unit_placement; in which dtype the
// runtime stores parameters and gradients; when and how it reduces gradients; what the step adds), and the ops it
// adds are built here: the parameter all-gathers of sharded units, the gradient reductions (reduce-scatter, HSDP's
// replica all-reduce, the all-reduce of a bucket or of a unit), and the gather of the updated parameters after a
// ZeRO-1/2 step. The step program (step_program.cpp) composes the dimensions: it asks the plan, never the strategy
// kind, and pushes these ops where the schedule puts them.
//
// Sources: torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp (DDP); torch/distributed/fsdp
// (FSDP1 FullyShardedDataParallel, FSDP2 fully_shard: _fully_shard/_fsdp_param.py, _fsdp_collectives.py); DeepSpeed
// deepspeed/runtime/zero/stage_1_and_2.py and stage3.py (ZeRO-1/2/3; Rajbhandari et al. 2020, arXiv:1910.02054);
// nanotron (huggingface/nanotron @ 67c5ebb6a925cb47026b22013af8bd1bb6c46d93) for ZeRO-1 with an fp32 gradient
// accumulator; the runtime profile's keys (runtime/runtime_profile.hpp) where runtimes differ.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "program/collective_wire.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/placement.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct DataParallelPlan {
  // A unit's placement but the root's (strategy/placement.hpp unit_placement; the root's differs only in
  // reshard_after_forward): sharded parameters choose the sharded emitter (gathers before use), replicas the
  // replicated one.
  UnitPlacement place;
  // The compute dtype differs from the master dtype (mixed precision).
  bool mixed = false;
  // The ZeRO paper's layout (Rajbhandari et al. 2020, arXiv 1910.02054 sec. 3.1, DeepSpeed): parameters and
  // gradients in the low precision, an fp32 master copy kept with the optimizer states and partitioned like them
  // (runtime profile zero_low_precision_params, ZeRO stages only). PyTorch's DDP/FSDP instead keep fp32 parameters
  // and cast for compute. ZeRO-3 keeps its master partition apart even in the parameters' dtype: stage3.py shares
  // the bf16 partition as the master only if `flat.device == self.device`, and self.device is the accelerator's
  // device name, a string, which a torch.device never equals (pytorch/pytorch#153418), so it always clones
  // (runtime profile zero3_master_copy_same_dtype).
  bool zero_layout = false;
  // nanotron's FP32GradientAccumulator (src/nanotron/optim/gradient_accumulator.py; runtime profile
  // fp32_grad_accumulation, DDP and ZeRO-1 with mixed precision): the model is built in the compute dtype, the
  // accumulator keeps the fp32 copy of the parameters the optimizer updates and a contiguous fp32 buffer of every
  // gradient.
  bool fp32_grad_accumulator = false;
  // The dtype of the stored parameters (a replica, or the rank's shard): the compute dtype under the two layouts
  // above, else the master dtype.
  DType param_storage_dtype = DType::Fp32;
  // The dtype of the gradients the rank keeps: ZeRO-1/2 keep the gradient (partition) in the low precision and
  // convert it to fp32 for the step; ZeRO-3 reduce-scatters straight into the gradient partition in the reduce
  // dtype (stage3.py: fp32 partitioned gradients; estimate_zero3_model_states_mem_needs counts 18 bytes/param); the
  // accumulator's per-micro-batch .grad is a compute-dtype parameter's; PyTorch's are the master dtype's.
  DType grad_buffer_dtype = DType::Fp32;
  // ZeRO-3's gradient partition is one flat buffer allocated with the optimizer, alive for the run (stage3.py
  // grad_partitions_flat_buffer; runtime profile zero3_grad_partition_persistent).
  bool grad_partition_persistent = false;
  // ZeRO-3 updates its partition sub-group by sub-group (stage3.py _prepare_fp32_grad_for_sub_group:
  // flatten(averaged_gradients).to(master dtype); runtime profile zero3_step_sub_group_elems): a flat copy of up to
  // sub_group_size gradient elements, and its cast where the master dtype differs, alive while that sub-group
  // steps. ZeRO-1/2 instead convert the whole low-precision partition (stage_1_and_2.py:
  // single_partition_of_fp32_groups[i].grad).
  bool step_in_sub_groups = false;
  // DDP allocates its gradient buckets once, at construction (torch/csrc/distributed/c10d/reducer.cpp
  // initialize_buckets); with gradient_as_bucket_view (runtime profile ddp_gradient_as_bucket_view) the .grad
  // tensors are views into them. nanotron wraps the model in DDP only with more than one data-parallel rank
  // (src/nanotron/trainer.py init_model @ 67c5ebb6: make_ddp = data_parallel_size > 1 and not
  // (accumulate_grad_in_fp32 and zero_stage > 0)); its FP32GradientAccumulator is what marks that trainer here.
  bool reducer_buckets = false;
  // Full gradients reduced in buckets of ddp_bucket_mb (DDP and ZeRO-1: place.reduction AllReduceBuckets):
  // torch/nn/parallel/distributed.py bucket_cap_mb; executor/shard/sharded_model.cpp post_backward.
  bool bucketed = false;
  // ZeRO-1 without DDP reduces once after the last micro-batch's backward, the whole buffer (nanotron
  // sync_gradients_across_dp; runtime profile zero1_grads_reduced_after_backward), not in buckets overlapping it.
  bool reduce_after_backward = false;
  // Gradients are reduced after every micro-batch's backward: partitioned gradients always under ZeRO-2 (DeepSpeed
  // refuses no_sync with partitioned gradients), the sharded (FSDP) family unless grad_sync last-micro-batch (FSDP1
  // no_sync, FSDP2 set_requires_gradient_sync(False)); replicas (DDP no_sync) only on the last.
  bool reduces_every_micro_batch = false;
  // The last micro-batch's reductions are issued after the stage's whole backward, not unit by unit inside it:
  // torch.distributed.pipelining runs every backward with gradient sync off and then FSDP2's post-backward of every
  // group by hand (stage.py backward_maybe_with_nosync, last_backward: run_post_backward, then
  // _root_post_backward_final_callback, whose finalize_backward makes the compute stream wait for the reductions), so
  // the schedule's send of that micro-batch's input gradient follows them (schedules.py: get_bwd_send_ops after
  // backward_one_chunk). Pipeline stages of a runtime whose schedule keeps the units gathered
  // (RuntimeProfile::pipeline_keeps_units_gathered).
  bool reduces_after_stage_backward = false;
  // Replicated parameters with partitioned gradients (ZeRO-2): each bucket's full gradient is held until it is
  // reduce-scattered into this rank's partition (stage_1_and_2.py average_tensor / reduce_ipg_grads).
  bool partitions_replicated_grads = false;
  // ZeRO-2 on a runtime that copies a unit's gradients into a flat buffer (runtime profile
  // replicated_grads_via_flat_copy, fsdp-run): the flat copy itself is reduce-scattered, and it and the shard-sized
  // output stay alive until the reduction is waited for (executor/shard/sharded_model.cpp post_backward).
  bool flat_grad_copy = false;
  // Replicated parameters with a sharded optimizer (ZeRO-1/2): every rank updates its slice of the replica and the
  // others' slices are all-gathered after the step (stage_1_and_2.py step: all_gather_dp_groups).
  bool gathers_params_after_step = false;
  // HSDP (torch/distributed/fsdp HYBRID_SHARD, FSDP2 2-D mesh): shard groups of hsdp_group ranks, replicated across
  // them; place.replica_all_reduce.
  bool shard_groups = false;
};

// The plan of `dp_ranks` data-parallel ranks (the world / (tp x pp)).
DataParallelPlan data_parallel_plan(const Strategy& s, const RuntimeProfile& rt, int64_t dp_ranks);

// The ranks a parameter/gradient/optimizer shard is split over among `dp_ranks` data-parallel ranks: an HSDP shard
// group, all of them for the ZeRO stages and FSDP, one for replicas (DDP, NO_SHARD).
int64_t dp_shard_size(const Strategy& s, int64_t dp_ranks);

// NCCL communicators the data-parallel dimension holds: the default (world) group, plus shard and replica groups
// for HSDP; none on one rank.
int dp_communicators(const DataParallelPlan& plan, int64_t dp_ranks);

// What the data-parallel ops of one step program share: the strategy, runtime and plan, the mesh, the wire format,
// the element sizes the step program derived (compute, master, reduce dtype; stored parameters and gradients), and
// the backend's properties (ProgramInput).
struct DataParallelContext {
  const Strategy* s = nullptr;
  const RuntimeProfile* rt = nullptr;
  const DataParallelPlan* plan = nullptr;
  const StepLayout* layout = nullptr;
  CollectiveWire wire;
  double pb = 0, mb = 0, rb = 0;  // compute, master and reduce dtype bytes
  double sb = 0, gb = 0;          // stored parameter and gradient bytes (plan dtypes)
  bool backend_gather_buffer = false;
  bool host_params_are_compute_params = false;

  double shard(double elems) const;   // this rank's elements of `elems` split over the shard group
  double padded(double elems) const;  // `elems` padded to a multiple of the shard group
};

// The all-gather of a sharded unit's parameters before its forward (or again before its backward).
struct UnitGather {
  int unit = -1;
  int micro_batch = 0;
  bool backward = false;
  // The unit's elements stored in the master dtype and cast to the compute dtype for the gather (unpadded): its
  // trainable ones, and a frozen base stored so (RuntimeProfile::lora_base_in_master_dtype).
  double cast_elems = 0;
  double gathered_bytes = 0;    // its gathered parameters in compute form (trainable and frozen)
  double wire_bytes = 0;        // what the gather moves (trainable and frozen)
  double host_shard_bytes = 0;  // parameter offload: the shard copied in from the host (master dtype)
  // The unsharded parameters are in the walk already (a pipeline schedule left the unit resident since an earlier
  // pass): the gather moves them again without allocating them.
  bool params_resident = false;
};
// Its op: the unsharded parameters allocated on issue (unless resident), the staging buffers alive while it runs. The
// caller adds the prefetch window's dependency.
Op dp_param_gather_op(const DataParallelContext& c, const UnitGather& g);

// A sharded unit's reduce-scatter of `full` gradient elements (`rs_input` bytes of reduce-dtype copy made by its
// post-backward, freed when it ends) into the shard of `train_elems`; `kept`: the sharded gradient it allocates
// (the first reduced micro-batch's, where the step allocates gradients). `wire_elems`: what it moves per rank's
// group, `full` unless the experts reduce over their own group (program/expert_parallel.hpp
// ep_shard_equivalent_params).
Op dp_reduce_scatter_op(const DataParallelContext& c, int unit, int micro_batch, double full, double wire_elems,
                        double train_elems, double rs_input, const std::optional<MemEvent>& kept);

// HSDP: a unit's reduced gradient shard of `shard_elems` summed over the replicas.
Op dp_replica_all_reduce_op(const DataParallelContext& c, int unit, int micro_batch, double shard_elems);

// A replicated unit's gradient reduction of `elems` gradient elements (a unit, or a bucket closed at `unit`):
// ZeRO-2's reduce-scatter into the partition (through the flat copy where flat_copy; `kept`: the partition it
// allocates), else an all-reduce.
Op dp_replicated_reduction_op(const DataParallelContext& c, int unit, int micro_batch, double elems, bool flat_copy,
                              const std::optional<MemEvent>& kept);

// After a ZeRO-1/2 step (op `step_op`): the gather of the updated parameter slices, in one collective of `total`
// elements or one per wrap unit of `unit_train` elements each (runtime profile zero_param_gather_per_unit).
std::vector<Op> dp_step_param_gathers(const DataParallelContext& c, const std::vector<double>& unit_train, double total,
                                      int step_op);

}  // namespace fsdp
