// A unit's forward and backward compute ops and its post-backward hook (program/step_emitter.hpp).

#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

void Emitter::fill_forward_op(Op& f, int ui, int mbi) {
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

void Emitter::fill_backward_op(Op& b, int ui, int mbi) {
  const WrapUnit& u = prog.units[static_cast<size_t>(ui)];
  b.kind = OpKind::Backward;
  b.unit = ui;
  b.micro_batch = mbi;
  b.phase = Phase::Backward;
  const size_t i = static_cast<size_t>(ui);
  // Backward = 2x forward GEMM FLOPs (input and weight gradients), plus what its layers' modes recompute; of the
  // parts that train only (a frozen vision tower's blocks run no backward: first_trained_layer).
  b.matmul_flops = trained_fwd_flops[i] * 2.0 + recompute_flops[i];
  b.first_layer = first_trained_layer(u);
  b.last_layer = u.last_layer;
  b.layers = b.first_layer < 0 ? 0.0 : static_cast<double>(b.last_layer - b.first_layer + 1);
  // A frozen base needs input gradients only: one GEMM per linear instead of two (LoRA's own GEMMs
  // are rank-r and negligible). The recomputed GEMMs and attention forward are priced layer by layer under
  // each layer's mode (timeline/op_cost.cpp, layer_ckpt).
  b.gemm_passes = s.method == Method::Full ? 2.0 : 1.0;
  b.attn_fwd_passes = 0;
  b.attn_bwd_passes = 1;
  // FlashAttention-2 backward is 2.5x its forward (arXiv 2307.08691 sec. 3.2: 5 vs 2 GEMMs); selective
  // and full checkpointing also recompute the attention forward.
  b.attention_flops = trained_attn_flops[i] * kAttentionBackwardRatio + recompute_attn_flops[i];
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

Op Emitter::post_backward_op(int ui, int mbi) {
  Op op;
  op.kind = OpKind::Reshard;
  op.unit = ui;
  op.micro_batch = mbi;
  op.phase = Phase::PostBackward;
  return op;
}

}  // namespace fsdp::step_emission
