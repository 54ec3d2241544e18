// `fsdp-run calibrate`: measurements (LibTorch), the fits (calibrate/fit.hpp) and the profile
// (calibrate/profile_yaml.hpp). What is measured where, and why: docs/calibrate.md.
#include "calibrate/calibrate.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "calibrate/fit.hpp"
#include "calibrate/profile_yaml.hpp"
#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "compute/compute_cost.hpp"
#include "core/config_map.hpp"
#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "dist/device.hpp"
#include "dist/launcher.hpp"
#include "hardware/hardware_profile.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "model/transformer.hpp"
#include "planfile/plan_file.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"
#include "train/device_optimizer.hpp"
#include "train/host_adam.hpp"
#include "train/trainer.hpp"

#if defined(FSDP_EXEC_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace fsdp::exec {
namespace {

using Clock = std::chrono::steady_clock;
using cal::CollKind;
using cal::CollSample;

constexpr const char* kUsage =
    "usage: fsdp-run calibrate --out FILE.yaml [--nproc-per-node N] [--base PROFILE] [--quick]\n"
    "options:\n"
    "  --out FILE.yaml      the hardware profile to write (loads with fsdp-plan --hw FILE.yaml)\n"
    "  --nproc-per-node N   local ranks: collectives are measured over them (default 1: none)\n"
    "  --base PROFILE       name or .yaml path of the profile whose unmeasurable fields are kept\n"
    "                       (peak FLOP/s, NICs, cores...; default cpu on CPU, required on CUDA)\n"
    "  --name NAME          the profile's name (default: the file name without .yaml)\n"
    "  --device cpu|cuda    what to calibrate (default cuda when this build and machine have it)\n"
    "  --quick              fewer and smaller shapes (seconds instead of minutes)\n"
    "  --timeout SEC        collective / rendezvous timeout (default 300)\n"
    "  --config-root DIR    where hwprofiles/ lives (default $FSDP_CONFIG_ROOT or the source tree)\n";

constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  std::string out, base, name, device, config_root;
  bool quick = false;
  int nproc = 0;
  int timeout_s = 300;
};

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < 1 || x > 4096)
    throw InputError("calibrate: " + flag + " expects a positive integer, got '" + v + "'");
  return static_cast<int>(x);
}

std::string fmt(const char* f, double a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

// /proc/meminfo field in bytes (kB in the file); 0 when absent.
double meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k, unit;
  double v = 0;
  while (in >> k >> v) {
    std::getline(in, unit);
    if (k == key + ":") return v * 1024.0;
  }
  return 0;
}

struct GemmSample {
  int64_t m, n, k;
  double seconds;        // mean over the three orientations of a linear layer (forward, input grad, weight grad)
  double forward_share;  // the forward GEMM's (x W^T) time over that mean
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

struct AttnSample {
  AttentionShape shape;
  double fwd_s, bwd_s;
};

// The probes of host_overhead and elementwise_bandwidth: decoder layers of the zoo's Llama shape (RMSNorm,
// RoPE, grouped-query attention, SwiGLU; configs/models/README.md). The first is so narrow that its
// arithmetic is negligible (the per-pass host time); the others widen the tokens, the hidden size, the FFN
// and the vocabulary apart so that the elementwise bytes the simulator counts for each pass vary
// independently of each other.
struct ProbeShape {
  int64_t tokens, hidden, heads, kv_heads, head_dim, ffn, vocab;
  int layers;  // layers of the long run; per layer = (long - 0-layer run) / layers
};
constexpr std::array<ProbeShape, 4> kProbeShapes{{{32, 32, 2, 1, 16, 32, 64, 4},
                                                  {96, 160, 5, 1, 32, 432, 768, 2},
                                                  {256, 64, 4, 2, 16, 128, 256, 2},
                                                  {64, 256, 8, 4, 32, 640, 2048, 2}}};

std::string probe_model_yaml(const ProbeShape& p) {
  std::ostringstream y;
  y << "name: calibrate-probe\nfamily: decoder\nhidden_size: " << p.hidden << "\nnum_layers: " << p.layers
    << "\nnum_heads: " << p.heads << "\nnum_kv_heads: " << p.kv_heads << "\nhead_dim: " << p.head_dim
    << "\nffn_size: " << p.ffn << "\ngated_mlp: true\nactivation: silu\nvocab_size: " << p.vocab
    << "\ntied_embeddings: false\nnorm: rmsnorm\nnorm_eps: 1.0e-5\nposition_embedding: rope\n"
       "rope_theta: 10000\nmax_positions: "
    << p.tokens << "\nqkv_bias: false\nattn_out_bias: false\nmlp_bias: false\ndropout: false\n";
  return y.str();
}

class Calibrator {
 public:
  Calibrator(const Options& o, Comm& comm, std::string device, int threads)
      : opt_(o),
        comm_(comm),
        device_(std::move(device)),
        cuda_(device_ != "cpu"),
        threads_(threads),
        cpus_(available_cpus()) {
    f32_ = at::TensorOptions().dtype(at::kFloat).device(device_);
  }

  int run(const DistEnv& env);

 private:
  bool root() const { return comm_.rank() == 0; }
  void progress(const std::string& s) const {
    if (root()) std::cerr << "calibrate: " << s << "\n" << std::flush;
  }
  void sync() const {
#if defined(FSDP_EXEC_CUDA)
    if (cuda_) c10::cuda::device_synchronize();
#endif
  }
  // Lower quartile of repeated timings (cal::lower_quartile): one warm-up call, then at least 4 calls and
  // until a time budget is spent, however short the call. With at most 50 calls a small GEMM (32^3: 13 us on
  // this project's VM) was sampled over under a millisecond, and a series' first shapes, timed right after other
  // work, came out up to 68% slow (run B2, tests/accuracy/README.md); over the whole budget the lower quartile
  // sees the quiet calls.
  double time_op(const std::function<void()>& f) const {
    f();
    sync();
    std::vector<double> ts;
    const double budget = opt_.quick ? 0.15 : 0.25;
    const auto start = Clock::now();
    while (ts.size() < 4 || seconds_since(start) < budget) {
      const auto t0 = Clock::now();
      f();
      sync();
      ts.push_back(seconds_since(t0));
    }
    return cal::lower_quartile(ts);
  }
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  // Rank 0's decision, shared, so that every rank runs the same shapes at the same time.
  bool agree(bool v) {
    if (comm_.size() == 1) return v;
    at::Tensor t = at::full({1}, v ? 1.0f : 0.0f, f32_);
    comm_.world().broadcast(t, 0);
    return t.item<float>() > 0.5f;
  }

  double memory_bandwidth(const at::TensorOptions& o, int64_t elems);
  void gemms();
  void gemm_dtype(at::ScalarType dt, std::vector<GemmSample>& out);
  void attention(at::ScalarType dt, std::vector<AttnSample>& out);
  void kernels_again();
  std::array<double, 4> probe_pass_times(const ProbeShape& shape, at::ScalarType dt, std::string& note);
  void host_overhead(at::ScalarType dt, HostOverhead& out, BytesPerSecond& elementwise, std::string& note);
  double optimizer_bandwidth(const RuntimeProfile& rt, std::string& note);
  void host();
  void collectives(const DistEnv& env);
  void step_probe(const DistEnv& env, int rounds);
  void finish_step_probe();
  bool oversubscribed_probe(int ranks, DType dtype, int64_t steps, std::vector<double>& to);
  void measure_group(Group& g, std::vector<CollSample>& out, const std::string& what);
  std::string write_profile(const DistEnv& env);

