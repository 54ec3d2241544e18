// fsdp-run calibrate (issue 7): the least-squares fits, the profile writer against the strict loader,
// and a --quick run of the binary on 2 local ranks.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "test_common.hpp"
// (test_common.hpp first: torch headers before doctest)
#include "calibrate/derive_profile.hpp"
#include "calibrate/fit.hpp"
#include "calibrate/probe_plans.hpp"
#include "calibrate/profile_yaml.hpp"
#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "core/errors.hpp"
#include "hardware/hardware_profile.hpp"
#include "model/module_graph.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"

namespace fsdp::exec::test {
namespace fs = std::filesystem;
using namespace fsdp::exec::cal;

namespace {

using Result = ShellResult;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() / ("exec_cal_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

// The in-step collective time (s) an in-step factor was fitted to: its note in a written profile ends in
// "factor = A ms / B ms" on the comment lines above `key:`. 0 when the key is absent.
double noted_in_step_s(const std::string& profile_text, const std::string& key) {
  const std::size_t at = profile_text.find("\n  " + key + ":");
  if (at == std::string::npos) return 0;
  const std::size_t f = profile_text.rfind("factor = ", at);
  REQUIRE(f != std::string::npos);
  return std::stod(profile_text.substr(f + 9)) * 1e-3;
}

// Deterministic +-1% "noise" that does not average out trivially.
double wobble(int i) { return 1.0 + 0.01 * std::sin(1.7 * i + 0.3); }

}  // namespace

TEST_CASE("alpha-beta fit recovers alpha and beta from synthetic timings") {
  const double alpha = 50e-6, beta = 2e9;
  std::vector<double> bytes, t;
  for (int i = 0; i < 12; ++i) {
    bytes.push_back(4096.0 * std::pow(2.0, i));
    t.push_back((alpha + bytes.back() / beta) * wobble(i));
  }
  AlphaBeta ab = fit_alpha_beta(bytes, t);
  CHECK(rel(ab.alpha_s, alpha) < 0.05);
  CHECK(rel(ab.beta_Bps, beta) < 0.02);
  CHECK(ab.fit.max_abs_rel < 0.02);
  CHECK(ab.fit.rms_rel > 0);  // the wobble is seen as residual

  SUBCASE("exact data: exact fit") {
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = alpha + bytes[i] / beta;
    ab = fit_alpha_beta(bytes, t);
    CHECK(rel(ab.alpha_s, alpha) < 1e-9);
    CHECK(rel(ab.beta_Bps, beta) < 1e-9);
    CHECK(ab.fit.max_abs_rel < 1e-9);
  }
  SUBCASE("a negative intercept is not fitted: alpha stays >= 0") {
    for (std::size_t i = 0; i < t.size(); ++i) {
      bytes[i] = 8e6 * std::pow(2.0, static_cast<double>(i));
      t[i] = -1e-3 + bytes[i] / beta;  // all positive; the unconstrained intercept would be -1 ms
    }
    ab = fit_alpha_beta(bytes, t);
    CHECK(ab.alpha_s == 0);
    CHECK(ab.beta_Bps > 0);
  }
}

TEST_CASE("least squares recovers a fixed time per pass and one rate for the bytes (the host-overhead fit's form)") {
  // time(pass k, shape) = host_k + bytes(k, shape) / bandwidth, four passes, three shapes, 2% wobble.
  const std::vector<double> host{250e-6, 350e-6, 40e-6, 120e-6};
  const double bw = 7.5e9;
  std::vector<std::vector<double>> rows;
  std::vector<double> y;
  int i = 0;
  for (double scale : {0.05, 1.0, 2.5})
    for (std::size_t k = 0; k < host.size(); ++k) {
      std::vector<double> row(5, 0.0);
      row[k] = 1.0;
      row[4] = scale * 1e6 * (1.0 + static_cast<double>(k));  // bytes differ by pass and shape
      rows.push_back(row);
      y.push_back((host[k] + row[4] / bw) * wobble(i++));
    }
  const LsqResult fit = nonneg_relative_lsq(rows, y);
  REQUIRE(fit.coef.size() == 5);
  for (std::size_t k = 0; k < host.size(); ++k) CHECK(rel(fit.coef[k], host[k]) < 0.1);
  CHECK(rel(1.0 / fit.coef[4], bw) < 0.05);
  CHECK(fit.max_abs_rel < 0.03);
  std::vector<std::vector<double>> seven(7, std::vector<double>(7, 1.0));
  CHECK_THROWS_AS(nonneg_relative_lsq(seven, std::vector<double>(7, 1.0)), InputError);  // at most 6 unknowns
}

TEST_CASE("least squares refuses malformed input") {
  CHECK_THROWS_AS(nonneg_relative_lsq({{1.0, 2.0}}, {1.0}), InputError);         // fewer samples than unknowns
  CHECK_THROWS_AS(nonneg_relative_lsq({{1.0}, {2.0}}, {1.0, 0.0}), InputError);  // non-positive measurement
  CHECK_THROWS_AS(nonneg_relative_lsq({{1.0}, {2.0, 3.0}}, {1.0, 2.0}), InputError);
  CHECK_THROWS_AS(fit_alpha_beta({1.0, 2.0}, {1.0}), InputError);
}

TEST_CASE("two timings of a kernel series: the largest gap between a shape's timings, either way") {
  CHECK(largest_gap({}) == 0.0);
  CHECK(largest_gap({{1.0, 1.0}, {2.0, 2.0}}) == doctest::Approx(0.0));
  // Run A's fp32 GEMMs: 2.81 and 3.40 GFLOP/s at 32^3 (times in the inverse ratio), 4.18 and 4.13 at 256^3.
  CHECK(largest_gap({{1 / 2.81, 1 / 3.40}, {1 / 4.18, 1 / 4.13}}) == doctest::Approx(3.40 / 2.81 - 1));
  CHECK(largest_gap({{1.0, 1.04}, {1.5, 1.0}}) == doctest::Approx(0.5));  // the slower first or second alike
  CHECK_THROWS_AS(largest_gap({{1.0, 0.0}}), InputError);
}

TEST_CASE("ring fit recovers base latency, step latency and bandwidth over collectives and group sizes") {
  const double base = 20e-6, step = 7e-6, bw = 5e9;
  std::vector<CollSample> v;
  for (int n : {2, 4})
    for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce})
      for (double s = 16384; s <= 64 << 20; s *= 4)
        v.push_back({k, n, s, base + ring_steps(k, n) * step + busbw_factor(k, n) * s / bw});
  RingFit f = fit_ring(v);
  CHECK(rel(f.base_latency_s, base) < 1e-6);
  CHECK(rel(f.step_latency_s, step) < 1e-6);
  CHECK(rel(f.bandwidth_Bps, bw) < 1e-6);
  CHECK(f.line.max_abs_rel < 1e-9);
  for (const auto& [x, e] : f.bus_efficiency) CHECK(e == doctest::Approx(1.0).epsilon(1e-6));

