// The step after the last backward (program/step_emitter.hpp): gradient synchronisation, the gradient norm, the
// optimizer (on the device or the host) and ZeRO's parameter gather; LoRA adapters kept outside the wrap units.

#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

void Emitter::emit_adapter_state() {
  if (!adapters_outside_units()) return;
  prog.persistent.push_back({MemoryCategory::ShardedParams, adapters * mb});
}

void Emitter::keep_adapter_grads(Op& loss_backward) {
  if (adapters_outside_units()) keep_grads(loss_backward, MemoryCategory::UnshardedGrads, adapters * mb);
}

void Emitter::push_adapter_all_reduce(int mbi) {
  if (!adapters_outside_units() || prog.layout.world <= 1) return;
  Op a = collective_op(OpKind::AllReduce, Stream::ReduceScatter, Phase::AdapterAllReduce, CollectiveKind::AllReduce,
                       GroupKind::World, wire_bytes(adapters, mb, GroupKind::World),
                       wire_type(s.master_dtype, GroupKind::World), -1, mbi);
  a.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
  push(a);
}

void Emitter::emit_optimizer() {
  const bool outside = adapters_outside_units();  // replicated adapters: every rank owns and holds them all
  const double P = outside ? adapters : total_train();
  const double owned = place.optim_sharded && !outside ? shard(P) : P;  // what the optimizer updates
  const double held = place.grads_sharded && !outside ? shard(P) : P;   // the gradient elements the rank keeps
  const double grad_bytes = owned * rt.grad_norm_bytes_per_grad + held * rt.grad_pass_bytes_per_grad;
  // fp16 loss scaling: whether any owned gradient overflowed, one fp32 flag summed over the shard group
  // (torch/distributed/fsdp/sharded_grad_scaler.py _unscale_grads_; fsdp-run's grads_nonfinite).
  if (s.param_dtype == DType::Fp16 && place.optim_sharded && !outside && prog.layout.shard_size > 1) {
    constexpr double kFlagBytes = 4.0;
    Op f = collective_op(OpKind::ScalarAllReduce, Stream::ReduceScatter, Phase::OverflowCheckAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Shard, kFlagBytes, WireType::Fp32, -1, 0);
    f.after_all_comm = true;
    push(f);
  }
  double tp_replicated_params = 0;
  for (double p : tp_unit_replicated_params) tp_replicated_params += p;
  if (s.mesh.tp > 1 && tp_replicated_params > 0 && !rt.tp_norm_grad_sum_per_unit) {
    // The replicated norms' gradients differ per tp rank under sequence parallelism (each saw its s/tp tokens), the
    // q/k norms' without it too (each saw its heads): summed over the tp group before the step (Megatron-LM
    // finalize_model_grads, allreduce_layernorm_grads).
    Op a = collective_op(OpKind::TpCollective, Stream::TensorParallel, Phase::TpNormGradAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Tensor,
                         wire_bytes(tp_replicated_params, rb, GroupKind::Tensor),
                         wire_type(s.reduce_dtype, GroupKind::Tensor), -1, static_cast<int>(s.grad_accum) - 1);
    a.after_all_comm = true;
    push(a);
  }
  if (grad_bytes > 0) {
    Op n;
    n.kind = OpKind::GradNorm;
    n.phase = Phase::GradientNorm;
    n.elementwise_bytes = grad_bytes;
    n.transient_bytes = step_elems_at_once(owned) * rt.grad_norm_temporary_bytes_per_grad;
    n.after_all_comm = true;  // every gradient reduction has landed
    push(n);
    // One fp64 scalar per group the owned gradients are spread over (executor clip_grad_norm, sum_over_mesh; FSDP2's
    // clip_grad_norm_ reduces the DTensor norm likewise): the optimizer's shards, then the tp slices and the pipeline
    // stages (Megatron-LM get_grad_norm_fp32 all-reduces over the model-parallel group, megatron/core/optimizer/
    // clip_grads.py; torchtitan's clip_grad_norm_ over the pp mesh, torchtitan/distributed/utils.py).
    auto norm_all_reduce = [&](GroupKind group) {
      Op a = collective_op(OpKind::ScalarAllReduce, Stream::ReduceScatter, Phase::GradientNormAllReduce,
                           CollectiveKind::AllReduce, group, kScalarBytes, WireType::Fp64, -1, 0);
      a.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
      push(a);
    };
    if (rt.grad_norm_bytes_per_grad > 0 && !outside) {
      if (place.optim_sharded && prog.layout.shard_size > 1) norm_all_reduce(GroupKind::Shard);
      if (s.mesh.tp > 1) norm_all_reduce(GroupKind::Tensor);
      if (s.mesh.pp > 1) norm_all_reduce(GroupKind::Pipeline);
    }
  }
  emit_optimizer_step();
  if (rt.loss_all_reduce && prog.layout.ranks() > 1) {
    Op l = collective_op(OpKind::ScalarAllReduce, Stream::ReduceScatter, Phase::LossAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Mesh, kScalarBytes, WireType::Fp64, -1, 0);
    l.after_all_comm = true;
    l.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
    push(l);
  }
}

