#include "memory/memory_walk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/errors.hpp"

namespace fsdp {

namespace {

size_t idx(MemoryCategory c) { return static_cast<size_t>(c); }

// The walk's books in exact bytes (no allocator rounding), kept beside the rounded counters: no category
// may go below zero at any point, and the step must end where it began (every allocation of the step
// freed once), else an emitter lost or doubled an event. Both are bugs, hence assertions. The tolerance
// absorbs floating-point summation only: a billionth of the bytes the step moves, plus one byte.
class Ledger {
 public:
  void apply(const MemEvent& e, const StepProgram& p, size_t op) {
    cur_[idx(e.category)] += e.bytes;
    moved_ += std::fabs(e.bytes);
    if (cur_[idx(e.category)] < -tolerance())
      fail(p, op,
           std::string("memory category ") + std::string(to_string(e.category)) + " goes negative (" +
               std::to_string(cur_[idx(e.category)]) + " bytes)");
  }
  void persistent(const MemEvent& e) {
    cur_[idx(e.category)] += e.bytes;
    start_[idx(e.category)] += e.bytes;
  }
  void check_balanced(const StepProgram& p) const {
    for (size_t c = 0; c < kNumMemoryCategories; ++c)
      if (std::fabs(cur_[c] - start_[c]) > tolerance())
        fail(p, p.ops.size(),
             std::string("the step ends unbalanced: ") + std::string(kMemoryCategoryNames[c]) + " holds " +
                 std::to_string(cur_[c] - start_[c]) + " bytes more than before it");
  }