  SUBCASE("a slower small-message regime becomes a rising bus-efficiency curve, plateau 1") {
    for (auto& s : v)
      if (s.bytes < 1 << 20) s.seconds *= 1.5;
    f = fit_ring(v);
    REQUIRE(f.bus_efficiency.size() >= 2);
    CHECK(f.bus_efficiency.front().second < 1.0);
    CHECK(f.bus_efficiency.back().second == doctest::Approx(1.0));
    for (std::size_t i = 1; i < f.bus_efficiency.size(); ++i)
      CHECK(f.bus_efficiency[i].second >= f.bus_efficiency[i - 1].second);
  }
  SUBCASE("timings that do not grow with size are refused") {
    for (auto& s : v) s.seconds = 1e-3;
    CHECK_THROWS_AS(fit_ring(v), InputError);
  }
}

TEST_CASE("ring fit over one group size puts the fixed cost on the ring steps") {
  // Only 2-rank timings (a 2-CPU machine): a constant and a per-step latency cannot be told apart, so the
  // constant is left out and larger groups pay the fixed cost per hop.
  const double base = 300e-6, bw = 1e9;
  std::vector<CollSample> v;
  for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce})
    for (double s = 64 * 1024; s <= 4 << 20; s *= 2) v.push_back({k, 2, s, base + busbw_factor(k, 2) * s / bw});
  const RingFit f = fit_ring(v);
  CHECK(f.base_latency_s == 0);
  CHECK(f.step_latency_s > 0);
  REQUIRE(f.line.coef.size() == 3);
  CHECK(f.line.coef[0] == 0);
  CHECK(f.line_bandwidth_Bps > 0);
  // The same timings with a 4-rank group added: the data now separate the two terms (exact data here).
  for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce})
    for (double s = 64 * 1024; s <= 4 << 20; s *= 2) v.push_back({k, 4, s, base + busbw_factor(k, 4) * s / bw});
  const RingFit g = fit_ring(v);
  CHECK(rel(g.base_latency_s, base) < 1e-3);
}

