// Hand-made safetensors files for the tests of hostile input: a header as given (the format's 8-byte length, the
// header text, the data bytes; huggingface/safetensors README "Format"), or a written file's header edited.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

namespace fsdp::exec::test {

inline void write_raw_safetensors(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

// Replaces the header of the file at `path` by `edit` of it; the data bytes stay as they are.
inline void edit_safetensors_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  write_raw_safetensors(path, header.dump(), bytes.substr(8 + n));
}

}  // namespace fsdp::exec::test
