// The step program's emitter (internal to emit_step_program, program/step_program.hpp): one Emitter builds a rank's
// ops for one step from the strategy, the model graph and the runtime. Its parts, one concept a file:
//   emit_setup.cpp      per-unit parameters, activations, FLOPs and bytes, derived once per program
//   emit_units.cpp      a unit's forward and backward compute ops and its post-backward hook
//   emit_sharded.cpp    the sharded strategies' micro-batches (FSDP, HSDP, ZeRO-3): gathers, reshards, reductions
//   emit_replicated.cpp the replicated strategies' micro-batches (DDP, ZeRO-1/2): buckets and their reductions
//   emit_mesh.cpp       the mesh's own ops: tensor-parallel collectives and pipeline transfers
//   emit_loss.cpp       the final norm, the LM head and the loss
//   emit_optimizer.cpp  the step after the last backward: gradient sync, norm, optimizer, ZeRO's gather; LoRA adapters
// Included by those files and step_program.cpp only.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/errors.hpp"
#include "program/collective_wire.hpp"
#include "program/data_parallel.hpp"
#include "program/expert_parallel.hpp"
#include "program/float8_linears.hpp"
#include "program/pipeline_parallel.hpp"
#include "program/root_module_costs.hpp"
#include "program/tensor_parallel.hpp"
#include "strategy/placement.hpp"

