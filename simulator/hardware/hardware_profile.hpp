// A cluster's hardware (hwprofiles/*.yaml): one node type, repeated.
// All quantities in SI base units (units.hpp); parsing converts once.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/units.hpp"
#include "core/versions.hpp"
#include "runtime/backend_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// Piecewise-linear efficiency curve: points (x, efficiency in (0,1]) sorted by x;
// evaluated by linear interpolation in log2(x), clamped at both ends.
// The loader also refuses a curve that rises faster than its argument between two
// points (x / efficiency(x) must not decrease), so more work never takes less time.
struct EfficiencyCurve {
  std::vector<double> x;
  std::vector<double> efficiency;
  double at(double value) const;
  bool empty() const { return x.empty(); }
};

// Clock and power quantities of a device (`device.boost_clock: "1830 MHz"`, `device.tdp: "700 W"`), in SI base
// units like core/units.hpp's: hertz and watts. Only the hardware profile uses them, so they live here.
struct HertzTag {};
struct WattsTag {};
using Hertz = Quantity<HertzTag>;
using Watts = Quantity<WattsTag>;

// `node.inter_node.fabric`: the network between nodes. Descriptive: NCCL's cost model does not tell InfiniBand
// from RoCE (both run its net_ib transport, which reports no latency of its own), and EFA's extra latency is per
// instance type in aws-ofi-nccl, so the tier's latency and curve keys carry the difference (docs/hardware.md).
enum class Fabric { Unstated, InfiniBand, RoCE, Efa };
const char* to_string(Fabric);  // "infiniband", "roce", "efa"; "not stated"
// The fabric's name in reports: "InfiniBand", "RoCE", "EFA"; "fabric not stated".
const char* display_name(Fabric);

struct LinkTier {
  BytesPerSecond bandwidth{0};  // per-GPU unidirectional bandwidth into the tier
  Seconds latency{0};           // per-hop latency (alpha)
  // Achieved bus bandwidth as a fraction of `bandwidth`, by message size in bytes.
  EfficiencyCurve bus_efficiency;
  // Optional curves of one collective (`bus_efficiency_all_gather`, ...): empty means `bus_efficiency`. A
  // transport whose collectives do not keep the ring's cost ratios needs them (Gloo on CPUs: its all-reduce
  // costs several all-gathers of the same buffer, and fsdp-run's reduce-scatter on Gloo is an all-reduce).
  EfficiencyCurve bus_efficiency_all_gather, bus_efficiency_reduce_scatter, bus_efficiency_all_reduce;
  // Optional (inter-node tier): a factor on the bus efficiency by the number of nodes a collective spans
  // (`bus_efficiency_by_nodes`, x = nodes), for fabrics whose measured bus bandwidth falls with the node
  // count beyond what the ring's latency explains (EFA: docs/hardware.md, "The network between nodes").
  // Empty means 1 at every node count.
  EfficiencyCurve bus_efficiency_by_nodes;
  // Optional factors of one collective by node count (`bus_efficiency_by_nodes_all_gather`, `..._reduce_scatter`):
  // empty means `bus_efficiency_by_nodes`. NCCL runs all-gather and reduce-scatter as rings only (no tree), and their
  // measured bus bandwidth on EFA falls faster with the node count than the all-reduce's (docs/hardware.md).
  EfficiencyCurve bus_efficiency_by_nodes_all_gather, bus_efficiency_by_nodes_reduce_scatter;
};

// Host time of an eager runtime's operators that the kernel costs do not account for (ATen dispatch, output
// allocation, autograd graph recording and backward-node evaluation, the many small norm/rotary/residual
// ops), per pass of one decoder layer and of the embedding + head + loss. A CPU pays it serially; GPU
// launches run ahead of the device and hide it (absent: 0).
struct HostOverhead {
  Seconds layer_forward{0}, layer_backward{0};  // one decoder layer
  Seconds head_forward{0}, head_backward{0};    // embedding, final norm, head and loss
  // Per wrap unit and micro-batch: the runtime's machinery around a unit (gather and reshard, views, hooks, the
  // flat gradient copy and casts) beyond the bytes the step program prices (optional key `unit`; absent: 0).
  Seconds unit{0};
  bool empty() const {
    return layer_forward.value == 0 && layer_backward.value == 0 && head_forward.value == 0 &&
           head_backward.value == 0 && unit.value == 0;
  }
};

