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

}  // namespace fsdp::exec