namespace fsdp::step_emission {

// The training loop's scalar collectives carry one fp64 value (executor clip_grad_norm and the loss).
inline constexpr double kScalarBytes = 8.0;
// FlashAttention-2's backward is 2.5x its forward in FLOPs (arXiv 2307.08691 sec. 3.2: 5 GEMMs against 2).
inline constexpr double kAttentionBackwardRatio = 2.5;

inline double ceil_div(double a, double b) { return std::ceil(a / b); }

struct Emitter {
  const ModuleGraph& g;
  const Strategy& s;
  const RuntimeProfile& rt;
  StepProgram prog;
  ActivationQuery q;
  SdpaKernel sdpa_memory = SdpaKernel::Flash;  // the sdpa kernel whose saved tensors the layers keep
  double tokens = 0;
  double pb = 0;  // compute (param) dtype bytes
  double mb = 0;  // master dtype bytes
  double rb = 0;  // reduce dtype bytes
  // The data-parallel dimension (program/data_parallel.hpp): its plan, derived once from the strategy and the
  // runtime, and what its ops share. The fields below are the plan's, named for the emitters.
  DataParallelPlan dp_plan;
  DataParallelContext dp;
  CollectiveWire wire;  // the backend's wire format over the mesh's groups (program/collective_wire.hpp)
  bool sharded = false;
  UnitPlacement place;       // of the strategy's units but the root (strategy/placement.hpp)
  bool mixed = false;        // compute dtype differs from storage
  bool zero_layout = false;  // DeepSpeed ZeRO's low-precision parameters and gradients (DataParallelPlan)
  bool accum32 = false;      // nanotron's fp32 gradient accumulator (DataParallelPlan::fp32_grad_accumulator)
  double sb = 0;             // bytes per element of the stored parameters / gradients (the plan's dtypes)
  double gb = 0;
  // Parameters per unit: trainable (everything for full fine-tuning; the adapters for LoRA) and frozen
  // (the LoRA/QLoRA base, no gradients and no optimizer state), and the bytes per frozen element in compute form.
  std::vector<double> train_p, frozen_p, frozen_bpe;
  // The frozen base stored as master-dtype shards cast for each use (RuntimeProfile::lora_base_in_master_dtype).
  bool frozen_in_master = false;
  // Bytes per frozen element as the rank stores it: the master dtype's where frozen_in_master, else frozen_bpe.
  double frozen_store_bpe(size_t i) const { return frozen_in_master ? mb : frozen_bpe[i]; }
  // Elements a unit stores in the master dtype and casts to the compute dtype for use: the trained ones, and the
  // frozen base where it is stored so.
  double cast_elems(int ui) const {
    const size_t i = static_cast<size_t>(ui);
    return train_p[i] + (frozen_in_master ? frozen_p[i] : 0.0);
  }
  // Bytes per trained element a unit gathers and holds unsharded: the compute dtype's, less for the weights of float8
  // linears gathered in float8 (Strategy::float8_all_gather: 1 byte each).
  std::vector<double> train_bpe;
  // Per unit, its routed experts' trainable parameters (LayerCost::routed_params), and, of its trainable ones, those a
  // rank holds unsharded: all but the routed experts of the other ep ranks (program/expert_parallel.hpp). Empty
  // without expert parallelism.
  std::vector<double> routed_p;
  double unsharded_train(size_t i) const {
    return routed_p.empty() ? train_p[i] : ep_unsharded_params(train_p[i], routed_p[i], s.mesh.ep);
  }
  // The trainable elements whose collective over the shard group costs what the unit's gather (or reduce-scatter)
  // costs: the experts' over their efsdp group counted as their shard-group equivalent.
  double shard_equivalent_train(size_t i) const {
    return routed_p.empty() ? train_p[i]
                            : ep_shard_equivalent_params(train_p[i], routed_p[i], prog.layout.shard_size, s.mesh.ep);
  }
  // A layer's trainable elements a rank holds unsharded (full fine-tuning).
  double unsharded_layer_params(const LayerCost& lc) const {
    return routed_p.empty() ? lc.params : ep_unsharded_params(lc.params, lc.routed_params, s.mesh.ep);
  }
  // Per class of decoder layers (ModuleGraph::layer_classes), from its nodes; layer l's is
  // class_costs[layer_class[l]].
  std::vector<LayerCost> class_costs;
  std::vector<int32_t> layer_class;
  // Trainable parameters of the lm_head and the final norm: autograd produces their gradients in the
  // loss backward, long before the root unit's post-backward (the embedding's come last).
  double head_train = 0;
  // Trainable parameters of the token embedding where it is a unit of its own, resharded after its forward
  // (RuntimeProfile::embedding_own_unit; emit_sharded.cpp), else 0: the root unit holds it gathered.
  double embed_released = 0;
  std::vector<double> act_bytes;  // per unit, saved activations of one micro-batch
  // Per unit: its layers' memory-bound bytes, and their largest forward and backward working memory.
  std::vector<double> unit_elementwise, unit_elementwise_backward, unit_forward_transient, unit_backward_transient;
  std::vector<double> fwd_flops;   // per unit, matmul FLOPs per micro-batch
  std::vector<double> attn_flops;  // per unit
  // Per unit, the forward FLOPs of its parts that run a backward (all but a frozen vision tower's or projector's).
  std::vector<double> trained_fwd_flops, trained_attn_flops;
  // Layers [0, prog.frozen_layers) are a vision tower's blocks frozen by the strategy (Strategy::train_vision): they
  // run their forward alone, save nothing and get no gradient (no input of theirs needs one).
  bool layer_frozen(int64_t l) const { return l < prog.frozen_layers; }
  // The first of a unit's layers that runs a backward (past the frozen ones), or its first layer where it has none.
  int64_t first_trained_layer(const WrapUnit& u) const {
    return u.num_layers() == 0 ? u.first_layer : std::max(u.first_layer, prog.frozen_layers);
  }
  // Whether a unit runs a backward: the root does (the language model's embedding), a unit of frozen layers does not.
  bool unit_trains(int ui) const {
    const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
    return u.is_root || u.last_layer >= prog.frozen_layers;
  }
  std::vector<double> recompute_bytes;  // per unit: what its backward rematerialises at once (the largest layer's)
  // Per unit, what its backward adds by recomputation under its layers' modes (layer_ckpt): GEMM FLOPs, attention
  // FLOPs (the forward run again) and memory-bound bytes (the forward's kernels run again).
  std::vector<double> recompute_flops, recompute_attn_flops, recompute_elementwise;
  // Float8 linears' casts per unit (float8_linears.hpp): forward, and backward with what the recomputed forward casts.
  std::vector<double> unit_float8_cast, unit_float8_cast_backward;
  // The root's activations on the head side (the final norm's and the head's saved inputs): released by
  // the loss backward, which runs their backward; the embedding side waits for the root's backward.
  double head_act = 0;

