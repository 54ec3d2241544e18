#include "timeline/timeline.hpp"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "program/pipeline_parallel.hpp"

namespace fsdp {

TimelineResult run_timeline(const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s) {
  TimelineResult r;
  r.ops.resize(p.ops.size());
  constexpr size_t kStreams = static_cast<size_t>(Stream::kCount);
  std::array<double, kStreams> stream_free{};
  // Ops are issued in program order (the CPU issue order); each stream is a FIFO, so scheduling in
  // program order with "start = max(stream free, deps done)" is an exact event simulation of in-order streams.
  // A CPU device has no engines of its own for communication and copies: a rank's intra-op threads occupy all
  // of its cores (executor/dist/device.hpp), and its Gloo transport thread, copies and host optimizer run on
  // the same cores. So on a cpu device every op of the rank runs on one in-order resource: nothing overlaps
  // (measured: docs/calibrate.md, "Time"). The backend profile says so (configs/backends/gloo.yaml).
  const bool one_resource = !hw.backend.overlaps_compute;
  double compute_busy = 0;
  double comm_done = 0;  // latest end of any non-compute op so far (for barrier ops)
  const OpPrices prices = price_layers(p, hw, s);
  // The host issues the ops in program order, each pass taking it host_issue_seconds, and runs ahead of the device
  // without waiting for it: CUDA kernel launches and NCCL collectives are asynchronous, and a collective's
  // Work.wait() makes the compute stream wait for the NCCL stream, not the host (torch/csrc/distributed/c10d/
  // ProcessGroupNCCL.cpp WorkNCCL::synchronizeStream). An op cannot end before the host has issued the last of its
  // kernels: end = max(device end, host issue end), the device then idles for the host (host-bound). The step starts
  // with the host and device together (the previous step's loss was read back: nanotron's trainer logs loss.item()
  // after every step). On a CPU device the host's time is the compute itself (HostOverhead), charged there.
  const bool host_issue = !hw.device_is_host() && !p.host_issue.empty();
  double host_clock = 0, host_wait = 0, host_wait_mid = 0;
  // What the passes after the schedule read of the ops, gathered as each op is scheduled (its timing is final then),
  // in program order: one pass over the program, whose ops are large, instead of several. Sums are taken in program
  // order as before and maxima are exact in any order, so every result is bit-identical.
  const int64_t K = s.grad_accum;
  double end = 0;                // the latest end of any op
  double before_barrier = 0;     // ... of the ops before the first that waits for every collective
  double before_reductions = 0;  // ... of the ops before the stage's reductions after its backward
  bool barrier_seen = false;
  double compute_end = 0;                       // ... of the compute ops
  double offload_end = 0;                       // ... of the offload ops (copies and the host optimizer)
  std::vector<std::pair<double, double>> comm;  // the gathers' and reductions' busy intervals
  comm.reserve(p.ops.size());
  struct ComputeSpan {
    double start, end;
    bool mid;  // of the representative micro-batch (index 1)
  };
  std::vector<ComputeSpan> compute_spans;
  compute_spans.reserve(p.ops.size());
  // The representative micro-batch (accumulation, below): its first compute op's start, the first compute op's start of
  // micro-batch K - 1, its compute, and its collectives (all, tensor-parallel, pipeline).
  double mid_start = -1, next_start = -1, mid_compute = 0, mid_comm = 0, mid_tp = 0, mid_pp = 0, mid_ep = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    // Tensor-parallel collectives and pipeline transfers block the compute stream: the next GEMM needs their output
    // (Megatron-LM and DTensor wait on them; async TP shortens them instead, op_cost.cpp).
    const bool blocking =
        op.stream == Stream::TensorParallel || op.stream == Stream::Pipeline || op.stream == Stream::ExpertParallel;
    const size_t resource = static_cast<size_t>(one_resource || blocking ? Stream::Compute : op.stream);
    double ready = stream_free[resource];
    if (op.after_all_comm) ready = std::max(ready, comm_done);
    for (int d : op.deps) {
      FSDP_ASSERT(d >= 0 && static_cast<size_t>(d) < i, "dependencies point backwards in program order");
      ready = std::max(ready, r.ops[static_cast<size_t>(d)].end);
    }
    double dur = op_duration(op, p, hw, c, s, prices);
    FSDP_ASSERT(dur >= 0, "negative op duration");
    double waited = 0;  // for the host, beyond the device's own time
    if (host_issue) {
      host_clock += host_issue_seconds(op, p, s);
      if (op.stream == Stream::Compute && host_clock > ready + dur) {
        waited = host_clock - (ready + dur);
        host_wait += waited;
        if (op.micro_batch == 1) host_wait_mid += waited;
      }
    }
    r.ops[i] = OpTiming{ready, ready + dur + waited};
    stream_free[resource] = ready + dur + waited;
    if (op.stream != Stream::Compute && !blocking) comm_done = std::max(comm_done, ready + dur);
    switch (op.stream) {
      case Stream::Compute:
        compute_busy += dur + waited;
        if (op.kind == OpKind::OptimizerStep || op.kind == OpKind::GradNorm) r.optimizer_s += dur;
        break;
      case Stream::AllGather:
      case Stream::ReduceScatter:
        r.comm_s += dur;
        break;
      case Stream::HostToDevice:
      case Stream::DeviceToHost:
      case Stream::Host:
        r.offload_s += dur;
        if (op.kind == OpKind::HostOptimizerStep) r.optimizer_s += dur;
        break;
      case Stream::TensorParallel:
        r.comm_s += dur;
        r.tp_comm_s += dur;
        break;
      case Stream::Pipeline:
        r.comm_s += dur;
        r.pp_comm_s += dur;
        break;
      case Stream::ExpertParallel:
        r.comm_s += dur;
        r.ep_comm_s += dur;
        break;
      case Stream::kCount:
        break;
    }
    const OpTiming& done = r.ops[i];
    end = std::max(end, done.end);
    barrier_seen = barrier_seen || op.after_all_comm;
    if (!barrier_seen) before_barrier = std::max(before_barrier, done.end);
    if (p.first_reduction_after_backward >= 0 && static_cast<int>(i) < p.first_reduction_after_backward)
      before_reductions = std::max(before_reductions, done.end);
    if ((op.stream == Stream::AllGather || op.stream == Stream::ReduceScatter) && done.end > done.start)
      comm.emplace_back(done.start, done.end);
    if (op.stream == Stream::HostToDevice || op.stream == Stream::DeviceToHost || op.stream == Stream::Host)
      offload_end = std::max(offload_end, done.end);
    if (op.stream == Stream::Compute) {
      compute_spans.push_back({done.start, done.end, op.micro_batch == 1});
      compute_end = std::max(compute_end, done.end);
      // Micro-batch boundaries on the compute stream (prefetched gathers may start earlier).
      if (op.micro_batch == 1 && mid_start < 0) mid_start = done.start;
      if (op.micro_batch == K - 1 && next_start < 0) next_start = done.start;
      if (op.micro_batch == 1) mid_compute += done.end - done.start;
    } else if (op.micro_batch == 1) {
      const double d = done.end - done.start;
      mid_comm += d;
      if (op.stream == Stream::TensorParallel) mid_tp += d;
      if (op.stream == Stream::Pipeline) mid_pp += d;
      if (op.stream == Stream::ExpertParallel) mid_ep += d;
    }
  }
  // The optimizer phase starts at the first op that waits for every collective (the step's barrier).
  r.optimizer_phase_s = end - before_barrier;
  // Collectives occupy SMs (one CTA per NCCL channel), so compute overlapped with communication runs
  // slower by the profile's compute_slowdown_during_comm; first order: the overlapped compute time
  // stretches the step by that fraction (Calculon models the same effect as a network's
  // "processor_usage", calculon/network.py).
  std::sort(comm.begin(), comm.end());
  std::vector<std::pair<double, double>> merged;
  for (const auto& iv : comm) {
    if (!merged.empty() && iv.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, iv.second);
    } else {
      merged.push_back(iv);
    }
  }
  auto overlap_with_comm = [&](double a, double b) {
    double o = 0;
    auto it = std::lower_bound(merged.begin(), merged.end(), std::make_pair(a, a),
                               [](const auto& x, const auto& y) { return x.second < y.first; });
    for (; it != merged.end() && it->first < b; ++it)
      o += std::max(0.0, std::min(b, it->second) - std::max(a, it->first));
    return o;
  };
  double overlapped = 0, overlapped_mid = 0;
  for (const ComputeSpan& c : compute_spans) {
    double o = overlap_with_comm(c.start, c.end);
    overlapped += o;
    if (c.mid) overlapped_mid += o;
  }
  const double slowdown = hw.compute_slowdown_during_comm * overlapped;
  end += slowdown;
  compute_busy += slowdown;
  r.contention_s = slowdown;
  // Accumulation: micro-batches 2..K-1 are identical and one of them (index 1) was emitted; the others
  // take as long as it does, from its first op to the first op of the next emitted micro-batch.
  if (K > p.layout.micro_batches_emitted) {
    FSDP_ASSERT(mid_start >= 0 && next_start >= mid_start, "representative micro-batch missing");
    double repeats = static_cast<double>(K - p.layout.micro_batches_emitted);
    const double mid_slowdown = hw.compute_slowdown_during_comm * overlapped_mid;
    end += repeats * (next_start - mid_start + mid_slowdown);
    compute_busy += repeats * (mid_compute + mid_slowdown);
    r.contention_s += repeats * mid_slowdown;
    r.comm_s += repeats * mid_comm;
    r.tp_comm_s += repeats * mid_tp;
    r.pp_comm_s += repeats * mid_pp;
    r.ep_comm_s += repeats * mid_ep;
    host_wait += repeats * host_wait_mid;
  }
  r.host_wait_s = host_wait;
  // Pipeline parallelism: the schedule's bubble, (pp - 1) / v of one micro-batch's work on this stage
  // (pipeline_parallel.hpp; Narayanan et al. 2021 sec. 2.2): the stage idles while the pipeline fills and drains.
  if (p.layout.pp > 1) {
    // The reductions after the stage's backward delay its input gradient's send, so they sit on the drain's path once
    // (simulate.cpp), not in each micro-batch.
    if (p.first_reduction_after_backward >= 0)
      r.pipeline_reduction_tail_s = std::max(0.0, before_barrier - before_reductions);
    const double micro_batch_s = (end - r.optimizer_phase_s - r.pipeline_reduction_tail_s) / static_cast<double>(K);
    r.pipeline_micro_batch_s = micro_batch_s;
    r.pipeline_bubble_s = pipeline_bubble_s(s.mesh, micro_batch_s);
    end += r.pipeline_bubble_s;
  }
  r.step_s = end;
  r.compute_s = compute_busy;
  // Everything that is not compute-stream work is exposed time; split it between communication and
  // offload by which kind of op the compute stream was waiting for.
  double idle = std::max(0.0, end - compute_busy);
  // Tail after the last compute op is offload time when an offload op ends the step: the most of end - compute_end
  // over the offload ops ending after compute_end, which is the latest offload end less compute_end (rounded
  // subtraction is monotone in its first operand, so the largest difference is the latest end's, bit for bit).
  double exposed_offload = offload_end > compute_end ? offload_end - compute_end : 0.0;
  exposed_offload = std::min(exposed_offload, idle);
  r.exposed_offload_s = exposed_offload;
  // The tensor-parallel collectives and pipeline transfers are waited for on the compute stream: all exposed.
  r.exposed_comm_s = std::max(0.0, idle - exposed_offload - r.pipeline_bubble_s);
  return r;
}

}  // namespace fsdp
