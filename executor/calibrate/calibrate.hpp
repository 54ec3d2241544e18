// `fsdp-run calibrate` (issue 7): measure this machine (GEMMs, attention, collectives, copies, host
// AdamW, memory) and write a hardware profile that `fsdp-plan --hw FILE.yaml` loads. docs/calibrate.md.
#pragma once

#include <string>
#include <vector>

#include "planfile/plan_file.hpp"

namespace fsdp::exec {

// args: the command line after the program name, starting with "calibrate"; argv0: the program (for
// --nproc-per-node, which starts N local ranks of it). Returns the exit code; InputError on bad flags.
int run_calibrate(const std::vector<std::string>& args, const std::string& argv0);

// The step probe's plan over `ranks` local ranks on `device` ("cpu" or "cuda"), computing in `compute`: the plan
// whose measured steps give collectives.in_step_factor (over the node's ranks) and in_step_factor_shared_cores
// (over twice the CPUs), with the suffix _fp32 for the fp32 probe's.
PlanFile step_probe_plan(int ranks, const std::string& device, DType compute);

}  // namespace fsdp::exec
