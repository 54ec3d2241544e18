// libFuzzer target: Hugging Face config.json through parse_hf_config. Seeds: tests/data/hf/*.json.
#include "fuzz_common.hpp"
#include "model/model_loader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_fuzz::expect_only_input_errors([&] {
    fsdp::ModelSpec spec = fsdp::parse_hf_config(fsdp_fuzz::as_text(data, size), "fuzz-config.json");
    (void)spec;
  });
  return 0;
}
