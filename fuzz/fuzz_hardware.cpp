// libFuzzer target: hardware profiles (hwprofiles/*.yaml) through parse_hardware_text, the loader load_hardware
// runs on a file's text. The input is parsed from memory, and its `base:` may name only a shipped profile
// (FSDP_SOURCE_ROOT/hwprofiles/NAME.yaml), never a path: the fuzzer reads no file but its input and the shipped
// profiles and backends. Seeds: hwprofiles/*.yaml (the derived ones exercise `base:`); dictionary: hardware.dict.
#include <string>

#include "fuzz_common.hpp"
#include "hardware/hardware_profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = fsdp_fuzz::as_text(data, size);
  fsdp_fuzz::expect_only_input_errors([&] {
    const fsdp::HardwareProfile hw = fsdp::parse_hardware_text(text, "fuzz-input.yaml", FSDP_SOURCE_ROOT);
    // What the reports print of a profile must hold for any profile the loader accepts.
    (void)fsdp::hardware_warnings(hw);
    (void)fsdp::network_summary(hw);
    (void)fsdp::clock_summary(hw);
    for (fsdp::DType d : {fsdp::DType::Fp32, fsdp::DType::Bf16, fsdp::DType::Fp16}) (void)hw.peak_flops(d);
  });
  return 0;
}
