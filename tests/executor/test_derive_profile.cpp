// derive_profile (executor/calibrate/derive_profile.hpp) on synthetic samples: timings generated from a known
// profile (hwprofiles/cpu.yaml, "the truth"), so that each derivation can be checked against the numbers it
// must give back, including the cases a real calibration meets only by chance (a step probe whose collectives
// hid entirely, a failed over-subscribed run, no fp16 GEMMs, a CUDA device). No LibTorch call, no clock.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "calibrate/derive_profile.hpp"
#include "calibrate/probe_plans.hpp"
#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "compute/compute_cost.hpp"
#include "hardware/hardware_profile.hpp"
#include "model/module_graph.hpp"
#include "runtime/backend_profile.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"
#include "test_common.hpp"

namespace fsdp::exec::test {
using namespace fsdp::exec::cal;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// cpu.yaml without the fields a calibration derives from the step probes: the truth the samples come from.
HardwareProfile truth() {
  HardwareProfile hw = load_hardware("cpu", FSDP_SOURCE_ROOT);
  for (const auto& f : HardwareProfile::in_step_factor_fields()) hw.*(f.field) = std::nullopt;
  hw.matmul_efficiency_bf16 = hw.matmul_efficiency;
  hw.attention_efficiency_bf16 = hw.attention_efficiency;
  hw.attention_backward_efficiency_bf16 = hw.attention_backward_efficiency;
  return hw;
}

DeriveInputs inputs(const std::string& source) {
  return DeriveInputs{"synthetic", source, load_hardware("cpu", FSDP_SOURCE_ROOT),
                      load_backend("gloo", FSDP_SOURCE_ROOT), load_runtime("fsdp-run", FSDP_SOURCE_ROOT)};
}

std::vector<GemmSample> gemms(const HardwareProfile& t, DType dt) {
  std::vector<GemmSample> v;
  for (int64_t n = 32; n <= 512; n *= 2) v.push_back({n, n, n, matmul_time(t, n, n, n, dt).value, 1.0});
  for (int64_t h = 128; h <= 1024; h *= 2) {
    v.push_back({512, 3 * h, h, matmul_time(t, 512, 3 * h, h, dt).value, 0.9});
    v.push_back({512, h, 3 * h, matmul_time(t, 512, h, 3 * h, dt).value, 1.1});
  }
  return v;
}

std::vector<AttnSample> attention(const HardwareProfile& t, DType dt) {
  std::vector<AttnSample> v;
  for (int64_t seq = 16; seq <= 512; seq *= 2) {
    AttentionShape a;
    a.seq_len = seq;
    a.heads = a.kv_heads = 8;
    a.head_dim = 64;
    v.push_back({a, attention_forward_time(t, a, dt).value, attention_backward_time(t, a, dt).value});
  }
  return v;
}

std::vector<CollSample> collectives(const HardwareProfile& t, int n) {
  std::vector<CollSample> v;
  const CommGroup g = make_group(t, n, n);
  for (double bytes = 64 * 1024; bytes <= 4 * kMiB; bytes *= 2)
    for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce})
      v.push_back({k, n, bytes, collective_time(t, k, Bytes(bytes), g).value});
  return v;
}

CalibrationSamples cpu_samples(const HardwareProfile& t) {
  CalibrationSamples s;
  s.device = "cpu";
  s.quick = true;
  s.ranks = s.local_world_size = 2;
  s.threads = 1;
  s.cpus = 2;
  s.torch_version = "1.13.1";
  s.date = "2026-12-01";
  s.mem_total = 16 * kGiB;
  s.mem_available = 12 * kGiB;
  s.device_bw = s.host_bw = t.memory_bandwidth.value;
  s.device_bw_array_mib = 16;
  s.adam_params = 4 << 20;
  s.adam_params_per_s = 50e6;
  s.fp32 = gemms(t, DType::Fp32);
  s.bf16 = gemms(t, DType::Bf16);
  s.fp16_missing = "fp16 GEMM unavailable on cpu in LibTorch 1.13.1";
  s.attn = attention(t, DType::Fp32);
  s.attn_bf16 = attention(t, DType::Bf16);
  s.overhead_fp32 = HostOverhead{Seconds(300e-6), Seconds(400e-6), Seconds(50e-6), Seconds(120e-6), Seconds(0)};
  s.overhead_bf16 = HostOverhead{Seconds(280e-6), Seconds(390e-6), Seconds(45e-6), Seconds(125e-6), Seconds(0)};
  s.elementwise_fp32 = BytesPerSecond(6e9);
  s.elementwise_bf16 = BytesPerSecond(7e9);
  s.note_elementwise_fp32 = s.overhead_note_fp32 = s.overhead_note_bf16 = "synthetic";
  s.intra = collectives(t, 2);
  s.intra_size = 2;
  return s;
}

