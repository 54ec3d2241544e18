// Samples -> hardware profile (derive_profile.hpp). Every number written comes with its note: measured (how,
// with the date) or taken from the base profile.
#include "calibrate/derive_profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "calibrate/probe_plans.hpp"
#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "core/format.hpp"
#include "model/module_graph.hpp"
#include "program/step_program.hpp"
#include "simulate.hpp"

namespace fsdp::exec::cal {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Simulator times of the samples under a profile, and their relative errors.
struct Residuals {
  std::vector<double> rel;
  double rms() const {
    double s = 0;
    for (double r : rel) s += r * r;
    return rel.empty() ? 0 : std::sqrt(s / double(rel.size()));
  }
  double worst() const {
    double w = 0;
    for (double r : rel) w = std::max(w, std::abs(r));
    return w;
  }
};

std::string pct(double r) { return fmt("%+.1f%%", 100 * r); }

}  // namespace

DerivedProfile derive_profile(const CalibrationSamples& s, const DeriveInputs& in) {
  std::ostringstream rep;  // the report printed on stdout
  const std::string& date = s.date;
  const std::string by = "measured by fsdp-run calibrate on " + date + ", ";
  const HardwareProfile& base = in.base;
  const std::string from_base = "from --base " + base.source + " (not measured by fsdp-run calibrate)";
  HardwareProfile hw = base;
  ProfileNotes notes;
  auto& N = notes.note;
  hw.name = in.name;
  hw.source = in.source;
  hw.device_kind = s.cuda ? "cuda" : "cpu";
  N["name"] = "written by fsdp-run calibrate on " + date + " (docs/calibrate.md); schema: docs/hardware.md";
  N["device_kind"] = by + "the device the ranks ran on (" + s.device + ")";
  hw.backend = in.backend;
  N["backend"] = by + "the c10d backend its collectives ran through";
  // What the fitted numbers below belong to: fsdp-plan refuses the profile for another runtime or cost model.
  hw.calibrated = HardwareProfile::Calibration{
      "fsdp-run", "LibTorch " + s.torch_version + (s.cuda ? ", NCCL" : ", Gloo"), kCostModelVersion};
  N["calibrated.runtime"] =
      "the runtime whose executor ran the probes: the host overheads and in-step factors are its own";
  N["calibrated.runtime_build"] = "that executor's build";
  N["calibrated.cost_model_version"] =
      "the fsdp-plan cost model the factors were fitted against (hardware_profile.hpp kCostModelVersion)";
  notes.header = {"Hardware profile written by `fsdp-run calibrate" + std::string(s.quick ? " --quick" : "") + "` on " +
                      date + ": " + std::to_string(s.ranks) + " rank(s), " + std::to_string(s.local_world_size) +
                      " per node, LibTorch " + s.torch_version + ".",
                  "Per-device numbers were measured on every local rank at once (rank 0's are written); node-wide",
                  "numbers (host bandwidth, host AdamW) by local rank 0 alone. Fields calibrate cannot measure",
                  "come from the base profile " + base.source + " and say so."};

  // --- What the base describes that a calibrated profile does not carry, and why (said in the header) ---
  // The clocks and power: the measured curves are rates at the clock the device held, so a sustained_clock would
  // lower them twice. The SMs and GEMM tiles: the measured GEMM curve already has the measured shapes' tile and wave
  // quantization in it. The attention reference and the kernel ratios: calibrate's attention series is the executor's
  // eager attention core (executor/model/transformer.cpp attention_core), by FLOPs per call as timed, not the flash
  // kernel those ratios and that reference describe; a plan whose SDPA dispatches to cuDNN or the memory-efficient
  // kernel, or one with --attention flash3 or flex, is refused on the written profile (simulate.hpp
  // attention_hardware_refusal) rather than priced on an eager curve.
  std::vector<std::string> dropped;
  if (base.boost_clock.value > 0 || base.sustained_clock.value > 0 || base.tdp.value > 0 || base.power_limit.value > 0)
    dropped.push_back("clocks and power (the measured rates are at the clock the device held)");
  if (base.sm_count > 0 || !base.matmul_tiles.empty())
    dropped.push_back("sm_count and matmul_tiles (the measured GEMM curve has the shapes' tile quantization in it)");
  if (base.attention_reference_tokens > 0 || base.sdpa_memory_efficient_ratio.given() ||
      base.sdpa_cudnn_ratio.given() || base.flash3_ratio.given() || base.flex_ratio.given())
    dropped.push_back(
        "attention_reference and the attention kernel ratios (the attention curves are the executor's eager core's)");
  hw.boost_clock = hw.boost_clock_fp32 = hw.sustained_clock = Hertz(0);
  hw.tdp = hw.power_limit = Watts(0);
  hw.sm_count = 0;
  hw.matmul_tiles.clear();
  hw.attention_reference_tokens = hw.attention_reference_heads = 0;
  hw.sdpa_memory_efficient_ratio = hw.sdpa_cudnn_ratio = hw.flash3_ratio = hw.flex_ratio = {};
  for (const std::string& d : dropped) notes.header.push_back("Not carried from the base: " + d + ".");

  // --- Memory ---
  if (s.cuda) {
    hw.usable_device_memory = Bytes(s.device_total);
    hw.device_memory = Bytes(std::max(base.device_memory.value, s.device_total));
    N["device.memory"] = hw.device_memory.value > base.device_memory.value
                             ? by + "cudaMemGetInfo total (above the base profile's memory)"
                             : from_base;
    N["device.usable_memory"] = by + "cudaMemGetInfo total of device " + std::to_string(s.local_rank);
  } else {
    if (!(s.mem_total > 0 && s.mem_available > 0)) throw std::runtime_error("calibrate: /proc/meminfo unreadable");
    hw.device_memory = Bytes(s.mem_total);
    hw.usable_device_memory = Bytes(std::min(s.mem_available, s.mem_total));
    N["device.memory"] =
        by + fmt("/proc/meminfo MemTotal (%.2f GiB): the CPU \"device\" is host RAM", s.mem_total / kMiB / 1024);
    N["device.usable_memory"] =
        by + fmt("/proc/meminfo MemAvailable (%.2f GiB) while calibrate ran; every rank shares it",
                 s.mem_available / kMiB / 1024);
  }
  if (s.mem_total > 0) {
    hw.host_memory = Bytes(s.mem_total);
    N["node.host_memory"] = by + "/proc/meminfo MemTotal";
  } else {
    N["node.host_memory"] = from_base;
  }

  // --- Memory bandwidths ---
  hw.memory_bandwidth = BytesPerSecond(s.device_bw);
  N["device.memory_bandwidth"] = by + "a = b + c over 3 x " + fmt("%.0f MiB", s.device_bw_array_mib) +
                                 " fp32 arrays on " + s.device +
                                 " (STREAM-triad-like, 12 bytes per element), every local rank at once";
  if (s.host_bw > 0) {
    hw.host_memory_bandwidth = BytesPerSecond(s.host_bw);
    N["node.host_memory_bandwidth"] = by + "a = b + c over host fp32 arrays, local rank 0 alone (all its threads)";
  } else {
    N["node.host_memory_bandwidth"] = from_base;
  }
  if (s.cuda) {
    hw.host_to_device = BytesPerSecond(0.5 * (s.h2d + s.d2h));
    N["node.host_to_device"] = by + "mean of pinned host->device " + fmt("%.2f GB/s", s.h2d / 1e9) +
                               " and device->host " + fmt("%.2f GB/s", s.d2h / 1e9) + " copies, every GPU at once";
  } else {
    hw.host_to_device = BytesPerSecond(s.device_bw);
    N["node.host_to_device"] = by +
                               "no copy on CPU runs: \"device\" memory is host memory, so the device memory "
                               "bandwidth above is used";
  }

  // --- GEMMs: per dtype, efficiency = achieved / the dtype's peak, by FLOPs per call ---
  // Each dtype gets its own curve (docs/hardware.md): on CPUs LibTorch runs fp32 GEMMs in the BLAS it was
  // built with and bf16 GEMMs in oneDNN, whose rates differ by up to 40x and scale differently with size.
  auto gemm_curve = [&](const std::vector<GemmSample>& v, const std::string& what, FlopsPerSecond& peak,
                        const std::string& peak_key, const std::string& curve_key) {
    double best = 0;
    for (const auto& g : v) best = std::max(best, g.flops() / g.seconds);
    if (best > peak.value) {
      peak = FlopsPerSecond(best);
      N[peak_key] = by + "the best " + what + " GEMM rate (it exceeded the base profile's peak)";
    } else {
      N[peak_key] = from_base + "; the " + what + " matmul curve is relative to it";
    }
    std::vector<std::pair<double, double>> pts;
    for (const auto& g : v) pts.emplace_back(g.flops(), g.flops() / g.seconds / peak.value);
    Curve mm = make_efficiency_curve(pts);
    std::string rates;
    for (const auto& g : v)
      rates += (rates.empty() ? "" : ", ") + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" +
               std::to_string(g.k) + fmt(" %.3g", g.flops() / g.seconds / 1e9);
    N[curve_key] = by + what +
                   " at::mm, each shape as the 3 GEMMs of a linear layer\n(x W^T, dy W, dy^T x), mean time; "
                   "GFLOP/s m x n x k: " +
                   rates + "\nefficiency = rate / peak " + what + "; points within 1% of FLOPs merged" +
                   (mm.raised ? fmt("; %.0f point(s) raised to the loader's monotone-time limit", mm.raised) : "");
    rep << "calibrate: " << what << " GEMM best " << fmt("%.3f GFLOP/s", best / 1e9) << " (" << v.size()
        << " shapes)\n";
    return EfficiencyCurve{mm.x, mm.e};
  };
  hw.matmul_efficiency =
      gemm_curve(s.fp32, "fp32", hw.peak_flops_fp32, "device.peak_flops.fp32", "device.matmul_efficiency");
  N["device.matmul_efficiency"] += "\n(the curve of every dtype without a curve of its own)";
  if (!s.bf16.empty())
    hw.matmul_efficiency_bf16 =
        gemm_curve(s.bf16, "bf16", hw.peak_flops_bf16, "device.peak_flops.bf16", "device.matmul_efficiency_bf16");
  if (!s.fp16.empty()) {
    hw.matmul_efficiency_fp16 =
        gemm_curve(s.fp16, "fp16", hw.peak_flops_fp16, "device.peak_flops.fp16", "device.matmul_efficiency_fp16");
  } else if (!s.bf16.empty()) {
    // Half GEMMs do not exist here (LibTorch 1.13 CPU): an fp16 plan cannot run, so fp16 is priced as bf16.
    hw.peak_flops_fp16 = hw.peak_flops_bf16;
    hw.matmul_efficiency_fp16 = hw.matmul_efficiency_bf16;
    N["device.peak_flops.fp16"] = "taken at the measured bf16 rate: " + s.fp16_missing;
    N["device.matmul_efficiency_fp16"] = "the bf16 curve: " + s.fp16_missing;
  } else {
    N["device.peak_flops.fp16"] = from_base;
  }
  // The FP8 tensor-core peak: a datasheet figure calibrate does not time; float8 GEMMs are priced at it on the measured
  // bf16 curve (compute_cost.cpp float8_linear_gemm_times). A CPU has none.
  if (!s.cuda) {
    hw.peak_flops_fp8 = FlopsPerSecond(0);
    hw.float8_matmul_ratio = 0;
  }
  if (hw.peak_flops_fp8.value > 0) N["device.peak_flops.fp8"] = from_base + "; float8 GEMMs run on the bf16 curve";
  if (hw.float8_matmul_ratio > 0)
    N["device.float8_matmul_ratio"] =
        from_base + ": the base's FP8 over bf16 GEMM efficiency, on the measured bf16 curve";

  // --- The forward GEMM's share: per dtype, the median over the shapes of x W^T's time / the mean of three ---
  std::string ratio_note;
  auto forward_ratio = [&](const std::vector<GemmSample>& v, const char* what) {
    std::vector<double> r;
    for (const auto& g : v) r.push_back(g.forward_share);
    const double m = median(r);
    ratio_note += std::string(ratio_note.empty() ? "" : ", ") + what + fmt(" %.3g", m) +
                  fmt(" (%.3g", *std::min_element(r.begin(), r.end())) +
                  fmt("-%.3g", *std::max_element(r.begin(), r.end())) + ")";
    return m;
  };
  hw.matmul_forward_ratio_fp32 = forward_ratio(s.fp32, "fp32");
  if (!s.bf16.empty()) hw.matmul_forward_ratio_bf16 = forward_ratio(s.bf16, "bf16");
  hw.matmul_forward_ratio_fp16 = !s.fp16.empty() ? forward_ratio(s.fp16, "fp16") : hw.matmul_forward_ratio_bf16;
  N["device.matmul_forward_ratio"] = by +
                                     "the GEMM shapes above: the forward GEMM's (x W^T) time / the mean of the "
                                     "linear layer's three,\nmedian over the shapes (range): " +
                                     ratio_note + (s.fp16.empty() ? "; fp16 as bf16" : "");

  // --- Attention, per dtype: efficiency relative to the dtype's peak ---
  auto attention_curves = [&](const std::vector<AttnSample>& v, const std::string& what, FlopsPerSecond peak,
                              const std::string& suffix, EfficiencyCurve& fwd, EfficiencyCurve& bwd) {
    std::vector<std::pair<double, double>> fw, bw;
    std::string times;
    for (const auto& a : v) {
      const double ff = attention_forward_flops(a.shape).value, bf = attention_backward_flops(a.shape).value;
      fw.emplace_back(ff, ff / a.fwd_s / peak.value);
      bw.emplace_back(bf, bf / a.bwd_s / peak.value);
      times += (times.empty() ? "" : ", ") + std::to_string(a.shape.seq_len) + fmt(": %.3g", a.fwd_s * 1e3) +
               fmt("/%.3g", a.bwd_s * 1e3);
    }
    Curve cf = make_efficiency_curve(fw), cb = make_efficiency_curve(bw);
    fwd = EfficiencyCurve{cf.x, cf.e};
    bwd = EfficiencyCurve{cb.x, cb.e};
    N["device.attention_forward_efficiency" + suffix] =
        by +
        "the executor's attention_core (eager: QK^T, fp32 softmax with causal mask, PV), batch 1,\n8 heads x 64, " +
        what + "; FLOPs by the simulator's convention (causal: half of 4 b s^2 h d; backward 2.5x);\n" +
        "efficiency relative to peak " + what + "; ms forward/backward by sequence: " + times;
    N["device.attention_backward_efficiency" + suffix] =
        by + "as the forward curve; backward = (forward + backward) - forward";
  };
  attention_curves(s.attn, "fp32", hw.peak_flops_fp32, "", hw.attention_efficiency, hw.attention_backward_efficiency);
  if (!s.attn_bf16.empty()) {
    attention_curves(s.attn_bf16, "bf16", hw.peak_flops_bf16, "_bf16", hw.attention_efficiency_bf16,
                     hw.attention_backward_efficiency_bf16);
    if (s.fp16.empty()) {
      // fp16 priced as bf16 (above): the bf16 curves relative to the same peak.
      hw.attention_efficiency_fp16 = hw.attention_efficiency_bf16;
      hw.attention_backward_efficiency_fp16 = hw.attention_backward_efficiency_bf16;
      N["device.attention_forward_efficiency_fp16"] = "the bf16 curve: " + s.fp16_missing;
      N["device.attention_backward_efficiency_fp16"] = "the bf16 curve: " + s.fp16_missing;
    }
  }

  // --- Host overhead and elementwise bandwidth of the executor's eager layer, per dtype ---
  hw.host_overhead_fp32 = s.overhead_fp32;
  hw.host_overhead_bf16 = s.overhead_bf16;
  hw.host_overhead_fp16 = HostOverhead{};  // fp16: the bf16 entry's rules (fp32's) apply; none measured
  hw.elementwise_bandwidth_fp32 = s.elementwise_fp32;
  hw.elementwise_bandwidth_bf16 = s.elementwise_bf16;
  hw.elementwise_bandwidth_fp16 = BytesPerSecond(0);
  const std::string probe_how =
      "the executor's forward/backward (embed_forward, layer_forward, head_loss, autograd) of Llama-shaped\n"
      "probes (batch 1; tokens, hidden, ffn and vocab below) with 0 and 2-4 layers, less their GEMMs and\n"
      "attention core timed alone (the curves above price those), fitted per dtype as a fixed host time per\n"
      "pass plus the elementwise bytes the simulator counts for that pass / one elementwise bandwidth\n"
      "(relative least squares; fp32 at its measured rate). ";
  N["device.host_overhead"] = by + probe_how + s.overhead_note_fp32 + ";\n" + s.overhead_note_bf16;
  // A measured rate replaces the base's fraction for its dtype (a profile gives one of the two per dtype); fp16 keeps
  // the base's fraction, or fp32's rate.
  if (hw.elementwise_bandwidth_fp32.value > 0) hw.elementwise_efficiency_fp32 = 0;
  if (hw.elementwise_bandwidth_bf16.value > 0) hw.elementwise_efficiency_bf16 = 0;
  N["device.elementwise_efficiency"] = from_base + ": the dtypes without a measured rate";
  N["device.compute_capability"] = from_base;
  N["device.elementwise_bandwidth"] =
      by + s.note_elementwise_fp32 + ";\nbf16 " +
      (hw.elementwise_bandwidth_bf16.value > 0 ? "the bandwidth term of the host_overhead fit (see there)"
                                               : "absent: the host_overhead fit found no bytes term");

  // --- Kernel families priced as fractions of the memory's bandwidth (hardware_profile.hpp) ---
  // On CUDA the cross-entropy's forward sets softmax_efficiency: the passes SoftMax.cu makes over the fp32 logits
  // (kSoftmaxForwardPasses) per second, over the bandwidth measured above (the median over the vocabularies; the
  // backward, at kSoftmaxBackwardPasses, is the residual report's check). The copies and float8 casts keep the base's
  // fractions, now of the measured bandwidth, as the elementwise fraction above. A CPU's kernels are priced at its
  // measured elementwise rate: none of the three is written (SoftMax.cu's passes are a GPU's; aten's CPU log_softmax
  // vectorises differently).
  if (s.cuda) {
    std::vector<double> f;
    std::string rows;
    for (const SoftmaxSample& c : s.cross_entropy) {
      if (!(c.fwd_s > 0)) continue;
      f.push_back(HardwareProfile::kSoftmaxForwardPasses * c.logit_bytes() / c.fwd_s / s.device_bw);
      rows += "\n  " + std::to_string(c.rows) + " x " + std::to_string(c.vocab) + ": forward " +
              fmt("%.3f ms, ", c.fwd_s * 1e3) + fmt("%.3f of the bandwidth", f.back());
    }
    if (!f.empty()) {
      const double mid = median(f);
      hw.softmax_efficiency = std::min(1.0, mid);
      N["device.softmax_efficiency"] =
          by + "at::cross_entropy_loss's forward over fp32 logits (log_softmax + nll_loss),\n" +
          fmt("%.0f", HardwareProfile::kSoftmaxForwardPasses) +
          " passes of 4 bytes a logit per second over device.memory_bandwidth, the median of" + rows +
          (mid > 1 ? fmt("\n(median %.3f, held at 1: the loader's bound)", mid) : std::string()) +
          (base.softmax_efficiency > 0 ? fmt("\nbase profile: %.3f of its bandwidth", base.softmax_efficiency) +
                                             fmt(" (%.0f GB/s)", base.memory_bandwidth.value / 1e9)
                                       : std::string("\nthe base profile has none"));
    } else if (hw.softmax_efficiency > 0) {
      N["device.softmax_efficiency"] = from_base + ": the base's fraction, of the measured bandwidth";
    }
    if (hw.copy_efficiency > 0)
      N["device.copy_efficiency"] = from_base + ": the base's fraction, of the measured bandwidth";
    if (hw.float8_cast_efficiency > 0)
      N["device.float8_cast_efficiency"] = from_base + ": the base's fraction, of the measured bandwidth";
  } else {
    hw.softmax_efficiency = hw.copy_efficiency = hw.float8_cast_efficiency = 0;
  }

  // --- CPU: the cores the node has and the cores each rank computed on ---
  if (!s.cuda) {
    hw.cpu_cores = s.cpus;
    N["node.cpu_cores"] = by + "the CPUs this process may run on (sched_getaffinity)";
    hw.device_cores = cpu_cores_per_rank(s.cpus, s.local_world_size);
    if (s.threads < hw.device_cores) hw.device_cores = s.threads;  // OMP_NUM_THREADS asked for fewer
    N["device.cores"] = by + std::to_string(s.local_world_size) + " local rank(s) on " + std::to_string(s.cpus) +
                        " CPUs, " + std::to_string(s.threads) +
                        " intra-op thread(s) each (executor/dist/device.hpp):\nthe cores each rank "
                        "computed on while the device rates above were measured";
  }

  // --- Host AdamW -> cpu_peak_flops_per_core ---
  if (s.adam_params_per_s > 0) {
    // host_optimizer_step_time (simulator/compute/compute_cost.cpp), one rank on the node:
    // max(bytes / host bandwidth, 16 FLOPs x params / (cores x FLOP/s per core)).
    const double bpp = optimizer_bytes_per_param(Optimizer::AdamW, DType::Fp32, DType::Fp32).value;
    const double fpp = optimizer_flops_per_param(Optimizer::AdamW);
    const double mem_rate = hw.host_memory_bandwidth.value / bpp;  // params/s the memory bound allows
    const std::string m = fmt("host AdamW (executor/train/host_adam.cpp) %.4g params/s", s.adam_params_per_s) +
                          fmt(" over %.0f M fp32 params", double(s.adam_params) / 1e6);
    if (s.adam_params_per_s < mem_rate) {
      hw.host_flops_per_core = FlopsPerSecond(fpp * s.adam_params_per_s / hw.cpu_cores);
      N["node.cpu_peak_flops_per_core"] =
          by + m + ";\nset so that the simulator's compute bound (" + fmt("%.0f", fpp) +
          " FLOPs per param over cpu_cores cores) reproduces it:\nan effective AdamW rate, not the core's peak";
    } else {
      N["node.cpu_peak_flops_per_core"] =
          from_base + ";\n" + m + " is within the memory bound (" + fmt("%.4g params/s", mem_rate) + ")";
    }
    rep << "calibrate: " << m << "\n";
  } else {
    N["node.cpu_peak_flops_per_core"] = from_base;
  }

  // --- Collectives ---
  auto tier_from = [&](const RingFit& f, LinkTier& t, double scale) {
    t.bandwidth = BytesPerSecond(f.bandwidth_Bps * scale);
    t.latency = Seconds(f.step_latency_s);
    EfficiencyCurve c;
    for (const auto& [x, e] : f.bus_efficiency) {
      c.x.push_back(x);
      c.efficiency.push_back(e);
    }
    t.bus_efficiency = c;
    // One curve per collective (the same derivation per collective; docs/hardware.md bus_efficiency_<kind>).
    auto own = [&](CollKind k, EfficiencyCurve& dst) {
      auto it = f.by_kind.find(k);
      dst = EfficiencyCurve{};
      if (it == f.by_kind.end()) return;
      for (const auto& [x, e] : it->second) {
        dst.x.push_back(x);
        dst.efficiency.push_back(e);
      }
    };
    own(CollKind::AllGather, t.bus_efficiency_all_gather);
    own(CollKind::ReduceScatter, t.bus_efficiency_reduce_scatter);
    own(CollKind::AllReduce, t.bus_efficiency_all_reduce);
  };
  auto describe = [&](const RingFit& f, const std::vector<CollSample>& v) {
    return fmt("ring fit t = base + steps x latency + factor x S / busbw over %.0f timings", double(v.size())) +
           fmt(" (3 collectives, %.0f sizes): ", double(v.size()) / 3) + fmt("base %.1f us", f.base_latency_s * 1e6) +
           fmt(", per step %.1f us", f.step_latency_s * 1e6) +
           fmt(", line busbw %.3f GB/s", f.line_bandwidth_Bps / 1e9) + ", line residual rms " + pct(f.line.rms_rel) +
           ", worst " + pct(f.line.max_abs_rel) +
           (f.outliers ? fmt(", %.0f outlier timing(s) left out", f.outliers) : "") +
           (f.latency_scale < 1
                ? fmt(", latency terms scaled by %.3g to the collectives' own fixed costs", f.latency_scale)
                : "");
  };
  if (!s.intra.empty()) {
    RingFit f = fit_ring(s.intra);
    tier_from(f, hw.intra_node, 1.0);
    hw.collective_base_latency = Seconds(f.base_latency_s);
    N["node.intra_node"] =
        by + std::to_string(s.intra_size) + " local ranks through executor/dist/comm.hpp (" +
        (s.cuda ? "NCCL" : "Gloo") + "), fp32 buffers;\n" + describe(f, s.intra) +
        ";\nbus efficiency: per size after the latency terms, isotonic, plateau = bandwidth;\n"
        "bus_efficiency_<collective>: the same per collective (mean of timed calls less the slowest)";
    N["collectives.base_latency"] = by + "the intra-node ring fit's constant term";
    rep << "calibrate: intra-node " << describe(f, s.intra) << "\n";
  } else {
    N["node.intra_node"] = from_base + ": one local rank, no intra-node collective to time";
    N["collectives.base_latency"] = from_base;
  }
  if (!s.inter.empty()) {
    RingFit f = fit_ring(s.inter);
    // One rank per node: busbw = nics_per_node x NIC bandwidth / gpus_per_node x efficiency (docs/hardware.md,
    // ring_bus_bandwidth), so one NIC's bandwidth = busbw x gpus_per_node / nics_per_node.
    tier_from(f, hw.inter_node, double(hw.gpus_per_node) / double(hw.nics_per_node));
    N["node.inter_node"] = by + std::to_string(s.inter_size) + " nodes, one rank each;\n" + describe(f, s.inter) +
                           ";\nNIC bandwidth = fitted busbw x gpus_per_node / nics_per_node (ring_bus_bandwidth)";
    rep << "calibrate: inter-node " << describe(f, s.inter) << "\n";
  } else {
    N["node.inter_node"] = from_base + ": launched on one node";
  }
  // --- Collectives inside a step: the step probe's measured collective time / the profile's price for it ---
  // Every factor and per-unit time is priced against this profile without any of them (the per-unit time adds
  // to compute only, so the collectives' price is the same with it). With a factor already in, the
  // shared-cores one written was the measured one divided by it: 1.63 where 0.79 was measured, on a profile
  // whose node factor was 0.48.
  for (const auto& f : HardwareProfile::in_step_factor_fields()) hw.*(f.field) = std::nullopt;
  hw.host_overhead_bf16.unit = hw.host_overhead_fp32.unit = Seconds(0);
  struct Factors {
    std::optional<double> node, shared;
    Seconds unit{0};
  };
  std::array<Factors, 2> factors;
  const RuntimeProfile& rt = in.runtime;
  for (std::size_t i = 0; i < s.probes.size(); ++i) {
    const ProbeSeries& pr = s.probes[i];
    if (pr.step_s <= 0) continue;
    const bool fp32 = pr.dtype == DType::Fp32;
    const std::string dt = to_string(pr.dtype), sfx = fp32 ? "_fp32" : "";
    const PlanFile plan = step_probe_plan(s.ranks, s.cuda ? "cuda" : "cpu", pr.dtype);
    const ModuleGraph graph(plan.model);
    StepProgram prog;
    const Prediction pred =
        simulate(SimulationInput{&graph, &hw, &rt, Cluster{1, plan.cluster.gpus_per_node}, plan.strategy}, &prog);
    // The rehearsal's step is the probe's compute: what the profile does not price of it (the executor's
    // machinery around each wrap unit, beyond the bytes the step program counts) is spread over its units.
    if (!s.cuda) {
      const double units = double(prog.units.size());
      const double rest = pr.alone_s - pred.time.compute_s;
      if (rest > 0) factors[i].unit = Seconds(rest / units);
      N["device.host_overhead"] += ";\n" + dt + " unit: the " + dt + " step probe's rehearsal" +
                                   fmt(" (%.2f ms) less the compute this profile prices for it", pr.alone_s * 1e3) +
                                   fmt(" (%.2f ms)", pred.time.compute_s * 1e3) + fmt(", over its %.0f units", units) +
                                   (rest > 0 ? "" : " (none left: 0)");
    }
    const std::string what = "the step probe (fsdp, " + dt + fmt(", %.0f ranks", double(s.ranks)) +
                             "; executor/calibrate/probe_plans.cpp step_probe_plan) stepped in " +
                             fmt("%.2f ms", pr.step_s * 1e3) + ", " + fmt("%.2f ms", pr.alone_s * 1e3) +
                             " with local collectives;\nthis profile prices its collectives at " +
                             fmt("%.2f ms", pred.time.comm_s * 1e3);
    // factor = what the probe's collectives took inside its steps / what this profile prices them at. A step no
    // slower than its local step (on 2 vCPUs the fp32 probe over 4 ranks stepped 416.1 ms against a local step of
    // 419.2 ms: its collectives hid entirely within the timing's noise) measures 0, written as 0; the field stays
    // absent only when the profile prices no collectives for the probe.
    auto set_factor = [&](double in_step, double price, const std::string& how, std::optional<double>& field,
                          const std::string& key) {
      if (price > 0) {
        const double seen = std::max(0.0, in_step);
        // Written as measured, however large: a cap would make the profile price collectives at a time no step
        // took. A factor past 10 is said, since it usually means the machine was busy while the probe ran.
        field = seen / price;
        N[key] = by + how + ": factor = " + fmt("%.2f ms", seen * 1e3) +
                 (in_step < 0 ? fmt(" (the step was %.2f ms faster than its local step)", -in_step * 1e3) : "") +
                 " / " + fmt("%.2f ms", price * 1e3);
      }
      rep << "calibrate: " << how << "; in-step factor " << (field ? fmt("%.3g", *field) : "absent") << "\n";
      if (field && *field > 10)
        rep << "calibrate: warning: " << key << fmt(" = %.3g", *field)
            << ": the collectives took over 10x their priced time inside the step; if other work shared the machine "
               "during calibrate, rerun it on an idle one\n";
    };
    set_factor(pr.step_s - pr.alone_s, pred.time.comm_s, what, factors[i].node, "collectives.in_step_factor" + sfx);
    // The same plan over twice as many ranks as CPUs: its local step is the rehearsal's scaled by the compute the
    // profile prices for each rank there over that at the node's ranks (half a core each: about 2x; both with the
    // per-unit time, as every plan's will be), the rest is its collectives. Measured directly (4 rehearsals at
    // once on 2 vCPUs, bf16): 17.5 ms against the 17.8 ms this gives.
    if (pr.shared_step_s > 0) {
      HardwareProfile priced = hw;
      (fp32 ? priced.host_overhead_fp32 : priced.host_overhead_bf16).unit = factors[i].unit;
      const int ranks = 2 * s.ranks;
      const PlanFile shared_plan = step_probe_plan(ranks, "cpu", pr.dtype);
      const Prediction node = simulate(SimulationInput{&graph, &priced, &rt, Cluster{1, s.ranks}, plan.strategy});
      const Prediction shared =
          simulate(SimulationInput{&graph, &priced, &rt, Cluster{1, ranks}, shared_plan.strategy});
      const double compute_ratio = shared.time.compute_s / node.time.compute_s;
      const double local = pr.alone_s * compute_ratio;
      const std::string what2 =
          "the " + dt + fmt(" step probe over %.0f ranks", double(ranks)) + " (twice the CPUs) stepped in " +
          fmt("%.2f ms", pr.shared_step_s * 1e3) + fmt(";\nits local step: the rehearsal's %.2f ms", pr.alone_s * 1e3) +
          fmt(" x %.3f", compute_ratio) + " (the compute this profile prices per rank there over that at " +
          std::to_string(s.ranks) + " ranks);\nthis profile prices its collectives at " +
          fmt("%.2f ms", shared.time.comm_s * 1e3);
      set_factor(pr.shared_step_s - local, shared.time.comm_s, what2, factors[i].shared,
                 "collectives.in_step_factor_shared_cores" + sfx);
    }
  }
  static_assert(std::tuple_size_v<decltype(s.probes)> == 2);
  hw.collective_in_step_factor = factors[0].node;
  hw.collective_in_step_factor_shared_cores = factors[0].shared;
  hw.host_overhead_bf16.unit = factors[0].unit;
  hw.collective_in_step_factor_fp32 = factors[1].node;
  hw.collective_in_step_factor_shared_cores_fp32 = factors[1].shared;
  hw.host_overhead_fp32.unit = factors[1].unit;
  const std::string keep = from_base;
  for (const char* k : {"node.gpus_per_node", "node.nics_per_node", "collectives.compute_slowdown_during_comm"})
    N[k] = keep;
  if (s.cuda) N["node.cpu_cores"] = keep;
  for (const std::string& k : profile_note_keys(hw))
    FSDP_ASSERT(N.count(k) == 1, "calibrate: no note for profile field " + k);

  return DerivedProfile{std::move(hw), std::move(notes), rep.str()};
}