  bool fp32_collectives = false;
  bool backend_gather_buffer = false;
  // Parameter offload onto a host that is itself the device (a CPU run), in the compute dtype: the offloaded
  // shard is the all-gather's input as it is (executor/shard/sharded_model.cpp unshard_async: Tensor::to to
  // the same device and dtype returns the tensor itself), with no staging copy.
  bool host_params_are_compute_params = false;
  bool grads_copied_per_unit = false;  // offload: gradient partitions copied to the host unit by unit
  // LoRA adapters kept outside the wrap units (RuntimeProfile::lora_adapters_replicated): their elements, one
  // replicated flat buffer.
  double adapters = 0;
  bool adapters_outside_units() const { return s.method != Method::Full && rt.lora_adapters_replicated; }
  Op deferred_replica;  // HSDP: a replica all-reduce waiting for its issue point (kind AllReduce)
  // Tensor parallelism: per unit, the replicated parameters whose gradients are summed over the tp group
  // (LayerCost::tp_partial_grad_params: every norm with sequence parallelism, else the q/k norms; the root's final
  // norm with sequence parallelism).
  std::vector<double> tp_unit_replicated_params;
  // Pipeline parallelism: the stage's other micro-batches' activations its schedule keeps in flight, held from the
  // first micro-batch's transfer to the last one's (program/pipeline_parallel.hpp in_flight_micro_batches).
  double pp_in_flight_bytes = 0;
  bool pp_in_flight_held = false;
  // A pipeline stage's output, held from its forward to its backward by every schedule (the backward runs on it:
  // torch.distributed.pipelining's fwd_cache, nanotron's activations requiring backward, fsdp-run's
  // executor/train/pipeline.cpp), and where the runtime keeps it to the step's end
  // (RuntimeProfile::pipeline_outputs_to_step_end) until then: how many micro-batches' outputs are held so far, and
  // what is freed when the step ends.
  int64_t pp_outputs_held = 0;
  double pp_outputs_freed_at_end = 0;
  // Whether this stage keeps its outputs to the step's end; under either setting the loss's stage outputs its logits.
  bool keeps_stage_outputs() const {
    using K = RuntimeProfile::PipelineOutputsKept;
    if (prog.layout.pp <= 1) return false;
    return rt.pipeline_outputs_to_step_end == K::EveryStage ||
           (rt.pipeline_outputs_to_step_end == K::LastStage && holds_loss());
  }
  bool loss_stage_outputs_logits() const {
    return prog.layout.pp > 1 && rt.pipeline_outputs_to_step_end != RuntimeProfile::PipelineOutputsKept::None;
  }
  // Elements of one micro-batch's transfer between stages, and of the stage's output: s x b x h (1/tp of it with
  // sequence parallelism), or the logits across nanotron's head-to-loss boundary.
  double pp_transfer_elems(bool logits) const {
    if (logits) return logits_elems();
    double elems = tokens * static_cast<double>(g.spec().hidden_size);
    if (s.mesh.tp > 1 && s.mesh.sequence_parallel) elems /= static_cast<double>(s.mesh.tp);
    return elems;
  }
  // This micro-batch's output held by the stage (`bytes` each): to the step's end with those of the micro-batches
  // since the last emitted one (the one emitted in the middle stands for them), or to its backward.
  void hold_stage_output(Op& op, int mbi, double bytes);
  // The final norm and the head, and the loss (with nanotron's fp32 cast): on the last stage, or on two
  // (StepLayout::head_stage, loss_stage; pipeline_parallel.hpp pipeline_split_by_cost).
  bool holds_head() const { return prog.layout.holds_head(); }
  bool holds_loss() const { return prog.layout.holds_loss(); }
  PipelineTail tail() const { return PipelineTail{prog.layout.head_stage, prog.layout.loss_stage}; }
  // The head's bf16 logits cross this stage's input (a stage after the head's) or output (the head's or one after
  // it, before the loss's) boundary instead of the hidden states.
  bool receives_logits() const { return tail().split() && prog.layout.stage > prog.layout.head_stage; }
  bool sends_logits() const {
    return tail().split() && prog.layout.stage >= prog.layout.head_stage && prog.layout.stage < prog.layout.loss_stage;
  }

  Emitter(const ModuleGraph& graph, const Strategy& st, const RuntimeProfile& r) : g(graph), s(st), rt(r) {}
  // The caller's runtime profile, which the emit memo binds (rt: it with the strategy's kernel library applied).
  const RuntimeProfile* memo_runtime = nullptr;

  // By reference: an Op is a few hundred bytes, and the search emits millions of them, so one copy, not two.
  int push(const Op& op) {
    prog.ops.push_back(op);
    return static_cast<int>(prog.ops.size()) - 1;
  }

