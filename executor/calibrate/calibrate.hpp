// `fsdp-run calibrate` (issue 7): measure this machine (GEMMs, attention, collectives, copies, host
// AdamW, memory) and write a hardware profile that `fsdp-plan --hw FILE.yaml` loads. docs/calibrate.md.
#pragma once

#include <string>
#include <vector>

namespace fsdp::exec {

// args: the command line after the program name, starting with "calibrate"; argv0: the program (for
// --nproc-per-node, which starts N local ranks of it). Returns the exit code; InputError on bad flags.
int run_calibrate(const std::vector<std::string>& args, const std::string& argv0);

}  // namespace fsdp::exec
