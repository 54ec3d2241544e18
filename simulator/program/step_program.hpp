// The step program: the ordered operations of one training step on one rank
// (DESIGN.md "The middle"). The memory walk replays its allocations and frees;
// the timeline schedules the same operations on their streams. step_program.cpp
// composes the mesh's dimensions, each a transform of the per-unit program that adds
// its own ops: data parallelism (data_parallel.hpp: where a unit's state lives, its
// gathers and gradient reductions), tensor parallelism (tensor_parallel.hpp) and
// pipeline parallelism (pipeline_parallel.hpp).
#pragma once

#include <string>
#include <vector>

#include "compute/sdpa_dispatch.hpp"
#include "compute/unfused_attention.hpp"
#include "core/errors.hpp"
#include "hardware/cluster.hpp"
#include "memory/memory_category.hpp"
#include "model/module_graph.hpp"
#include "program/emit_memo.hpp"
#include "program/layer_costs.hpp"
#include "program/op_kinds.hpp"
#include "program/wrap_units.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct MemEvent {
  MemoryCategory category;
  double bytes;  // > 0 allocates, < 0 frees
};

// A fixed-capacity inline list: ops are emitted by the thousand per simulated configuration and
// the planner simulates thousands of configurations, so no op allocates. Pushing past the capacity is
// a bug in an emitter (an event or dependency would be lost): an assertion, never a silent drop.
template <typename T, int N>
struct InlineList {
  static constexpr int kCapacity = N;
  T items[N]{};
  int count = 0;
  void push_back(const T& v) {
    FSDP_ASSERT(count < N, "InlineList capacity exceeded: an op would lose a memory event or a dependency");
    items[count++] = v;
  }
  const T* begin() const { return items; }
  const T* end() const { return items + count; }
  bool empty() const { return count == 0; }
};

