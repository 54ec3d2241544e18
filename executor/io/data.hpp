// Training data: deterministic synthetic tokens, or a flat binary token file
// (uint16 / uint32 ids, as nanoGPT's prepare.py and Megatron-style preprocessing
// write them), memory-mapped. A batch row is addressed by (step, global row), so
// rank r of W with micro-batch b and accumulation index k reads rows
// (k*W + r)*b .. +b: a run on any world size sees the same global batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace fsdp::exec {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // [count, seq_len + 1] int64 token ids of rows first..first+count-1 of `step`.
  virtual at::Tensor rows(int64_t step, int64_t first, int64_t count) = 0;
  virtual std::string describe() const = 0;
};

// "synthetic" or a path; dtype "uint16" or "uint32". InputError on a bad file.
std::unique_ptr<DataSource> open_data(const std::string& spec, const std::string& dtype, int64_t vocab_size,
                                      int64_t seq_len, uint64_t seed);

}  // namespace fsdp::exec
