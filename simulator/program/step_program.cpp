#include "program/step_program.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/errors.hpp"
#include "program/collective_wire.hpp"
#include "program/data_parallel.hpp"
#include "program/float8_linears.hpp"
#include "program/pipeline_parallel.hpp"
#include "program/root_module_costs.hpp"
#include "program/tensor_parallel.hpp"
#include "strategy/placement.hpp"

namespace fsdp {

Op make_collective_op(OpKind kind, Stream stream, int unit, int micro_batch, Phase phase, CollectiveKind collective,
                      GroupKind group) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.unit = unit;
  op.micro_batch = micro_batch;
  op.phase = phase;
  op.collective = collective;
  op.group = group;
  return op;
}

std::string op_label(const StepProgram& p, const Op& op) {
  std::string l = to_string(op.phase);
  if (op.unit >= 0 && static_cast<size_t>(op.unit) < p.units.size() &&
      (op.kind == OpKind::Gather || op.kind == OpKind::Forward || op.kind == OpKind::Backward ||
       op.kind == OpKind::Reshard || op.kind == OpKind::ReduceScatter || op.kind == OpKind::AllReduce ||
       op.kind == OpKind::ParamAllGather || op.kind == OpKind::TpCollective))
    l += " " + p.units[static_cast<size_t>(op.unit)].name;
  return l;
}

std::string op_phase(const StepProgram& p, const Op& op) {
  // The optimizer and what follows it belong to the step, not to a micro-batch.
  if (is_step_phase(op.phase)) return op_label(p, op);
  return op_label(p, op) + " (micro-batch " + std::to_string(op.micro_batch + 1) + ")";
}

ActivationQuery activation_query(const Strategy& s, const RuntimeProfile& rt) {
  ActivationQuery q;
  q.compute = s.param_dtype;
  q.attention = s.attention;
  q.seq_len = s.seq_len;
  // Replicated strategies run mixed precision through autocast over fp32 parameters: the residual
  // stream (embedding output + fp32 adds) stays fp32 (torch.autocast op lists: embedding and add are
  // not autocast to lower precision), unless the runtime casts the replica itself (RuntimeProfile::
  // replicated_residual_fp32).
  bool replicated = !shards_params(s.kind);
  q.autocast_fp32_residual =
      rt.replicated_residual_fp32 && replicated && s.param_dtype != DType::Fp32 && s.master_dtype == DType::Fp32;
  q.norm_fp32_internal = rt.norm_saves_fp32_input;
  q.softmax_fp32 = rt.eager_softmax_fp32;
  q.logits_upcast_fp32 = rt.logits_upcast_fp32;
  q.norm_mean_keeps_input = rt.norm_mean_keeps_input;
  q.pointwise_outputs_saved = rt.pointwise_outputs_saved;
  q.sac_keeps_unread_outputs = rt.sac_keeps_unread_outputs;
  if (s.method != Method::Full) {
    q.frozen_base = true;
    q.adapted = s.lora.target_modules;
    q.lora_rank = s.lora.rank;
  }
  return q;
}

bool sdpa_layer_masked(const ModelSpec& m, int64_t layer, int64_t seq_len) {
  const int64_t w = m.attention_window(layer);
  return w > 0 && seq_len >= w;
}

ActivationQuery activation_query(const Strategy& s, const RuntimeProfile& rt, SdpaKernel kernel) {
  ActivationQuery q = activation_query(s, rt);
  // SDPA's math backend is the composite softmax(q k^T / sqrt(d) + mask) v of eager ops, whose autograd saves what
  // eager attention's does (pytorch/pytorch aten/src/ATen/native/transformers/attention.cpp @
  // bc8cb28010a6b27e1817d38e1c1e0ac59b34477e, _scaled_dot_product_attention_math: matmul, softmax, dropout, matmul).
  if (s.attention == AttentionImpl::Sdpa && kernel == SdpaKernel::Math) q.attention = AttentionImpl::Eager;
  return q;
}

namespace {

// The training loop's scalar collectives carry one fp64 value (executor clip_grad_norm and the loss).
constexpr double kScalarBytes = 8.0;
// FlashAttention-2's backward is 2.5x its forward in FLOPs (arXiv 2307.08691 sec. 3.2: 5 GEMMs against 2).
constexpr double kAttentionBackwardRatio = 2.5;

double ceil_div(double a, double b) { return std::ceil(a / b); }

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
  // Per class of decoder layers (ModuleGraph::layer_classes), from its nodes; layer l's is
  // class_costs[layer_class[l]].
  std::vector<LayerCost> class_costs;
  std::vector<int32_t> layer_class;
  // Trainable parameters of the lm_head and the final norm: autograd produces their gradients in the
  // loss backward, long before the root unit's post-backward (the embedding's come last).
  double head_train = 0;
  std::vector<double> act_bytes;  // per unit, saved activations of one micro-batch
  // Per unit: its layers' memory-bound bytes, and their largest forward and backward working memory.
  std::vector<double> unit_elementwise, unit_elementwise_backward, unit_forward_transient, unit_backward_transient;
  std::vector<double> fwd_flops;        // per unit, matmul FLOPs per micro-batch
  std::vector<double> attn_flops;       // per unit
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
  void hold_stage_output(Op& op, int mbi, double bytes) {
    if (keeps_stage_outputs()) {
      const int64_t held_after = static_cast<int64_t>(mbi) + 1;
      op.on_issue.push_back({MemoryCategory::Activations, static_cast<double>(held_after - pp_outputs_held) * bytes});
      pp_outputs_freed_at_end += static_cast<double>(held_after - pp_outputs_held) * bytes;
      pp_outputs_held = held_after;
    } else {
      op.on_issue.push_back({MemoryCategory::Activations, bytes});
    }
  }
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
    return wire_bytes(padded(train_p[i]), train_bpe[i], GroupKind::Shard) +
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
  void setup(EmitMemo* memo) {
    q = activation_query(s, rt, sdpa_memory);
    tokens = static_cast<double>(s.micro_batch * s.seq_len);
    prog.layout.tokens_per_micro_batch = s.micro_batch * s.seq_len;
    pb = dtype_bytes(s.param_dtype);
    mb = dtype_bytes(s.master_dtype);
    rb = dtype_bytes(s.reduce_dtype);
    dp_plan = data_parallel_plan(s, rt, prog.layout.world);
    place = dp_plan.place;
    sharded = place.params_sharded;
    mixed = dp_plan.mixed;
    zero_layout = dp_plan.zero_layout;
    accum32 = dp_plan.fp32_grad_accumulator;
    sb = dtype_bytes(dp_plan.param_storage_dtype);
    gb = dtype_bytes(dp_plan.grad_buffer_dtype);
    wire = CollectiveWire{&prog.layout, fp32_collectives};
    dp.s = &s;
    dp.rt = &rt;
    dp.plan = &dp_plan;
    dp.layout = &prog.layout;
    dp.wire = wire;
    dp.pb = pb;
    dp.mb = mb;
    dp.rb = rb;
    dp.sb = sb;
    dp.gb = gb;
    dp.backend_gather_buffer = backend_gather_buffer;
    dp.host_params_are_compute_params = host_params_are_compute_params;
    // The strategy's units (from the memo where one is given: program/emit_memo.hpp), clipped to a pipeline stage's
    // layers.
    std::vector<WrapUnit> built;
    if (memo == nullptr) built = strategy_units(g, s);
    const std::vector<WrapUnit>& all_units = memo != nullptr ? memo->strategy_units(g, s) : built;
    const StepLayout& lay = prog.layout;
    if (lay.pp > 1) {
      prog.units =
          stage_units(g, all_units, StageLayers{lay.stage_first_layer, lay.stage_last_layer}, lay.stage, tail());
    } else if (memo != nullptr) {
      prog.units = all_units;
    } else {
      prog.units = std::move(built);
    }
    // LoRA (Hu et al. 2021, arXiv 2106.09685): rank-r adapters A (r x in) and B (out x r) on the target
    // linears, trainable; the base frozen in the compute dtype. QLoRA (Dettmers et al. 2023, arXiv
    // 2305.14314 sec. 3): the base linears in 4-bit NormalFloat with double-quantised constants,
    // 4 + 0.127 bits per parameter; embeddings and norms stay in the compute dtype.
    constexpr double kQLoraBytesPerParam = (4.0 + 0.127) / 8.0;
    // Every decoder layer's costs from its own nodes (program/layer_costs.hpp); a unit sums its layers'.
    LayerCostInput lin{&g, &s, &rt, q, tokens};
    // Layers of one structure cost the same under one checkpointing mode: each (class, mode) is derived once
    // (ModuleGraph::layer_classes; every:N gives a class's layers two modes, layer_ckpt). Shapes are the class's.
    // From the memo where an earlier program of the same inputs derived them (program/emit_memo.hpp).
    std::optional<EmitMemo::CostKey> memo_key;
    const EmitMemo::LayerClasses* known = nullptr;
    if (memo != nullptr) {
      memo->bind(g, rt);
      memo_key = EmitMemo::cost_key(q, s);
      known = memo->find(*memo_key);
    }
    if (known != nullptr) {
      class_costs = known->class_costs;
      layer_class = known->layer_class;
      prog.layer_shapes = known->layer_shapes;
      prog.layer_shape_of = known->layer_shape_of;
    }
    // Float8 tensorwise under tp gathers the column blocks' inputs in float8, and the linears save that gathered
    // float8 tensor (torchao Float8Linear saves its input as it receives it: float8_linear.py
    // matmul_with_hp_or_float8_args): one byte an element of what column_input_bytes_per_token counts in the compute
    // dtype.
    const double column_input_scale = s.float8 == Float8Recipe::Tensorwise ? kFloat8ElementBytes / pb : 1.0;
    std::vector<std::pair<int64_t, ActCkpt>> cost_keys;
    std::vector<int32_t> shape_of_class(g.layers().size(), -1);
    for (size_t l = 0; known == nullptr && l < g.layers().size(); ++l) {
      const int64_t cls = g.layer_classes()[l];
      const std::pair<int64_t, ActCkpt> key{cls, layer_ckpt(s, static_cast<int64_t>(l))};
      auto idx = static_cast<int32_t>(std::find(cost_keys.begin(), cost_keys.end(), key) - cost_keys.begin());
      if (static_cast<size_t>(idx) == cost_keys.size()) {
        cost_keys.push_back(key);
        class_costs.push_back(layer_cost(lin, g.layers()[l], key.second));
        // Tensor parallelism: what one rank of the tp group holds and computes of the layer.
        const ModuleId layer = g.layers()[l];
        if (s.mesh.tp > 1)
          shard_layer_for_tp(class_costs.back(), g, layer, tokens * norm_saved_bytes_per_token(g, layer, q),
                             tokens * column_input_bytes_per_token(g, layer, q) * column_input_scale,
                             tokens * moe_tp_whole_saved_bytes_per_token(g, layer, q), rt.sp_saves_column_input_shard,
                             s.mesh);
      }
      int32_t& shape = shape_of_class[static_cast<size_t>(cls)];
      if (shape < 0) {
        shape = static_cast<int32_t>(prog.layer_shapes.size());
        prog.layer_shapes.push_back(class_costs[static_cast<size_t>(idx)].shape);
      }
      layer_class.push_back(idx);
      prog.layer_shape_of.push_back(shape);
    }
    if (memo != nullptr && known == nullptr)
      memo->store(std::move(*memo_key),
                  EmitMemo::LayerClasses{class_costs, layer_class, prog.layer_shapes, prog.layer_shape_of});
    if (s.mesh.tp > 1) {
      // One tp rank's parameters of each unit: its layers' (shard_layer_for_tp), and of the model's other parts the
      // embedding and head 1/tp, the final norm whole.
      tp_unit_replicated_params.assign(prog.units.size(), 0.0);
      for (WrapUnit& u : prog.units) {
        double p = 0;
        for (const LayerCost* lc : costs_of(u)) {
          p += lc->params;
          tp_unit_replicated_params[static_cast<size_t>(&u - prog.units.data())] += lc->tp_partial_grad_params;
        }
        if (u.is_root)
          for (ModuleId c : g.children(g.root()))
            if (g.node(c).kind != ModuleKind::LayerStack && stage_holds(g, c, lay.stage, tail()))
              p += tp_root_module_params(g, c, s.mesh.tp);
        u.params = std::llround(p);
      }
    }
    if (s.method == Method::Full && holds_head())
      for (ModuleId c : g.children(g.root())) {
        const ModuleKind k = g.node(c).kind;
        if (k == ModuleKind::Head || k == ModuleKind::Norm) {
          head_train += tp_root_module_params(g, c, s.mesh.tp);
          // The root is unit 0 (wrap_units.hpp: root first).
          if (k == ModuleKind::Norm && s.mesh.tp > 1 && s.mesh.sequence_parallel)
            tp_unit_replicated_params[0] += static_cast<double>(g.params_under(c));
        }
      }
    // Per-unit vectors, sized once (the search emits thousands of programs).
    for (std::vector<double>* v :
         {&train_p, &train_bpe, &frozen_p, &frozen_bpe, &unit_elementwise, &unit_elementwise_backward,
          &unit_forward_transient, &unit_backward_transient, &act_bytes, &fwd_flops, &attn_flops, &recompute_bytes,
          &recompute_flops, &recompute_attn_flops, &recompute_elementwise, &unit_float8_cast,
          &unit_float8_cast_backward})
      v->reserve(prog.units.size());
    for (const auto& u : prog.units) {
      const double params = static_cast<double>(u.params);
      if (s.method == Method::Full) {
        train_p.push_back(params);
        double float8 = 0;
        if (s.float8_all_gather)
          for (const LayerCost* lc : costs_of(u)) float8 += lc->float8_params;
        train_bpe.push_back(params > 0 ? ((params - float8) * pb + float8 * kFloat8ElementBytes) / params : pb);
        frozen_p.push_back(0.0);
        frozen_bpe.push_back(pb);
        continue;
      }
      frozen_in_master = s.method == Method::Lora && rt.lora_base_in_master_dtype;
      double lora = 0, quantised = 0;
      for (const LayerCost* lc : costs_of(u)) {
        lora += lc->lora_params;
        quantised += lc->linear_params;
      }
      train_p.push_back(adapters_outside_units() ? 0.0 : lora);
      train_bpe.push_back(pb);
      if (adapters_outside_units()) adapters += lora;
      frozen_p.push_back(params);
      if (s.method == Method::QLora && params > 0) {
        frozen_bpe.push_back((quantised * kQLoraBytesPerParam + (params - quantised) * pb) / params);
      } else {
        frozen_bpe.push_back(pb);
      }
    }
    // Shapes for the compute cost model: the head's GEMM and the attention batch (per-layer shapes above).
    const ModelSpec& ms = g.spec();
    const int64_t toks = s.micro_batch * s.seq_len;
    // The head vocabulary-parallel: each tp rank computes its 1/tp of the logits.
    prog.head_gemm = GemmShape{toks, (ms.vocab_size + s.mesh.tp - 1) / s.mesh.tp, ms.hidden_size, 1.0};
    prog.tp_async_linears = s.mesh.tp > 1 && s.mesh.sequence_parallel && !s.mesh.async_tp && rt.tp_linear_async_overlap;
    if (!rt.host_issue.tensor_parallel_only || s.mesh.tp > 1) prog.host_issue = rt.host_issue;
    prog.attn_batch = s.micro_batch;
    prog.attn_seq = s.seq_len;
    const Float8WeightCastBytes f8_weight = float8_weight_cast_bytes_per_element(
        s.float8, s.float8_all_gather, static_cast<double>(prog.layout.shard_size));
    for (const auto& u : prog.units) {
      double act = 0, mm = 0, at = 0, rec = 0, first_saved = 0, rec_all = 0, ew = 0, ft = 0, bt = 0;
      double rec_mm = 0, rec_at = 0, rec_ew = 0, bew = 0, f8 = 0, f8_back = 0;
      bool first = true;
      for (const LayerCost* lc : costs_of(u)) {
        act += lc->saved_bytes;
        rec_all += lc->saved_bytes_unckpt;
        ew += tokens * lc->elementwise_bytes_per_token;
        bew += tokens * lc->elementwise_backward_bytes_per_token;
        ft = std::max(ft, lc->forward_transient);
        bt = std::max(bt, lc->backward_transient);
        mm += lc->matmul_flops_per_token;
        at += lc->attention_flops_per_token;
        rec_mm += lc->recompute_matmul_flops_per_token;
        rec_at += recomputes_attention(lc->ckpt) ? lc->attention_flops_per_token : 0.0;
        rec_ew += recomputes_layer_forward(lc->ckpt) ? tokens * lc->elementwise_bytes_per_token : 0.0;
        // Float8 linears cast their activations and weights every micro-batch, again where the layer's forward
        // reruns (float8_linears.hpp).
        const double f8_fwd = tokens * lc->float8_cast_bytes_per_token + lc->float8_params * f8_weight.forward;
        f8 += f8_fwd;
        f8_back += tokens * lc->float8_cast_backward_bytes_per_token + lc->float8_params * f8_weight.backward +
                   (recomputes_layer_forward(lc->ckpt) ? f8_fwd : 0.0);
        // A layer's region rematerialises its activations one layer at a time (the largest counts): under Full all
        // it saves without checkpointing; selective: only what the attention core did not save (Korthikanti et al.
        // 2022); selective-op: what the per-op policy did not cache (LayerCost::recompute_bytes).
        rec = std::max(rec, lc->recompute_bytes);
        if (first) first_saved = lc->saved_bytes;
        first = false;
      }
      if (unit_checkpoint_region() && u.num_layers() > 0) {
        // One region per unit: only the unit's input is kept, and backward rematerialises all its layers.
        act = first_saved;
        rec = rec_all;
      }
      if (u.is_root) {
        // Root modules: embedding, final norm, head, loss (activations of the head/loss handled by Loss ops).
        for (ModuleId c : g.children(g.root())) {
          ModuleKind k = g.node(c).kind;
          if (k == ModuleKind::LayerStack) continue;
          if (k == ModuleKind::Loss) continue;
          if (!stage_holds(g, c, prog.layout.stage, tail())) continue;
          // A vision tower's embeddings and projector run on their own tokens (ModuleGraph::token_ratio).
          const double r = g.token_ratio(c, s.seq_len);
          double c_mm = 0, c_at = 0;
          flops_of(c, c_mm, c_at);
          if (k == ModuleKind::Head) c_mm /= static_cast<double>(s.mesh.tp);  // vocabulary-parallel
          mm += r * c_mm;
          at += r * c_at;
          // The lookups' and the final norm's memory-bound kernels (program/root_module_costs.hpp).
          const RootModuleTraffic traffic = root_module_traffic(g, c, s, rt, q, r * tokens);
          ew += traffic.forward_bytes;
          bew += traffic.backward_bytes;
          // The head's logits are the Loss ops' business; its saved input (the final norm's output) is here.
          const double saved = r * tokens * g.saved_bytes_per_token(c, q, ActCkpt::None);
          act += saved;
          if (k == ModuleKind::Norm || k == ModuleKind::Head) head_act += saved;
        }
      }
      unit_elementwise.push_back(ew);
      unit_elementwise_backward.push_back(bew);
      unit_forward_transient.push_back(ft);
      unit_backward_transient.push_back(bt);
      act_bytes.push_back(act);
      fwd_flops.push_back(mm * tokens);
      attn_flops.push_back(at * tokens);
      recompute_bytes.push_back(rec);
      recompute_flops.push_back(rec_mm * tokens);
      recompute_attn_flops.push_back(rec_at * tokens);
      recompute_elementwise.push_back(rec_ew);
      unit_float8_cast.push_back(f8);
      unit_float8_cast_backward.push_back(f8_back);
    }
  }

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

