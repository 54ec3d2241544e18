// What a collective puts on the wire on this backend: a group of one rank communicates nothing and keeps its
// buffers' dtype (fsdp-run's local group); a backend without low-precision collectives (Gloo in LibTorch 1.13
// rejects bf16) sends a bf16/fp16 buffer through an fp32 staging copy (executor/dist/comm.cpp), twice its own bytes,
// but for point-to-point transfers, and a mixed-precision FSDP gather sends the fp32 master shard as it is. Every
// dimension of the mesh (data, tensor, pipeline) sizes its collectives with it.
#pragma once

#include <algorithm>

#include "program/op_kinds.hpp"
#include "program/step_program.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct CollectiveWire {
  const StepLayout* layout = nullptr;  // the mesh whose group sizes decide what communicates
  bool fp32_only = false;              // the backend has no low-precision collectives (ProgramInput)

  // Whether a collective over `g` stages its low-precision buffer in fp32. A pipeline stage's point-to-point send
  // and receive move the buffer's raw bytes on every backend (ProcessGroupGloo::send / recv: numel x element size;
  // fsdp-run's Group::send), so they send bf16 as it is.
  bool stages_fp32(GroupKind g) const { return fp32_only && g != GroupKind::Pipeline && layout->group_size(g) > 1; }
  // Bytes a collective over `g` moves for `elems` elements of `bytes_per_elem` bytes each.
  double bytes(double elems, double bytes_per_elem, GroupKind g) const {
    constexpr double kFp32Bytes = 4.0;
    return elems * (stages_fp32(g) ? std::max(bytes_per_elem, kFp32Bytes) : bytes_per_elem);
  }
  // The element type that travels for a buffer of dtype `d` over `g`.
  WireType type(DType d, GroupKind g) const {
    if (stages_fp32(g) && d != DType::Fp32) return WireType::Fp32;
    switch (d) {
      case DType::Fp32:
        return WireType::Fp32;
      case DType::Bf16:
        return WireType::Bf16;
      case DType::Fp16:
        return WireType::Fp16;
    }
    return WireType::Fp32;
  }
};

}  // namespace fsdp