// The fields are ordered so that the one-byte and four-byte ones pack together: an Op is copied once per emission
// and read by the memory walk and the timeline, millions of times per search (no field's meaning depends on its
// place; Op is only ever value-initialised, Op{}, and assigned by name).
struct Op {
  OpKind kind = OpKind::Forward;
  Stream stream = Stream::Compute;
  Phase phase = Phase::Forward;  // label prefix; the full label is op_label(program, op)
  CollectiveKind collective = CollectiveKind::None;
  GroupKind group = GroupKind::Shard;
  WireType comm_dtype = WireType::Fp32;  // what travels (fp32 where the backend lacks the plan's dtype)
  bool after_all_comm = false;           // also waits for every earlier non-compute op (optimizer barrier)
  // Its elementwise_bytes compute in the master dtype, not the compute dtype (op_cost.cpp: a kernel is priced for the
  // dtype it computes in, docs/hardware.md "Elementwise kernels"), as the optimizer's.
  bool elementwise_in_master_dtype = false;
  int unit = -1;                 // index into StepProgram::units
  int micro_batch = 0;           // 0-based
  int comm_calls = 1;            // the op is this many collectives of comm_bytes each (a unit's tp layers)
  int async_tp_fused_calls = 0;  // of comm_calls, those async TP fuses with a GEMM (TpCollective::fused_calls)
  bool tp_head = false;          // a tensor-parallel op of the head's (tensor_parallel.hpp tp_head_collectives)
  // The lm_head's three GEMMs run chunk by chunk with the loss (Liger-Kernel's fused linear cross-entropy,
  // RuntimeProfile::loss_fused_linear): priced by compute/compute_cost.hpp fused_linear_cross_entropy_time.
  bool head_fused_loss = false;
  // Its elementwise_bytes are the eager cross-entropy's softmax-family kernels (log_softmax forward and backward,
  // nll_loss's zeroed gradient: program/emit_loss.cpp), priced at HardwareProfile::softmax_bandwidth.
  bool elementwise_softmax = false;
  InlineList<int, 2> deps;           // ops that must complete before this one starts
  InlineList<MemEvent, 4> on_issue;  // applied when the op is issued (CPU order)
  double transient_bytes = 0;        // live only while the op runs (Transient category)
  // The largest single tensor its on_issue allocations hold, freed with its on_complete, where the emitter knows it
  // (0: not stated): the memory walk's step segments (memory_walk.hpp MemoryResult::step_segments) count the ops of
  // the step window that state it. nanotron's ZeRO-1 gather: c10d's flat output of the whole replica.
  double largest_block_bytes = 0;
  // A gather's buffer inside the backend (Gloo's flat all-gather output), Transient: it lives while the collective
  // runs, which on a CPU rank may overlap any compute issued before its consumer waits, or end before that compute
  // peaks (MemoryResult::peak_allocated_floor).
  double backend_buffer_bytes = 0;
  // Of the blocks the program frees once this collective is issued, those it reads (not counted in its events: the
  // compute op that wrote them frees them): the sequence-parallel reduce-scatters' full-sequence inputs. The caching
  // allocator keeps them out of the compute stream's reach until the GPU has run the collective
  // (RuntimeProfile::collective_inputs_held_for_the_pass); the memory walk holds them in reserved memory.
  double stream_recorded_bytes = 0;
  InlineList<MemEvent, 3> on_complete;  // applied when it completes
  // Cost (read by the timeline)
  double matmul_flops = 0;     // total GEMM FLOPs of the op (for the trace and checks)
  double attention_flops = 0;  // total attention-score FLOPs
  // What the compute cost model prices: `layers` decoder layers' GEMMs run `gemm_passes` times
  // (forward 1, backward 2: input and weight gradients, +1 when recomputed), attention kernels
  // forward `attn_fwd_passes` and backward `attn_bwd_passes` times; `head_passes` of the lm_head GEMM.
  double layers = 0;
  int64_t first_layer = -1, last_layer = -1;  // the decoder layers it computes (-1: none)
  double gemm_passes = 0;
  double attn_fwd_passes = 0;
  double attn_bwd_passes = 0;
  double head_passes = 0;
  double elementwise_bytes = 0;  // memory-bound traffic
  double float8_cast_bytes = 0;  // float8 linears' casts (program/float8_linears.hpp), at their own rate
  // Contiguous device-to-device copies (read + write), priced at HardwareProfile::copy_bandwidth: FSDP2's all-gather
  // copy-out and copy-in, FSDP1's flat-gradient cat, sequence-parallel layout cats of rank-major chunks.
  double device_copy_bytes = 0;
  double comm_bytes = 0;  // full buffer size of the collective
  double copy_bytes = 0;  // host<->device
  double host_optimizer_params = 0;
};

struct StepLayout;
struct StepProgram;
// A collective op of `kind` on `stream`: its unit, micro-batch, phase, collective and process group; the emitters
// (step_program.cpp, data_parallel.cpp) add its bytes, wire dtype, memory events and dependencies.
Op make_collective_op(OpKind kind, Stream stream, int unit, int micro_batch, Phase phase, CollectiveKind collective,
                      GroupKind group);

std::string op_label(const StepProgram& p, const Op& op);
// The label and, for the ops of a micro-batch, "(micro-batch k)": the words of peak_phase, which
// fsdp-run's report uses too.
std::string op_phase(const StepProgram& p, const Op& op);

