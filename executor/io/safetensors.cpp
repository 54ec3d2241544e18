#include "io/safetensors.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <vector>

#include "core/duplicate_keys.hpp"
#include "core/errors.hpp"

namespace fsdp::exec {
namespace {

using nlohmann::json;

// FNV-1a 64-bit prime.
constexpr uint64_t kFnvPrime = 1099511628211ull;

// The reference reader refuses larger headers (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100000000;

// The format's dtype names (safetensors/src/tensor.rs, enum Dtype) that LibTorch has a type for.
struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {{"BOOL", at::kBool}, {"U8", at::kByte},   {"I8", at::kChar},  {"I16", at::kShort},
                                 {"I32", at::kInt},   {"I64", at::kLong},  {"F16", at::kHalf}, {"BF16", at::kBFloat16},
                                 {"F32", at::kFloat}, {"F64", at::kDouble}};

std::optional<at::ScalarType> dtype_of(const std::string& name) {
  for (const DtypeName& d : kDtypes)
    if (name == d.name) return d.type;
  return std::nullopt;
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

[[noreturn]] void refuse(const std::string& path, const std::string& what) { throw InputError(path + ": " + what); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One tensor of the header, validated on its own.
struct Entry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data buffer
};

std::string range_text(const Entry& e) { return "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")"; }

json parse_header(const std::string& path, const std::string& text) {
  json header;
  try {
    header = parse_json_unique_keys(text, path + " (safetensors header)");
  } catch (const json::parse_error& e) {
    refuse(path, "the safetensors header is not valid JSON (at byte " + std::to_string(e.byte) + " of the header)");
  } catch (const json::exception&) {
    refuse(path, "the safetensors header is not valid JSON");
  }
  if (!header.is_object())
    refuse(path, std::string("the safetensors header is a JSON ") + header.type_name() + ", not an object of tensors");
  return header;
}

std::map<std::string, std::string> read_metadata(const std::string& path, const json& m) {
  if (!m.is_object()) refuse(path, "__metadata__ is not an object of strings");
  std::map<std::string, std::string> out;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it.value().is_string()) refuse(path, "__metadata__." + it.key() + " is not a string");
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

std::vector<int64_t> read_shape(const std::string& path, const std::string& where, const json& v) {
  if (!v.is_array()) refuse(path, where + ": shape is not an array of sizes");
  std::vector<int64_t> shape;
  for (const json& d : v) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      refuse(path, where + ": shape " + v.dump() + " holds " + d.dump() + ", not a size");
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// The bytes `dtype` x `shape` occupy; refused when the product overflows.
uint64_t tensor_bytes(const std::string& path, const std::string& where, const Entry& e) {
  int64_t n = static_cast<int64_t>(c10::elementSize(e.dtype));
  for (int64_t d : e.shape)
    if (__builtin_mul_overflow(n, d, &n)) refuse(path, where + ": shape " + shape_text(e.shape) + " overflows");
  return static_cast<uint64_t>(n);
}

Entry read_entry(const std::string& path, const std::string& name, const json& v) {
  const std::string where = "tensor " + name;
  if (!v.is_object()) refuse(path, where + ": not an object of dtype, shape and data_offsets");
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      refuse(path, where + ": unknown key '" + it.key() + "' (a tensor has dtype, shape and data_offsets only)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) refuse(path, where + ": no " + key);
  Entry e;
  e.name = name;
  const json& dt = v.at("dtype");
  const std::optional<at::ScalarType> type = dt.is_string() ? dtype_of(dt.get<std::string>()) : std::nullopt;
  if (!type) refuse(path, where + ": unsupported dtype " + dt.dump());
  e.dtype = *type;
  e.shape = read_shape(path, where, v.at("shape"));
  const json& offs = v.at("data_offsets");
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned() ||
      offs[1].get<uint64_t>() < offs[0].get<uint64_t>())
    refuse(path, where + ": data_offsets " + offs.dump() + " is not [begin, end] with begin <= end");
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  const uint64_t bytes = tensor_bytes(path, where, e);
  if (e.end - e.begin != bytes)
    refuse(path, where + ": dtype " + dt.get<std::string>() + " x shape " + shape_text(e.shape) + " is " +
                     std::to_string(bytes) + " bytes, but its data_offsets " + range_text(e) + " hold " +
                     std::to_string(e.end - e.begin));
  return e;
}

// In offset order, each tensor starts where the previous one ended, and the last one ends at the file's end
// (Metadata::validate and the MetadataIncompleteBuffer check of the reference reader).
void check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < at)
      refuse(path, "tensor " + e.name + "'s data_offsets " + range_text(e) + " overlap tensor " + prev->name + "'s " +
                       range_text(*prev));
    if (e.begin > at)
      refuse(path, "data bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                       ") belong to no tensor (the next, " + e.name + ", starts at " + std::to_string(e.begin) + ")");
    at = e.end;
    prev = &e;
  }
  if (at > data_bytes)
    refuse(path, "tensor " + prev->name + " ends at data byte " + std::to_string(at) + " but the file holds " +
                     std::to_string(data_bytes) + " data bytes (truncated file?)");
  if (at < data_bytes)
    refuse(path, std::to_string(data_bytes - at) + " bytes after the last tensor's data belong to no tensor");
}

}  // namespace