std::string residual_report(const HardwareProfile& back, const CalibrationSamples& s) {
  std::ostringstream rep;
  rep << "calibrate: residuals of the written profile (simulator time / measured - 1), rms and worst:\n";
  auto gemm_resid = [&](const std::vector<GemmSample>& v, DType d, const char* what) {
    if (v.empty()) return;
    Residuals r;
    for (const auto& g : v) r.rel.push_back(matmul_time(back, g.m, g.n, g.k, d).value / g.seconds - 1);
    rep << "  " << what << " GEMM       " << pct(r.rms()) << " " << pct(r.worst()) << " (" << r.rel.size()
        << " shapes)\n";
  };
  auto attn_resid = [&](const std::vector<AttnSample>& v, DType d, const char* what) {
    if (v.empty()) return;
    Residuals ra, rb;
    for (const auto& a : v) {
      ra.rel.push_back(attention_forward_time(back, a.shape, d).value / a.fwd_s - 1);
      rb.rel.push_back(attention_backward_time(back, a.shape, d).value / a.bwd_s - 1);
    }
    rep << "  " << what << " attention fwd " << pct(ra.rms()) << " " << pct(ra.worst()) << "\n";
    rep << "  " << what << " attention bwd " << pct(rb.rms()) << " " << pct(rb.worst()) << "\n";
  };
  gemm_resid(s.fp32, DType::Fp32, "fp32");
  gemm_resid(s.bf16, DType::Bf16, "bf16");
  gemm_resid(s.fp16, DType::Fp16, "fp16");
  attn_resid(s.attn, DType::Fp32, "fp32");
  attn_resid(s.attn_bf16, DType::Bf16, "bf16");
  auto coll_resid = [&](const std::vector<CollSample>& v, bool inter) {
    for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce}) {
      Residuals r;
      for (const CollSample& c : v) {
        if (c.kind != k) continue;
        const CommGroup grp = inter ? make_group(back, c.group, 1) : make_group(back, c.group, c.group);
        r.rel.push_back(collective_time(back, k, Bytes(c.bytes), grp).value / c.seconds - 1);
      }
      rep << "  " << (inter ? "inter " : "intra ") << coll_name(k) << std::string(15 - std::strlen(coll_name(k)), ' ')
          << pct(r.rms()) << " " << pct(r.worst()) << "\n";
    }
  };
  // The cross-entropy where the profile prices its kernels by their passes (CUDA): forward and backward.
  if (back.softmax_efficiency > 0 && !s.cross_entropy.empty()) {
    Residuals rf, rb;
    const double rate = back.softmax_bandwidth(DType::Fp32).value;
    for (const SoftmaxSample& c : s.cross_entropy) {
      rf.rel.push_back(HardwareProfile::kSoftmaxForwardPasses * c.logit_bytes() / rate / c.fwd_s - 1);
      rb.rel.push_back(HardwareProfile::kSoftmaxBackwardPasses * c.logit_bytes() / rate / c.bwd_s - 1);
    }
    rep << "  fp32 cross-entropy fwd " << pct(rf.rms()) << " " << pct(rf.worst()) << "\n";
    rep << "  fp32 cross-entropy bwd " << pct(rb.rms()) << " " << pct(rb.worst()) << " (held out)\n";
  }
  if (!s.intra.empty()) coll_resid(s.intra, false);
  if (!s.inter.empty()) coll_resid(s.inter, true);
  return rep.str();
}

}  // namespace fsdp::exec::cal
