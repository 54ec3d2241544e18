// The strategy knobs as command-line flags, shared by `simulate` and the planner's pins.
#pragma once

#include <set>
#include <string>

#include "cli/args.hpp"
#include "model/model_spec.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// Flags naming one strategy knob each.
const std::set<std::string>& strategy_value_flags();

// The --help lines that name every strategy flag (strategy_value_flags, so the help cannot miss one), after
// `indent`, wrapped before `width` columns.
std::string strategy_flags_help(const std::string& indent, size_t width);

// Sets every knob given on the command line; InputError naming the flag for a bad value.
void apply_strategy_flags(const Args& args, Strategy& s);

// Without --sequence-parallel: tensor parallelism without sequence parallelism where the runtime does not run it
// (RuntimeSupport::sequence_parallel; DeepSpeed's AutoTP), rather than a default the runtime refuses.
void apply_runtime_defaults(const Args& args, const RuntimeProfile& rt, Strategy& s);

// --grad-sync last-micro-batch for the fsdp-run runtime: InputError (its executor reduces sharded gradients after
// every micro-batch; executor/shard/sharded_model.cpp check_supported refuses such a plan too).
void check_grad_sync_runtime(const Strategy& s, const RuntimeProfile& rt);

// Without --seq: the default sequence (Strategy's, 4096), or the model's text positions where it has fewer (a
// vision-language model's positions hold its image tokens too), with a note on stderr: the default never exceeds
// what the model was trained for. Call before apply_strategy_flags (a --seq given replaces it).
void apply_default_seq(const Args& args, const ModelSpec& m, Strategy& s);

// --image-tokens N: the language-model tokens of a sample's images for a vision-language model (VisionSpec::
// image_tokens; its config.json gives one image at the tower's image size, or none for a dynamic-resolution
// tower). InputError for a model without a vision tower, or a count that is not whole images.
void apply_image_tokens_flag(const Args& args, ModelSpec& m);

}  // namespace fsdp
