// fsdp-plan subcommands. Each returns the process exit code; InputError escapes to main (exit 2).
#pragma once

#include <string>
#include <vector>

namespace fsdp {

std::string config_root_from(const std::vector<std::string>& argv);
int run_simulate(const std::vector<std::string>& argv);
int run_list_models(const std::vector<std::string>& argv);
int run_list_hardware(const std::vector<std::string>& argv);
int run_compare(const std::vector<std::string>& argv);

}  // namespace fsdp