  // What a collective moves and in which element type (program/collective_wire.hpp).
  double wire_bytes(double elems, double bytes_per_elem, GroupKind g) const {
    return wire.bytes(elems, bytes_per_elem, g);
  }
  bool stages_fp32(GroupKind g) const { return wire.stages_fp32(g); }
  WireType wire_type(DType d, GroupKind g) const { return wire.type(d, g); }
  int64_t group_size(GroupKind g) const { return prog.layout.group_size(g); }
  // What gathering unit `ui` moves (its trainable and frozen parameters).
  double gathered_wire_bytes(int ui) const {
    const size_t i = static_cast<size_t>(ui);
    return wire_bytes(padded(shard_equivalent_train(i)), train_bpe[i], GroupKind::Shard) +
           wire_bytes(padded(frozen_p[i]), frozen_bpe[i], GroupKind::Shard);
  }

  double shard(double elems) const { return ceil_div(elems, static_cast<double>(prog.layout.shard_size)); }
  double padded(double elems) const { return shard(elems) * static_cast<double>(prog.layout.shard_size); }

  // Matmul FLOPs (GEMMs incl. head) and attention-score FLOPs of the modules under `id`, per token.
  void flops_of(ModuleId id, double& mm, double& at) const {
    constexpr double kCausalFraction = 0.5;  // see ModuleGraph::forward_flops_per_token
    for (ModuleId leaf : g.leaves_under(id)) {
      const ModuleNode& n = g.node(leaf);
      mm += n.flops_per_token;
      at += n.flops_per_token_per_seq * static_cast<double>(s.seq_len) * kCausalFraction;
    }
  }

  // `memo`: what programs of the same inputs share (program/emit_memo.hpp), or null.
  void setup(EmitMemo* memo);

  // Full checkpointing of every layer on a runtime that checkpoints a unit as one region (fsdp-run's CheckpointFn
  // over the unit's layers): only the unit's input is kept. every:N checkpoints layer by layer (a region each).
  bool unit_checkpoint_region() const { return checkpoints_every_layer(s) && rt.checkpoint_per_unit; }
  // The share of a unit's layers that are checkpointed (any mode); a unit without layers (the root) counts as the
  // model's layers do, as checkpointing of the whole model was counted before modes differed by layer.
  double checkpointed_share(int ui) const {
    const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
    int64_t first = u.first_layer, last = u.last_layer;
    if (u.num_layers() == 0) {
      first = 0;
      last = static_cast<int64_t>(g.layers().size()) - 1;
    }
    if (last < first) return s.act_ckpt == ActCkpt::None ? 0.0 : 1.0;
    double n = 0;
    for (int64_t l = first; l <= last; ++l) n += layer_ckpt(s, l) == ActCkpt::None ? 0.0 : 1.0;
    return n / static_cast<double>(last - first + 1);
  }
  // Elements of a replica unit's weight casts (`casts`): a runtime under autocast (replicated_residual_fp32) casts the
  // linears' weights only, so of the root (embedding, final norm, head) the LM head's, where this stage holds it
  // (torch.autocast's op lists: embedding and the norms run in fp32); a runtime that casts the replica itself
  // (fsdp-run) casts the whole unit.
  double replica_cast_elems(int ui) const {
    if (prog.units[static_cast<size_t>(ui)].num_layers() != 0 || !rt.replicated_residual_fp32) return cast_elems(ui);
    if (!holds_head() || (s.method != Method::Full && !frozen_in_master)) return 0.0;
    // The head GEMM's weight, vocab x hidden (the embedding's where they are tied), its vocabulary split over tp.
    const ModelSpec& m = g.spec();
    return static_cast<double>(m.vocab_size) * static_cast<double>(m.hidden_size) /
           static_cast<double>(std::max<int64_t>(1, s.mesh.tp));
  }
  // The share of a unit's weight casts cast again for its backward: its checkpointed layers'. The root's (embedding,
  // final norm, head) are never in a checkpointed region (fsdp-run checkpoints the units' decoder layers; Hugging
  // Face's gradient checkpointing the decoder layers), so the head's cast lives from its forward to its backward.
  double cast_checkpointed_share(int ui) const {
    return prog.units[static_cast<size_t>(ui)].num_layers() == 0 ? 0.0 : checkpointed_share(ui);
  }
  // A layer's share of its unit's backward work (recomputation included): GEMMs, attention, memory-bound bytes.
  static double backward_gemm_weight(const LayerCost& lc) {
    return 2.0 * lc.matmul_flops_per_token + lc.recompute_matmul_flops_per_token;
  }
  static double backward_attention_weight(const LayerCost& lc) {
    return lc.attention_flops_per_token * (kAttentionBackwardRatio + (recomputes_attention(lc.ckpt) ? 1.0 : 0.0));
  }
  static double backward_elementwise_weight(const LayerCost& lc) {
    return lc.elementwise_backward_bytes_per_token +
           (recomputes_layer_forward(lc.ckpt) ? lc.elementwise_bytes_per_token : 0.0);
  }