 private:
  double tolerance() const { return 1e-9 * moved_ + 1.0; }
  [[noreturn]] static void fail(const StepProgram& p, size_t op, const std::string& what) {
    const std::string where =
        op < p.ops.size() ? " at op " + std::to_string(op) + " (" + op_phase(p, p.ops[op]) + ")" : "";
    assertion_failed("memory walk", __FILE__, __LINE__, what + where);
  }
  MemoryBreakdown cur_{}, start_{};
  double moved_ = 0;
};

// The caching allocator rounds every block up (c10/cuda/CUDACachingAllocator.cpp round_size: multiples of
// kMinBlockSize = 512 bytes). Applied per event; events are whole tensors or flat buffers.
double rounded(double bytes, double rounding) {
  if (rounding <= 1) return bytes;
  double sign = bytes < 0 ? -1.0 : 1.0;
  return sign * std::ceil(std::fabs(bytes) / rounding) * rounding;
}

// The segment the caching allocator cudaMallocs for a request of `bytes` it cannot serve from its cache
// (c10/cuda/CUDACachingAllocator.cpp get_allocation_size): up to kSmallSize (1 MiB) a 2 MiB small-pool segment
// (kSmallBuffer), below kMinLargeAlloc (10 MiB) a 20 MiB one (kLargeBuffer), else the request rounded up to
// kRoundLarge (2 MiB).
double segment_bytes(double bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (bytes <= 1.0 * kMiB) return 2.0 * kMiB;
  if (bytes < 10.0 * kMiB) return 20.0 * kMiB;
  return std::ceil(bytes / (2.0 * kMiB)) * 2.0 * kMiB;
}

// `backend_buffers_until_waited`: a backend's gather buffer (Op::backend_buffer_bytes) lives from the gather's
// issue until its consumer waits (the bound), or only while the gather op itself is walked (the floor).
MemoryResult walk(const StepProgram& p, const RuntimeProfile& rt, int64_t ranks_per_node, bool cuda,
                  bool backend_buffers_until_waited, bool samples) {
  MemoryResult r;
  MemoryBreakdown cur{};
  const double round_to = cuda ? rt.allocation_rounding.value : 1.0;
  Ledger ledger;
  // The categories some event has changed (a bit each; Transient always counts): the others hold exactly +0.0
  // throughout, and the per-op total below skips them. Exact: the running sum starts at +0.0 and a rounded sum is
  // -0.0 only where both terms are, so it is never -0.0, and s + (+0.0) == s for every s that is not -0.0.
  uint32_t touched = 1u << idx(MemoryCategory::Transient);
  auto touch = [&](MemoryCategory c) { touched |= 1u << idx(c); };
  // The per-op total's partial sum over the categories before Transient (below): recomputed only after an event has
  // changed one of them (or touched one). Exact: it is the same sum of the same values in the same order that the
  // full loop forms before it reaches Transient, so the total is the same double.
  constexpr size_t kTransient = static_cast<size_t>(MemoryCategory::Transient);
  double before_transient = 0;
  bool before_transient_stale = true;
  for (const MemEvent& e : p.persistent) {
    cur[idx(e.category)] += rounded(e.bytes, round_to);
    touch(e.category);
    ledger.persistent(e);
  }
  // On a CPU run the "host" and the device are the same memory: offloaded state counts too.
  if (!cuda)
    for (const MemEvent& e : p.host_persistent) {
      cur[idx(e.category)] += e.bytes;
      touch(e.category);
    }
  auto total = [](const MemoryBreakdown& b) {
    double t = 0;
    for (double v : b) t += v;
    return t;
  };
  double persistent_total = total(cur);
  // The reduce stream's pool (RuntimeProfile::sharded_grads_in_reduce_stream_pool): the sharded gradients the step
  // allocates, live now and at most; in the steady state the pool keeps its most from the step before.
  const bool rs_pool = cuda && rt.sharded_grads_in_reduce_stream_pool;
  double rs_live = 0, rs_most = 0, rs_live_at_peak = 0;
  r.peak_allocated = persistent_total;
  r.breakdown = cur;
  r.peak_phase = "before the step";
  // Gradient reductions run asynchronously: what a reduce-scatter or all-reduce releases when it
  // completes is released only after the compute op issued next has run (FSDP keeps one reduction in
  // flight and waits for it at the next post-backward), so its buffers coexist with that compute.
  // An all-gather is waited for (and its staging copied out and released) right before the first
  // compute op that depends on it: a prefetched unit's staging coexists with the compute issued
  // meanwhile (FSDP2 wait_for_unshard in the consumer's pre-forward; fsdp-run's wait_unsharded).
  if (samples) r.samples.reserve(p.ops.size());
  // The step window (MemoryResult::step_segments): the ops after the last backward compute or post-backward hook,
  // where one of them states its largest tensor (Op::largest_block_bytes; an op that does not, an optimizer's
  // temporaries over every parameter, is assumed to fit the cache), else none (and none on a CPU run). Before it, the
  // largest block allocated: each allocation event's bytes and each op's working memory, an upper bound of the largest
  // tensor where they sum several, so that no segment below is counted that the cache could hold. In it, the ops
  // whose stated tensor is larger: their segments, live now and at most.
  size_t step_window = 0;
  double largest_before_window = 0, step_segments_live = 0, step_segments_most = 0;
  double peak_before_window = persistent_total;
  if (cuda)
    for (size_t i = p.ops.size(); i-- > 0;)
      if (p.ops[i].kind == OpKind::Backward || p.ops[i].phase == Phase::PostBackward) {
        for (size_t k = i + 1; k < p.ops.size(); ++k)
          if (p.ops[k].largest_block_bytes > 0) step_window = i + 1;
        break;
      }
  for (size_t i = 0; i < step_window; ++i) {
    const Op& o = p.ops[i];
    largest_before_window = std::max({largest_before_window, o.transient_bytes, o.backend_buffer_bytes});
    // A pipeline transfer's events sum many tensors (StepProgram::pipeline_transfer_tensor_bound bounds them).
    const double bound = o.kind == OpKind::PipelineTransfer ? p.pipeline_transfer_tensor_bound : 0.0;
    for (const MemEvent& e : o.on_issue)
      largest_before_window = std::max(largest_before_window, bound > 0 ? std::min(e.bytes, bound) : e.bytes);
    for (const MemEvent& e : o.on_complete) largest_before_window = std::max(largest_before_window, e.bytes);
  }
  auto step_segment = [&](const Op& o, double sign) {
    if (step_window == 0 || o.largest_block_bytes <= 0 || static_cast<size_t>(&o - p.ops.data()) < step_window) return;
    if (rounded(o.largest_block_bytes, round_to) <= rounded(largest_before_window, round_to)) return;
    step_segments_live = std::max(0.0, step_segments_live + sign * segment_bytes(o.largest_block_bytes));
    step_segments_most = std::max(step_segments_most, step_segments_live);
  };
  // The collectives' recorded inputs (RuntimeProfile::collective_inputs_held_for_the_pass): held from their
  // collective's issue until the walk leaves the pass (a micro-batch's forward, or its backward) that issued it. Each
  // op's allocated bytes plus what is held then, plus the fragmentation of its dynamic memory, bounds the reserved
  // peak from below; the most of it, and what was held then.
  const bool hold_recorded = cuda && rt.collective_inputs_held_for_the_pass;
  double held = 0, held_reserved_most = 0, held_at_most = 0;
  int held_micro_batch = -1;
  bool held_backward = false;
  auto backward_pass = [](const Op& o) {
    return o.kind == OpKind::Backward || o.kind == OpKind::LossBackward || o.phase == Phase::PostBackward ||
           o.phase == Phase::TpBackwardCollectives;
  };
  std::vector<const Op*> pending;
  std::vector<int> gathers_open;
  auto apply = [&](const MemEvent& e, const Op& o) {
    cur[idx(e.category)] += rounded(e.bytes, round_to);
    touch(e.category);
    if (idx(e.category) < kTransient) before_transient_stale = true;
    if (rs_pool && e.category == MemoryCategory::ShardedGrads) {
      rs_live += rounded(e.bytes, round_to);
      rs_most = std::max(rs_most, rs_live);
    }
    ledger.apply(e, p, static_cast<size_t>(&o - p.ops.data()));
  };
  auto complete = [&](const Op& o) {
    for (const MemEvent& e : o.on_complete) apply(e, o);
    step_segment(o, -1.0);
    if (backend_buffers_until_waited) cur[idx(MemoryCategory::Transient)] -= rounded(o.backend_buffer_bytes, round_to);
  };
  auto flush_pending = [&] {
    for (const Op* o : pending) complete(*o);
    pending.clear();
  };
  auto wait_gathers_of = [&](const Op& consumer) {
    for (int d : consumer.deps) {
      auto it = std::find(gathers_open.begin(), gathers_open.end(), d);
      if (it == gathers_open.end()) continue;
      complete(p.ops[static_cast<size_t>(d)]);
      gathers_open.erase(it);
    }
  };
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (op.stream == Stream::Compute) wait_gathers_of(op);
    if (op.kind == OpKind::Gather) {
      // A prefetch is issued from the next compute op's pre-forward (pre-backward) hook, after that op
      // has waited for its own unit's gather.
      for (size_t k = i + 1; k < p.ops.size(); ++k)
        if (p.ops[k].stream == Stream::Compute && p.ops[k].kind != OpKind::Reshard) {
          wait_gathers_of(p.ops[k]);
          break;
        }
    }
    if (op.after_all_comm) flush_pending();  // the optimizer waits for every reduction
    // The end of a micro-batch's backward waits for its reductions (FSDP2's root post-backward final
    // callback, torch/distributed/fsdp/_fully_shard/_fsdp_state.py; fsdp-run's ShardedModel::backward).
    if (i > 0 && op.micro_batch != p.ops[i - 1].micro_batch) flush_pending();
    if (hold_recorded && op.stream == Stream::Compute &&
        (op.micro_batch != held_micro_batch || backward_pass(op) != held_backward))
      held = 0;  // a new pass: the GPU has run the last one's collectives
    if (hold_recorded && op.stream_recorded_bytes > 0) {
      if (held == 0) {
        held_micro_batch = op.micro_batch;
        held_backward = backward_pass(op);
      }
      held += rounded(op.stream_recorded_bytes, round_to);
    }
    for (const MemEvent& e : op.on_issue) apply(e, op);
    step_segment(op, 1.0);
    if (backend_buffers_until_waited) cur[idx(MemoryCategory::Transient)] += rounded(op.backend_buffer_bytes, round_to);
    // The op's bytes: what is allocated, its working memory (Transient) and, where it lives only while the gather
    // is walked, the backend's buffer; summed over the categories in order, as total() does, but for those no event
    // has touched (+0.0, above). The breakdown is copied out only at a new peak.
    double transient_now = cur[kTransient];
    transient_now += rounded(op.transient_bytes, round_to);
    if (!backend_buffers_until_waited) transient_now += rounded(op.backend_buffer_bytes, round_to);
    if (before_transient_stale) {
      before_transient = 0;
      for (size_t c = 0; c < kTransient; ++c)
        if ((touched >> c) & 1u) before_transient += cur[c];
      before_transient_stale = false;
    }
    double t = before_transient;
    t += transient_now;
    for (size_t c = kTransient + 1; c < kNumMemoryCategories; ++c)
      if ((touched >> c) & 1u) t += cur[c];
    if (samples) r.samples.push_back(MemorySample{static_cast<int>(i), t});
    // The micro-batches end with the last backward compute or post-backward hook (the autograd engine's final
    // callbacks run inside loss.backward()): the window after it starts over at each of them.
    if (op.kind == OpKind::Backward || op.phase == Phase::PostBackward)
      r.peak_allocated_after_backward = 0;
    else
      r.peak_allocated_after_backward = std::max(r.peak_allocated_after_backward, t);
    if (i < step_window) peak_before_window = std::max(peak_before_window, t);
    if (held > 0) {
      const double reserved_now = t + held + rt.fragmentation_fraction * std::max(0.0, t - persistent_total);
      if (reserved_now > held_reserved_most) {
        held_reserved_most = reserved_now;
        held_at_most = held;
      }
    }
    if (t > r.peak_allocated) {
      r.peak_allocated = t;
      r.breakdown = cur;
      r.breakdown[kTransient] = transient_now;
      r.peak_op = static_cast<int>(i);
      rs_live_at_peak = rs_live;
    }
    if (op.stream == Stream::ReduceScatter) {
      pending.push_back(&op);
      continue;
    }
    if (op.kind == OpKind::Gather) {
      gathers_open.push_back(static_cast<int>(i));
      continue;
    }
    for (const MemEvent& e : op.on_complete) apply(e, op);
    step_segment(op, -1.0);
    // A reduction issued just before this compute op stays pending until the next one.
    if (op.stream == Stream::Compute && op.kind != OpKind::Reshard) flush_pending();
  }
  flush_pending();
  for (int g : gathers_open) complete(p.ops[static_cast<size_t>(g)]);
  ledger.check_balanced(p);
  if (r.peak_op >= 0) {
    const Op& op = p.ops[static_cast<size_t>(r.peak_op)];
    r.peak_phase = op_phase(p, op);
  }
  // Allocator rounding of a free that sums several allocations may leave a category a few rounding units
  // below zero in the rounded counters; the exact ledger above has checked the books.
  for (double& v : r.breakdown) v = std::max(0.0, v);
  // Fragmentation: blocks freed within the step stay cached and are not always reusable for differently
  // sized requests; modelled as a fraction of the step's dynamic (non-persistent) memory at the peak.
  double dynamic = std::max(0.0, r.peak_allocated - persistent_total);
  double frag = cuda ? rt.fragmentation_fraction * dynamic : 0.0;
  // What the reduce stream's pool holds beyond its live gradients at the peak: cached, unusable by compute.
  if (rs_pool) {
    r.reduce_pool_cached = std::max(0.0, rs_most - rs_live_at_peak);
    frag += r.reduce_pool_cached;
  }
  // Step segments: a block the step window allocates that is larger than every block the micro-batches cached
  // cannot be carved from the cache (get_free_block finds no cached block of the stream's pool at least its size,
  // and blocks of different segments never merge), so the allocator cudaMallocs a segment of its own (alloc_block)
  // and keeps it cached when it is freed: reserved memory grows by those segments over what the micro-batches
  // reserved (their allocated peak and its fragmentation). The next step's micro-batches split them for their own
  // blocks, so they add once. nanotron's ZeRO-1 parameter gather: c10d's flat output of the whole replica is larger
  // than the micro-batches' largest block (the fp32 logits) where the micro-batch is small.
  if (step_segments_most > 0) {
    r.step_segments = step_segments_most;
    const double before =
        peak_before_window + rt.fragmentation_fraction * std::max(0.0, peak_before_window - persistent_total);
    frag = std::max(frag, before + step_segments_most - r.peak_allocated);
  }
  // The collectives' held inputs: the allocator serves the pass's later blocks with segments beside them, so reserved
  // memory is at least the allocated bytes, the held ones and the fragmentation of that moment.
  if (held_reserved_most > r.peak_allocated + frag) {
    frag = held_reserved_most - r.peak_allocated;
    r.collective_inputs_held = held_at_most;
  }
  r.reserved_peak = r.peak_allocated + frag;
  r.breakdown[idx(MemoryCategory::Fragmentation)] = frag;
  double nccl = cuda ? rt.nccl_memory_per_communicator.value * p.communicators : 0.0;
  r.breakdown[idx(MemoryCategory::Nccl)] = nccl;
  const double context = cuda ? rt.context_memory.value : 0.0;
  r.breakdown[idx(MemoryCategory::Workspace)] += context;
  r.device_total = r.reserved_peak + nccl + context;
  r.host_bytes_per_node = (p.host_bytes_per_rank + p.pinned_bytes_per_rank) * static_cast<double>(ranks_per_node);
  r.peak_allocated_floor = r.peak_allocated;
  return r;
}

}  // namespace