// cpu_samples as a CUDA device's calibration gives them: the device's memory and the pinned copies measured.
CalibrationSamples cuda_samples(const HardwareProfile& t) {
  CalibrationSamples s = cpu_samples(t);
  s.device = "cuda";
  s.cuda = true;
  s.device_total = 139.8 * kGiB;
  s.h2d = 50e9;
  s.d2h = 54e9;
  return s;
}

// A CUDA calibration's inputs: the H200 profile as its base, NCCL its backend.
DeriveInputs cuda_inputs(const std::string& source) {
  DeriveInputs in = inputs(source);
  in.base = load_hardware("h200-141gb", FSDP_SOURCE_ROOT);
  in.backend = load_backend("nccl", FSDP_SOURCE_ROOT);
  return in;
}

// The probe's price under a profile without its own in-step factors and with `unit` as the per-unit host time:
// what derive_profile divides the probe's in-step collective time by (at unit 0), and the compute it scales the
// rehearsal by for the over-subscribed run (at the derived unit).
struct ProbePrice {
  double comm_s = 0, compute_s = 0;
  std::size_t units = 0;
};
ProbePrice probe_price(HardwareProfile hw, DType dt, int ranks, Seconds unit = Seconds(0)) {
  for (const auto& f : HardwareProfile::in_step_factor_fields()) hw.*(f.field) = std::nullopt;
  hw.host_overhead_bf16.unit = hw.host_overhead_fp32.unit = Seconds(0);
  (dt == DType::Fp32 ? hw.host_overhead_fp32 : hw.host_overhead_bf16).unit = unit;
  const PlanFile plan = step_probe_plan(ranks, "cpu", dt);
  const ModuleGraph graph(plan.model);
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  StepProgram prog;
  const Prediction p = simulate(SimulationInput{&graph, &hw, &rt, Cluster{1, ranks}, plan.strategy}, &prog);
  return {p.time.comm_s, p.time.compute_s, prog.units.size()};
}

std::string note(const DerivedProfile& d, const std::string& key) {
  auto it = d.notes.note.find(key);
  REQUIRE(it != d.notes.note.end());
  return it->second;
}

}  // namespace