  // The costs of a unit's decoder layers, in forward order: a view over its layers (no vector per call: the setup
  // asks for every unit's several times per program).
  struct LayerCosts {
    const Emitter* e;
    int64_t first, count;  // the unit's first layer and how many (0 for none)
    const LayerCost* operator[](size_t i) const {
      return &e->class_costs[static_cast<size_t>(e->layer_class[static_cast<size_t>(first) + i])];
    }
    struct Iter {
      const LayerCosts* v;
      size_t i;
      const LayerCost* operator*() const { return (*v)[i]; }
      Iter& operator++() {
        ++i;
        return *this;
      }
      bool operator!=(const Iter& o) const { return i != o.i; }
    };
    Iter begin() const { return Iter{this, 0}; }
    Iter end() const { return Iter{this, static_cast<size_t>(count)}; }
  };
  LayerCosts costs_of(const WrapUnit& u) const {
    const bool any = u.first_layer >= 0 && u.last_layer >= u.first_layer;
    return LayerCosts{this, any ? u.first_layer : 0, any ? u.last_layer - u.first_layer + 1 : 0};
  }
  double unit_elementwise_bytes(const WrapUnit& u) const {
    return unit_elementwise[static_cast<size_t>(&u - prog.units.data())];
  }

  // Working memory of a unit's forward and backward: its largest layer's (a fully checkpointed unit first
  // rematerialises its activations, recompute_bytes).
  double forward_transient(const WrapUnit& u) const {
    return unit_forward_transient[static_cast<size_t>(&u - prog.units.data())];
  }
  double backward_transient(size_t ui) const {
    if (prog.units[ui].num_layers() == 0) return 0;
    return unit_backward_transient[ui] + recompute_bytes[ui];
  }

  // The logits the loss reads on this rank: the vocabulary shard, or the whole vocabulary where the runtime gathers
  // the head's output (RuntimeProfile::tp_head_output_replicated).
  double logits_elems() const {
    const double vocab = static_cast<double>(g.spec().vocab_size);
    return tokens * (rt.tp_head_output_replicated ? vocab : std::ceil(vocab / static_cast<double>(s.mesh.tp)));
  }
  double logprob_bytes() const { return tensor_bytes(TensorClass::LogProbs, q); }

  double train(int ui) const { return train_p[static_cast<size_t>(ui)]; }
  // Bytes of a unit's gathered (unsharded) parameters in compute form.
  double gathered_bytes(int ui) const {
    const size_t i = static_cast<size_t>(ui);
    return padded(unsharded_train(i)) * train_bpe[i] + padded(frozen_p[i]) * frozen_bpe[i];
  }
  // Bytes of this rank's stored shard of a unit.
  double shard_bytes(int ui, double train_bytes_per_elem) const {
    const size_t i = static_cast<size_t>(ui);
    return shard(train_p[i]) * train_bytes_per_elem + shard(frozen_p[i]) * frozen_store_bpe(i);
  }
  // Elements the step after the backward works on at once out of `owned` (RuntimeProfile::step_per_unit):
  // the largest unit's owned share when it runs unit by unit, else all of them. LoRA adapters are one tensor.
  double step_elems_at_once(double owned) const {
    if (!rt.step_per_unit || s.method != Method::Full) return owned;
    double most = 0;
    for (double v : train_p) most = std::max(most, place.optim_sharded ? shard(v) : v);
    return std::min(most, owned);
  }

  double total_train() const {
    double t = 0;
    for (double v : train_p) t += v;
    return t;
  }

  // Gradient storage of a category still alive after the ops emitted so far (what the optimizer frees).
  double allocated_grads(MemoryCategory cat) const {
    double total = 0;
    for (const Op& op : prog.ops) {
      for (const MemEvent& e : op.on_issue)
        if (e.category == cat) total += e.bytes;
      for (const MemEvent& e : op.on_complete)
        if (e.category == cat) total += e.bytes;
    }
    return total;
  }

