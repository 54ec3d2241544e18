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