  Options opt_;
  Comm& comm_;
  std::string device_;
  bool cuda_;
  at::TensorOptions f32_;
  // Measurements (rank 0's are the ones written).
  double mem_total_ = 0, mem_available_ = 0;
  double device_total_ = 0;
  double device_bw_ = 0, host_bw_ = 0, h2d_ = 0, d2h_ = 0;
  double adam_params_per_s_ = 0;
  int64_t adam_params_ = 0;
  std::vector<GemmSample> fp32_, bf16_, fp16_;
  std::string fp16_missing_;
  std::vector<AttnSample> attn_, attn_bf16_;
  HostOverhead overhead_fp32_, overhead_bf16_;
  BytesPerSecond elementwise_fp32_{0}, elementwise_bf16_{0};
  std::string note_elementwise_fp32_;
  std::string overhead_note_fp32_, overhead_note_bf16_;
  int threads_ = 0;  // intra-op threads of each rank (configure_cpu_threads)
  int cpus_ = 0;     // CPUs this process may run on (sched_getaffinity)
  std::vector<CollSample> intra_, inter_;
  // The step probes (in_step_factor), one per compute dtype that the factors are kept for: rank 0's steps
  // with the node's collectives, and alone, over every round of both blocks; the same plan over twice as many
  // ranks as CPUs (CPU only); and their medians.
  struct ProbeSeries {
    DType dtype;
    int64_t steps_quick, steps_full;  // steps a run (its first warms up)
    std::vector<double> real, local, shared;
    bool shared_failed = false;  // rank 0: the over-subscribed run failed once (said why); not tried again
    double step_s = 0, alone_s = 0, shared_step_s = 0;
  };
  // bf16 first: its factors are the profile's in_step_factor(_shared_cores), which every dtype without its
  // own uses. An fp32 step of the probe takes ~10x a bf16 one (netlib sgemm): fewer steps a run.
  std::array<ProbeSeries, 2> probes_{{{DType::Bf16, 12, 16, {}, {}, {}}, {DType::Fp32, 6, 8, {}, {}, {}}}};
  int probe_rounds_ = 0;
  int intra_size_ = 0, inter_size_ = 0;
};

double Calibrator::memory_bandwidth(const at::TensorOptions& o, int64_t elems) {
  // STREAM's triad-like add (a = b + c): 3 x 4 bytes per element moved (McCalpin, STREAM benchmark).
  at::Tensor a = at::empty({elems}, o), b = at::rand({elems}, o), c = at::rand({elems}, o);
  const double t = time_op([&] { at::add_out(a, b, c); });
  return 3.0 * 4.0 * double(elems) / t;
}

void Calibrator::gemm_dtype(at::ScalarType dt, std::vector<GemmSample>& out) {
  // Squares, then linear-layer shapes (tokens x 3h x h and tokens x h x 3h): each shape timed as the three
  // GEMMs of a linear layer, y = x W^T, dx = dy W, dW = dy^T x (the simulator prices all three at the same
  // FLOP count with one curve, so their mean is what the curve must reproduce).
  std::vector<std::array<int64_t, 3>> squares, rects;
  for (int64_t n = 32; n <= 4096; n *= 2) squares.push_back({n, n, n});
  for (int64_t h = 128; h <= 4096; h *= 2) {
    rects.push_back({512, 3 * h, h});
    rects.push_back({512, h, 3 * h});
  }
  const double cap = opt_.quick ? 0.02 : 0.4;  // stop a series when one call takes longer than this
  const auto o = f32_.dtype(dt);
  for (const auto* series : {&squares, &rects}) {
    for (const auto& s : *series) {
      const int64_t m = s[0], n = s[1], k = s[2];
      at::Tensor x = at::randn({m, k}, f32_).to(o), w = at::randn({n, k}, f32_).to(o),
                 dy = at::randn({m, n}, f32_).to(o);
      const double tf = time_op([&] { (void)at::mm(x, w.t()); });
      const double td = time_op([&] { (void)at::mm(dy, w); });
      const double tw = time_op([&] { (void)at::mm(dy.t(), x); });
      GemmSample g{m, n, k, (tf + td + tw) / 3, tf / ((tf + td + tw) / 3)};
      out.push_back(g);
      progress(std::string(c10::toString(dt)) + " GEMM " + std::to_string(m) + "x" + std::to_string(n) + "x" +
               std::to_string(k) + ": " + fmt("%.2f GFLOP/s", g.flops() / g.seconds / 1e9));
      if (agree(std::max({tf, td, tw}) > cap)) break;
    }
  }
}

void Calibrator::gemms() {
  gemm_dtype(at::kFloat, fp32_);
  gemm_dtype(at::kBFloat16, bf16_);
  // fp16 GEMMs are not implemented on CPU in LibTorch 1.13 ("addmm_impl_cpu_" not implemented for 'Half').
  bool ok = true;
  try {
    at::Tensor a = at::ones({8, 8}, f32_.dtype(at::kHalf));
    (void)at::mm(a, a);
  } catch (const std::exception& e) {
    ok = false;
    fp16_missing_ = "fp16 GEMM unavailable on " + device_ + " in LibTorch " + TORCH_VERSION;
  }
  if (agree(ok)) gemm_dtype(at::kHalf, fp16_);
}

void Calibrator::kernels_again() {
  // The GEMM and attention series once more, at the end of the calibration: each shape keeps the faster of its
  // timings. A kernel's time on a quiet machine is the one to fit, and a slow phase only ever adds to it:
  // two quick calibrations of this project's 2-vCPU VM (tests/accuracy/README.md, runs O and P) timed the
  // fp32 GEMMs of their first two seconds 30-35% slow, and the grid's fp32 plans came out 11-37% slow. Where a
  // series' two timings disagree, one of them ran in a slow phase, possibly both (run A: the fp32 GEMMs up to
  // 128^3 at 2.8-3.0 GFLOP/s, then 3.4-3.6, against 5.0-5.2 on a quiet machine; every fp32 plan +13% to +22%):
  // the series is timed again until a timing agrees with the best so far, at most kMaxTimings in all.
  constexpr int kMaxTimings = 4;
  // Two timings of a GEMM on this VM when it is quiet: within 4% (runs U-Z); a gap above this is a slow phase.
  constexpr double kAgreeWithin = 0.10;
  auto settle = [&](const std::string& what, auto time_series, auto& best, auto same_shape, auto seconds) {
    for (int timings = 1; timings < kMaxTimings; ++timings) {
      std::remove_reference_t<decltype(best)> again;
      time_series(again);
      std::vector<std::pair<double, double>> pairs;
      for (auto& a : again)
        for (auto& f : best)
          if (same_shape(f, a)) {
            pairs.emplace_back(seconds(f), seconds(a));
            if (seconds(a) < seconds(f)) f = a;
          }
      const double gap = cal::largest_gap(pairs);
      if (agree(gap <= kAgreeWithin)) break;
      if (timings + 1 < kMaxTimings)
        progress(what + fmt(": two timings %.0f%% apart, timed again", gap * 100));
      else
        progress(what + fmt(": still %.0f%% apart after ", gap * 100) + std::to_string(kMaxTimings) +
                 " timings (a busy machine); keeping each shape's fastest");
    }
  };
  progress("GEMMs and attention again (each shape keeps its fastest timing)");
  for (auto [dt, samples] : {std::pair{at::kFloat, &fp32_}, {at::kBFloat16, &bf16_}, {at::kHalf, &fp16_}}) {
    if (samples->empty()) continue;
    settle(
        std::string(c10::toString(dt)) + " GEMMs", [&, dt = dt](std::vector<GemmSample>& v) { gemm_dtype(dt, v); },
        *samples, [](const GemmSample& f, const GemmSample& a) { return f.m == a.m && f.n == a.n && f.k == a.k; },
        [](const GemmSample& g) { return g.seconds; });
  }
  for (auto [dt, samples] : {std::pair{at::kFloat, &attn_}, {at::kBFloat16, &attn_bf16_}}) {
    settle(
        std::string(c10::toString(dt)) + " attention", [&, dt = dt](std::vector<AttnSample>& v) { attention(dt, v); },
        *samples, [](const AttnSample& f, const AttnSample& a) { return f.shape.seq_len == a.shape.seq_len; },
        [](const AttnSample& x) { return x.fwd_s + x.bwd_s; });
  }
}

void Calibrator::attention(at::ScalarType dt, std::vector<AttnSample>& out) {
  // The executor's attention (attention_core, executor/model/transformer.hpp), forward and backward,
  // batch 1, 8 heads of 64, in the compute dtype `dt`, growing sequence length from 16 (small calls are
  // dominated by the core's fixed cost: mask, softmax, casts).
  const double cap = opt_.quick ? 0.02 : 0.4;
  const auto o = f32_.dtype(dt);
  for (int64_t T = 16; T <= 8192; T *= 2) {
    AttentionShape a;
    a.batch = 1;
    a.seq_len = T;
    a.heads = a.kv_heads = 8;
    a.head_dim = 64;
    a.causal = true;
    at::Tensor q = at::randn({a.batch, a.heads, T, a.head_dim}, f32_).to(o), k = at::randn_like(q),
               v = at::randn_like(q);
    const double fwd = time_op([&] { (void)attention_core(q, k, v, /*eager=*/true); });
    at::Tensor qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true),
               vg = v.clone().requires_grad_(true);
    at::Tensor go = at::randn_like(q);
    const double both = time_op([&] {
      at::Tensor o = attention_core(qg, kg, vg, true);
      torch::autograd::backward({o}, {go});
    });
    const double bwd = std::max(both - fwd, 0.05 * both);
    out.push_back({a, fwd, bwd});
    progress(std::string(c10::toString(dt)) + " attention seq " + std::to_string(T) + ": forward " +
             fmt("%.3f ms", fwd * 1e3) + ", backward " + fmt("%.3f ms", bwd * 1e3));
    if (agree(both > cap || (opt_.quick && T >= 256))) break;
  }
}

// The passes host_overhead prices (HostOverhead's four fields, in this order).
constexpr std::array<const char*, 4> kPasses{"layer forward", "layer backward", "head forward", "head backward"};

