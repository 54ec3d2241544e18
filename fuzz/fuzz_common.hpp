// Shared by the libFuzzer targets: run one parse and let only InputError through.
// Anything else that escapes (another exception type, an FSDP_ASSERT abort, a sanitizer
// report, a crash) is a finding: libFuzzer stops, saves the input and exits non-zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/errors.hpp"

namespace fsdp_fuzz {

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

template <typename F>
void expect_only_input_errors(F&& parse) {
  try {
    parse();
  } catch (const fsdp::InputError&) {
    // The one allowed outcome besides success.
  }
}

}  // namespace fsdp_fuzz