TEST_CASE("collectives that do not keep the ring's cost ratios get one curve each (Gloo-like timings)") {
  // Gloo on 2 CPU ranks (docs/calibrate.md): all-reduce costs far more than the ring's 2x an all-gather, and
  // fsdp-run's reduce-scatter on Gloo is an all-reduce. Lines t = a + S / B per collective, 1% noise.
  struct Line {
    CollKind k;
    double a, B;
  };
  const Line lines[] = {{CollKind::AllGather, 300e-6, 1.2e9},
                        {CollKind::ReduceScatter, 900e-6, 0.9e9},
                        {CollKind::AllReduce, 500e-6, 1.0e9}};
  std::vector<CollSample> v;
  int i = 0;
  for (const Line& l : lines)
    for (double s = 64 * 1024; s <= 4 << 20; s *= 2) v.push_back({l.k, 2, s, (l.a + s / l.B) * wobble(i++)});
  const RingFit f = fit_ring(v);
  REQUIRE(f.by_kind.size() == 3);
  auto profile = [&](bool own) {
    HardwareProfile hw = load_hardware("cpu", FSDP_SOURCE_ROOT);
    hw.collective_base_latency = Seconds(f.base_latency_s);
    hw.intra_node.latency = Seconds(f.step_latency_s);
    hw.intra_node.bandwidth = BytesPerSecond(f.bandwidth_Bps);
    auto curve = [](const std::vector<std::pair<double, double>>& pts) {
      EfficiencyCurve c;
      for (const auto& [x, e] : pts) {
        c.x.push_back(x);
        c.efficiency.push_back(e);
      }
      return c;
    };
    hw.intra_node.bus_efficiency = curve(f.bus_efficiency);
    if (own) {
      hw.intra_node.bus_efficiency_all_gather = curve(f.by_kind.at(CollKind::AllGather));
      hw.intra_node.bus_efficiency_reduce_scatter = curve(f.by_kind.at(CollKind::ReduceScatter));
      hw.intra_node.bus_efficiency_all_reduce = curve(f.by_kind.at(CollKind::AllReduce));
    }
    return hw;
  };
  auto worst = [&](const HardwareProfile& hw) {
    double w = 0;
    for (const CollSample& s : v) {
      const CollectiveKind c = s.kind == CollKind::AllGather       ? CollectiveKind::AllGather
                               : s.kind == CollKind::ReduceScatter ? CollectiveKind::ReduceScatter
                                                                   : CollectiveKind::AllReduce;
      w = std::max(w, rel(collective_time(hw, c, Bytes(s.bytes), make_group(hw, 2, 2)).value, s.seconds));
    }
    return w;
  };
  const double with_own = worst(profile(true)), shared_only = worst(profile(false));
  INFO("worst relative error: own curves " << with_own << ", shared curve only " << shared_only);
  CHECK(with_own < 0.1);
  CHECK(shared_only > 0.3);  // one ring-shaped curve cannot price these collectives
  // Every curve is loader-valid: efficiencies in (0, 1], the plateau (the bandwidth) reached by one of them.
  double top = 0;
  for (const auto& [k, pts] : f.by_kind)
    for (const auto& [x, e] : pts) {
      CHECK(e > 0);
      CHECK(e <= 1);
      top = std::max(top, e);
    }
  CHECK(top == doctest::Approx(1.0));
}

