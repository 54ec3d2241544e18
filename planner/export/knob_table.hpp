// The knobs a target's capabilities name, one row each: when the knob applies to a plan, its value as text, and
// how the nearest plan sets it. The search filter, `export`'s refusal and the target pins all read this one table;
// a new Strategy dimension (tensor / pipeline parallel degrees) is one more row here and one more capability in
// the target files.
#pragma once

#include <string>
#include <vector>

#include "export/target_spec.hpp"
#include "hardware/cluster.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// A list of names as one text, and back (empty items dropped): a knob's value (lora_targets "q_proj,v_proj").
std::string join(const std::vector<std::string>& v, const char* sep);
std::vector<std::string> split(const std::string& text, char sep);

struct Knob {
  const char* name;
  const char* flag;  // the fsdp-plan flag that pins it
  bool searched;     // the search enumerates it (strategy, wrap, ...); the others come from the base strategy
  bool (*applies)(const Strategy&);
  std::string (*value)(const Strategy&, const Cluster&);
  // Sets the knob to a value named by a capability (a concrete value, not a pattern); false if it cannot.
  bool (*set)(Strategy&, const std::string&, const Cluster&);
};

const std::vector<Knob>& knob_table();
const Knob* find_knob(const std::string& name);

// Concrete values of a knob that span what fsdp-plan can plan (every strategy, each wrap and checkpointing kind,
// a prefetch depth of 0, 1 and 2, ...): what the targets' knob tables list as expressed or not, and what the tests
// try against every capability.
const std::vector<std::string>& knob_samples(const std::string& knob);
// A sample as the knob tables show it: every:2 as every:N, size:100000000 as size:N, a shard group of 4 (not a
// node) as "other".
std::string sample_label(const std::string& knob, const std::string& sample);

// Whether a capability's values admit `value` (patterns every:N, size:N and any; lora_targets by module).
bool rule_admits(const KnobRule& rule, const std::string& value);

// The value a knob takes in the nearest plan when the target does not admit `value`: the rule's `nearest` entry
// (exact, then by pattern every:N / size:N), for lora_targets the admitted modules with partly adapted groups
// completed, else the rule's first value.
std::string nearest_value(const KnobRule& rule, const std::string& value);

struct KnobViolation {
  std::string knob;
  std::string value;
  const KnobRule* rule = nullptr;
  std::string message() const;  // "act_ckpt selective: torchtitan expresses none, full, ... (why; source)"
};

// The knobs of `s` the target cannot express, in table order (empty: the target runs the plan as planned).
std::vector<KnobViolation> inexpressible(const TargetSpec& spec, const Strategy& s, const Cluster& c);
// The nearest plan the target expresses: each violated knob set to its rule's nearest value, repeated until none
// is violated. Never called for an expressible plan's knobs: they stay as they are.
Strategy nearest_expressible(const TargetSpec& spec, Strategy s, const Cluster& c);

}  // namespace fsdp
