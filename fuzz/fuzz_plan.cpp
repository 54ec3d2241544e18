// libFuzzer target: plan.yaml (docs/plan-format.md) through parse_plan_text. Seeds: plan files
// under tests/data and configs, and the model zoo (a plan embeds a model).
#include "fuzz_common.hpp"
#include "planfile/plan_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_fuzz::expect_only_input_errors([&] {
    fsdp::PlanFile plan = fsdp::parse_plan_text(fsdp_fuzz::as_text(data, size), "fuzz-plan.yaml");
    (void)plan;
  });
  return 0;
}