const char* safetensors_dtype(at::ScalarType t) {
  for (const DtypeName& d : kDtypes)
    if (d.type == t) return d.name;
  throw InputError(std::string("safetensors: no dtype name for ") + c10::toString(t));
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

uint64_t write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t off = 0;
  for (const auto& [name, t0] : tensors) {
    at::Tensor t = t0.detach().cpu().contiguous();
    const uint64_t n = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {
        {"dtype", safetensors_dtype(t.scalar_type())}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + n}}};
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
  write_all(fd, len, 8, tmp);
  uint64_t sum = fnv1a64(len, 8);
  write_all(fd, h.data(), h.size(), tmp);
  sum = fnv1a64(h.data(), h.size(), sum);
  for (auto& t : data) {
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    write_all(fd, t.data_ptr(), n, tmp);
    sum = fnv1a64(t.data_ptr(), n, sum);
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
  uint64_t h = kFnv1a64Offset;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = fnv1a64(buf.data(), static_cast<size_t>(in.gcount()), h);
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) refuse(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(path, "not a regular file");
  }
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ < 8) {
    ::close(fd);
    refuse(path, "not a safetensors file (shorter than its header length)");
  }
  map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    refuse(path, "mmap failed");
  }
  try {
    index(static_cast<const unsigned char*>(map_));
  } catch (...) {
    ::munmap(map_, bytes_);
    map_ = nullptr;
    throw;
  }
}

void SafetensorsFile::index(const unsigned char* base) {
  const std::string& path = path_;
  uint64_t hs = 0;
  for (int i = 0; i < 8; ++i) hs |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (hs > kMaxHeaderBytes)
    refuse(path, "safetensors header length " + std::to_string(hs) + " exceeds the format's limit of " +
                     std::to_string(kMaxHeaderBytes) + " bytes (not a safetensors file?)");
  if (hs > bytes_ - 8) refuse(path, "truncated safetensors header");
  const json header = parse_header(path, std::string(reinterpret_cast<const char*>(base + 8), hs));
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      metadata_ = read_metadata(path, it.value());
    else
      entries.push_back(read_entry(path, it.key(), it.value()));
  }
  const size_t data_start = 8 + hs;
  check_tiling(path, entries, bytes_ - data_start);
  for (const Entry& e : entries) {
    void* p = const_cast<unsigned char*>(base + data_start + e.begin);
    tensors_[e.name] = at::from_blob(p, e.shape, at::TensorOptions().dtype(e.dtype));
  }
}

SafetensorsFile::~SafetensorsFile() {
  tensors_.clear();
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

}  // namespace fsdp::exec
