#include "program/step_program.hpp"

#include <optional>

#include "program/step_emitter.hpp"
#include "runtime/kernel_library.hpp"

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
  q.mha_qkv_copy_saved = rt.mha_qkv_copy_saved;
  q.value_view_keeps_fused_qkv = rt.value_view_keeps_fused_qkv;
  // Without the model the sliding layers are taken as attending every earlier token; the emitter sets them from the
  // model's window (step_emitter.hpp Emitter::setup).
  q.kv_repeated = q.kv_repeated_windowed = kv_repeated(s, rt, false);
  if (s.method != Method::Full) {
    q.frozen_base = true;
    q.adapted = s.lora.target_modules;
    q.lora_rank = s.lora.rank;
    q.vision_unadapted = s.train_vision == VisionTraining::None;
  }
  return q;
}

bool kv_repeated(const Strategy& s, const RuntimeProfile& rt, bool masked) {
  switch (rt.kv_repeat) {
    case KvRepeat::Never:
      return false;
    case KvRepeat::Always:
      return true;
    case KvRepeat::WithoutSdpaGqa: {
      // transformers src/transformers/integrations/sdpa_attention.py @ 00c238bd242b4c6ddfb2c17d4573174ec2daaec8,
      // sdpa_attention_forward: repeat_kv unless use_gqa_in_sdpa (torch >= 2.5 and attention_mask is None), which
      // passes enable_gqa instead. flash-attn (flash_attention_2 / 3) takes the grouped heads, flex attention passes
      // enable_gqa, and eager attention's repeat is counted apart (module_graph.cpp build_attention). A runtime whose
      // torch release is not stated is taken as recent (the same assumption as its SDPA dispatch).
      if (s.attention != AttentionImpl::Sdpa) return false;
      const std::optional<TorchVersion> tv =
          rt.torch_version.empty() ? std::nullopt : parse_torch_version(rt.torch_version);
      return masked || (tv && !tv->at_least(2, 5));
    }
  }
  return false;
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

using step_emission::Emitter;

StepProgram emit_step_program(const ProgramInput& in, EmitMemo* memo) {
  FSDP_ASSERT(in.graph && in.runtime, "emit_step_program needs a graph and a runtime");
  const Strategy& s = in.strategy;
  // The strategy's kernel library in place of the runtime's own kernels (runtime/kernel_library.hpp); the memo stays
  // bound to the caller's profile, the library in its key.
  std::optional<RuntimeProfile> patched;
  if (s.kernels != KernelLibrary::None) patched = with_kernel_library(*in.runtime, s.kernels);
  Emitter e(*in.graph, s, patched ? *patched : *in.runtime);
  e.memo_runtime = in.runtime;
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
  lay.ep = s.mesh.ep;
  lay.stage = in.pipeline_stage;
  FSDP_ASSERT(lay.stage >= 0 && lay.stage < lay.pp, "pipeline stage out of range");
  const bool by_cost = lay.pp > 1 && in.runtime->pipeline_split_by_cost && lay.pp_virtual_stages == 1;
  const StageClose closes = in.runtime->pipeline_stage_closes_on_reaching ? StageClose::Reached : StageClose::Exceeded;
  // nanotron's split, computed once for the tail and the stage's layers.
  const CostSplit split = by_cost ? pipeline_split_by_cost(in.graph->spec(), lay.pp, closes) : CostSplit{};
  const PipelineTail tail = by_cost ? pipeline_tail(split) : pipeline_tail(in.graph->spec(), lay.pp, false, closes);
  lay.head_stage = tail.head_stage;
  lay.loss_stage = tail.loss_stage;
  const StageLayers stage = graph_stage_layers(
      by_cost ? stage_layers_in(split, lay.stage)
              : stage_layers(in.graph->spec().num_layers, lay.pp, lay.pp_virtual_stages, lay.pp > 1 ? lay.stage : 0),
      in.graph->first_decoder_layer(), lay.pp > 1 ? lay.stage : 0);
  lay.stage_first_layer = lay.pp > 1 ? stage.first : 0;
  lay.stage_last_layer = lay.pp > 1 ? stage.last : static_cast<int64_t>(in.graph->layers().size()) - 1;
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
  // Expert parallelism: the ep group's (the all-to-alls) and the efsdp group's (the experts' FSDP collectives).
  if (lay.ep > 1) e.prog.communicators += lay.ep < lay.shard_size ? 2 : 1;
  return std::move(e.prog);
}

}  // namespace fsdp
