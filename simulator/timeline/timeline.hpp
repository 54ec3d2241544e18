// A discrete-event simulation of one step program on its streams: each stream runs its ops in program
// order; an op starts when its stream is free and its dependencies have completed. Durations come from
// the compute and collective cost models. Memory over time is read from the same events.
#pragma once

#include <string>
#include <vector>

#include "hardware/cluster.hpp"
#include "hardware/hardware_profile.hpp"
#include "program/step_program.hpp"

namespace fsdp {

struct OpTiming {
  double start = 0;
  double end = 0;
};

struct TimelineResult {
  double step_s = 0;
  double compute_s = 0;       // busy time of the compute stream
  double comm_s = 0;          // total collective time
  double exposed_comm_s = 0;  // compute-stream idle time waiting on communication
  double offload_s = 0;       // host<->device copies + host optimizer
  double exposed_offload_s = 0;
  double optimizer_s = 0;  // the optimizer step and the gradient norm before it
  // From the end of the last micro-batch's work (its backward and gradient reductions) to the end of the
  // step: gradient norm, scalar all-reduces, optimizer, parameter all-gathers (fsdp-run's report measures
  // the same span as steps[].optimizer_phase_s).
  double optimizer_phase_s = 0;
  double contention_s = 0;       // compute slowed by collectives running beside it (in compute_s)
  double tp_comm_s = 0;          // tensor-parallel collectives (on the critical path; in comm_s and exposed_comm_s)
  double pp_comm_s = 0;          // pipeline point-to-point transfers (likewise)
  double ep_comm_s = 0;          // expert-parallel token all-to-alls (likewise)
  double pipeline_bubble_s = 0;  // the pipeline schedule's fill and drain (idle, not in exposed_comm_s)
  // The stage's forward and backward of one micro-batch, the bubble's unit: its step before the optimizer phase over
  // the micro-batches (pp > 1 only).
  double pipeline_micro_batch_s = 0;
  // The stage's reductions issued after its whole backward (StepProgram::first_reduction_after_backward): from the end
  // of the work before them to the end of the work before the optimizer phase; not in pipeline_micro_batch_s. 0 where
  // the program has none.
  double pipeline_reduction_tail_s = 0;
  // The other stages' reduction tails, on the drain's path one after the other (simulate.cpp): the last micro-batch's
  // input gradient leaves each stage only once its reductions are done. In step_s; not in pipeline_bubble_s (the
  // schedule's fill and drain) nor in exposed_comm_s (this stage's own waits). 0 where no stage reduces after its
  // backward.
  double pipeline_reduction_chain_s = 0;
  // The compute stream's wait for the host to issue its work (StepProgram::host_issue; in compute_s, not in
  // exposed_comm_s): the step is host-bound by this much.
  double host_wait_s = 0;
  std::vector<OpTiming> ops;  // per op of the program
};

// The compute times of a program's layer classes and head, priced once per program: every op of a class computes
// the same shapes (the search prices millions of ops, and the tile quantization of each GEMM and the attention
// kernel's dispatch are most of an op's cost otherwise).
struct LayerPrices {
  double gemm_forward = 0;       // the forward GEMM of each of the layer's linears (gemm_pass_times)
  double gemm_gradient = 0;      // one of the two gradient GEMMs of each
  double op_sac_recomputed = 0;  // the forward GEMMs the per-op checkpointing policy runs again
  double attention_forward = 0;  // one forward pass of its attention core, on the kernel the strategy runs
  double attention_backward = 0;
};
// A layer's GEMM (its rows weighted, GemmShape::weight) by pass: the forward's and one gradient GEMM's time. In the
// compute dtype the profile's curve prices the mean of a linear's three GEMMs, the forward taking
// device.matmul_forward_ratio of it and each gradient GEMM half the rest; a float8 linear's at their own rates
// (compute_cost.hpp float8_linear_gemm_times: the forward accumulates fast, the gradients do not).
struct GemmPassTimes {
  double forward = 0, gradient = 0;
};
GemmPassTimes gemm_pass_times(const HardwareProfile& hw, const GemmShape& g, DType compute_dtype);
struct OpPrices {
  std::vector<LayerPrices> layers;  // by StepProgram::layer_shapes index
  GemmPassTimes head;
  double head_fused_loss = 0;  // the head's GEMMs under a fused linear cross-entropy (Op::head_fused_loss)
  // What op_duration has priced of one program's collectives and memory-bound traffic (pure functions of the
  // profile, the group and the bytes): a program repeats the same few per unit and micro-batch, and the planner
  // times thousands of programs, so each distinct one is priced once per timeline (exactly the value it would
  // compute again). Small linear caches: a program has a handful of distinct ones.
  struct CollectiveMemo {
    CollectiveKind kind;
    GroupKind group;
    double bytes;
    double latency, transfer;
  };
  struct TrafficMemo {
    double bytes;
    bool master;
    double seconds;
  };
  mutable std::vector<CollectiveMemo> collectives;
  mutable std::vector<TrafficMemo> traffic;
};
OpPrices price_layers(const StepProgram& p, const HardwareProfile& hw, const Strategy& s);

double op_duration(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s,
                   const OpPrices& prices);
double op_duration(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s);

// The host's time to issue `op` (StepProgram::host_issue, per pass): a decoder layer's forward for each layer a
// Forward op computes; its backward, plus the forward again where the layer's checkpointing reruns it, for each
// layer a Backward op computes; the embedding + head + loss forward at Loss and their backward at LossBackward.
// Other ops are issued within those passes (their collectives) or are not priced (0).
double host_issue_seconds(const Op& op, const StepProgram& p, const Strategy& s);

TimelineResult run_timeline(const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s);

}  // namespace fsdp