  // The logits one rank computes: its vocabulary shard under tensor parallelism.
  double logits_elems() const {
    return tokens * std::ceil(static_cast<double>(g.spec().vocab_size) / static_cast<double>(s.mesh.tp));
  }
  double logprob_bytes() const { return tensor_bytes(TensorClass::LogProbs, q); }

  double train(int ui) const { return train_p[static_cast<size_t>(ui)]; }
  // Bytes of a unit's gathered (unsharded) parameters in compute form.
  double gathered_bytes(int ui) const {
    const size_t i = static_cast<size_t>(ui);
    return padded(train_p[i]) * train_bpe[i] + padded(frozen_p[i]) * frozen_bpe[i];
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
  const TpUnitShape& tp_unit_shape(int ui) {
    const size_t i = static_cast<size_t>(ui);
    if (tp_shapes.size() != prog.units.size()) {
      tp_shapes.assign(prog.units.size(), TpUnitShape{});
      tp_shape_known.assign(prog.units.size(), false);
      tp_forward.assign(prog.units.size(), {});
      tp_backward.assign(prog.units.size(), {});
    }
    if (tp_shape_known[i]) return tp_shapes[i];
    const WrapUnit& u = prog.units[i];
    TpUnitShape& shape = tp_shapes[i];
    shape.layers = u.num_layers();
    for (int64_t l = u.first_layer; l >= 0 && l <= u.last_layer; ++l) {
      const ActCkpt ckpt = layer_ckpt(s, l);
      shape.recomputed_layers += ckpt == ActCkpt::Full ? 1 : 0;
      shape.sac_op_layers += ckpt == ActCkpt::SelectiveOp ? 1 : 0;
      const auto cls = static_cast<size_t>(g.layer_classes()[static_cast<size_t>(l)]);
      if (class_single_linear_blocks.size() <= cls) class_single_linear_blocks.resize(cls + 1, -1);
      int64_t& blocks = class_single_linear_blocks[cls];
      if (blocks < 0) blocks = single_linear_blocks(g, g.layers()[static_cast<size_t>(l)]);
      shape.single_linear_blocks += blocks;
    }
    shape.embedding = u.is_root && prog.layout.first_stage();
    shape.head = u.is_root && holds_head();
    shape.activation_bytes = tokens * static_cast<double>(g.spec().hidden_size) * pb;
    shape.layer_gather_bytes = s.float8 == Float8Recipe::Tensorwise
                                   ? tokens * static_cast<double>(g.spec().hidden_size) * kFloat8ElementBytes
                                   : shape.activation_bytes;
    shape.column_inputs_regathered = s.mesh.sequence_parallel && rt.sp_saves_column_input_shard;
    shape.gathers_fuse = s.float8 != Float8Recipe::Rowwise;
    // The unit's own collectives, without the head's: those run with the head+loss ops (push_tp_head).
    TpUnitShape own = shape;
    own.head = false;
    tp_forward[i] = tp_forward_collectives(own, s.mesh);
    tp_backward[i] = tp_backward_collectives(own, s.mesh);
    if (shape.head) {
      tp_head_forward = tp_head_collectives(shape, s.mesh, false);
      tp_head_backward = tp_head_collectives(shape, s.mesh, true);
    }
    tp_shape_known[i] = true;
    return shape;
  }

  // What a unit's sequence-parallel collectives copy on the compute stream in one direction
  // (RuntimeProfile::tp_sequence_collective_copy, tp_sequence_layout_copy_bytes), and in backward what async TP's
  // fused gathers leave for the weight gradients to copy (tp_async_gathered_layout_copy_bytes).
  double tp_layout_copy_bytes(int ui, bool backward) {
    if (s.mesh.tp <= 1 || !rt.tp_sequence_collective_copy) return 0.0;
    const TpUnitShape& shape = tp_unit_shape(ui);
    const size_t i = static_cast<size_t>(ui);
    // The head's collectives' copies are charged to its unit's pass, as before they were emitted apart.
    const double head =
        shape.head ? tp_sequence_layout_copy_bytes(backward ? tp_head_backward : tp_head_forward, s.mesh) : 0.0;
    return tp_sequence_layout_copy_bytes(backward ? tp_backward[i] : tp_forward[i], s.mesh) + head +
           (backward ? tp_async_gathered_layout_copy_bytes(shape, s.mesh, s.micro_batch) : 0.0);
  }

  // A unit's tensor-parallel collectives in forward or backward, after its compute op `dep`, on the tensor-parallel
  // stream (which the compute stream waits for: timeline.cpp). Returns the last op pushed, or `dep`.
  int push_tp(int ui, int mbi, bool backward, int dep) {
    if (s.mesh.tp <= 1) return dep;
    tp_unit_shape(ui);
    const size_t i = static_cast<size_t>(ui);
    return push_tp_list(backward ? tp_backward[i] : tp_forward[i], ui, mbi, backward, false, dep);
  }

  // The head's tensor-parallel collectives (tensor_parallel.hpp tp_head_collectives) where the head runs: forward
  // before the head's GEMM (its input gathered), backward after the head's backward GEMM (its input gradient), as
  // fsdp-run and Megatron-LM issue them. Returns the last op pushed, or `dep`.
  int push_tp_head(int mbi, bool backward, int dep) {
    if (s.mesh.tp <= 1 || !holds_head()) return dep;
    constexpr int kRoot = 0;  // wrap_units.hpp: root first
    tp_unit_shape(kRoot);
    return push_tp_list(backward ? tp_head_backward : tp_head_forward, kRoot, mbi, backward, true, dep);
  }

  int push_tp_list(const std::vector<TpCollective>& list, int ui, int mbi, bool backward, bool head, int dep) {
    const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
    int last = dep;
    for (const TpCollective& c : list) {
      // Built in place (the op collective_op would return, field for field, without its copy): nothing below pushes
      // an op before `op` is complete, so the reference stays valid.
      Op& op = prog.ops.emplace_back();
      op.kind = OpKind::TpCollective;
      op.stream = Stream::TensorParallel;
      op.unit = ui;
      op.micro_batch = mbi;
      op.phase = backward ? Phase::TpBackwardCollectives : Phase::TpForwardCollectives;
      op.collective = c.kind;
      op.group = GroupKind::Tensor;
      op.comm_bytes = wire_bytes(c.bytes / pb, pb, GroupKind::Tensor);
      op.comm_dtype = wire_type(s.param_dtype, GroupKind::Tensor);
      op.comm_calls = c.calls;
      op.async_tp_fused_calls = c.fused_calls;
      op.tp_head = head;
      op.transient_bytes = c.gathered_bytes;
      // Each sequence-parallel reduce-scatter reads a full-sequence tensor its block frees right after: the row
      // linears' outputs in forward, the column linears' (and the head's) input gradients in backward, the
      // embedding's output (nanotron tensor_parallel/distributed_differentiable_primitives.py
      // _ReduceScatterSum.forward's input, functional.py _ColumnLinearAsyncCommunication.backward's grad_tensor @
      // 67c5ebb6); ProcessGroupNCCL records it on its stream (RuntimeProfile::collective_inputs_held_for_the_pass).
      if (c.kind == CollectiveKind::ReduceScatter && s.mesh.sequence_parallel)
        op.stream_recorded_bytes = static_cast<double>(c.calls) * c.bytes;
      // The layers whose GEMMs the collectives may overlap (timeline/tp_linear_overlap.hpp).
      op.first_layer = head ? -1 : u.first_layer;
      op.last_layer = head ? -1 : u.last_layer;
      if (last >= 0) op.deps.push_back(last);
      last = static_cast<int>(prog.ops.size()) - 1;
    }
    return last;
  }

  // The replicated norms' partial gradients of unit `ui` (LayerCost::tp_partial_grad_params) summed over the tp
  // group as the unit's backward hands them over, every micro-batch (RuntimeProfile::tp_norm_grad_sum_per_unit;
  // fsdp-run's ShardedModel sum_partial_grads, one all-reduce of the unit's norms in the compute dtype). Returns the
  // op, or `dep`.
  int push_tp_norm_grad_sum(int ui, int mbi, int dep) {
    if (s.mesh.tp <= 1 || !rt.tp_norm_grad_sum_per_unit) return dep;
    const double elems = tp_unit_replicated_params.empty() ? 0.0 : tp_unit_replicated_params[static_cast<size_t>(ui)];
    if (elems <= 0) return dep;
    Op a = collective_op(OpKind::TpCollective, Stream::TensorParallel, Phase::TpNormGradAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Tensor, wire_bytes(elems, pb, GroupKind::Tensor),
                         wire_type(s.param_dtype, GroupKind::Tensor), ui, mbi);
    if (dep >= 0) a.deps.push_back(dep);
    return push(a);
  }

  // A pipeline stage's point-to-point transfer of one micro-batch's activations (or their gradients): s x b x h in
  // the compute dtype, 1/tp of it with sequence parallelism (Korthikanti et al. 2022 sec. 4.2.3: the tensors between
  // stages are in sequence-parallel form), once per model chunk boundary of the rank. Across the boundary between
  // nanotron's head and loss stages (`logits`): the rank's bf16 logits, tokens x vocab / tp (llama.py @ 67c5ebb6:
  // lm_head's sharded_logits are the cast_to_fp32 PipelineBlock's input, sent by pipeline_parallel/functional.py
  // send_to_pipeline_state_buffer; their gradient comes back the same size).
  int push_pp(Phase phase, int mbi, int dep, bool logits = false) {
    const double elems = pp_transfer_elems(logits);
    Op op = collective_op(OpKind::PipelineTransfer, Stream::Pipeline, phase, CollectiveKind::SendRecv,
                          GroupKind::Pipeline, wire_bytes(elems, pb, GroupKind::Pipeline),
                          wire_type(s.param_dtype, GroupKind::Pipeline), -1, mbi);
    op.comm_calls = pipeline_transfers_per_micro_batch(s.mesh);
    // The other micro-batches in flight (the schedule's warm-up), held from the first emitted micro-batch's first
    // transfer to the last one's.
    const bool last_mb = mbi == static_cast<int>(s.grad_accum) - 1;
    if (pp_in_flight_bytes > 0 && !pp_in_flight_held && !last_mb) {
      op.on_issue.push_back({MemoryCategory::Activations, pp_in_flight_bytes});
      pp_in_flight_held = true;
    } else if (pp_in_flight_held && last_mb) {
      op.on_issue.push_back({MemoryCategory::Activations, -pp_in_flight_bytes});
      pp_in_flight_held = false;
    }
    if (dep >= 0) op.deps.push_back(dep);
    return push(op);
  }

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
  void pp_before_forward(int mbi) {
    if (prog.layout.pp > 1 && !prog.layout.first_stage())
      push_pp(Phase::PipelineRecvActivations, mbi, -1, receives_logits());
  }
  // Between forward and backward: the loss's stage computes the loss (and the head, where it holds it); the head's
  // stage before it computes the head and sends the logits; the others send their output and receive its gradient.
  void pp_turn(int mbi) {
    if (holds_loss()) {
      push_loss_ops(mbi);
      return;
    }
    if (holds_head()) {
      push_head_ops(mbi);
      return;
    }
    const int sent =
        push_pp(Phase::PipelineSendActivations, mbi, static_cast<int>(prog.ops.size()) - 1, sends_logits());
    const double output = pp_transfer_elems(sends_logits()) * pb;
    hold_stage_output(prog.ops[static_cast<size_t>(sent)], mbi, output);
    const int received = push_pp(Phase::PipelineRecvGradients, mbi, sent, sends_logits());
    // Its backward runs on the output: released then, unless the runtime keeps it to the step's end.
    if (!keeps_stage_outputs())
      prog.ops[static_cast<size_t>(received)].on_complete.push_back({MemoryCategory::Activations, -output});
  }
  // After a micro-batch's backward: a stage after the first sends its input's gradient back.
  void pp_after_backward(int mbi, int last_backward) {
    if (prog.layout.pp > 1 && !prog.layout.first_stage())
      push_pp(Phase::PipelineSendGradients, mbi, last_backward, receives_logits());
  }

  // A unit's forward compute: GEMMs, attention, elementwise traffic; its saved activations allocated.
  // Into `f` as it is value-initialised: an op emplaced in the program, built in place (no copy of the op; the callers
  // push no other op before it is complete, so the reference stays valid).
  void fill_forward_op(Op& f, int ui, int mbi) {
    const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
    f.kind = OpKind::Forward;
    f.unit = ui;
    f.micro_batch = mbi;
    f.phase = Phase::Forward;
    f.matmul_flops = fwd_flops[static_cast<size_t>(ui)];
    f.attention_flops = attn_flops[static_cast<size_t>(ui)];
    f.layers = static_cast<double>(u.num_layers());
    f.first_layer = u.first_layer;
    f.last_layer = u.last_layer;
    f.gemm_passes = 1;
    f.attn_fwd_passes = 1;
    f.on_issue.push_back({MemoryCategory::Activations, act_bytes[static_cast<size_t>(ui)]});
    f.transient_bytes = forward_transient(u);
    f.elementwise_bytes = unit_elementwise_bytes(u);
    f.float8_cast_bytes = unit_float8_cast[static_cast<size_t>(ui)];
    f.device_copy_bytes = tp_layout_copy_bytes(ui, false);
  }

  // A unit's backward compute (recomputation included); frees the unit's activations when done.
  // Into `b` as it is value-initialised (an op emplaced in the program, or a template of a unit's per-layer ops).
  void fill_backward_op(Op& b, int ui, int mbi) {
    const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
    b.kind = OpKind::Backward;
    b.unit = ui;
    b.micro_batch = mbi;
    b.phase = Phase::Backward;
    const size_t i = static_cast<size_t>(ui);
    // Backward = 2x forward GEMM FLOPs (input and weight gradients), plus what its layers' modes recompute.
    b.matmul_flops = fwd_flops[i] * 2.0 + recompute_flops[i];
    b.layers = static_cast<double>(u.num_layers());
    b.first_layer = u.first_layer;
    b.last_layer = u.last_layer;
    // A frozen base needs input gradients only: one GEMM per linear instead of two (LoRA's own GEMMs
    // are rank-r and negligible). The recomputed GEMMs and attention forward are priced layer by layer under
    // each layer's mode (timeline/op_cost.cpp, layer_ckpt).
    b.gemm_passes = s.method == Method::Full ? 2.0 : 1.0;
    b.attn_fwd_passes = 0;
    b.attn_bwd_passes = 1;
    // FlashAttention-2 backward is 2.5x its forward (arXiv 2307.08691 sec. 3.2: 5 vs 2 GEMMs); selective
    // and full checkpointing also recompute the attention forward.
    b.attention_flops = attn_flops[i] * kAttentionBackwardRatio + recompute_attn_flops[i];
    b.transient_bytes = backward_transient(i);
    // Backward elementwise kernels read the saved inputs and the incoming gradient and write the
    // outgoing one: twice the forward traffic (LayerCost::elementwise_backward_bytes_per_token); plus a forward's
    // worth where the layer's forward runs again.
    b.elementwise_bytes = unit_elementwise_backward[i] + recompute_elementwise[i];
    b.float8_cast_bytes = unit_float8_cast_backward[i];
    b.device_copy_bytes = tp_layout_copy_bytes(ui, true);
    b.on_complete.push_back(
        {MemoryCategory::Activations, -(act_bytes[static_cast<size_t>(ui)] - (ui == 0 ? head_act : 0.0))});
  }

  // The head's GEMM and the loss, forward then backward: logits in the compute dtype, an fp32 copy when
  // the runtime upcasts, the log-probabilities kept for backward; in backward d(logprobs) and d(logits)
  // in the log-prob dtype, then the cast back to the compute dtype.
  // Bytes of the head's gradients allocated in the loss backward; the root's own backward allocates the
  // rest of its gradients with the same element size.
  double head_grad_bytes() const {
    // Only where they are separate per-parameter tensors until the root's post-backward, not views into a persistent
    // buffer; autograd's, in the compute dtype: FSDP2's unsharded .grad, fsdp-run's UnitParamsFn inputs (its ZeRO-2
    // too: executor/shard/sharded_model.cpp post_backward copies them into a flat buffer after the root's backward).
    if (!sharded && !rt.replicated_grads_via_flat_copy) return 0.0;
    return head_train * pb;
  }

  void push_loss_ops(int mbi) {
    const double logits = logits_elems() * pb;
    // The upcast (HF modeling_llama.py `logits.float()`; executor head_loss `.to(kFloat)`) copies only
    // when the logits are not already fp32.
    const bool upcasts = rt.logits_upcast_fp32 && pb < 4.0;
    const double upcast = upcasts ? logits_elems() * 4.0 : 0.0;
    const double logprobs = logits_elems() * logprob_bytes();
    Op l;
    l.kind = OpKind::Loss;
    l.phase = Phase::HeadLossForward;
    l.micro_batch = mbi;
    l.unit = 0;
    // A caller that keeps the logits (Hugging Face returns them in CausalLMOutputWithPast) holds them
    // through the loss and its backward; otherwise the compute-dtype logits are gone once upcast
    // (fsdp-run's head_loss), and the peak is the fp32 logits beside the log-probabilities. A pipeline schedule that
    // computes the loss on the stage's output holds them itself (hold_stage_output, below), whoever else does.
    const bool schedule_keeps = loss_stage_outputs_logits();
    const bool caller_keeps = rt.logits_kept_by_caller && !schedule_keeps;
    l.transient_bytes = schedule_keeps ? upcast : caller_keeps ? logits + upcast : (upcasts ? upcast : logits);
    l.on_issue.push_back({MemoryCategory::Activations, logprobs});
    l.elementwise_bytes = logits + upcast + logprobs;
    // Megatron's vocabulary-parallel cross-entropy as eager kernels (RuntimeProfile::loss_vocab_parallel_kernels;
    // huggingface/nanotron src/nanotron/parallel/tensor_parallel/functional.py _ShardedCrossEntropy.forward @
    // 67c5ebb6a925cb47026b22013af8bd1bb6c46d93), over the logits in the loss's dtype (fp32 once upcast): after the
    // upcast (read the logits, write the copy), torch.max reads them (1), the subtraction of the max writes a new
    // tensor (r/w: 2), torch.exp(out=) rewrites it in place (2), .sum reads it (1), div_ normalises it in place (2):
    // 8 passes. The target gathers and the all-reduces' buffers are one element per token.
    const double loss_elems_bytes = logits_elems() * (upcasts ? 4.0 : pb);
    if (rt.loss_vocab_parallel_kernels) l.elementwise_bytes = logits + upcast + 8.0 * loss_elems_bytes;
    // The head's GEMM where this stage holds it (not on nanotron's loss stage after the head's: push_head_ops).
    l.head_passes = holds_head() ? 1 : 0;
    // A compiled loss (RuntimeProfile::loss_compiled): one pass over the compute-dtype logits, which it saves for its
    // backward in place of the log-probabilities; no fp32 copy.
    const bool compiled = rt.loss_compiled && s.mesh.tp == 1;
    if (compiled) {
      l.transient_bytes = 0;
      l.on_issue = {};
      // The logits it saves are the stage's output where the schedule computes the loss on it (below): counted there.
      if (!schedule_keeps) l.on_issue.push_back({MemoryCategory::Activations, logits});
      l.elementwise_bytes = logits;
    }
    // A schedule that computes the loss on the stage's output (torch.distributed.pipelining) holds the logits to this
    // micro-batch's backward, or to the step's end.
    if (schedule_keeps) hold_stage_output(l, mbi, logits);
    push_tp_head(mbi, false, -1);
    const int lop = push(l);
    if (s.mesh.tp > 1) {
      // Vocabulary-parallel cross-entropy (tensor_parallel.hpp): its all-reduces over the tp group.
      int dep = lop;
      for (const TpCollective& c : tp_loss_collectives(tokens, rt.tp_loss_all_reduces_fused)) {
        Op a = collective_op(OpKind::TpCollective, Stream::TensorParallel, Phase::TpLossAllReduce, c.kind,
                             GroupKind::Tensor, c.bytes, WireType::Fp32, -1, mbi);
        a.comm_calls = c.calls;
        a.deps.push_back(dep);
        dep = push(a);
      }
    }
    Op lb;
    lb.kind = OpKind::LossBackward;
    lb.phase = Phase::LossBackward;
    lb.micro_batch = mbi;
    lb.unit = 0;
    // The gradients of the log-probabilities and of the (fp32) logits, beside the saved log-probabilities.
    lb.transient_bytes = logprobs * 2.0 + (caller_keeps ? logits : 0.0);
    // In place (RuntimeProfile::loss_backward_in_place): the saved probabilities become the fp32 logits' gradient;
    // only the upcast's backward allocates, the compute-dtype gradient of the logits.
    if (rt.loss_backward_in_place) lb.transient_bytes = (upcasts ? logits : 0.0) + (caller_keeps ? logits : 0.0);
    // A vocabulary-parallel loss whose backward copies the saved probabilities into the logits' gradient
    // (RuntimeProfile::tp_loss_backward_copies_probabilities): the copy beside them; the upcast's backward runs after
    // they are released, its compute-dtype gradient beside the fp32 one (less than the copy and the probabilities).
    else if (s.mesh.tp > 1 && rt.tp_loss_backward_copies_probabilities)
      lb.transient_bytes = logprobs + (caller_keeps ? logits : 0.0);
    const double saved = compiled ? (schedule_keeps ? 0.0 : logits) : logprobs;
    lb.on_complete.push_back({MemoryCategory::Activations, -(saved + head_act)});
    if (schedule_keeps && !keeps_stage_outputs()) lb.on_complete.push_back({MemoryCategory::Activations, -logits});
    // The head's weight gradient comes out of the head GEMM's backward, after the logits' gradients
    // (the peak of this op) are released.
    lb.on_complete.push_back({MemoryCategory::UnshardedGrads, head_grad_bytes()});
    if (mbi == 0) keep_adapter_grads(lb);
    lb.elementwise_bytes = lb.transient_bytes + logprobs;
    // _ShardedCrossEntropy.backward (functional.py above): the target's subtraction is one element per token and
    // grad_input.mul_(grad_output) rewrites the saved probabilities in place (2 passes); the upcast's backward casts
    // that gradient back to the compute dtype (read it, write the logits' gradient).
    if (rt.loss_vocab_parallel_kernels)
      lb.elementwise_bytes = 2.0 * loss_elems_bytes + (upcasts ? upcast + logits : 0.0);
    // Compiled: one kernel reads the saved logits and writes their gradient in the compute dtype, beside them.
    if (compiled) {
      lb.transient_bytes = logits;
      lb.elementwise_bytes = 2.0 * logits;
    }
    lb.head_passes = holds_head() ? 2 : 0;
    push_tp_head(mbi, true, push(lb));
  }

  // One of the head's ops on its own stage: the root unit's, `passes` of the head GEMM.
  static Op head_op(OpKind kind, Phase phase, int mbi, double passes) {
    Op op;
    op.kind = kind;
    op.phase = phase;
    op.micro_batch = mbi;
    op.unit = 0;
    op.head_passes = passes;
    return op;
  }
  // A unit's post-backward work on the compute stream (its reshard, its gradient's copies), micro-batch `mbi`.
  static Op post_backward_op(int ui, int mbi) {
    Op op;
    op.kind = OpKind::Reshard;
    op.unit = ui;
    op.micro_batch = mbi;
    op.phase = Phase::PostBackward;
    return op;
  }

  // The head's stage before the loss's (nanotron's compute-cost split, pipeline_parallel.hpp): the final norm and
  // the head GEMM (its saved input is the root's head_act), the bf16 logits sent to the loss's stage and their
  // gradient received back, then the head GEMM's backward. The logits live from the GEMM until their send is done:
  // SendTensorToPipelineBuffer (nanotron pipeline_parallel/functional.py @ 67c5ebb6) saves nothing for backward
  // (the head's autograd saves its input, not its output); the received gradient until the head's backward.
  void push_head_ops(int mbi) {
    const double logits = logits_elems() * pb;
    Op h = head_op(OpKind::Loss, Phase::HeadLossForward, mbi, 1);
    h.on_issue.push_back({MemoryCategory::Activations, logits});
    push_tp_head(mbi, false, -1);
    const int hop = push(h);
    const int sent = push_pp(Phase::PipelineSendActivations, mbi, hop, true);
    prog.ops[static_cast<size_t>(sent)].on_complete.push_back({MemoryCategory::Activations, -logits});
    const int grad = push_pp(Phase::PipelineRecvGradients, mbi, sent, true);
    prog.ops[static_cast<size_t>(grad)].on_issue.push_back({MemoryCategory::Activations, logits});
    Op hb = head_op(OpKind::LossBackward, Phase::LossBackward, mbi, 2);
    hb.deps.push_back(grad);
    // The logits' gradient and the head's saved input released; the head's weight gradient allocated.
    hb.on_complete.push_back({MemoryCategory::Activations, -(logits + head_act)});
    hb.on_complete.push_back({MemoryCategory::UnshardedGrads, head_grad_bytes()});
    if (mbi == 0) keep_adapter_grads(hb);
    push_tp_head(mbi, true, push(hb));
  }

  // Adapters outside the units (fsdp-run's LoRA): one replicated fp32 leaf with its gradient, kept for the run;
  // the optimizer's states are emitted with the step.
  void emit_adapter_state() {
    if (!adapters_outside_units()) return;
    prog.persistent.push_back({MemoryCategory::ShardedParams, adapters * mb});
  }
  void keep_adapter_grads(Op& loss_backward) {
    if (adapters_outside_units()) keep_grads(loss_backward, MemoryCategory::UnshardedGrads, adapters * mb);
  }
  // Their gradient summed over the world once, after the last micro-batch's backward (fsdp-run's
  // ShardedModel::backward), in the master dtype.
  void push_adapter_all_reduce(int mbi) {
    if (!adapters_outside_units() || prog.layout.world <= 1) return;
    Op a = collective_op(OpKind::AllReduce, Stream::ReduceScatter, Phase::AdapterAllReduce, CollectiveKind::AllReduce,
                         GroupKind::World, wire_bytes(adapters, mb, GroupKind::World),
                         wire_type(s.master_dtype, GroupKind::World), -1, mbi);
    a.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
    push(a);
  }

  // ---- the two families -------------------------------------------------------------------------

  void emit_sharded();
  void emit_replicated();
  void emit_optimizer();
  void emit_optimizer_step();
};

void Emitter::emit_sharded() {
  emit_adapter_state();
  const int n = static_cast<int>(prog.units.size());
  const bool offload_params = s.offload == Offload::Params;
  const int K = static_cast<int>(s.grad_accum);
  const int Kemit = static_cast<int>(prog.layout.micro_batches_emitted);
  const bool hsdp = place.replica_all_reduce;
  // grad_sync last-micro-batch (FSDP1 no_sync, FSDP2 set_requires_gradient_sync(False)): the post-backward of a
  // micro-batch before the last keeps the unit's unsharded gradient (the first) or adds this micro-batch's into it
  // and frees it (the others); the last adds its own and reduce-scatters the sum. The sharded gradient appears with
  // that one reduce-scatter.
  const bool accumulate_unsharded = !dp_plan.reduces_every_micro_batch && K > 1;
  const int first_reduced_mb = accumulate_unsharded ? K - 1 : 0;
  // The kept gradient's bytes per element: the compute dtype's, or the reduce dtype's where the runtime upcasts it
  // (RuntimeProfile::unsynced_grads_in_reduce_dtype; FSDP2 only when the reduce dtype differs from the compute dtype).
  const bool kept_in_reduce_dtype =
      accumulate_unsharded && rt.unsynced_grads_in_reduce_dtype && s.reduce_dtype != s.param_dtype;
  const double kb = kept_in_reduce_dtype ? rb : pb;
  // Persistent: parameter shards in the master dtype (FSDP2 keeps the sharded fp32 parameter and casts
  // at all-gather: torch/distributed/fsdp/_fully_shard/_fsdp_param.py), unless offloaded.
  if (!offload_params) {
    // ZeRO-Offload keeps the compute-dtype parameter shard on the GPU; masters live on the host.
    const double bpe = s.offload == Offload::Optimizer ? pb : sb;
    double bytes = 0;
    for (int ui = 0; ui < n; ++ui) bytes += shard_bytes(ui, bpe);
    prog.persistent.push_back({MemoryCategory::ShardedParams, bytes});
  }
  std::vector<int> last_rs(static_cast<size_t>(n), -1);
  // A runtime whose pipeline schedule keeps the stage's units unsharded from their first gather to the step's last
  // backward (RuntimeProfile::pipeline_keeps_units_gathered): no backward reshards before the last, so a unit kept
  // after forward is gathered once a step, and one resharded after forward is gathered by a forward that follows a
  // forward and by a backward that follows a forward, and found unsharded otherwise (FSDP2's unshard is a no-op on
  // an unsharded group). `held`: the walk holds the unit's parameters from the previous micro-batch's backward.
  const bool keeps_gathered =
      rt.pipeline_keeps_units_gathered && pipeline_orders_passes(prog.layout.pp_schedule, prog.layout.pp);
  std::vector<bool> held(static_cast<size_t>(n), false);
  for (int rep = 0; rep < Kemit; ++rep) {
    const int mbi = rep == Kemit - 1 ? K - 1 : rep;
    std::vector<int> gather_op(static_cast<size_t>(n), -1);
    std::vector<bool> gathered(static_cast<size_t>(n), false);
    std::vector<bool> regathered(static_cast<size_t>(n), false);  // gathered again for backward
    auto gather = [&](int ui, bool backward) {
      // A unit the schedule left resident since an earlier pass (kept_regathered_in_backward): its parameters are
      // in the walk already, from this micro-batch's forward; the gather moves them again.
      const bool resident = gathered[static_cast<size_t>(ui)];
      if (backward) regathered[static_cast<size_t>(ui)] = true;
      UnitGather ug;
      ug.unit = ui;
      ug.micro_batch = mbi;
      ug.backward = backward;
      ug.cast_elems = cast_elems(ui);
      ug.gathered_bytes = gathered_bytes(ui);
      ug.wire_bytes = gathered_wire_bytes(ui);
      ug.host_shard_bytes = offload_params ? shard_bytes(ui, mb) : 0.0;
      ug.params_resident = resident;
      Op op = dp_param_gather_op(dp, ug);
      // The prefetch window: a gather is issued from the pre-forward (pre-backward) hook, so it cannot
      // start before the compute issued just before it has run; this bounds gathers in flight as FSDP's
      // rate limiter does (FSDP1 limit_all_gathers; FSDP2 issues the next unit's all-gather in the
      // current unit's pre-forward/pre-backward hook).
      for (size_t k = prog.ops.size(); k-- > 0;)
        if (prog.ops[k].stream == Stream::Compute && prog.ops[k].kind != OpKind::Reshard) {
          op.deps.push_back(static_cast<int>(k));
          break;
        }
      gathered[static_cast<size_t>(ui)] = true;
      gather_op[static_cast<size_t>(ui)] = push(op);
    };
    // A memory-only op on the compute stream: the unit's gathered parameters released (its reshard) or, for a unit
    // the schedule left gathered since an earlier pass, counted as resident without a gather (resident, below).
    auto set_resident = [&](int ui, bool on, Phase phase) {
      Op& op = prog.ops.emplace_back();  // in place: nothing pushes another op before it is complete
      op.kind = OpKind::Reshard;
      op.stream = Stream::Compute;
      op.unit = ui;
      op.micro_batch = mbi;
      op.phase = phase;
      op.on_issue.push_back({MemoryCategory::UnshardedParams, on ? gathered_bytes(ui) : -gathered_bytes(ui)});
      gathered[static_cast<size_t>(ui)] = on;
      if (on) gather_op[static_cast<size_t>(ui)] = static_cast<int>(prog.ops.size()) - 1;
    };
    auto reshard = [&](int ui) { set_resident(ui, false, Phase::Free); };
    auto keep_after_forward = [&](int ui) {
      const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
      // The last layer unit is the first the backward gathers: a runtime that keeps it (torchtitan) saves that
      // gather and holds its parameters through the loss (runtime profile last_unit_reshard_after_forward).
      if (!u.is_root && ui == n - 1 && !rt.last_unit_reshard_after_forward) return true;
      return !unit_placement(s, u.is_root, rt.root_reshard_after_forward).reshard_after_forward;
    };
    // A unit kept after forward is gathered where the stage's pipeline schedule leaves it resharded (the forward
    // of the first micro-batch, or one after a backward); else it is still resident from the previous forward, and
    // a backward after a backward gathers it again (kept_gathered_in_forward, kept_regathered_in_backward).
    auto resident = [&](int ui, Phase phase) { set_resident(ui, true, phase); };
    auto gather_forward = [&](int ui) {
      const size_t i = static_cast<size_t>(ui);
      if (gathered[i]) return;
      if (held[i]) {  // the walk holds it since the previous micro-batch's backward (keeps_gathered)
        held[i] = false;
        gathered[i] = true;
        gather_op[i] = -1;
        // Resharded by the forward before it in the schedule: gathered again (nothing added to the walk).
        if (!keep_after_forward(ui) && !kept_gathered_in_forward(mbi)) gather(ui, false);
        return;
      }
      if (!keeps_gathered && !kept_gathered_in_forward(mbi) && keep_after_forward(ui)) {
        resident(ui, Phase::FwdAllGather);
      } else {
        gather(ui, false);
      }
    };
    auto gather_backward = [&](int ui) {
      const size_t i = static_cast<size_t>(ui);
      if (keeps_gathered) {
        if (gathered[i]) return;
        // Resharded after this micro-batch's forward; a backward before this one (the schedule's) left it unsharded.
        if (kept_regathered_in_backward(mbi)) {
          resident(ui, Phase::BwdAllGather);
        } else {
          gather(ui, true);
        }
        return;
      }
      if (!gathered[i] || (kept_regathered_in_backward(mbi) && !regathered[i] && keep_after_forward(ui)))
        gather(ui, true);
    };
    // A unit's post-backward `post` (its reshard, and its accumulation where it had one) completed by the copy-in and
    // the reduce-scatter of its gradient, issued now; `norm_sum`: with the tensor-parallel norm gradients' sum.
    int last_reduction = -1;
    auto reduce_unit = [&](Op post, int ui, bool norm_sum) {
      const double full = padded(train(ui));
      const double full_bytes = gathered_bytes(ui);
      const double rs_input = (rt.grads_in_reduce_dtype_before_reduce || rb != pb) ? full * rb : 0.0;
      post.on_issue.push_back({MemoryCategory::CommBuffers, rs_input});
      post.device_copy_bytes += rs_input > 0 ? full * kb + rs_input : 0.0;
      if (rs_input > 0) post.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * kb});
      // The unit's reduce-scatter (data_parallel.hpp); the first reduced micro-batch's allocates the sharded gradient.
      const std::optional<MemEvent> kept =
          mbi == first_reduced_mb ? kept_grads(MemoryCategory::ShardedGrads, shard(train(ui)) * gb) : std::nullopt;
      Op r = dp_reduce_scatter_op(dp, ui, mbi, full, train(ui), rs_input, kept);
      // Issued while the per-parameter gradients are still held (RuntimeProfile::unit_grads_held_through_reduce_issue):
      // its output and staging beside them for a moment, after the unit's parameters were resharded (fsdp-run's
      // hook reshards between the copy-in and the issue), so only what exceeds them raises the post-backward's peak.
      if (rt.unit_grads_held_through_reduce_issue) {
        double issued = 0;
        for (const MemEvent& e : r.on_issue)
          if (e.category == MemoryCategory::CommBuffers) issued += e.bytes;
        const double resharded = held[static_cast<size_t>(ui)] ? 0.0 : full_bytes;
        post.transient_bytes = std::max(post.transient_bytes, issued - resharded);
      }
      int pop = push(post);
      if (norm_sum) push_tp_norm_grad_sum(ui, mbi, pop);
      // The previous unit's replica all-reduce is issued here, when this post-backward waits for that unit's
      // reduce-scatter (fsdp-run's ShardedModel wait_pending; one reduction step in flight).
      if (deferred_replica.kind == OpKind::AllReduce) {
        deferred_replica.deps.push_back(pop);
        last_rs[static_cast<size_t>(deferred_replica.unit)] = last_reduction = push(deferred_replica);
        deferred_replica = Op{};
      }
      r.deps.push_back(pop);
      int rop = push(r);
      last_reduction = rop;
      last_rs[static_cast<size_t>(ui)] = rop;
      if (hsdp && mbi == K - 1 && prog.layout.replicas > 1) {
        // HSDP: the accumulated gradient shard summed over the replicas (data_parallel.hpp) once the reduce-scatter
        // has landed: issued at the next unit's post-backward, or at the end of the backward for the last unit.
        Op a = dp_replica_all_reduce_op(dp, ui, mbi, shard(train(ui)));
        a.deps.push_back(rop);
        deferred_replica = a;
      }
      if (s.offload != Offload::None && mbi == K - 1) {
        // ZeRO-Offload copies each gradient partition to the host as soon as it is reduced, overlapping
        // the rest of the backward (Ren et al. 2021, arXiv 2101.06840 sec. 4.2).
        Op d;
        d.kind = OpKind::CopyToHost;
        d.stream = Stream::DeviceToHost;
        d.unit = ui;
        d.micro_batch = mbi;
        d.phase = Phase::GradientsToHost;
        d.copy_bytes = shard(train(ui)) * rb;
        d.deps.push_back(rop);
        push(d);
        grads_copied_per_unit = true;
      }
    };
    const bool defer_reduction = dp_plan.reduces_after_stage_backward && mbi == K - 1;
    std::vector<int> reduced_after_backward;
    // ---- forward ----
    pp_before_forward(mbi);
    int last_bwd = -1;
    for (int ui = 0; ui < n; ++ui) {
      gather_forward(ui);
      for (int ahead = 1; ahead <= s.forward_prefetch && ui + ahead < n; ++ahead) gather_forward(ui + ahead);
      // Built in place (forward_op's op, field for field, without its copy): nothing pushes an op before it is
      // complete, so the reference stays valid.
      Op& f = prog.ops.emplace_back();
      fill_forward_op(f, ui, mbi);
      if (gather_op[static_cast<size_t>(ui)] >= 0) f.deps.push_back(gather_op[static_cast<size_t>(ui)]);
      // FSDP2's copy-out of the gathered flat buffer into per-parameter tensors runs on the compute
      // stream when the unit's gather is waited for (_fsdp_param_group.py wait_for_unshard).
      if (rt.allgather_copy_out) f.device_copy_bytes += 2.0 * gathered_bytes(ui);
      push_tp(ui, mbi, false, static_cast<int>(prog.ops.size()) - 1);
      if (!keep_after_forward(ui)) reshard(ui);
    }
    pp_turn(mbi);
    // ---- backward (reverse unit order; the root's embedding backward comes last) ----
    std::vector<int> order;
    for (int ui = n - 1; ui >= 1; --ui) order.push_back(ui);
    order.push_back(0);
    // Adapters outside the units: a frozen unit has no post-backward hook; its gathered base is freed at the
    // next unit's pre-backward (fsdp-run's ShardedModel::pre_backward), the last one's when the backward ends.
    int free_late = -1;
    for (size_t oi = 0; oi < order.size(); ++oi) {
      int ui = order[oi];
      if (free_late >= 0) {
        reshard(free_late);
        free_late = -1;
      }
      gather_backward(ui);
      for (int ahead = 1; ahead <= s.backward_prefetch && oi + static_cast<size_t>(ahead) < order.size(); ++ahead)
        gather_backward(order[oi + static_cast<size_t>(ahead)]);
      const double full = padded(train(ui));  // gradient elements of the unit
      const double full_bytes = gathered_bytes(ui);
      const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
      const int64_t nl = u.num_layers();
      // A unit of one layer: its backward op built in place (as fill_forward_op says); of several: a template of its
      // per-layer ops, pushed below.
      std::optional<Op> layered;
      if (nl > 1) layered.emplace();
      Op& b = nl <= 1 ? prog.ops.emplace_back() : *layered;
      fill_backward_op(b, ui, mbi);
      if (gather_op[static_cast<size_t>(ui)] >= 0) b.deps.push_back(gather_op[static_cast<size_t>(ui)]);
      if (rt.allgather_copy_out && regathered[static_cast<size_t>(ui)]) b.device_copy_bytes += 2.0 * full_bytes;
      int bop = -1;
      const double head = ui == 0 ? head_grad_bytes() : 0.0;  // allocated in the loss backward
      if (nl <= 1) {
        b.on_complete.push_back({MemoryCategory::UnshardedGrads, full * pb - head});
        bop = static_cast<int>(prog.ops.size()) - 1;
      } else {
        // A unit of several layers: autograd walks its layers in reverse, allocating each layer's
        // parameter gradients and releasing its activations as it goes, so the unit's gradients and
        // activations are never all alive at once. One op per layer; the unit's own non-layer
        // parameters (root: the embeddings; the head's came in the loss backward) get their gradients
        // after the last, when the embedding backward runs.
        const LayerCosts layers = costs_of(u);
        auto layer_train = [&](const LayerCost& lc) {
          if (adapters_outside_units()) return 0.0;
          return s.method == Method::Full ? lc.params : lc.lora_params;
        };
        double trained = 0, mm_sum = 0, at_sum = 0, ew_sum = 0, saved_sum = 0;
        for (const LayerCost* lc : layers) {
          trained += layer_train(*lc);
          mm_sum += backward_gemm_weight(*lc);
          at_sum += backward_attention_weight(*lc);
          ew_sum += backward_elementwise_weight(*lc);
          saved_sum += lc->saved_bytes;
        }
        auto share = [](double part, double whole) { return whole > 0 ? part / whole : 0.0; };
        const double own = full - trained;  // non-layer params and padding
        const double act_total = act_bytes[static_cast<size_t>(ui)] - (ui == 0 ? head_act : 0.0);
        double rematerialised = 0;  // of a unit-wide checkpoint region, by the layers already walked
        for (int64_t i = 0; i < nl; ++i) {
          const LayerCost& lc = *layers[static_cast<size_t>(nl - 1 - i)];
          Op part = b;
          part.matmul_flops *= share(backward_gemm_weight(lc), mm_sum);
          part.attention_flops *= share(backward_attention_weight(lc), at_sum);
          const double elementwise_share = share(backward_elementwise_weight(lc), ew_sum);
          part.elementwise_bytes *= elementwise_share;
          part.float8_cast_bytes *= elementwise_share;
          part.device_copy_bytes *= elementwise_share;
          part.layers = 1;
          part.first_layer = part.last_layer = u.last_layer - i;
          part.on_issue = {};
          part.on_complete = {};
          part.on_complete.push_back({MemoryCategory::UnshardedGrads, layer_train(lc) * pb});
          part.on_complete.push_back({MemoryCategory::Activations, -act_total * share(lc.saved_bytes, saved_sum)});
          if (i == nl - 1) part.on_complete.push_back({MemoryCategory::UnshardedGrads, own * pb - head});
          // A unit-wide checkpoint region is recomputed whole, then consumed layer by layer.
          if (unit_checkpoint_region()) {
            part.transient_bytes = backward_transient(static_cast<size_t>(ui)) - rematerialised;
            rematerialised += lc.saved_bytes_unckpt;
          }
          if (i > 0) part.deps = {};
          bop = push(part);
        }
      }
      bop = push_tp(ui, mbi, true, bop);
      last_bwd = bop;
      if (adapters_outside_units()) {
        free_late = ui;
        continue;
      }
      gathered[static_cast<size_t>(ui)] = false;
      // Post-backward (on the compute stream, once the unit's gradients are complete): the gradients are
      // copied into the reduce-scatter input in the reduce dtype while the unsharded parameters and the
      // per-parameter gradients are still alive (FSDP2 foreach_reduce's copy-in; fsdp-run's flat buffer),
      // then the parameters are resharded and the per-parameter gradients released (reduce_unit).
      Op post = post_backward_op(ui, mbi);
      // Kept by the schedule until the last micro-batch's backward (keeps_gathered), else resharded here.
      held[static_cast<size_t>(ui)] = keeps_gathered && mbi < K - 1;
      if (!held[static_cast<size_t>(ui)] && !defer_reduction)
        post.on_complete.push_back({MemoryCategory::UnshardedParams, -full_bytes});
      post.deps.push_back(bop);
      // FSDP1: the per-parameter gradients concatenated into the flat gradient (read them, write it), on the compute
      // stream at the end of the unit's backward, while both are alive.
      if (rt.flat_grad_cat_in_backward) {
        post.device_copy_bytes += 2.0 * full * pb;
        post.transient_bytes += full * pb;
      }
      if (accumulate_unsharded && mbi > 0) {
        // This micro-batch's gradient added into the kept one (read both, write the kept), then freed.
        post.elementwise_bytes += full * (2.0 * kb + pb);
        post.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * pb});
      }
      if (mbi < first_reduced_mb) {
        // Not reduced: the unit's kept gradient waits for the last micro-batch.
        int pop = push(post);
        if (kept_in_reduce_dtype && mbi == 0) {
          // After the reshard, the first gradient upcast into the kept reduce-dtype copy, both alive while it is
          // written, the compute-dtype one then freed.
          Op up = post_backward_op(ui, mbi);
          up.device_copy_bytes = full * (pb + rb);
          up.on_issue.push_back({MemoryCategory::UnshardedGrads, full * rb});
          up.on_complete.push_back({MemoryCategory::UnshardedGrads, -full * pb});
          up.deps.push_back(pop);
          pop = push(up);
        }
        push_tp_norm_grad_sum(ui, mbi, pop);
        continue;
      }
      if (defer_reduction) {
        // The unit's gradient is complete (added into the kept one); the reshard and the reduction wait for the
        // stage's whole backward (DataParallelPlan::reduces_after_stage_backward).
        push_tp_norm_grad_sum(ui, mbi, push(post));
        reduced_after_backward.push_back(ui);
        continue;
      }
      reduce_unit(post, ui, true);
    }
    // After the stage's backward: each unit's post-backward (its reshard and copy-in) and reduction, in the order the
    // backward completed them; the compute stream waits for them before the input gradient is sent.
    for (int ui : reduced_after_backward) {
      Op post = post_backward_op(ui, mbi);
      post.on_complete.push_back({MemoryCategory::UnshardedParams, -gathered_bytes(ui)});
      post.deps.push_back(last_bwd);
      if (prog.first_reduction_after_backward < 0)
        prog.first_reduction_after_backward = static_cast<int>(prog.ops.size());
      reduce_unit(post, ui, false);
    }
    // The last unit's replica all-reduce, issued when the end of the backward waits for its reduce-scatter.
    if (deferred_replica.kind == OpKind::AllReduce) {
      last_rs[static_cast<size_t>(deferred_replica.unit)] = last_reduction = push(deferred_replica);
      deferred_replica = Op{};
    }
    if (free_late >= 0) reshard(free_late);
    pp_after_backward(mbi, defer_reduction && last_reduction >= 0 ? last_reduction : last_bwd);
    if (mbi == K - 1) push_adapter_all_reduce(mbi);
  }
  emit_optimizer();
}

