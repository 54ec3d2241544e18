// libFuzzer target: model YAML (configs/models schema) through ConfigMap::load_string and
// parse_model_map. Seeds: configs/models/*.yaml.
#include "core/config_map.hpp"
#include "fuzz_common.hpp"
#include "model/model_loader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_fuzz::expect_only_input_errors([&] {
    fsdp::ConfigMap map = fsdp::ConfigMap::load_string(fsdp_fuzz::as_text(data, size), "fuzz-model.yaml");
    fsdp::ModelSpec spec = fsdp::parse_model_map(map);
    (void)spec;
  });
  return 0;
}
