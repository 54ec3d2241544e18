// `fsdp-plan [--model M --nodes N ...]`: search, explain, write plan.yaml; `fsdp-plan show plan.yaml`.
#pragma once

#include <string>
#include <vector>

namespace fsdp {

int run_plan(const std::vector<std::string>& argv);
int run_show(const std::vector<std::string>& argv);

}  // namespace fsdp