  // The gradient storage kept until the optimizer step: allocated in the step (set_to_none=True
  // semantics, PyTorch's default since 2.0), or once for the whole run by runtimes that zero it in place.
  // Returns the allocation for the op's issue, or nothing where the storage is persistent.
  std::optional<MemEvent> kept_grads(MemoryCategory cat, double bytes) {
    const bool partition_buffer = cat == MemoryCategory::ShardedGrads && dp_plan.grad_partition_persistent;
    if (rt.grads_persist || partition_buffer) {
      prog.persistent.push_back({cat, bytes});
      return std::nullopt;
    }
    return MemEvent{cat, bytes};
  }
  void keep_grads(Op& op, MemoryCategory cat, double bytes) {
    if (const std::optional<MemEvent> e = kept_grads(cat, bytes)) op.on_issue.push_back(*e);
  }

  // Frees, when the optimizer is done with them, the gradients the step allocated.
  void free_grads(Op& op) {
    for (MemoryCategory cat : {MemoryCategory::ShardedGrads, MemoryCategory::UnshardedGrads}) {
      double g = allocated_grads(cat);
      if (g > 0) op.on_complete.push_back({cat, -g});
    }
  }

  // ---- ops shared by both families ----

  // A collective on a communication stream.
  Op collective_op(OpKind kind, Stream stream, Phase phase, CollectiveKind c, GroupKind group, double bytes,
                   WireType type, int ui, int mbi) const {
    Op op = make_collective_op(kind, stream, ui, mbi, phase, c, group);
    op.comm_bytes = bytes;
    op.comm_dtype = type;
    return op;
  }

  // ---- the mesh's own ops (tensor_parallel.hpp, pipeline_parallel.hpp) ----

  // Unit `ui`'s shape for its tensor-parallel collectives, and the collectives: the same for every micro-batch and
  // direction, so derived once per unit (push_tp runs per unit, micro-batch and direction, and the search emits
  // thousands of programs); a layer's single-linear blocks once per class of decoder layers
  // (ModuleGraph::layer_classes: layers of one class have the same children).
  std::vector<TpUnitShape> tp_shapes;
  std::vector<bool> tp_shape_known;
  std::vector<std::vector<TpCollective>> tp_forward, tp_backward;  // per unit, its collectives (the head's apart)
  std::vector<TpCollective> tp_head_forward, tp_head_backward;     // the head's (push_tp_head)
  std::vector<int64_t> class_single_linear_blocks;                 // per layer class, -1: not yet counted
  const TpUnitShape& tp_unit_shape(int ui);

  // What a unit's sequence-parallel collectives copy on the compute stream in one direction
  // (RuntimeProfile::tp_sequence_collective_copy, tp_sequence_layout_copy_bytes), and in backward what async TP's
  // fused gathers leave for the weight gradients to copy (tp_async_gathered_layout_copy_bytes).
  double tp_layout_copy_bytes(int ui, bool backward);

  // A unit's tensor-parallel collectives in forward or backward, after its compute op `dep`, on the tensor-parallel
  // stream (which the compute stream waits for: timeline.cpp). Returns the last op pushed, or `dep`.
  int push_tp(int ui, int mbi, bool backward, int dep);
  // A unit's expert-parallel all-to-alls in one direction (expert_parallel.hpp) after op `dep`; returns the last op
  // pushed, or dep.
  int push_ep(int ui, int mbi, bool backward, int dep);

  // The head's tensor-parallel collectives (tensor_parallel.hpp tp_head_collectives) where the head runs: forward
  // before the head's GEMM (its input gathered), backward after the head's backward GEMM (its input gradient), as
  // fsdp-run and Megatron-LM issue them. Returns the last op pushed, or `dep`.
  int push_tp_head(int mbi, bool backward, int dep);

  int push_tp_list(const std::vector<TpCollective>& list, int ui, int mbi, bool backward, bool head, int dep);

  // The replicated norms' partial gradients of unit `ui` (LayerCost::tp_partial_grad_params) summed over the tp
  // group as the unit's backward hands them over, every micro-batch (RuntimeProfile::tp_norm_grad_sum_per_unit;
  // fsdp-run's ShardedModel sum_partial_grads, one all-reduce of the unit's norms in the compute dtype). Returns the
  // op, or `dep`.
  int push_tp_norm_grad_sum(int ui, int mbi, int dep);