struct HardwareProfile {
  std::string name;
  std::string source;       // file it came from
  std::string base_source;  // `base:`: the file of the profile it was derived from ("" when none)
  std::string device_kind;  // "cuda" or "cpu"
  // `backend: NAME` (configs/backends/NAME.yaml): the communication library the cluster's ranks use, and what it
  // can do (Gloo's fp32 staging and gather buffer, NCCL's streams).
  BackendProfile backend;
  // A CPU "device" computes in host memory: offloaded state already lives where compute reads it, and there is
  // no CUDA context, caching allocator or NCCL buffer.
  bool device_is_host() const { return device_kind == "cpu"; }
  // Device
  Bytes device_memory{0};             // total memory per GPU
  Bytes usable_device_memory{0};      // what the runtime can allocate (after driver/ECC reservations)
  FlopsPerSecond peak_flops_fp32{0};  // dense (TF32 tensor cores where applicable is NOT used for fp32 here)
  FlopsPerSecond peak_flops_bf16{0};  // dense tensor-core
  FlopsPerSecond peak_flops_fp16{0};
  // `device.peak_flops.fp8` (optional): the dense FP8 tensor-core peak (E4M3/E5M2 inputs, torch._scaled_mm); a
  // profile without it cannot price float8 linears (Strategy::float8), which are refused on it.
  FlopsPerSecond peak_flops_fp8{0};
  // Clocks and power (optional; docs/hardware.md "Clocks and power"). Peak FLOP/s = SMs x FLOP/clk/SM x clock
  // (NVIDIA A100 and H100 whitepapers), so a GPU held below the clock its peaks are quoted at computes that much
  // slower; memory bandwidth does not follow the SM clock.
  Hertz boost_clock{0};       // `device.boost_clock`: the clock the tensor-core peaks (bf16, fp16) are quoted at
  Hertz boost_clock_fp32{0};  // `device.boost_clock_fp32`: the fp32 peak's, where it differs (H100); 0: boost_clock
  Hertz sustained_clock{0};   // `device.sustained_clock`: the SM clock held under a training load; 0: not given
  Watts tdp{0};               // `device.tdp`: the board's rated (and maximum settable) power; 0: not given
  Watts power_limit{0};       // `device.power_limit`: the limit the cluster sets (nvidia-smi -pl); 0: not given
  // `device.sm_count` and `device.matmul_tiles` (optional, together; compute/compute_cost.hpp
  // tile_wave_efficiency): the streaming multiprocessors a GEMM's thread blocks run on, one block per SM per wave,
  // and the output tile shapes (rows, columns) the GEMM library chooses among. Absent (0, empty): no tile or wave
  // quantization (CPUs).
  int sm_count = 0;
  std::vector<std::pair<int64_t, int64_t>> matmul_tiles;
  // `device.compute_capability: "9.0"` (CUDA devices only; docs/hardware.md "Attention kernels"): the device's
  // cudaDeviceProp major.minor, which PyTorch's SDPA dispatch reads to choose its kernel (compute/sdpa_dispatch.hpp).
  // Unknown (0.0) where not given; a plan with attention sdpa on a CUDA device needs it.
  ComputeCapability compute_capability;
  // `device.sdpa_kernel_ratio.{memory_efficient,cudnn}: {forward: r, backward: r}` (optional; docs/hardware.md
  // "Attention kernels"): the throughput of SDPA's memory-efficient (CUTLASS) and cuDNN kernels over the flash curves
  // above (attention_forward_efficiency / attention_backward_efficiency), from published benchmarks of both kernels on
  // one GPU. 0: not given; a plan whose sdpa dispatches to that kernel needs it.
  struct KernelRatio {
    double forward = 0, backward = 0;
    bool given() const { return forward > 0; }
  };
  KernelRatio sdpa_memory_efficient_ratio, sdpa_cudnn_ratio;
  // `device.flash_attention_3_ratio: {forward: r, backward: r}` (optional; docs/hardware.md "Attention kernels"):
  // FlashAttention-3's throughput over the same flash (FlashAttention-2) curves, from a benchmark of both on this GPU.
  // 0: not given; a plan with --attention flash3 needs it (simulate.hpp attention_hardware_refusal).
  KernelRatio flash3_ratio;
  // `device.flex_attention_ratio: {forward: r, backward: r}` (optional; docs/hardware.md "FlexAttention"):
  // torch's flex_attention over the same curves, from PyTorch's benchmarks of it against FlashAttention-2 on this GPU.
  // 0: not given; a plan with --attention flex needs it.
  KernelRatio flex_ratio;
  BytesPerSecond memory_bandwidth{0};             // HBM
  EfficiencyCurve matmul_efficiency;              // by GEMM FLOPs per call
  EfficiencyCurve attention_efficiency;           // by attention FLOPs per call (forward kernel)
  EfficiencyCurve attention_backward_efficiency;  // by attention FLOPs per call (backward kernel)
  // `device.attention_reference: {tokens_per_call: 16384, heads: 16}` (optional; docs/hardware.md "Attention
  // kernels"): the calls the attention curves were read at. FlashAttention's benchmarks vary the sequence with the
  // tokens per call and the heads held fixed, so a curve point is a sequence length, not a batch size: a call of
  // other tokens x heads is priced at the FLOPs the reference call of its sequence has (compute_cost.cpp). Absent
  // (0): the curves are by FLOPs per call as measured (fsdp-run calibrate's probes).
  int64_t attention_reference_tokens = 0, attention_reference_heads = 0;
  // Optional curves of one compute dtype (`matmul_efficiency_bf16`, ...): empty means the dtype uses the
  // curve above. CPUs need them: LibTorch runs fp32 and bf16 GEMMs in different libraries (BLAS, oneDNN).
  EfficiencyCurve matmul_efficiency_bf16, matmul_efficiency_fp16;
  EfficiencyCurve attention_efficiency_bf16, attention_efficiency_fp16;
  EfficiencyCurve attention_backward_efficiency_bf16, attention_backward_efficiency_fp16;
  // CPU devices: the cores one rank computed on when the device's rates were measured (`device.cores`;
  // absent: the whole node, cpu_cores). Ranks that get fewer cores run slower (cpu_compute_slowdown).
  double device_cores = 0;
  // `device.host_overhead.<dtype>` (optional): see HostOverhead. A dtype without an entry uses fp32's.
  HostOverhead host_overhead_fp32, host_overhead_bf16, host_overhead_fp16;
  // `device.elementwise_bandwidth.<dtype>` (optional): the rate at which the eager runtime's memory-bound
  // kernels (norms, activations, rotary, casts, copies, the optimizer) move bytes when they compute in that
  // dtype; 0 (absent): memory_bandwidth. A CPU needs it: its bf16 elementwise kernels convert every element
  // and run far below the memory's bandwidth (fsdp-run calibrate measures it, docs/calibrate.md).
  BytesPerSecond elementwise_bandwidth_fp32{0}, elementwise_bandwidth_bf16{0}, elementwise_bandwidth_fp16{0};
  // `device.elementwise_efficiency.<dtype>` (optional, instead of the rate): the fraction of memory_bandwidth those
  // kernels reach. A GPU's eager PyTorch kernels reach well under the HBM peak: a norm runs seven kernels with fp32
  // casts, rotary slices and concatenates (docs/hardware.md "Elementwise kernels": measured against the byte counts
  // of simulator/program/layer_costs.cpp).
  double elementwise_efficiency_fp32 = 0, elementwise_efficiency_bf16 = 0, elementwise_efficiency_fp16 = 0;
  // `device.copy_efficiency` (optional): the fraction of memory_bandwidth a contiguous device-to-device copy reaches,
  // its read and its write both counted (a measured memcpy within the device: docs/hardware.md "Elementwise
  // kernels"). Prices the ops' Op::device_copy_bytes (FSDP's all-gather copy-out and copy-in, FSDP1's flat-gradient
  // cat, sequence-parallel layout cats); 0 (absent): those copies take the elementwise rate.
  double copy_efficiency = 0;
  // `device.float8_cast_efficiency` (optional; float8 linears need it): the fraction of memory_bandwidth the compiled
  // (Triton) kernels that cast a float8 linear's tensors reach (program/float8_linears.hpp; docs/hardware.md "Float8
  // linears").
  double float8_cast_efficiency = 0;
  // `device.float8_matmul_ratio` (optional): the fraction of the bf16 matmul curve's efficiency an FP8 GEMM reaches
  // on the FP8 peak (a measured best-shape FP8 rate over the best-shape bf16 rate, each over its datasheet peak:
  // docs/hardware.md "Float8 linears"); 0 (absent): FP8 GEMMs reach the bf16 curve's efficiency. compute_cost.cpp
  // float8_linear_gemm_times.
  double float8_matmul_ratio = 0;
  // `device.softmax_efficiency` (optional): the fraction of memory_bandwidth PyTorch's softmax-family kernels reach
  // (aten/src/ATen/native/cuda/SoftMax.cu: log_softmax's forward and backward over rows longer than its shared-memory
  // path takes, which read a row three times and write it once, and nll_loss's zeroed gradient): the eager
  // cross-entropy's kernels (program/emit_loss.cpp, Op::elementwise_softmax). 0 (absent): the compute dtype's
  // elementwise rate.
  double softmax_efficiency = 0;
  // Those kernels' passes over a row of logits in the loss's dtype (SoftMax.cu, rows longer than the shared-memory
  // path): log_softmax's forward reads the row for its max, for the sum of exponentials and to write the output (3
  // reads, 1 write); the backward zeroes nll_loss's gradient (1 write) and cunn_SoftMaxBackward reads it for its row
  // sum, then it and the saved output to write the logits' gradient (3 reads, 1 write). program/emit_loss.cpp prices
  // them; fsdp-run calibrate measures softmax_efficiency with them (executor/calibrate/measure_kernels.cpp).
  static constexpr double kSoftmaxForwardPasses = 4.0;
  static constexpr double kSoftmaxBackwardPasses = 5.0;
  // `device.matmul_forward_ratio.<dtype>` (optional): a linear layer's forward GEMM (y = x W^T) time over the
  // mean of its three GEMMs (forward, dx = dy W, dW = dy^T x), which the matmul curves price. 0 (absent): 1,
  // the three alike. A reference BLAS's transposed-B loop is slower (netlib sgemm_ here: ~1.45); a full
  // checkpoint's recomputed forward pays it once more.
  double matmul_forward_ratio_fp32 = 0, matmul_forward_ratio_bf16 = 0, matmul_forward_ratio_fp16 = 0;
  // Node
  int gpus_per_node = 0;
  LinkTier intra_node;  // NVLink/NVSwitch or PCIe
  int nics_per_node = 0;
  LinkTier inter_node;               // per NIC
  Fabric fabric = Fabric::Unstated;  // `node.inter_node.fabric` (optional)
  BytesPerSecond host_to_device{0};  // PCIe per GPU, pinned
  Bytes host_memory{0};              // per node
  int cpu_cores = 0;                 // per node
  BytesPerSecond host_memory_bandwidth{0};
  FlopsPerSecond host_flops_per_core{0};  // peak fp32 FLOP/s of one host CPU core
  // Collectives
  Seconds collective_base_latency{0};       // fixed cost of launching one collective (NCCL's baseLat)
  double compute_slowdown_during_comm = 0;  // fraction of compute throughput lost while collectives run
  // `collectives.in_step_factor` (optional; absent: 1): a collective's cost inside a training step over its
  // isolated cost, which the terms above describe (calibrated collectives run alone, after a barrier). fsdp-run
  // calibrate measures it on a probe plan run with and without communication (docs/calibrate.md). A measured 0
  // is a measurement (the probe stepped no slower with its collectives than without: they hid entirely), not an
  // absent key, hence optional rather than 0 for absent.
  std::optional<double> collective_in_step_factor;
  // `collectives.in_step_factor_shared_cores` (optional, CPU devices; absent: in_step_factor): the same when
  // a node's ranks outnumber its cores. fsdp-run's ranks then sleep in their waits instead of polling
  // (cpu_ranks_poll below); calibrate measures it on its step probe run over twice as many ranks as CPUs.
  std::optional<double> collective_in_step_factor_shared_cores;
  // `collectives.in_step_factor_fp32` and `in_step_factor_shared_cores_fp32` (optional; absent: the two
  // above): the same for plans that compute in fp32. The two above are measured on a bf16 probe and price every
  // other compute dtype. On a CPU the fp32 probe computes ~10x longer between the same collectives (netlib
  // sgemm against oneDNN's bf16 kernels), and their transport threads then take their cores from compute
  // rather than from a waiting rank: five calibrations of this project's 2-vCPU VM measured fp32 factors
  // 0.99-1.31x the bf16 ones on 2 ranks (tests/accuracy/README.md, runs AE-AH).
  std::optional<double> collective_in_step_factor_fp32;
  std::optional<double> collective_in_step_factor_shared_cores_fp32;
  // The four factors' keys under `collectives`, with their fields: one list for the parser and the writer.
  struct InStepFactorField {
    const char* key;
    std::optional<double> HardwareProfile::*field;
  };
  static const std::array<InStepFactorField, 4>& in_step_factor_fields();
  // The factor for a plan with `ranks_per_node` ranks on each node that computes in `compute`. When the ranks
  // share cores: the fp32 shared-cores factor (fp32 plans), else the bf16 one; otherwise, or when neither is
  // there: the fp32 factor (fp32 plans), else the bf16 one, else 1.
  double in_step_factor(int ranks_per_node, DType compute) const;

