#include "dist/device.hpp"

#include <ATen/Parallel.h>
#include <sched.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/errors.hpp"
#include "train/mem_tracker.hpp"

#if defined(FSDP_EXEC_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace fsdp::exec {

std::string select_device(const std::string& plan_device, int local_rank) {
  if (plan_device == "cpu") {
    configure_host_allocator();
    MemTracker::instance().install_cpu();
    return "cpu";
  }
  if (plan_device != "cuda") throw InputError("plan cluster.device must be cpu or cuda, not '" + plan_device + "'");
#if defined(FSDP_EXEC_CUDA)
  const int n = static_cast<int>(c10::cuda::device_count());
  if (local_rank >= n)
    throw InputError("LOCAL_RANK " + std::to_string(local_rank) + " but this node has " + std::to_string(n) +
                     " CUDA devices");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
  MemTracker::instance().use_cuda(local_rank);
  return "cuda:" + std::to_string(local_rank);
#else
  (void)local_rank;
  throw InputError("the plan asks for device cuda, but this fsdp-run was built against a CPU-only LibTorch");
#endif
}

namespace {
// What configure_host_allocator() did in this process; empty until it has run (it runs once).
std::string host_allocator_note;
}  // namespace

std::string configure_host_allocator() {
  if (!host_allocator_note.empty()) return host_allocator_note;
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if ((tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) ||
      std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    host_allocator_note = "glibc malloc: as the environment sets it";
  } else {
    constexpr int kMmapThreshold = 32 << 20;  // DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (mallopt(3))
    constexpr int kTrimThreshold = 1 << 30;
    const bool ok = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
    host_allocator_note = ok ? "glibc malloc: mmap threshold 32 MiB, trim threshold 1 GiB"
                             : "glibc malloc: mallopt refused the thresholds; its defaults";
  }
#else
  host_allocator_note = "the C library's allocator, as it is";
#endif
  return host_allocator_note;
}

std::string host_allocator_policy() {
  return host_allocator_note.empty() ? std::string("the C library's allocator, not configured") : host_allocator_note;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

int configure_cpu_threads(int local_world_size) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env != nullptr && *env != '\0') return at::get_num_threads();
  const int threads = std::max(1, available_cpus() / std::max(1, local_world_size));
  at::set_num_threads(threads);
  return threads;
}

bool cpu_busy_poll(int local_world_size, int threads_per_rank) {
  return std::max(1, local_world_size) * std::max(1, threads_per_rank) <= available_cpus();
}

}  // namespace fsdp::exec
