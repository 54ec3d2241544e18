#include "search/allocator_tuning.hpp"

#include <cstdlib>  // defines __GLIBC__ on glibc (features.h)

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace fsdp {

void keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  // The most M_MMAP_THRESHOLD takes on 64-bit (HEAP_MAX_SIZE / 2, malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX): blocks
  // up to it come from the heap; the trim threshold far above any program the search emits.
  constexpr int kMmapThreshold = 32 * 1024 * 1024;
  constexpr int kTrimThreshold = 1024 * 1024 * 1024;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
#endif
}

}  // namespace fsdp