// The elementwise bytes the simulator charges each pass of the probe (simulator/program/step_program.cpp:
// one layer's forward and backward, the head + loss forward and backward), for fsdp-run's runtime profile
// at batch 1 x `tokens`: the same accounting the predictions will use.
std::array<double, 4> simulated_elementwise_bytes(const ModelSpec& spec, DType dt, int64_t tokens,
                                                  const RuntimeProfile& rt) {
  const ModuleGraph graph(spec);
  ProgramInput in;
  in.graph = &graph;
  in.runtime = &rt;
  in.strategy.kind = StrategyKind::Ddp;
  in.strategy.param_dtype = dt;
  in.strategy.micro_batch = 1;
  in.strategy.seq_len = tokens;
  in.strategy.attention = AttentionImpl::Eager;
  const StepProgram prog = emit_step_program(in);
  std::array<double, 4> bytes{0, 0, 0, 0};
  for (const Op& op : prog.ops) {
    if (op.kind == OpKind::Forward && op.layers > 0) bytes[0] += op.elementwise_bytes / op.layers;
    if (op.kind == OpKind::Backward && op.layers > 0) bytes[1] += op.elementwise_bytes / op.layers;
    if (op.kind == OpKind::Loss) bytes[2] += op.elementwise_bytes;
    if (op.kind == OpKind::LossBackward) bytes[3] += op.elementwise_bytes;
  }
  // The probe has one layer per unit: the sums above are of its `layers` identical layers.
  bytes[0] /= static_cast<double>(spec.num_layers);
  bytes[1] /= static_cast<double>(spec.num_layers);
  return bytes;
}

std::array<double, 4> Calibrator::probe_pass_times(const ProbeShape& shape, at::ScalarType dt, std::string& note) {
  // The executor's own forward and backward (executor/model/transformer.hpp: embed_forward, layer_forward,
  // head_loss, autograd) of the probe with 0 and `layers` layers, batch 1; per layer = the difference /
  // layers, the head = the 0-layer run. From each, the time of its GEMMs and attention core, timed alone at
  // the same shapes, is taken away: the simulator prices those with the curves above. What remains is the
  // host time of everything else (dispatch, autograd, norms, rotary, casts, residual adds, activations).
  ConfigMap map = ConfigMap::load_string(probe_model_yaml(shape), "calibrate probe");
  const ModelSpec spec = parse_model_map(map);
  const int64_t T = shape.tokens, H = spec.hidden_size, F = spec.ffn_size, V = spec.vocab_size;
  const int64_t nh = spec.num_heads, nkv = spec.num_kv_heads, hd = spec.head_dim;
  const auto o = f32_.dtype(dt);
  const std::vector<ParamDef> defs = model_param_defs(spec);
  ParamMap params;
  for (std::size_t i = 0; i < defs.size(); ++i)
    params[defs[i].name] = init_param(defs[i], static_cast<int64_t>(i), 0).to(o).requires_grad_(true);
  at::Tensor tokens = at::randint(0, V, {1, T + 1}, f32_.dtype(at::kLong));
  const at::Tensor in = tokens.narrow(1, 0, T).contiguous(), target = tokens.narrow(1, 1, T).contiguous();
  ForwardOptions fo;
  fo.attention = AttentionImpl::Eager;
  auto forward = [&](int layers) {
    at::Tensor h = embed_forward(spec, params, in);
    for (int l = 0; l < layers; ++l) h = layer_forward(spec, params, l, h, fo);
    return head_loss(spec, params, h, target);
  };
  auto backward = [&](const at::Tensor& loss) {
    torch::autograd::backward({loss});
    for (auto& [name, t] : params) t.mutable_grad() = at::Tensor();
  };
  // A longer budget than the kernels: these are differences of small times.
  auto timed = [&](const std::function<void()>& f) {
    f();
    std::vector<double> ts;
    const auto start = Clock::now();
    while (ts.size() < 3 || (ts.size() < 200 && seconds_since(start) < (opt_.quick ? 0.3 : 1.0))) {
      const auto t0 = Clock::now();
      f();
      sync();
      ts.push_back(seconds_since(t0));
    }
    return cal::lower_quartile(ts);
  };
  const int L = shape.layers;
  const double f0 = timed([&] { (void)forward(0); }), fL = timed([&] { (void)forward(L); });
  const double b0 = timed([&] { backward(forward(0)); }), bL = timed([&] { backward(forward(L)); });
  // The layer's GEMMs (x W^T forward; dy W and dy^T x backward) and its attention core, alone.
  double gemm_f = 0, gemm_b = 0;
  auto linear = [&](int64_t outf, int64_t inf, double& fwd, double& bwd) {
    at::Tensor x = at::randn({T, inf}, f32_).to(o), w = at::randn({outf, inf}, f32_).to(o),
               dy = at::randn({T, outf}, f32_).to(o);
    fwd += timed([&] { (void)at::mm(x, w.t()); });
    bwd += timed([&] { (void)at::mm(dy, w); }) + timed([&] { (void)at::mm(dy.t(), x); });
  };
  for (auto [outf, inf] :
       {std::pair<int64_t, int64_t>{nh * hd, H}, {nkv * hd, H}, {nkv * hd, H}, {H, nh * hd}, {F, H}, {F, H}, {H, F}})
    linear(outf, inf, gemm_f, gemm_b);
  double head_f = 0, head_b = 0;
  linear(V, H, head_f, head_b);
  at::Tensor q = at::randn({1, nh, T, hd}, f32_).to(o).requires_grad_(true), k = at::randn_like(q).requires_grad_(true),
             v = at::randn_like(q).requires_grad_(true);
  at::Tensor go = at::randn_like(q);
  const double attn_f = timed([&] { (void)attention_core(q, k, v, true); });
  const double attn_fb = timed([&] {
    at::Tensor a = attention_core(q, k, v, true);
    torch::autograd::backward({a}, {go});
    q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
  });
  const double layer_f = (fL - f0) / L, layer_b = (bL - b0) / L - layer_f;
  auto us = [](double t) { return fmt("%.0f us", t * 1e6); };
  note = "tokens " + std::to_string(T) + ", hidden " + std::to_string(H) + ", ffn " + std::to_string(F) + ", vocab " +
         std::to_string(V) + ": layer forward " + us(layer_f) + " - GEMMs " + us(gemm_f) + " - attention " +
         us(attn_f) + ", backward " + us(layer_b) + " - " + us(gemm_b) + " - " + us(attn_fb - attn_f) +
         "; embedding+head+loss forward " + us(f0) + " - " + us(head_f) + ", backward " + us(b0 - f0) + " - " +
         us(head_b);
  return {layer_f - gemm_f - attn_f, layer_b - gemm_b - (attn_fb - attn_f), f0 - head_f, b0 - f0 - head_b};
}

double Calibrator::optimizer_bandwidth(const RuntimeProfile& rt, std::string& note) {
  // The executor's on-device AdamW step (train/device_optimizer.hpp) as a step runs it: one call per wrap
  // unit, over units of a small model's per-rank shard size, each unit's buffers cold in the caches when its
  // turn comes (the set of units is larger than a core's L2), at the bytes the runtime profile says it moves.
  constexpr int64_t kUnitElems = 128 * 1024, kUnits = 8;
  std::vector<std::array<at::Tensor, 4>> units;
  for (int64_t u = 0; u < kUnits; ++u)
    units.push_back({at::randn({kUnitElems}, f32_), at::randn({kUnitElems}, f32_), at::zeros({kUnitElems}, f32_),
                     at::zeros({kUnitElems}, f32_)});
  OptimizerConfig c;
  c.weight_decay = 0.1;
  int64_t step = 0;
  const double t = time_op([&] {
    ++step;
    for (auto& [p, g, m, v] : units) adamw_update(p, g, m, v, c, step);
  });
  const double params = double(kUnitElems * kUnits);
  const double bw = rt.adamw_bytes_per_param * params / t;
  note = "fp32 from the executor's AdamW step (train/device_optimizer.cpp) over " + std::to_string(kUnits) +
         " units of " + std::to_string(kUnitElems) + " fp32 parameters: " + fmt("%.1f us", t * 1e6) + " for " +
         fmt("%.0f", rt.adamw_bytes_per_param) + " B each (" + rt.source + " training_loop.adamw_bytes_per_param)";
  return bw;
}