  // A pipeline stage's point-to-point transfer of one micro-batch's activations (or their gradients): s x b x h in
  // the compute dtype, 1/tp of it with sequence parallelism (Korthikanti et al. 2022 sec. 4.2.3: the tensors between
  // stages are in sequence-parallel form), once per model chunk boundary of the rank. Across the boundary between
  // nanotron's head and loss stages (`logits`): the rank's bf16 logits, tokens x vocab / tp (llama.py @ 67c5ebb6:
  // lm_head's sharded_logits are the cast_to_fp32 PipelineBlock's input, sent by pipeline_parallel/functional.py
  // send_to_pipeline_state_buffer; their gradient comes back the same size).
  int push_pp(Phase phase, int mbi, int dep, bool logits = false);

  // A unit kept gathered after forward under the stage's pipeline schedule (pipeline_parallel.hpp).
  bool kept_gathered_in_forward(int mbi) const {
    const StepLayout& l = prog.layout;
    return pipeline_kept_unit_gathered_in_forward(l.pp_schedule, l.pp, l.stage, s.grad_accum, mbi);
  }
  bool kept_regathered_in_backward(int mbi) const {
    const StepLayout& l = prog.layout;
    return pipeline_kept_unit_regathered_in_backward(l.pp_schedule, l.pp, l.stage, s.grad_accum, mbi);
  }

  // Before a micro-batch's forward: a stage after the first receives its input.
  void pp_before_forward(int mbi);
  // Between forward and backward: the loss's stage computes the loss (and the head, where it holds it); the head's
  // stage before it computes the head and sends the logits; the others send their output and receive its gradient.
  void pp_turn(int mbi);
  // After a micro-batch's backward: a stage after the first sends its input's gradient back.
  void pp_after_backward(int mbi, int last_backward);

  // A unit's forward compute: GEMMs, attention, elementwise traffic; its saved activations allocated.
  // Into `f` as it is value-initialised: an op emplaced in the program, built in place (no copy of the op; the callers
  // push no other op before it is complete, so the reference stays valid).
  void fill_forward_op(Op& f, int ui, int mbi);

  // A unit's backward compute (recomputation included); frees the unit's activations when done.
  // Into `b` as it is value-initialised (an op emplaced in the program, or a template of a unit's per-layer ops).
  void fill_backward_op(Op& b, int ui, int mbi);

  // The head's GEMM and the loss, forward then backward: logits in the compute dtype, an fp32 copy when
  // the runtime upcasts, the log-probabilities kept for backward; in backward d(logprobs) and d(logits)
  // in the log-prob dtype, then the cast back to the compute dtype.
  // Bytes of the head's gradients allocated in the loss backward; the root's own backward allocates the
  // rest of its gradients with the same element size.
  double head_grad_bytes() const;

  void push_loss_ops(int mbi);
  // The loss as one fused linear cross-entropy (RuntimeProfile::loss_fused_linear): the head's GEMMs in its forward.
  void push_fused_linear_loss_ops(int mbi);

  // One of the head's ops on its own stage: the root unit's, `passes` of the head GEMM.
  static Op head_op(OpKind kind, Phase phase, int mbi, double passes);
  // A unit's post-backward work on the compute stream (its reshard, its gradient's copies), micro-batch `mbi`.
  static Op post_backward_op(int ui, int mbi);

  // The head's stage before the loss's (nanotron's compute-cost split, pipeline_parallel.hpp): the final norm and
  // the head GEMM (its saved input is the root's head_act), the bf16 logits sent to the loss's stage and their
  // gradient received back, then the head GEMM's backward. The logits live from the GEMM until their send is done:
  // SendTensorToPipelineBuffer (nanotron pipeline_parallel/functional.py @ 67c5ebb6) saves nothing for backward
  // (the head's autograd saves its input, not its output); the received gradient until the head's backward.
  void push_head_ops(int mbi);

  // Adapters outside the units (fsdp-run's LoRA): one replicated fp32 leaf with its gradient, kept for the run;
  // the optimizer's states are emitted with the step.
  void emit_adapter_state();
  void keep_adapter_grads(Op& loss_backward);
  // Their gradient summed over the world once, after the last micro-batch's backward (fsdp-run's
  // ShardedModel::backward), in the master dtype.
  void push_adapter_all_reduce(int mbi);

  // ---- the two families -------------------------------------------------------------------------

  void emit_sharded();
  void emit_replicated();
  void emit_optimizer();
  void emit_optimizer_step();
};

}  // namespace fsdp::step_emission
