// The mixture-of-experts MLP block of a decoder layer (ModelSpec::moe, simulator/model/model_spec.hpp MoeSpec):
// a softmax router choosing top-k of the routed experts per token, every routed expert a dense MLP of
// expert_ffn_size over the tokens routed to it, and shared experts over every token. No expert parallelism:
// the experts are parameters of their layer like any other, in the layer's wrap unit. Under tensor parallelism each
// expert is split as a dense MLP is (gate/up column-parallel, down row-parallel: torchtitan's TensorParallel plan for
// grouped experts without expert parallelism, torchtitan/models/llama4/infra/parallelize.py apply_moe_ep_tp: the
// block's input gathered to Replicate, its output Partial reduce-scattered; Megatron-LM's expert tensor parallelism),
// the router runs whole on every rank over the gathered tokens, and the block's output, a sum of the experts' partial
// outputs, is summed over tp once (tensor_parallel.hpp tp_exit).
//
// Parameter names are Hugging Face's Qwen2-MoE / Qwen3-MoE ones (transformers models/qwen2_moe/modeling_qwen2_moe.py
// Qwen2MoeSparseMoeBlock, models/qwen3_moe/modeling_qwen3_moe.py): model.layers.N.mlp.gate.weight [E, H],
// mlp.experts.e.{gate,up,down}_proj.weight, and for one shared expert behind a sigmoid gate (Qwen2-MoE)
// mlp.shared_expert.* with mlp.shared_expert_gate.weight [1, H]; an ungated shared MLP is DeepSeek's
// mlp.shared_experts.* (modeling_deepseek_v3.py DeepseekV3MoE); several are mlp.shared_experts.i.*.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "model/model_spec.hpp"
#include "model/ops.hpp"
#include "model/tensor_parallel.hpp"

namespace fsdp::exec {

// The parameters of decoder layer `layer`'s MoE block `prefix` ("model.layers.N.mlp"), appended to `out`.
void moe_param_defs(const ModelSpec& s, const std::string& prefix, int layer, std::vector<ParamDef>& out);

// The MoE block on the post-attention norm's output h [B, T, H] (under tp the whole sequence, gathered by the
// caller's tp_enter); returns [B, T, H], under tp summed over the group (tp_exit: [B, T/tp, H] with sequence
// parallelism).
at::Tensor moe_forward(const ModelSpec& s, const ParamMap& p, const std::string& prefix, const at::Tensor& h,
                       const TpContext& tp);

// The scores the routing chooses by: the router logits of x [N, H] recomputed in fp64, without autograd. A GEMM's
// rounding depends on its shape (the rows beside a token), so fp32 logits of one token may differ in their last
// bit between a micro-batch of 2 rows and one of 8, and flip a near tie between two experts; in fp64 such
// differences are 2^29 times smaller than fp32's resolution, and the choice is a function of the token alone
// (Megatron-LM routes in fp32 or fp64 for the same reason: --moe-router-dtype,
// megatron/core/transformer/moe/router.py). The softmax probabilities that weight the experts stay the fp32 ones
// autograd differentiates.
at::Tensor router_scores_fp64(const at::Tensor& x, const at::Tensor& router);

// The routing of N tokens by their scores [N, E] (logits or probabilities: the order is the same): for each token its
// top-k experts, best first ([N, k] int64). Ties between equal scores go to the lower expert index (a stable descending
// sort), so a token is routed the same way whatever else is in its micro-batch, on every rank and in every run.
at::Tensor top_k_experts(const at::Tensor& scores, int64_t k);

}  // namespace fsdp::exec
