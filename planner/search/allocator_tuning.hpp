// The C library's allocator kept from handing the search's freed memory back to the kernel.
//
// The search emits a step program per plan and stage (thousands per search), each an op list of n x sizeof(Op)
// (328 B) bytes, up to a few MiB, and frees it before the next. glibc's malloc serves a request of at least
// M_MMAP_THRESHOLD (128 KiB at first, raised to the size of each mmapped block freed, at most 32 MiB on 64-bit) with a
// fresh mmap, and returns the top of the heap to the kernel once more than M_TRIM_THRESHOLD (128 KiB, twice the raised
// mmap threshold) of it is free (mallopt(3), "M_MMAP_THRESHOLD", "M_TRIM_THRESHOLD"; glibc malloc/malloc.c, "Tuning
// options"). Either way the next program's list lands on pages the kernel must map and zero again: a page fault per
// 4 KiB, measured (perf record of `fsdp-plan --model 405b --nodes 128 --hw h100-80gb`) at 15% of the search's samples.
// Fixing both thresholds keeps the freed blocks in the heap for the next program: the same allocations, served from
// memory the process already holds (at most the largest programs' high-water mark stays mapped). Nothing computed
// changes. glibc only (elsewhere a no-op); called by fsdp-plan's main and the benchmarks, not by the library.
#pragma once

namespace fsdp {

void keep_freed_memory_for_reuse();

}  // namespace fsdp
