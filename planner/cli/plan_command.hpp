// `fsdp-plan [--model M --nodes N ...]`: search, explain, write plan.yaml; `fsdp-plan show plan.yaml`.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace fsdp {

// The flags `fsdp-plan` accepts, with a value and without (its --help names each: tests/planner/test_cli_help.cpp).
std::set<std::string> plan_value_flags();
std::set<std::string> plan_switch_flags();

int run_plan(const std::vector<std::string>& argv);
int run_show(const std::vector<std::string>& argv);

}  // namespace fsdp
