// What a runtime (this project's fsdp-run, or PyTorch DDP/FSDP2 with Hugging Face modules)
// allocates beyond the mathematics of the step: configs/runtimes/*.yaml. Runtime specifics are
// data here, not branches elsewhere. Each field's file comment cites the source it was read from.
#pragma once

#include <optional>
#include <string>

#include "core/units.hpp"
#include "strategy/capabilities.hpp"

namespace fsdp {

// The host's time to issue an eager runtime's work to a GPU (section host_issue, optional; absent: none): the Python
// module code, ATen dispatch, autograd recording and kernel launches of one pass, per decoder layer and for the
// embedding + final norm + head + loss. A GPU runs each kernel once the host has issued it, and the host runs ahead
// of the device (CUDA launches are asynchronous) until it waits on it, so where the device's work per pass is shorter
// than the host's issue time the step is host-bound (timeline/timeline.cpp). On a CPU device the host's time is
// compute already (hardware_profile.hpp HostOverhead).
struct HostIssue {
  Seconds layer_forward{0}, layer_backward{0};  // one decoder layer
  Seconds head_forward{0}, head_backward{0};    // embedding, final norm, head and loss
  // Where it was measured: on the tensor-parallel path only (true: a tp = 1 layer issues other, fewer ops and is
  // charged nothing), or on every mesh (false).
  bool tensor_parallel_only = false;
  bool empty() const {
    return layer_forward.value == 0 && layer_backward.value == 0 && head_forward.value == 0 && head_backward.value == 0;
  }
};

// Whether the model's code repeats k and v to the query heads (a copy each) before a fused attention kernel
// (`modules.kv_repeat`; fewer kv heads than query heads only), read by program/step_program.cpp kv_repeated: the
// copies' traffic (program/layer_costs.cpp), and the q-wide tensors the kernel saves where eager autograd keeps them
// (model/module_graph.cpp build_attention; a compiled graph saves the kv-wide projections and repeats again in the
// backward). Eager attention repeats them for its GEMMs whatever this says.
enum class KvRepeat : uint8_t {
  // `never`: the kernel takes the grouped k and v (enable_gqa, flash-attn's own GQA).
  Never,
  // `always`: the model repeats them before any kernel (torchtitan's repeat_kv at 9dec370 and e7c0cae, torchtune's
  // and foundation-model-stack's expand and flatten, fsdp-run's repeat_interleave).
  Always,
  // `without-sdpa-gqa`: Hugging Face's sdpa path (transformers integrations/sdpa_attention.py use_gqa_in_sdpa):
  // repeat_kv unless torch is 2.5 or later and no attention mask is passed; flash-attn takes them grouped.
  WithoutSdpaGqa,
};

// The rotary embedding's kernels (`modules.rotary_kernel`), priced by program/layer_costs.cpp:
enum class RotaryKernel : uint8_t {
  // `eager` (the default): Hugging Face's apply_rotary_pos_emb (q * cos, rotate_half, * sin, add: 7 passes).
  Eager,
  // `flash-attn-in-place`: k and v packed into one (batch, seq, 2, heads, dim) tensor (a cat and a permuted
  // contiguous copy), then flash-attn's Triton rotary rewriting q and k in place.
  FlashAttnInPlace,
  // `complex`: the rotation as a complex multiply in fp32 (torchtitan's apply_rotary_emb: view_as_complex(x.float())
  // * freqs_cis, view_as_real, type_as): an upcast, the complex multiply and a downcast, whose backward is the same
  // three kernels; Inductor generates no code for complex tensors, so a compiled layer runs them too
  // (rotary_complex_bytes).
  Complex,
  // `rotate-half-fp32`: Hugging Face's rotation (x * cos + rotate_half(x) * sin) on an fp32 upcast of q and k, cast
  // back (torchtitan's CosSinRoPE.apply_rotary_emb after its rotary moved to models/common/rope.py): the upcast, the
  // 7 passes in fp32 and the downcast (rotary_rotate_half_fp32_bytes).
  RotateHalfFp32,
  // `in-place`: one kernel rotating q and k in place, forward and backward (Liger-Kernel's LigerRopeFunction,
  // src/liger_kernel/ops/rope.py rope_forward / rope_backward: the transposes back to the projections' layout are
  // views, the Triton kernel reads and rewrites q and k, and dq and dk in backward): one r/w pass each way.
  InPlace,
};

struct RuntimeProfile {
  std::string name;
  std::string source;
  // The profile it derives from (`base:`, the file it was read from), or "" for a profile written whole: a derived
  // profile is its base with the keys it gives overriding the base's, key by key.
  std::string base_source;
  // --- allocator ---
  Bytes allocation_rounding{512};  // every block is rounded up to this (CUDA caching allocator kMinBlockSize)
  // Reserved minus allocated at the peak, as a fraction of the memory that is allocated and freed within
  // a step (activations, unsharded params/grads, transients): blocks freed out of order stay cached.
  double fragmentation_fraction = 0;
  // The sharded gradients are allocated on the reduce-scatter stream (FSDP2 foreach_reduce and FSDP1 _reduce_grad
  // allocate the reduce-scatter output under that stream, and the .grad is a view of it): the caching allocator
  // never hands a block freed on one stream to another (CUDACachingAllocator.cpp: "Once freed, blocks can be
  // re-allocated on the same stream, but not on any other stream"), so after zero_grad frees them their blocks stay
  // reserved in that stream's pool, out of the compute stream's reach. Optional in the file (absent: false).
  bool sharded_grads_in_reduce_stream_pool = false;
  // The blocks a collective reads and the program frees right after issuing it (Op::stream_recorded_bytes: the
  // sequence-parallel reduce-scatters' full-sequence inputs) stay reserved, out of the compute stream's reach, until
  // the pass that issued them (a micro-batch's forward, or its backward, on the rank) has been issued whole.
  // ProcessGroupNCCL records a collective's inputs on its NCCL stream (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp
  // collective(): "Both `inputs' and `outputs' ... must record the ncclStream", recordStream of every input unless
  // TORCH_NCCL_AVOID_RECORD_STREAMS is set, async_op or not; releases since stash them on the Work until its wait()
  // instead, which this does not model), and the caching allocator returns a freed block with recorded streams to its
  // pool only once an event recorded on those streams at the free has completed on the GPU
  // (c10/cuda/CUDACachingAllocator.cpp free -> insert_events; process_events at each malloc). A runtime that does
  // not wait for the GPU within the micro-batches issues a pass before the GPU has run its collectives, so the pass's
  // later blocks cannot be carved from them. Optional in the file (allocator.collective_inputs_held_for_the_pass;
  // absent: false, the blocks reusable at once, as when the GPU keeps up with the CPU).
  bool collective_inputs_held_for_the_pass = false;
  // --- fixed costs outside the allocator's statistics ---
  Bytes context_memory{0};                // CUDA context + kernels + cuBLAS/cuDNN handles (workspace category)
  Bytes nccl_memory_per_communicator{0};  // NCCL channel buffers (nccl category)
  // --- module behaviour ---
  bool norm_saves_fp32_input = false;  // the norm upcasts its input to fp32 and autograd keeps that copy
  bool logits_upcast_fp32 = false;     // the loss casts logits to fp32 before log_softmax
  // A replicated strategy's mixed precision keeps the residual stream in fp32 (autocast over fp32 parameters: the
  // embedding and the residual adds are not autocast; modules `replicated_residual: fp32`), or in the compute dtype
  // (a runtime that casts the replica's weights to it, embedding included: `compute-dtype`).
  bool replicated_residual_fp32 = true;
  bool logits_kept_by_caller = false;  // the model returns its logits, alive through the loss backward
  // The cross-entropy's backward writes the logits' gradient into the probabilities it saved (a hand-written
  // autograd function, nanotron's _ShardedCrossEntropy), instead of allocating the gradients of the log-probabilities
  // and of the logits (log_softmax + nll_loss).
  bool loss_backward_in_place = false;
  // Full activation checkpointing regions: each decoder layer (Hugging Face gradient_checkpointing), or
  // each wrap unit (fsdp-run: one region per unit, whatever its number of layers).
  bool checkpoint_per_unit = false;
  // A checkpointed (no-autograd) layer forward keeps its intermediate tensors until the layer returns.
  bool checkpointed_forward_keeps_layer_tensors = false;
  bool allgather_copy_out = false;                  // all-gather output is copied out into per-parameter tensors
  bool root_reshard_after_forward = true;           // the root unit frees its params after forward
  bool grads_in_reduce_dtype_before_reduce = true;  // a reduce-dtype copy of the unit's grads is made to reduce
  bool ddp_gradient_as_bucket_view = false;         // DDP grads are views into its buckets (no extra copy)
  bool autocast_caches_weight_casts = true;         // autocast keeps low-precision weight casts for backward
  // FSDP1's flat parameter: the module's parameters are views split off the unsharded flat parameter, so autograd
  // concatenates their gradients into the flat gradient (SplitWithSizesBackward) before the post-backward hook.
  bool flat_grad_cat_in_backward = false;
  // ZeRO stages keep parameters and gradients in the low precision with an fp32 master partition
  // (DeepSpeed, the ZeRO paper), rather than fp32 parameters cast for compute (PyTorch, fsdp-run).
  bool zero_low_precision_params = false;
  bool grads_persist = false;  // gradient buffers live for the whole run (zeroed in place), not per step
  bool replicated_grads_via_flat_copy = false;  // replicated strategies copy a unit's grads into a flat buffer
  // ZeRO-1/2 gather the updated parameter slices with one all-gather per wrap unit, not one for the model.
  bool zero_param_gather_per_unit = false;
  // What that gather allocates beyond the parameters it writes into, alive while it runs (optional in the file;
  // absent: 0, a gather straight into the parameters): staging copies of the whole replica, and of the rank's own
  // slice, in the parameters' dtype. nanotron's all_gather_coalesced flattens the rank's slice and every rank's
  // output slices, and c10d's list all_gather stages its output in one more flat tensor: 2 and 1.
  double zero_param_gather_replica_copies = 0;
  double zero_param_gather_shard_copies = 0;
  // Mixed precision by a gradient accumulator rather than autocast (nanotron's FP32GradientAccumulator): the
  // model's parameters are stored in the compute dtype, an fp32 master copy is kept for the optimizer (sharded
  // with it under ZeRO-1), every micro-batch's compute-dtype .grad is added into one persistent fp32 buffer of
  // all the gradients and freed, and the gradient reduction reduces that fp32 buffer.
  bool fp32_grad_accumulation = false;
  // ZeRO-1 without DDP: the gradients are all-reduced once, the whole buffer, after the last micro-batch's
  // backward (not in buckets overlapping it).
  bool zero1_grads_reduced_after_backward = false;
  // LoRA's adapters: one replicated flat buffer outside the wrap units, all-reduced once after the backward
  // (fsdp-run), or parameters of their units, sharded and reduced with them (PEFT under FSDP2 / DeepSpeed).
  bool lora_adapters_replicated = false;
  // LoRA's frozen base (method lora): stored in the compute dtype (false: Hugging Face PEFT over a model loaded in
  // bf16, torchtune, torchtitan's LoRA) or, like the trained parameters, as master-dtype shards cast to the compute
  // dtype for each use (true: fsdp-run keeps an fp32 master of every unit, frozen or not). Sharding key
  // `lora_base_dtype: compute | master` (optional, absent: compute). QLoRA's quantised base is what it is.
  bool lora_base_in_master_dtype = false;
  // The last decoder-layer unit (the first the backward needs) frees its params after forward like the others;
  // false keeps them gathered into the backward (torchtitan's apply_fsdp: reshard_after_forward=False for the
  // last TransformerBlock, "since FSDP would prefetch it immediately"). Optional in the file (absent: true).
  bool last_unit_reshard_after_forward = true;
  // How a pipeline splits the model into stages (program/pipeline_parallel.hpp): the decoder layers as evenly as they
  // go, the final norm, head and loss on the last stage (torchtitan, torch.distributed.pipelining; false), or every
  // block by compute cost with the head counted (nanotron's build_model: cumulative block costs against thresholds
  // total x (r + 1) / pp, which may put the final norm and the head on the stage before the fp32 cast and the loss,
  // the bf16 logits sent between them: pipeline_split_by_cost; true). Optional in the file
  // (sharding.pipeline_stage_split: layers | compute-cost; absent: layers).
  bool pipeline_split_by_cost = false;
  // Under that split, when the walk moves on to the next rank: after the block whose cumulative cost exceeds the
  // rank's threshold (false; base.py build_model's `cumulative_cost > thresholds[...]` as published) or reaches it
  // (true). The two differ only where a cumulative cost equals a threshold exactly (the Ultra-Scale Playbook's 1B:
  // a decoder layer 2^26, the head 2^28, so thresholds fall on layer boundaries at pp 2 and 4).
  // sharding.pipeline_stage_threshold: exceeded | reached, required with pipeline_stage_split: compute-cost.
  bool pipeline_stage_closes_on_reaching = false;
  // Sequence-parallel linears that overlap their collectives with their own GEMMs (nanotron's
  // tp_linear_async_communication: timeline/tp_linear_overlap.hpp) and gather a column-parallel linear's input again
  // in backward; false: every tensor-parallel collective waited for (Megatron-style without overlap), async TP aside.
  // Optional in the file (sharding.tp_linear_async_overlap; absent: false).
  bool tp_linear_async_overlap = false;
  // Each sequence-parallel collective copies its whole tensor once on the compute stream: a batch-first [B, S, H]
  // activation gathered or scattered along the sequence (dim 1) is laid out rank-major for NCCL and back
  // (program/tensor_parallel.hpp tp_sequence_layout_copy_bytes). Optional in the file
  // (sharding.tp_sequence_collective_copy; absent: false, a sequence-first layout such as Megatron's or nanotron's).
  bool tp_sequence_collective_copy = false;
  // What a sequence-parallel column-parallel linear (q/k/v, gate/up) keeps of its input for the weight gradient:
  // - the all-gathered, full-sequence input (false): PyTorch DTensor tensor parallelism, where SequenceParallel
  //   shards the norm and PrepareModuleInput / ColwiseParallel all-gather its output into the tensor that aten.mm
  //   multiplies and saves (torch/distributed/tensor/parallel/style.py; torchtitan's plan, parallelize.py
  //   apply_tp), and fsdp-run (executor/model/tensor_parallel.cpp: GatherSeq's output is what autograd keeps);
  // - only its sequence shard, all-gathered again in backward (true): Megatron-LM's sequence parallelism
  //   (Korthikanti et al. 2022, arXiv 2205.05198, sec. 4.2.2: "we store the s/t shard ... and perform an extra
  //   all-gather in backward"), nanotron's tp_recompute_allgather.
  // Optional in the file (sharding.sp_column_input_saved: gathered | shard; absent: gathered, PyTorch's).
  bool sp_saves_column_input_shard = false;
  // When the replicated norms' gradients (partial sums over each tp rank's sequence shard under sequence
  // parallelism) are summed over the tp group:
  // - once a step, all of them in one all-reduce after the last backward (false): Megatron-LM's finalize_model_grads
  //   (_allreduce_layernorm_grads), nanotron's sync of its tied parameters' gradients;
  // - per unit and micro-batch, as the unit's backward hands its gradients over (true): fsdp-run
  //   (executor/shard/sharded_model.cpp sum_partial_grads, one all-reduce of the unit's norms in the compute dtype).
  // Optional in the file (sharding.tp_norm_grad_sum: per-step | per-unit; absent: per-step).
  bool tp_norm_grad_sum_per_unit = false;
  // The vocabulary-parallel cross-entropy's all-reduces (program/tensor_parallel.hpp tp_loss_collectives): three
  // separate calls (false), or the maximum and then the target logit with the sum of exponentials in one call
  // (true: Megatron core's fused cross-entropy, fsdp-run). Optional in the file (sharding.tp_loss_all_reduces:
  // separate | fused; absent: separate).
  bool tp_loss_all_reduces_fused = false;
  // The head's output under tp > 1: its vocabulary shards, the cross-entropy vocabulary-parallel (false: Megatron-LM,
  // torchtitan's loss_parallel, nanotron, fsdp-run), or all-gathered into the whole logits on every tp rank, the
  // loss then as without tp over them (true: torchtune's TP plans, `"output": ColwiseParallel(output_layouts=
  // Replicate())`, torchtune/models/llama3/_parallelism.py @ a6290a5). Optional in the file (sharding.tp_head_output:
  // vocab-parallel | replicated; absent: vocab-parallel).
  bool tp_head_output_replicated = false;
  // The vocabulary-parallel cross-entropy's kernels under tp > 1 (program/emit_loss.cpp), by what its backward
  // allocates beyond the probabilities it saved. AsLoss: as the loss without tp, aten's log_softmax and nll_loss
  // and their backwards (the log-softmax and NLL gradients, two logits-sized tensors; or in place where
  // loss_backward_in_place says so). ProbabilitiesCopy: one copy of the saved probabilities becomes the logits'
  // gradient (fsdp-run's VocabParallelCE::backward, executor/model/tensor_parallel.cpp, clones them and writes the
  // target's subtraction and the scaling into the clone). LossParallel: DTensor's loss_parallel handlers
  // (torch/distributed/tensor/parallel/loss.py, unchanged from 3be12382 to 02eef6b8): _log_softmax runs the
  // decomposition op by op (amax, the shifted copy, exp, sum, the shifted minus the log-sum), and
  // _nll_loss_and_log_softmax_backward computes `(grad_input + torch.exp(x)) * grad_output` with grad_input a
  // zeros_like(x) scattered at the targets, so three logits-sized tensors beside the saved probabilities at its peak
  // (the zeros, exp(x) and their sum; then the sum, the product and the zeros). Optional in the file
  // (sharding.tp_loss_backward: as-loss | probabilities-copy | loss-parallel; absent: as-loss).
  enum class TpLossBackward { AsLoss, ProbabilitiesCopy, LossParallel };
  TpLossBackward tp_loss_backward = TpLossBackward::AsLoss;
  // When a unit's per-parameter gradients are released against its reduction's buffers: once copied into the
  // reduce-scatter input, before the output is allocated (false: FSDP2's foreach_reduce, unsharded_grads.clear()
  // after foreach_reduce_scatter_copy_in, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), or only once the
  // reduction is issued, its output (and a staging copy) allocated beside them (true: fsdp-run's post-backward hook,
  // whose gradients autograd holds until the hook returns, executor/shard/sharded_model.cpp post_backward). Optional
  // in the file (sharding.unit_grads_released: after-copy-in | after-reduce-issue; absent: after-copy-in).
  bool unit_grads_held_through_reduce_issue = false;
  // Under offload (optimizer or params) of a sharded strategy, where a unit's reduced gradient shard lives: copied to
  // the host after every reduction and its device copy freed (false: FSDP2's foreach_reduce under CPUOffloadPolicy,
  // `new_sharded_grad.to(torch.device("cpu"), non_blocking=...)` with the comment "we can free it here by not keeping a
  // ref", torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py; FSDP1's _offload_grad into flat_param._cpu_grad,
  // torch/distributed/fsdp/_runtime_utils.py _post_reduce_grad_callback; DeepSpeed ZeRO-3 under offload_optimizer
  // allocates no device grad_partitions_flat_buffer and copies each partition into the fp32 host gradient,
  // deepspeed/runtime/zero/stage3.py partition_grads), or kept on the device, accumulated there and copied once for
  // the step (true: fsdp-run, whose fp32 grad_shard is a persistent device buffer the host AdamW reads after the
  // backward, executor/shard/sharded_model.cpp). Optional in the file
  // (sharding.offloaded_grads: to-host-per-reduction | on-device-until-step; absent: to-host-per-reduction).
  bool offloaded_grads_kept_on_device = false;
  // The token embedding as a wrap unit of its own, resharded after its forward like the decoder layers and gathered
  // again for its backward at the end of the step (true: torchtitan's apply_fsdp, fully_shard(model.tok_embeddings,
  // reshard_after_forward=...) before the layers, torchtitan/distributed/fsdp.py; torchtune's custom_sharded_layers),
  // or a part of the root unit, gathered from the first forward to the end of the backward (false: fully_shard of each
  // decoder layer then of the model, FSDP2's root never resharded after forward; fsdp-run's root). Applies where the
  // decoder layers reshard after forward, the embedding is not tied to the head (tied, torchtitan shards embedding,
  // norm and head as one unit kept after forward) and the model is not pipelined (under pp torchtitan keeps every unit
  // gathered after forward). Optional in the file (sharding.embedding_unit: root | own; absent: root).
  bool embedding_own_unit = false;
  // Under a pipeline schedule (GPipe, 1F1B), whether the stage's FSDP units are resharded at the end of every
  // backward (false: fsdp-run's run_micro_batches) or kept unsharded until the step's last backward (true:
  // torch.distributed.pipelining's PipelineStage.backward_maybe_with_nosync sets set_reshard_after_backward(False)
  // and set_requires_gradient_sync(False) on an FSDPModule for every backward, stage.py @ 0138610331c9, and the
  // schedule reshards and reduces once at the step's end): a unit kept after forward (torchtitan turns
  // reshard_after_forward off under pipeline parallelism) is then gathered once a step and held through it, and one
  // resharded after forward is gathered only by a pass that follows a forward (program/emit_sharded.cpp).
  // Optional in the file (sharding.pipeline_reshard_after_backward: each | last; absent: each).
  bool pipeline_keeps_units_gathered = false;
  // The dtype a unit's unsharded gradient is kept in between backwards that do not reduce it (grad_sync
  // last-micro-batch, or a pipeline schedule that turns gradient sync off: pipeline_keeps_units_gathered):
  // - the compute dtype (false): FSDP1's no_sync accumulates into the flat parameter's low-precision gradient;
  // - the reduce dtype when it differs from the compute dtype (true): FSDP2's post-backward without reduction reshards,
  //   then upcasts each gradient into FSDPParam.unsharded_accumulated_grad (to_accumulated_grad_if_needed, a
  //   reduce-dtype copy beside the compute-dtype one for a moment), and later backwards add theirs into it
  //   (accumulate_unsharded_grad_if_needed) before the reduce-scatter reads it
  //   (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, _fsdp_param_group.py FSDPParamGroup.post_backward).
  // Optional in the file (sharding.unsynced_grads_kept_in: compute-dtype | reduce-dtype; absent: compute-dtype).
  bool unsynced_grads_in_reduce_dtype = false;
  // Which pipeline stages keep each micro-batch's output to the step's end, beyond its backward (until which every
  // schedule holds it, to call the backward on it): none; the last stage's (its logits), torch.distributed.pipelining
  // since pytorch/pytorch#153383 (2025-05-13: stage.py forward_one_chunk, `if self.is_last:
  // self.output_chunks.append(output)`, for the schedule's merged return value); every stage's, the same before it
  // (every forward output appended). output_chunks is cleared when the next step starts (clear_runtime_states). With
  // either, the last stage's output is the logits, the loss computed by the schedule on them. Optional in the file
  // (sharding.pipeline_outputs_to_step_end: none | last-stage | every-stage; absent: none).
  enum class PipelineOutputsKept { None, LastStage, EveryStage };
  PipelineOutputsKept pipeline_outputs_to_step_end = PipelineOutputsKept::None;
  // DeepSpeed's ZeRO-3 (deepspeed/runtime/zero/stage3.py), optional in the file (absent: false / 0, PyTorch's):
  // - a master partition of its own even when the master dtype is the parameters' (bf16_master_weights_and_grads);
  bool zero3_master_copy_same_dtype = false;
  // - the gradient partition is one flat buffer allocated with the optimizer (grad_partitions_flat_buffer), alive
  //   for the whole run, not allocated by the step;
  bool zero3_grad_partition_persistent = false;
  // - the step flattens up to this many elements of the gradient partition at once (sub_group_size) and casts them
  //   to the master dtype: both copies alive during that sub-group's update.
  double zero3_step_sub_group_elems = 0;
  // The dtype gradients are reduced in when the user does not choose one: fp32 (false), or the compute dtype (true:
  // DeepSpeed's engine communication_data_type and grad_accum_dtype follow the model's bf16 / fp16). Optional.
  bool reduce_in_compute_dtype_by_default = false;
  bool eager_softmax_fp32 = false;  // eager attention's softmax runs in fp32 and is cast back to the compute dtype
  // The RMSNorm's mean(x^2) keeps its input, the squared tensor, for backward (LibTorch 1.13's mean.dim
  // backward saves self; 2.x saves only sizes and numel).
  bool norm_mean_keeps_input = false;
  // Autograd keeps the outputs of pointwise ops that only pointwise ops consume, as each eager op's backward
  // formula saves them (a gated MLP's SiLU output, saved by the gating multiply); false: they are recomputed in
  // the backward's fused kernels from the tensors that are saved (AOTAutograd's min-cut partitioner).
  bool pointwise_outputs_saved = true;
  // Per-op selective checkpointing (ActCkpt::SelectiveOp) keeps every output its policy marks MUST_SAVE, also those
  // the backward never reads (a down projection's output, which only enters the residual sum): eager
  // torch.utils.checkpoint's _CachingTorchDispatchMode stores each MUST_SAVE op's output as it runs
  // (torch/utils/checkpoint.py). false: only those the backward reads, as AOTAutograd's partitioner saves a compiled
  // layer's (torch/_functorch/partitioners.py solve_min_cut: MUST_SAVE bans the recomputation of a node the
  // backward needs; a node it does not need is not in the cut). Optional (absent: true).
  bool sac_keeps_unread_outputs = true;
  // Each chain of pointwise ops and reductions between two GEMM / attention kernels runs as one fused kernel that
  // reads the chain's inputs once and writes what leaves it (Inductor), rather than one kernel per op reading and
  // writing whole tensors (eager): program/layer_costs.cpp prices the layer's memory-bound traffic either way.
  bool fused_elementwise = false;
  // Eager kernels that are not PyTorch's per-op defaults (optional keys of `modules`, absent: the defaults), priced
  // by program/layer_costs.cpp eager_elementwise_bytes and the loss ops (program/emit_loss.cpp push_loss_ops):
  // `norm_kernel: single`: each norm is one kernel (flash-attn's Triton layer_norm_fn), reading x and writing y;
  // default `eager`, the norm's ops one kernel each.
  bool norm_single_kernel = false;
  // `rotary_kernel` (RotaryKernel): how q and k are rotated.
  RotaryKernel rotary_kernel = RotaryKernel::Eager;
  // `activation_kernel: single`: a gated MLP's activation and gating multiply are one kernel that reads the gate and
  // up projections' outputs and writes the product, and whose backward reads the incoming gradient and both saved
  // inputs and writes their gradients, recomputing the activation (Liger-Kernel's LigerSiLUMulFunction /
  // LigerGELUMulFunction, src/liger_kernel/ops/swiglu.py, geglu.py); default `eager`, the activation and the multiply
  // one kernel each. What it saves (the gate and up outputs, not the activation's) is pointwise_outputs_saved false.
  bool glu_single_kernel = false;
  // `attention_output_copy: true`: the layer runs sequence-first ([seq, batch, hidden]) while the attention kernel
  // writes batch-first, so with more than one sequence per micro-batch the output projection's matmul copies its
  // transposed input into a dense one.
  bool attention_output_copy = false;
  // `mha_qkv_copy_saved: true`: a layer with as many key/value heads as query heads copies its qkv projection's
  // output once into a (3, batch, seq, heads, dim) tensor and hands the attention kernel q as a view of it, so the
  // q the kernel saves for backward keeps that whole copy alive, k's and v's thirds included, beside the packed kv
  // the kernel saves too (model/module_graph.cpp build_attention, TensorClass::QkvCopyKv).
  bool mha_qkv_copy_saved = false;
  // `value_view_keeps_fused_qkv: true`: the runtime trains the model's own (Hugging Face) attention modules, so for a
  // model whose value is a view of its fused qkv projection's output (ModelSpec::value_views_fused_qkv) the value the
  // attention kernel saves keeps the whole output alive, its q and k parts beside the rotated q and k the kernel saves
  // (model/module_graph.cpp build_attention, TensorClass::FusedQkvQk). false: the runtime's own modules project q, k
  // and v apart (torchtitan, torchtune, nanotron, fsdp-run), or project them fused where the model key, which
  // describes Hugging Face's modules, does not say so (fms-fsdp: configs/runtimes/fms-fsdp.yaml).
  bool value_view_keeps_fused_qkv = false;
  // `kv_repeat`: KvRepeat above.
  KvRepeat kv_repeat = KvRepeat::Never;
  // `loss_kernels: vocab-parallel`: Megatron's vocabulary-parallel cross-entropy as eager kernels over the (fp32)
  // logits (max, subtract into a new tensor, exp in place, sum, divide in place; backward: multiply in place);
  // default `log-softmax`: log_softmax and nll_loss.
  bool loss_vocab_parallel_kernels = false;
  // `loss_kernels: compiled`: the cross-entropy (with its fp32 upcast) compiled by torch.compile (torchtitan
  // components/loss.py build_cross_entropy_loss @ e7c0cae934df78d6e9c2835f42ff1f757dc3fddc: `loss_fn =
  // torch.compile(loss_fn)` under training.compile). Inductor fuses the upcast, the log-softmax's reductions and the
  // target's pick into one pass over the compute-dtype logits, and AOTAutograd's min-cut partitioner saves those
  // logits (2 bytes an element, cheaper than the fp32 log-probabilities) with one log-sum-exp per token; the backward
  // is one kernel that reads them and writes the logits' gradient in the compute dtype (the upcast's backward fused).
  // So the logits live from the head to the loss backward, no fp32 copy exists, and the backward's peak is the logits
  // beside their gradient (program/emit_loss.cpp push_loss_ops). Without tensor parallelism only (the
  // vocabulary-parallel loss keeps its own kernels: the key is ignored under tp, and the runtime profile says so).
  bool loss_compiled = false;
  // `loss_kernels: fused-linear`: the head's GEMMs and the cross-entropy fused and chunked over the tokens, the
  // gradients computed in the forward (Liger-Kernel's LigerFusedLinearCrossEntropyFunction,
  // src/liger_kernel/ops/fused_linear_cross_entropy.py): no logits tensor, one chunk's at a time; the input's and the
  // weight's gradients allocated in the forward and held to the backward, which only scales them
  // (program/emit_loss.cpp push_fused_linear_loss_ops; compute/compute_cost.hpp fused_linear_cross_entropy_time).
  bool loss_fused_linear = false;
  // `loss_output_chunks: N` (N >= 2; absent: 1, the whole sequence at once): the head runs on N chunks of the
  // sequence and returns them in the compute dtype, and the loss upcasts and takes the cross-entropy of one chunk at a
  // time (torchtune's CEWithChunkedOutputLoss with TransformerDecoder.chunked_output). The compute-dtype chunks live
  // through the loss's forward beside one chunk's fp32 copy, and each chunk's fp32 log-probabilities are saved for the
  // backward; the backward runs every chunk's loss backward before the head's, so one chunk's fp32 gradients are
  // transient while the compute-dtype ones gather (program/emit_loss.cpp push_loss_ops). The kernels move the same
  // bytes as unchunked.
  int64_t loss_output_chunks = 1;
  // --- the software stack SDPA's dispatch depends on (section sdpa, optional; compute/sdpa_dispatch.hpp) ---
  // `sdpa.torch_version: "2.11.0"` and `sdpa.cudnn_version: "9.19"`: the torch release and the cuDNN runtime it
  // loads, which decide whether cuDNN's attention comes first in SDPA's order on sm90 / sm100. Not given: the
  // dispatch assumes nothing of them and says so.
  std::string torch_version;
  std::string cudnn_version;
  // --- the training loop around forward and backward (section training_loop) ---
  // Bytes the optimizer step moves per trained parameter with fp32 masters and states (scaled for other
  // master dtypes): 28 for a fused AdamW (read p, g, m, v; write p, m, v), more when it runs as separate
  // elementwise kernels, each reading and writing whole tensors.
  double adamw_bytes_per_param = 0;
  double sgd_bytes_per_param = 0;
  // Bytes moved per gradient element the rank owns to compute the global gradient norm and clip by it
  // (clip_grad_norm_); 0: the loop computes no norm. Nonzero and the optimizer sharded: the partial norms
  // are summed by one scalar all-reduce over the shard group before the step.
  double grad_norm_bytes_per_grad = 0;
  // Bytes moved per gradient element the rank holds by other whole-gradient passes of the step (averaging
  // over the world after the reduction, zeroing in place for the next step).
  double grad_pass_bytes_per_grad = 0;
  // Temporaries of the step after the backward. The optimizer's, in master-dtype elements per parameter it
  // updates at once (torch.optim's foreach AdamW: one list the size of the parameters for sqrt(v); fused
  // optimizers: none), and the gradient norm's, in bytes per gradient element it reads at once (a loop that
  // upcasts a gradient to fp64 and squares it holds two fp64 copies).
  double adamw_temporaries_per_param = 0;
  double grad_norm_temporary_bytes_per_grad = 0;
  // `adamw_under_tp: {bytes_per_param: B, temporaries_per_param: T}` (optional): the AdamW step a tensor-parallel plan
  // runs instead, where the runtime cannot run its usual one there (torchtune's full_finetune_distributed refuses a
  // fused optimizer under tensor parallelism, so its plans with tp run torch.optim's foreach AdamW). Absent: the same
  // step whatever the mesh.
  struct AdamwStep {
    double bytes_per_param = 0;
    double temporaries_per_param = 0;
  };
  std::optional<AdamwStep> adamw_under_tp;
  // The AdamW step a plan with `tp` ranks a tensor-parallel group runs: adamw_under_tp under tp, else the usual one.
  AdamwStep adamw_step(int64_t tp) const {
    if (tp > 1 && adamw_under_tp) return *adamw_under_tp;
    return AdamwStep{adamw_bytes_per_param, adamw_temporaries_per_param};
  }
  // The norm and the optimizer run unit by unit over the wrap units' flat buffers, so their temporaries
  // cover the largest unit's owned elements, not all of them.
  bool step_per_unit = false;
  bool loss_all_reduce = false;  // the step's loss is all-reduced over the mesh (one scalar) every step
  // --- the host's issue time on a GPU (section host_issue, optional): see HostIssue ---
  HostIssue host_issue;
  // --- the mesh the runtime runs (section mesh, optional; absent keys: supported) ---
  // Read by the capability table (strategy/capabilities.hpp) when fsdp-plan simulates or searches for this runtime:
  // tensor_parallel, sequence_parallel, async_tp, pipeline_parallel, interleaved_pipeline, pipeline_tied_embeddings.
  // runtime_name is the profile's name.
  RuntimeSupport support;
};

RuntimeProfile load_runtime(const std::string& name_or_path, const std::string& config_root);

// The shipped runtimes (configs/runtimes/*.yaml under `config_root`, by name, sorted, comma-separated) whose support
// sets `flag`: what a refusal offers instead (strategy/capabilities.cpp). Each profile is read once per root and
// process; one that does not load is left out.
std::string shipped_runtimes_running(const std::string& config_root, bool RuntimeSupport::*flag);

}  // namespace fsdp
