// Measured memory: a counting wrapper around c10's CPU allocator (installed with
// c10::SetCPUAllocator), or the CUDA caching allocator's statistics. The executor
// tags the buffers it owns by category (memory/memory_category.hpp); at every new
// peak the tags are snapshotted, and the untagged rest of the peak is attributed
// to activations (forward/backward) or transient (elsewhere).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "memory/memory_category.hpp"

namespace fsdp::exec {

class MemTracker {
 public:
  static MemTracker& instance();

  // Installs the counting CPU allocator (idempotent). Tensors created before
  // are not counted (they keep their own deleters).
  void install_cpu();
  // Use the CUDA caching allocator's statistics for `device_index` instead.
  void use_cuda(int device_index);

  int64_t current() const;
  int64_t peak() const;
  void reset_peak();

  // Executor bookkeeping: bytes of buffers in a category (positive: allocate,
  // negative: free). Tag before allocating and after freeing, so that a peak
  // reached by the allocation itself is attributed.
  void tag(MemoryCategory c, int64_t delta_bytes);
  // True while forward/backward run (the untagged rest counts as activations).
  void set_in_compute(bool v) { in_compute_.store(v); }
  // What the executor is doing ("forward layers.2 (micro-batch 1)", "optimizer step"), in
  // the simulator's peak_phase vocabulary; the phase at the recorded peak is reported.
  void set_phase(const std::string& phase);
  std::string peak_phase() const;
  std::string phase() const;
  // Category bytes at the recorded peak; untagged bytes are in activations or transient.
  std::array<int64_t, kNumMemoryCategories> peak_breakdown() const;

  void on_alloc(int64_t n);
  void on_free(int64_t n);

 private:
  MemTracker() = default;
  void snapshot_locked(int64_t cur);
  mutable std::mutex mu_;
  int64_t current_ = 0;
  int64_t peak_ = 0;
  bool installed_ = false;
  int cuda_device_ = -1;
  std::array<std::atomic<int64_t>, kNumMemoryCategories> tags_{};
  std::array<int64_t, kNumMemoryCategories> peak_tags_{};
  bool peak_in_compute_ = false;
  std::set<std::string> phases_;  // interned: nodes are stable, the snapshot keeps a pointer
  const std::string* phase_ = nullptr;
  const std::string* peak_phase_ = nullptr;
  std::atomic<bool> in_compute_{false};
};

// The bytes of one executor buffer in a category, tagged for as long as the MemTag holds them (RAII): made
// before the buffer is allocated, reset (or destroyed) after it is freed, so that a tag cannot be dropped or
// doubled on an early return or an exception. Moves carry the tag; copies are not allowed.
class MemTag {
 public:
  MemTag() = default;
  MemTag(MemTracker& tracker, MemoryCategory category, int64_t bytes)
      : tracker_(&tracker), category_(category), bytes_(bytes) {
    if (bytes_ != 0) tracker_->tag(category_, bytes_);
  }
  MemTag(MemTag&& o) noexcept : tracker_(o.tracker_), category_(o.category_), bytes_(o.bytes_) { o.bytes_ = 0; }
  MemTag& operator=(MemTag&& o) noexcept {
    if (this != &o) {
      reset();
      tracker_ = o.tracker_;
      category_ = o.category_;
      bytes_ = o.bytes_;
      o.bytes_ = 0;
    }
    return *this;
  }
  MemTag(const MemTag&) = delete;
  MemTag& operator=(const MemTag&) = delete;
  ~MemTag() { reset(); }
  void reset() {
    if (bytes_ != 0 && tracker_ != nullptr) tracker_->tag(category_, -bytes_);
    bytes_ = 0;
  }
  int64_t bytes() const { return bytes_; }

 private:
  MemTracker* tracker_ = nullptr;
  MemoryCategory category_ = MemoryCategory::Transient;
  int64_t bytes_ = 0;
};

}  // namespace fsdp::exec
