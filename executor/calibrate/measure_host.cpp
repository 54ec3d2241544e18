// Calibrate's host-side measurements: the executor's eager layer beyond its GEMMs (host overhead per pass and
// elementwise bandwidth, fitted on the probe shapes), the on-device AdamW step, the host's memory bandwidth and
// AdamW, and pinned copies between host and device.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "calibrate/calibrator.hpp"
#include "core/format.hpp"
#include "model/transformer.hpp"
#include "train/device_optimizer.hpp"
#include "train/host_adam.hpp"

namespace fsdp::exec::cal {

namespace {

// The passes host_overhead prices (HostOverhead's four fields, in this order).
constexpr std::array<const char*, 4> kPasses{"layer forward", "layer backward", "head forward", "head backward"};

}  // namespace

std::array<double, 4> Calibrator::probe_pass_times(const ProbeShape& shape, at::ScalarType dt, std::string& note) {
  // The executor's own forward and backward (executor/model/transformer.hpp: embed_forward, layer_forward,
  // head_loss, autograd) of the probe with 0 and `layers` layers, batch 1; per layer = the difference /
  // layers, the head = the 0-layer run. From each, the time of its GEMMs and attention core, timed alone at
  // the same shapes, is taken away: the simulator prices those with the curves above. What remains is the
  // host time of everything else (dispatch, autograd, norms, rotary, casts, residual adds, activations).
  const ModelSpec spec = probe_model(shape);
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
    const std::array<double, 4> bytes = simulated_elementwise_bytes(probe_model(shape), sim_dt, shape.tokens, rt);
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
  if (!fit_rate) s_.note_elementwise_fp32 = rate_note;
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
    s_.host_bw = memory_bandwidth(h, opt_.quick ? (16 << 20) / 4 : (256 << 20) / 4);
    progress("host memory bandwidth: " + fmt("%.2f GB/s", s_.host_bw / 1e9));
    s_.adam_params = opt_.quick ? (4 << 20) : (32 << 20);
    at::Tensor p = at::randn({s_.adam_params}, h), g = at::randn({s_.adam_params}, h),
               m = at::zeros({s_.adam_params}, h), v = at::zeros({s_.adam_params}, h);
    AdamHyper hy{1e-3, 0.9, 0.999, 1e-8, 0.01, 1};
    const double t = time_op([&] {
      host_adamw_step(p, g, m, v, hy);
      ++hy.step;
    });
    s_.adam_params_per_s = double(s_.adam_params) / t;
    progress("host AdamW: " + fmt("%.3g params/s", s_.adam_params_per_s));
  }
  comm_.world().barrier();
#if defined(FSDP_EXEC_CUDA)
  if (cuda_) {
    const int64_t elems = (opt_.quick ? (64 << 20) : (256 << 20)) / 4;
    at::Tensor hbuf = at::empty({elems}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
    at::Tensor dbuf = at::empty({elems}, f32_);
    s_.h2d = 4.0 * double(elems) / time_op([&] { dbuf.copy_(hbuf); });
    s_.d2h = 4.0 * double(elems) / time_op([&] { hbuf.copy_(dbuf); });
    progress("host->device " + fmt("%.2f GB/s", s_.h2d / 1e9) + ", device->host " + fmt("%.2f GB/s", s_.d2h / 1e9));
  }
#endif
}

}  // namespace fsdp::exec::cal