void Emitter::emit_replicated() {
  emit_adapter_state();
  const int n = static_cast<int>(prog.units.size());
  const int K = static_cast<int>(s.grad_accum);
  const int Kemit = static_cast<int>(prog.layout.micro_batches_emitted);
  const double P = total_train();
  // Full replicas in the master dtype; autocast runs compute in the param dtype.
  double frozen_bytes = 0;
  for (int ui = 0; ui < n; ++ui)
    frozen_bytes += frozen_p[static_cast<size_t>(ui)] * frozen_store_bpe(static_cast<size_t>(ui));
  prog.persistent.push_back({MemoryCategory::ShardedParams, P * sb + frozen_bytes});
  // DDP's reducer buckets, allocated once (DataParallelPlan::reducer_buckets).
  if (dp_plan.reducer_buckets) {
    // With gradient_as_bucket_view the buckets are the gradients; otherwise .grad is a separate copy.
    MemoryCategory cat = rt.ddp_gradient_as_bucket_view ? MemoryCategory::UnshardedGrads : MemoryCategory::CommBuffers;
    prog.persistent.push_back({cat, P * sb});  // DDP's buckets take the parameters' dtype
  }
  // FP32GradientAccumulator.build_grad_buffers: one fp32 buffer of every trained parameter's gradient, for the run.
  if (accum32) prog.persistent.push_back({MemoryCategory::ShardedGrads, P * 4.0});
  // nanotron's asynchronous tensor-parallel linears gather into MemoryBuffer's global buffers, kept for the run at
  // their largest request (src/nanotron/parallel/utils.py MemoryBuffer.get @ 67c5ebb6): "allgather", a column-parallel
  // linear's gathered input (tp_recompute_allgather), and "allgather2", a row-parallel linear's gathered output
  // gradient (parallel/tensor_parallel/functional.py): s x b x h each in the compute dtype.
  if (prog.tp_async_linears) {
    constexpr double kMemoryBuffers = 2;  // "allgather", "allgather2"
    prog.persistent.push_back(
        {MemoryCategory::CommBuffers, kMemoryBuffers * tokens * static_cast<double>(g.spec().hidden_size) * pb});
  }
  // ZeRO-1 reduced once after the backward (RuntimeProfile::zero1_grads_reduced_after_backward).
  const bool reduce_after_backward = dp_plan.reduce_after_backward;
  // ZeRO-2: partitioned gradients, each bucket's full gradient held until it is reduce-scattered.
  const bool partitioned = dp_plan.partitions_replicated_grads;
  const bool casts = mixed && !zero_layout && !accum32 && rt.autocast_caches_weight_casts;
  // DDP and ZeRO-1 reduce gradients in buckets: units' gradients join the open bucket in backward order, and
  // it is all-reduced once it holds bucket_cap_mb (torch/nn/parallel/distributed.py, bucket_cap_mb = 25;
  // executor/shard/sharded_model.cpp post_backward), the last one when backward ends. (PyTorch's first bucket
  // is capped at 1 MiB, _DEFAULT_FIRST_BUCKET_BYTES; not modelled: it only splits the first, earliest bucket.)
  const bool bucketed = dp_plan.bucketed;
  const double bucket_cap = static_cast<double>(s.ddp_bucket_mb) * kMiB;
  for (int rep = 0; rep < Kemit; ++rep) {
    const int mbi = rep == Kemit - 1 ? K - 1 : rep;
    double bucket_bytes = 0;
    // DDP no_sync on all but the last; ZeRO-2 reduces every micro-batch.
    const bool sync = (mbi == K - 1 && !reduce_after_backward) || dp_plan.reduces_every_micro_batch;
    int last_backward = -1;
    pp_before_forward(mbi);
    for (int ui = 0; ui < n; ++ui) {
      Op& f = prog.ops.emplace_back();  // in place (fill_forward_op)
      fill_forward_op(f, ui, mbi);
      // autocast's weight casts are saved by the linears for backward (unless the layer is checkpointed,
      // in which case they are recomputed): the unit's checkpointed share of them lives while the op runs, in forward
      // and again in backward (fsdp-run frees a checkpointed replica's cast after its forward and casts it again for
      // its backward: executor/shard/sharded_model.cpp).
      const double cast = casts ? replica_cast_elems(ui) * pb : 0.0;
      const double recast = cast * cast_checkpointed_share(ui);
      if (cast > 0) f.on_issue.push_back({MemoryCategory::UnshardedParams, cast});
      if (recast > 0) f.on_complete.push_back({MemoryCategory::UnshardedParams, -recast});
      push_tp(ui, mbi, false, static_cast<int>(prog.ops.size()) - 1);
    }
    pp_turn(mbi);
    std::vector<int> order;
    for (int ui = n - 1; ui >= 1; --ui) order.push_back(ui);
    order.push_back(0);
    for (int ui : order) {
      double p = train(ui);
      Op& b = prog.ops.emplace_back();  // in place, as the forward ops (fill_forward_op)
      fill_backward_op(b, ui, mbi);
      const double cast = casts ? replica_cast_elems(ui) * pb : 0.0;
      const double recast = cast * cast_checkpointed_share(ui);
      if (recast > 0) b.on_issue.push_back({MemoryCategory::UnshardedParams, recast});
      // Full gradients accumulate into .grad (unsharded), allocated on the first micro-batch; ZeRO-2 keeps
      // only a partition and holds the full gradient of a bucket until it is reduced.
      const double head = ui == 0 ? head_grad_bytes() : 0.0;  // allocated in the loss backward
      if (accum32) {
        // Every micro-batch's .grad is allocated by its backward and freed once added to the fp32 buffer.
        b.on_complete.push_back({MemoryCategory::UnshardedGrads, p * gb - head});
      } else if (mbi == 0) {
        if (partitioned) {
          b.on_complete.push_back({MemoryCategory::UnshardedGrads, p * gb - head});
        } else if (!(dp_plan.reducer_buckets && rt.ddp_gradient_as_bucket_view)) {
          keep_grads(b, MemoryCategory::UnshardedGrads, p * gb);
        }
      } else if (partitioned) {
        b.on_complete.push_back({MemoryCategory::UnshardedGrads, p * gb - head});
      }
      // The cast held since the forward and the one cast again for this backward, freed together.
      if (cast > 0) b.on_complete.push_back({MemoryCategory::UnshardedParams, -cast});
      int bop = push_tp(ui, mbi, true, static_cast<int>(prog.ops.size()) - 1);
      last_backward = bop;
      if (adapters_outside_units()) continue;  // no per-unit gradients: the adapters are reduced once below
      // fsdp-run's ZeRO-2 reduce-scatters the flat copy itself: the copy and the shard-sized output stay
      // alive until the reduction is waited for, at the next unit's post-backward
      // (executor/shard/sharded_model.cpp post_backward), like FSDP's sharded gradients.
      const bool zero2_flat = dp_plan.flat_grad_copy && sync;
      if (rt.replicated_grads_via_flat_copy) {
        // The runtime gathers the unit's per-parameter gradients (compute dtype) into a flat buffer before
        // accumulating it into the kept gradient: both copies live for a moment after the backward.
        Op post = post_backward_op(ui, mbi);
        if (zero2_flat) {
          post.on_issue.push_back({MemoryCategory::CommBuffers, p * rb});
          post.on_complete.push_back({MemoryCategory::UnshardedGrads, -p * gb});
          post.elementwise_bytes = 2.0 * p * pb;
          // The partition's reduce-scatter output allocated while the gradients are held
          // (RuntimeProfile::unit_grads_held_through_reduce_issue).
          if (rt.unit_grads_held_through_reduce_issue) post.transient_bytes = shard(p) * rb;
        } else {
          post.transient_bytes = 2.0 * p * pb - head;
          post.elementwise_bytes = 3.0 * p * pb;
          post.on_complete.push_back({MemoryCategory::UnshardedGrads, -head});
        }
        post.deps.push_back(bop);
        bop = push(post);
      }
      bop = push_tp_norm_grad_sum(ui, mbi, bop);
      if (!sync) continue;
      // bucket_cap_mb counts the gradients' own bytes (DDP's reducer buckets the .grad tensors; a comm hook
      // such as bf16_compress_hook casts a full bucket; fsdp-run's flush_bucket likewise).
      if (bucketed) {
        bucket_bytes += p * gb;
        if (bucket_bytes < bucket_cap && ui != order.back()) continue;
      }
      // The unit's (or the closed bucket's) reduction (data_parallel.hpp): ZeRO-2's reduce-scatter, whose first
      // micro-batch allocates the partition, or the all-reduce of a bucket or a unit.
      const double elems = !partitioned && bucketed ? bucket_bytes / gb : p;
      const std::optional<MemEvent> kept =
          partitioned && mbi == 0 ? kept_grads(MemoryCategory::ShardedGrads, shard(p) * gb) : std::nullopt;
      Op r = dp_replicated_reduction_op(dp, ui, mbi, elems, zero2_flat, kept);
      r.deps.push_back(bop);
      if (!partitioned) bucket_bytes = 0;
      push(r);
    }
    if (accum32 && last_backward >= 0) {
      // FP32GradientAccumulator.backward: after loss.backward(), fp32_grad.add_(half_param.grad) for every
      // parameter (read 2 + 4, write 4 bytes), then half_param.grad = None.
      Op a;
      a.kind = OpKind::Reshard;
      a.unit = 0;
      a.micro_batch = mbi;
      a.phase = Phase::PostBackward;
      a.elementwise_bytes = P * (gb + 8.0);
      // fp32_grad.add_(bf16 grad) computes in fp32 (PyTorch's type promotion: the result dtype of fp32 and bf16
      // operands is fp32, torch/_prims_common result_type), 8 of its 10 bytes a parameter fp32: priced at the
      // master dtype's elementwise rate, as the optimizer's passes.
      a.elementwise_in_master_dtype = true;
      a.on_complete.push_back({MemoryCategory::UnshardedGrads, -P * gb});
      a.deps.push_back(last_backward);
      last_backward = push(a);
    }
    if (reduce_after_backward && mbi == K - 1 && prog.layout.world > 1 && last_backward >= 0) {
      // nanotron trainer.py training_step (@ 67c5ebb6a925cb47026b22013af8bd1bb6c46d93): without DDP (ZeRO-1 with
      // accumulate_grad_in_fp32), sync_gradients_across_dp all-reduces the whole contiguous fp32 gradient buffer
      // after train_batch_iter returns (FP32GradientAccumulator.sync_gradients_across_dp, reduce_scatter=False).
      Op r = collective_op(OpKind::AllReduce, Stream::ReduceScatter, Phase::AllReduce, CollectiveKind::AllReduce,
                           GroupKind::World, wire_bytes(P, accum32 ? 4.0 : rb, GroupKind::World),
                           accum32 ? WireType::Fp32 : wire_type(s.reduce_dtype, GroupKind::World), -1, mbi);
      r.deps.push_back(last_backward);
      push(r);
    }
    pp_after_backward(mbi, last_backward);
    if (mbi == K - 1) push_adapter_all_reduce(mbi);
  }
  emit_optimizer();
}