TEST_CASE("efficiency curves: sorted, merged, clamped and never rising faster than the loader allows") {
  Curve c = make_efficiency_curve({{1e9, 0.5}, {1e6, 0.2}, {1.005e6, 0.3}, {1e7, 2.0}});
  REQUIRE(c.x.size() == 3);
  CHECK(c.x[0] == 1e6);
  CHECK(c.e[1] == 1.0);  // clamped
  CHECK(c.e[2] == 0.5);
  // 1e6 -> 1e7 is 3.32 doublings: the loader needs e(1e6) >= 1 / (1 + ln2 x 3.32) = 0.303, so the merged
  // 0.25 (mean of 0.2 and 0.3, x within 1%) is raised; the plateau stays as measured.
  CHECK(c.e[0] == doctest::Approx(1.0 / (1 + std::log(2.0) * std::log2(10.0))).epsilon(1e-3));
  CHECK(c.raised == 1);
  for (std::size_t i = 1; i < c.x.size(); ++i)
    CHECK((c.e[i] - c.e[i - 1]) / std::log2(c.x[i] / c.x[i - 1]) <= std::log(2.0) * c.e[i - 1]);
  c = make_efficiency_curve({{1e6, 0.2}, {1.005e6, 0.3}, {1e7, 0.3}});
  REQUIRE(c.x.size() == 2);
  CHECK(c.e[0] == doctest::Approx(0.25));
  CHECK(c.raised == 0);
  const std::vector<double> iso = isotonic_non_decreasing({1, 3, 2, 4}, {1, 1, 1, 1});
  CHECK(iso == std::vector<double>{1, 2.5, 2.5, 4});
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 2, 3}) == 2.5);
  CHECK(lower_quartile({4, 1, 3, 2}) == doctest::Approx(1.75));  // position 0.75 between 1 and 2
  CHECK(lower_quartile({9, 1, 5, 3, 7}) == 3);
  CHECK(lower_quartile({5}) == 5);
}

