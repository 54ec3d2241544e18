// Flat-parameter units and the strategy lifecycle. Behaviour follows PyTorch FSDP
// (torch/distributed/fsdp/_flat_param.py, _runtime_utils.py: unshard before forward,
// reshard after forward unless SHARD_GRAD_OP or root, unshard again in the
// pre-backward hook, reduce-scatter in the post-backward hook) and DDP
// (torch/nn/parallel/distributed.py: gradient buckets of bucket_cap_mb all-reduced
// as backward produces them), ZeRO stages 1/2 from Rajbhandari et al. 2020
// (arXiv:1910.02054).
#include "shard/sharded_model.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/errors.hpp"
#include "core/units.hpp"
#include "dist/comm.hpp"
#include "model/module_graph.hpp"
#include "model/transformer.hpp"
#include "program/wrap_units.hpp"
#include "shard/mesh.hpp"
#include "strategy/placement.hpp"
#include "train/host_adam.hpp"
#include "train/mem_tracker.hpp"

namespace fsdp::exec {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

at::ScalarType to_scalar(DType d) {
  switch (d) {
    case DType::Fp32:
      return at::kFloat;
    case DType::Bf16:
      return at::kBFloat16;
    case DType::Fp16:
      return at::kHalf;
  }
  return at::kFloat;
}

int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

// Release / re-create the memory behind a tensor while keeping its StorageImpl, so
// that tensors saved by autograd (aliases of the same storage) see the data again
// after re-gathering (FSDP's _free_storage / _alloc_storage in torch/distributed/utils.py).
void free_storage(const at::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}
void alloc_storage(const at::Tensor& t, int64_t bytes) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(static_cast<size_t>(bytes)));
  impl->set_nbytes(static_cast<size_t>(bytes));
}

enum class UState { Sharded, Gathering, Unsharded };

struct Pending {
  Handle handle;
  std::function<void()> done;
};

}  // namespace

struct Unit {
  ShardedModel::Impl* owner = nullptr;
  int index = 0;
  UnitInfo info;
  std::vector<int> param_ids;
  std::vector<int64_t> offsets;
  std::vector<int> layers;
  bool root = false;
  UnitPlacement place;       // where its state lives and how its gradients are reduced (strategy/placement.hpp)
  int64_t shard_offset = 0;  // start of this rank's shard in the padded flat index space

  at::Tensor master;      // fp32: shard [S] when params are sharded, else the full replica [padded]
  at::Tensor dev_params;  // optimizer offload: the device copy of the shard in compute dtype (master is on the host)
  at::Tensor compute;     // compute dtype [padded]; storage freed while resharded unless persistent
  bool compute_persistent = false;
  UState state = UState::Sharded;
  Handle gather;

  at::Tensor grad_full;   // fp32 [padded] (grads not sharded)
  at::Tensor grad_shard;  // fp32 [S] (grads sharded)
  at::Tensor exp_avg, exp_avg_sq, momentum;
  at::Tensor anchor;  // scalar leaf: the autograd entry of UnitParamsFn
  // The memory tracker's tags of the unit's buffers (train/mem_tracker.hpp MemTag): untagged when the buffer is
  // freed, or with the unit.
  MemTag master_tag, dev_params_tag, grad_tag, states_tag, compute_tag;
};

struct ShardedModel::Impl {
  ModelSpec spec;
  Strategy strategy;
  Comm& comm;
  MemTracker& tracker;  // where the executor's buffers are tagged by category
  at::Device device{at::kCPU};
  std::vector<ParamDef> defs;
  std::vector<std::unique_ptr<Unit>> units;
  std::vector<UnitInfo> infos;
  std::shared_ptr<Group> shard_group;          // size 1 when parameters/optimizer are not sharded
  std::shared_ptr<Group> replica_group;        // HSDP: across shard groups
  Mesh mesh;                                   // tp x dp x pp (shard/mesh.hpp); the strategy runs over mesh.dp_group
  TpContext tp;                                // this rank's tensor-parallel slice (model/tensor_parallel.hpp)
  std::vector<std::vector<ParamDef>> tp_defs;  // every tp rank's defs (tp > 1): gathering a whole parameter
  bool has_root = true;                        // this stage has a root unit (pipeline middle stages may not)
  int world = 1;                               // the data-parallel ranks (mesh.dp)
  // The strategy's placement of its units (strategy/placement.hpp), for what the model holds as a whole (the
  // groups, the replicated gradient buffer, the optimizer's reductions): every unit's own `place` differs from it
  // at most in reshard_after_forward (the root's).
  UnitPlacement place;
  // LoRA (method: lora): the base is frozen (no gradients, no optimizer states); the
  // adapters are one small replicated flat leaf, reduced like DDP and updated by AdamW.
  bool frozen = false;
  std::vector<ParamDef> adapter_defs;
  std::vector<int64_t> adapter_offsets;
  UnitInfo adapter_info;
  at::Tensor adapters, ad_exp_avg, ad_exp_avg_sq, ad_momentum;
  MemTag adapter_tags[3];  // the adapters, their gradient, their optimizer states
  at::Tensor grads_flat;   // replicated gradients: every unit's grad_full is a view into it
  at::ScalarType compute_dtype = at::kFloat, reduce_dtype = at::kFloat;
  bool sync = true;
  std::vector<Pending> pending;
  std::vector<Unit*> bucket;
  int64_t bucket_bytes = 0;
  // Closures used by CheckpointFn's backward; alive from a forward to the next one.
  std::vector<std::shared_ptr<void>> keepalive;
  int micro_batch = 0;      // 1-based within the step, for the memory phase labels
  int bwd_micro_batch = 0;  // 0-based, the backward's (a pipeline runs forwards ahead of backwards)
  bool in_backward = false;
  bool root_backward_seen = false;  // this micro-batch's backward reached the root's pre-backward point

  // The memory tracker's phase label, in the simulator's peak_phase words (program/op_kinds.hpp Phase).
  void phase(Phase what, const Unit& u) { phase_label(std::string(to_string(what)) + " " + u.info.name); }
  void phase(Phase what) { phase_label(to_string(what)); }
  void phase_label(const std::string& what) {
    mem().set_phase(what + " (micro-batch " + std::to_string(micro_batch) + ")");
  }
  // A unit op in the step trace (the simulator's program_trace entries), named for the memory tracker too.
  void unit_op(Phase what, const Unit& u) {
    comm.trace().unit_op(what, u.index);
    phase(what, u);
  }
  CollectiveTag tag(Phase what, GroupKind group, const Unit& u) const { return CollectiveTag{what, group, u.index}; }

  Impl(const ModelSpec& s, const Strategy& st, Comm& c, MemTracker& t) : spec(s), strategy(st), comm(c), tracker(t) {}

  MemTracker& mem() { return tracker; }
  std::shared_ptr<MemTag> shared_tag(MemoryCategory c, int64_t bytes) {
    return std::make_shared<MemTag>(tracker, c, bytes);
  }

  // ---- unshard / reshard ----
  void unshard_async(Unit& u) {
    if (u.state != UState::Sharded) return;
    // Named like the simulator's gather op while it is issued (the staging is allocated now), then the
    // phase goes back to the compute that issued it.
    const std::string issuing = mem().phase();
    const Phase gather_phase = in_backward ? Phase::BwdAllGather : Phase::FwdAllGather;
    phase(gather_phase, u);
    struct Restore {
      MemTracker& t;
      const std::string& p;
      ~Restore() { t.set_phase(p); }
    } restore{mem(), issuing};
    if (!u.compute_persistent) {
      const int64_t bytes = u.info.padded * static_cast<int64_t>(c10::elementSize(compute_dtype));
      u.compute_tag = MemTag(mem(), MemoryCategory::UnshardedParams, bytes);
      alloc_storage(u.compute, bytes);
    }
    if (u.place.params_sharded) {
      // Params offload: the host shard is copied in (and cast) right before the all-gather. The fp32
      // master shard is handed over as it is: the group casts it (Group::all_gather).
      at::Tensor src = u.place.params_on_host   ? u.master.to(device, compute_dtype)
                       : u.place.master_on_host ? u.dev_params
                                                : u.master;
      u.gather = shard_group->all_gather(src, u.compute, tag(gather_phase, GroupKind::Shard, u));
      u.state = UState::Gathering;
    } else {
      if (!u.compute_persistent) u.compute.copy_(u.master);
      u.state = UState::Unsharded;
    }
  }
  void wait_unsharded(Unit& u) {
    unshard_async(u);
    if (u.state == UState::Gathering) {
      u.gather.wait();
      u.state = UState::Unsharded;
    }
  }
  void reshard(Unit& u) {
    if (u.state == UState::Sharded || u.compute_persistent) return;
    if (u.state == UState::Gathering) u.gather.wait();
    free_storage(u.compute);
    u.compute_tag.reset();
    u.state = UState::Sharded;
  }

