// libFuzzer target: hardware profiles (hwprofiles/*.yaml) through load_hardware. It reads a path,
// so each input is written to a per-process temporary .yaml file first. Seeds: hwprofiles/*.yaml.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_common.hpp"
#include "hardware/hardware_profile.hpp"

namespace {

const std::string& temp_path() {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("fsdp-fuzz-hw-" + std::to_string(::getpid()) + ".yaml")).string();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(temp_path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  fsdp_fuzz::expect_only_input_errors([&] {
    fsdp::HardwareProfile hw = fsdp::load_hardware(temp_path(), FSDP_SOURCE_ROOT);
    (void)hw;
  });
  return 0;
}
