#include "io/data.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

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
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) throw InputError(path + ": cannot open token file: " + std::strerror(errno));
    struct stat st {};
    ::fstat(fd_, &st);
    bytes_ = static_cast<int64_t>(st.st_size);
    if (bytes_ % elem_ != 0)
      throw InputError(path + ": size " + std::to_string(bytes_) + " bytes is not a multiple of " +
                       std::to_string(elem_) + " (uint" + std::to_string(8 * elem_) + " token ids)");
    tokens_ = bytes_ / elem_;
    if (tokens_ < seq_ + 2)
      throw InputError(path + ": holds " + std::to_string(tokens_) +
                       " tokens, fewer than seq_len + 2 = " + std::to_string(seq_ + 2));
    map_ = ::mmap(nullptr, static_cast<size_t>(bytes_), PROT_READ, MAP_SHARED, fd_, 0);
    if (map_ == MAP_FAILED) throw InputError(path + ": mmap failed: " + std::strerror(errno));
  }
  ~TokenFile() override {
    if (map_ != MAP_FAILED && map_ != nullptr) ::munmap(map_, static_cast<size_t>(bytes_));
    if (fd_ >= 0) ::close(fd_);
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
        int64_t id = elem_ == 2 ? static_cast<const uint16_t*>(map_)[pos] : static_cast<const uint32_t*>(map_)[pos];
        if (id >= vocab_)
          throw InputError(path_ + ": token id " + std::to_string(id) + " at position " + std::to_string(pos) +
                           " is beyond the model's vocabulary (" + std::to_string(vocab_) + ")");
        o[i * (seq_ + 1) + t] = id;
      }
    }
    return out;
  }
  std::string describe() const override {
    return path_ + " (" + std::to_string(tokens_) + " uint" + std::to_string(8 * elem_) + " tokens)";
  }

 private:
  std::string path_;
  int elem_;
  int64_t vocab_, seq_;
  uint64_t seed_;
  int fd_ = -1;
  int64_t bytes_ = 0, tokens_ = 0;
  void* map_ = nullptr;
};

}  // namespace

std::unique_ptr<DataSource> open_data(const std::string& spec, const std::string& dtype, int64_t vocab, int64_t seq,
                                      uint64_t seed) {
  if (spec == "synthetic") return std::make_unique<SyntheticData>(vocab, seq, seed);
  int elem = 0;
  if (dtype == "uint16")
    elem = 2;
  else if (dtype == "uint32")
    elem = 4;
  else
    throw InputError("--data-dtype must be uint16 or uint32, not '" + dtype + "'");
  return std::make_unique<TokenFile>(spec, elem, vocab, seq, seed);
}

}  // namespace fsdp::exec