  // Plain (non-view) tensors aliasing the unit's compute buffer, one per parameter.
  variable_list make_views(Unit& u) {
    variable_list out;
    out.reserve(u.param_ids.size());
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
      const ParamDef& d = defs[static_cast<std::size_t>(u.param_ids[i])];
      std::vector<int64_t> strides(d.shape.size(), 1);
      for (int k = static_cast<int>(d.shape.size()) - 2; k >= 0; --k)
        strides[static_cast<std::size_t>(k)] =
            strides[static_cast<std::size_t>(k) + 1] * d.shape[static_cast<std::size_t>(k) + 1];
      at::Tensor t = at::empty({0}, u.compute.options());
      t.set_(u.compute.storage(), u.compute.storage_offset() + u.offsets[i], d.shape, strides);
      out.push_back(t);
    }
    return out;
  }

  // ---- backward hooks ----
  // A frozen (LoRA) unit's gathered base, freed without a post-backward hook: a Free in the step trace.
  void free_frozen(Unit& u) {
    if (u.place.params_sharded && u.state != UState::Sharded && !u.compute_persistent)
      comm.trace().unit_op(Phase::Free, u.index);
    reshard(u);
  }

  void pre_backward(Unit& u) {
    if (u.root) root_backward_seen = true;
    // Frozen base (LoRA): no post-backward hook; the unit after this one in forward order
    // has finished its backward once the gradient reaches this unit's output. Its gathered shards, or a replica's
    // compute-dtype cast (a persistent fp32 replica stays), are freed then.
    if (frozen && static_cast<std::size_t>(u.index) + 1 < units.size())
      free_frozen(*units[static_cast<std::size_t>(u.index) + 1]);
    unit_op(Phase::Backward, u);
    wait_unsharded(u);
    // Replicas: nothing to prefetch. (Their compute buffer is already there unless a pipeline ran this unit's
    // forward of a later micro-batch before, and its post-backward of an earlier one freed it: copied back.)
    if (!u.place.params_sharded) return;
    // Backward prefetch (FSDP BackwardPrefetch.BACKWARD_PRE): gather the next units in backward order.
    for (int64_t k = 1; k <= strategy.backward_prefetch; ++k) {
      const int j = u.index - static_cast<int>(k);
      if (j < 0) break;
      unshard_async(*units[static_cast<std::size_t>(j)]);
    }
  }

  // Waits for the reductions in flight and runs their completions; a completion may issue the next
  // reduction of its gradient (HSDP's replica all-reduce after the reduce-scatter), which stays in flight.
  void wait_pending() {
    std::vector<Pending> now;
    now.swap(pending);
    for (auto& p : now) {
      p.handle.wait();
      if (p.done) p.done();
    }
  }
  void drain_pending() {
    while (!pending.empty()) wait_pending();
  }

  // All-reduce of replicated fp32 gradients in the plan's reduce dtype: in place when it is fp32, else
  // through a reduce-dtype copy (a comm buffer) copied back when the reduction is waited for (DDP's
  // bf16_compress_hook, torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py).
  void all_reduce_grads(at::Tensor grads, const CollectiveTag& t) {
    if (grads.scalar_type() == reduce_dtype) {
      pending.push_back({mesh.dp_group->all_reduce_sum(grads, t), nullptr});
      return;
    }
    auto copy_tag =
        shared_tag(MemoryCategory::CommBuffers, grads.numel() * static_cast<int64_t>(c10::elementSize(reduce_dtype)));
    at::Tensor low = grads.to(reduce_dtype);
    pending.push_back({mesh.dp_group->all_reduce_sum(low, t), [grads, low, copy_tag]() mutable {
                         grads.copy_(low);
                         low = at::Tensor();
                         copy_tag->reset();
                       }});
  }

  // The bucket's units are consecutive in backward order, hence a contiguous slice of grads_flat.
  void flush_bucket() {
    if (bucket.empty()) return;
    const int64_t start = bucket.front()->grad_full.storage_offset() - grads_flat.storage_offset();
    int64_t len = 0;
    for (Unit* u : bucket) len += u->info.padded;
    FSDP_ASSERT(bucket.back()->grad_full.storage_offset() - grads_flat.storage_offset() + bucket.back()->info.padded ==
                    start + len,
                "a DDP bucket is not contiguous in the gradient buffer");
    all_reduce_grads(grads_flat.narrow(0, start, len), tag(Phase::BucketAllReduce, GroupKind::World, *bucket.back()));
    bucket.clear();
    bucket_bytes = 0;
  }

  void post_backward(Unit& u, const variable_list& grads) {
    unit_op(Phase::PostBackward, u);
    // The unit's per-parameter gradients, handed over by autograd, are unsharded gradients until
    // autograd releases them when this hook returns.
    int64_t inflight = 0;
    for (const auto& g : grads) inflight += nbytes(g);
    // On return: autograd goes on with the unit before this one in forward order (the root last).
    struct OnReturn {
      Impl* m;
      const Unit& u;
      ~OnReturn() {
        if (u.index > 0) m->phase(Phase::Backward, *m->units[static_cast<std::size_t>(u.index) - 1]);
      }
    } on_return{this, u};
    const MemTag inflight_tag(mem(), MemoryCategory::UnshardedGrads, inflight);  // untagged first on return
    const int64_t flat_bytes = u.info.padded * static_cast<int64_t>(c10::elementSize(compute_dtype));
    // The flat copy is the reduce-scatter input when gradients are sharded (FSDP2's foreach_reduce input,
    // a comm buffer in the simulator's words), else a momentary copy accumulated into grad_full.
    const MemoryCategory flat_cat = u.place.grads_sharded ? MemoryCategory::CommBuffers : MemoryCategory::Transient;
    auto flat_tag = shared_tag(flat_cat, flat_bytes);
    at::Tensor flat = at::zeros({u.info.padded}, u.compute.options());
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
      if (i >= grads.size() || !grads[i].defined()) continue;
      flat.narrow(0, u.offsets[i], grads[i].numel()).copy_(grads[i].reshape({-1}));
    }
    sum_partial_grads(u, flat);
    reshard(u);  // a persistent compute buffer (fp32 replicas) stays

    if (u.place.reduction != GradReduction::ReduceScatter) {
      u.grad_full.add_(flat);
      flat = at::Tensor();
      flat_tag->reset();
      if (!sync) return;
      if (u.place.reduction == GradReduction::AllReducePerUnit) {
        all_reduce_grads(u.grad_full, tag(Phase::AllReduce, u.place.reduce_group, u));
      } else {  // ddp, zero1: buckets of ddp_bucket_mb MiB (DDP bucket_cap_mb, default 25) of the gradients' bytes
        bucket.push_back(&u);
        bucket_bytes += nbytes(u.grad_full);
        if (static_cast<double>(bucket_bytes) >= static_cast<double>(strategy.ddp_bucket_mb) * kMiB) flush_bucket();
      }
      return;
    }
    // Sharded gradients: reduce-scatter this micro-batch's unit gradient now (at most one
    // in flight, like FSDP's post-backward stream), accumulate into the shard.
    wait_pending();
    at::Tensor red = flat.scalar_type() == reduce_dtype ? flat : flat.to(reduce_dtype);
    // The reduce-dtype copy is the reduce-scatter's input from here on: tagged as the comm buffer, the compute-dtype
    // flat copy (and its tag) released.
    std::shared_ptr<MemTag> red_tag;
    if (!red.is_same(flat)) {
      red_tag = shared_tag(MemoryCategory::CommBuffers, nbytes(red));
      flat = at::Tensor();
      flat_tag->reset();
    }
    auto out_tag =
        shared_tag(MemoryCategory::CommBuffers, u.info.shard * static_cast<int64_t>(c10::elementSize(reduce_dtype)));
    at::Tensor out = at::empty({u.info.shard}, red.options());
    // ZeRO-2 keeps replicated parameters: its gradient partitions are split over the whole world (the step
    // program's GroupKind::World), FSDP's over the shard group.
    Handle h = shard_group->reduce_scatter_sum(red, out, tag(Phase::ReduceScatter, u.place.reduce_group, u));
    Unit* up = &u;
    const bool replicate = sync && u.place.replica_all_reduce && replica_group->size() > 1;
    pending.push_back({std::move(h), [this, up, red, out, flat, flat_tag, red_tag, out_tag, replicate]() mutable {
                         up->grad_shard.add_(out);
                         red = at::Tensor();
                         flat = at::Tensor();
                         out = at::Tensor();
                         flat_tag->reset();
                         if (red_tag) red_tag->reset();
                         out_tag->reset();
                         if (replicate) all_reduce_replicas(*up);
                       }});
  }

  // Tensor parallelism: the gradients of replicated parameters that this rank computed only part of (on its
  // sequence slice, its heads: ParamDef::grad_sum) summed over the tp group, the kv heads shared by tp / kv_heads
  // ranks over theirs; one all-reduce of each kind per unit (Megatron's coalesced allreduce of layernorm grads).
  void sum_partial_grads(const Unit& u, const at::Tensor& flat) {
    for (TpGradSum kind : {TpGradSum::Tensor, TpGradSum::KvGroup}) {
      Group& g = kind == TpGradSum::Tensor ? *mesh.tp_group : *mesh.kv_group;
      if (g.size() <= 1) continue;
      std::vector<at::Tensor> parts;
      for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
        const ParamDef& d = defs[static_cast<std::size_t>(u.param_ids[i])];
        if (d.grad_sum == kind) parts.push_back(flat.narrow(0, u.offsets[i], d.numel()));
      }
      if (parts.empty()) continue;
      at::Tensor buf = at::cat(parts);
      g.all_reduce_sum(buf, tag(Phase::TpNormGradAllReduce, GroupKind::Tensor, u)).wait();
      int64_t pos = 0;
      for (auto& part : parts) {
        part.copy_(buf.narrow(0, pos, part.numel()));
        pos += part.numel();
      }
    }
  }

  // Sum of squares of the unit's gradient part that this rank owns (owned_grad), counting each parameter once
  // over the mesh: of identical tensor-parallel copies only the one ParamDef::counts_in_norm marks.
  at::Tensor owned_grad_sq(Unit& u) {
    at::Tensor g = owned_grad(u);
    bool all_count = true;
    for (int pid : u.param_ids) all_count = all_count && defs[static_cast<std::size_t>(pid)].counts_in_norm;
    if (all_count) return g.to(at::kDouble).pow(2).sum();
    const int64_t lo = g.numel() == u.info.padded ? 0 : u.shard_offset, hi = lo + g.numel();
    at::Tensor sq = at::zeros({}, g.options().dtype(at::kDouble));
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
      const ParamDef& d = defs[static_cast<std::size_t>(u.param_ids[i])];
      const int64_t a = std::max(lo, u.offsets[i]), b = std::min(hi, u.offsets[i] + d.numel());
      if (d.counts_in_norm && a < b) sq += g.narrow(0, a - lo, b - a).to(at::kDouble).pow(2).sum();
    }
    return sq;
  }

  // A per-rank partial sum (the gradient norm's squares, a non-finite count) summed over the mesh: the shard group
  // where the optimizer is sharded (replicas hold the same), then tp and pp.
  void sum_over_mesh(at::Tensor t, Phase what) {
    if (place.optim_sharded && shard_group->size() > 1)
      shard_group->all_reduce_sum(t, CollectiveTag{what, GroupKind::Shard, -1}).wait();
    if (mesh.tp_group->size() > 1) mesh.tp_group->all_reduce_sum(t, CollectiveTag{what, GroupKind::Tensor, -1}).wait();
    if (mesh.pp_group->size() > 1)
      mesh.pp_group->all_reduce_sum(t, CollectiveTag{what, GroupKind::Pipeline, -1}).wait();
  }

  Unit* root_unit() { return has_root ? units.front().get() : nullptr; }
  // The tensor-parallel context of unit `u`'s collectives.
  TpContext tp_of(const Unit& u) const {
    TpContext c = tp;
    c.unit = u.index;
    return c;
  }

  // HSDP: the unit's accumulated gradient shard summed over the replica groups in the reduce dtype, issued
  // when its reduce-scatter is waited for (the next unit's post-backward) and waited for at the one after,
  // overlapping the backward (FSDP2 foreach_reduce's all-reduce over the replicate dimension).
  void all_reduce_replicas(Unit& u) {
    const CollectiveTag t = tag(Phase::ReplicaAllReduce, GroupKind::Replica, u);
    if (reduce_dtype == at::kFloat) {
      pending.push_back({replica_group->all_reduce_sum(u.grad_shard, t), nullptr});
      return;
    }
    auto copy_tag =
        shared_tag(MemoryCategory::CommBuffers, u.info.shard * static_cast<int64_t>(c10::elementSize(reduce_dtype)));
    at::Tensor low = u.grad_shard.to(reduce_dtype);
    Unit* up = &u;
    pending.push_back({replica_group->all_reduce_sum(low, t), [up, low, copy_tag]() mutable {
                         up->grad_shard.copy_(low);
                         low = at::Tensor();
                         copy_tag->reset();
                       }});
  }

  // ---- optimizer views ----
  at::Tensor owned_param(Unit& u) {
    if (u.place.params_sharded || !u.place.optim_sharded) return u.master;
    return u.master.narrow(0, u.shard_offset, u.info.shard);
  }
  at::Tensor owned_grad(Unit& u) {
    if (u.place.grads_sharded) return u.grad_shard;
    if (u.place.optim_sharded) return u.grad_full.narrow(0, u.shard_offset, u.info.shard);
    return u.grad_full;
  }
};

