// `fsdp-run calibrate`: its command line, the order of its measurements (calibrator.hpp; one file each), and
// the profile derived from them (derive_profile.hpp), written and reloaded. What is measured where, and why:
// docs/calibrate.md.
#include "calibrate/calibrate.hpp"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "calibrate/calibrator.hpp"
#include "calibrate/derive_profile.hpp"
#include "calibrate/profile_yaml.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "dist/comm.hpp"
#include "dist/device.hpp"
#include "dist/launcher.hpp"
#include "hardware/hardware_profile.hpp"
#include "runtime/backend_profile.hpp"
#include "runtime/runtime_profile.hpp"

#if defined(FSDP_EXEC_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace fsdp::exec {
namespace {

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

}  // namespace

namespace cal {

Calibrator::Calibrator(const Options& o, Comm& comm, std::string device, int threads)
    : opt_(o), comm_(comm), device_(std::move(device)), cuda_(device_ != "cpu") {
  f32_ = at::TensorOptions().dtype(at::kFloat).device(device_);
  s_.device = device_;
  s_.cuda = cuda_;
  s_.quick = o.quick;
  s_.ranks = comm.size();
  s_.local_rank = comm.local_rank();
  s_.threads = threads;
  s_.cpus = available_cpus();
  s_.torch_version = TORCH_VERSION;
  s_.date = today();
}

void Calibrator::sync() const {
#if defined(FSDP_EXEC_CUDA)
  if (cuda_) c10::cuda::device_synchronize();
#endif
}

double Calibrator::time_op(const std::function<void()>& f) const {
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
  return lower_quartile(ts);
}

bool Calibrator::agree(bool v) {
  if (comm_.size() == 1) return v;
  at::Tensor t = at::full({1}, v ? 1.0f : 0.0f, f32_);
  comm_.world().broadcast(t, 0);
  return t.item<float>() > 0.5f;
}

int Calibrator::run(const DistEnv& env) {
  const auto start = Clock::now();
  progress(std::to_string(comm_.size()) + " rank(s) on " + device_ + (opt_.quick ? ", quick" : "") + ", " +
           std::to_string(s_.threads) + " intra-op thread(s) per rank, " + std::to_string(s_.cpus) + " CPUs");
  s_.mem_total = meminfo_bytes("MemTotal");
  s_.mem_available = meminfo_bytes("MemAvailable");
#if defined(FSDP_EXEC_CUDA)
  if (cuda_) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) throw std::runtime_error("cudaMemGetInfo failed");
    s_.device_total = double(total_b);
  }
#endif
  s_.local_world_size = env.local_world_size;
  s_.device_bw_array_mib = opt_.quick ? 16 : 256;
  s_.device_bw = memory_bandwidth(f32_, static_cast<int64_t>(s_.device_bw_array_mib * kMiB) / 4);
  progress("device memory bandwidth: " + fmt("%.2f GB/s", s_.device_bw / 1e9));
  gemms();
  attention(at::kFloat, s_.attn);
  attention(at::kBFloat16, s_.attn_bf16);
  cross_entropy();
  host_overhead(at::kFloat, s_.overhead_fp32, s_.elementwise_fp32, s_.overhead_note_fp32);
  host_overhead(at::kBFloat16, s_.overhead_bf16, s_.elementwise_bf16, s_.overhead_note_bf16);
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
    std::cout << write_profile();
    std::cout << "calibrate: done in " << fmt("%.1f s", seconds_since(start)) << ", wrote " << opt_.out << "\n";
  }
  comm_.world().barrier();
  return rc;
}

std::string Calibrator::write_profile() {
  DeriveInputs in{opt_.name, opt_.out, load_hardware(opt_.base.empty() ? "cpu" : opt_.base, opt_.config_root),
                  load_backend(cuda_ ? "nccl" : "gloo", opt_.config_root), load_runtime("fsdp-run", opt_.config_root)};
  const DerivedProfile d = derive_profile(s_, in);
  const std::string text = hardware_profile_yaml(d.hw, d.notes);
  {
    std::ofstream out(opt_.out);
    if (!out) throw InputError("calibrate: cannot write " + opt_.out);
    out << text;
    if (!out.flush()) throw InputError("calibrate: cannot write " + opt_.out);
  }
  // Reloaded through the strict loader: the residuals are those of the profile fsdp-plan will read.
  return d.report + residual_report(load_hardware(opt_.out, opt_.config_root), s_);
}

}  // namespace cal

int run_calibrate(const std::vector<std::string>& a, const std::string& argv0) {
  cal::Options opt;
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
  // Fail before measuring when the base does not load or the output cannot be written; an unknown name is the user's
  // --base.
  (void)load_hardware(opt.base.empty() ? "cpu" : opt.base, opt.config_root, "calibrate: --base");
  {
    const auto parent = std::filesystem::path(opt.out).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent))
      throw InputError("calibrate: --out " + opt.out + ": no such directory " + parent.string());
  }

  if (opt.nproc > 0 && std::getenv("RANK") == nullptr) {
    LaunchOptions lo;
    lo.nproc = opt.nproc;
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
  cal::Calibrator c(opt, *comm, device, threads);
  return c.run(env);
}

}  // namespace fsdp::exec
