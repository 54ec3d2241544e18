// Least-squares fits of the calibration (docs/calibrate.md). Eigen is used here only, so that the
// header stays free of it.
#include "calibrate/fit.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/errors.hpp"

namespace fsdp::exec::cal {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double lower_quartile(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Linear interpolation between order statistics (the usual "type 7" quantile).
  const double pos = 0.25 * static_cast<double>(v.size() - 1);
  const std::size_t i = static_cast<std::size_t>(pos);
  const double w = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - w) + v[i + 1] * w : v[i];
}

double largest_gap(const std::vector<std::pair<double, double>>& timings) {
  double gap = 0;
  for (const auto& [a, b] : timings) {
    if (!(a > 0) || !(b > 0)) throw InputError("timings must be positive");
    gap = std::max(gap, std::max(a, b) / std::min(a, b) - 1);
  }
  return gap;
}

LsqResult nonneg_relative_lsq(const std::vector<std::vector<double>>& rows, const std::vector<double>& y) {
  if (rows.size() != y.size() || rows.empty())
    throw InputError("least squares: rows and measurements differ in number");
  const std::size_t cols = rows.front().size();
  if (cols == 0 || cols > 6) throw InputError("least squares: 1 to 6 columns expected");
  if (rows.size() < cols) throw InputError("least squares: fewer samples than unknowns");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].size() != cols) throw InputError("least squares: rows of different lengths");
    if (!(y[i] > 0) || !std::isfinite(y[i])) throw InputError("least squares: measurements must be positive");
  }
  // Relative residuals: divide row i and its target by y_i, so the target becomes 1.
  const Eigen::Index n = static_cast<Eigen::Index>(rows.size());
  Eigen::MatrixXd A(n, static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < n; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      A(i, static_cast<Eigen::Index>(j)) = rows[static_cast<std::size_t>(i)][j] / y[static_cast<std::size_t>(i)];
  const Eigen::VectorXd ones = Eigen::VectorXd::Ones(n);

  double best_err = std::numeric_limits<double>::infinity();
  Eigen::VectorXd best = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(cols));
  // Every non-empty subset of columns (the active set of x >= 0 is one of them); larger subsets first so
  // that, on ties (collinear columns), the earlier, larger subset wins.
  for (unsigned mask = (1u << cols) - 1; mask >= 1; --mask) {
    std::vector<Eigen::Index> use;
    for (std::size_t j = 0; j < cols; ++j)
      if (mask & (1u << j)) use.push_back(static_cast<Eigen::Index>(j));
    Eigen::MatrixXd S(n, static_cast<Eigen::Index>(use.size()));
    for (std::size_t c = 0; c < use.size(); ++c) S.col(static_cast<Eigen::Index>(c)) = A.col(use[c]);
    Eigen::VectorXd xs = S.colPivHouseholderQr().solve(ones);
    bool feasible = xs.allFinite();
    for (Eigen::Index c = 0; feasible && c < xs.size(); ++c) feasible = xs(c) >= 0;
    if (feasible) {
      Eigen::VectorXd x = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(cols));
      for (std::size_t c = 0; c < use.size(); ++c) x(use[c]) = xs(static_cast<Eigen::Index>(c));
      const double err = (A * x - ones).squaredNorm();
      if (err < best_err * (1 - 1e-12)) {
        best_err = err;
        best = x;
      }
    }
    if (mask == 1) break;
  }
  LsqResult r;
  r.coef.assign(best.data(), best.data() + best.size());
  const Eigen::VectorXd res = A * best - ones;
  double ss = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    r.rel_residuals.push_back(res(i));
    ss += res(i) * res(i);
    r.max_abs_rel = std::max(r.max_abs_rel, std::abs(res(i)));
  }
  r.rms_rel = std::sqrt(ss / static_cast<double>(n));
  return r;
}

