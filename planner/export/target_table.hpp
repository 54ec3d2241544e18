// The targets' knob tables as the README shows them (`fsdp-plan --list-targets`): per target and version, the
// release it writes for, its runtime, and for each knob it restricts what it expresses and what not, with the
// reason and source. Generated from configs/targets, so the README cannot drift from the data
// (tests/planner/test_export.cpp compares them).
#pragma once

#include <string>

namespace fsdp {

std::string targets_markdown(const std::string& config_root);

}  // namespace fsdp
