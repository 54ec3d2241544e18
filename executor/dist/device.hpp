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

}  // namespace fsdp::exec
