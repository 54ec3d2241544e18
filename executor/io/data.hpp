// Training data: deterministic synthetic tokens, or a flat binary token file
// (uint16 / uint32 ids, as nanoGPT's prepare.py and Megatron-style preprocessing
// write them), memory-mapped. A batch row is addressed by (step, global row), so
// rank r of W with micro-batch b and accumulation index k reads rows
// (k*W + r)*b .. +b: a run on any world size sees the same global batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

namespace fsdp::exec {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // [count, seq_len + 1] int64 token ids of rows first..first+count-1 of `step`.
  virtual at::Tensor rows(int64_t step, int64_t first, int64_t count) = 0;
  virtual std::string describe() const = 0;
  // Token ids the source holds; 0 for synthetic data (drawn within the vocabulary).
  virtual int64_t num_tokens() const { return 0; }
  // Scans the ids at positions [begin, end) before training reads any (issue M11): InputError naming the file, the
  // position and the value of the first id beyond the model's vocabulary. Ranges over 1 GiB note their progress
  // on `progress` (when given) every GiB.
  virtual void check_ids(int64_t begin, int64_t end, std::ostream* progress) const;
};

// The bytes of a token id of `dtype` (--data-dtype): 2 for "uint16", 4 for "uint32"; InputError naming the flag
// for anything else.
int token_element_bytes(const std::string& dtype);

// "synthetic" or a path; dtype "uint16" or "uint32". InputError on a bad file.
std::unique_ptr<DataSource> open_data(const std::string& spec, const std::string& dtype, int64_t vocab_size,
                                      int64_t seq_len, uint64_t seed);

}  // namespace fsdp::exec