void Calibrator::host_overhead(at::ScalarType dt, HostOverhead& out, BytesPerSecond& elementwise, std::string& note) {
  const DType sim_dt = dt == at::kBFloat16 ? DType::Bf16 : DType::Fp32;
  const RuntimeProfile rt = load_runtime("fsdp-run", opt_.config_root);
  // Each pass's non-GEMM time at every probe shape, fitted (relative least squares, x >= 0) as
  //   time(pass, shape) = host(pass) + elementwise_bytes(pass, shape) / elementwise_bandwidth:
  // a fixed host time per pass and one rate for the bytes the simulator counts. In fp32 the probes' GEMMs
  // take 90% of a layer at the wider shapes, and the difference left is too uncertain to fit a rate from:
  // the fp32 rate is the optimizer's, measured directly (fp32 elementwise work is mostly the optimizer's,
  // in bf16 plans too), and only the fixed times are fitted.
  const bool fit_rate = dt != at::kFloat;
  std::string rate_note;
  const double fixed_bw = fit_rate ? 0.0 : optimizer_bandwidth(rt, rate_note);
  std::vector<std::vector<double>> rows;
  std::vector<double> y;
  std::vector<std::string> shape_notes;
  // --quick leaves out the widest probe (its fp32 GEMMs take seconds); three shapes still over-determine
  // the five unknowns (12 pass times).
  const std::size_t shapes = opt_.quick ? kProbeShapes.size() - 1 : kProbeShapes.size();
  for (std::size_t si = 0; si < shapes; ++si) {
    const ProbeShape& shape = kProbeShapes[si];
    std::string sn;
    const std::array<double, 4> t = probe_pass_times(shape, dt, sn);
    ConfigMap map = ConfigMap::load_string(probe_model_yaml(shape), "calibrate probe");
    const std::array<double, 4> bytes = simulated_elementwise_bytes(parse_model_map(map), sim_dt, shape.tokens, rt);
    for (std::size_t k = 0; k < kPasses.size(); ++k) {
      const double rest = fit_rate ? t[k] : t[k] - bytes[k] / fixed_bw;
      if (!(rest > 0)) continue;  // the GEMMs timed alone (and the bytes) took as long: nothing to fit
      std::vector<double> row(kPasses.size() + (fit_rate ? 1 : 0), 0.0);
      row[k] = 1.0;
      if (fit_rate) row.back() = bytes[k];
      rows.push_back(row);
      y.push_back(rest);
    }
    shape_notes.push_back(sn);
    progress("host overhead " + std::string(c10::toString(dt)) + ", " + sn);
  }
  const cal::LsqResult fit = cal::nonneg_relative_lsq(rows, y);
  out.layer_forward = Seconds(fit.coef[0]);
  out.layer_backward = Seconds(fit.coef[1]);
  out.head_forward = Seconds(fit.coef[2]);
  out.head_backward = Seconds(fit.coef[3]);
  elementwise = BytesPerSecond(fit_rate ? (fit.coef[4] > 0 ? 1.0 / fit.coef[4] : 0.0) : fixed_bw);
  if (!fit_rate) note_elementwise_fp32_ = rate_note;
  std::string shapes_note;
  for (const auto& sn : shape_notes) shapes_note += (shapes_note.empty() ? "" : "; ") + sn;
  note = std::string(c10::toString(dt)) + " (non-GEMM time per pass at each probe shape: " + shapes_note +
         "; fit residual rms " + fmt("%.1f%%", 100 * fit.rms_rel) + ", worst " + fmt("%.1f%%", 100 * fit.max_abs_rel) +
         ")";
}

void Calibrator::host() {
  // Node-wide quantities: local rank 0 measures them alone while the node's other ranks wait.
  comm_.world().barrier();
  if (comm_.local_rank() == 0) {
    const at::TensorOptions h = at::TensorOptions().dtype(at::kFloat);
    host_bw_ = memory_bandwidth(h, opt_.quick ? (16 << 20) / 4 : (256 << 20) / 4);
    progress("host memory bandwidth: " + fmt("%.2f GB/s", host_bw_ / 1e9));
    adam_params_ = opt_.quick ? (4 << 20) : (32 << 20);
    at::Tensor p = at::randn({adam_params_}, h), g = at::randn({adam_params_}, h), m = at::zeros({adam_params_}, h),
               v = at::zeros({adam_params_}, h);
    AdamHyper hy{1e-3, 0.9, 0.999, 1e-8, 0.01, 1};
    const double t = time_op([&] {
      host_adamw_step(p, g, m, v, hy);
      ++hy.step;
    });
    adam_params_per_s_ = double(adam_params_) / t;
    progress("host AdamW: " + fmt("%.3g params/s", adam_params_per_s_));
  }
  comm_.world().barrier();
#if defined(FSDP_EXEC_CUDA)
  if (cuda_) {
    const int64_t elems = (opt_.quick ? (64 << 20) : (256 << 20)) / 4;
    at::Tensor hbuf = at::empty({elems}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
    at::Tensor dbuf = at::empty({elems}, f32_);
    h2d_ = 4.0 * double(elems) / time_op([&] { dbuf.copy_(hbuf); });
    d2h_ = 4.0 * double(elems) / time_op([&] { hbuf.copy_(dbuf); });
    progress("host->device " + fmt("%.2f GB/s", h2d_ / 1e9) + ", device->host " + fmt("%.2f GB/s", d2h_ / 1e9));
  }
#endif
}

void Calibrator::measure_group(Group& g, std::vector<CollSample>& out, const std::string& what) {
  std::vector<double> sizes;
  const double top = opt_.quick ? 4 * kMiB : (cuda_ ? 256 * kMiB : 64 * kMiB);
  for (double s = opt_.quick ? 64 * 1024 : 16 * 1024; s <= top; s *= 2) sizes.push_back(s);
  // The statistic is the mean: a training step pays the sum of its collectives, and on a loaded or virtual
  // machine single collectives are bimodal (a fast mode, and one that waits a scheduler quantum for a thread
  // to run), so a median flips between modes. The slowest timing of each is left out (a one-off stall).
  // The calls are made in rounds over every (size, collective), not size after size: a slow phase of the
  // machine lasting seconds then spreads over all of them instead of inflating a few neighbouring sizes,
  // which bent the line fit (quick calibrations of one machine gave 0.74-1.58 GB/s before).
  const int rounds = 8, per_round = opt_.quick ? 4 : 5;
  const int n = g.size();
  constexpr std::array<CollKind, 3> kinds{CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce};
  struct Buffers {
    at::Tensor full, shard;
  };
  std::vector<Buffers> bufs;
  for (double bytes : sizes) {
    const int64_t shard = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4) / n);
    bufs.push_back({at::rand({shard * n}, f32_), at::rand({shard}, f32_)});
  }
  auto run = [&](CollKind k, Buffers& b) {
    Handle h = k == CollKind::AllGather       ? g.all_gather(b.shard, b.full)
               : k == CollKind::ReduceScatter ? g.reduce_scatter_sum(b.full, b.shard)
                                              : g.all_reduce_sum(b.full);
    h.wait();
    sync();
  };
  std::vector<std::vector<double>> ts(sizes.size() * kinds.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (CollKind k : kinds) run(k, bufs[i]);  // warm-up: connections, buffers
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < kinds.size(); ++j)
        for (int c = 0; c < per_round; ++c) {
          g.barrier();
          const auto t0 = Clock::now();
          run(kinds[j], bufs[i]);
          ts[i * kinds.size() + j].push_back(seconds_since(t0));
        }
    progress(what + fmt(" collectives: round %.0f", r + 1) + fmt(" of %.0f", rounds));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::size_t j = 0; j < kinds.size(); ++j) {
      std::vector<double>& v = ts[i * kinds.size() + j];
      std::sort(v.begin(), v.end());
      v.pop_back();
      double mean = 0;
      for (double t : v) mean += t / double(v.size());
      CollSample s{kinds[j], n, 4.0 * double(bufs[i].full.numel()), mean};
      out.push_back(s);
      progress(what + " " + cal::coll_name(kinds[j]) + " " + fmt("%.0f KiB", s.bytes / 1024) + " over " +
               std::to_string(n) + ": " + fmt("%.3f ms", s.seconds * 1e3) + " (busbw " +
               fmt("%.3f GB/s", cal::busbw_factor(kinds[j], n) * s.bytes / s.seconds / 1e9) + ")");
    }
}

