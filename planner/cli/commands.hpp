// fsdp-plan subcommands. Each returns the process exit code; InputError escapes to main (exit 2).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace fsdp {

class Args;
struct ModelSpec;
struct PlanFile;

// --tokens: a training run's tokens, a positive number or K, M, B, T (core/unit_parse.hpp parse_count); 0 when absent.
// fsdp-plan and simulate report the plan's GPU-hours, days and optimizer steps for it (report/training_run.hpp).
double training_tokens(const Args& args);

std::string config_root_from(const std::vector<std::string>& argv);
// check_trained_length (simulate.hpp) for a plan file's model and strategy.seq_len.
void check_trained_length(const PlanFile& plan, const std::string& plan_path);
int run_simulate(const std::vector<std::string>& argv);
// The flags `fsdp-plan simulate` accepts, with a value and without (its --help names each).
std::set<std::string> simulate_value_flags();
std::set<std::string> simulate_switch_flags();
int run_list_models(const std::vector<std::string>& argv);
int run_list_hardware(const std::vector<std::string>& argv);
int run_compare(const std::vector<std::string>& argv);
int run_validate(const std::vector<std::string>& argv);
int run_export(const std::vector<std::string>& argv);
// The targets' knob tables in Markdown (planner/export/target_table.hpp), as the README shows them.
int run_list_targets(const std::vector<std::string>& argv);

}  // namespace fsdp
