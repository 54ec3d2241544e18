// The measuring half of `fsdp-run calibrate` (private to executor/calibrate): one Calibrator per rank runs the
// measurements, each in its own file (measure_kernels.cpp, measure_host.cpp, measure_collectives.cpp,
// measure_step_probe.cpp), into plain samples (samples.hpp) that derive_profile.hpp turns into a profile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "calibrate/fit.hpp"
#include "calibrate/probe_plans.hpp"
#include "calibrate/samples.hpp"
#include "dist/comm.hpp"
#include "runtime/runtime_profile.hpp"

namespace fsdp::exec {

namespace cal {

struct Options {
  std::string out, base, name, device, config_root;
  bool quick = false;
  int nproc = 0;
  int timeout_s = 300;
};

class Calibrator {
 public:
  Calibrator(const Options& o, Comm& comm, std::string device, int threads);
  // Every measurement, in its order; rank 0 then writes the profile. Returns the exit code.
  int run(const DistEnv& env);

 private:
  using Clock = std::chrono::steady_clock;
  bool root() const { return comm_.rank() == 0; }
  void progress(const std::string& s) const {
    if (root()) std::cerr << "calibrate: " << s << "\n" << std::flush;
  }
  void sync() const;
  // Lower quartile of repeated timings (lower_quartile): one warm-up call, then at least 4 calls and until a
  // time budget is spent, however short the call. With at most 50 calls a small GEMM (32^3: 13 us on this
  // project's VM) was sampled over under a millisecond, and a series' first shapes, timed right after other
  // work, came out up to 68% slow (run B2, tests/accuracy/README.md); over the whole budget the lower quartile
  // sees the quiet calls.
  double time_op(const std::function<void()>& f) const;
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  // Rank 0's decision, shared, so that every rank runs the same shapes at the same time.
  bool agree(bool v);

  // measure_kernels.cpp
  double memory_bandwidth(const at::TensorOptions& o, int64_t elems);
  void gemms();
  void gemm_dtype(at::ScalarType dt, std::vector<GemmSample>& out);
  void attention(at::ScalarType dt, std::vector<AttnSample>& out);
  void cross_entropy();
  void kernels_again();
  // measure_host.cpp
  std::array<double, 4> probe_pass_times(const ProbeShape& shape, at::ScalarType dt, std::string& note);
  void host_overhead(at::ScalarType dt, HostOverhead& out, BytesPerSecond& elementwise, std::string& note);
  double optimizer_bandwidth(const RuntimeProfile& rt, std::string& note);
  void host();
  // measure_collectives.cpp
  void collectives(const DistEnv& env);
  void measure_group(Group& g, std::vector<CollSample>& out, const std::string& what);
  // measure_step_probe.cpp
  void step_probe(const DistEnv& env, int rounds);
  void finish_step_probe();
  bool oversubscribed_probe(int ranks, DType dtype, int64_t steps, std::vector<double>& to);
  // calibrate.cpp: derive, write, reload through the strict loader, report residuals.
  std::string write_profile();

  Options opt_;
  Comm& comm_;
  std::string device_;
  bool cuda_;
  at::TensorOptions f32_;
  CalibrationSamples s_;  // rank 0's are the ones written
};

}  // namespace cal
}  // namespace fsdp::exec
