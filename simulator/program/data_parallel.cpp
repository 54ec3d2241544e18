#include "program/data_parallel.hpp"

#include <cmath>

namespace fsdp {

namespace {

// DeepSpeed's ZeRO engine (stage_1_and_2.py, stage3.py) runs these strategies; PyTorch's DDP and FSDP the others.
bool deepspeed_zero(StrategyKind k) {
  return k == StrategyKind::Zero1 || k == StrategyKind::Zero2 || k == StrategyKind::Zero3;
}

}  // namespace

DataParallelPlan data_parallel_plan(const Strategy& s, const RuntimeProfile& rt, int64_t dp_ranks) {
  DataParallelPlan p;
  p.place = unit_placement(s, /*root=*/false, rt.root_reshard_after_forward);
  p.mixed = s.param_dtype != s.master_dtype;
  p.bucketed = p.place.reduction == GradReduction::AllReduceBuckets;
  const bool zero = deepspeed_zero(s.kind);
  // ZeRO-3 is the ZeRO stage that shards parameters (the FSDP family shards them too, with PyTorch's layout).
  const bool zero3 = zero && p.place.params_sharded;
  const bool own_master = p.mixed || (zero3 && rt.zero3_master_copy_same_dtype);
  p.zero_layout = own_master && rt.zero_low_precision_params && zero;
  // The accumulator replaces DDP's and ZeRO-1's full-gradient reduction (bucketed all-reduce of replicas).
  p.fp32_grad_accumulator = p.mixed && rt.fp32_grad_accumulation && p.bucketed;
  p.param_storage_dtype = p.zero_layout || p.fp32_grad_accumulator ? s.param_dtype : s.master_dtype;
  p.grad_buffer_dtype = p.zero_layout ? (zero3 ? s.reduce_dtype : s.param_dtype) : s.master_dtype;
  if (p.fp32_grad_accumulator) p.grad_buffer_dtype = s.param_dtype;  // autograd's .grad of a compute-dtype parameter
  p.grad_partition_persistent = zero3 && rt.zero3_grad_partition_persistent;
  p.step_in_sub_groups = zero3;
  // DDP is the bucketed strategy whose reducer owns its buckets; ZeRO-1 buckets without a reducer.
  p.reducer_buckets = p.bucketed && !p.place.optim_sharded && !(p.fp32_grad_accumulator && dp_ranks <= 1);
  p.reduce_after_backward = p.bucketed && p.place.optim_sharded && rt.zero1_grads_reduced_after_backward;
  p.partitions_replicated_grads = p.place.grads_sharded && !p.place.params_sharded;
  // A pipeline schedule that keeps the stage's units unsharded to the step's last backward also turns their gradient
  // sync off until then (RuntimeProfile::pipeline_keeps_units_gathered: torch.distributed.pipelining's
  // backward_maybe_with_nosync calls set_requires_gradient_sync(False) for every backward and runs the post-backward
  // once, after the last), as grad_sync last-micro-batch does.
  const bool pipeline_defers = s.mesh.pp > 1 && rt.pipeline_keeps_units_gathered;
  p.reduces_every_micro_batch =
      p.partitions_replicated_grads ||
      (p.place.params_sharded && s.grad_sync == GradSync::EveryMicroBatch && !pipeline_defers);
  p.reduces_after_stage_backward = pipeline_defers && p.place.params_sharded;
  p.flat_grad_copy = p.partitions_replicated_grads && rt.replicated_grads_via_flat_copy;
  p.gathers_params_after_step = p.place.optim_sharded && !p.place.params_sharded;
  p.shard_groups = p.place.replica_all_reduce;
  return p;
}

int64_t dp_shard_size(const Strategy& s, int64_t dp_ranks) {
  const UnitPlacement place = unit_placement(s, /*root=*/false, /*root_reshard_after_forward=*/true);
  if (place.replica_all_reduce) {
    FSDP_ASSERT(s.hsdp_group > 0 && dp_ranks % s.hsdp_group == 0, "hsdp group validated before emission");
    return s.hsdp_group;
  }
  // Replicas keep everything whole; every other strategy splits at least its optimizer states over all the ranks.
  return place.optim_sharded ? dp_ranks : 1;
}

int dp_communicators(const DataParallelPlan& plan, int64_t dp_ranks) {
  if (dp_ranks <= 1) return 0;
  return plan.shard_groups ? 3 : 1;
}

double DataParallelContext::shard(double elems) const {
  return std::ceil(elems / static_cast<double>(layout->shard_size));
}
double DataParallelContext::padded(double elems) const {
  return shard(elems) * static_cast<double>(layout->shard_size);
}

namespace {

// The buffers an all-reduce of `elems` gradient elements over `group` holds while it runs: a reduce dtype other than
// the gradients' reduces a copy (copied back when waited for), which a backend without low-precision collectives
// stages in fp32 once more (executor/dist/comm.cpp all_reduce_impl).
void all_reduce_buffers(const DataParallelContext& c, double elems, GroupKind group, Op& op) {
  const double copy = c.rb != c.gb ? elems * c.rb : 0.0;
  const double staging = c.wire.stages_fp32(group) && c.rb < 4.0 ? elems * 4.0 : 0.0;
  if (copy + staging > 0) {
    op.on_issue.push_back({MemoryCategory::CommBuffers, copy + staging});
    op.on_complete.push_back({MemoryCategory::CommBuffers, -(copy + staging)});
  }
}

}  // namespace

Op dp_param_gather_op(const DataParallelContext& c, const UnitGather& g) {
  const Strategy& s = *c.s;
  const RuntimeProfile& rt = *c.rt;
  Op op = make_collective_op(OpKind::Gather, Stream::AllGather, g.unit, g.micro_batch,
                             g.backward ? Phase::BwdAllGather : Phase::FwdAllGather, CollectiveKind::AllGather,
                             GroupKind::Shard);
  op.comm_bytes = g.wire_bytes;
  op.comm_dtype = c.wire.type(s.param_dtype, GroupKind::Shard);
  const bool offload_params = s.offload == Offload::Params;
  if (offload_params) op.copy_bytes = g.host_shard_bytes;
  if (!g.params_resident) op.on_issue.push_back({MemoryCategory::UnshardedParams, g.gathered_bytes});
  // The all-gather input: this rank's shard cast to the compute dtype (when it differs).
  double staging = c.plan->mixed && !c.plan->zero_layout && !c.wire.fp32_only ? c.shard(g.cast_elems) * c.pb : 0.0;
  // FSDP2 gathers into one flat output and copies out into per-parameter tensors, so the output
  // buffer and the parameters coexist until the copy-out ends (_fsdp_collectives.py foreach_all_gather).
  if (rt.allgather_copy_out) staging += g.gathered_bytes;
  if (c.wire.fp32_only && c.layout->shard_size > 1) {
    // Without low-precision collectives (Gloo, executor/dist/comm.cpp) the fp32 master shard goes over
    // the wire as it is; a compute-dtype shard (offload) is staged in fp32 first. The gather lands in an
    // fp32 buffer, cast into the compute-dtype parameters when it is waited for. Gloo's list
    // all-gather gathers into a flat buffer of its own, released when the collective ends
    // (ProcessGroupGloo.cpp AsyncAllgatherWork::run: newLikeFlat(outputs), copied out). It runs on
    // Gloo's worker thread while the rank computes, so a prefetched gather's flat buffer coexists with
    // the compute issued before its consumer waits (measured: tests/accuracy grid rows with
    // reshard_after_forward peak in a layer's backward with the next unit's gather in flight), or ends
    // before that compute peaks (MemoryResult::peak_allocated_floor). Not the runtime's own buffer (fsdp-run
    // cannot tag it).
    const double elems = c.padded(g.cast_elems), shard_elems = c.shard(g.cast_elems);
    if (offload_params && !c.host_params_are_compute_params) staging += shard_elems * c.pb;
    if (s.offload != Offload::None && c.pb < 4.0) staging += shard_elems * 4.0;
    if (c.pb < 4.0) staging += elems * 4.0;
  }
  if (c.backend_gather_buffer && c.layout->shard_size > 1)
    op.backend_buffer_bytes = c.wire.bytes(c.padded(g.cast_elems), c.pb, GroupKind::Shard);
  if (staging > 0) {
    op.on_issue.push_back({MemoryCategory::CommBuffers, staging});
    op.on_complete.push_back({MemoryCategory::CommBuffers, -staging});
  }
  return op;
}

Op dp_reduce_scatter_op(const DataParallelContext& c, int unit, int micro_batch, double full, double wire_elems,
                        double train_elems, double rs_input, const std::optional<MemEvent>& kept) {
  // Reduce-scatter in the reduce dtype into a shard-sized output that is then accumulated into the
  // sharded gradient (FSDP2 foreach_reduce in _fsdp_collectives.py).
  Op r = make_collective_op(OpKind::ReduceScatter, Stream::ReduceScatter, unit, micro_batch, Phase::ReduceScatter,
                            CollectiveKind::ReduceScatter, GroupKind::Shard);
  r.comm_bytes = c.wire.bytes(wire_elems, c.rb, GroupKind::Shard);
  r.comm_dtype = c.wire.type(c.s->reduce_dtype, GroupKind::Shard);
  const double rs_output = c.shard(train_elems) * c.rb;
  r.on_issue.push_back({MemoryCategory::CommBuffers, rs_output});
  if (kept) r.on_issue.push_back(*kept);
  // Without low-precision collectives the adapter stages a bf16/fp16 input in fp32 (executor/dist/comm.cpp
  // reduce_scatter_impl: all-reduce of an fp32 copy, then the slice).
  const double rs_staging = c.wire.stages_fp32(GroupKind::Shard) && c.rb < 4.0 ? full * 4.0 : 0.0;
  if (rs_staging > 0) r.on_issue.push_back({MemoryCategory::CommBuffers, rs_staging});
  r.on_complete.push_back({MemoryCategory::CommBuffers, -(rs_input + rs_output + rs_staging)});
  // Without a copy the per-parameter gradients are the reduce-scatter input, released when it ends.
  if (rs_input == 0) r.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * c.pb});
  return r;
}

