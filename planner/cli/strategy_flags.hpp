// The strategy knobs as command-line flags, shared by `simulate` and the planner's pins.
#pragma once

#include <set>
#include <string>

#include "cli/args.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// Flags naming one strategy knob each.
const std::set<std::string>& strategy_value_flags();

// Sets every knob given on the command line; InputError naming the flag for a bad value.
void apply_strategy_flags(const Args& args, Strategy& s);

}  // namespace fsdp
