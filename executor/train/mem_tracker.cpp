#include "train/mem_tracker.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <unordered_map>

#include "core/errors.hpp"

#if defined(FSDP_EXEC_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace fsdp::exec {
namespace {

// Live allocations and their sizes. The DataPtr's context is the data pointer itself
// (as the default CPU allocator does), so raw_allocate()/raw_deleter() keep working.
std::mutex g_sizes_mu;
std::unordered_map<void*, int64_t>& sizes() {
  static std::unordered_map<void*, int64_t> m;
  return m;
}
c10::DeleterFnPtr g_inner_raw_deleter = nullptr;

void counted_delete(void* p) {
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(g_sizes_mu);
    auto it = sizes().find(p);
    if (it != sizes().end()) {
      n = it->second;
      sizes().erase(it);
    }
  }
  MemTracker::instance().on_free(n);
  g_inner_raw_deleter(p);
}

// c10::Allocator changed in LibTorch 2.3: allocate() lost its const and copy_data()
// became pure virtual (c10/core/Allocator.h).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define FSDP_ALLOCATE_CONST
#define FSDP_HAS_COPY_DATA 1
#else
#define FSDP_ALLOCATE_CONST const
#define FSDP_HAS_COPY_DATA 0
#endif

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) FSDP_ALLOCATE_CONST override {
    if (n == 0) return {nullptr, nullptr, &counted_delete, c10::Device(c10::DeviceType::CPU)};
    void* p = inner_->raw_allocate(n);
    {
      std::lock_guard<std::mutex> lock(g_sizes_mu);
      sizes()[p] = static_cast<int64_t>(n);
    }
    MemTracker::instance().on_alloc(static_cast<int64_t>(n));
    return {p, p, &counted_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
#if FSDP_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif

 private:
  c10::Allocator* inner_;
};

}  // namespace

MemTracker& MemTracker::instance() {
  static MemTracker t;
  return t;
}

void MemTracker::install_cpu() {
  std::lock_guard<std::mutex> lock(mu_);
  if (installed_) return;
  c10::Allocator* inner = c10::GetCPUAllocator();
  g_inner_raw_deleter = inner->raw_deleter();
  FSDP_ASSERT(g_inner_raw_deleter != nullptr, "the CPU allocator has no raw deleter");
  static CountingAllocator alloc(inner);
  // Priority above the default registration (0) so later SetCPUAllocator calls at 0 do not undo it.
  c10::SetCPUAllocator(&alloc, /*priority=*/10);
  installed_ = true;
}

void MemTracker::use_cuda(int device_index) { cuda_device_ = device_index; }

void MemTracker::snapshot_locked(int64_t cur) {
  peak_ = cur;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) peak_tags_[i] = tags_[i].load();
  peak_in_compute_ = in_compute_.load();
  peak_phase_ = phase_;
}

void MemTracker::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = &*phases_.insert(phase).first;
}

std::string MemTracker::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_ != nullptr ? *phase_ : std::string();
}

std::string MemTracker::peak_phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_phase_ != nullptr ? *peak_phase_ : std::string();
}

void MemTracker::on_alloc(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  current_ += n;
  if (current_ > peak_) snapshot_locked(current_);
}

void MemTracker::on_free(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  current_ -= n;
}

void MemTracker::tag(MemoryCategory c, int64_t delta) {
  tags_[static_cast<std::size_t>(c)].fetch_add(delta);
#if defined(FSDP_EXEC_CUDA)
  if (cuda_device_ >= 0) {
    // No allocation hook on CUDA: sample the tags whenever they change at a new peak.
    std::lock_guard<std::mutex> lock(mu_);
    int64_t cur = current();
    if (cur > peak_) snapshot_locked(cur);
  }
#endif
}

int64_t MemTracker::current() const {
#if defined(FSDP_EXEC_CUDA)
  if (cuda_device_ >= 0) {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_);
    return s.allocated_bytes[0].current;  // StatType::AGGREGATE
  }
#endif
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

int64_t MemTracker::peak() const {
#if defined(FSDP_EXEC_CUDA)
  if (cuda_device_ >= 0) {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device_);
    return s.allocated_bytes[0].peak;
  }
#endif
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void MemTracker::reset_peak() {
#if defined(FSDP_EXEC_CUDA)
  if (cuda_device_ >= 0) c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_device_);
#endif
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_locked(current_);
}

std::array<int64_t, kNumMemoryCategories> MemTracker::peak_breakdown() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::array<int64_t, kNumMemoryCategories> out = peak_tags_;
  int64_t tagged = 0;
  for (auto v : out) tagged += v;
  const int64_t rest = std::max<int64_t>(0, peak_ - tagged);
  out[static_cast<std::size_t>(peak_in_compute_ ? MemoryCategory::Activations : MemoryCategory::Transient)] += rest;
  return out;
}

}  // namespace fsdp::exec
