// From what `fsdp-run calibrate` measured to the hardware profile it writes: a pure function of the samples
// and the profiles it starts from (LibTorch-free, no clock, no file), so that every derivation is tested on
// synthetic samples (tests/executor/test_derive_profile.cpp). docs/calibrate.md.
#pragma once

#include <string>

#include "calibrate/profile_yaml.hpp"
#include "calibrate/samples.hpp"
#include "hardware/hardware_profile.hpp"
#include "runtime/backend_profile.hpp"
#include "runtime/runtime_profile.hpp"

namespace fsdp::exec::cal {

struct DeriveInputs {
  std::string name;        // the profile's name
  std::string source;      // the path it will be written to (its `source`)
  HardwareProfile base;    // the fields calibrate cannot measure come from it (peak FLOP/s, NICs, ...)
  BackendProfile backend;  // the c10d backend the collectives ran through
  RuntimeProfile runtime;  // fsdp-run's: the step probes are priced with it
};

struct DerivedProfile {
  HardwareProfile hw;
  ProfileNotes notes;  // where each field came from (written above it)
  std::string report;  // what calibrate prints on stdout about the derivation
};

DerivedProfile derive_profile(const CalibrationSamples& s, const DeriveInputs& in);

// The written profile (as loaded back) against the samples it was fitted on: the simulator's time over the
// measured one, less 1, rms and worst per kernel family and collective.
std::string residual_report(const HardwareProfile& written, const CalibrationSamples& s);

}  // namespace fsdp::exec::cal
