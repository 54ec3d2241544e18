// fsdp-plan subcommands. Each returns the process exit code; InputError escapes to main (exit 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

struct ModelSpec;
struct PlanFile;

std::string config_root_from(const std::vector<std::string>& argv);
// untrained_length_warning (simulate.hpp) on stderr when it applies; a warning only, the exit status is unchanged.
void warn_untrained_length(const ModelSpec& model, int64_t seq_len, const std::string& seq_source);
// The same for a plan file's model and strategy.seq_len.
void warn_untrained_length(const PlanFile& plan, const std::string& plan_path);
int run_simulate(const std::vector<std::string>& argv);
int run_list_models(const std::vector<std::string>& argv);
int run_list_hardware(const std::vector<std::string>& argv);
int run_compare(const std::vector<std::string>& argv);
int run_validate(const std::vector<std::string>& argv);

}  // namespace fsdp
