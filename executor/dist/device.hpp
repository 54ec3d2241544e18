// Device choice, in one place: "cpu", or "cuda:<LOCAL_RANK>" (the CUDA device is made
// current so that NCCL, the caching allocator and every tensor of this rank use it).
// Streams: compute runs on the current (default) stream; c10d's NCCL backend runs its
// collectives on internal streams and Work::wait() makes the current stream wait for them,
// so the executor needs no stream handling of its own.
#pragma once

#include <string>

namespace fsdp::exec {

// plan_device: "cpu" or "cuda". InputError when this build cannot serve it.
std::string select_device(const std::string& plan_device, int local_rank);

// The host allocator's policy for a CPU device (glibc; called by select_device("cpu")). glibc malloc serves
// requests above its mmap threshold (128 KiB, then raised as large blocks are freed) with fresh mmap'd pages
// and returns memory above its trim threshold at every free, so a training step's activations and gradients
// (hundreds of KiB to MiBs each, freed and allocated again every step) pay page faults every step, as much
// as the history of earlier frees leaves to them: the CPU counterpart of what PyTorch's CUDA caching
// allocator avoids (PyTorch's CPU performance guide recommends jemalloc or tcmalloc for the same reason).
// Fixing the mmap threshold at its 64-bit maximum (32 MiB, mallopt(3)) and the trim threshold at 1 GiB keeps
// freed blocks in the heap for the next step. Measured (acc-small, tests/accuracy grid row 38's plan, one
// rank rehearsed, 5 launches each): 42.9-62.7 ms a step before, 38.3-52.6 ms after; with selective
// checkpointing 46.8-63.3 ms before, 42.0-46.3 ms after. A GLIBC_TUNABLES with glibc.malloc settings or a
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment wins (nothing is set). Returns what it did,
// for the run's log.
std::string configure_host_allocator();
// The policy configure_host_allocator() put in force in this process (for reports); "not configured" before
// it has run. Changes nothing.
std::string host_allocator_policy();

// Intra-op threads of this rank (at::set_num_threads): ranks of a node split the CPUs the process may
// run on (sched_getaffinity), floor(cpus / local ranks) each and at least one, so that local ranks do not
// oversubscribe the cores: torchrun's intent when it sets OMP_NUM_THREADS=1 for nproc_per_node > 1
// (torch/distributed/run.py). An OMP_NUM_THREADS in the environment wins. The simulator models the same
// split (cpu_cores_per_rank, simulator/hardware/hardware_profile.hpp). Returns the thread count in use.
int configure_cpu_threads(int local_world_size);

// CPUs this process may run on (sched_getaffinity; at least 1).
int available_cpus();

// Whether a CPU rank waits for its collectives by polling (CommOptions::busy_poll): when the node's ranks,
// `threads_per_rank` intra-op threads each, fit on its CPUs, so that a waiting rank holds only a core of its
// own. Open MPI makes the same choice: it busy-waits unless the node is oversubscribed, and then yields
// (its FAQ, "aggressive" and "degraded" modes, mpi_yield_when_idle). Measured on a 2-vCPU VM with 2 ranks
// (bf16, tests/accuracy grid rows 16 and 30): 36-48 ms a step sleeping, 31-41 ms polling, as a sleeping
// core's wakeup waits for the hypervisor. With 4 ranks on the 2 vCPUs polling went both ways (-17% to +12%,
// executor/README.md), and a rank polling on a shared core takes time from the one computing there.
bool cpu_busy_poll(int local_world_size, int threads_per_rank);

}  // namespace fsdp::exec
