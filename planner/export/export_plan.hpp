// `fsdp-plan export plan.yaml --to TARGET` and the files `fsdp-plan --target TARGET` writes next to plan.yaml.
#pragma once

#include <map>
#include <string>

#include "export/target.hpp"

namespace fsdp {

// The plan's files for the target, or an InputError (exit 2) that names every knob the target cannot express and
// the nearest plan it can run with that plan's prediction on the target's runtime. Never changes the plan.
ExportResult export_plan(const PlanFile& plan, const TargetSpec& spec, const std::string& config_root);

// Writes the files and launch.sh into `dir` (created if missing); returns the paths written.
std::vector<std::string> write_export(const ExportResult& r, const TargetSpec& spec, const std::string& dir);

// The keyed files of an export directory parsed with their key tables, by file name.
std::map<std::string, FlatDoc> read_export(const std::string& dir, const TargetSpec& spec);

// read_export then the target's read: the strategy the written files run.
Strategy import_export(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster);

}  // namespace fsdp