  // `calibrated` (optional; written by fsdp-run calibrate): what the profile's measured overheads were fitted
  // against. Absent for hand-written profiles.
  struct Calibration {
    std::string runtime;             // the runtime profile whose executor ran the probes ("fsdp-run")
    std::string runtime_build;       // that executor's build (LibTorch version, backend), for the reader
    int64_t cost_model_version = 0;  // kCostModelVersion of the fsdp-plan that fitted it
  };
  std::optional<Calibration> calibrated;

  // The dtype's peak at the clock the GPU holds: rated_peak_flops x clock_scale. Every compute cost uses it.
  FlopsPerSecond peak_flops(DType) const;
  // The FP8 tensor-core peak at the clock the GPU holds (the tensor-core clock scale, as bf16's).
  FlopsPerSecond float8_peak_flops() const;
  // float8_matmul_ratio, 1 where the profile has none.
  double float8_matmul_efficiency_ratio() const { return float8_matmul_ratio > 0 ? float8_matmul_ratio : 1.0; }
  // The datasheet's peak (`device.peak_flops.<dtype>`), at the boost clock.
  FlopsPerSecond rated_peak_flops(DType) const;
  // sustained_clock / the clock the dtype's peak is quoted at (boost_clock_fp32 for fp32, else boost_clock),
  // at most 1 (a clock above the rated one is not credited); 1 without a sustained_clock. Tensor-core and fp32
  // rates scale with the SM clock; memory bandwidth does not.
  double clock_scale(DType) const;
  // The clock the dtype's peak is quoted at (0 when the profile gives none).
  Hertz boost_clock_of(DType) const;
  // The dtype's own curve when the profile has one, else the shared one.
  const EfficiencyCurve& matmul_curve(DType) const;
  const EfficiencyCurve& attention_forward_curve(DType) const;
  const EfficiencyCurve& attention_backward_curve(DType) const;
  const HostOverhead& host_overhead(DType) const;
  // The dtype's elementwise bandwidth, else fp32's, else memory_bandwidth.
  BytesPerSecond elementwise_bandwidth(DType) const;
  // memory_bandwidth x copy_efficiency, else the dtype's elementwise bandwidth.
  BytesPerSecond copy_bandwidth(DType) const;
  // memory_bandwidth x softmax_efficiency, else the dtype's elementwise bandwidth.
  BytesPerSecond softmax_bandwidth(DType) const;
  // memory_bandwidth x float8_cast_efficiency.
  BytesPerSecond float8_cast_bandwidth() const { return memory_bandwidth * float8_cast_efficiency; }
  // The dtype's forward-GEMM ratio, else 1.
  double matmul_forward_ratio(DType) const;
};

