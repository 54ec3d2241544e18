#include "io/data.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ostream>

#include "core/errors.hpp"

namespace fsdp::exec {
namespace {

uint64_t mix(uint64_t a, uint64_t b) {
  // splitmix64 finaliser over a combined key (Steele et al. 2014).
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The first position in [begin, end) whose id is not below `vocab`, or -1. Each block of ids is reduced to its
// largest first (a loop without an early exit, which the compiler can vectorise); only a block holding a bad id is
// searched id by id.
template <typename Id>
int64_t first_beyond(const Id* ids, int64_t begin, int64_t end, int64_t vocab) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t e = std::min(end, b + kBlock);
    Id largest = 0;
    for (int64_t i = b; i < e; ++i) largest = std::max(largest, ids[i]);
    if (static_cast<int64_t>(largest) < vocab) continue;
    for (int64_t i = b; i < e; ++i)
      if (static_cast<int64_t>(ids[i]) >= vocab) return i;
  }
  return -1;
}

class SyntheticData final : public DataSource {
 public:
  SyntheticData(int64_t vocab, int64_t seq, uint64_t seed) : vocab_(vocab), seq_(seq), seed_(seed) {}
  at::Tensor rows(int64_t step, int64_t first, int64_t count) override {
    at::Tensor out = at::empty({count, seq_ + 1}, at::kLong);
    for (int64_t i = 0; i < count; ++i) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(
          mix(mix(seed_, static_cast<uint64_t>(step)), static_cast<uint64_t>(first + i)));
      out[i].copy_(at::randint(vocab_, {seq_ + 1}, gen, at::kLong));
    }
    return out;
  }
  std::string describe() const override { return "synthetic"; }

 private:
  int64_t vocab_, seq_;
  uint64_t seed_;
};

class TokenFile final : public DataSource {
 public:
  TokenFile(const std::string& path, int elem, int64_t vocab, int64_t seq, uint64_t seed)
      : path_(path), elem_(elem), vocab_(vocab), seq_(seq), seed_(seed) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw InputError(path + ": cannot open token file: " + std::strerror(errno));
    struct stat st {};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    bytes_ = static_cast<int64_t>(st.st_size);
    if (regular && bytes_ > 0) map_ = ::mmap(nullptr, static_cast<size_t>(bytes_), PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping stays valid (mmap(2))
    if (!regular) throw InputError(path + ": not a regular file");
    if (map_ == MAP_FAILED) throw InputError(path + ": mmap failed: " + std::strerror(err));
    try {
      check_size();
    } catch (...) {
      if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(bytes_));
      throw;
    }
  }
  ~TokenFile() override {
    if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(bytes_));
  }
  at::Tensor rows(int64_t step, int64_t first, int64_t count) override {
    at::Tensor out = at::empty({count, seq_ + 1}, at::kLong);
    int64_t* o = out.data_ptr<int64_t>();
    const int64_t windows = tokens_ - seq_ - 1;
    for (int64_t i = 0; i < count; ++i) {
      // Deterministic window start for (seed, step, global row): nanoGPT's get_batch samples
      // uniform offsets the same way, with a random generator instead of a hash.
      const int64_t start =
          static_cast<int64_t>(mix(mix(seed_, static_cast<uint64_t>(step)), static_cast<uint64_t>(first + i)) %
                               static_cast<uint64_t>(windows));
      for (int64_t t = 0; t <= seq_; ++t) {
        const int64_t pos = start + t;
        const int64_t id = id_at(pos);
        if (id >= vocab_) refuse_id(pos);  // the file changed since check_ids
        o[i * (seq_ + 1) + t] = id;
      }
    }
    return out;
  }
  std::string describe() const override {
    return path_ + " (" + std::to_string(tokens_) + " uint" + std::to_string(8 * elem_) + " tokens)";
  }
  int64_t num_tokens() const override { return tokens_; }
  void check_ids(int64_t begin, int64_t end, std::ostream* progress) const override {
    FSDP_ASSERT(0 <= begin && begin <= end && end <= tokens_, "token range outside the file");
    const int64_t chunk = kProgressBytes / elem_;
    const bool report = progress != nullptr && (end - begin) * elem_ > kProgressBytes;
    for (int64_t b = begin; b < end; b += chunk) {
      const int64_t e = std::min(end, b + chunk);
      const int64_t bad = elem_ == 2 ? first_beyond(static_cast<const uint16_t*>(map_), b, e, vocab_)
                                     : first_beyond(static_cast<const uint32_t*>(map_), b, e, vocab_);
      if (bad >= 0) refuse_id(bad);
      if (report)
        *progress << "fsdp-run: checked the token ids of " << path_ << ": " << gib((e - begin) * elem_) << " of "
                  << gib((end - begin) * elem_) << " GiB\n"
                  << std::flush;
    }
  }

 private:
  static constexpr int64_t kProgressBytes = int64_t{1} << 30;

  void check_size() {
    if (bytes_ % elem_ != 0)
      throw InputError(path_ + ": size " + std::to_string(bytes_) + " bytes is not a multiple of " +
                       std::to_string(elem_) + " (uint" + std::to_string(8 * elem_) + " token ids)");
    tokens_ = bytes_ / elem_;
    if (tokens_ < seq_ + 2)
      throw InputError(path_ + ": holds " + std::to_string(tokens_) +
                       " tokens, fewer than seq_len + 2 = " + std::to_string(seq_ + 2));
  }
  static std::string gib(int64_t bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", static_cast<double>(bytes) / static_cast<double>(kProgressBytes));
    return b;
  }
  int64_t id_at(int64_t pos) const {
    return elem_ == 2 ? static_cast<const uint16_t*>(map_)[pos] : static_cast<const uint32_t*>(map_)[pos];
  }
  [[noreturn]] void refuse_id(int64_t pos) const {
    throw InputError(path_ + ": token id " + std::to_string(id_at(pos)) + " at position " + std::to_string(pos) +
                     " (byte " + std::to_string(pos * elem_) + ") is beyond the model's vocabulary (" +
                     std::to_string(vocab_) + " ids)");
  }

  std::string path_;
  int elem_;
  int64_t vocab_, seq_;
  uint64_t seed_;
  int64_t bytes_ = 0, tokens_ = 0;
  void* map_ = nullptr;
};

}  // namespace

void DataSource::check_ids(int64_t /*begin*/, int64_t /*end*/, std::ostream* /*progress*/) const {}

int token_element_bytes(const std::string& dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  throw InputError("--data-dtype: '" + dtype + "' is not one of: uint16, uint32");
}

std::unique_ptr<DataSource> open_data(const std::string& spec, const std::string& dtype, int64_t vocab, int64_t seq,
                                      uint64_t seed) {
  if (spec == "synthetic") return std::make_unique<SyntheticData>(vocab, seq, seed);
  return std::make_unique<TokenFile>(spec, token_element_bytes(dtype), vocab, seq, seed);
}

}  // namespace fsdp::exec