// The step after the last backward: the training loop's gradient passes and norm (with the all-reduce of
// the partial norms when the optimizer is sharded), the optimizer, and the loss all-reduce
// (RuntimeProfile, section training_loop).
void Emitter::emit_optimizer() {
  const bool outside = adapters_outside_units();  // replicated adapters: every rank owns and holds them all
  const double P = outside ? adapters : total_train();
  const double owned = place.optim_sharded && !outside ? shard(P) : P;  // what the optimizer updates
  const double held = place.grads_sharded && !outside ? shard(P) : P;   // the gradient elements the rank keeps
  const double grad_bytes = owned * rt.grad_norm_bytes_per_grad + held * rt.grad_pass_bytes_per_grad;
  // fp16 loss scaling: whether any owned gradient overflowed, one fp32 flag summed over the shard group
  // (torch/distributed/fsdp/sharded_grad_scaler.py _unscale_grads_; fsdp-run's grads_nonfinite).
  if (s.param_dtype == DType::Fp16 && place.optim_sharded && !outside && prog.layout.shard_size > 1) {
    constexpr double kFlagBytes = 4.0;
    Op f = collective_op(OpKind::ScalarAllReduce, Stream::ReduceScatter, Phase::OverflowCheckAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Shard, kFlagBytes, WireType::Fp32, -1, 0);
    f.after_all_comm = true;
    push(f);
  }
  double tp_replicated_params = 0;
  for (double p : tp_unit_replicated_params) tp_replicated_params += p;
  if (s.mesh.tp > 1 && tp_replicated_params > 0 && !rt.tp_norm_grad_sum_per_unit) {
    // The replicated norms' gradients differ per tp rank under sequence parallelism (each saw its s/tp tokens), the
    // q/k norms' without it too (each saw its heads): summed over the tp group before the step (Megatron-LM
    // finalize_model_grads, allreduce_layernorm_grads).
    Op a = collective_op(OpKind::TpCollective, Stream::TensorParallel, Phase::TpNormGradAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Tensor,
                         wire_bytes(tp_replicated_params, rb, GroupKind::Tensor),
                         wire_type(s.reduce_dtype, GroupKind::Tensor), -1, static_cast<int>(s.grad_accum) - 1);
    a.after_all_comm = true;
    push(a);
  }
  if (grad_bytes > 0) {
    Op n;
    n.kind = OpKind::GradNorm;
    n.phase = Phase::GradientNorm;
    n.elementwise_bytes = grad_bytes;
    n.transient_bytes = step_elems_at_once(owned) * rt.grad_norm_temporary_bytes_per_grad;
    n.after_all_comm = true;  // every gradient reduction has landed
    push(n);
    // One fp64 scalar per group the owned gradients are spread over (executor clip_grad_norm, sum_over_mesh; FSDP2's
    // clip_grad_norm_ reduces the DTensor norm likewise): the optimizer's shards, then the tp slices and the pipeline
    // stages (Megatron-LM get_grad_norm_fp32 all-reduces over the model-parallel group, megatron/core/optimizer/
    // clip_grads.py; torchtitan's clip_grad_norm_ over the pp mesh, torchtitan/distributed/utils.py).
    auto norm_all_reduce = [&](GroupKind group) {
      Op a = collective_op(OpKind::ScalarAllReduce, Stream::ReduceScatter, Phase::GradientNormAllReduce,
                           CollectiveKind::AllReduce, group, kScalarBytes, WireType::Fp64, -1, 0);
      a.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
      push(a);
    };
    if (rt.grad_norm_bytes_per_grad > 0 && !outside) {
      if (place.optim_sharded && prog.layout.shard_size > 1) norm_all_reduce(GroupKind::Shard);
      if (s.mesh.tp > 1) norm_all_reduce(GroupKind::Tensor);
      if (s.mesh.pp > 1) norm_all_reduce(GroupKind::Pipeline);
    }
  }
  emit_optimizer_step();
  if (rt.loss_all_reduce && prog.layout.ranks() > 1) {
    Op l = collective_op(OpKind::ScalarAllReduce, Stream::ReduceScatter, Phase::LossAllReduce,
                         CollectiveKind::AllReduce, GroupKind::Mesh, kScalarBytes, WireType::Fp64, -1, 0);
    l.after_all_comm = true;
    l.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
    push(l);
  }
}

