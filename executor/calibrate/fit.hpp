// The least-squares fits of `fsdp-run calibrate` (issue 7), LibTorch-free (Eigen inside fit.cpp only):
// alpha-beta lines for collectives, the ring model of docs/hardware.md fitted jointly over collectives and
// group sizes, and efficiency curves that the hardware-profile loader accepts. See docs/calibrate.md.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "program/op_kinds.hpp"

namespace fsdp::exec::cal {

struct LsqResult {
  std::vector<double> coef;           // one per column; 0 for a column the non-negativity dropped
  std::vector<double> rel_residuals;  // (model - measured) / measured, per row
  double rms_rel = 0;                 // root mean square of rel_residuals
  double max_abs_rel = 0;
};

// Minimises sum_i ((A_i . x - y_i) / y_i)^2 subject to x >= 0 (relative residuals: measured times span
// decades, so each sample counts by its relative error). Solved with Eigen's column-pivoting QR for every
// subset of columns (active-set enumeration, at most 6 columns) and the best feasible subset kept.
// rows: the design matrix A, one vector per sample; y: positive measurements. Throws InputError when the
// sizes disagree, a y is not positive, or there are fewer samples than columns.
LsqResult nonneg_relative_lsq(const std::vector<std::vector<double>>& rows, const std::vector<double>& y);

// t = alpha + bytes / beta (Hockney's alpha-beta model).
struct AlphaBeta {
  double alpha_s = 0;
  double beta_Bps = 0;  // 0 when the fit found no bandwidth term
  LsqResult fit;
};
AlphaBeta fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& seconds);

// The step program's collective kinds (program/op_kinds.hpp): calibrate times all-gather, reduce-scatter and
// all-reduce.
using CollKind = CollectiveKind;
inline const char* coll_name(CollKind k) { return to_string(k); }

struct CollSample {
  CollKind kind = CollKind::AllReduce;
  int group = 2;       // ranks in the group
  double bytes = 0;    // nccl-tests buffer size S: all-gather output, reduce-scatter input, all-reduce buffer
  double seconds = 0;  // measured time of one collective
};

// Ring steps and nccl-tests bus-bandwidth factor of docs/hardware.md ("Collective model"):
// all-gather / reduce-scatter N-1 steps, factor (N-1)/N; all-reduce 2(N-1) steps, factor 2(N-1)/N.
int ring_steps(CollKind k, int n);
double busbw_factor(CollKind k, int n);

// The single-tier ring model of docs/hardware.md fitted to samples:
//   t = base_latency + steps * step_latency + factor * S / (bandwidth * bus_efficiency(S)).
// First the line t = base + steps * lat + factor * S / B (non-negative least squares), its latency terms
// scaled down where they exceed a collective's own fixed cost (the intercept of a line t = a + c S fitted
// per collective and group size), then the bus efficiency each size needs to reproduce its mean measured
// time after the latency terms (per collective: its line's time), much as
// hwprofiles/tools/derive_bus_efficiency.py derives the shipped curves: the per-size efficiencies are made
// non-decreasing (isotonic regression), normalised so the largest is 1 (bandwidth = the plateau) and made
// loader-valid.
// The same per-size derivation is also made for each collective alone (`by_kind`, relative to the same
// bandwidth, which is then the highest plateau of any of them): transports whose collectives do not keep
// the ring's cost ratios (Gloo) get one curve per collective (docs/hardware.md, bus_efficiency_<kind>).
struct RingFit {
  double base_latency_s = 0;
  double step_latency_s = 0;
  double bandwidth_Bps = 0;                                            // plateau bus bandwidth
  std::vector<std::pair<double, double>> bus_efficiency;               // (message bytes, efficiency)
  std::map<CollKind, std::vector<std::pair<double, double>>> by_kind;  // a collective's own curve
  LsqResult line;                                                      // the linear fit (before the efficiency curve)
  double line_bandwidth_Bps = 0;
  int outliers = 0;          // timings left out of the line fit (trimmed least squares, see fit.cpp)
  double latency_scale = 1;  // < 1: the line's latency terms were scaled down to the collectives' own
};
RingFit fit_ring(const std::vector<CollSample>& samples);

// Points (x, efficiency) -> a curve docs/hardware.md's loader accepts: sorted by x, points within 1%
// of each other's x merged (mean efficiency), efficiencies clamped into [1e-6, 1], and where a point
// rises faster than the loader allows (more than ln 2 x the previous efficiency per doubling of x: more
// work would take less time) the previous point raised to the smallest allowed value, working from the
// largest x down (the plateau stays as measured). `raised` counts those.
struct Curve {
  std::vector<double> x, e;
  int raised = 0;
};
Curve make_efficiency_curve(std::vector<std::pair<double, double>> points);

// Pool-adjacent-violators: the weighted least-squares non-decreasing sequence closest to y.
std::vector<double> isotonic_non_decreasing(const std::vector<double>& y, const std::vector<double>& w);

// Robust summaries of repeated timings.
double median(std::vector<double> v);
// The lower quartile: for a kernel whose cost is fixed, interference from other processes only adds time,
// so a low quantile estimates the kernel's own cost (Python's timeit documentation makes the same argument
// for the minimum) while staying clear of the single luckiest run.
double lower_quartile(std::vector<double> v);
// Two timings of one series of kernels, as (seconds, seconds) per shape: the largest relative gap between a
// shape's two timings (slower / faster - 1); 0 for an empty series.
double largest_gap(const std::vector<std::pair<double, double>>& timings);

}  // namespace fsdp::exec::cal
