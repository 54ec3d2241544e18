// The plan.yaml key (docs/plan-format.md) a fsdp-plan strategy flag sets: fsdp-run names the key of its plan where
// fsdp-plan names the flag, e.g. a capability violation (strategy/capabilities.hpp) blaming "--tp" is reported by
// fsdp-run as "strategy.tp".
#pragma once

#include <string>

namespace fsdp {

// "--tp" -> "strategy.tp", "--seq" -> "strategy.seq_len", "--strategy" -> "strategy.kind", "--optimizer" ->
// "training.optimizer"; a flag no plan key holds (a cluster flag) maps to itself.
std::string plan_key_of_flag(const std::string& flag);

}  // namespace fsdp
