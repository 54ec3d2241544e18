// The replicated strategies' micro-batches (DDP, ZeRO-1/2; program/step_emitter.hpp): compute, and the gradient
// buckets' reductions as the backward fills them.

#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

void Emitter::emit_replicated() {
  emit_adapter_state();
  const int n = static_cast<int>(prog.units.size());
  const int K = static_cast<int>(s.grad_accum);
  const int Kemit = static_cast<int>(prog.layout.micro_batches_emitted);
  const double P = total_train();
  // Full replicas in the master dtype; autocast runs compute in the param dtype.
  double frozen_bytes = 0;
  for (int ui = 0; ui < n; ++ui)
    frozen_bytes += frozen_p[static_cast<size_t>(ui)] * frozen_store_bpe(static_cast<size_t>(ui));
  prog.persistent.push_back({MemoryCategory::ShardedParams, P * sb + frozen_bytes});
  // DDP's reducer buckets, allocated once (DataParallelPlan::reducer_buckets).
  if (dp_plan.reducer_buckets) {
    // With gradient_as_bucket_view the buckets are the gradients; otherwise .grad is a separate copy.
    MemoryCategory cat = rt.ddp_gradient_as_bucket_view ? MemoryCategory::UnshardedGrads : MemoryCategory::CommBuffers;
    prog.persistent.push_back({cat, P * sb});  // DDP's buckets take the parameters' dtype
  }
  // FP32GradientAccumulator.build_grad_buffers: one fp32 buffer of every trained parameter's gradient, for the run.
  if (accum32) prog.persistent.push_back({MemoryCategory::ShardedGrads, P * 4.0});
  // nanotron's asynchronous tensor-parallel linears gather into MemoryBuffer's global buffers, kept for the run at
  // their largest request (src/nanotron/parallel/utils.py MemoryBuffer.get @ 67c5ebb6): "allgather", a column-parallel
  // linear's gathered input (tp_recompute_allgather), and "allgather2", a row-parallel linear's gathered output
  // gradient (parallel/tensor_parallel/functional.py): s x b x h each in the compute dtype.
  if (prog.tp_async_linears) {
    constexpr double kMemoryBuffers = 2;  // "allgather", "allgather2"
    prog.persistent.push_back(
        {MemoryCategory::CommBuffers, kMemoryBuffers * tokens * static_cast<double>(g.spec().hidden_size) * pb});
  }
  // ZeRO-1 reduced once after the backward (RuntimeProfile::zero1_grads_reduced_after_backward).
  const bool reduce_after_backward = dp_plan.reduce_after_backward;
  // ZeRO-2: partitioned gradients, each bucket's full gradient held until it is reduce-scattered.
  const bool partitioned = dp_plan.partitions_replicated_grads;
  const bool casts = mixed && !zero_layout && !accum32 && rt.autocast_caches_weight_casts;
  // DDP and ZeRO-1 reduce gradients in buckets: units' gradients join the open bucket in backward order, and
  // it is all-reduced once it holds bucket_cap_mb (torch/nn/parallel/distributed.py, bucket_cap_mb = 25;
  // executor/shard/sharded_model.cpp post_backward), the last one when backward ends. (PyTorch's first bucket
  // is capped at 1 MiB, _DEFAULT_FIRST_BUCKET_BYTES; not modelled: it only splits the first, earliest bucket.)
  const bool bucketed = dp_plan.bucketed;
  const double bucket_cap = static_cast<double>(s.ddp_bucket_mb) * kMiB;
  for (int rep = 0; rep < Kemit; ++rep) {
    const int mbi = rep == Kemit - 1 ? K - 1 : rep;
    double bucket_bytes = 0;
    // DDP no_sync on all but the last; ZeRO-2 reduces every micro-batch.
    const bool sync = (mbi == K - 1 && !reduce_after_backward) || dp_plan.reduces_every_micro_batch;
    int last_backward = -1;
    pp_before_forward(mbi);
    for (int ui = 0; ui < n; ++ui) {
      Op& f = prog.ops.emplace_back();  // in place (fill_forward_op)
      fill_forward_op(f, ui, mbi);
      // autocast's weight casts are saved by the linears for backward (unless the layer is checkpointed,
      // in which case they are recomputed): the unit's checkpointed share of them lives while the op runs, in forward
      // and again in backward (fsdp-run frees a checkpointed replica's cast after its forward and casts it again for
      // its backward: executor/shard/sharded_model.cpp).
      const double cast = casts ? replica_cast_elems(ui) * pb : 0.0;
      // autocast caches the casts of leaf tensors that require a gradient only (aten/src/ATen/autocast_mode.cpp
      // cached_cast: arg.requires_grad()): a frozen unit's are freed after its forward.
      const double recast = unit_trains(ui) ? cast * cast_checkpointed_share(ui) : cast;
      if (cast > 0) f.on_issue.push_back({MemoryCategory::UnshardedParams, cast});
      if (recast > 0) f.on_complete.push_back({MemoryCategory::UnshardedParams, -recast});
      push_tp(ui, mbi, false, static_cast<int>(prog.ops.size()) - 1);
    }
    pp_turn(mbi);
    // A unit of frozen vision blocks runs no backward (Strategy::train_vision).
    std::vector<int> order;
    for (int ui = n - 1; ui >= 1; --ui)
      if (unit_trains(ui)) order.push_back(ui);
    order.push_back(0);
    for (int ui : order) {
      double p = train(ui);
      Op& b = prog.ops.emplace_back();  // in place, as the forward ops (fill_forward_op)
      fill_backward_op(b, ui, mbi);
      const double cast = casts ? replica_cast_elems(ui) * pb : 0.0;
      const double recast = cast * cast_checkpointed_share(ui);
      if (recast > 0) b.on_issue.push_back({MemoryCategory::UnshardedParams, recast});
      // Full gradients accumulate into .grad (unsharded), allocated on the first micro-batch; ZeRO-2 keeps
      // only a partition and holds the full gradient of a bucket until it is reduced.
      const double head = ui == 0 ? head_grad_bytes() : 0.0;  // allocated in the loss backward
      if (accum32) {
        // Every micro-batch's .grad is allocated by its backward and freed once added to the fp32 buffer.
        b.on_complete.push_back({MemoryCategory::UnshardedGrads, p * gb - head});
      } else if (mbi == 0) {
        if (partitioned) {
          b.on_complete.push_back({MemoryCategory::UnshardedGrads, p * gb - head});
        } else if (!(dp_plan.reducer_buckets && rt.ddp_gradient_as_bucket_view)) {
          keep_grads(b, MemoryCategory::UnshardedGrads, p * gb);
        }
      } else if (partitioned) {
        b.on_complete.push_back({MemoryCategory::UnshardedGrads, p * gb - head});
      }
      // The cast held since the forward and the one cast again for this backward, freed together.
      if (cast > 0) b.on_complete.push_back({MemoryCategory::UnshardedParams, -cast});
      int bop = push_tp(ui, mbi, true, static_cast<int>(prog.ops.size()) - 1);
      last_backward = bop;
      if (adapters_outside_units()) continue;  // no per-unit gradients: the adapters are reduced once below
      // fsdp-run's ZeRO-2 reduce-scatters the flat copy itself: the copy and the shard-sized output stay
      // alive until the reduction is waited for, at the next unit's post-backward
      // (executor/shard/sharded_model.cpp post_backward), like FSDP's sharded gradients.
      const bool zero2_flat = dp_plan.flat_grad_copy && sync;
      if (rt.replicated_grads_via_flat_copy) {
        // The runtime gathers the unit's per-parameter gradients (compute dtype) into a flat buffer before
        // accumulating it into the kept gradient: both copies live for a moment after the backward.
        Op post = post_backward_op(ui, mbi);
        if (zero2_flat) {
          post.on_issue.push_back({MemoryCategory::CommBuffers, p * rb});
          post.on_complete.push_back({MemoryCategory::UnshardedGrads, -p * gb});
          post.elementwise_bytes = 2.0 * p * pb;
          // The partition's reduce-scatter output allocated while the gradients are held
          // (RuntimeProfile::unit_grads_held_through_reduce_issue).
          if (rt.unit_grads_held_through_reduce_issue) post.transient_bytes = shard(p) * rb;
        } else {
          post.transient_bytes = 2.0 * p * pb - head;
          post.elementwise_bytes = 3.0 * p * pb;
          post.on_complete.push_back({MemoryCategory::UnshardedGrads, -head});
        }
        post.deps.push_back(bop);
        bop = push(post);
      }
      bop = push_tp_norm_grad_sum(ui, mbi, bop);
      if (!sync) continue;
      // bucket_cap_mb counts the gradients' own bytes (DDP's reducer buckets the .grad tensors; a comm hook
      // such as bf16_compress_hook casts a full bucket; fsdp-run's flush_bucket likewise).
      if (bucketed) {
        bucket_bytes += p * gb;
        if (bucket_bytes < bucket_cap && ui != order.back()) continue;
      }
      // The unit's (or the closed bucket's) reduction (data_parallel.hpp): ZeRO-2's reduce-scatter, whose first
      // micro-batch allocates the partition, or the all-reduce of a bucket or a unit.
      const double elems = !partitioned && bucketed ? bucket_bytes / gb : p;
      const std::optional<MemEvent> kept =
          partitioned && mbi == 0 ? kept_grads(MemoryCategory::ShardedGrads, shard(p) * gb) : std::nullopt;
      Op r = dp_replicated_reduction_op(dp, ui, mbi, elems, zero2_flat, kept);
      r.deps.push_back(bop);
      if (!partitioned) bucket_bytes = 0;
      push(r);
    }
    if (accum32 && last_backward >= 0) {
      // FP32GradientAccumulator.backward: after loss.backward(), fp32_grad.add_(half_param.grad) for every
      // parameter (read 2 + 4, write 4 bytes), then half_param.grad = None.
      Op a;
      a.kind = OpKind::Reshard;
      a.unit = 0;
      a.micro_batch = mbi;
      a.phase = Phase::PostBackward;
      a.elementwise_bytes = P * (gb + 8.0);
      // fp32_grad.add_(bf16 grad) computes in fp32 (PyTorch's type promotion: the result dtype of fp32 and bf16
      // operands is fp32, torch/_prims_common result_type), 8 of its 10 bytes a parameter fp32: priced at the
      // master dtype's elementwise rate, as the optimizer's passes.
      a.elementwise_in_master_dtype = true;
      a.on_complete.push_back({MemoryCategory::UnshardedGrads, -P * gb});
      a.deps.push_back(last_backward);
      last_backward = push(a);
    }
    if (reduce_after_backward && mbi == K - 1 && prog.layout.world > 1 && last_backward >= 0) {
      // nanotron trainer.py training_step (@ 67c5ebb6a925cb47026b22013af8bd1bb6c46d93): without DDP (ZeRO-1 with
      // accumulate_grad_in_fp32), sync_gradients_across_dp all-reduces the whole contiguous fp32 gradient buffer
      // after train_batch_iter returns (FP32GradientAccumulator.sync_gradients_across_dp, reduce_scatter=False).
      Op r = collective_op(OpKind::AllReduce, Stream::ReduceScatter, Phase::AllReduce, CollectiveKind::AllReduce,
                           GroupKind::World, wire_bytes(P, accum32 ? 4.0 : rb, GroupKind::World),
                           accum32 ? WireType::Fp32 : wire_type(s.reduce_dtype, GroupKind::World), -1, mbi);
      r.deps.push_back(last_backward);
      push(r);
    }
    pp_after_backward(mbi, last_backward);
    if (mbi == K - 1) push_adapter_all_reduce(mbi);
  }
  emit_optimizer();
}

// The step after the last backward: the training loop's gradient passes and norm (with the all-reduce of
// the partial norms when the optimizer is sharded), the optimizer, and the loss all-reduce
// (RuntimeProfile, section training_loop).

}  // namespace fsdp::step_emission
