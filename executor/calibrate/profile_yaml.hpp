// Writes a HardwareProfile as hwprofiles/*.yaml text (schema: docs/hardware.md), every field preceded by
// its comment (where the number came from). LibTorch-free; the output loads with load_hardware.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hardware/hardware_profile.hpp"

namespace fsdp::exec::cal {

struct ProfileNotes {
  std::vector<std::string> header;  // comment lines at the top of the file
  // Comment per field, by dotted key: "device.memory", "device.peak_flops.bf16", "node.intra_node",
  // "collectives.base_latency", ... A note may hold several lines ('\n').
  std::map<std::string, std::string> note;
};

std::string hardware_profile_yaml(const HardwareProfile& hw, const ProfileNotes& notes);

// The keys hardware_profile_yaml writes for `hw` (every required field of the schema, plus the optional
// per-dtype curves and device.cores the profile has); the calibration checks that each one got a note.
std::vector<std::string> profile_note_keys(const HardwareProfile& hw);

}  // namespace fsdp::exec::cal