namespace {

// Hands out the unit's parameters as autograd outputs; its backward receives every
// parameter gradient of the unit at once: the post-backward point.
struct UnitParamsFn : public torch::autograd::Function<UnitParamsFn> {
  static variable_list forward(AutogradContext* ctx, at::Tensor anchor, int64_t unit_addr) {
    (void)anchor;
    ctx->saved_data["unit"] = unit_addr;
    auto* u = reinterpret_cast<Unit*>(unit_addr);
    return u->owner->make_views(*u);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* u = reinterpret_cast<Unit*>(ctx->saved_data["unit"].toInt());
    u->owner->post_backward(*u, grads);
    return {at::Tensor(), at::Tensor()};
  }
};

// Identity on the unit's output; its backward runs before the unit's own backward:
// the pre-backward point (re-gather, prefetch). With `regather_only`, its backward only gathers the unit again: on
// the output of the root's own layers on the first of several pipeline stages (wrap "model"), whose pre-backward
// point, at the embedding's output, comes after those layers' backward (with one stage the root is still gathered
// from its forward, but a pipeline runs later micro-batches' forwards before an earlier one's backward resharded it).
struct PreBackwardFn : public torch::autograd::Function<PreBackwardFn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t unit_addr, bool regather_only) {
    ctx->saved_data["unit"] = unit_addr;
    ctx->saved_data["regather_only"] = regather_only;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* u = reinterpret_cast<Unit*>(ctx->saved_data["unit"].toInt());
    if (ctx->saved_data["regather_only"].toBool())
      u->owner->wait_unsharded(*u);
    else
      u->owner->pre_backward(*u);
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

using LayersRunner = std::function<at::Tensor(const at::Tensor& x, const ParamMap& params)>;

// Full activation checkpointing of a unit (Chen et al. 2016, arXiv:1604.06174):
// forward without saving activations, recompute the unit in backward.
struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  // TensorList, not variable_list: only an ArrayRef argument is unpacked into autograd inputs
  // (ExtractVariables in torch/csrc/autograd/custom_function.h).
  static at::Tensor forward(AutogradContext* ctx, at::TensorList input_list, int64_t runner_addr, int64_t names_addr) {
    variable_list inputs = input_list.vec();
    ctx->save_for_backward(inputs);
    // Which inputs the recomputation differentiates: those that required a gradient here. A LoRA unit's frozen base
    // does not (ShardedModel's make_views), nor does a first layer's input under a frozen embedding; made to require
    // one, the recomputed graph would keep the frozen linears' inputs and compute their weights' gradients.
    std::string needs(inputs.size(), '0');
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].requires_grad()) needs[i] = '1';
    ctx->saved_data["needs_grad"] = needs;
    ctx->saved_data["runner"] = runner_addr;
    ctx->saved_data["names"] = names_addr;
    const auto& runner = *reinterpret_cast<const LayersRunner*>(runner_addr);
    const auto& names = *reinterpret_cast<const std::vector<std::string>*>(names_addr);
    ParamMap p;
    for (std::size_t i = 0; i < names.size(); ++i) p[names[i]] = inputs[i + 1];
    return runner(inputs[0], p);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& runner = *reinterpret_cast<const LayersRunner*>(ctx->saved_data["runner"].toInt());
    const auto& names = *reinterpret_cast<const std::vector<std::string>*>(ctx->saved_data["names"].toInt());
    const std::string needs = ctx->saved_data["needs_grad"].toStringRef();
    variable_list inputs, wrt;
    std::vector<std::size_t> wrt_index;
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const bool grad = needs[i] == '1';
      inputs.push_back(grad ? saved[i].detach().requires_grad_(true) : saved[i].detach());
      if (grad) {
        wrt.push_back(inputs.back());
        wrt_index.push_back(i);
      }
    }
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      ParamMap p;
      for (std::size_t i = 0; i < names.size(); ++i) p[names[i]] = inputs[i + 1];
      out = runner(inputs[0], p);
    }
    variable_list g(saved.size());
    if (!wrt.empty() && out.requires_grad()) {
      const variable_list got = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
      for (std::size_t j = 0; j < wrt_index.size(); ++j) g[wrt_index[j]] = got[j];
    }
    // One gradient for the variable_list (flattened by apply) and none for the addresses.
    g.push_back(at::Tensor());
    g.push_back(at::Tensor());
    return g;
  }
};