MemoryResult walk_memory(const StepProgram& p, const RuntimeProfile& rt, int64_t ranks_per_node, bool cuda,
                         bool samples) {
  MemoryResult r = walk(p, rt, ranks_per_node, cuda, true, samples);
  const bool racing = std::any_of(p.ops.begin(), p.ops.end(), [](const Op& o) { return o.backend_buffer_bytes > 0; });
  if (racing) r.peak_allocated_floor = walk(p, rt, ranks_per_node, cuda, false, false).peak_allocated;
  return r;
}

void cap_reserved_at_device(MemoryResult& r, double device_bytes) {
  const size_t frag = static_cast<size_t>(MemoryCategory::Fragmentation);
  const double outside = r.device_total - r.reserved_peak;  // context and NCCL: outside the allocator
  const double room = device_bytes - outside;
  if (r.reserved_peak <= room || r.peak_allocated > room) return;
  const double cut = r.reserved_peak - room;
  r.breakdown[frag] = std::max(0.0, r.breakdown[frag] - cut);
  r.reserved_peak = room;
  r.device_total = device_bytes;
  r.capped_at_device = true;
}

}  // namespace fsdp

namespace fsdp {

MemoryBreakdown model_state_bytes(const StepProgram& p) {
  MemoryBreakdown b{};
  for (const MemEvent& e : p.persistent) b[static_cast<size_t>(e.category)] += e.bytes;
  // Gradient storage the step allocates: the most sharded gradient alive at once, and the full
  // (unsharded) gradients still alive when the optimizer (or the copy to the host) starts.
  double sharded = 0, max_sharded = 0, unsharded = 0, unsharded_at_step = 0;
  for (const Op& op : p.ops) {
    for (const MemEvent& e : op.on_issue) {
      if (e.category == MemoryCategory::ShardedGrads) sharded += e.bytes;
      if (e.category == MemoryCategory::UnshardedGrads) unsharded += e.bytes;
    }
    max_sharded = std::max(max_sharded, sharded);
    if (op.kind == OpKind::OptimizerStep || op.kind == OpKind::HostOptimizerStep)
      unsharded_at_step = std::max(unsharded_at_step, unsharded);
    for (const MemEvent& e : op.on_complete) {
      if (e.category == MemoryCategory::ShardedGrads) sharded += e.bytes;
      if (e.category == MemoryCategory::UnshardedGrads) unsharded += e.bytes;
    }
  }
  b[static_cast<size_t>(MemoryCategory::ShardedGrads)] += max_sharded;
  b[static_cast<size_t>(MemoryCategory::UnshardedGrads)] += unsharded_at_step;
  return b;
}

double total(const MemoryBreakdown& b) {
  double t = 0;
  for (double v : b) t += v;
  return t;
}

}  // namespace fsdp