Op dp_replica_all_reduce_op(const DataParallelContext& c, int unit, int micro_batch, double shard_elems) {
  // The accumulated gradient shard summed over the replicas in the reduce dtype (through a copy when that is not the
  // fp32 gradient's) once the reduce-scatter has landed (FSDP2 foreach_reduce's all-reduce over the replicate
  // dimension; fsdp-run's all_reduce_replicas).
  Op a = make_collective_op(OpKind::AllReduce, Stream::ReduceScatter, unit, micro_batch, Phase::ReplicaAllReduce,
                            CollectiveKind::AllReduce, GroupKind::Replica);
  a.comm_bytes = c.wire.bytes(shard_elems, c.rb, GroupKind::Replica);
  a.comm_dtype = c.wire.type(c.s->reduce_dtype, GroupKind::Replica);
  all_reduce_buffers(c, shard_elems, GroupKind::Replica, a);
  return a;
}

Op dp_replicated_reduction_op(const DataParallelContext& c, int unit, int micro_batch, double elems, bool flat_copy,
                              const std::optional<MemEvent>& kept) {
  const DataParallelPlan& plan = *c.plan;
  Op r;
  r.stream = Stream::ReduceScatter;
  r.unit = unit;
  r.micro_batch = micro_batch;
  if (plan.partitions_replicated_grads) {
    // ZeRO-2: reduce(-scatter) each bucket, keep only this rank's partition of the gradient
    // (DeepSpeed stage_1_and_2.py average_tensor / reduce_ipg_grads).
    r.kind = OpKind::ReduceScatter;
    r.phase = Phase::ReduceScatter;
    r.collective = CollectiveKind::ReduceScatter;
    r.comm_bytes = c.wire.bytes(elems, c.rb, GroupKind::World);
    r.comm_dtype = c.wire.type(c.s->reduce_dtype, GroupKind::World);
    if (flat_copy) {
      r.on_issue.push_back({MemoryCategory::CommBuffers, c.shard(elems) * c.rb});
      r.on_complete.push_back({MemoryCategory::CommBuffers, -(elems + c.shard(elems)) * c.rb});
    } else {
      r.on_issue.push_back({MemoryCategory::UnshardedGrads, -elems * c.gb});
    }
    if (kept) r.on_issue.push_back(*kept);
  } else {
    r.kind = OpKind::AllReduce;
    r.phase = plan.bucketed ? Phase::BucketAllReduce : Phase::AllReduce;
    r.collective = CollectiveKind::AllReduce;
    r.comm_bytes = c.wire.bytes(elems, c.rb, GroupKind::World);
    r.comm_dtype = c.wire.type(c.s->reduce_dtype, GroupKind::World);
    all_reduce_buffers(c, elems, GroupKind::World, r);
  }
  r.group = GroupKind::World;
  return r;
}