void Emitter::emit_optimizer_step() {
  const bool outside = adapters_outside_units();
  const double P = outside ? adapters : total_train();
  const double opt_elems = place.optim_sharded && !outside ? shard(P) : P;
  const double states = s.optimizer == Optimizer::AdamW ? 2.0 : 1.0;  // exp_avg + exp_avg_sq, or momentum
  const bool host_opt = s.offload != Offload::None;
  const double grad_elems = place.grads_sharded && !outside ? shard(P) : P;
  if (!host_opt) {
    prog.persistent.push_back({MemoryCategory::OptimizerStates, opt_elems * states * mb});
    if (zero_layout || accum32) prog.persistent.push_back({MemoryCategory::MasterParams, opt_elems * mb});
    Op o;
    o.kind = OpKind::OptimizerStep;
    o.phase = Phase::OptimizerStep;
    // AdamW's temporaries for sqrt(exp_avg_sq) / bias correction (RuntimeProfile::adamw_temporaries_per_param;
    // torch/optim/adamw.py _multi_tensor_adamw: _foreach_sqrt), over what it updates at once.
    o.transient_bytes =
        s.optimizer == Optimizer::AdamW ? step_elems_at_once(opt_elems) * rt.adamw_temporaries_per_param * mb : 0.0;
    // DeepSpeed's ZeRO-1/2 instead convert the low-precision gradient partition to fp32 for the step
    // (stage_1_and_2.py: single_partition_of_fp32_groups[i].grad) and use a fused Adam without temporaries;
    // ZeRO-3 flattens and casts it sub-group by sub-group (DataParallelPlan::step_in_sub_groups).
    if (zero_layout) {
      const double sub = std::min(opt_elems, rt.zero3_step_sub_group_elems);
      o.transient_bytes = dp_plan.step_in_sub_groups ? sub * (gb + (mb != gb ? mb : 0.0)) : opt_elems * mb;
    }
    // The accumulator's fp32 gradients are views of its buffer: nothing is converted for the step.
    if (accum32) o.transient_bytes = 0.0;
    // Memory traffic as the runtime's optimizer moves it (training_loop.adamw_bytes_per_param: 28 B when
    // fused, 4 reads + 3 writes of fp32), given for fp32 masters and states: scaled to the master dtype.
    o.elementwise_bytes =
        opt_elems * (mb / 4.0) * (s.optimizer == Optimizer::AdamW ? rt.adamw_bytes_per_param : rt.sgd_bytes_per_param);
    // The step waits for the gradient norm's all-reduce (clipping scales the gradients it reads).
    if (!prog.ops.empty() && prog.ops.back().kind == OpKind::ScalarAllReduce)
      o.deps.push_back(static_cast<int>(prog.ops.size()) - 1);
    // Gradients are dropped after the step (zero_grad(set_to_none=True)).
    free_grads(o);
    o.after_all_comm = true;
    push(o);
    if (dp_plan.gathers_params_after_step && !outside) {
      // ZeRO-1/2: the updated slices of the replica gathered (data_parallel.hpp).
      const int opt_op = static_cast<int>(prog.ops.size()) - 1;
      for (const Op& a : dp_step_param_gathers(dp, train_p, P, opt_op)) push(a);
    }
    return;
  }
  // Offloaded optimizer (ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840): fp32 masters, states and a
  // gradient copy live in (pinned) host memory; gradients go down, updated parameters come back up.
  prog.host_bytes_per_rank += opt_elems * (states + 1.0 + 1.0) * 4.0;  // states + master + fp32 grad
  prog.host_persistent.push_back({MemoryCategory::OptimizerStates, opt_elems * states * 4.0});
  prog.host_persistent.push_back({MemoryCategory::MasterParams, opt_elems * 4.0});
  prog.pinned_bytes_per_rank += grad_elems * rb;
  if (!grads_copied_per_unit) {
    Op d;
    d.kind = OpKind::CopyToHost;
    d.stream = Stream::DeviceToHost;
    d.phase = Phase::GradientsToHost;
    d.copy_bytes = grad_elems * rb;
    d.after_all_comm = true;
    d.deps.push_back(static_cast<int>(prog.ops.size()) - 1);  // the last backward
    push(d);
  }
  Op h;
  h.kind = OpKind::HostOptimizerStep;
  h.stream = Stream::Host;
  h.phase = Phase::HostOptimizerStep;
  h.host_optimizer_params = opt_elems;
  h.after_all_comm = true;  // every gradient copy has landed
  free_grads(h);
  int hop = push(h);
  Op u;
  u.kind = OpKind::CopyToDevice;
  u.stream = Stream::HostToDevice;
  u.phase = Phase::ParametersToDevice;
  u.copy_bytes = s.offload == Offload::Params ? 0.0 : opt_elems * pb;
  u.deps.push_back(hop);
  push(u);
}

}  // namespace

