// The sharded strategies' micro-batches (FSDP, HSDP, ZeRO-3; program/step_emitter.hpp): each unit's gather, compute,
// reshard and gradient reduction, forward and backward, with prefetch and offload.

#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

void Emitter::emit_sharded() {
  emit_adapter_state();
  const int n = static_cast<int>(prog.units.size());
  const bool offload_params = s.offload == Offload::Params;
  const int K = static_cast<int>(s.grad_accum);
  const int Kemit = static_cast<int>(prog.layout.micro_batches_emitted);
  const bool hsdp = place.replica_all_reduce;
  // grad_sync last-micro-batch (FSDP1 no_sync, FSDP2 set_requires_gradient_sync(False)): the post-backward of a
  // micro-batch before the last keeps the unit's unsharded gradient (the first) or adds this micro-batch's into it
  // and frees it (the others); the last adds its own and reduce-scatters the sum. The sharded gradient appears with
  // that one reduce-scatter.
  const bool accumulate_unsharded = !dp_plan.reduces_every_micro_batch && K > 1;
  const int first_reduced_mb = accumulate_unsharded ? K - 1 : 0;
  // The kept gradient's bytes per element: the compute dtype's, or the reduce dtype's where the runtime upcasts it
  // (RuntimeProfile::unsynced_grads_in_reduce_dtype; FSDP2 only when the reduce dtype differs from the compute dtype).
  const bool kept_in_reduce_dtype =
      accumulate_unsharded && rt.unsynced_grads_in_reduce_dtype && s.reduce_dtype != s.param_dtype;
  const double kb = kept_in_reduce_dtype ? rb : pb;
  // Persistent: parameter shards in the master dtype (FSDP2 keeps the sharded fp32 parameter and casts
  // at all-gather: torch/distributed/fsdp/_fully_shard/_fsdp_param.py), unless offloaded.
  if (!offload_params) {
    // ZeRO-Offload keeps the compute-dtype parameter shard on the GPU; masters live on the host.
    const double bpe = s.offload == Offload::Optimizer ? pb : sb;
    double bytes = 0;
    for (int ui = 0; ui < n; ++ui) bytes += shard_bytes(ui, bpe);
    prog.persistent.push_back({MemoryCategory::ShardedParams, bytes});
  }
  std::vector<int> last_rs(static_cast<size_t>(n), -1);
  // A runtime whose pipeline schedule keeps the stage's units unsharded from their first gather to the step's last
  // backward (RuntimeProfile::pipeline_keeps_units_gathered): no backward reshards before the last, so a unit kept
  // after forward is gathered once a step, and one resharded after forward is gathered by a forward that follows a
  // forward and by a backward that follows a forward, and found unsharded otherwise (FSDP2's unshard is a no-op on
  // an unsharded group). `held`: the walk holds the unit's parameters from the previous micro-batch's backward.
  const bool keeps_gathered =
      rt.pipeline_keeps_units_gathered && pipeline_orders_passes(prog.layout.pp_schedule, prog.layout.pp);
  std::vector<bool> held(static_cast<size_t>(n), false);
  for (int rep = 0; rep < Kemit; ++rep) {
    const int mbi = rep == Kemit - 1 ? K - 1 : rep;
    std::vector<int> gather_op(static_cast<size_t>(n), -1);
    std::vector<bool> gathered(static_cast<size_t>(n), false);
    std::vector<bool> regathered(static_cast<size_t>(n), false);  // gathered again for backward
    // A gather's op, pushed: its index. The prefetch window: a gather is issued from the pre-forward (pre-backward)
    // hook, so it cannot start before the compute issued just before it has run; this bounds gathers in flight as
    // FSDP's rate limiter does (FSDP1 limit_all_gathers; FSDP2 issues the next unit's all-gather in the current unit's
    // pre-forward/pre-backward hook).
    auto issue_gather = [&](const UnitGather& ug) {
      Op op = dp_param_gather_op(dp, ug);
      for (size_t k = prog.ops.size(); k-- > 0;)
        if (prog.ops[k].stream == Stream::Compute && prog.ops[k].kind != OpKind::Reshard) {
          op.deps.push_back(static_cast<int>(k));
          break;
        }
      return push(op);
    };
    // A memory-only op on the compute stream: `bytes` of unit `ui`'s gathered parameters allocated (or, negative,
    // released) without a collective.
    auto params_event = [&](int ui, Phase phase, double bytes) {
      Op& op = prog.ops.emplace_back();  // in place: nothing pushes another op before it is complete
      op.kind = OpKind::Reshard;
      op.stream = Stream::Compute;
      op.unit = ui;
      op.micro_batch = mbi;
      op.phase = phase;
      op.on_issue.push_back({MemoryCategory::UnshardedParams, bytes});
    };
    auto gather = [&](int ui, bool backward) {
      // A unit the schedule left resident since an earlier pass (kept_regathered_in_backward): its parameters are
      // in the walk already, from this micro-batch's forward; the gather moves them again.
      const bool resident = gathered[static_cast<size_t>(ui)];
      if (backward) regathered[static_cast<size_t>(ui)] = true;
      UnitGather ug;
      ug.unit = ui;
      ug.micro_batch = mbi;
      ug.backward = backward;
      ug.cast_elems = cast_elems(ui);
      ug.gathered_bytes = gathered_bytes(ui);
      ug.wire_bytes = gathered_wire_bytes(ui);
      ug.host_shard_bytes = offload_params ? shard_bytes(ui, mb) : 0.0;
      ug.params_resident = resident;
      gathered[static_cast<size_t>(ui)] = true;
      gather_op[static_cast<size_t>(ui)] = issue_gather(ug);
    };
    // A memory-only op on the compute stream: the unit's gathered parameters released (its reshard) or, for a unit
    // the schedule left gathered since an earlier pass, counted as resident without a gather (resident, below).
    auto set_resident = [&](int ui, bool on, Phase phase) {
      params_event(ui, phase, on ? gathered_bytes(ui) : -gathered_bytes(ui));
      gathered[static_cast<size_t>(ui)] = on;
      if (on) gather_op[static_cast<size_t>(ui)] = static_cast<int>(prog.ops.size()) - 1;
    };
    auto reshard = [&](int ui) { set_resident(ui, false, Phase::Free); };
    // The token embedding as a unit of its own (embed_released, RuntimeProfile::embedding_own_unit): released after
    // the root's forward (the embedding lookup), gathered again before the root's backward, where the embedding's
    // backward runs; the root's post-backward then frees it with the rest of the root.
    const double embed_bytes = padded(embed_released) * pb;
    int embed_gather = -1;
    auto release_embedding = [&]() { params_event(0, Phase::Free, -embed_bytes); };
    auto gather_embedding = [&]() {
      if (embed_gather >= 0) return;
      UnitGather ug;
      ug.unit = 0;
      ug.micro_batch = mbi;
      ug.backward = true;
      ug.cast_elems = embed_released;
      ug.gathered_bytes = embed_bytes;
      ug.wire_bytes = wire_bytes(padded(embed_released), pb, GroupKind::Shard);
      ug.host_shard_bytes = offload_params ? shard(embed_released) * mb : 0.0;
      embed_gather = issue_gather(ug);
    };
    auto keep_after_forward = [&](int ui) {
      const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
      // The last layer unit is the first the backward gathers: a runtime that keeps it (torchtitan) saves that
      // gather and holds its parameters through the loss (runtime profile last_unit_reshard_after_forward).
      if (!u.is_root && ui == n - 1 && !rt.last_unit_reshard_after_forward) return true;
      return !unit_placement(s, u.is_root, rt.root_reshard_after_forward).reshard_after_forward;
    };
    // Released only beside decoder-layer units (a model wrapped whole has none) from a root kept after forward.
    const bool embed_split = embed_released > 0 && n > 1 && keep_after_forward(0);
    // A unit kept after forward is gathered where the stage's pipeline schedule leaves it resharded (the forward
    // of the first micro-batch, or one after a backward); else it is still resident from the previous forward, and
    // a backward after a backward gathers it again (kept_gathered_in_forward, kept_regathered_in_backward).
    auto resident = [&](int ui, Phase phase) { set_resident(ui, true, phase); };
    auto gather_forward = [&](int ui) {
      const size_t i = static_cast<size_t>(ui);
      if (gathered[i]) return;
      if (held[i]) {  // the walk holds it since the previous micro-batch's backward (keeps_gathered)
        held[i] = false;
        gathered[i] = true;
        gather_op[i] = -1;
        // Resharded by the forward before it in the schedule: gathered again (nothing added to the walk).
        if (!keep_after_forward(ui) && !kept_gathered_in_forward(mbi)) gather(ui, false);
        return;
      }
      if (!keeps_gathered && !kept_gathered_in_forward(mbi) && keep_after_forward(ui)) {
        resident(ui, Phase::FwdAllGather);
      } else {
        gather(ui, false);
      }
    };
    auto gather_backward = [&](int ui) {
      const size_t i = static_cast<size_t>(ui);
      if (keeps_gathered) {
        if (gathered[i]) return;
        // Resharded after this micro-batch's forward; a backward before this one (the schedule's) left it unsharded.
        if (kept_regathered_in_backward(mbi)) {
          resident(ui, Phase::BwdAllGather);
        } else {
          gather(ui, true);
        }
        return;
      }
      if (!gathered[i] || (kept_regathered_in_backward(mbi) && !regathered[i] && keep_after_forward(ui)))
        gather(ui, true);
    };
    // A unit's post-backward `post` (its reshard, and its accumulation where it had one) completed by the copy-in and
    // the reduce-scatter of its gradient, issued now; `norm_sum`: with the tensor-parallel norm gradients' sum.
    int last_reduction = -1;
    auto reduce_unit = [&](Op post, int ui, bool norm_sum) {
      const double full = padded(unsharded_train(static_cast<size_t>(ui)));
      const double full_bytes = gathered_bytes(ui);
      const double rs_input = (rt.grads_in_reduce_dtype_before_reduce || rb != pb) ? full * rb : 0.0;
      post.on_issue.push_back({MemoryCategory::CommBuffers, rs_input});
      post.device_copy_bytes += rs_input > 0 ? full * kb + rs_input : 0.0;
      if (rs_input > 0) post.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * kb});
      // The unit's reduce-scatter (data_parallel.hpp); the first reduced micro-batch's allocates the sharded gradient,
      // or, where an offloading runtime copies every reduced shard to the host (RuntimeProfile::
      // offloaded_grads_kept_on_device false), each reduction allocates the shard the copy below frees.
      const double shard_grad = shard(train(ui)) * gb;
      const bool grads_to_host = s.offload != Offload::None && !rt.offloaded_grads_kept_on_device;
      const std::optional<MemEvent> kept =
          grads_to_host             ? std::optional<MemEvent>(MemEvent{MemoryCategory::ShardedGrads, shard_grad})
          : mbi == first_reduced_mb ? kept_grads(MemoryCategory::ShardedGrads, shard_grad)
                                    : std::nullopt;
      // Expert parallelism: the routed experts' gradients reduce-scatter over their efsdp group.
      const double wire_elems = s.mesh.ep > 1 ? padded(shard_equivalent_train(static_cast<size_t>(ui))) : full;
      Op r = dp_reduce_scatter_op(dp, ui, mbi, full, wire_elems, train(ui), rs_input, kept);
      // Issued while the per-parameter gradients are still held (RuntimeProfile::unit_grads_held_through_reduce_issue):
      // its output and staging beside them for a moment, after the unit's parameters were resharded (fsdp-run's
      // hook reshards between the copy-in and the issue), so only what exceeds them raises the post-backward's peak.
      if (rt.unit_grads_held_through_reduce_issue) {
        double issued = 0;
        for (const MemEvent& e : r.on_issue)
          if (e.category == MemoryCategory::CommBuffers) issued += e.bytes;
        const double resharded = held[static_cast<size_t>(ui)] ? 0.0 : full_bytes;
        post.transient_bytes = std::max(post.transient_bytes, issued - resharded);
      }
      int pop = push(post);
      if (norm_sum) push_tp_norm_grad_sum(ui, mbi, pop);
      // The previous unit's replica all-reduce is issued here, when this post-backward waits for that unit's
      // reduce-scatter (fsdp-run's ShardedModel wait_pending; one reduction step in flight).
      if (deferred_replica.kind == OpKind::AllReduce) {
        deferred_replica.deps.push_back(pop);
        last_rs[static_cast<size_t>(deferred_replica.unit)] = last_reduction = push(deferred_replica);
        deferred_replica = Op{};
      }
      r.deps.push_back(pop);
      int rop = push(r);
      last_reduction = rop;
      last_rs[static_cast<size_t>(ui)] = rop;
      if (hsdp && mbi == K - 1 && prog.layout.replicas > 1) {
        // HSDP: the accumulated gradient shard summed over the replicas (data_parallel.hpp) once the reduce-scatter
        // has landed: issued at the next unit's post-backward, or at the end of the backward for the last unit.
        Op a = dp_replica_all_reduce_op(dp, ui, mbi, shard(train(ui)));
        a.deps.push_back(rop);
        deferred_replica = a;
      }
      if (s.offload != Offload::None && (mbi == K - 1 || grads_to_host)) {
        // ZeRO-Offload copies each gradient partition to the host as soon as it is reduced, overlapping
        // the rest of the backward (Ren et al. 2021, arXiv 2101.06840 sec. 4.2): once, the accumulated shard, or
        // after every reduction, the device shard freed once copied (FSDP2, FSDP1, DeepSpeed ZeRO-3: above).
        Op d;
        d.kind = OpKind::CopyToHost;
        d.stream = Stream::DeviceToHost;
        d.unit = ui;
        d.micro_batch = mbi;
        d.phase = Phase::GradientsToHost;
        d.copy_bytes = grads_to_host ? shard_grad : shard(train(ui)) * rb;
        if (grads_to_host) d.on_complete.push_back({MemoryCategory::ShardedGrads, -shard_grad});
        d.deps.push_back(rop);
        push(d);
        grads_copied_per_unit = true;
      }
    };
    const bool defer_reduction = dp_plan.reduces_after_stage_backward && mbi == K - 1;
    std::vector<int> reduced_after_backward;
    // ---- forward ----
    pp_before_forward(mbi);
    int last_bwd = -1;
    for (int ui = 0; ui < n; ++ui) {
      gather_forward(ui);
      for (int ahead = 1; ahead <= s.forward_prefetch && ui + ahead < n; ++ahead) gather_forward(ui + ahead);
      // Built in place (forward_op's op, field for field, without its copy): nothing pushes an op before it is
      // complete, so the reference stays valid.
      Op& f = prog.ops.emplace_back();
      fill_forward_op(f, ui, mbi);
      if (gather_op[static_cast<size_t>(ui)] >= 0) f.deps.push_back(gather_op[static_cast<size_t>(ui)]);
      // FSDP2's copy-out of the gathered flat buffer into per-parameter tensors runs on the compute
      // stream when the unit's gather is waited for (_fsdp_param_group.py wait_for_unshard).
      if (rt.allgather_copy_out) f.device_copy_bytes += 2.0 * gathered_bytes(ui);
      push_ep(ui, mbi, false, push_tp(ui, mbi, false, static_cast<int>(prog.ops.size()) - 1));
      if (!keep_after_forward(ui)) reshard(ui);
      if (ui == 0 && embed_split) release_embedding();
    }
    pp_turn(mbi);
    // ---- backward (reverse unit order; the root's embedding backward comes last) ----
    // A unit of frozen vision blocks runs no backward (Strategy::train_vision): no gather, no hook, no reduction.
    std::vector<int> order;
    for (int ui = n - 1; ui >= 1; --ui)
      if (unit_trains(ui)) order.push_back(ui);
    order.push_back(0);
    // Adapters outside the units: a frozen unit has no post-backward hook; its gathered base is freed at the
    // next unit's pre-backward (fsdp-run's ShardedModel::pre_backward), the last one's when the backward ends.
    int free_late = -1;
    for (size_t oi = 0; oi < order.size(); ++oi) {
      int ui = order[oi];
      if (free_late >= 0) {
        reshard(free_late);
        free_late = -1;
      }
      gather_backward(ui);
      for (int ahead = 1; ahead <= s.backward_prefetch && oi + static_cast<size_t>(ahead) < order.size(); ++ahead) {
        const int next = order[oi + static_cast<size_t>(ahead)];
        gather_backward(next);
        if (next == 0 && embed_split) gather_embedding();
      }
      if (ui == 0 && embed_split) gather_embedding();
      const double full = padded(unsharded_train(static_cast<size_t>(ui)));  // gradient elements of the unit
      const double full_bytes = gathered_bytes(ui);
      const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
      // Its layers that run a backward: all but frozen vision blocks (first_trained_layer).
      const int64_t first_trained = first_trained_layer(u);
      const int64_t nl = u.num_layers() == 0 ? 0 : u.last_layer - first_trained + 1;
      // A unit of one layer: its backward op built in place (as fill_forward_op says); of several: a template of its
      // per-layer ops, pushed below.
      std::optional<Op> layered;
      if (nl > 1) layered.emplace();
      Op& b = nl <= 1 ? prog.ops.emplace_back() : *layered;
      fill_backward_op(b, ui, mbi);
      if (gather_op[static_cast<size_t>(ui)] >= 0) b.deps.push_back(gather_op[static_cast<size_t>(ui)]);
      if (ui == 0 && embed_gather >= 0) b.deps.push_back(embed_gather);
      if (rt.allgather_copy_out && regathered[static_cast<size_t>(ui)]) b.device_copy_bytes += 2.0 * full_bytes;
      int bop = -1;
      const double head = ui == 0 ? head_grad_bytes() : 0.0;  // allocated in the loss backward
      if (nl <= 1) {
        b.on_complete.push_back({MemoryCategory::UnshardedGrads, full * pb - head});
        bop = static_cast<int>(prog.ops.size()) - 1;
      } else {
        // A unit of several layers: autograd walks its layers in reverse, allocating each layer's
        // parameter gradients and releasing its activations as it goes, so the unit's gradients and
        // activations are never all alive at once. One op per layer; the unit's own non-layer
        // parameters (root: the embeddings; the head's came in the loss backward) get their gradients
        // after the last, when the embedding backward runs.
        const LayerCosts layers = costs_of(u);
        auto layer_train = [&](const LayerCost& lc) {
          if (adapters_outside_units()) return 0.0;
          return s.method == Method::Full ? unsharded_layer_params(lc) : lc.lora_params;
        };
        auto layer_at = [&](int64_t l) -> const LayerCost& { return *layers[static_cast<size_t>(l - u.first_layer)]; };
        double trained = 0, mm_sum = 0, at_sum = 0, ew_sum = 0, saved_sum = 0;
        for (int64_t l = first_trained; l <= u.last_layer; ++l) {
          const LayerCost* lc = &layer_at(l);
          trained += layer_train(*lc);
          mm_sum += backward_gemm_weight(*lc);
          at_sum += backward_attention_weight(*lc);
          ew_sum += backward_elementwise_weight(*lc);
          saved_sum += lc->saved_bytes;
        }
        auto share = [](double part, double whole) { return whole > 0 ? part / whole : 0.0; };
        const double own = full - trained;  // non-layer params and padding
        const double act_total = act_bytes[static_cast<size_t>(ui)] - (ui == 0 ? head_act : 0.0);
        double rematerialised = 0;  // of a unit-wide checkpoint region, by the layers already walked
        for (int64_t i = 0; i < nl; ++i) {
          const LayerCost& lc = layer_at(u.last_layer - i);
          Op part = b;
          part.matmul_flops *= share(backward_gemm_weight(lc), mm_sum);
          part.attention_flops *= share(backward_attention_weight(lc), at_sum);
          const double elementwise_share = share(backward_elementwise_weight(lc), ew_sum);
          part.elementwise_bytes *= elementwise_share;
          part.float8_cast_bytes *= elementwise_share;
          part.device_copy_bytes *= elementwise_share;
          part.layers = 1;
          part.first_layer = part.last_layer = u.last_layer - i;
          part.on_issue = {};
          part.on_complete = {};
          part.on_complete.push_back({MemoryCategory::UnshardedGrads, layer_train(lc) * pb});
          part.on_complete.push_back({MemoryCategory::Activations, -act_total * share(lc.saved_bytes, saved_sum)});
          if (i == nl - 1) part.on_complete.push_back({MemoryCategory::UnshardedGrads, own * pb - head});
          // A unit-wide checkpoint region is recomputed whole, then consumed layer by layer.
          if (unit_checkpoint_region()) {
            part.transient_bytes = backward_transient(static_cast<size_t>(ui)) - rematerialised;
            rematerialised += lc.saved_bytes_unckpt;
          }
          if (i > 0) part.deps = {};
          bop = push(part);
        }
      }
      bop = push_ep(ui, mbi, true, push_tp(ui, mbi, true, bop));
      last_bwd = bop;
      if (adapters_outside_units()) {
        free_late = ui;
        continue;
      }
      gathered[static_cast<size_t>(ui)] = false;
      // Post-backward (on the compute stream, once the unit's gradients are complete): the gradients are
      // copied into the reduce-scatter input in the reduce dtype while the unsharded parameters and the
      // per-parameter gradients are still alive (FSDP2 foreach_reduce's copy-in; fsdp-run's flat buffer),
      // then the parameters are resharded and the per-parameter gradients released (reduce_unit).
      Op post = post_backward_op(ui, mbi);
      // Kept by the schedule until the last micro-batch's backward (keeps_gathered), else resharded here.
      held[static_cast<size_t>(ui)] = keeps_gathered && mbi < K - 1;
      if (!held[static_cast<size_t>(ui)] && !defer_reduction)
        post.on_complete.push_back({MemoryCategory::UnshardedParams, -full_bytes});
      post.deps.push_back(bop);
      // FSDP1: the per-parameter gradients concatenated into the flat gradient (read them, write it), on the compute
      // stream at the end of the unit's backward, while both are alive.
      if (rt.flat_grad_cat_in_backward) {
        post.device_copy_bytes += 2.0 * full * pb;
        post.transient_bytes += full * pb;
      }
      if (accumulate_unsharded && mbi > 0) {
        // This micro-batch's gradient added into the kept one (read both, write the kept), then freed.
        post.elementwise_bytes += full * (2.0 * kb + pb);
        post.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * pb});
      }
      if (mbi < first_reduced_mb) {
        // Not reduced: the unit's kept gradient waits for the last micro-batch.
        int pop = push(post);
        if (kept_in_reduce_dtype && mbi == 0) {
          // After the reshard, the first gradient upcast into the kept reduce-dtype copy, both alive while it is
          // written, the compute-dtype one then freed.
          Op up = post_backward_op(ui, mbi);
          up.device_copy_bytes = full * (pb + rb);
          up.on_issue.push_back({MemoryCategory::UnshardedGrads, full * rb});
          up.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * pb});
          up.deps.push_back(pop);
          pop = push(up);
        }
        push_tp_norm_grad_sum(ui, mbi, pop);
        continue;
      }
      if (defer_reduction) {
        // The unit's gradient is complete (added into the kept one); the reshard and the reduction wait for the
        // stage's whole backward (DataParallelPlan::reduces_after_stage_backward).
        push_tp_norm_grad_sum(ui, mbi, push(post));
        reduced_after_backward.push_back(ui);
        continue;
      }
      reduce_unit(post, ui, true);
    }
    // After the stage's backward: each unit's post-backward (its reshard and copy-in) and reduction, in the order the
    // backward completed them; the compute stream waits for them before the input gradient is sent.
    for (int ui : reduced_after_backward) {
      Op post = post_backward_op(ui, mbi);
      post.on_complete.push_back({MemoryCategory::UnshardedParams, -gathered_bytes(ui)});
      post.deps.push_back(last_bwd);
      if (prog.first_reduction_after_backward < 0)
        prog.first_reduction_after_backward = static_cast<int>(prog.ops.size());
      reduce_unit(post, ui, false);
    }
    // Units of frozen vision blocks kept after forward: resharded when the backward ends (FSDP2's root post-backward
    // callback runs the post-backward of groups whose backward never ran, _fsdp_state.py
    // _root_post_backward_final_callback), or held for the schedule's next pass like the others (keeps_gathered).
    for (int ui = 1; ui < n; ++ui) {
      if (unit_trains(ui) || !gathered[static_cast<size_t>(ui)]) continue;
      held[static_cast<size_t>(ui)] = keeps_gathered && mbi < K - 1;
      if (held[static_cast<size_t>(ui)]) {
        gathered[static_cast<size_t>(ui)] = false;
      } else {
        reshard(ui);
      }
    }
    // The last unit's replica all-reduce, issued when the end of the backward waits for its reduce-scatter.
    if (deferred_replica.kind == OpKind::AllReduce) {
      last_rs[static_cast<size_t>(deferred_replica.unit)] = last_reduction = push(deferred_replica);
      deferred_replica = Op{};
    }
    if (free_late >= 0) reshard(free_late);
    pp_after_backward(mbi, defer_reduction && last_reduction >= 0 ? last_reduction : last_bwd);
    if (mbi == K - 1) push_adapter_all_reduce(mbi);
  }
  emit_optimizer();
}

}  // namespace fsdp::step_emission