std::vector<Op> dp_step_param_gathers(const DataParallelContext& c, const std::vector<double>& unit_train, double total,
                                      int step_op) {
  const RuntimeProfile& rt = *c.rt;
  // Every rank updated its slice of the replica; the others' slices are gathered: in one collective, or
  // one per wrap unit (RuntimeProfile::zero_param_gather_per_unit).
  const int units = rt.zero_param_gather_per_unit ? static_cast<int>(unit_train.size()) : 1;
  const DType stored = c.plan->param_storage_dtype;
  std::vector<Op> out;
  for (int ui = 0; ui < units; ++ui) {
    Op a = make_collective_op(OpKind::ParamAllGather, Stream::AllGather, rt.zero_param_gather_per_unit ? ui : -1, 0,
                              Phase::ParamAllGather, CollectiveKind::AllGather, GroupKind::World);
    const double gathered = rt.zero_param_gather_per_unit ? unit_train[static_cast<size_t>(ui)] : total;
    a.comm_bytes = c.wire.bytes(gathered, c.sb, GroupKind::World);
    a.comm_dtype = c.wire.type(stored, GroupKind::World);
    // The gather's staging copies (RuntimeProfile::zero_param_gather_replica_copies / _shard_copies), in the
    // stored parameters' dtype, alive until it ends.
    const double staging =
        (rt.zero_param_gather_replica_copies * gathered + rt.zero_param_gather_shard_copies * c.shard(gathered)) * c.sb;
    // Its largest tensor: one replica copy in one flat tensor (c10d's flat output of the list all_gather,
    // ProcessGroupNCCL.cpp allgather newLikeFlat), else the rank's own flat slice.
    const double largest = (rt.zero_param_gather_replica_copies >= 1 ? gathered : c.shard(gathered)) * c.sb;
    if (staging > 0 && c.layout->world > 1) {
      a.on_issue.push_back({MemoryCategory::CommBuffers, staging});
      a.on_complete.push_back({MemoryCategory::CommBuffers, -staging});
      a.largest_block_bytes = largest;
    }
    a.deps.push_back(step_op);
    out.push_back(a);
  }
  return out;
}

}  // namespace fsdp
