// The final norm, the LM head and the loss (program/step_emitter.hpp): their compute, saved and transient memory,
// and the head's gradients.

#include <algorithm>

#include "compute/compute_cost.hpp"
#include "program/step_emitter.hpp"

namespace fsdp::step_emission {

double Emitter::head_grad_bytes() const {
  // Only where they are separate per-parameter tensors until the root's post-backward, not views into a persistent
  // buffer; autograd's, in the compute dtype: FSDP2's unsharded .grad, fsdp-run's UnitParamsFn inputs (its ZeRO-2
  // too: executor/shard/sharded_model.cpp post_backward copies them into a flat buffer after the root's backward).
  if (!sharded && !rt.replicated_grads_via_flat_copy) return 0.0;
  return head_train * pb;
}

// Liger-Kernel's fused linear cross-entropy (RuntimeProfile::loss_fused_linear; linkedin/Liger-Kernel
// src/liger_kernel/ops/fused_linear_cross_entropy.py @ ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c,
// LigerFusedLinearCrossEntropyFunction). Its forward zeroes the input's gradient (tokens x H) and the weight's (V x H,
// in the weight's dtype as the forward sees it), then per chunk of rows (compute_cost.hpp fused_linear_ce_chunk_rows)
// computes the chunk's logits, runs liger_cross_entropy_kernel over them (ops/cross_entropy.py: an online-softmax pass
// reading the row, a second reading it and writing its gradient in place: 3 passes), writes the chunk's input gradient
// (a GEMM into a temporary copied into its slice) and accumulates the weight's (addmm, beta 1). It saves the two
// gradients for the backward, which only scales them by the incoming gradient in place (element_mul_kernel, read and
// write each; Transformers' loss is a sum divided by the batch's items, so the gradient is not 1) and returns them:
// the weight's becomes the head's gradient. The input's gradient takes the place of the head's saved input (the final
// norm's output, the same size), which the fused loss does not keep; the logits never exist whole.
void Emitter::push_fused_linear_loss_ops(int mbi) {
  FSDP_ASSERT(s.mesh.tp == 1 && !loss_stage_outputs_logits(),
              "the fused linear cross-entropy runs without tp or a "
              "pipeline schedule's loss (rule KernelLibrary's runtimes)");
  const GemmShape& head = prog.head_gemm;
  const double tok = static_cast<double>(head.m), vocab = static_cast<double>(head.n);
  const double hidden = static_cast<double>(head.k);
  const double rows = static_cast<double>(std::min(fused_linear_ce_chunk_rows(head.m, head.n, head.k), head.m));
  // The weight as the forward reads it: the gathered compute-dtype copy of a sharded strategy, else the replica as
  // stored (fp32 under autocast, the compute dtype under DeepSpeed's low-precision ZeRO-1/2).
  const double weight_bytes = sharded ? pb : sb;
  const double grad_weight = holds_head() ? head_train * weight_bytes : 0.0;
  const double grad_input = tok * hidden * pb;
  const double loss_rows = tok * 4.0;  // loss_1d, fp32
  prog.fused_linear_loss = true;
  Op l;
  l.kind = OpKind::Loss;
  l.phase = Phase::HeadLossForward;
  l.micro_batch = mbi;
  l.unit = 0;
  l.head_fused_loss = holds_head();
  l.transient_bytes = rows * vocab * pb + rows * hidden * pb;
  l.on_issue.push_back({MemoryCategory::Activations, grad_weight + loss_rows});
  l.elementwise_bytes = grad_input + grad_weight + 3.0 * tok * vocab * pb + 2.0 * grad_input;
  push(l);
  Op lb;
  lb.kind = OpKind::LossBackward;
  lb.phase = Phase::LossBackward;
  lb.micro_batch = mbi;
  lb.unit = 0;
  lb.on_complete.push_back({MemoryCategory::Activations, -(grad_weight + loss_rows + head_act)});
  lb.on_complete.push_back({MemoryCategory::UnshardedGrads, head_grad_bytes()});
  if (mbi == 0) keep_adapter_grads(lb);
  lb.elementwise_bytes = 2.0 * (grad_input + grad_weight);
  push(lb);
}

void Emitter::push_loss_ops(int mbi) {
  if (rt.loss_fused_linear) {
    push_fused_linear_loss_ops(mbi);
    return;
  }
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
  const bool compiled = rt.loss_compiled && s.mesh.tp == 1;
  // PyTorch's cross-entropy over whole logits (F.cross_entropy = log_softmax + nll_loss; under tp, the logits gathered
  // first, tp_head_output_replicated): the upcast, `logits.float()` (read 2, write 4 bytes a logit), is a plain copy;
  // log_softmax's forward over rows longer than its shared-memory path holds (aten/src/ATen/native/cuda/SoftMax.cu
  // host_softmax: max_elements_per_smem is the 48 KiB of sharedMemPerBlock over the element size, 12,288 fp32 logits,
  // so every vocabulary from 16k up) runs cunn_SoftMaxForward, which reads the row for its max, again for the sum of
  // exponentials and a third time to write the output: 4 passes over the logits in the loss's dtype (fp32 once
  // upcast); nll_loss's forward gathers one element a row. Priced at the softmax kernels' own rate
  // (HardwareProfile::softmax_bandwidth). A vocabulary-parallel loss, a compiled one and an in-place backward run
  // other kernels (below).
  const bool softmax_kernels = !compiled && !rt.loss_vocab_parallel_kernels && !rt.loss_backward_in_place &&
                               (s.mesh.tp == 1 || rt.tp_head_output_replicated);
  const double loss_elems_bytes = logits_elems() * (upcasts ? 4.0 : pb);
  l.elementwise_bytes =
      softmax_kernels ? HardwareProfile::kSoftmaxForwardPasses * loss_elems_bytes : logits + upcast + logprobs;
  l.elementwise_softmax = softmax_kernels;
  l.device_copy_bytes = softmax_kernels && upcasts ? logits + upcast : 0.0;
  // Megatron's vocabulary-parallel cross-entropy as eager kernels (RuntimeProfile::loss_vocab_parallel_kernels;
  // huggingface/nanotron src/nanotron/parallel/tensor_parallel/functional.py _ShardedCrossEntropy.forward @
  // 67c5ebb6a925cb47026b22013af8bd1bb6c46d93), over the logits in the loss's dtype (fp32 once upcast): after the
  // upcast (read the logits, write the copy), torch.max reads them (1), the subtraction of the max writes a new
  // tensor (r/w: 2), torch.exp(out=) rewrites it in place (2), .sum reads it (1), div_ normalises it in place (2):
  // 8 passes. The target gathers and the all-reduces' buffers are one element per token.
  if (rt.loss_vocab_parallel_kernels) l.elementwise_bytes = logits + upcast + 8.0 * loss_elems_bytes;
  // DTensor's loss_parallel (RuntimeProfile::TpLossBackward::LossParallel; torch/distributed/tensor/parallel/loss.py
  // _log_softmax, which follows torch._decomp's): in the computation dtype (fp32), torch.amax reads the logits (1),
  // `shifted = x - x_max` writes a copy (2), torch.exp(shifted) a temporary (2) that torch.sum reads (1), and
  // `shifted - shifted_logsumexp` writes the log-probabilities (2): 7 passes, after the upcast. The shifted copy lives
  // to the end beside the input and the output, the exponentials before the output exists: one more logits-sized
  // fp32 tensor than the log-probabilities and the input.
  const bool loss_parallel = s.mesh.tp > 1 && !rt.tp_head_output_replicated && !rt.loss_vocab_parallel_kernels &&
                             !compiled && rt.tp_loss_backward == RuntimeProfile::TpLossBackward::LossParallel;
  const double fp32_pass = logits_elems() * 4.0;
  // Compute-dtype logits the loss did not upcast are cast to fp32 first and the result back (the decomposition's
  // x.to(computation_dtype) and result.to(result_dtype)).
  const double to_fp32_and_back = (upcasts || pb >= 4.0) ? 0.0 : 2.0 * (logits + fp32_pass);
  constexpr double kLossParallelForwardPasses = 7, kLossParallelBackwardPasses = 8;
  if (loss_parallel) {
    l.elementwise_bytes = logits + upcast + kLossParallelForwardPasses * fp32_pass + to_fp32_and_back;
    l.transient_bytes += fp32_pass;
  }
  // The head's GEMM where this stage holds it (not on nanotron's loss stage after the head's: push_head_ops).
  l.head_passes = holds_head() ? 1 : 0;
  // A compiled loss (RuntimeProfile::loss_compiled): one pass over the compute-dtype logits, which it saves for its
  // backward in place of the log-probabilities; no fp32 copy.
  if (compiled) {
    l.transient_bytes = 0;
    l.on_issue = {};
    // The logits it saves are the stage's output where the schedule computes the loss on it (below): counted there.
    if (!schedule_keeps) l.on_issue.push_back({MemoryCategory::Activations, logits});
    l.elementwise_bytes = logits;
  }
  // The loss chunk by chunk (RuntimeProfile::loss_output_chunks; torchtune/modules/loss/ce_chunked_output_loss.py @
  // a6290a5 CEWithChunkedOutputLoss.forward: `logits.float()` and F.cross_entropy per chunk, over the compute-dtype
  // chunks TransformerDecoder.chunked_output returns): the chunks live through the loss, one chunk's fp32 copy beside
  // them, each chunk's log_softmax output saved as it goes. Priced over the whole sequence with a vocabulary-parallel,
  // compiled or in-place loss, under a vocabulary-parallel head or a pipeline schedule's loss: the chunked loss is
  // torchtune's eager log-softmax over whole logits (under tp its head gathers each chunk's: tp_head_output_replicated;
  // priced as one gather of them all).
  const double chunks = static_cast<double>(rt.loss_output_chunks);
  const bool chunked = chunks > 1 && upcasts && !compiled && !rt.loss_vocab_parallel_kernels &&
                       !rt.loss_backward_in_place && (s.mesh.tp == 1 || rt.tp_head_output_replicated) &&
                       !schedule_keeps;
  if (chunked) l.transient_bytes = logits + upcast / chunks;
  // A schedule that computes the loss on the stage's output (torch.distributed.pipelining) holds the logits to this
  // micro-batch's backward, or to the step's end.
  if (schedule_keeps) hold_stage_output(l, mbi, logits);
  push_tp_head(mbi, false, -1);
  const int lop = push(l);
  if (s.mesh.tp > 1 && rt.tp_head_output_replicated) {
    // The gathered shards laid side by side along the vocabulary (DTensor's Shard(-1) -> Replicate: NCCL gathers
    // the shards one after the other, torch.cat joins them on the last dimension): the whole logits read and written
    // once. The loss is then as without tp, on every rank; its backward slices the gradient of this rank's shard.
    prog.ops[static_cast<size_t>(lop)].device_copy_bytes += 2.0 * logits;
  } else if (s.mesh.tp > 1) {
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
  // (RuntimeProfile::TpLossBackward::ProbabilitiesCopy): the copy beside them; the upcast's backward runs after
  // they are released, its compute-dtype gradient beside the fp32 one (less than the copy and the probabilities).
  else if (s.mesh.tp > 1 && rt.tp_loss_backward == RuntimeProfile::TpLossBackward::ProbabilitiesCopy)
    lb.transient_bytes = logprobs + (caller_keeps ? logits : 0.0);
  // DTensor's loss_parallel (above): _nll_loss_and_log_softmax_backward's zeros_like(x), torch.exp(x) and their sum
  // (then the sum, the product by grad_output and the zeros) beside the saved log-probabilities, in fp32.
  else if (loss_parallel)
    lb.transient_bytes = 3.0 * fp32_pass + (caller_keeps ? logits : 0.0);
  const double saved = compiled ? (schedule_keeps ? 0.0 : logits) : logprobs;
  lb.on_complete.push_back({MemoryCategory::Activations, -(saved + head_act)});
  if (schedule_keeps && !keeps_stage_outputs()) lb.on_complete.push_back({MemoryCategory::Activations, -logits});
  // The head's weight gradient comes out of the head GEMM's backward, after the logits' gradients
  // (the peak of this op) are released.
  lb.on_complete.push_back({MemoryCategory::UnshardedGrads, head_grad_bytes()});
  if (mbi == 0) keep_adapter_grads(lb);
  // PyTorch's kernels (above): nll_loss's backward zeroes the log-probabilities' gradient (one write) and scatters one
  // element a row; cunn_SoftMaxBackward reads that gradient for its row sum, then it and the saved output again to
  // write the logits' gradient: 5 passes in the loss's dtype. The upcast's backward casts the gradient back (read 4,
  // write 2 bytes a logit), a copy.
  lb.elementwise_bytes =
      softmax_kernels ? HardwareProfile::kSoftmaxBackwardPasses * loss_elems_bytes : lb.transient_bytes + logprobs;
  lb.elementwise_softmax = softmax_kernels;
  lb.device_copy_bytes = softmax_kernels && upcasts ? upcast + logits : 0.0;
  // Chunked, every chunk's loss backward runs before the head's (the autograd engine takes the ready node created
  // last, and the head's chunk GEMMs were created before any loss op): one chunk's two fp32 gradients and its
  // compute-dtype one are transient while the saved log-probabilities are released and the compute-dtype gradients
  // gather, at most at the first chunk (the fp32 log-probabilities are twice as wide as the gradients that replace
  // them). The kernels move the same bytes.
  if (chunked) lb.transient_bytes = (logprobs * 2.0 + logits) / chunks + (caller_keeps ? logits : 0.0);
  // _ShardedCrossEntropy.backward (functional.py above): the target's subtraction is one element per token and
  // grad_input.mul_(grad_output) rewrites the saved probabilities in place (2 passes); the upcast's backward casts
  // that gradient back to the compute dtype (read it, write the logits' gradient).
  if (rt.loss_vocab_parallel_kernels) lb.elementwise_bytes = 2.0 * loss_elems_bytes + (upcasts ? upcast + logits : 0.0);
  // DTensor's loss_parallel backward: zeros_like writes (1), torch.exp reads x and writes (2), the sum reads both and
  // writes (3), the product reads it and writes (2): 8 fp32 passes (the scatter of the targets is one element a row);
  // then the upcast's backward casts the gradient back (read 4, write 2 bytes a logit).
  if (loss_parallel)
    lb.elementwise_bytes =
        kLossParallelBackwardPasses * fp32_pass + (upcasts ? upcast + logits : 0.0) + to_fp32_and_back;
  // Compiled: one kernel reads the saved logits and writes their gradient in the compute dtype, beside them.
  if (compiled) {
    lb.transient_bytes = logits;
    lb.elementwise_bytes = 2.0 * logits;
  }
  lb.head_passes = holds_head() ? 2 : 0;
  push_tp_head(mbi, true, push(lb));
}

Op Emitter::head_op(OpKind kind, Phase phase, int mbi, double passes) {
  Op op;
  op.kind = kind;
  op.phase = phase;
  op.micro_batch = mbi;
  op.unit = 0;
  op.head_passes = passes;
  return op;
}

void Emitter::push_head_ops(int mbi) {
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

}  // namespace fsdp::step_emission
