// The emitter's setup (program/step_emitter.hpp): per-unit parameters, saved activations, FLOPs, memory-bound bytes
// and working memory, derived once per program from the model graph, the strategy and the runtime.

#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

void Emitter::setup(EmitMemo* memo) {
  q = activation_query(s, rt, sdpa_memory);
  // The sliding layers share one window (ModelSpec::attention_window) and pass a mask from it on.
  const ModelSpec& spec = g.spec();
  bool windowed_masked = false;
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    if (spec.attention_window(i) == 0) continue;
    windowed_masked = sdpa_layer_masked(spec, i, s.seq_len);
    break;
  }
  q.kv_repeated_windowed = kv_repeated(s, rt, windowed_masked);
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
    prog.units = stage_units(g, all_units, StageLayers{lay.stage_first_layer, lay.stage_last_layer}, lay.stage, tail());
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
    memo->bind(g, memo_runtime != nullptr ? *memo_runtime : rt);
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
      // Expert parallelism: the rank's routed experts run ep times the tokens each.
      shard_layer_for_ep(class_costs.back(), s.mesh.ep);
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
  if (rt.embedding_own_unit && s.method == Method::Full && prog.layout.pp == 1 && !g.spec().tied_embeddings &&
      unit_placement(s, false, rt.root_reshard_after_forward).reshard_after_forward)
    for (ModuleId c : g.children(g.root()))
      if (g.node(c).kind == ModuleKind::Embedding) embed_released += tp_root_module_params(g, c, s.mesh.tp);
  // Per-unit vectors, sized once (the search emits thousands of programs).
  for (std::vector<double>* v :
       {&train_p, &train_bpe, &frozen_p, &frozen_bpe, &unit_elementwise, &unit_elementwise_backward,
        &unit_forward_transient, &unit_backward_transient, &act_bytes, &fwd_flops, &attn_flops, &trained_fwd_flops,
        &trained_attn_flops, &recompute_bytes, &recompute_flops, &recompute_attn_flops, &recompute_elementwise,
        &unit_float8_cast, &unit_float8_cast_backward})
    v->reserve(prog.units.size());
  // A vision-language model's frozen vision parts (Strategy::train_vision): the tower's blocks lead the layer stack
  // (ModuleGraph::layers), its embeddings and the projector are the root's.
  const bool vision_frozen = g.spec().vision && s.train_vision != VisionTraining::All;
  prog.frozen_layers = vision_frozen ? g.first_decoder_layer() : 0;
  auto frozen_root_part = [&](ModuleId c) {
    return vision_frozen && ModuleGraph::frozen(g.vision_part(c), s.train_vision);
  };
  // Frozen parameters (a LoRA base, a frozen vision part) stored as master-dtype shards cast for each use, where the
  // runtime keeps the model in the master dtype (RuntimeProfile::lora_base_in_master_dtype).
  frozen_in_master = (s.method == Method::Lora || vision_frozen) && rt.lora_base_in_master_dtype;
  for (const auto& u : prog.units) {
    const double params = static_cast<double>(u.params);
    if (s.method == Method::Full) {
      double frozen = 0;
      if (vision_frozen) {
        const LayerCosts layers = costs_of(u);
        for (int64_t i = 0; i < layers.count; ++i)
          if (layer_frozen(layers.first + i)) frozen += layers[static_cast<size_t>(i)]->params;
        // The root's frozen parts, as the stage's root counts its parameters (stage_root_holds).
        if (u.is_root)
          for (ModuleId c : g.children(g.root()))
            if (frozen_root_part(c) && stage_root_holds(g, c, lay.stage, tail()))
              frozen += static_cast<double>(g.params_under(c));
      }
      const double trained = params - frozen;
      train_p.push_back(trained);
      if (s.mesh.ep > 1) {
        double routed = 0;
        for (const LayerCost* lc : costs_of(u)) routed += lc->routed_params;
        routed_p.push_back(routed);
      }
      double float8 = 0;
      if (s.float8_all_gather)
        for (const LayerCost* lc : costs_of(u)) float8 += lc->float8_params;
      train_bpe.push_back(trained > 0 ? ((trained - float8) * pb + float8 * kFloat8ElementBytes) / trained : pb);
      frozen_p.push_back(frozen);
      frozen_bpe.push_back(pb);
      continue;
    }
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
  const Float8WeightCastBytes f8_weight =
      float8_weight_cast_bytes_per_element(s.float8, s.float8_all_gather, static_cast<double>(prog.layout.shard_size));
  for (const auto& u : prog.units) {
    double act = 0, mm = 0, at = 0, rec = 0, first_saved = 0, rec_all = 0, ew = 0, ft = 0, bt = 0;
    double rec_mm = 0, rec_at = 0, rec_ew = 0, bew = 0, f8 = 0, f8_back = 0, trained_mm = 0, trained_at = 0;
    bool first = true;
    const LayerCosts layers = costs_of(u);
    for (int64_t li = 0; li < layers.count; ++li) {
      const LayerCost* lc = layers[static_cast<size_t>(li)];
      ew += tokens * lc->elementwise_bytes_per_token;
      ft = std::max(ft, lc->forward_transient);
      mm += lc->matmul_flops_per_token;
      at += lc->attention_flops_per_token;
      // Float8 linears cast their activations and weights every micro-batch, again where the layer's forward
      // reruns (float8_linears.hpp).
      const double f8_fwd = tokens * lc->float8_cast_bytes_per_token + lc->float8_params * f8_weight.forward;
      f8 += f8_fwd;
      // A frozen vision block (Strategy::train_vision) runs its forward alone: it saves nothing, and its backward,
      // recomputation and casts for a backward do not happen.
      if (layer_frozen(layers.first + li)) continue;
      trained_mm += lc->matmul_flops_per_token;
      trained_at += lc->attention_flops_per_token;
      act += lc->saved_bytes;
      rec_all += lc->saved_bytes_unckpt;
      bew += tokens * lc->elementwise_backward_bytes_per_token;
      bt = std::max(bt, lc->backward_transient);
      rec_mm += lc->recompute_matmul_flops_per_token;
      rec_at += recomputes_attention(lc->ckpt) ? lc->attention_flops_per_token : 0.0;
      rec_ew += recomputes_layer_forward(lc->ckpt) ? tokens * lc->elementwise_bytes_per_token : 0.0;
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
        // A frozen vision part runs its forward alone (Strategy::train_vision).
        if (frozen_root_part(c)) continue;
        trained_mm += r * c_mm;
        trained_at += r * c_at;
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
    trained_fwd_flops.push_back(trained_mm * tokens);
    trained_attn_flops.push_back(trained_at * tokens);
    recompute_bytes.push_back(rec);
    recompute_flops.push_back(rec_mm * tokens);
    recompute_attn_flops.push_back(rec_at * tokens);
    recompute_elementwise.push_back(rec_ew);
    unit_float8_cast.push_back(f8);
    unit_float8_cast_backward.push_back(f8_back);
  }
}

}  // namespace fsdp::step_emission
