// What `fsdp-run calibrate` measured, as plain data (LibTorch-free): the measurement files fill it
// (measure_*.cpp), derive_profile.hpp turns it into a hardware profile. docs/calibrate.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "calibrate/fit.hpp"
#include "compute/compute_cost.hpp"
#include "hardware/hardware_profile.hpp"

namespace fsdp::exec::cal {

struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  double seconds = 0;        // mean over the three orientations of a linear layer (forward, input grad, weight grad)
  double forward_share = 0;  // the forward GEMM's (x W^T) time over that mean
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

struct AttnSample {
  AttentionShape shape;
  double fwd_s = 0, bwd_s = 0;
};

// PyTorch's eager cross-entropy (at::cross_entropy_loss: log_softmax, then nll_loss) over `rows` x `vocab` fp32
// logits, its forward and its backward (the input gradient, without accumulation).
struct SoftmaxSample {
  int64_t rows = 0, vocab = 0;
  double fwd_s = 0, bwd_s = 0;
  double logit_bytes() const { return 4.0 * double(rows) * double(vocab); }
};

// The step probes (collectives.in_step_factor), one per compute dtype that the factors are kept for: rank 0's
// steps with the node's collectives (`real`) and alone (`local`, the rehearsal), over every round of both
// blocks; the same plan over twice as many ranks as CPUs (`shared`, CPU only); and their medians.
struct ProbeSeries {
  DType dtype = DType::Bf16;
  int64_t steps_quick = 0, steps_full = 0;  // steps a run (its first warms up)
  std::vector<double> real, local, shared;
  bool shared_failed = false;  // rank 0: the over-subscribed run failed once (said why); not tried again
  double step_s = 0, alone_s = 0, shared_step_s = 0;  // medians (0: not measured)
};

struct CalibrationSamples {
  // --- Where and how it ran ---
  std::string device;  // "cpu" or "cuda"
  bool cuda = false;
  bool quick = false;
  int ranks = 1;             // world size
  int local_world_size = 1;  // ranks per node
  int local_rank = 0;        // of the rank whose per-device numbers these are (rank 0)
  int threads = 0;           // intra-op threads of each rank (configure_cpu_threads)
  int cpus = 0;              // CPUs the process may run on (sched_getaffinity)
  std::string torch_version;
  std::string date;  // YYYY-MM-DD
  // --- Memory (bytes; 0: unread) ---
  double mem_total = 0, mem_available = 0;  // /proc/meminfo MemTotal, MemAvailable
  double device_total = 0;                  // cudaMemGetInfo total
  // --- Bandwidths (bytes/s; 0: not measured) ---
  double device_bw = 0, host_bw = 0, h2d = 0, d2h = 0;
  double device_bw_array_mib = 0;  // the size of each of the triad's three arrays
  // --- Host AdamW ---
  double adam_params_per_s = 0;
  int64_t adam_params = 0;
  // --- Kernels ---
  std::vector<GemmSample> fp32, bf16, fp16;
  std::string fp16_missing;  // why there are no fp16 GEMMs (empty when there are)
  std::vector<AttnSample> attn, attn_bf16;
  std::vector<SoftmaxSample> cross_entropy;
  // --- The executor's eager layer, per dtype (fitted while measured: measure_host.cpp) ---
  HostOverhead overhead_fp32, overhead_bf16;
  BytesPerSecond elementwise_fp32{0}, elementwise_bf16{0};
  std::string note_elementwise_fp32, overhead_note_fp32, overhead_note_bf16;
  // --- Collectives ---
  std::vector<CollSample> intra, inter;
  int intra_size = 0, inter_size = 0;
  // --- Step probes: bf16 first (its factors are the profile's in_step_factor(_shared_cores), which every dtype
  // without its own uses), then fp32. An fp32 step of the probe takes ~10x a bf16 one (netlib sgemm): fewer
  // steps a run.
  std::array<ProbeSeries, 2> probes{{{DType::Bf16, 12, 16, {}, {}, {}}, {DType::Fp32, 6, 8, {}, {}, {}}}};
  int probe_rounds = 0;
};

}  // namespace fsdp::exec::cal