// Selective checkpointing: only the attention core is recomputed (Korthikanti et
// al. 2022, arXiv:2205.05198, "selective activation recomputation").
struct CoreCheckpointFn : public torch::autograd::Function<CoreCheckpointFn> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor q, at::Tensor k, at::Tensor v, bool eager) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["eager"] = eager;
    return attention_core(q, k, v, eager);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    variable_list in;
    for (auto& t : s) in.push_back(t.detach().requires_grad_(true));
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      out = attention_core(in[0], in[1], in[2], ctx->saved_data["eager"].toBool());
    }
    auto g = torch::autograd::grad({out}, in, {grads[0]});
    return {g[0], g[1], g[2], at::Tensor()};
  }
};

}  // namespace

// ---------------------------------------------------------------------------

ShardedModel::ShardedModel(const ModelSpec& spec, const Strategy& strategy, Comm& comm, MemTracker& tracker,
                           const std::string& device, uint64_t seed)
    : impl_(std::make_unique<Impl>(spec, strategy, comm, tracker)) {
  Impl& m = *impl_;
  m.device = at::Device(device);
  m.place = unit_placement(strategy, /*root=*/false, ShardedModel::kReshardsRoot);
  m.compute_dtype = to_scalar(strategy.param_dtype);
  m.reduce_dtype = to_scalar(strategy.reduce_dtype);
  check_supported(spec, strategy, comm.size());
  m.frozen = strategy.method == Method::Lora;

  // The mesh: tp, dp and pp groups (shard/mesh.hpp); the strategy shards and reduces over the dp group.
  m.mesh = make_mesh(comm, spec, strategy);
  Mesh& mesh = m.mesh;
  m.world = mesh.dp;
  const std::vector<ParamDef> whole = model_param_defs(spec);
  m.defs = tp_param_defs(whole, spec, mesh.tp, mesh.tp_rank, mesh.sequence_parallel);
  if (mesh.tp > 1) {
    for (int r = 0; r < mesh.tp; ++r)
      m.tp_defs.push_back(tp_param_defs(whole, spec, mesh.tp, r, mesh.sequence_parallel));
    m.tp.group = mesh.tp_group.get();
    m.tp.size = mesh.tp;
    m.tp.rank = mesh.tp_rank;
    m.tp.sequence_parallel = mesh.sequence_parallel;
    m.tp.heads = spec.num_heads / mesh.tp;
    m.tp.kv_heads = spec.num_kv_heads >= mesh.tp ? spec.num_kv_heads / mesh.tp : 1;
    m.tp.vocab = split_rows(spec.vocab_size, mesh.tp, mesh.tp_rank);
    m.tp.in_backward = &m.in_backward;
  }

  // The shard group and, for HSDP, the replica group: within the dp group (its ranks by dp index).
  const int W = m.world;
  const int r = mesh.dp_rank;
  auto global = [&mesh](int dp_index) { return mesh.rank_of(mesh.pp_rank, dp_index, mesh.tp_rank); };
  if (strategy.kind == StrategyKind::Hsdp) {
    const int G = static_cast<int>(strategy.hsdp_group);
    std::vector<int> shard_members, replica_members;
    for (int i = 0; i < G; ++i) shard_members.push_back(global((r / G) * G + i));
    for (int i = r % G; i < W; i += G) replica_members.push_back(global(i));
    // Creation order is the same on every rank: all shard groups, then all replica groups. The tags name the
    // members' dp indices and the mesh coordinates, so that no two groups share a store prefix.
    const std::string at_mesh = "@" + std::to_string(mesh.pp_rank) + "." + std::to_string(mesh.tp_rank);
    m.shard_group = comm.subgroup("shard" + std::to_string(r / G) + at_mesh, shard_members);
    m.replica_group = comm.subgroup("replica" + std::to_string(r % G) + at_mesh, replica_members);
  } else if (m.place.optim_sharded) {
    m.shard_group = mesh.dp_group;
  } else {
    m.shard_group = comm.subgroup("self" + std::to_string(comm.rank()), {comm.rank()});
  }
  const int Ws = m.shard_group->size();
  const int shard_rank = m.shard_group->rank();

  // Wrap units: the simulator's (program/wrap_units.hpp strategy_units), so that the program's ops and this
  // run's name the same units. The root holds embeddings, final norm and head (and every layer no other
  // unit claims). A pipeline stage keeps the units of its layers (cut at the stage's bounds, renamed as
  // strategy_units names a unit of those layers) and the root where it holds the embeddings (first stage), the
  // final norm and head (last stage) or root layers.
  const int L = static_cast<int>(spec.num_layers);
  const int first = mesh.first_layer, last = mesh.last_layer;
  const std::vector<WrapUnit> plan_units = strategy_units(ModuleGraph(spec), strategy);
  std::vector<int> layer_unit(static_cast<std::size_t>(L), -1);
  for (const WrapUnit& w : plan_units) {
    const int64_t a = w.first_layer < 0 ? -1 : std::max<int64_t>(w.first_layer, first);
    const int64_t b = w.first_layer < 0 ? -2 : std::min<int64_t>(w.last_layer, last);
    const bool has_layers = a >= 0 && a <= b;
    if (w.is_root ? !(has_layers || mesh.first_stage() || mesh.last_stage()) : !has_layers) continue;
    auto u = std::make_unique<Unit>();
    u->owner = &m;
    u->index = static_cast<int>(m.units.size());
    u->root = w.is_root;
    u->place = unit_placement(strategy, w.is_root, ShardedModel::kReshardsRoot);
    u->info.name = w.name;
    if (!w.is_root && (a != w.first_layer || b != w.last_layer))
      u->info.name = "layers." + std::to_string(a) + (a == b ? "" : "-" + std::to_string(b));
    for (int64_t l = a; has_layers && l <= b; ++l) {
      u->layers.push_back(static_cast<int>(l));
      layer_unit[static_cast<std::size_t>(l)] = u->index;
    }
    m.units.push_back(std::move(u));
  }
  m.has_root = !m.units.empty() && m.units[0]->root;
  FSDP_ASSERT(!m.units.empty() && (m.has_root || !(mesh.first_stage() || mesh.last_stage())),
              "strategy_units puts the root first; the first and last stages keep it");
  for (int l = first; l <= last; ++l)
    FSDP_ASSERT(layer_unit[static_cast<std::size_t>(l)] >= 0, "every decoder layer of the stage belongs to a unit");
  for (std::size_t p = 0; p < m.defs.size(); ++p) {
    const ParamDef& d = m.defs[p];
    // The root's parameters: the embeddings on the first stage, the final norm and head on the last.
    const bool embedding = d.name.rfind("model.embed_", 0) == 0;
    if (d.layer < 0 ? !(embedding ? mesh.first_stage() : mesh.last_stage()) : (d.layer < first || d.layer > last))
      continue;
    Unit& u = *m.units[d.layer < 0 ? 0 : static_cast<std::size_t>(layer_unit[static_cast<std::size_t>(d.layer)])];
    u.param_ids.push_back(static_cast<int>(p));
    u.offsets.push_back(u.info.numel);
    u.info.offsets.push_back(u.info.numel);
    u.info.shapes.push_back(d.shape);
    u.info.full_shapes.push_back(d.whole_shape());
    u.info.tp_dims.push_back(d.tp_dim);
    u.info.tp_starts.push_back(d.tp_start);
    u.info.numel += d.numel();
    u.info.params.push_back(d.name);
  }

  auto fopt = at::TensorOptions().dtype(at::kFloat).device(m.device);
  for (auto& up : m.units) {
    Unit& u = *up;
    u.info.padded = (u.info.numel + Ws - 1) / Ws * Ws;
    u.info.shard = u.info.padded / Ws;
    u.shard_offset = static_cast<int64_t>(shard_rank) * u.info.shard;
    const int64_t master_numel = u.place.params_sharded ? u.info.shard : u.info.padded;
    // With optimizer offload the fp32 master and the optimizer states live on the host
    // (pinned on CUDA, for asynchronous copies); the device keeps the compute-dtype shard.
    const auto host = at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(m.device.is_cuda());
    const auto sopt = u.place.master_on_host ? host : fopt;
    u.master_tag =
        MemTag(m.tracker, u.place.master_on_host ? MemoryCategory::MasterParams : MemoryCategory::ShardedParams,
               master_numel * 4);
    u.master = at::zeros({master_numel}, sopt);
    // Deterministic init: every rank builds each full parameter and keeps its part.
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
      const int pid = u.param_ids[i];
      at::Tensor full = init_param(m.defs[static_cast<std::size_t>(pid)], pid, seed).reshape({-1}).to(m.device);
      const int64_t lo = u.offsets[i], hi = lo + full.numel();
      const int64_t mlo = u.place.params_sharded ? u.shard_offset : 0;
      const int64_t mhi = mlo + master_numel;
      const int64_t a = std::max(lo, mlo), b = std::min(hi, mhi);
      if (a < b) u.master.narrow(0, a - mlo, b - a).copy_(full.narrow(0, a - lo, b - a));
    }
    if (u.place.master_on_host && !u.place.params_on_host) {
      u.dev_params_tag = MemTag(m.tracker, MemoryCategory::ShardedParams,
                                master_numel * static_cast<int64_t>(c10::elementSize(m.compute_dtype)));
      u.dev_params = u.master.to(fopt.dtype(m.compute_dtype), /*non_blocking=*/false, /*copy=*/true);
    }
    u.compute_persistent = !u.place.params_sharded && m.compute_dtype == at::kFloat;
    if (u.compute_persistent) {
      u.compute = u.master;
      u.state = UState::Unsharded;
    } else {
      u.compute = at::empty({u.info.padded}, fopt.dtype(m.compute_dtype));
      free_storage(u.compute);
      u.state = UState::Sharded;
    }
    if (m.frozen) {
      // no gradient buffers nor optimizer states for a frozen base
    } else if (u.place.grads_sharded) {
      u.grad_tag = MemTag(m.tracker, MemoryCategory::ShardedGrads, u.info.shard * 4);
      u.grad_shard = at::zeros({u.info.shard}, fopt);
    } else {
      u.grad_tag = MemTag(m.tracker, MemoryCategory::UnshardedGrads, u.info.padded * 4);  // a view, below
    }
    const int64_t owned = u.place.optim_sharded ? u.info.shard : u.info.padded;
    if (m.frozen) {
      // frozen
    } else if (strategy.optimizer == Optimizer::AdamW) {
      u.states_tag = MemTag(m.tracker, MemoryCategory::OptimizerStates, 2 * owned * 4);
      u.exp_avg = at::zeros({owned}, sopt);
      u.exp_avg_sq = at::zeros({owned}, sopt);
    } else {
      u.states_tag = MemTag(m.tracker, MemoryCategory::OptimizerStates, owned * 4);
      u.momentum = at::zeros({owned}, sopt);
    }
    u.anchor = at::zeros({}, fopt).requires_grad_(true);
    m.infos.push_back(u.info);
  }
  if (!m.frozen && !m.place.grads_sharded) {
    // Replicated gradients: one flat buffer, the units laid out in backward order (the root last), each
    // unit's grad_full a view into it, so that a DDP bucket of consecutive units is a contiguous slice
    // all-reduced in place (DDP's gradient_as_bucket_view, torch/nn/parallel/distributed.py).
    int64_t total = 0;
    for (auto& up : m.units) total += up->info.padded;
    m.grads_flat = at::zeros({total}, fopt);
    int64_t off = 0;
    for (auto it = m.units.rbegin(); it != m.units.rend(); ++it) {
      (*it)->grad_full = m.grads_flat.narrow(0, off, (*it)->info.padded);
      off += (*it)->info.padded;
    }
  }
  if (m.frozen) {
    m.adapter_defs = lora_param_defs(spec, strategy.lora.rank, strategy.lora.target_modules);
    int64_t n = 0;
    m.adapter_info.name = "adapters";
    for (const auto& d : m.adapter_defs) {
      m.adapter_offsets.push_back(n);
      m.adapter_info.params.push_back(d.name);
      m.adapter_info.offsets.push_back(n);
      m.adapter_info.shapes.push_back(d.shape);
      n += d.numel();
    }
    m.adapter_info.numel = m.adapter_info.padded = m.adapter_info.shard = n;
    m.adapter_tags[0] = MemTag(m.tracker, MemoryCategory::ShardedParams, 4 * n);
    m.adapter_tags[1] = MemTag(m.tracker, MemoryCategory::UnshardedGrads, 4 * n);
    m.adapter_tags[2] =
        MemTag(m.tracker, MemoryCategory::OptimizerStates, (strategy.optimizer == Optimizer::AdamW ? 8 : 4) * n);
    m.adapters = at::zeros({n}, fopt);
    const int64_t base_index = static_cast<int64_t>(m.defs.size());
    for (std::size_t i = 0; i < m.adapter_defs.size(); ++i)
      m.adapters.narrow(0, m.adapter_offsets[i], m.adapter_defs[i].numel())
          .copy_(init_param(m.adapter_defs[i], base_index + static_cast<int64_t>(i), seed).reshape({-1}));
    m.adapters.requires_grad_(true);
    m.adapters.mutable_grad() = at::zeros({n}, fopt);
    if (strategy.optimizer == Optimizer::AdamW) {
      m.ad_exp_avg = at::zeros({n}, fopt);
      m.ad_exp_avg_sq = at::zeros({n}, fopt);
    } else {
      m.ad_momentum = at::zeros({n}, fopt);
    }
  }
}