void Calibrator::step_probe(const DistEnv& env, int rounds) {
  // Collectives timed alone (above) run after a barrier on otherwise idle ranks; inside a step they meet ranks
  // that arrive apart and transport threads that wait for busy cores, and on this kind of machine cost more.
  // The probe plan runs for real over the node's ranks and then, on every rank at once, with its collectives
  // made local (the executor's rehearsal, --emulate-world-size): the difference is what its collectives cost
  // inside a step. write_profile divides it by what the fitted profile prices them at. The probe runs once per
  // compute dtype that keeps its own factors (probes_: bf16, fp32): on a CPU the fp32 probe computes ~10x
  // longer between the same collectives, and their transport threads take their cores from that compute.
  if (comm_.size() < 2 || comm_.size() != env.local_world_size) return;
  // Rounds of real and rehearsed runs alternate, and each side is the median of all its rounds' steps: a slow
  // phase of the machine (minutes on a shared VM) then weighs on every side alike instead of on one run of
  // 10 steps (one run a side before: the factor moved 0.82-1.5 between calibrations). On CPUs each round also
  // runs the probe with twice as many ranks as CPUs (rank 0 launches them; the node's calibration ranks sleep
  // meanwhile): plans whose ranks outnumber the cores wait differently (their ranks sleep, cpu_busy_poll) and
  // are priced by that run (collectives.in_step_factor_shared_cores).
  // run() calls this twice, before and after the collectives, so that its rounds meet more than one phase
  // of the machine. With one block of 3 rounds of 9 steps (2 s of the 4-rank probe), the factors of five
  // calibrations of one idle machine (tests/accuracy/README.md, runs I-M) were 0.87-1.27x (2 ranks) and
  // 0.76-1.26x (4 ranks) of the one factor that best fitted the grid measured after each; with two blocks
  // of 4 rounds of 11 steps, 0.93-1.20x and 0.77-1.05x (runs N-T).
  auto add_steps = [](const RunResult& r, std::vector<double>& to) {
    for (std::size_t i = 1; i < r.steps.size(); ++i) to.push_back(r.steps[i].time_s);  // step 1 warms up
  };
  const bool poll = cpu_busy_poll(env.local_world_size, threads_);
  // The median of the steps one run added to `v` (from index `from`), for the progress line.
  auto run_median = [](const std::vector<double>& v, std::size_t from) {
    return cal::median(std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end()));
  };
  std::array<PlanFile, std::tuple_size_v<decltype(probes_)>> plans;
  for (std::size_t i = 0; i < probes_.size(); ++i)
    plans[i] = step_probe_plan(comm_.size(), cuda_ ? "cuda" : "cpu", probes_[i].dtype);
  for (int round = 0; round < rounds; ++round) {
    ++probe_rounds_;
    for (std::size_t i = 0; i < probes_.size(); ++i) {
      ProbeSeries& pr = probes_[i];
      const PlanFile& plan = plans[i];
      RunConfig cfg;
      cfg.steps = opt_.quick ? pr.steps_quick : pr.steps_full;
      cfg.log_every = cfg.steps + 1;
      const std::size_t real0 = pr.real.size(), local0 = pr.local.size(), shared0 = pr.shared.size();
      comm_.world().barrier();
      {
        Trainer trainer(plan, cfg, comm_);
        add_steps(trainer.run(nullptr), pr.real);
      }
      comm_.world().barrier();
      {
        std::unique_ptr<Comm> local = Comm::emulate(comm_.size(), !cuda_);
        Trainer trainer(plan, cfg, *local);
        add_steps(trainer.run(nullptr), pr.local);
      }
      if (!cuda_) {
        comm_.set_busy_poll(false);
        comm_.world().barrier();
        if (comm_.rank() == 0 && !pr.shared_failed)
          pr.shared_failed = !oversubscribed_probe(2 * comm_.size(), pr.dtype, cfg.steps, pr.shared);
        comm_.world().barrier();
        comm_.set_busy_poll(poll);
      }
      progress(fmt("step probe round %.0f", probe_rounds_) + " (" + to_string(pr.dtype) +
               "): " + fmt("%.2f ms", run_median(pr.real, real0) * 1e3) +
               fmt(", %.2f ms local", run_median(pr.local, local0) * 1e3) +
               (pr.shared.size() > shared0 ? fmt(", %.2f ms", run_median(pr.shared, shared0) * 1e3) + " over " +
                                                 std::to_string(2 * comm_.size()) + " ranks"
                                           : std::string()));
    }
  }
  comm_.world().barrier();
}

void Calibrator::finish_step_probe() {
  for (ProbeSeries& pr : probes_) {
    if (pr.real.empty()) continue;
    pr.step_s = cal::median(pr.real);
    pr.alone_s = cal::median(pr.local);
    pr.shared_step_s = pr.shared.empty() ? 0.0 : cal::median(pr.shared);
    progress("step probe (fsdp, " + std::string(to_string(pr.dtype)) + ", " + std::to_string(comm_.size()) +
             " ranks, " + std::to_string(probe_rounds_) + " rounds): " + fmt("%.2f ms", pr.step_s * 1e3) + " a step, " +
             fmt("%.2f ms", pr.alone_s * 1e3) + " with local collectives" +
             (pr.shared_step_s > 0
                  ? fmt(", %.2f ms", pr.shared_step_s * 1e3) + " over " + std::to_string(2 * comm_.size()) + " ranks"
                  : std::string()));
  }
}

bool Calibrator::oversubscribed_probe(int ranks, DType dtype, int64_t steps, std::vector<double>& to) {
  // The probe plan over `ranks` local ranks, run by this same binary as `fsdp-run plan.yaml` under its own
  // launcher, in a scratch directory; its report's steps 2..N join `to`. A failed run leaves `to` as it was
  // (the profile then has no shared-cores factor when no round succeeded), says why and returns false.
  namespace fs = std::filesystem;
  fs::path dir;
  std::error_code ec;
  bool ok = true;
  try {
    dir = fs::temp_directory_path() / ("fsdp-calibrate-probe-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string plan_path = (dir / "probe.yaml").string(), report_path = (dir / "report.json").string();
    write_plan_file(step_probe_plan(ranks, "cpu", dtype), plan_path);
    LaunchOptions lo;
    lo.nproc = ranks;
    lo.grace = std::chrono::milliseconds(1000LL * opt_.timeout_s + 30000);
    lo.quiet = true;
    const int rc = launch_local(lo, {"fsdp-run", plan_path, "--steps", std::to_string(steps), "--report", report_path,
                                     "--timeout", std::to_string(opt_.timeout_s)});
    if (rc != 0) throw std::runtime_error("its ranks exited with code " + std::to_string(rc));
    std::ifstream in(report_path);
    const nlohmann::json report = nlohmann::json::parse(in);
    const auto& st = report.at("steps");
    for (std::size_t i = 1; i < st.size(); ++i) to.push_back(st[i].at("time_s").get<double>());
  } catch (const std::exception& e) {
    progress(std::string("step probe (") + to_string(dtype) + ") over " + std::to_string(ranks) + " ranks failed (" +
             e.what() + "); not tried again");
    ok = false;
  }
  if (!dir.empty()) fs::remove_all(dir, ec);
  return ok;
}

void Calibrator::collectives(const DistEnv& env) {
  const int lws = env.local_world_size, nodes = comm_.size() / std::max(1, lws);
  if (nodes * lws != comm_.size()) throw InputError("calibrate: world size is not nodes x local world size");
  const int node = comm_.rank() / lws;
  if (lws > 1) {
    std::vector<int> members;
    for (int i = 0; i < lws; ++i) members.push_back(node * lws + i);
    auto g = comm_.subgroup("cal-intra", members);
    intra_size_ = lws;
    measure_group(*g, intra_, "intra-node");
  }
  if (nodes > 1) {
    std::vector<int> members;
    for (int i = 0; i < nodes; ++i) members.push_back(i * lws + comm_.local_rank());
    auto g = comm_.subgroup("cal-inter", members);
    inter_size_ = nodes;
    measure_group(*g, inter_, "inter-node");
  }
}

int Calibrator::run(const DistEnv& env) {
  const auto start = Clock::now();
  progress(std::to_string(comm_.size()) + " rank(s) on " + device_ + (opt_.quick ? ", quick" : "") + ", " +
           std::to_string(threads_) + " intra-op thread(s) per rank, " + std::to_string(cpus_) + " CPUs");
  mem_total_ = meminfo_bytes("MemTotal");
  mem_available_ = meminfo_bytes("MemAvailable");
#if defined(FSDP_EXEC_CUDA)
  if (cuda_) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) throw std::runtime_error("cudaMemGetInfo failed");
    device_total_ = double(total_b);
  }
#endif
  device_bw_ = memory_bandwidth(f32_, (opt_.quick ? (16 << 20) : (256 << 20)) / 4);
  progress("device memory bandwidth: " + fmt("%.2f GB/s", device_bw_ / 1e9));
  gemms();
  attention(at::kFloat, attn_);
  attention(at::kBFloat16, attn_bf16_);
  host_overhead(at::kFloat, overhead_fp32_, elementwise_fp32_, overhead_note_fp32_);
  host_overhead(at::kBFloat16, overhead_bf16_, elementwise_bf16_, overhead_note_bf16_);
  host();
  // The step probe's two blocks, around the collectives (step_probe), then the kernels' second timing: the
  // measurements that decide the factors and the curves are each spread over the calibration's minute.
  const int probe_rounds = opt_.quick ? 4 : 5;  // per block
  step_probe(env, probe_rounds);
  collectives(env);
  step_probe(env, probe_rounds);
  finish_step_probe();
  kernels_again();
  comm_.world().barrier();
  int rc = 0;
  if (root()) {
    std::cout << write_profile(env);
    std::cout << "calibrate: done in " << fmt("%.1f s", seconds_since(start)) << ", wrote " << opt_.out << "\n";
  }
  comm_.world().barrier();
  return rc;
}

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