TEST_CASE("a written profile loads with load_hardware and round-trips") {
  TmpDir d;
  HardwareProfile hw = load_hardware("cpu", FSDP_SOURCE_ROOT);
  hw.name = "round trip";
  hw.usable_device_memory = Bytes(12345678901.0);
  hw.peak_flops_bf16 = FlopsPerSecond(6.933e12);
  hw.memory_bandwidth = BytesPerSecond(30.1243e9);
  Curve mm = make_efficiency_curve({{6.5536e4, 0.031}, {5.24e5, 0.2}, {4.2e6, 0.03}, {2.7e8, 0.025}});
  hw.matmul_efficiency = EfficiencyCurve{mm.x, mm.e};
  // The optional per-dtype curves and the CPU device's cores are written only when present.
  Curve bf = make_efficiency_curve({{6.5536e4, 0.02}, {4.2e6, 0.5}, {2.7e8, 1.0}});
  hw.matmul_efficiency_bf16 = EfficiencyCurve{bf.x, bf.e};
  hw.attention_efficiency_bf16 = EfficiencyCurve{{1e6, 1e8}, {0.1, 0.15}};
  hw.attention_backward_efficiency_bf16 = EfficiencyCurve{{2.5e6}, {0.07}};
  hw.device_cores = 0.5;
  hw.elementwise_bandwidth_bf16 = BytesPerSecond(7.46902e9);
  hw.matmul_forward_ratio_fp32 = 1.468;
  // cpu.yaml carries calibrate's fp32 elementwise rate and bf16 forward ratio: cleared, so that the dtypes
  // without one are checked to be left out of the file and to fall back.
  hw.elementwise_bandwidth_fp32 = BytesPerSecond(0);
  hw.matmul_forward_ratio_bf16 = 0;
  hw.collective_in_step_factor = 1.23;
  hw.collective_in_step_factor_shared_cores = 0.91;
  hw.collective_in_step_factor_fp32 = 0.84;
  hw.collective_in_step_factor_shared_cores_fp32 = 1.07;
  hw.host_overhead_fp32.unit = Seconds(1.47e-3);
  hw.host_overhead_bf16 =
      HostOverhead{Seconds(285.5e-6), Seconds(393.8e-6), Seconds(44.46e-6), Seconds(124.3e-6), Seconds(680.6e-6)};
  hw.intra_node.bandwidth = BytesPerSecond(0.612e9);
  hw.intra_node.latency = Seconds(3.5e-6);
  hw.intra_node.bus_efficiency = EfficiencyCurve{{262144, 4194304}, {0.4, 1.0}};
  hw.host_flops_per_core = FlopsPerSecond(2.43479e9);
  hw.collective_base_latency = Seconds(308.19e-6);
  ProfileNotes notes;
  notes.header = {"test"};
  const std::vector<std::string> keys = profile_note_keys(hw);
  CHECK(std::find(keys.begin(), keys.end(), "device.matmul_efficiency_bf16") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "device.matmul_efficiency_fp16") == keys.end());  // absent: not written
  CHECK(std::find(keys.begin(), keys.end(), "device.cores") != keys.end());
  for (const auto& k : keys) notes.note[k] = "note for " + k + "\nsecond line";
  const std::string path = d / "rt.yaml";
  std::ofstream(path) << hardware_profile_yaml(hw, notes);
  const HardwareProfile back = load_hardware(path, FSDP_SOURCE_ROOT);
  CHECK(back.name == hw.name);
  CHECK(back.device_kind == hw.device_kind);
  CHECK(rel(back.device_memory.value, hw.device_memory.value) < 1e-9);  // written in whole bytes
  CHECK(back.usable_device_memory.value == hw.usable_device_memory.value);
  CHECK(rel(back.peak_flops_fp32.value, hw.peak_flops_fp32.value) < 1e-5);
  CHECK(rel(back.peak_flops_bf16.value, hw.peak_flops_bf16.value) < 1e-5);
  CHECK(rel(back.memory_bandwidth.value, hw.memory_bandwidth.value) < 1e-5);
  REQUIRE(back.matmul_efficiency.x.size() == hw.matmul_efficiency.x.size());
  for (std::size_t i = 0; i < back.matmul_efficiency.x.size(); ++i) {
    CHECK(rel(back.matmul_efficiency.x[i], hw.matmul_efficiency.x[i]) < 1e-6);
    CHECK(rel(back.matmul_efficiency.efficiency[i], hw.matmul_efficiency.efficiency[i]) < 1e-5);
  }
  auto same_curve = [](const EfficiencyCurve& a, const EfficiencyCurve& b) {
    REQUIRE(a.x.size() == b.x.size());
    for (std::size_t i = 0; i < a.x.size(); ++i) {
      CHECK(rel(a.x[i], b.x[i]) < 1e-6);
      CHECK(rel(a.efficiency[i], b.efficiency[i]) < 1e-5);
    }
  };
  same_curve(back.matmul_efficiency_bf16, hw.matmul_efficiency_bf16);
  same_curve(back.attention_efficiency_bf16, hw.attention_efficiency_bf16);
  same_curve(back.attention_backward_efficiency_bf16, hw.attention_backward_efficiency_bf16);
  CHECK(back.matmul_efficiency_fp16.empty());
  CHECK(&back.matmul_curve(DType::Fp16) == &back.matmul_efficiency);  // no fp16 curve: the shared one
  CHECK(&back.matmul_curve(DType::Bf16) == &back.matmul_efficiency_bf16);
  CHECK(back.device_cores == hw.device_cores);
  // Only the dtypes with an elementwise rate are written; the others fall back (fp32 to memory_bandwidth).
  CHECK(std::find(keys.begin(), keys.end(), "device.elementwise_bandwidth") != keys.end());
  CHECK(rel(back.elementwise_bandwidth_bf16.value, hw.elementwise_bandwidth_bf16.value) < 1e-5);
  CHECK(back.elementwise_bandwidth_fp32.value == 0);
  CHECK(back.matmul_forward_ratio(DType::Fp32) == doctest::Approx(1.468));
  CHECK(back.matmul_forward_ratio(DType::Bf16) == 1.0);
  CHECK(*back.collective_in_step_factor == doctest::Approx(1.23));
  CHECK(*back.collective_in_step_factor_shared_cores == doctest::Approx(0.91));
  CHECK(*back.collective_in_step_factor_fp32 == doctest::Approx(0.84));
  CHECK(*back.collective_in_step_factor_shared_cores_fp32 == doctest::Approx(1.07));
  CHECK(rel(back.host_overhead_fp32.unit.value, 1.47e-3) < 1e-5);
  CHECK(rel(back.elementwise_bandwidth(DType::Fp32).value, hw.memory_bandwidth.value) < 1e-5);
  CHECK(rel(back.host_overhead_bf16.layer_backward.value, hw.host_overhead_bf16.layer_backward.value) < 1e-5);
  CHECK(rel(back.host_overhead_bf16.unit.value, hw.host_overhead_bf16.unit.value) < 1e-5);
  CHECK(rel(back.intra_node.bandwidth.value, hw.intra_node.bandwidth.value) < 1e-5);
  CHECK(rel(back.intra_node.latency.value, hw.intra_node.latency.value) < 1e-5);
  CHECK(back.intra_node.bus_efficiency.x == hw.intra_node.bus_efficiency.x);
  CHECK(back.gpus_per_node == hw.gpus_per_node);
  CHECK(back.nics_per_node == hw.nics_per_node);
  CHECK(back.cpu_cores == hw.cpu_cores);
  CHECK(rel(back.host_flops_per_core.value, hw.host_flops_per_core.value) < 1e-5);
  CHECK(rel(back.collective_base_latency.value, hw.collective_base_latency.value) < 1e-5);
  CHECK(back.compute_slowdown_during_comm == hw.compute_slowdown_during_comm);
  // Same times through the simulator's cost model.
  const CommGroup g = make_group(back, 2, 2);
  CHECK(rel(collective_time(back, CollectiveKind::AllGather, Bytes(1 << 20), g).value,
            collective_time(hw, CollectiveKind::AllGather, Bytes(1 << 20), g).value) < 1e-5);
  // Every note is in the file, as comments.
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  for (const auto& k : keys) CHECK(ss.str().find("# note for " + k + "\n") != std::string::npos);
}