void ShardedModel::check_supported(const ModelSpec& spec, const Strategy& strategy, int world) {
  check_model_supported(spec);
  // torch.utils.checkpoint's selective policies (create_selective_checkpoint_contexts, a TorchDispatchMode that
  // caches chosen aten ops' outputs) are not in LibTorch 1.13's C++ API.
  if (strategy.act_ckpt == ActCkpt::SelectiveOp)
    throw InputError(
        "--act-ckpt selective-op is torchtitan's per-op policy; fsdp-run runs none, full, selective and every:N");
  if (strategy.master_dtype != DType::Fp32)
    throw InputError("fsdp-run keeps master parameters in fp32; the plan asks for master_dtype " +
                     std::string(to_string(strategy.master_dtype)));
  if (strategy.offload != Offload::None && !shards_params(strategy.kind))
    throw InputError(std::string("offload is implemented for zero3, fsdp, fsdp-grad-op and hsdp; the plan asks for ") +
                     to_string(strategy.kind));
  if (strategy.method == Method::QLora)
    throw InputError("fsdp-run does not implement method qlora (4-bit base weights) yet; use lora");
  if (strategy.grad_sync == GradSync::LastMicroBatch)
    throw InputError(
        "fsdp-run reduces sharded gradients after every micro-batch; the plan asks for grad_sync "
        "last-micro-batch (no_sync), which it does not run yet");
  if (strategy.method == Method::Lora && strategy.offload != Offload::None)
    throw InputError("method lora with offload is not supported");
  // The adapters' targets, before any rank connects (one message from the launcher, no rank left waiting).
  if (strategy.method == Method::Lora) lora_param_defs(spec, strategy.lora.rank, strategy.lora.target_modules);
  check_mesh_supported(spec, strategy, world);
}

