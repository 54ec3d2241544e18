#include "program/root_module_costs.hpp"

#include "program/layer_costs.hpp"

namespace fsdp {

namespace {

// ATen's fp32 partial sums of the embedding backward (acc_type of bf16 / fp16 is float).
constexpr double kEmbeddingPartialBytes = 4.0;

}  // namespace

// The embedding, as ATen runs it on CUDA (pytorch/pytorch @ 01b9dc565e8cdd6fd13ad2ab8a80de76e192b880):
//  - forward: embedding -> index_select reads the looked-up rows and writes the output, 2 h-wide tensors a token;
//    vocabulary-parallel (tp > 1: Megatron-LM VocabParallelEmbedding, DTensor's _MaskPartial for torchtitan's
//    RowwiseParallel) each rank also zeroes the rows of tokens outside its vocabulary slice, one more r/w pass;
//  - backward (aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu embedding_backward_cuda_kernel):
//    `at::zeros({num_weights, h})` writes the whole gradient table in the gradient's dtype; compute_grad_weight reads
//    the output gradient and writes fp32 partial sums a token (`grad_weight_per_segment`, acc_type), and
//    sum_and_scatter reads them and writes the rows: V/tp x h x b + tokens x h x (2b + 2 x 4), the index sort aside.
//    A frozen embedding (LoRA, QLoRA) gets no weight gradient: no backward kernel.
//  - learned positions are the same lookup, plus the add of the two embeddings (r 2, w 1); the add's backward
//    passes the gradient through.
// The embedding's output dtype is the residual stream's (autocast leaves embedding in the parameters' dtype).
// The final norm moves what a layer's norm moves per element (norm_traffic_per_element), on the tokens between
// blocks: 1/tp of them with sequence parallelism. torchtitan and pytorch-compile compile the blocks only, so their
// final norm runs eager but is priced here as fused, as the layers' are: 30h bytes a token less than HF's eager
// norm, one norm against the layers' 2L.
RootModuleTraffic root_module_traffic(const ModuleGraph& g, ModuleId module, const Strategy& s,
                                      const RuntimeProfile& rt, const ActivationQuery& q, double tokens) {
  const ModuleNode& n = g.node(module);
  const double tp = static_cast<double>(s.mesh.tp);
  const double res = tensor_bytes(TensorClass::Residual, q);
  RootModuleTraffic t;
  if (n.kind == ModuleKind::Norm) {
    const double token_share = s.mesh.sequence_parallel ? 1.0 / tp : 1.0;
    const NormTraffic nt = norm_traffic_per_element(rt, dtype_bytes(s.param_dtype), q.norm_fp32_internal);
    const double elems = tokens * token_share * static_cast<double>(n.output_elems_per_token);
    t.forward_bytes = elems * nt.forward;
    t.backward_bytes = elems * nt.backward;
    return t;
  }
  if (n.kind != ModuleKind::Embedding && n.kind != ModuleKind::PositionEmbedding) return t;
  const double h = static_cast<double>(n.output_elems_per_token);
  if (h <= 0) return t;
  const double out = tokens * h * res;
  t.forward_bytes = 2.0 * out;
  if (s.mesh.tp > 1) t.forward_bytes += 2.0 * out;
  if (n.kind == ModuleKind::PositionEmbedding) t.forward_bytes += 3.0 * out;
  if (s.method != Method::Full) return t;
  const double table = static_cast<double>(g.params_under(module)) / tp * res;
  t.backward_bytes = table + 2.0 * out + 2.0 * tokens * h * kEmbeddingPartialBytes;
  return t;
}

}  // namespace fsdp