TEST_CASE("derive_profile: kernel curves and collectives re-price the samples they were derived from") {
  const HardwareProfile t = truth();
  const CalibrationSamples s = cpu_samples(t);
  const DerivedProfile d = derive_profile(s, inputs("/tmp/synthetic.yaml"));
  // Every field the writer writes has its note (derive_profile asserts it; the writer's list is the check).
  for (const std::string& k : profile_note_keys(d.hw)) CHECK(d.notes.note.count(k) == 1);
  for (auto [v, dt] : {std::pair{&s.fp32, DType::Fp32}, {&s.bf16, DType::Bf16}})
    for (const GemmSample& g : *v) {
      INFO(to_string(dt), " GEMM ", g.m, "x", g.n, "x", g.k);
      CHECK(matmul_time(d.hw, g.m, g.n, g.k, dt).value == doctest::Approx(g.seconds).epsilon(0.02));
    }
  for (auto [v, dt] : {std::pair{&s.attn, DType::Fp32}, {&s.attn_bf16, DType::Bf16}})
    for (const AttnSample& a : *v) {
      INFO(to_string(dt), " attention seq ", a.shape.seq_len);
      CHECK(attention_forward_time(d.hw, a.shape, dt).value == doctest::Approx(a.fwd_s).epsilon(0.02));
      CHECK(attention_backward_time(d.hw, a.shape, dt).value == doctest::Approx(a.bwd_s).epsilon(0.02));
    }
  // The forward GEMM's share: the median over the shapes (1.0 for the squares, 0.9 and 1.1 for the others).
  CHECK(d.hw.matmul_forward_ratio_fp32 == doctest::Approx(1.0));
  for (const CollSample& c : s.intra) {
    INFO(coll_name(c.kind), " ", c.bytes, " bytes");
    const double priced = collective_time(d.hw, c.kind, Bytes(c.bytes), make_group(d.hw, 2, 2)).value;
    CHECK(priced == doctest::Approx(c.seconds).epsilon(0.05));
  }
  // No fp16 GEMMs: fp16 is priced as bf16, and the note says why.
  CHECK(d.hw.peak_flops_fp16.value == d.hw.peak_flops_bf16.value);
  CHECK(d.hw.matmul_efficiency_fp16.x == d.hw.matmul_efficiency_bf16.x);
  CHECK(note(d, "device.peak_flops.fp16").find(s.fp16_missing) != std::string::npos);
  // CPU memory is host memory: MemTotal, and MemAvailable as the usable part.
  CHECK(d.hw.device_memory.value == s.mem_total);
  CHECK(d.hw.usable_device_memory.value == s.mem_available);
  CHECK(d.hw.host_memory.value == s.mem_total);
  CHECK(d.hw.device_cores == 1);  // 2 ranks on 2 CPUs, one intra-op thread each
  CHECK(d.hw.calibrated.has_value());
  // The residual report of the profile against its own samples is the same check, printed.
  const std::string r = residual_report(d.hw, s);
  CHECK(r.find("bf16 GEMM") != std::string::npos);
  CHECK(r.find("intra all-reduce") != std::string::npos);
}

TEST_CASE("derive_profile: host AdamW sets cpu_peak_flops_per_core below the memory bound, else keeps the base") {
  const HardwareProfile t = truth();
  CalibrationSamples s = cpu_samples(t);
  const DeriveInputs in = inputs("/tmp/synthetic.yaml");
  // host_optimizer_step_time (simulator/compute/compute_cost.cpp): 16 FLOPs per parameter over cpu_cores cores.
  const DerivedProfile slow = derive_profile(s, in);
  CHECK(slow.hw.host_flops_per_core.value ==
        doctest::Approx(optimizer_flops_per_param(Optimizer::AdamW) * s.adam_params_per_s / s.cpus));
  s.adam_params_per_s = 1e12;  // faster than the host's memory allows: the FLOP rate cannot be read from it
  const DerivedProfile fast = derive_profile(s, in);
  CHECK(fast.hw.host_flops_per_core.value == in.base.host_flops_per_core.value);
  CHECK(note(fast, "node.cpu_peak_flops_per_core").find("within the memory bound") != std::string::npos);
}

