// The safetensors format (https://github.com/huggingface/safetensors, README "Format"):
// an 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian tensor bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace fsdp::exec {

// Writes atomically (temporary name, fsync, rename). Returns the FNV-1a 64 checksum of the file.
uint64_t write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// A memory-mapped safetensors file; tensors alias the mapping (valid while it lives).
// The whole header is validated before any tensor is made, as the format's reference reader does
// (huggingface/safetensors safetensors/src/tensor.rs, SafeTensors::read_metadata and Metadata::validate): the
// header is at most 100,000,000 bytes of JSON, an object whose members are `__metadata__` (strings only) and
// tensors with exactly dtype, shape and data_offsets, no name twice; each tensor's dtype size x shape is its
// data_offsets' length; the tensors' data, in offset order, tile the data buffer from its first byte to the file's
// end, without holes or overlaps. Any other file is an InputError naming the file (and the tensor).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::string& path() const { return path_; }
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void index(const unsigned char* base);  // validates the header and makes the tensors

  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The format's name of a dtype ("F32", "BF16", "I32", ...).
const char* safetensors_dtype(at::ScalarType t);

// FNV-1a 64-bit (Fowler, Noll, Vo; IETF draft-eastlake-fnv): its offset basis, and the hash of `n` bytes
// continued from `h`.
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Offset);

// FNV-1a 64-bit hash of a file's bytes.
uint64_t file_checksum(const std::string& path);

}  // namespace fsdp::exec