AlphaBeta fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  if (bytes.size() != seconds.size()) throw InputError("alpha-beta fit: sizes and times differ in number");
  std::vector<std::vector<double>> rows;
  for (double b : bytes) rows.push_back({1.0, b});
  AlphaBeta ab;
  ab.fit = nonneg_relative_lsq(rows, seconds);
  ab.alpha_s = ab.fit.coef[0];
  ab.beta_Bps = ab.fit.coef[1] > 0 ? 1.0 / ab.fit.coef[1] : 0.0;
  return ab;
}

int ring_steps(CollKind k, int n) { return k == CollKind::AllReduce ? 2 * (n - 1) : n - 1; }

double busbw_factor(CollKind k, int n) {
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return k == CollKind::AllReduce ? 2 * f : f;
}

std::vector<double> isotonic_non_decreasing(const std::vector<double>& y, const std::vector<double>& w) {
  FSDP_ASSERT(y.size() == w.size(), "isotonic: sizes differ");
  struct Block {
    double sum_wy, sum_w;
    std::size_t count;
    double mean() const { return sum_wy / sum_w; }
  };
  std::vector<Block> blocks;
  for (std::size_t i = 0; i < y.size(); ++i) {
    blocks.push_back({w[i] * y[i], w[i], 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean() > blocks.back().mean()) {
      Block b = blocks.back();
      blocks.pop_back();
      blocks.back().sum_wy += b.sum_wy;
      blocks.back().sum_w += b.sum_w;
      blocks.back().count += b.count;
    }
  }
  std::vector<double> out;
  for (const Block& b : blocks) out.insert(out.end(), b.count, b.mean());
  return out;
}

Curve make_efficiency_curve(std::vector<std::pair<double, double>> points) {
  std::sort(points.begin(), points.end());
  Curve c;
  std::vector<int> counts;
  for (const auto& [x, e] : points) {
    if (!(x > 0) || !std::isfinite(x) || !std::isfinite(e)) continue;
    if (!c.x.empty() && x <= c.x.back() * 1.01) {
      const double k = counts.back();
      c.e.back() = (c.e.back() * k + e) / (k + 1);
      ++counts.back();
      continue;
    }
    c.x.push_back(x);
    c.e.push_back(e);
    counts.push_back(1);
  }
  for (double& e : c.e) e = std::clamp(e, 1e-6, 1.0);
  // The loader's rule (simulator/hardware/hardware_profile.cpp, read_curve): the rise per doubling of x
  // must not exceed ln(2) x the previous efficiency. Enforced from the largest x down, raising the earlier
  // point where needed: the plateau of large calls (which dominate time) stays as measured, and only small
  // calls become faster than measured. A small margin keeps the rule after printing six digits.
  for (std::size_t i = c.x.size(); i-- > 1;) {
    const double floor = c.e[i] / (1 + std::log(2.0) * std::log2(c.x[i] / c.x[i - 1]) * (1 - 1e-4));
    if (c.e[i - 1] < floor) {
      c.e[i - 1] = floor;
      ++c.raised;
    }
  }
  return c;
}

RingFit finish_ring(RingFit f, const std::vector<CollSample>& samples);

RingFit fit_ring(const std::vector<CollSample>& samples) {
  if (samples.size() < 2) throw InputError("collective fit: at least two timings needed");
  // With a single group size, a constant cost and a per-step one cannot be told apart (at 2 ranks every
  // collective has 1 or 2 ring steps, and Gloo's all-reduce is no ring, so that difference is not the ring's):
  // the fit leaves the constant out and the whole fixed cost goes to the ring steps, so that a larger group
  // pays it per hop, as each hop of a ring is a blocking exchange between two processes. Where calibrate saw
  // several group sizes the data decide.
  bool one_size = true;
  for (const CollSample& s : samples) one_size = one_size && s.group == samples.front().group;
  const std::size_t first = one_size ? 1 : 0;
  std::vector<std::vector<double>> rows;
  std::vector<double> y;
  for (const CollSample& s : samples) {
    if (s.group < 2) throw InputError("collective fit: a group of one rank has no collective cost");
    std::vector<double> row{1.0, static_cast<double>(ring_steps(s.kind, s.group)),
                            busbw_factor(s.kind, s.group) * s.bytes};
    rows.push_back(std::vector<double>(row.begin() + static_cast<std::ptrdiff_t>(first), row.end()));
    y.push_back(s.seconds);
  }
  // The line's coefficients are always (base, per step, 1 / bandwidth).
  auto fit_line = [&](const std::vector<std::vector<double>>& r, const std::vector<double>& t) {
    LsqResult l = nonneg_relative_lsq(r, t);
    if (one_size) l.coef.insert(l.coef.begin(), 0.0);
    return l;
  };
  RingFit f;
  f.line = fit_line(rows, y);
  // Trimmed least squares: timings more than 3x the median relative residual off the line (and more than
  // 25% off) are outliers for the line (a stalled TCP exchange, a preempted rank); refit once without them.
  {
    std::vector<double> a;
    for (double r : f.line.rel_residuals) a.push_back(std::abs(r));
    const double cut = std::max(0.25, 3 * median(a));
    std::vector<std::vector<double>> rows2;
    std::vector<double> y2;
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (std::abs(f.line.rel_residuals[i]) <= cut) {
        rows2.push_back(rows[i]);
        y2.push_back(y[i]);
      }
    f.outliers = static_cast<int>(rows.size() - rows2.size());
    if (f.outliers > 0 && rows2.size() >= 3)
      f.line = fit_line(rows2, y2);
    else
      f.outliers = 0;
  }
  // The bus-efficiency curve below uses every timing, outliers included: a size that is really slow
  // (not a one-off) shows in its own point, while the latency and bandwidth come from the trimmed line.
  return finish_ring(f, samples);
}

RingFit finish_ring(RingFit f, const std::vector<CollSample>& samples) {
  f.base_latency_s = f.line.coef[0];
  f.step_latency_s = f.line.coef[1];
  // A bandwidth term that explains under 1% of any timing is no bandwidth term (rounding, not data).
  double share = 0;
  for (const CollSample& s : samples)
    share = std::max(share, f.line.coef[2] * busbw_factor(s.kind, s.group) * s.bytes / s.seconds);
  if (!(f.line.coef[2] > 0) || share < 0.01)
    throw InputError("collective fit: the timings do not grow with the message size (no bandwidth term)");
  f.line_bandwidth_Bps = 1.0 / f.line.coef[2];
  // Per (collective, group size), a line t = a + c S over its sizes (relative non-negative least squares)
  // smooths the per-size noise of single timings, and its intercept a is that collective's own fixed cost.
  std::map<std::pair<CollKind, int>, std::pair<double, double>> own_line;  // -> (a, c)
  {
    std::map<std::pair<CollKind, int>, std::vector<const CollSample*>> by;
    for (const CollSample& s : samples) by[{s.kind, s.group}].push_back(&s);
    for (const auto& [key, v] : by) {
      std::vector<std::vector<double>> rows;
      std::vector<double> y;
      double lo = v.front()->bytes, hi = lo;
      for (const CollSample* s : v) {
        rows.push_back({1.0, s->bytes});
        y.push_back(s->seconds);
        lo = std::min(lo, s->bytes);
        hi = std::max(hi, s->bytes);
      }
      if (hi <= lo) continue;  // one size: no line
      const LsqResult r = nonneg_relative_lsq(rows, y);
      if (r.coef[1] > 0) own_line[key] = {r.coef[0], r.coef[1]};
    }
  }
  // The latency terms may not exceed any collective's own fixed cost (or half a timing where it has no
  // line): a transport whose collectives do not share the ring's latency structure (Gloo) otherwise gets
  // latency terms that alone are slower than its fast collectives. Both terms are scaled down together.
  auto smoothed = [&](const CollSample& s) {
    auto it = own_line.find({s.kind, s.group});
    return it == own_line.end() ? s.seconds : it->second.first + it->second.second * s.bytes;
  };
  {
    double scale = 1;
    for (const CollSample& s : samples) {
      const double lat = f.base_latency_s + f.step_latency_s * ring_steps(s.kind, s.group);
      auto it = own_line.find({s.kind, s.group});
      const double bound = it == own_line.end() ? 0.5 * s.seconds : it->second.first;
      if (lat > bound) scale = std::min(scale, bound / lat);
    }
    f.base_latency_s *= scale;
    f.step_latency_s *= scale;
    f.latency_scale = scale;
  }

  // Bus bandwidth each size needs, after the latency terms: mean over all collectives at that size (the
  // shared curve, from the measured times), and per collective (from its line).
  using Need = std::map<double, std::pair<double, int>>;  // bytes -> (sum of needed busbw, count)
  Need all;
  std::map<CollKind, Need> kind;
  for (const CollSample& s : samples) {
    const double lat = f.base_latency_s + f.step_latency_s * ring_steps(s.kind, s.group);
    const double fac = busbw_factor(s.kind, s.group) * s.bytes;
    auto add = [](Need& n, double bytes, double busbw) {
      auto& [sum, cnt] = n[bytes];
      sum += busbw;
      ++cnt;
    };
    // Shared curve: latency-dominated timings say little about the bandwidth and are left out.
    if (s.seconds >= 2 * lat) add(all, s.bytes, fac / (s.seconds - lat));
    // Own curve: the collective's line exceeds the latency terms by its bandwidth term at every size.
    const double t_own = smoothed(s);
    if (t_own > lat) add(kind[s.kind], s.bytes, fac / (t_own - lat));
  }
  if (all.empty() && kind.empty()) {
    double largest = 0;
    for (const CollSample& s : samples) largest = std::max(largest, s.bytes);
    f.bandwidth_Bps = f.line_bandwidth_Bps;
    f.bus_efficiency = {{largest, 1.0}};
    return f;
  }
  // Efficiency relative to the line's bandwidth, made non-decreasing with size (isotonic).
  auto relative = [&](const Need& n) {
    std::vector<double> xs, eff, w;
    for (const auto& [bytes, sc] : n) {
      xs.push_back(bytes);
      eff.push_back(sc.first / sc.second / f.line_bandwidth_Bps);
      w.push_back(sc.second);
    }
    eff = isotonic_non_decreasing(eff, w);
    std::vector<std::pair<double, double>> pts;
    for (std::size_t i = 0; i < xs.size(); ++i) pts.emplace_back(xs[i], eff[i]);
    return pts;
  };
  const auto shared = relative(all);
  std::map<CollKind, std::vector<std::pair<double, double>>> own;
  if (kind.size() > 1)
    for (const auto& [k, n] : kind) own[k] = relative(n);
  // The tier's bandwidth is the highest plateau; every curve is relative to it.
  double top = 0;
  for (const auto& [x, e] : shared) top = std::max(top, e);
  for (const auto& [k, pts] : own)
    for (const auto& [x, e] : pts) top = std::max(top, e);
  f.bandwidth_Bps = f.line_bandwidth_Bps * top;
  auto to_curve = [&](const std::vector<std::pair<double, double>>& pts) {
    std::vector<std::pair<double, double>> scaled;
    for (const auto& [x, e] : pts) scaled.emplace_back(x, e / top);
    Curve c = make_efficiency_curve(scaled);
    std::vector<std::pair<double, double>> out;
    for (std::size_t i = 0; i < c.x.size(); ++i) out.emplace_back(c.x[i], c.e[i]);
    return out;
  };
  f.bus_efficiency = to_curve(shared);
  if (f.bus_efficiency.empty()) {  // every timing latency-dominated: the plateau at the largest size
    double largest = 0;
    for (const CollSample& s : samples) largest = std::max(largest, s.bytes);
    f.bus_efficiency = {{largest, 1.0}};
  }
  for (const auto& [k, pts] : own) f.by_kind[k] = to_curve(pts);
  return f;
}

}  // namespace fsdp::exec::cal