TEST_CASE("derive_profile: in-step factors are the probe's in-step collective time over its price") {
  const HardwareProfile t = truth();
  CalibrationSamples s = cpu_samples(t);
  const DeriveInputs in = inputs("/tmp/synthetic.yaml");
  // A first derivation gives the profile the probes are priced with (the factors do not change the kernels).
  const HardwareProfile base_hw = derive_profile(s, in).hw;
  const ProbePrice bf16 = probe_price(base_hw, DType::Bf16, 2), fp32 = probe_price(base_hw, DType::Fp32, 2);
  REQUIRE(bf16.comm_s > 0);
  REQUIRE(fp32.comm_s > 0);
  // bf16: collectives cost 1.5x their price inside the step; the rehearsal took 3 ms more than the profile
  // prices for its compute, spread over the probe's units.
  ProbeSeries& b = s.probes[0];
  b.alone_s = bf16.compute_s + 3e-3;
  b.step_s = b.alone_s + 1.5 * bf16.comm_s;
  // fp32: the step was faster with its collectives than without (they hid entirely): a measured 0.
  ProbeSeries& f = s.probes[1];
  f.alone_s = fp32.compute_s;
  f.step_s = f.alone_s - 1e-3;
  const DerivedProfile d = derive_profile(s, in);
  REQUIRE(d.hw.collective_in_step_factor.has_value());
  CHECK(*d.hw.collective_in_step_factor == doctest::Approx(1.5));
  CHECK(d.hw.host_overhead_bf16.unit.value == doctest::Approx(3e-3 / double(bf16.units)));
  REQUIRE(d.hw.collective_in_step_factor_fp32.has_value());
  CHECK(*d.hw.collective_in_step_factor_fp32 == 0.0);
  CHECK(note(d, "collectives.in_step_factor_fp32").find("faster than its local step") != std::string::npos);
  CHECK(d.hw.in_step_factor(2, DType::Fp32) == 0.0);  // a measured 0 does not fall back to the bf16 factor
  // No over-subscribed run succeeded: the shared-cores factors stay absent and fall back.
  CHECK_FALSE(d.hw.collective_in_step_factor_shared_cores.has_value());
  CHECK_FALSE(d.hw.collective_in_step_factor_shared_cores_fp32.has_value());
  CHECK(d.hw.in_step_factor(4, DType::Bf16) == doctest::Approx(1.5));

  // The over-subscribed bf16 run (4 ranks on 2 CPUs): its local step is the rehearsal's scaled by the compute
  // the profile prices per rank there over that at 2 ranks, with the per-unit time; the rest is its collectives.
  const Seconds unit = d.hw.host_overhead_bf16.unit;
  const ProbePrice node = probe_price(base_hw, DType::Bf16, 2, unit),
                   shared = probe_price(base_hw, DType::Bf16, 4, unit);
  b.shared_step_s = b.alone_s * shared.compute_s / node.compute_s + 0.8 * shared.comm_s;
  const DerivedProfile d2 = derive_profile(s, in);
  REQUIRE(d2.hw.collective_in_step_factor_shared_cores.has_value());
  CHECK(*d2.hw.collective_in_step_factor_shared_cores == doctest::Approx(0.8));

  // A busy machine: the collectives took 22x their price inside the step (the CI run of 2026-11-30 measured 175 ms
  // against a price of 7.99 ms). The factor is written as measured, not capped, and the report warns.
  b.step_s = b.alone_s + 22 * bf16.comm_s;
  const DerivedProfile busy = derive_profile(s, in);
  REQUIRE(busy.hw.collective_in_step_factor.has_value());
  CHECK(*busy.hw.collective_in_step_factor == doctest::Approx(22));
  CHECK(busy.report.find("warning: collectives.in_step_factor = 22") != std::string::npos);
  CHECK(d.report.find("warning:") == std::string::npos);
}