// The device mesh of the step, from the program's rank (DESIGN.md "Parallelism as a device mesh"): world = dp x tp x
// pp ranks, tp innermost (a node's NVLink), pp outermost, as torchtitan's ParallelDims builds it. Each dimension owns
// a process group (GroupKind) and its tier (timeline/op_cost.cpp group_of): the data-parallel ones (Shard, Replica,
// World) span the dp ranks holding the same model slice, tp apart; Tensor is tp consecutive ranks; Pipeline joins a
// stage to its neighbours, world / pp ranks apart.
struct StepLayout {
  int64_t world = 1;       // data-parallel ranks: the whole world / (tp x pp)
  int64_t shard_size = 1;  // ranks a parameter/gradient/optimizer shard is split over
  int64_t replicas = 1;    // world / shard_size
  int64_t tp = 1;          // tensor-parallel degree (MeshSpec::tp)
  int64_t pp = 1;          // pipeline stages (MeshSpec::pp)
  int64_t pp_virtual_stages = 1;
  PipelineSchedule pp_schedule = PipelineSchedule::OneFOneB;
  // Expert parallelism (MeshSpec::ep): the routed experts split over ep consecutive ranks of the shard group, their
  // parameters sharded over the shard_size / ep ranks holding the same experts (program/expert_parallel.hpp).
  int64_t ep = 1;
  int64_t stage = 0;                                     // the pipeline stage this program is of (0 .. pp-1)
  int64_t stage_first_layer = 0, stage_last_layer = -1;  // the decoder layers the stage holds (pipeline_parallel.hpp)
  int64_t tokens_per_micro_batch = 0;
  int64_t micro_batches_emitted = 1;  // min(grad_accum, 3): first, one representative middle, last
  int64_t ranks() const { return world * tp * pp; }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
  // The stages holding the final norm and the head, and the loss (pipeline_parallel.hpp PipelineTail: the last for
  // the even split; nanotron's compute-cost split may put the head on the stage before the loss's).
  int64_t head_stage = 0, loss_stage = 0;
  bool holds_head() const { return stage == head_stage; }
  bool holds_loss() const { return stage == loss_stage; }
  int64_t group_size(GroupKind g) const {
    switch (g) {
      case GroupKind::Shard:
        return shard_size;
      case GroupKind::Replica:
        return replicas;
      case GroupKind::World:
        return world;
      case GroupKind::Tensor:
        return tp;
      case GroupKind::Pipeline:
        return pp;
      case GroupKind::Mesh:
        return ranks();
      case GroupKind::Expert:
        return ep;
    }
    return 1;
  }
};

struct StepProgram {
  StepLayout layout;
  // Per class of decoder layers (ModuleGraph::layer_classes): GEMMs and attention heads (layer_costs.hpp);
  // layer l's shapes are layer_shapes[layer_shape_of[l]].
  std::vector<LayerShape> layer_shapes;
  std::vector<int32_t> layer_shape_of;
  GemmShape head_gemm;
  bool fused_linear_loss =
      false;  // the loss ops run the head's GEMMs fused with the cross-entropy (Op::head_fused_loss)
  int64_t attn_batch = 0, attn_seq = 0;
  // Layers [0, frozen_layers) are frozen vision blocks (Strategy::train_vision): forward only, no backward op.
  int64_t frozen_layers = 0;
  // The tensor-parallel collectives overlap the linears' own GEMMs (RuntimeProfile::tp_linear_async_overlap, with
  // sequence parallelism and without async TP): the timeline prices what stays exposed
  // (timeline/tp_linear_overlap.hpp).
  bool tp_async_linears = false;
  // The runtime's host issue time per pass (RuntimeProfile::host_issue) where its scope covers this mesh; empty where
  // it does not (the timeline charges none).
  HostIssue host_issue;
  // With attention sdpa: the kernels PyTorch's dispatch runs (ProgramInput::sdpa_global, sdpa_windowed): the
  // timeline prices them.
  SdpaKernel sdpa_global = SdpaKernel::Flash;    // layers attending every earlier token (is_causal, no mask)
  SdpaKernel sdpa_windowed = SdpaKernel::Flash;  // sliding-window layers (an attention mask)
  // What unfused attention moves besides its GEMMs (compute/unfused_attention.hpp): attention eager, and SDPA's math
  // backend where the dispatch chose it. The timeline prices them on a GPU.
  UnfusedAttentionRecipe eager_attention, sdpa_math_attention;
  std::vector<WrapUnit> units;
  std::vector<MemEvent> persistent;  // allocated before the step and alive throughout (steady state)
  std::vector<Op> ops;
  std::vector<MemEvent> host_persistent;  // offloaded state in host memory (the device itself on CPU runs)
  double host_bytes_per_rank = 0;         // host-resident state for offload (pinned buffers included)
  double pinned_bytes_per_rank = 0;
  // A pipeline transfer's on_issue events sum many tensors that live on (the stage's other micro-batches in flight,
  // the outputs it holds): an upper bound of the largest of them, one unit's activations of one micro-batch, the
  // loss's saved log-probabilities or one output (0: no pipeline). What the memory walk takes for the largest block
  // such an event caches (memory_walk.cpp, step segments); each other event's bytes bound its own tensors.
  double pipeline_transfer_tensor_bound = 0;
  int communicators = 0;  // NCCL communicators this rank holds
  // The first op of the last micro-batch's reductions issued after the stage's whole backward
  // (DataParallelPlan::reduces_after_stage_backward), or -1: the timeline measures the stage's reduction tail from
  // the end of the work before it.
  int first_reduction_after_backward = -1;
};

