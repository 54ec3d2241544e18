// The safetensors format (https://github.com/huggingface/safetensors, "Format"):
// an 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian tensor bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

namespace fsdp::exec {

// Writes atomically (temporary name, fsync, rename). Returns the FNV-1a 64 checksum of the file.
uint64_t write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// A memory-mapped safetensors file; tensors alias the mapping (valid while it lives).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // InputError on a malformed file
  ~SafetensorsFile();
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// FNV-1a 64-bit hash of a file's bytes (Fowler, Noll, Vo; IETF draft-eastlake-fnv).
uint64_t file_checksum(const std::string& path);

}  // namespace fsdp::exec