ShardedModel::~ShardedModel() {
  if (!impl_) return;
  // The units' and adapters' memory tags untag with them (MemTag); a gathered unit is freed first.
  for (auto& up : impl_->units) {
    // May run while an exception unwinds (a failed collective): a prefetch still in flight
    // must not throw out of the destructor (std::terminate).
    try {
      impl_->reshard(*up);
    } catch (...) {
    }
  }
}

at::Tensor ShardedModel::forward_stage(const at::Tensor& tokens_in, const at::Tensor& targets_in,
                                       const at::Tensor& input) {
  Impl& m = *impl_;
  at::Tensor tokens = tokens_in.to(m.device), targets = targets_in.to(m.device);
  if (++m.micro_batch == 1) m.keepalive.clear();  // the previous step's checkpoint closures
  m.comm.trace().set_micro_batch(m.micro_batch - 1);
  auto params_of = [&](Unit& u) {
    m.unit_op(Phase::Forward, u);
    m.wait_unsharded(u);
    variable_list views = m.frozen ? m.make_views(u) : UnitParamsFn::apply(u.anchor, reinterpret_cast<int64_t>(&u));
    ParamMap p;
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) p[u.info.params[i]] = views[i];
    if (m.frozen) {  // this unit's adapters: autograd views of the adapter leaf
      for (std::size_t i = 0; i < m.adapter_defs.size(); ++i) {
        const ParamDef& d = m.adapter_defs[i];
        if (std::find(u.layers.begin(), u.layers.end(), d.layer) == u.layers.end()) continue;
        p[d.name] = m.adapters.narrow(0, m.adapter_offsets[i], d.numel()).view(d.shape);
      }
    }
    // Forward prefetch: start gathering the next units now.
    for (int64_t k = 1; k <= m.strategy.forward_prefetch; ++k) {
      const std::size_t j = static_cast<std::size_t>(u.index + k);
      if (j < m.units.size()) m.unshard_async(*m.units[j]);
    }
    return p;
  };
  const bool eager = m.strategy.attention == AttentionImpl::Eager;
  ForwardOptions fo;
  fo.attention = m.strategy.attention;
  if (m.strategy.act_ckpt == ActCkpt::Selective)
    fo.core = [eager](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return CoreCheckpointFn::apply(q, k, v, eager);
    };
  const ModelSpec& spec = m.spec;
  if (spec.position_embedding == PositionEmbedding::Rope) {
    // Once per forward, in the compute dtype, shared by every layer (the whole sequence: rotary runs after
    // sequence parallelism's all-gather).
    at::Tensor like = at::empty({0}, at::TensorOptions().dtype(m.compute_dtype).device(m.device));
    rope_tables(spec, tokens.size(1), like, fo.rope_cos, fo.rope_sin);
  }
  // Layers `layers` (in order) as one checkpoint region: run without saving activations, recomputed in backward.
  auto checkpointed = [&](const std::vector<int>& layers, const at::Tensor& x, const ParamMap& p,
                          const ForwardOptions& uo) {
    auto runner = std::make_shared<LayersRunner>([&spec, layers, uo](const at::Tensor& xin, const ParamMap& pm) {
      at::Tensor h = xin;
      for (int l : layers) h = layer_forward(spec, pm, l, h, uo);
      return h;
    });
    auto names = std::make_shared<std::vector<std::string>>();
    variable_list inputs{x};
    for (auto& [name, t] : p) {
      // Only the region's layers' parameters (model.layers.<l>.*, executor/model/transformer.cpp).
      const bool mine = std::any_of(layers.begin(), layers.end(), [&name = name](int l) {
        return name.rfind("model.layers." + std::to_string(l) + ".", 0) == 0;
      });
      if (!mine) continue;
      names->push_back(name);
      inputs.push_back(t);
    }
    m.keepalive.push_back(runner);
    m.keepalive.push_back(names);
    return CheckpointFn::apply(at::TensorList(inputs), reinterpret_cast<int64_t>(runner.get()),
                               reinterpret_cast<int64_t>(names.get()));
  };
  // A unit's layers under the plan's checkpointing: full checkpointing of every layer is one region per unit (the
  // simulator's RuntimeProfile::checkpoint_per_unit); every:N and fraction:P checkpoint the layers layer_ckpt names,
  // each its own region (torchtitan wraps each chosen block), and runs the others as they are.
  auto run_layers = [&](Unit& u, const at::Tensor& x, const ParamMap& p) {
    ForwardOptions uo = fo;
    uo.tp = m.tp_of(u);
    if (u.layers.empty() || m.strategy.act_ckpt != ActCkpt::Full) {
      at::Tensor h = x;
      for (int l : u.layers) h = layer_forward(spec, p, l, h, uo);
      return h;
    }
    if (checkpoints_every_layer(m.strategy)) return checkpointed(u.layers, x, p, uo);
    at::Tensor h = x;
    for (int l : u.layers)
      h = layer_ckpt(m.strategy, l) == ActCkpt::Full ? checkpointed({l}, h, p, uo) : layer_forward(spec, p, l, h, uo);
    return h;
  };

  Unit* root = m.root_unit();
  ParamMap rp;
  if (root != nullptr) rp = params_of(*root);
  at::Tensor x = input;
  if (m.mesh.first_stage()) {
    x = embed_forward(spec, rp, tokens, m.tp_of(*root));
    // The root's pre-backward point: autograd reaches the embedding's output once every other unit's backward
    // has run (the root's own layers, under wrap "model", come before it). On a later pipeline stage the root
    // (final norm and head) is the first to run backward: backward_stage calls its pre-backward first.
    x = PreBackwardFn::apply(x, reinterpret_cast<int64_t>(root), false);
  }
  if (root != nullptr && !root->layers.empty()) {
    x = run_layers(*root, x, rp);
    if (m.mesh.pp > 1 && m.mesh.first_stage()) x = PreBackwardFn::apply(x, reinterpret_cast<int64_t>(root), true);
  }
  // A replica's compute-dtype copy (cast from its fp32 master) that no saved tensor needs: every layer of the unit
  // is checkpointed, so its backward runs the forward again and casts anew (pre_backward). PyTorch's autocast holds
  // no cast across a checkpointed region either (its recomputation casts again), and the simulator prices the cast
  // so (program/step_emitter.hpp, cast_checkpointed_share).
  auto casts_unneeded_after_forward = [&](const Unit& u) {
    if (u.place.params_sharded || u.compute_persistent || u.layers.empty() || m.strategy.act_ckpt != ActCkpt::Full)
      return false;
    return std::all_of(u.layers.begin(), u.layers.end(),
                       [&](int l) { return layer_ckpt(m.strategy, l) == ActCkpt::Full; });
  };
  for (std::size_t i = root != nullptr ? 1 : 0; i < m.units.size(); ++i) {
    Unit& u = *m.units[i];
    ParamMap p = params_of(u);
    x = run_layers(u, x, p);
    x = PreBackwardFn::apply(x, reinterpret_cast<int64_t>(&u), false);
    if (u.place.reshard_after_forward) {
      m.comm.trace().unit_op(Phase::Free, u.index);
      m.reshard(u);
    } else if (casts_unneeded_after_forward(u)) {
      m.reshard(u);
    }
  }
  if (!m.mesh.last_stage()) return x;
  m.comm.trace().unit_op(Phase::HeadLossForward, -1);
  m.phase(Phase::HeadLossForward);
  return head_loss(spec, rp, x, targets, m.tp_of(*root));
}