// The version of the simulator's cost model that a calibrated profile's fitted numbers belong to (the
// in-step collective factors, the per-unit host overhead and the per-dtype rates fsdp-run calibrate
// derives by dividing measurements by what this model prices). Raised whenever the pricing of an op
// changes what those numbers mean; a profile fitted against another version is refused
// (validate_profiles in simulate.hpp).
inline constexpr int64_t kCostModelVersion = 1;

// Cores one rank computes on when `ranks_per_node` ranks share a CPU node of `cpu_cores` cores, with
// fsdp-run's thread policy (executor/dist/device.hpp, as torchrun's OMP_NUM_THREADS): floor(cores / ranks)
// intra-op threads each, at least one; more ranks than cores are time-sliced by the OS, cores / ranks each.
double cpu_cores_per_rank(int cpu_cores, int ranks_per_node);

// Whether fsdp-run's ranks poll for their collectives' completion (executor/dist/device.hpp cpu_busy_poll):
// on a CPU device when a node's ranks do not outnumber its cores, so that each has a core to poll on.
bool cpu_ranks_poll(int cpu_cores, int ranks_per_node);

// Factor (>= 1) by which a rank's compute is slower than the profile's measured rates: 1 on GPUs; on a
// CPU device, device_cores / cpu_cores_per_rank when the rank gets fewer cores than the rates were
// measured with (more cores than measured are not credited: how an op scales with threads is not measured).
double cpu_compute_slowdown(const HardwareProfile& hw, int ranks_per_node);

