#include "dist/device.hpp"

#include "core/errors.hpp"
#include "train/mem_tracker.hpp"

#if defined(FSDP_EXEC_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace fsdp::exec {

std::string select_device(const std::string& plan_device, int local_rank) {
  if (plan_device == "cpu") {
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

}  // namespace fsdp::exec
