// fsdp-plan: capacity planner and simulator for sharded training.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/plan_command.hpp"
#include "core/errors.hpp"
#include "search/allocator_tuning.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // The search's step programs reuse the heap's freed memory (search/allocator_tuning.hpp).
  fsdp::keep_freed_memory_for_reuse();
  try {
    if (!args.empty() && args[0] == "simulate") return fsdp::run_simulate({args.begin() + 1, args.end()});
    if (!args.empty() && args[0] == "compare") return fsdp::run_compare({args.begin() + 1, args.end()});
    if (!args.empty() && args[0] == "validate") return fsdp::run_validate({args.begin() + 1, args.end()});
    if (!args.empty() && args[0] == "show") return fsdp::run_show({args.begin() + 1, args.end()});
    if (!args.empty() && args[0] == "export") return fsdp::run_export({args.begin() + 1, args.end()});
    for (const auto& a : args) {
      if (a == "--list-models") return fsdp::run_list_models(args);
      if (a == "--list-hardware") return fsdp::run_list_hardware(args);
      if (a == "--list-targets") return fsdp::run_list_targets(args);
    }
    return fsdp::run_plan(args);
  } catch (const fsdp::InputError& e) {
    std::fprintf(stderr, "fsdp-plan: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-plan: internal error: %s\n", e.what());
    return 3;
  }
}