at::Tensor ShardedModel::forward_loss(const at::Tensor& tokens, const at::Tensor& targets) {
  FSDP_ASSERT(impl_->mesh.pp == 1, "forward_loss runs the whole model: a pipeline stage runs forward_stage");
  return forward_stage(tokens, targets, at::Tensor());
}

void ShardedModel::trace_micro_batch(int64_t k) { impl_->comm.trace().set_micro_batch(static_cast<int>(k)); }

void ShardedModel::backward(const at::Tensor& loss, bool sync) { backward_stage(loss, at::Tensor(), sync); }

void ShardedModel::backward_stage(const at::Tensor& out, const at::Tensor& grad, bool sync) {
  Impl& m = *impl_;
  m.sync = sync;
  m.root_backward_seen = false;
  m.comm.trace().set_micro_batch(m.bwd_micro_batch++);
  if (!grad.defined()) {
    m.comm.trace().unit_op(Phase::LossBackward, -1);
    m.phase(Phase::LossBackward);
  }
  m.in_backward = true;
  struct EndBackward {
    bool& flag;
    ~EndBackward() { flag = false; }
  } end_backward{m.in_backward};
  Unit* root = m.root_unit();
  if (root != nullptr && !m.mesh.first_stage()) m.pre_backward(*root);
  if (grad.defined())
    torch::autograd::backward({out}, {grad});
  else
    out.backward();
  m.flush_bucket();
  m.drain_pending();
  if (sync) m.micro_batch = m.bwd_micro_batch = 0;
  if (m.frozen) {
    // A frozen embedding needs no gradient, so autograd never reaches the root's pre-backward point: its
    // backward (nothing to compute) is where the backward ends, after the last layer unit is done.
    if (!m.root_backward_seen) {
      if (m.units.size() > 1) m.free_frozen(*m.units[1]);
      m.unit_op(Phase::Backward, *m.units[0]);
    }
    for (auto& up : m.units) m.free_frozen(*up);
    if (!sync) return;
    if (m.world > 1)
      m.mesh.dp_group
          ->all_reduce_sum(m.adapters.mutable_grad(), CollectiveTag{Phase::AdapterAllReduce, GroupKind::World, -1})
          .wait();
    m.adapters.mutable_grad().mul_(1.0 / static_cast<double>(m.world));
    return;
  }
  if (!sync) return;
  const double inv_world = 1.0 / static_cast<double>(m.world);
  for (auto& up : m.units) {
    Unit& u = *up;
    if (m.place.grads_sharded) {
      u.grad_shard.mul_(inv_world);
    } else {
      u.grad_full.mul_(inv_world);
    }
  }
}

at::Tensor ShardedModel::stage_input(int64_t rows, int64_t seq) const {
  const Impl& m = *impl_;
  const int64_t T = m.mesh.sequence_parallel ? seq / m.mesh.tp : seq;
  return at::empty({rows, T, m.spec.hidden_size}, at::TensorOptions().dtype(m.compute_dtype).device(m.device));
}

const Mesh& ShardedModel::mesh() const { return impl_->mesh; }

at::Device ShardedModel::device() const { return impl_->device; }

int64_t ShardedModel::model_param_count() const { return static_cast<int64_t>(impl_->defs.size()); }

double ShardedModel::clip_grad_norm(double max_norm) {
  Impl& m = *impl_;
  at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(m.device));
  if (m.frozen) {
    sq += m.adapters.grad().to(at::kDouble).pow(2).sum();
  } else {
    for (auto& up : m.units) sq += m.owned_grad_sq(*up);
    m.sum_over_mesh(sq, Phase::GradientNormAllReduce);
  }
  const double norm = std::sqrt(sq.item<double>());
  // torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), applied when < 1.
  constexpr double kClipEps = 1e-6;
  if (max_norm > 0) {
    const double coef = max_norm / (norm + kClipEps);
    if (coef < 1.0) {
      if (m.frozen)
        m.adapters.mutable_grad().mul_(coef);
      else
        for (auto& up : m.units) m.owned_grad(*up).mul_(coef);
    }
  }
  return norm;
}

void ShardedModel::scale_grads(double k) {
  if (impl_->frozen) {
    impl_->adapters.mutable_grad().mul_(k);
    return;
  }
  for (auto& up : impl_->units) impl_->owned_grad(*up).mul_(k);
}

bool ShardedModel::grads_nonfinite() {
  Impl& m = *impl_;
  at::Tensor bad = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(m.device));
  if (m.frozen) return at::logical_not(at::isfinite(m.adapters.grad())).any().item<bool>();
  for (auto& up : m.units) {
    at::Tensor g = m.owned_grad(*up);
    bad += at::logical_not(at::isfinite(g)).any().to(at::kFloat);
  }
  // torch/distributed/fsdp/sharded_grad_scaler.py _unscale_grads_: found_inf all-reduced over the group (and the
  // other ranks of the mesh, which hold other parameters).
  m.sum_over_mesh(bad, Phase::OverflowCheckAllReduce);
  return bad.item<float>() > 0;
}

void ShardedModel::optimizer_step(const OptimizerConfig& c, int64_t step) {
  Impl& m = *impl_;
  at::NoGradGuard ng;
  if (m.frozen) {  // LoRA: only the adapters train
    at::Tensor p = m.adapters;
    const at::Tensor& g = m.adapters.grad();
    if (c.kind == Optimizer::AdamW) {
      adamw_update(p, g, m.ad_exp_avg, m.ad_exp_avg_sq, c, step);
    } else {
      sgd_update(p, g, m.ad_momentum, c, step);
    }
    return;
  }
  for (auto& up : m.units) {
    Unit& u = *up;
    at::Tensor p = m.owned_param(u);
    at::Tensor g = m.owned_grad(u);
    if (m.place.master_on_host) {
      // Gradient shard copied down to the host, host step, updated shard copied up.
      at::Tensor gh = g.device().is_cpu() ? g : g.to(at::kCPU);
      if (c.kind == Optimizer::AdamW) {
        host_adamw_step(p, gh, u.exp_avg, u.exp_avg_sq, {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step});
      } else {
        sgd_update(p, gh, u.momentum, c, step);
      }
      if (u.dev_params.defined()) u.dev_params.copy_(p);
      continue;
    }
    if (c.kind == Optimizer::AdamW) {
      adamw_update(p, g, u.exp_avg, u.exp_avg_sq, c, step);
    } else {
      sgd_update(p, g, u.momentum, c, step);
    }
    if (m.place.optim_sharded && !m.place.params_sharded) {
      // ZeRO-1/2: every rank updated its slice of the replica; gather the others'.
      at::Tensor mine = p.clone();
      m.shard_group->all_gather(mine, u.master, m.tag(Phase::ParamAllGather, GroupKind::World, u)).wait();
    }
  }
}

void ShardedModel::zero_grad() {
  if (impl_->frozen) impl_->adapters.mutable_grad().zero_();
  for (auto& up : impl_->units) {
    if (up->grad_shard.defined()) up->grad_shard.zero_();
    if (up->grad_full.defined()) up->grad_full.zero_();
  }
}