StepProgram emit_step_program(const ProgramInput& in, EmitMemo* memo) {
  FSDP_ASSERT(in.graph && in.runtime, "emit_step_program needs a graph and a runtime");
  const Strategy& s = in.strategy;
  Emitter e(*in.graph, s, *in.runtime);
  e.fp32_collectives = in.fp32_collectives_only;
  e.backend_gather_buffer = in.backend_gather_buffer;
  e.host_params_are_compute_params = in.host_device && in.strategy.param_dtype == in.strategy.master_dtype;
  e.prog.sdpa_global = in.sdpa_global;
  e.prog.sdpa_windowed = in.sdpa_windowed;
  e.prog.eager_attention = hf_eager_attention(s.param_dtype, in.runtime->eager_softmax_fp32);
  e.prog.sdpa_math_attention = sdpa_math_attention(s.param_dtype, parse_torch_version(in.runtime->torch_version));
  // The saved tensors follow the global layers' kernel, or the windowed layers' in a model that has only those.
  // The two differ in what they save only where one is math and the other fused (a windowed layer's mask refused
  // by flash and the memory-efficient kernel refusing the head dim): then the global layers' kernel is counted.
  {
    const ModelSpec& m = in.graph->spec();
    bool any_global = false;
    for (int64_t i = 0; i < m.num_layers; ++i) any_global = any_global || !sdpa_layer_masked(m, i, s.seq_len);
    e.sdpa_memory = any_global ? in.sdpa_global : in.sdpa_windowed;
  }
  StepLayout& lay = e.prog.layout;
  // The mesh (StepLayout): the data-parallel strategy spans world / (tp x pp) ranks; a pipeline program is one
  // stage's, with its layers (pipeline_parallel.hpp).
  FSDP_ASSERT(in.cluster.world_size() % s.mesh.model_parallel() == 0, "mesh validated before emission");
  lay.tp = s.mesh.tp;
  lay.pp = s.mesh.pp;
  lay.pp_virtual_stages = s.mesh.pp_virtual_stages;
  lay.pp_schedule = s.mesh.pp_schedule;
  lay.stage = in.pipeline_stage;
  FSDP_ASSERT(lay.stage >= 0 && lay.stage < lay.pp, "pipeline stage out of range");
  const bool by_cost = lay.pp > 1 && in.runtime->pipeline_split_by_cost && lay.pp_virtual_stages == 1;
  const StageClose closes = in.runtime->pipeline_stage_closes_on_reaching ? StageClose::Reached : StageClose::Exceeded;
  // nanotron's split, computed once for the tail and the stage's layers.
  const CostSplit split = by_cost ? pipeline_split_by_cost(in.graph->spec(), lay.pp, closes) : CostSplit{};
  const PipelineTail tail = by_cost ? pipeline_tail(split) : pipeline_tail(in.graph->spec(), lay.pp, false, closes);
  lay.head_stage = tail.head_stage;
  lay.loss_stage = tail.loss_stage;
  const StageLayers stage =
      by_cost ? stage_layers_in(split, lay.stage)
              : stage_layers(in.graph->spec().num_layers, lay.pp, lay.pp_virtual_stages, lay.pp > 1 ? lay.stage : 0);
  lay.stage_first_layer = lay.pp > 1 ? stage.first : 0;
  lay.stage_last_layer = lay.pp > 1 ? stage.last : in.graph->spec().num_layers - 1;
  lay.world = s.mesh.dp(in.cluster.world_size());
  lay.shard_size = dp_shard_size(s, lay.world);
  lay.replicas = lay.world / lay.shard_size;
  // Micro-batches between the first and the last are identical; one represents them all and the
  // timeline scales its duration (timeline.cpp).
  lay.micro_batches_emitted = std::min<int64_t>(s.grad_accum, 3);
  e.setup(memo);
  // Ops per unit and micro-batch: gathers, compute, frees, reductions, the mesh's collectives (a few more for
  // multi-layer units, which split their backward per layer); reserved once, as the search emits thousands.
  // Tensor parallelism adds its collectives (forward and backward, two kinds each with sequence parallelism); a unit
  // of several layers splits its backward per layer. An estimate: past it the vector grows as any does.
  constexpr size_t kOpsPerUnit = 12, kTpOpsPerUnit = 4, kOpsPerExtraLayer = 2;
  size_t per_micro_batch = 0;
  for (const WrapUnit& u : e.prog.units)
    per_micro_batch += kOpsPerUnit + (lay.tp > 1 ? kTpOpsPerUnit : 0) +
                       (u.num_layers() > 1 ? kOpsPerExtraLayer * static_cast<size_t>(u.num_layers()) : 0);
  e.prog.ops.reserve(per_micro_batch * static_cast<size_t>(lay.micro_batches_emitted) + 32);
  if (lay.pp > 1) {
    // The schedule's other micro-batches in flight on this stage, each holding what one holds.
    double act = 0, largest = 0;
    for (double a : e.act_bytes) {
      act += a;
      largest = std::max(largest, a);
    }
    // The last stage computes each micro-batch's loss in its forward, and the loss's graph, with the log-probabilities
    // it saved, lives until that micro-batch's backward (torch.distributed.pipelining's last stage calls the loss
    // function on its forward output, schedules.py _maybe_compute_loss; fsdp-run's run_pipeline keeps the last
    // stage's loss output per micro-batch, executor/train/pipeline.cpp): a loss micro-batch in flight holds them too
    // (pipeline_parallel.hpp in_flight_loss_micro_batches).
    double loss = e.holds_loss() ? e.logits_elems() * e.logprob_bytes() : 0.0;
    largest = std::max(largest, loss);
    // Each holds its output too (Emitter::hold_stage_output): the logits on the loss's stage where the schedule
    // computes the loss on them, else what it sends.
    double output = 0;
    if (e.holds_loss()) {
      if (e.loss_stage_outputs_logits()) output = e.logits_elems() * e.pb;
      loss += output;
    } else {
      output = e.pp_transfer_elems(e.sends_logits()) * e.pb;
      act += output;
    }
    largest = std::max(largest, output);
    e.prog.pipeline_transfer_tensor_bound = largest;
    e.pp_in_flight_bytes = (in_flight_micro_batches(s.mesh, lay.stage, s.grad_accum) - 1.0) * act +
                           (in_flight_loss_micro_batches(s.mesh, lay.stage, s.grad_accum) - 1.0) * loss;
  }
  if (e.place.params_sharded) {
    e.emit_sharded();
  } else {
    e.emit_replicated();
  }
  // The stage's outputs kept to the step's end are released when the next step starts: after this step's last op.
  if (e.pp_outputs_freed_at_end > 0)
    e.prog.ops.back().on_complete.push_back({MemoryCategory::Activations, -e.pp_outputs_freed_at_end});
  // Parameter offload: the parameter shards live on the host, where the optimizer updates them in place
  // (FSDP CPUOffload: the fp32 sharded parameters are the optimizer's, torch/distributed/fsdp/
  // _fully_shard/_fsdp_param.py offload_to_cpu), so they are the master copy emit_optimizer already
  // placed on the host; the copy in to the device stages through a pinned compute-dtype buffer.
  if (s.offload == Offload::Params) {
    double shard_p = 0;
    for (int ui = 0; ui < static_cast<int>(e.prog.units.size()); ++ui) shard_p += e.shard_bytes(ui, e.mb);
    e.prog.pinned_bytes_per_rank += shard_p * e.pb / e.mb;
  }
  // Communicators: the data-parallel dimension's (the default group, HSDP's shard and replica groups).
  e.prog.communicators = dp_communicators(e.dp_plan, lay.world);
  // The mesh's own groups: one communicator for the tp group, one for the pipeline group (NCCL point-to-point
  // sends and receives run on the group's communicator).
  e.prog.communicators += (lay.tp > 1 ? 1 : 0) + (lay.pp > 1 ? 1 : 0);
  return std::move(e.prog);
}

}  // namespace fsdp
