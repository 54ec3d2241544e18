// The mesh's own ops (program/step_emitter.hpp): tensor-parallel collectives per unit (program/tensor_parallel.hpp)
// and pipeline point-to-point transfers between stages (program/pipeline_parallel.hpp).

#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

void Emitter::hold_stage_output(Op& op, int mbi, double bytes) {
  if (keeps_stage_outputs()) {
    const int64_t held_after = static_cast<int64_t>(mbi) + 1;
    op.on_issue.push_back({MemoryCategory::Activations, static_cast<double>(held_after - pp_outputs_held) * bytes});
    pp_outputs_freed_at_end += static_cast<double>(held_after - pp_outputs_held) * bytes;
    pp_outputs_held = held_after;
  } else {
    op.on_issue.push_back({MemoryCategory::Activations, bytes});
  }
}

const TpUnitShape& Emitter::tp_unit_shape(int ui) {
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
  shape.head_output_gather_bytes = shape.head && rt.tp_head_output_replicated ? logits_elems() * pb : 0.0;
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

double Emitter::tp_layout_copy_bytes(int ui, bool backward) {
  if (s.mesh.tp <= 1 || !rt.tp_sequence_collective_copy) return 0.0;
  const TpUnitShape& shape = tp_unit_shape(ui);
  const size_t i = static_cast<size_t>(ui);
  // The head's collectives' copies are charged to its unit's pass, as before they were emitted apart.
  const double head =
      shape.head ? tp_sequence_layout_copy_bytes(backward ? tp_head_backward : tp_head_forward, s.mesh) : 0.0;
  return tp_sequence_layout_copy_bytes(backward ? tp_backward[i] : tp_forward[i], s.mesh) + head +
         (backward ? tp_async_gathered_layout_copy_bytes(shape, s.mesh, s.micro_batch) : 0.0);
}

int Emitter::push_tp(int ui, int mbi, bool backward, int dep) {
  if (s.mesh.tp <= 1) return dep;
  tp_unit_shape(ui);
  const size_t i = static_cast<size_t>(ui);
  return push_tp_list(backward ? tp_backward[i] : tp_forward[i], ui, mbi, backward, false, dep);
}

int Emitter::push_tp_head(int mbi, bool backward, int dep) {
  if (s.mesh.tp <= 1 || !holds_head()) return dep;
  constexpr int kRoot = 0;  // wrap_units.hpp: root first
  tp_unit_shape(kRoot);
  return push_tp_list(backward ? tp_head_backward : tp_head_forward, kRoot, mbi, backward, true, dep);
}

int Emitter::push_tp_list(const std::vector<TpCollective>& list, int ui, int mbi, bool backward, bool head, int dep) {
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

int Emitter::push_ep(int ui, int mbi, bool backward, int dep) {
  if (s.mesh.ep <= 1) return dep;
  const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
  // The unit's blocks' all-to-alls as one op: their calls, at their mean size.
  EpAllToAlls a;
  double bytes = 0;
  for (const LayerCost* lc : costs_of(u)) {
    const EpAllToAlls layer = ep_layer_all_to_alls(*lc, backward, s.mesh.ep, tokens, pb);
    a.calls += layer.calls;
    bytes += layer.calls * layer.bytes;
  }
  if (a.calls == 0) return dep;
  a.bytes = bytes / a.calls;
  Op& op = prog.ops.emplace_back();  // in place: nothing pushes another op before it is complete
  op.kind = OpKind::EpAllToAll;
  op.stream = Stream::ExpertParallel;
  op.unit = ui;
  op.micro_batch = mbi;
  op.phase = backward ? Phase::EpBackwardAllToAll : Phase::EpForwardAllToAll;
  op.collective = CollectiveKind::AllToAll;
  op.group = GroupKind::Expert;
  op.comm_bytes = wire_bytes(a.bytes / pb, pb, GroupKind::Expert);
  op.comm_dtype = wire_type(s.param_dtype, GroupKind::Expert);
  op.comm_calls = a.calls;
  // all_to_all_single's output beside its input while it runs (the input, the permuted token copies, is freed after).
  op.transient_bytes = a.bytes;
  op.first_layer = u.first_layer;
  op.last_layer = u.last_layer;
  if (dep >= 0) op.deps.push_back(dep);
  return static_cast<int>(prog.ops.size()) - 1;
}

int Emitter::push_tp_norm_grad_sum(int ui, int mbi, int dep) {
  if (s.mesh.tp <= 1 || !rt.tp_norm_grad_sum_per_unit) return dep;
  const double elems = tp_unit_replicated_params.empty() ? 0.0 : tp_unit_replicated_params[static_cast<size_t>(ui)];
  if (elems <= 0) return dep;
  Op a = collective_op(OpKind::TpCollective, Stream::TensorParallel, Phase::TpNormGradAllReduce,
                       CollectiveKind::AllReduce, GroupKind::Tensor, wire_bytes(elems, pb, GroupKind::Tensor),
                       wire_type(s.param_dtype, GroupKind::Tensor), ui, mbi);
  if (dep >= 0) a.deps.push_back(dep);
  return push(a);
}

int Emitter::push_pp(Phase phase, int mbi, int dep, bool logits) {
  const double elems = pp_transfer_elems(logits);
  Op op =
      collective_op(OpKind::PipelineTransfer, Stream::Pipeline, phase, CollectiveKind::SendRecv, GroupKind::Pipeline,
                    wire_bytes(elems, pb, GroupKind::Pipeline), wire_type(s.param_dtype, GroupKind::Pipeline), -1, mbi);
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

void Emitter::pp_before_forward(int mbi) {
  if (prog.layout.pp > 1 && !prog.layout.first_stage())
    push_pp(Phase::PipelineRecvActivations, mbi, -1, receives_logits());
}

void Emitter::pp_turn(int mbi) {
  if (holds_loss()) {
    push_loss_ops(mbi);
    return;
  }
  if (holds_head()) {
    push_head_ops(mbi);
    return;
  }
  const int sent = push_pp(Phase::PipelineSendActivations, mbi, static_cast<int>(prog.ops.size()) - 1, sends_logits());
  const double output = pp_transfer_elems(sends_logits()) * pb;
  hold_stage_output(prog.ops[static_cast<size_t>(sent)], mbi, output);
  const int received = push_pp(Phase::PipelineRecvGradients, mbi, sent, sends_logits());
  // Its backward runs on the output: released then, unless the runtime keeps it to the step's end.
  if (!keeps_stage_outputs())
    prog.ops[static_cast<size_t>(received)].on_complete.push_back({MemoryCategory::Activations, -output});
}

void Emitter::pp_after_backward(int mbi, int last_backward) {
  if (prog.layout.pp > 1 && !prog.layout.first_stage())
    push_pp(Phase::PipelineSendGradients, mbi, last_backward, receives_logits());
}

}  // namespace fsdp::step_emission
