#include "io/safetensors.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/errors.hpp"

namespace fsdp::exec {
namespace {

// FNV-1a 64-bit parameters (offset basis and prime).
constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "F32";
    case at::kBFloat16:
      return "BF16";
    case at::kHalf:
      return "F16";
    case at::kDouble:
      return "F64";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    default:
      throw InputError("safetensors: unsupported dtype");
  }
}

at::ScalarType dtype_of(const std::string& n, const std::string& path) {
  if (n == "F32") return at::kFloat;
  if (n == "BF16") return at::kBFloat16;
  if (n == "F16") return at::kHalf;
  if (n == "F64") return at::kDouble;
  if (n == "I64") return at::kLong;
  if (n == "I32") return at::kInt;
  throw InputError(path + ": unsupported safetensors dtype " + n);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

uint64_t write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t off = 0;
  for (const auto& [name, t0] : tensors) {
    at::Tensor t = t0.detach().cpu().contiguous();
    const uint64_t n = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {
        {"dtype", dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + n}}};
    off += n;
    data.push_back(t);
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';  // the format allows trailing spaces to align the data
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
  uint64_t hs = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((hs >> (8 * i)) & 0xff);
  uint64_t sum = kFnvOffset;
  write_all(fd, len, 8, tmp);
  sum = fnv(sum, len, 8);
  write_all(fd, h.data(), h.size(), tmp);
  sum = fnv(sum, reinterpret_cast<const unsigned char*>(h.data()), h.size());
  for (auto& t : data) {
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    write_all(fd, t.data_ptr(), n, tmp);
    sum = fnv(sum, static_cast<const unsigned char*>(t.data_ptr()), n);
  }
  if (::fsync(fd) != 0) throw std::runtime_error(tmp + ": fsync failed");
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": rename failed");
  return sum;
}

uint64_t file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnvOffset;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = fnv(h, reinterpret_cast<const unsigned char*>(buf.data()), static_cast<size_t>(in.gcount()));
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ < 8) {
    ::close(fd);
    throw InputError(path + ": not a safetensors file (shorter than its header length)");
  }
  map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw InputError(path + ": mmap failed");
  }
  const auto* base = static_cast<const unsigned char*>(map_);
  uint64_t hs = 0;
  for (int i = 0; i < 8; ++i) hs |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (hs > bytes_ - 8) throw InputError(path + ": truncated safetensors header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(base + 8), hs));
  } catch (const std::exception& e) {
    throw InputError(path + ": malformed safetensors header: " + e.what());
  }
  const size_t data_start = 8 + hs;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it.value().begin(); m != it.value().end(); ++m) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    const auto& v = it.value();
    at::ScalarType dt = dtype_of(v.at("dtype").get<std::string>(), path);
    std::vector<int64_t> shape = v.at("shape").get<std::vector<int64_t>>();
    auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    if (offs.size() != 2 || offs[1] < offs[0] || data_start + offs[1] > bytes_ ||
        offs[1] - offs[0] != static_cast<uint64_t>(numel) * c10::elementSize(dt))
      throw InputError(path + ": tensor " + it.key() + " has inconsistent data_offsets (truncated file?)");
    void* p = const_cast<unsigned char*>(base + data_start + offs[0]);
    tensors_[it.key()] = at::from_blob(p, shape, at::TensorOptions().dtype(dt));
  }
}

SafetensorsFile::~SafetensorsFile() {
  tensors_.clear();
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

}  // namespace fsdp::exec