// Strict parse; InputError names file, line and key. A profile may start with `base: NAME_OR_PATH` (a shipped
// name, or a .yaml path relative to the file): the base is loaded first (recursively; a cycle is refused naming
// the files) and this file's keys override it, mapping by mapping, key by key; a list (a curve) or a value replaces
// the base's whole. `name` is always this file's own. An error names the file that holds the key. Prints
// hardware_warnings on stderr ("fsdp-plan: warning: ..."). An unknown name's message starts with `flag`, the option
// that gave it (fsdp-run calibrate's --base, say).
HardwareProfile load_hardware(const std::string& name_or_path, const std::string& config_root,
                              const std::string& flag = "--hw");
// The same from a profile's text (the fuzzer): its `base:` may only name a shipped profile
// (config_root/hwprofiles/NAME.yaml), never a path, so nothing but the shipped profiles is read. Prints nothing.
HardwareProfile parse_hardware_text(const std::string& text, const std::string& source_name,
                                    const std::string& config_root);
// What the user should know about a loaded profile: a device.power_limit below device.tdp without a
// device.sustained_clock (the limit is not converted to a clock, so the peaks are not lowered for it).
std::vector<std::string> hardware_warnings(const HardwareProfile& hw);
// The stems of config_root/hwprofiles/*.yaml, derived profiles included.
std::vector<std::string> list_hardware(const std::string& config_root);

// One line for reports: "8 x 400 Gb/s InfiniBand per node (400 Gb/s per GPU)", "4 x 100 Gb/s EFA per node
// (50 Gb/s per GPU)"; "4 x 400 Gb/s per node (200 Gb/s per GPU), fabric not stated" where the profile does not say.
std::string network_summary(const HardwareProfile& hw);
// One line for reports when the profile gives a sustained clock or a power limit: "sustained 1464 MHz of 1830 MHz
// boost (0.8 x tensor-core peak), power limit 500 W of 700 W"; "" when it gives neither.
std::string clock_summary(const HardwareProfile& hw);

}  // namespace fsdp
