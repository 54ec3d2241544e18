// What a communication backend can and cannot do (configs/backends/*.yaml): Gloo's missing bf16 and
// reduce-scatter, its own gather buffer, its transport sharing the rank's cores; NCCL's direct collectives on
// their own streams. The hardware profile names its backend (`backend:`); the step program, the memory walk
// and the timeline read these facts, never the device kind.
#pragma once

#include <string>

namespace fsdp {

struct BackendProfile {
  std::string name;
  std::string source;
  bool low_precision_collectives = false;  // bf16/fp16 collectives (else staged in fp32)
  bool native_reduce_scatter = false;      // a reduce-scatter of its own (else all-reduce and slice)
  bool gather_flat_buffer = false;         // an all-gather lands in a flat buffer of the backend's first
  bool overlaps_compute = false;           // collectives and copies run beside compute (else one in-order resource)
};

// Strict parse; InputError names file, line and key.
BackendProfile load_backend(const std::string& name_or_path, const std::string& config_root);

}  // namespace fsdp