std::string Calibrator::write_profile(const DistEnv& env) {
  std::ostringstream rep;  // the report printed on stdout
  const std::string date = today();
  const std::string by = "measured by fsdp-run calibrate on " + date + ", ";
  const std::string base_name = opt_.base.empty() ? "cpu" : opt_.base;
  const HardwareProfile base = load_hardware(base_name, opt_.config_root);
  const std::string from_base = "from --base " + base.source + " (not measured by fsdp-run calibrate)";
  HardwareProfile hw = base;
  cal::ProfileNotes notes;
  auto& N = notes.note;
  hw.name = opt_.name;
  hw.source = opt_.out;
  hw.device_kind = cuda_ ? "cuda" : "cpu";
  N["name"] = "written by fsdp-run calibrate on " + date + " (docs/calibrate.md); schema: docs/hardware.md";
  N["device_kind"] = by + "the device the ranks ran on (" + device_ + ")";
  hw.backend = load_backend(cuda_ ? "nccl" : "gloo", opt_.config_root);
  N["backend"] = by + "the c10d backend its collectives ran through";
  // What the fitted numbers below belong to: fsdp-plan refuses the profile for another runtime or cost model.
  hw.calibrated = HardwareProfile::Calibration{
      "fsdp-run", std::string("LibTorch ") + TORCH_VERSION + (cuda_ ? ", NCCL" : ", Gloo"), kCostModelVersion};
  N["calibrated.runtime"] =
      "the runtime whose executor ran the probes: the host overheads and in-step factors are its own";
  N["calibrated.runtime_build"] = "that executor's build";
  N["calibrated.cost_model_version"] =
      "the fsdp-plan cost model the factors were fitted against (hardware_profile.hpp kCostModelVersion)";
  notes.header = {"Hardware profile written by `fsdp-run calibrate" + std::string(opt_.quick ? " --quick" : "") +
                      "` on " + date + ": " + std::to_string(comm_.size()) + " rank(s), " +
                      std::to_string(env.local_world_size) + " per node, LibTorch " + TORCH_VERSION + ".",
                  "Per-device numbers were measured on every local rank at once (rank 0's are written); node-wide",
                  "numbers (host bandwidth, host AdamW) by local rank 0 alone. Fields calibrate cannot measure",
                  "come from the base profile " + base.source + " and say so."};

  // --- Memory ---
  if (cuda_) {
    hw.usable_device_memory = Bytes(device_total_);
    hw.device_memory = Bytes(std::max(base.device_memory.value, device_total_));
    N["device.memory"] = hw.device_memory.value > base.device_memory.value
                             ? by + "cudaMemGetInfo total (above the base profile's memory)"
                             : from_base;
    N["device.usable_memory"] = by + "cudaMemGetInfo total of device " + std::to_string(comm_.local_rank());
  } else {
    if (!(mem_total_ > 0 && mem_available_ > 0)) throw std::runtime_error("calibrate: /proc/meminfo unreadable");
    hw.device_memory = Bytes(mem_total_);
    hw.usable_device_memory = Bytes(std::min(mem_available_, mem_total_));
    N["device.memory"] =
        by + fmt("/proc/meminfo MemTotal (%.2f GiB): the CPU \"device\" is host RAM", mem_total_ / kMiB / 1024);
    N["device.usable_memory"] =
        by + fmt("/proc/meminfo MemAvailable (%.2f GiB) while calibrate ran; every rank shares it",
                 mem_available_ / kMiB / 1024);
  }
  if (mem_total_ > 0) {
    hw.host_memory = Bytes(mem_total_);
    N["node.host_memory"] = by + "/proc/meminfo MemTotal";
  } else {
    N["node.host_memory"] = from_base;
  }

  // --- Memory bandwidths ---
  hw.memory_bandwidth = BytesPerSecond(device_bw_);
  N["device.memory_bandwidth"] = by + "a = b + c over 3 x " + fmt("%.0f MiB", (opt_.quick ? 16.0 : 256.0)) +
                                 " fp32 arrays on " + device_ +
                                 " (STREAM-triad-like, 12 bytes per element), every local rank at once";
  if (host_bw_ > 0) {
    hw.host_memory_bandwidth = BytesPerSecond(host_bw_);
    N["node.host_memory_bandwidth"] = by + "a = b + c over host fp32 arrays, local rank 0 alone (all its threads)";
  } else {
    N["node.host_memory_bandwidth"] = from_base;
  }
  if (cuda_) {
    hw.host_to_device = BytesPerSecond(0.5 * (h2d_ + d2h_));
    N["node.host_to_device"] = by + "mean of pinned host->device " + fmt("%.2f GB/s", h2d_ / 1e9) +
                               " and device->host " + fmt("%.2f GB/s", d2h_ / 1e9) + " copies, every GPU at once";
  } else {
    hw.host_to_device = BytesPerSecond(device_bw_);
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
    cal::Curve mm = cal::make_efficiency_curve(pts);
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
      gemm_curve(fp32_, "fp32", hw.peak_flops_fp32, "device.peak_flops.fp32", "device.matmul_efficiency");
  N["device.matmul_efficiency"] += "\n(the curve of every dtype without a curve of its own)";
  if (!bf16_.empty())
    hw.matmul_efficiency_bf16 =
        gemm_curve(bf16_, "bf16", hw.peak_flops_bf16, "device.peak_flops.bf16", "device.matmul_efficiency_bf16");
  if (!fp16_.empty()) {
    hw.matmul_efficiency_fp16 =
        gemm_curve(fp16_, "fp16", hw.peak_flops_fp16, "device.peak_flops.fp16", "device.matmul_efficiency_fp16");
  } else if (!bf16_.empty()) {
    // Half GEMMs do not exist here (LibTorch 1.13 CPU): an fp16 plan cannot run, so fp16 is priced as bf16.
    hw.peak_flops_fp16 = hw.peak_flops_bf16;
    hw.matmul_efficiency_fp16 = hw.matmul_efficiency_bf16;
    N["device.peak_flops.fp16"] = "taken at the measured bf16 rate: " + fp16_missing_;
    N["device.matmul_efficiency_fp16"] = "the bf16 curve: " + fp16_missing_;
  } else {
    N["device.peak_flops.fp16"] = from_base;
  }

  // --- The forward GEMM's share: per dtype, the median over the shapes of x W^T's time / the mean of three ---
  std::string ratio_note;
  auto forward_ratio = [&](const std::vector<GemmSample>& v, const char* what) {
    std::vector<double> r;
    for (const auto& g : v) r.push_back(g.forward_share);
    const double m = cal::median(r);
    ratio_note += std::string(ratio_note.empty() ? "" : ", ") + what + fmt(" %.3g", m) +
                  fmt(" (%.3g", *std::min_element(r.begin(), r.end())) +
                  fmt("-%.3g", *std::max_element(r.begin(), r.end())) + ")";
    return m;
  };
  hw.matmul_forward_ratio_fp32 = forward_ratio(fp32_, "fp32");
  if (!bf16_.empty()) hw.matmul_forward_ratio_bf16 = forward_ratio(bf16_, "bf16");
  hw.matmul_forward_ratio_fp16 = !fp16_.empty() ? forward_ratio(fp16_, "fp16") : hw.matmul_forward_ratio_bf16;
  N["device.matmul_forward_ratio"] = by +
                                     "the GEMM shapes above: the forward GEMM's (x W^T) time / the mean of the "
                                     "linear layer's three,\nmedian over the shapes (range): " +
                                     ratio_note + (fp16_.empty() ? "; fp16 as bf16" : "");

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
    cal::Curve cf = cal::make_efficiency_curve(fw), cb = cal::make_efficiency_curve(bw);
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
  attention_curves(attn_, "fp32", hw.peak_flops_fp32, "", hw.attention_efficiency, hw.attention_backward_efficiency);
  if (!attn_bf16_.empty()) {
    attention_curves(attn_bf16_, "bf16", hw.peak_flops_bf16, "_bf16", hw.attention_efficiency_bf16,
                     hw.attention_backward_efficiency_bf16);
    if (fp16_.empty()) {
      // fp16 priced as bf16 (above): the bf16 curves relative to the same peak.
      hw.attention_efficiency_fp16 = hw.attention_efficiency_bf16;
      hw.attention_backward_efficiency_fp16 = hw.attention_backward_efficiency_bf16;
      N["device.attention_forward_efficiency_fp16"] = "the bf16 curve: " + fp16_missing_;
      N["device.attention_backward_efficiency_fp16"] = "the bf16 curve: " + fp16_missing_;
    }
  }

  // --- Host overhead and elementwise bandwidth of the executor's eager layer, per dtype ---
  hw.host_overhead_fp32 = overhead_fp32_;
  hw.host_overhead_bf16 = overhead_bf16_;
  hw.host_overhead_fp16 = HostOverhead{};  // fp16: the bf16 entry's rules (fp32's) apply; none measured
  hw.elementwise_bandwidth_fp32 = elementwise_fp32_;
  hw.elementwise_bandwidth_bf16 = elementwise_bf16_;
  hw.elementwise_bandwidth_fp16 = BytesPerSecond(0);
  const std::string probe_how =
      "the executor's forward/backward (embed_forward, layer_forward, head_loss, autograd) of Llama-shaped\n"
      "probes (batch 1; tokens, hidden, ffn and vocab below) with 0 and 2-4 layers, less their GEMMs and\n"
      "attention core timed alone (the curves above price those), fitted per dtype as a fixed host time per\n"
      "pass plus the elementwise bytes the simulator counts for that pass / one elementwise bandwidth\n"
      "(relative least squares; fp32 at its measured rate). ";
  N["device.host_overhead"] = by + probe_how + overhead_note_fp32_ + ";\n" + overhead_note_bf16_;
  N["device.elementwise_bandwidth"] =
      by + note_elementwise_fp32_ + ";\nbf16 " +
      (hw.elementwise_bandwidth_bf16.value > 0 ? "the bandwidth term of the host_overhead fit (see there)"
                                               : "absent: the host_overhead fit found no bytes term");

  // --- CPU: the cores the node has and the cores each rank computed on ---
  if (!cuda_) {
    hw.cpu_cores = cpus_;
    N["node.cpu_cores"] = by + "the CPUs this process may run on (sched_getaffinity)";
    hw.device_cores = cpu_cores_per_rank(cpus_, env.local_world_size);
    if (threads_ < hw.device_cores) hw.device_cores = threads_;  // OMP_NUM_THREADS asked for fewer
    N["device.cores"] = by + std::to_string(env.local_world_size) + " local rank(s) on " + std::to_string(cpus_) +
                        " CPUs, " + std::to_string(threads_) +
                        " intra-op thread(s) each (executor/dist/device.hpp):\nthe cores each rank "
                        "computed on while the device rates above were measured";
  }

  // --- Host AdamW -> cpu_peak_flops_per_core ---
  if (adam_params_per_s_ > 0) {
    // host_optimizer_step_time (simulator/compute/compute_cost.cpp), one rank on the node:
    // max(bytes / host bandwidth, 16 FLOPs x params / (cores x FLOP/s per core)).
    const double bpp = optimizer_bytes_per_param(Optimizer::AdamW, DType::Fp32, DType::Fp32).value;
    const double fpp = optimizer_flops_per_param(Optimizer::AdamW);
    const double mem_rate = hw.host_memory_bandwidth.value / bpp;  // params/s the memory bound allows
    const std::string m = fmt("host AdamW (executor/train/host_adam.cpp) %.4g params/s", adam_params_per_s_) +
                          fmt(" over %.0f M fp32 params", double(adam_params_) / 1e6);
    if (adam_params_per_s_ < mem_rate) {
      hw.host_flops_per_core = FlopsPerSecond(fpp * adam_params_per_s_ / hw.cpu_cores);
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
  auto tier_from = [&](const cal::RingFit& f, LinkTier& t, double scale) {
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
  auto describe = [&](const cal::RingFit& f, const std::vector<CollSample>& v) {
    std::string s =
        fmt("ring fit t = base + steps x latency + factor x S / busbw over %.0f timings", double(v.size())) +
        fmt(" (3 collectives, %.0f sizes): ", double(v.size()) / 3) + fmt("base %.1f us", f.base_latency_s * 1e6) +
        fmt(", per step %.1f us", f.step_latency_s * 1e6) + fmt(", line busbw %.3f GB/s", f.line_bandwidth_Bps / 1e9) +
        ", line residual rms " + pct(f.line.rms_rel) + ", worst " + pct(f.line.max_abs_rel) +
        (f.outliers ? fmt(", %.0f outlier timing(s) left out", f.outliers) : "") +
        (f.latency_scale < 1
             ? fmt(", latency terms scaled by %.3g to the collectives' own fixed costs", f.latency_scale)
             : "");
    return s;
  };
  if (!intra_.empty()) {
    cal::RingFit f = cal::fit_ring(intra_);
    tier_from(f, hw.intra_node, 1.0);
    hw.collective_base_latency = Seconds(f.base_latency_s);
    N["node.intra_node"] =
        by + std::to_string(intra_size_) + " local ranks through executor/dist/comm.hpp (" + (cuda_ ? "NCCL" : "Gloo") +
        "), fp32 buffers;\n" + describe(f, intra_) +
        ";\nbus efficiency: per size after the latency terms, isotonic, plateau = bandwidth;\n"
        "bus_efficiency_<collective>: the same per collective (mean of timed calls less the slowest)";
    N["collectives.base_latency"] = by + "the intra-node ring fit's constant term";
    rep << "calibrate: intra-node " << describe(f, intra_) << "\n";
  } else {
    N["node.intra_node"] = from_base + ": one local rank, no intra-node collective to time";
    N["collectives.base_latency"] = from_base;
  }
  if (!inter_.empty()) {
    cal::RingFit f = cal::fit_ring(inter_);
    // One rank per node: busbw = nics_per_node x NIC bandwidth / gpus_per_node x efficiency (docs/hardware.md,
    // ring_bus_bandwidth), so one NIC's bandwidth = busbw x gpus_per_node / nics_per_node.
    tier_from(f, hw.inter_node, double(hw.gpus_per_node) / double(hw.nics_per_node));
    N["node.inter_node"] = by + std::to_string(inter_size_) + " nodes, one rank each;\n" + describe(f, inter_) +
                           ";\nNIC bandwidth = fitted busbw x gpus_per_node / nics_per_node (ring_bus_bandwidth)";
    rep << "calibrate: inter-node " << describe(f, inter_) << "\n";
  } else {
    N["node.inter_node"] = from_base + ": launched on one node";
  }
  // --- Collectives inside a step: the step probe's measured collective time / the profile's price for it ---
  // Every factor and per-unit time is priced against this profile without any of them (the per-unit time adds
  // to compute only, so the collectives' price is the same with it). With a factor already in, the
  // shared-cores one written was the measured one divided by it: 1.63 where 0.79 was measured, on a profile
  // whose node factor was 0.48.
  hw.collective_in_step_factor = hw.collective_in_step_factor_shared_cores = 0;
  hw.collective_in_step_factor_fp32 = hw.collective_in_step_factor_shared_cores_fp32 = 0;
  hw.host_overhead_bf16.unit = hw.host_overhead_fp32.unit = Seconds(0);
  struct Factors {
    double node = 0, shared = 0;
    Seconds unit{0};
  };
  std::array<Factors, 2> factors;
  const RuntimeProfile rt = load_runtime("fsdp-run", opt_.config_root);
  for (std::size_t i = 0; i < probes_.size(); ++i) {
    const ProbeSeries& pr = probes_[i];
    if (pr.step_s <= 0) continue;
    const bool fp32 = pr.dtype == DType::Fp32;
    const std::string dt = to_string(pr.dtype), sfx = fp32 ? "_fp32" : "";
    const PlanFile plan = step_probe_plan(comm_.size(), cuda_ ? "cuda" : "cpu", pr.dtype);
    const ModuleGraph graph(plan.model);
    StepProgram prog;
    const Prediction pred =
        simulate(SimulationInput{&graph, &hw, &rt, Cluster{1, plan.cluster.gpus_per_node}, plan.strategy}, &prog);
    // The rehearsal's step is the probe's compute: what the profile does not price of it (the executor's
    // machinery around each wrap unit, beyond the bytes the step program counts) is spread over its units.
    if (!cuda_) {
      const double units = double(prog.units.size());
      const double rest = pr.alone_s - pred.time.compute_s;
      if (rest > 0) factors[i].unit = Seconds(rest / units);
      N["device.host_overhead"] += ";\n" + dt + " unit: the " + dt + " step probe's rehearsal" +
                                   fmt(" (%.2f ms) less the compute this profile prices for it", pr.alone_s * 1e3) +
                                   fmt(" (%.2f ms)", pred.time.compute_s * 1e3) + fmt(", over its %.0f units", units) +
                                   (rest > 0 ? "" : " (none left: 0)");
    }
    const std::string what = "the step probe (fsdp, " + dt + fmt(", %.0f ranks", double(comm_.size())) +
                             "; executor/calibrate/calibrate.cpp step_probe_plan) stepped in " +
                             fmt("%.2f ms", pr.step_s * 1e3) + ", " + fmt("%.2f ms", pr.alone_s * 1e3) +
                             " with local collectives;\nthis profile prices its collectives at " +
                             fmt("%.2f ms", pred.time.comm_s * 1e3);
    // factor = what the probe's collectives took inside its steps / what this profile prices them at; the
    // field keeps 0 (absent) when the probe saw no cost.
    auto set_factor = [&](double in_step, double price, const std::string& how, double& field, const std::string& key) {
      if (in_step > 0 && price > 0) {
        field = std::min(10.0, in_step / price);
        N[key] = by + how + ": factor = " + fmt("%.2f ms", in_step * 1e3) + " / " + fmt("%.2f ms", price * 1e3);
      }
      rep << "calibrate: " << how << "; in-step factor " << fmt("%.3g", field) << "\n";
    };
    set_factor(pr.step_s - pr.alone_s, pred.time.comm_s, what, factors[i].node, "collectives.in_step_factor" + sfx);
    // The same plan over twice as many ranks as CPUs: its local step is the rehearsal's scaled by the compute the
    // profile prices for each rank there over that at the node's ranks (half a core each: about 2x; both with the
    // per-unit time, as every plan's will be), the rest is its collectives. Measured directly (4 rehearsals at
    // once on 2 vCPUs, bf16): 17.5 ms against the 17.8 ms this gives.
    if (pr.shared_step_s > 0) {
      HardwareProfile priced = hw;
      (fp32 ? priced.host_overhead_fp32 : priced.host_overhead_bf16).unit = factors[i].unit;
      const int ranks = 2 * comm_.size();
      const PlanFile shared_plan = step_probe_plan(ranks, "cpu", pr.dtype);
      const Prediction node = simulate(SimulationInput{&graph, &priced, &rt, Cluster{1, comm_.size()}, plan.strategy});
      const Prediction shared =
          simulate(SimulationInput{&graph, &priced, &rt, Cluster{1, ranks}, shared_plan.strategy});
      const double compute_ratio = shared.time.compute_s / node.time.compute_s;
      const double local = pr.alone_s * compute_ratio;
      const std::string what2 =
          "the " + dt + fmt(" step probe over %.0f ranks", double(ranks)) + " (twice the CPUs) stepped in " +
          fmt("%.2f ms", pr.shared_step_s * 1e3) + fmt(";\nits local step: the rehearsal's %.2f ms", pr.alone_s * 1e3) +
          fmt(" x %.3f", compute_ratio) + " (the compute this profile prices per rank there over that at " +
          std::to_string(comm_.size()) + " ranks);\nthis profile prices its collectives at " +
          fmt("%.2f ms", shared.time.comm_s * 1e3);
      set_factor(pr.shared_step_s - local, shared.time.comm_s, what2, factors[i].shared,
                 "collectives.in_step_factor_shared_cores" + sfx);
    }
  }
  static_assert(std::tuple_size_v<decltype(probes_)> == 2);
  hw.collective_in_step_factor = factors[0].node;
  hw.collective_in_step_factor_shared_cores = factors[0].shared;
  hw.host_overhead_bf16.unit = factors[0].unit;
  hw.collective_in_step_factor_fp32 = factors[1].node;
  hw.collective_in_step_factor_shared_cores_fp32 = factors[1].shared;
  hw.host_overhead_fp32.unit = factors[1].unit;
  const std::string keep = from_base;
  for (const char* k : {"node.gpus_per_node", "node.nics_per_node", "collectives.compute_slowdown_during_comm"})
    N[k] = keep;
  if (cuda_) N["node.cpu_cores"] = keep;
  for (const std::string& k : cal::profile_note_keys(hw))
    FSDP_ASSERT(N.count(k) == 1, "calibrate: no note for profile field " + k);

  // --- Write, reload through the strict loader, and report residuals through the simulator's cost model ---
  const std::string text = cal::hardware_profile_yaml(hw, notes);
  {
    std::ofstream out(opt_.out);
    if (!out) throw InputError("calibrate: cannot write " + opt_.out);
    out << text;
    if (!out.flush()) throw InputError("calibrate: cannot write " + opt_.out);
  }
  const HardwareProfile back = load_hardware(opt_.out, opt_.config_root);
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
  gemm_resid(fp32_, DType::Fp32, "fp32");
  gemm_resid(bf16_, DType::Bf16, "bf16");
  gemm_resid(fp16_, DType::Fp16, "fp16");
  attn_resid(attn_, DType::Fp32, "fp32");
  attn_resid(attn_bf16_, DType::Bf16, "bf16");
  auto coll_resid = [&](const std::vector<CollSample>& v, bool inter) {
    for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce}) {
      Residuals r;
      for (const auto& s : v) {
        if (s.kind != k) continue;
        const Collective c = k == CollKind::AllGather       ? Collective::AllGather
                             : k == CollKind::ReduceScatter ? Collective::ReduceScatter
                                                            : Collective::AllReduce;
        const CommGroup grp = inter ? make_group(back, s.group, 1) : make_group(back, s.group, s.group);
        r.rel.push_back(collective_time(back, c, Bytes(s.bytes), grp).value / s.seconds - 1);
      }
      rep << "  " << (inter ? "inter " : "intra ") << cal::coll_name(k)
          << std::string(15 - std::strlen(cal::coll_name(k)), ' ') << pct(r.rms()) << " " << pct(r.worst()) << "\n";
    }
  };
  if (!intra_.empty()) coll_resid(intra_, false);
  if (!inter_.empty()) coll_resid(inter_, true);
  return rep.str();
}

}  // namespace

// The probe plan of collectives.in_step_factor: FSDP over the node's local ranks, computing in bf16 (or fp32), the
// second host-overhead probe's shape (96 tokens, hidden 160, ffn 432, vocab 768) with 2 layers wrapped one per unit and
// resharded after forward: a gather per unit each way, a reduce-scatter per unit, the gradient-norm and loss
// all-reduces. A step of a few tens of ms: collectives are a large part of it, as in small-model steps.
PlanFile step_probe_plan(int ranks, const std::string& device, DType compute) {
  const ProbeShape& shape = kProbeShapes[1];  // 2 layers
  ConfigMap map = ConfigMap::load_string(probe_model_yaml(shape), "calibrate step probe");
  PlanFile plan;
  plan.model = parse_model_map(map);
  plan.model_name = plan.model.name;
  plan.cluster.hardware = "calibrating";
  plan.cluster.device = device;
  plan.cluster.nodes = 1;
  plan.cluster.gpus_per_node = ranks;
  plan.runtime = "fsdp-run";
  plan.strategy.kind = StrategyKind::Fsdp;
  plan.strategy.wrap.kind = WrapKind::Layer;
  plan.strategy.reshard_after_forward = true;
  plan.strategy.param_dtype = compute;
  plan.strategy.reduce_dtype = DType::Fp32;
  plan.strategy.micro_batch = 1;
  plan.strategy.seq_len = shape.tokens;
  plan.strategy.attention = AttentionImpl::Eager;
  return plan;
}

int run_calibrate(const std::vector<std::string>& a, const std::string& argv0) {
  Options opt;
  std::vector<std::string> child{argv0};
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string& f = a[i];
    if (i == 0 && f == "calibrate") {
      child.push_back(f);
      continue;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= a.size()) throw InputError("calibrate: " + f + " needs a value");
      return a[++i];
    };
    if (f == "--help" || f == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (f == "--nproc-per-node") {
      opt.nproc = to_int(f, value());
      continue;  // not passed to the children
    }
    child.push_back(f);
    if (f == "--out")
      opt.out = child.emplace_back(value());
    else if (f == "--base")
      opt.base = child.emplace_back(value());
    else if (f == "--name")
      opt.name = child.emplace_back(value());
    else if (f == "--device")
      opt.device = child.emplace_back(value());
    else if (f == "--config-root")
      opt.config_root = child.emplace_back(value());
    else if (f == "--timeout")
      opt.timeout_s = to_int(f, child.emplace_back(value()));
    else if (f == "--quick")
      opt.quick = true;
    else
      throw InputError("calibrate: unexpected argument '" + f + "'\n" + kUsage);
  }
  if (opt.out.empty()) throw InputError(std::string("calibrate: --out FILE.yaml is required\n") + kUsage);
  if (opt.out.size() < 6 || opt.out.compare(opt.out.size() - 5, 5, ".yaml") != 0)
    throw InputError("calibrate: --out must name a .yaml file (fsdp-plan --hw reads a path ending in .yaml)");
  if (opt.name.empty()) opt.name = std::filesystem::path(opt.out).stem().string();
  if (opt.config_root.empty()) {
    const char* env = std::getenv("FSDP_CONFIG_ROOT");
    opt.config_root = env != nullptr && *env != '\0' ? env : FSDP_SOURCE_ROOT;
  }
  if (opt.device.empty()) {
#if defined(FSDP_EXEC_CUDA)
    opt.device = c10::cuda::device_count() > 0 ? "cuda" : "cpu";
#else
    opt.device = "cpu";
#endif
  }
  if (opt.device != "cpu" && opt.device != "cuda") throw InputError("calibrate: --device must be cpu or cuda");
  if (opt.device == "cuda" && opt.base.empty())
    throw InputError("calibrate: --base PROFILE is required on CUDA (peak FLOP/s, NICs and cores come from it)");
  // Fail before measuring when the base does not load or the output cannot be written.
  (void)load_hardware(opt.base.empty() ? "cpu" : opt.base, opt.config_root);
  {
    const auto parent = std::filesystem::path(opt.out).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent))
      throw InputError("calibrate: --out " + opt.out + ": no such directory " + parent.string());
  }

  if (opt.nproc > 0 && std::getenv("RANK") == nullptr) {
    LaunchOptions lo;
    lo.nproc = opt.nproc;
    lo.grace = std::chrono::milliseconds(1000LL * opt.timeout_s + 30000);
    return launch_local(lo, child);
  }
  DistEnv env = read_dist_env();
  const std::string device = select_device(opt.device, env.local_rank);
  CommOptions co;
  co.device = opt.device;
  co.timeout = std::chrono::milliseconds(1000LL * opt.timeout_s);
  const int threads = configure_cpu_threads(env.local_world_size);
  co.busy_poll = cpu_busy_poll(env.local_world_size, threads);
  std::unique_ptr<Comm> comm = Comm::connect(env, co);
  Calibrator c(opt, *comm, device, threads);
  return c.run(env);
}

}  // namespace fsdp::exec
