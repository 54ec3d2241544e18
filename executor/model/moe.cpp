#include "model/moe.hpp"

#include <ATen/ATen.h>

namespace fsdp::exec {

namespace {

// The name of shared expert `i` (see moe.hpp).
std::string shared_name(const MoeSpec& m, const std::string& prefix, int64_t i) {
  if (m.shared_experts > 1) return prefix + ".shared_experts." + std::to_string(i);
  return prefix + (m.shared_expert_gate ? ".shared_expert" : ".shared_experts");
}

}  // namespace

void moe_param_defs(const ModelSpec& s, const std::string& prefix, int layer, std::vector<ParamDef>& out) {
  const MoeSpec& m = *s.moe;
  // The router: nn.Linear(hidden, num_experts, bias=False) in every family read (Mixtral, Qwen2/3-MoE, DeepSeek).
  out.push_back({prefix + ".gate.weight", {m.num_experts, s.hidden_size}, ParamInit::Normal, layer});
  for (int64_t e = 0; e < m.num_experts; ++e)
    dense_mlp_param_defs(s, prefix + ".experts." + std::to_string(e), m.expert_ffn_size, layer, out);
  for (int64_t i = 0; i < m.shared_experts; ++i)
    dense_mlp_param_defs(s, shared_name(m, prefix, i), m.shared_ffn(), layer, out);
  if (m.shared_expert_gate)
    out.push_back({prefix + ".shared_expert_gate.weight", {1, s.hidden_size}, ParamInit::Normal, layer});
}

at::Tensor router_scores_fp64(const at::Tensor& x, const at::Tensor& router) {
  at::NoGradGuard no_grad;
  return at::linear(x.to(at::kDouble), router.to(at::kDouble));
}

at::Tensor top_k_experts(const at::Tensor& scores, int64_t k) {
  at::NoGradGuard no_grad;
  return std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(1, 0, k).contiguous();
}

// Routing as Hugging Face's sparse MoE blocks do it (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock.forward): router
// logits, softmax in fp32, the top-k probabilities (divided by their sum when norm_topk_prob), cast to the
// activations' dtype; each routed expert's output times its token's weight, summed per token; plus the shared
// experts (Qwen2-MoE's times sigmoid(shared_expert_gate(x))).
//
// Dispatch is by sorting, as torchtitan's MoE does (torchtitan/models/moe/moe.py TokenReorderer: argsort of the
// chosen experts, then routed_input = x[token_indices_experts_sorted]) and Megatron-LM's token dispatcher permutes
// tokens by expert (megatron/core/transformer/moe/moe_utils.py permute / unpermute), rather than Hugging Face's loop
// of per-expert index copies: one buffer of all routed tokens in expert order, each expert a contiguous slice of it.
// The experts' outputs are put back in token order (the inverse permutation) and summed per token with their
// weights, instead of index_add_ into the output (Hugging Face), whose autograd keeps its whole source for backward
// (derivatives.yaml index_add: source's gradient is expand_as(source)). The buffers, N tokens, top-k, E experts:
//  - router logits [N, E] in the compute dtype (fp32 copy for the softmax); probabilities [N, E] fp32, saved; the
//    scores the choice is made by, fp64 [N, E] from an fp64 copy of x [N, H], and their sort, released at once;
//  - the chosen experts [N, k] int64, saved (the gather of their probabilities); with norm_topk_prob the gathered
//    probabilities [N, k] and their sums [N, 1], fp32, saved by the division; the weights [N, k] in the compute
//    dtype, saved by the weighting multiply;
//  - token_of and unpermute [N k] int64: the token of each routed row in expert order, and the row of each
//    (token, choice) slot, saved by the dispatch gather and the gather back to token order;
//  - dispatched [N k, H]: the routed copies of the tokens, saved (the experts' gate/up input);
//  - each expert's gate, up, activation and product [n_e, ffn] (n_e tokens routed to it; sum n_e = N k), saved;
//  - the experts' outputs joined [N k, H], then in token order [N, k, H] (saved by the weighting multiply), the
//    weighted products [N, k, H] and their sum [N, H].
// Every token goes to exactly k experts (no capacity, no token dropped), so the buffers are N k tokens whatever
// the experts' load; only each expert's GEMM shape depends on it.
// Under tensor parallelism every rank routes the same gathered tokens the same way (the fp64 scores are a function
// of the token) and runs its slice of each expert's width: the experts' outputs, their weighted sum and the shared
// experts' are partial sums, [N, H] and [N k, H] on every rank, and only the experts' intermediate tensors are split.
// The partial block output is summed over tp once, at the end. Each expert's down projection is then a plain linear
// (dense_mlp without a tp context: no sum of its own); the router's and the shared gate's weight gradients, taken
// against partial outputs, are partial too (tensor_parallel.cpp tp_param_defs sums them over tp).
at::Tensor moe_forward(const ModelSpec& s, const ParamMap& p, const std::string& prefix, const at::Tensor& h,
                       const TpContext& tp) {
  const MoeSpec& m = *s.moe;
  const int64_t H = s.hidden_size, k = m.experts_per_token;
  at::Tensor x = h.reshape({-1, H});
  const at::Tensor& router = param(p, prefix + ".gate.weight");
  at::Tensor probs = at::softmax(at::linear(x, router).to(at::kFloat), -1);
  const at::Tensor chosen = top_k_experts(router_scores_fp64(x, router), k);
  at::Tensor weights = probs.gather(1, chosen);
  if (m.norm_topk_prob) weights = weights / weights.sum(-1, true);
  weights = weights.to(h.scalar_type());

  at::Tensor token_of, unpermute;
  std::vector<int64_t> counts(static_cast<std::size_t>(m.num_experts));
  {
    at::NoGradGuard no_grad;
    const at::Tensor flat = chosen.reshape({-1});  // slot t * k + j: token t's j-th expert
    // A stable sort keeps each expert's tokens in token order.
    const at::Tensor order = std::get<1>(at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    token_of = at::div(order, k, "floor");
    unpermute = at::empty_like(order).scatter_(0, order, at::arange(order.numel(), order.options()));
    const at::Tensor n = at::bincount(flat, {}, m.num_experts).cpu();
    const auto a = n.accessor<int64_t, 1>();
    for (int64_t e = 0; e < m.num_experts; ++e) counts[static_cast<std::size_t>(e)] = a[e];
  }
  // The experts' outputs joined in expert order; the per-expert outputs are released as soon as they are joined.
  at::Tensor routed;
  {
    const std::vector<at::Tensor> per_expert = x.index_select(0, token_of).split_with_sizes(counts);
    std::vector<at::Tensor> outs;
    for (int64_t e = 0; e < m.num_experts; ++e)
      if (counts[static_cast<std::size_t>(e)] > 0)
        outs.push_back(
            dense_mlp(s, p, prefix + ".experts." + std::to_string(e), per_expert[static_cast<std::size_t>(e)]));
    routed = at::cat(outs, 0);
  }
  // Back in token order, [N, k, H], and summed over each token's k experts with their weights: a fixed order of
  // the k terms (best expert first), the same whatever else the micro-batch holds.
  routed = routed.index_select(0, unpermute).view({-1, k, H});
  at::Tensor y = (routed * weights.unsqueeze(2)).sum(1);

  if (m.shared_experts > 0) {
    at::Tensor shared = dense_mlp(s, p, shared_name(m, prefix, 0), x);
    for (int64_t i = 1; i < m.shared_experts; ++i) shared = shared + dense_mlp(s, p, shared_name(m, prefix, i), x);
    if (m.shared_expert_gate) shared = at::sigmoid(linear(p, prefix + ".shared_expert_gate", x)) * shared;
    y = y + shared;
  }
  return tp_exit(tp, y.view(h.sizes()));
}

}  // namespace fsdp::exec