namespace {

// The whole parameter `d` from every tp rank's slice (`mine` this rank's; `all_defs` every rank's definition of it):
// the slices padded to the largest, all-gathered over the tp group along the split dimension moved first, each laid
// at its place (kv heads held by several ranks land on the same place with the same values).
at::Tensor gather_tp(Group& g, const std::vector<const ParamDef*>& all_defs, const at::Tensor& mine) {
  const ParamDef& d = *all_defs[static_cast<std::size_t>(g.rank())];
  const auto dim = static_cast<std::size_t>(d.tp_dim);
  int64_t most = 0;
  for (const ParamDef* r : all_defs) most = std::max(most, r->shape[dim]);
  std::vector<int64_t> padded_shape = d.shape;
  padded_shape[dim] = most;
  at::Tensor piece = at::zeros(padded_shape, mine.options());
  piece.narrow(d.tp_dim, 0, mine.size(d.tp_dim)).copy_(mine);
  at::Tensor moved = piece.movedim(d.tp_dim, 0).contiguous();
  at::Tensor all = at::empty({g.size() * moved.numel()}, mine.options());
  g.all_gather(moved.view({-1}), all).wait();
  std::vector<int64_t> part_shape = moved.sizes().vec();
  at::Tensor full = at::zeros(d.whole_shape(), mine.options());
  for (int r = 0; r < g.size(); ++r) {
    const ParamDef& rd = *all_defs[static_cast<std::size_t>(r)];
    at::Tensor part = all.narrow(0, r * moved.numel(), moved.numel()).view(part_shape).movedim(0, d.tp_dim);
    full.narrow(d.tp_dim, rd.tp_start, rd.shape[dim]).copy_(part.narrow(d.tp_dim, 0, rd.shape[dim]));
  }
  return full;
}

}  // namespace

std::map<std::string, at::Tensor> ShardedModel::full_state_dict() {
  Impl& m = *impl_;
  std::map<std::string, at::Tensor> out;
  for (auto& up : m.units) {
    Unit& u = *up;
    at::Tensor full = u.master;
    if (m.place.params_sharded) {
      at::Tensor src = u.master.to(m.device);
      full = at::empty({u.info.padded}, src.options());
      m.shard_group->all_gather(src, full).wait();
    }
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
      const auto pid = static_cast<std::size_t>(u.param_ids[i]);
      const ParamDef& d = m.defs[pid];
      at::Tensor mine = full.narrow(0, u.offsets[i], d.numel()).view(d.shape);
      if (d.tp_dim >= 0) {
        std::vector<const ParamDef*> all_defs;
        for (const auto& rd : m.tp_defs) all_defs.push_back(&rd[pid]);
        mine = gather_tp(*m.mesh.tp_group, all_defs, mine);
      }
      out[d.name] = mine.clone().cpu();
    }
  }
  if (m.mesh.pp > 1) {
    // Every stage's parameters to every stage: each broadcast over the pp group from the stage holding it.
    for (const ParamDef& d : m.defs) {
      const bool embedding = d.name.rfind("model.embed_", 0) == 0;
      const int owner = d.layer >= 0 ? [&] {
        int st = 0;
        while (stage_layers(m.spec.num_layers, m.mesh.pp, st).second < d.layer) ++st;
        return st;
      }()
                                     : (embedding ? 0 : m.mesh.pp - 1);
      at::Tensor t = owner == m.mesh.pp_rank ? out.at(d.name).to(m.device)
                                             : at::empty(d.whole_shape(), at::TensorOptions().device(m.device));
      m.mesh.pp_group->broadcast(t, owner);
      out[d.name] = t.cpu();
    }
  }
  for (std::size_t i = 0; i < m.adapter_defs.size(); ++i)
    out[m.adapter_defs[i].name] = m.adapters.detach()
                                      .narrow(0, m.adapter_offsets[i], m.adapter_defs[i].numel())
                                      .view(m.adapter_defs[i].shape)
                                      .clone()
                                      .cpu();
  return out;
}

void ShardedModel::load_full_state(const std::map<std::string, at::Tensor>& params) {
  Impl& m = *impl_;
  at::NoGradGuard ng;
  for (auto& up : m.units) {
    Unit& u = *up;
    const int64_t mlo = m.place.params_sharded ? u.shard_offset : 0;
    const int64_t mhi = mlo + u.master.numel();
    for (std::size_t i = 0; i < u.param_ids.size(); ++i) {
      const ParamDef& d = m.defs[static_cast<std::size_t>(u.param_ids[i])];
      auto it = params.find(d.name);
      if (it == params.end()) throw InputError("weights: missing parameter " + d.name);
      if (it->second.sizes() != at::IntArrayRef(d.whole_shape()))
        throw InputError("weights: parameter " + d.name + " has shape " + c10::str(it->second.sizes()) +
                         ", the model expects " + c10::str(at::IntArrayRef(d.whole_shape())));
      // Copy only the part of the parameter that falls in this rank's range (its tensor-parallel slice, then its
      // shard), so a memory-mapped source is read only where this rank needs it.
      const at::Tensor src = tp_slice(d, it->second).contiguous().reshape({-1});
      const int64_t lo = u.offsets[i], hi = lo + d.numel();
      const int64_t a = std::max(lo, mlo), b = std::min(hi, mhi);
      if (a < b) u.master.narrow(0, a - mlo, b - a).copy_(src.narrow(0, a - lo, b - a));
    }
    if (u.dev_params.defined()) u.dev_params.copy_(u.master);
  }
  for (std::size_t i = 0; i < m.adapter_defs.size(); ++i) {  // base-only weights keep the adapters' init
    auto it = params.find(m.adapter_defs[i].name);
    if (it != params.end())
      m.adapters.detach().narrow(0, m.adapter_offsets[i], m.adapter_defs[i].numel()).copy_(it->second.reshape({-1}));
  }
}

std::map<std::string, at::Tensor> ShardedModel::local_state() {
  std::map<std::string, at::Tensor> s;
  for (auto& up : impl_->units) {
    Unit& u = *up;
    const std::string p = "unit" + std::to_string(u.index) + ".";
    s[p + "master"] = u.master;
    if (u.exp_avg.defined()) s[p + "exp_avg"] = u.exp_avg;
    if (u.exp_avg_sq.defined()) s[p + "exp_avg_sq"] = u.exp_avg_sq;
    if (u.momentum.defined()) s[p + "momentum"] = u.momentum;
  }
  if (impl_->frozen) {  // replicated: every rank saves the same
    s["adapters.params"] = impl_->adapters.detach();
    if (impl_->ad_exp_avg.defined()) s["adapters.exp_avg"] = impl_->ad_exp_avg;
    if (impl_->ad_exp_avg_sq.defined()) s["adapters.exp_avg_sq"] = impl_->ad_exp_avg_sq;
    if (impl_->ad_momentum.defined()) s["adapters.momentum"] = impl_->ad_momentum;
  }
  return s;
}

void ShardedModel::load_local_state(const std::map<std::string, at::Tensor>& state) {
  at::NoGradGuard ng;
  for (auto& [name, dst] : local_state()) {
    auto it = state.find(name);
    if (it == state.end()) throw InputError("checkpoint: missing tensor " + name);
    if (it->second.numel() != dst.numel()) throw InputError("checkpoint: tensor " + name + " has the wrong size");
    dst.copy_(it->second.reshape(dst.sizes()));
  }
  for (auto& up : impl_->units)
    if (up->dev_params.defined()) up->dev_params.copy_(up->master);
}

const std::vector<UnitInfo>& ShardedModel::units() const { return impl_->infos; }

const UnitInfo* ShardedModel::adapters() const { return impl_->frozen ? &impl_->adapter_info : nullptr; }

ShardLayout ShardedModel::layout() const {
  ShardLayout l;
  l.params_sharded = impl_->place.params_sharded;
  l.optim_sharded = impl_->place.optim_sharded;
  l.shard_group_size = impl_->shard_group->size();
  l.shard_rank = impl_->shard_group->rank();
  const Mesh& mesh = impl_->mesh;
  l.tp = mesh.tp;
  l.pp = mesh.pp;
  l.dp = mesh.dp;
  l.tp_rank = mesh.tp_rank;
  l.pp_rank = mesh.pp_rank;
  l.dp_rank = mesh.dp_rank;
  return l;
}

int64_t ShardedModel::num_params() const {
  int64_t n = 0;
  for (auto& u : impl_->infos) n += u.numel;
  return n;
}

bool ShardedModel::comm_upcast() const {
  const Mesh& mesh = impl_->mesh;
  return impl_->comm.world().upcast_happened() || impl_->shard_group->upcast_happened() ||
         (impl_->replica_group && impl_->replica_group->upcast_happened()) || mesh.dp_group->upcast_happened() ||
         mesh.tp_group->upcast_happened() || mesh.kv_group->upcast_happened();
}

}  // namespace fsdp::exec