void Emitter::emit_optimizer_step() {
  const bool outside = adapters_outside_units();
  const double P = outside ? adapters : total_train();
  const double opt_elems = place.optim_sharded && !outside ? shard(P) : P;
  const double states = s.optimizer == Optimizer::AdamW ? 2.0 : 1.0;  // exp_avg + exp_avg_sq, or momentum
  const bool host_opt = s.offload != Offload::None;
  const double grad_elems = place.grads_sharded && !outside ? shard(P) : P;
  if (!host_opt) {
    prog.persistent.push_back({MemoryCategory::OptimizerStates, opt_elems * states * mb});
    if (zero_layout || accum32) prog.persistent.push_back({MemoryCategory::MasterParams, opt_elems * mb});
    Op o;
    o.kind = OpKind::OptimizerStep;
    o.phase = Phase::OptimizerStep;
    // AdamW's temporaries for sqrt(exp_avg_sq) / bias correction (RuntimeProfile::adamw_temporaries_per_param;
    // torch/optim/adamw.py _multi_tensor_adamw: _foreach_sqrt), over what it updates at once.
    const RuntimeProfile::AdamwStep adamw = rt.adamw_step(s.mesh.tp);
    o.transient_bytes =
        s.optimizer == Optimizer::AdamW ? step_elems_at_once(opt_elems) * adamw.temporaries_per_param * mb : 0.0;
    // DeepSpeed's ZeRO-1/2 instead convert the low-precision gradient partition to fp32 for the step
    // (stage_1_and_2.py: single_partition_of_fp32_groups[i].grad) and use a fused Adam without temporaries;
    // ZeRO-3 flattens and casts it sub-group by sub-group (DataParallelPlan::step_in_sub_groups).
    if (zero_layout) {
      const double sub = std::min(opt_elems, rt.zero3_step_sub_group_elems);
      o.transient_bytes = dp_plan.step_in_sub_groups ? sub * (gb + (mb != gb ? mb : 0.0)) : opt_elems * mb;
    }
    // The accumulator's fp32 gradients are views of its buffer: nothing is converted for the step.
    if (accum32) o.transient_bytes = 0.0;
    // Memory traffic as the runtime's optimizer moves it (training_loop.adamw_bytes_per_param: 28 B when
    // fused, 4 reads + 3 writes of fp32), given for fp32 masters and states: scaled to the master dtype.
    o.elementwise_bytes =
        opt_elems * (mb / 4.0) * (s.optimizer == Optimizer::AdamW ? adamw.bytes_per_param : rt.sgd_bytes_per_param);
    // The step waits for the gradient norm's all-reduce (clipping scales the gradients it reads).
    if (!prog.ops.empty() && prog.ops.back().kind == OpKind::ScalarAllReduce)
      o.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
    // Gradients are dropped after the step (zero_grad(set_to_none=True)).
    free_grads(o);
    o.after_all_comm = true;
    push(o);
    if (dp_plan.gathers_params_after_step && !outside) {
      // ZeRO-1/2: the updated slices of the replica gathered (data_parallel.hpp).
      const int opt_op = static_cast<int>(prog.ops.size()) - 1;
      for (const Op& a : dp_step_param_gathers(dp, train_p, P, opt_op)) push(a);
    }
    return;
  }
  // Offloaded optimizer (ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840): fp32 masters, states and a
  // gradient copy live in (pinned) host memory; gradients go down, updated parameters come back up.
  prog.host_bytes_per_rank += opt_elems * (states + 1.0 + 1.0) * 4.0;  // states + master + fp32 grad
  prog.host_persistent.push_back({MemoryCategory::OptimizerStates, opt_elems * states * 4.0});
  prog.host_persistent.push_back({MemoryCategory::MasterParams, opt_elems * 4.0});
  prog.pinned_bytes_per_rank += grad_elems * rb;
  if (!grads_copied_per_unit) {
    Op d;
    d.kind = OpKind::CopyToHost;
    d.stream = Stream::DeviceToHost;
    d.phase = Phase::GradientsToHost;
    d.copy_bytes = grad_elems * rb;
    d.after_all_comm = true;
    d.deps.push_back(static_cast<int>(prog.ops.size()) - 1);  // the last backward
    push(d);
  }
  Op h;
  h.kind = OpKind::HostOptimizerStep;
  h.stream = Stream::Host;
  h.phase = Phase::HostOptimizerStep;
  h.host_optimizer_params = opt_elems;
  h.after_all_comm = true;  // every gradient copy has landed
  free_grads(h);
  int hop = push(h);
  Op u;
  u.kind = OpKind::CopyToDevice;
  u.stream = Stream::HostToDevice;
  u.phase = Phase::ParametersToDevice;
  u.copy_bytes = s.offload == Offload::Params ? 0.0 : opt_elems * pb;
  u.deps.push_back(hop);
  push(u);
}

}  // namespace fsdp::step_emission
