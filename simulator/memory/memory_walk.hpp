// Replays a step program's allocations and frees in issue order and records the
// peak (allocated), the phase and unit where it happens, and the category mix
// at that moment; then adds what lies outside the allocator's counters.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "hardware/hardware_profile.hpp"
#include "memory/memory_category.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"

namespace fsdp {

using MemoryBreakdown = std::array<double, kNumMemoryCategories>;

struct MemorySample {
  int op = -1;  // op index the sample was taken in
  double allocated = 0;
};

struct MemoryResult {
  double peak_allocated = 0;  // max over the walk of allocator-managed bytes (torch max_memory_allocated)
  // The same when every backend gather buffer (Op::backend_buffer_bytes: Gloo's flat all-gather output) ends before
  // the compute it overlaps peaks; peak_allocated counts each one until its consumer waits. Which of the two a run
  // sees is a race between Gloo's worker thread and the rank's compute (tests/accuracy grid row 15 on 2 cores:
  // the floor in 5 runs of 6, the bound in 1), so the bound is what must fit and the pair is what a measurement
  // is checked against. Equal to peak_allocated when the program has no backend buffers (every CUDA program).
  double peak_allocated_floor = 0;
  // The most allocated from the end of the last backward (its compute and post-backward hooks) to the step's end: the
  // gradient reductions still in flight, the norm, the optimizer and ZeRO's parameter gather (what a
  // max_memory_allocated() read after torch.cuda.reset_peak_memory_stats() at the end of the micro-batches sees;
  // nanotron's "Mem Alloc").
  double peak_allocated_after_backward = 0;
  double reserved_peak = 0;     // peak_allocated + fragmentation (torch max_memory_reserved)
  double device_total = 0;      // reserved + CUDA context/workspace + NCCL: what must fit on the GPU
  MemoryBreakdown breakdown{};  // category -> bytes at the peak (fragmentation, nccl, workspace included)
  std::string peak_phase;       // e.g. "backward layers.31 (micro-batch 1)"
  int peak_op = -1;
  double host_bytes_per_node = 0;
  std::vector<MemorySample> samples;  // allocated bytes after each op's issue (for the trace counter)
  // Of the fragmentation: the reduce stream pool's cached sharded-gradient blocks (RuntimeProfile::
  // sharded_grads_in_reduce_stream_pool), reserved and not allocated at the peak.
  double reduce_pool_cached = 0;
  // Of the fragmentation: the segments the caching allocator adds in the step window (after the last backward) for
  // blocks larger than any the micro-batches allocated (memory_walk.cpp, step segments; Op::largest_block_bytes).
  // The reserved peak is at least the micro-batches' reserved peak plus these. 0 on a CPU run.
  double step_segments = 0;
  // Of the fragmentation: the collectives' recorded inputs (Op::stream_recorded_bytes) the caching allocator still
  // holds at the moment reserved memory peaks (RuntimeProfile::collective_inputs_held_for_the_pass), where that moment
  // sets the reserved peak; else 0.
  double collective_inputs_held = 0;
  bool capped_at_device = false;  // cap_reserved_at_device lowered the fragmentation to what the device holds
};

// `cuda`: the device has a CUDA context, NCCL buffers and a caching allocator (fragmentation). On CPU
// (Gloo, the plain allocator that fsdp-run's counting wrapper measures) none of the three exists.
// `samples`: record MemoryResult::samples (the trace's counter); without them every other field is the same, bit for
// bit (the planner's search, which keeps no per-op detail, skips them).
MemoryResult walk_memory(const StepProgram& program, const RuntimeProfile& runtime, int64_t ranks_per_node,
                         bool cuda = true, bool samples = true);

// The caching allocator's miss path, when cudaMalloc fails: it returns every unsplit cached block to CUDA and
// retries (c10/cuda/CUDACachingAllocator.cpp malloc -> release_cached_blocks -> alloc_block(isRetry)), so reserved
// memory never exceeds what the device gives while what is allocated fits: a step whose allocated peak fits in
// `device_bytes` (the device's usable memory) runs with reserved at most device_bytes less the CUDA context and the
// NCCL buffers. Lowers the fragmentation (and reserved_peak, device_total) to that; sets capped_at_device.
void cap_reserved_at_device(MemoryResult& r, double device_bytes);

}  // namespace fsdp

namespace fsdp {

// Model states of a step program, by category: what is allocated before the step plus the gradient
// storage the step accumulates (the footprint the ZeRO paper and DeepSpeed's estimators count).
MemoryBreakdown model_state_bytes(const StepProgram& program);
double total(const MemoryBreakdown& b);

}  // namespace fsdp