struct ProgramInput {
  const ModuleGraph* graph = nullptr;
  Cluster cluster;
  Strategy strategy;
  const RuntimeProfile* runtime = nullptr;
  // The backend has no low-precision collectives (Gloo in LibTorch 1.13 rejects bf16): they run through
  // fp32 staging buffers (executor/dist/comm.cpp).
  bool fp32_collectives_only = false;
  // The backend gathers into a flat buffer of its own before the output (Gloo's AsyncAllgatherWork).
  bool backend_gather_buffer = false;
  // The device is the host (a CPU run): offloaded state already lives where compute reads it.
  bool host_device = false;
  // With strategy.attention sdpa, the kernels SDPA's dispatch chooses (simulate.hpp resolve_sdpa) for global and
  // for sliding-window layers. The math kernel materialises the scores and probabilities like eager attention and
  // saves what eager saves; the fused kernels (flash, memory-efficient, cuDNN) save the output and the log-sum-exp.
  // A caller that has no hardware profile to dispatch on (a program emitted for its memory alone) leaves flash, what
  // sdpa was priced as before the dispatch was modelled.
  SdpaKernel sdpa_global = SdpaKernel::Flash;
  SdpaKernel sdpa_windowed = SdpaKernel::Flash;
  // With pipeline parallelism, the stage whose rank the program is of (0 .. pp-1).
  int64_t pipeline_stage = 0;
};

// `memo`: what the programs of many plans (a plan's stages, a search's plans) derive alike, kept across them
// (program/emit_memo.hpp); null derives everything here.
StepProgram emit_step_program(const ProgramInput& in, EmitMemo* memo = nullptr);

// Activation query for this strategy and runtime (dtype, attention, autocast, runtime module behaviour).
ActivationQuery activation_query(const Strategy& s, const RuntimeProfile& rt);

// The same for the tensors `kernel` keeps when the strategy's attention is sdpa: math keeps eager attention's.
ActivationQuery activation_query(const Strategy& s, const RuntimeProfile& rt, SdpaKernel kernel);

// Whether Hugging Face's sdpa path hands layer `layer` an attention mask instead of is_causal: a sliding window
// no longer than the sequence (transformers src/transformers/masking_utils.py @
// 2ccc6cae21faaf11631efa5fb9054687ae5dc931, _ignore_causal_mask_sdpa: the mask is skipped only while kv_length <
// local_attention_size).
bool sdpa_layer_masked(const ModelSpec& m, int64_t layer, int64_t seq_len);

// Whether the model's code repeats k and v to the query heads before the fused attention kernel (RuntimeProfile::
// kv_repeat) in a layer that passes an attention mask (`masked`: sdpa_layer_masked) or not.
bool kv_repeated(const Strategy& s, const RuntimeProfile& rt, bool masked);

}  // namespace fsdp
