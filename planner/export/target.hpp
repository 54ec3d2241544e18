// A framework the plan can be launched with (`--target`, `fsdp-plan export --to`): one final class per target
// (fsdp_run.cpp, torchtitan.cpp, deepspeed.cpp, accelerate.cpp, swift.cpp, torchtune.cpp) that writes a plan the
// target can express into its files and reads those files back. What it can express, its keys and its runtime are
// data (TargetSpec); the export driver (export_plan.hpp) refuses what the capabilities exclude before a writer runs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "export/config_doc.hpp"
#include "export/target_spec.hpp"
#include "hardware/cluster.hpp"
#include "planfile/plan_file.hpp"

namespace fsdp {

struct ExportResult {
  std::vector<WrittenFile> files;  // keyed files are checked against their key tables before they are written
  std::string launch_command;      // for the cluster (also written to launch.sh)
  std::vector<std::string> notes;  // what the user must provide (a training script, a dataset), said once
};

class Target {
 public:
  virtual ~Target() = default;
  virtual std::string name() const = 0;
  // The files of a plan every knob of which the target expresses (export_plan checks that first).
  virtual ExportResult write(const PlanFile& plan, const TargetSpec& spec) const = 0;
  // The files written into `dir` read back (with their key tables) into the strategy they run on `cluster`: what
  // the files state (read_files), then what the target runs without being told (apply_fixed_knobs).
  Strategy read(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster) const;

 protected:
  virtual Strategy read_files(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster) const = 0;
};

// InputError naming the known targets for an unknown name.
const Target& target_by_name(const std::string& name);

// The target's name for the plan's model: its `models` row, or for targets that load Hugging Face checkpoints
// (models.accepts_path) a name with a '/' as given (the hub id a config.json's _name_or_path records, or a path), else
// the local model directory it was read from (`model_path`, PlanFile::model_path; empty for a zoo model). InputError
// naming the model and the target file otherwise.
std::map<std::string, std::string> target_model(const TargetSpec& spec, const std::string& model_name,
                                                const std::string& model_path);

// Strategy knobs no file of the target states, taken from its capabilities' single values (prefetch, attention,
// bucket size, ...): what the target runs without being told.
void apply_fixed_knobs(const TargetSpec& spec, Strategy& s, const Cluster& c);

// Shared text of the launch scripts.
std::string hf_model_dir(const std::string& hf_id);  // /tmp/<last path component>, as the targets' own examples
std::string shell_header(const TargetSpec& spec);    // "#!/bin/sh" and the release it writes for

}  // namespace fsdp