TEST_CASE("derive_profile: a CUDA device's memory and copies come from the device, the rest from the base") {
  const CalibrationSamples s = cuda_samples(truth());
  const DeriveInputs in = cuda_inputs("/tmp/synthetic.yaml");
  const DerivedProfile d = derive_profile(s, in);
  CHECK(d.hw.device_kind == "cuda");
  CHECK(d.hw.usable_device_memory.value == s.device_total);
  CHECK(d.hw.device_memory.value == std::max(in.base.device_memory.value, s.device_total));
  CHECK(d.hw.host_to_device.value == doctest::Approx(52e9));
  CHECK(d.hw.cpu_cores == in.base.cpu_cores);
  CHECK(d.hw.gpus_per_node == in.base.gpus_per_node);
  CHECK(note(d, "node.gpus_per_node").find("from --base") != std::string::npos);
  // What calibrate does not measure is written as the base gave it: the compute capability (SDPA's dispatch) and,
  // for a dtype without a measured elementwise rate, the base's fraction of the memory's bandwidth.
  CHECK(d.hw.compute_capability.major == 9);
  const std::string yaml = hardware_profile_yaml(d.hw, d.notes);
  CHECK(yaml.find("compute_capability: \"9.0\"") != std::string::npos);
  const bool bf16_measured = d.hw.elementwise_bandwidth_bf16.value > 0;
  CHECK(yaml.find("elementwise_efficiency:") != std::string::npos);
  CHECK((yaml.find("    bf16: 0.54\n") != std::string::npos) == !bf16_measured);
  CHECK(yaml.find("    fp16: 0.54\n") != std::string::npos);
  // No cross-entropy samples: the base's kernel fractions are written as it gives them (they priced nothing before
  // 2026-12-05: the writer dropped them).
  CHECK(yaml.find("  softmax_efficiency: 0.8\n") != std::string::npos);
  CHECK(yaml.find("  float8_cast_efficiency: 0.92\n") != std::string::npos);
  CHECK(note(d, "device.softmax_efficiency").find("from --base") != std::string::npos);
  // The FP8 peak is the datasheet's (float8 GEMMs on the measured bf16 curve); what the base adjusts the measured
  // rates with, or says of kernels calibrate does not time, is not carried, and the header says so.
  CHECK(yaml.find("    fp8: ") != std::string::npos);
  CHECK(d.hw.peak_flops_fp8.value == in.base.peak_flops_fp8.value);
  // The base's FP8-over-bf16 GEMM efficiency is a property of the GPU's kernels: carried onto the measured curve.
  CHECK(yaml.find("  float8_matmul_ratio: 0.915\n") != std::string::npos);
  CHECK(note(d, "device.float8_matmul_ratio").find("from --base") != std::string::npos);
  CHECK(d.hw.sm_count == 0);
  CHECK(!d.hw.sdpa_cudnn_ratio.given());
  CHECK(d.hw.boost_clock.value == 0);
  for (const char* dropped : {"Not carried from the base: clocks and power", "Not carried from the base: sm_count",
                              "Not carried from the base: attention_reference"})
    CHECK_MESSAGE(yaml.find(std::string("# ") + dropped) != std::string::npos, dropped);
  CHECK(yaml.find("sm_count") == yaml.find("sm_count and matmul_tiles"));  // in the header only
  for (const std::string& k : profile_note_keys(d.hw)) CHECK(d.notes.note.count(k) == 1);
}

TEST_CASE("derive_profile: a CUDA device's cross-entropy forward sets softmax_efficiency; its backward is the check") {
  CalibrationSamples s = cuda_samples(truth());
  s.device_bw = 4.3e12;
  // Timings as SoftMax.cu's passes would take them at 0.85 of the measured bandwidth; one vocabulary slower (the
  // median ignores it).
  const double eff = 0.85;
  for (int64_t vocab : {int64_t{32768}, int64_t{65536}, int64_t{131072}}) {
    SoftmaxSample c{8192 * 32768 / vocab, vocab, 0, 0};
    c.fwd_s = HardwareProfile::kSoftmaxForwardPasses * c.logit_bytes() / (eff * s.device_bw);
    c.bwd_s = HardwareProfile::kSoftmaxBackwardPasses * c.logit_bytes() / (eff * s.device_bw);
    if (vocab == 131072) c.fwd_s *= 1.5;
    s.cross_entropy.push_back(c);
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("derive_ce_" + std::to_string(::getpid()) + ".yaml")).string();
  const DeriveInputs in = cuda_inputs(path);
  const DerivedProfile d = derive_profile(s, in);
  CHECK(d.hw.softmax_efficiency == doctest::Approx(eff));
  CHECK(d.hw.float8_cast_efficiency == in.base.float8_cast_efficiency);
  const std::string n = note(d, "device.softmax_efficiency");
  CHECK(n.find("measured by fsdp-run calibrate") != std::string::npos);
  CHECK(n.find("base profile: 0.800") != std::string::npos);
  {
    std::ofstream out(path);
    out << hardware_profile_yaml(d.hw, d.notes);
  }
  const HardwareProfile back = load_hardware(path, FSDP_SOURCE_ROOT);
  std::filesystem::remove(path);
  CHECK(back.softmax_efficiency == doctest::Approx(eff).epsilon(1e-3));
  CHECK(back.softmax_bandwidth(DType::Fp32).value == doctest::Approx(eff * s.device_bw).epsilon(1e-3));
  // The residual report prices both passes at the written rate: the slow forward row is the worst, 33% under
  // (1 / 1.5 - 1), the backward's rows agree.
  const std::string rep = residual_report(back, s);
  CHECK_MESSAGE(rep.find("fp32 cross-entropy fwd +19.2% +33.3%") != std::string::npos, rep);
  CHECK_MESSAGE(rep.find("% (held out)") != std::string::npos, rep);
  const size_t bwd = rep.find("fp32 cross-entropy bwd ");
  REQUIRE(bwd != std::string::npos);
  CHECK(std::fabs(std::stod(rep.substr(bwd + 23))) < 0.1);
  // A measured rate past the loader's bound of 1 is held there, and said.
  for (SoftmaxSample& c : s.cross_entropy) c.fwd_s /= 2;
  const DerivedProfile fast = derive_profile(s, in);
  CHECK(fast.hw.softmax_efficiency == 1.0);
  CHECK(note(fast, "device.softmax_efficiency").find("held at 1") != std::string::npos);
  // On a CPU the three fractions are not written: its kernels run at its elementwise rate.
  s.device = "cpu";
  s.cuda = false;
  const DerivedProfile cpu = derive_profile(s, in);
  CHECK(cpu.hw.softmax_efficiency == 0);
  CHECK(cpu.hw.copy_efficiency == 0);
  CHECK(cpu.hw.float8_matmul_ratio == 0);
  CHECK(hardware_profile_yaml(cpu.hw, cpu.notes).find("softmax_efficiency") == std::string::npos);
}