#ifdef FSDP_RUN_BIN
TEST_CASE("fsdp-run calibrate --quick on 2 local CPU ranks writes a loadable, measured profile") {
  TmpDir d;
  const std::string out = d / "quick-cal.yaml";
  // Appended, not `std::string(FSDP_RUN_BIN) + "..."`: GCC 12 at -O2 warns -Warray-bounds inside libstdc++'s
  // operator+(string&&, const char*) here once the standard headers come from the precompiled header (a false
  // positive of the same family as the -Wrestrict one CMakeLists.txt names: GCC bugs 105329, 105651).
  std::string cmd = FSDP_RUN_BIN;
  cmd += " calibrate --quick --nproc-per-node 2 --out ";
  cmd += out;
  Result r = sh(cmd);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("calibrate: intra-node all-gather") != std::string::npos);  // progress on stderr
  CHECK(r.out.find("residuals of the written profile") != std::string::npos);
  const HardwareProfile hw = load_hardware(out, FSDP_SOURCE_ROOT);
  CHECK(hw.name == "quick-cal");
  CHECK(hw.device_kind == "cpu");
  // Best measured fp32 GEMM rate = peak x the curve's largest efficiency: positive, and below what this
  // many hardware threads could do at 5 GHz with two 512-bit FMA pipes (64 fp32 FLOPs per cycle).
  double best_eff = 0;
  for (double e : hw.matmul_efficiency.efficiency) best_eff = std::max(best_eff, e);
  const double rate = hw.peak_flops_fp32.value * best_eff;
  const double bound = std::max(1u, std::thread::hardware_concurrency()) * 5e9 * 64;
  CHECK(rate > 0);
  CHECK(rate < bound);
  CHECK(hw.intra_node.bandwidth.value > 0);
  // The fp32 elementwise rate is the executor's AdamW step, timed directly: always there.
  CHECK(hw.elementwise_bandwidth_fp32.value > 0);
  // Every GEMM shape was timed in its three orientations: the forward one's share is measured.
  CHECK(hw.matmul_forward_ratio_fp32 > 0);
  CHECK(hw.matmul_forward_ratio_fp32 < 3);
  // The step probe ran over both ranks and alone, in bf16 and in fp32, in two blocks of 4 rounds (each round
  // reported): its collectives cost something inside a step.
  for (const std::string dt : {"bf16", "fp32"}) {
    CHECK(r.out.find("calibrate: step probe (fsdp, " + dt + ", 2 ranks, 8 rounds)") != std::string::npos);
    for (int round = 1; round <= 8; ++round)
      CHECK(r.out.find("calibrate: step probe round " + std::to_string(round) + " (" + dt + "): ") !=
            std::string::npos);
  }
  // The kernels were timed a second time, at the end (each shape keeps its faster timing).
  CHECK(r.out.find("calibrate: GEMMs and attention again") != std::string::npos);
  CHECK(hw.collective_in_step_factor.has_value());
  CHECK(hw.collective_in_step_factor_shared_cores.has_value());
  CHECK(hw.collective_in_step_factor_fp32.has_value());
  CHECK(hw.collective_in_step_factor_shared_cores_fp32.has_value());
  {
    // The derivation, not a validation: each factor is the probe's measured in-step collective time over what the
    // written profile prices it at, so re-pricing the probe's collectives over the 2 calibrating ranks, and over
    // the 4 of the over-subscribed run, must give back the measured time (on a machine with 4 or more CPUs those 4
    // ranks would poll and the node's factor would price them: not checked). This catches a profile written with
    // other numbers than it derived; whether the factors predict other plans is checked on plans nobody fitted
    // on, the 47 grid rows of the timing test (ctest -L timing, tests/accuracy/README.md "Step time on CPU").
    std::ifstream f(out);
    std::stringstream text;
    text << f.rdbuf();
    const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
    for (auto [ranks, dt, key] :
         {std::tuple{2, DType::Bf16, "in_step_factor"}, std::tuple{4, DType::Bf16, "in_step_factor_shared_cores"},
          std::tuple{2, DType::Fp32, "in_step_factor_fp32"},
          std::tuple{4, DType::Fp32, "in_step_factor_shared_cores_fp32"}}) {
      if (ranks == 4 && cpu_ranks_poll(hw.cpu_cores, 4)) continue;
      const PlanFile probe = step_probe_plan(ranks, "cpu", dt);
      const ModuleGraph graph(probe.model);
      const Prediction p = simulate(SimulationInput{&graph, &hw, &rt, Cluster{1, ranks}, probe.strategy});
      const double noted = noted_in_step_s(text.str(), key);
      INFO(key, ": priced ", p.time.comm_s * 1e3, " ms, measured ", noted * 1e3, " ms");
      CHECK(std::abs(p.time.comm_s - noted) <= 0.01 * noted + 1e-5);
    }
  }
  CHECK(!hw.host_overhead_bf16.empty());
  CHECK(r.out.find("calibrate: host overhead BFloat16, tokens 96") != std::string::npos);
  // PyTorch's cross-entropy is timed at three vocabularies; on a CPU it sets no softmax_efficiency (the CPU's kernels
  // run at its elementwise rate: derive_profile).
  for (const char* vocab :
       {" x 32768 fp32 logits: forward ", " x 65536 fp32 logits: forward ", " x 131072 fp32 logits"})
    CHECK(r.out.find(vocab) != std::string::npos);
  CHECK(hw.softmax_efficiency == 0);
  CHECK(hw.usable_device_memory.value > 0);
  CHECK(hw.usable_device_memory.value <= hw.device_memory.value);
  // Every field is commented: measured (with the date) or taken from the base profile.
  std::ifstream in(out);
  std::string line;
  bool prev_comment = false;
  std::map<std::size_t, bool> block_commented;  // indentation of an open block -> it had a comment
  int fields = 0, measured = 0;
  while (std::getline(in, line)) {
    const std::size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos) continue;
    if (line[indent] == '#') {
      prev_comment = true;
      if (line.find("measured by fsdp-run calibrate on ") != std::string::npos) ++measured;
      continue;
    }
    if (line.compare(indent, 3, "- {") == 0) continue;  // a curve point: its block carries the comment
    const bool parent = indent >= 2 && block_commented[indent - 2];
    if (line.back() == ':') {
      block_commented[indent] = prev_comment || parent;
    } else {
      ++fields;
      INFO(line);
      CHECK((prev_comment || parent));
    }
    prev_comment = false;
  }
  CHECK(fields >= 18);
  CHECK(measured >= 10);
}

TEST_CASE("fsdp-run calibrate refuses bad input with exit code 2") {
  TmpDir d;
  const std::string bin = FSDP_RUN_BIN;
  Result r = sh(bin + " calibrate --quick");
  CHECK(r.code == 2);
  CHECK(r.out.find("--out") != std::string::npos);
  r = sh(bin + " calibrate --out " + d / "x.txt");
  CHECK(r.code == 2);
  r = sh(bin + " calibrate --out " + d / "x.yaml --base no-such-profile");
  CHECK(r.code == 2);
  CHECK(r.out.find("no-such-profile") != std::string::npos);
  CHECK(r.out.find("calibrate: --base: unknown hardware") != std::string::npos);  // the flag the user gave
  r = sh(bin + " calibrate --out " + d / "x.yaml --nproc-per-node 0");
  CHECK(r.code == 2);
  r = sh(bin + " calibrate --out " + d / "missing-dir/x.yaml");
  CHECK(r.code == 2);
  CHECK_FALSE(fs::exists(d / "x.yaml"));
}
#endif

}  // namespace fsdp::exec::test