TEST_CASE("derive_profile: the written profile loads through the strict loader with the derived numbers") {
  const HardwareProfile t = truth();
  CalibrationSamples s = cpu_samples(t);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("derive_" + std::to_string(::getpid()) + ".yaml")).string();
  const DeriveInputs in = inputs(path);
  s.probes[0].alone_s = 0.02;
  s.probes[0].step_s = 0.03;
  const DerivedProfile d = derive_profile(s, in);
  {
    std::ofstream out(path);
    out << hardware_profile_yaml(d.hw, d.notes);
  }
  const HardwareProfile back = load_hardware(path, FSDP_SOURCE_ROOT);
  std::filesystem::remove(path);
  CHECK(back.name == "synthetic");
  CHECK(back.calibrated.has_value());
  CHECK(back.peak_flops_bf16.value == doctest::Approx(d.hw.peak_flops_bf16.value).epsilon(1e-4));
  CHECK(back.intra_node.bandwidth.value == doctest::Approx(d.hw.intra_node.bandwidth.value).epsilon(1e-4));
  REQUIRE(back.collective_in_step_factor.has_value());
  CHECK(*back.collective_in_step_factor == doctest::Approx(*d.hw.collective_in_step_factor).epsilon(1e-3));
  for (const GemmSample& g : s.bf16)
    CHECK(matmul_time(back, g.m, g.n, g.k, DType::Bf16).value == doctest::Approx(g.seconds).epsilon(0.02));
  // A busy machine's factor past 10 (CI, 2026-12-02: 21.9) is written and loads back as measured.
  s.probes[0].step_s =
      s.probes[0].alone_s + 22 * (s.probes[0].step_s - s.probes[0].alone_s) / *d.hw.collective_in_step_factor;
  const DerivedProfile busy = derive_profile(s, in);
  REQUIRE(*busy.hw.collective_in_step_factor > 10);
  {
    std::ofstream out(path);
    out << hardware_profile_yaml(busy.hw, busy.notes);
  }
  const HardwareProfile busy_back = load_hardware(path, FSDP_SOURCE_ROOT);
  std::filesystem::remove(path);
  CHECK(*busy_back.collective_in_step_factor == doctest::Approx(*busy.hw.collective_in_step_factor).epsilon(1e-3));
}

}  // namespace fsdp::exec::test
