#include "model/tensor_parallel.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "model/ops.hpp"

namespace fsdp::exec {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

RowRange split_rows(int64_t n, int parts, int index) {
  const int64_t base = n / parts, extra = n % parts;
  RowRange r;
  r.start = index * base + std::min<int64_t>(index, extra);
  r.size = base + (index < extra ? 1 : 0);
  return r;
}

int kv_group_size(const ModelSpec& spec, int tp) {
  return spec.num_kv_heads < tp ? tp / static_cast<int>(spec.num_kv_heads) : 1;
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The module of a parameter name: "model.layers.0.self_attn.q_proj.weight" -> "q_proj"; "lm_head.weight" ->
// "lm_head".
std::string module_of(const std::string& name) {
  const std::string m = name.substr(0, name.rfind('.'));
  return m.substr(m.rfind('.') + 1);
}

void slice(ParamDef& d, int dim, RowRange r) {
  d.full_shape = d.shape;
  d.tp_dim = dim;
  d.tp_start = r.start;
  d.shape[static_cast<std::size_t>(dim)] = r.size;
}

}  // namespace

std::vector<ParamDef> tp_param_defs(const std::vector<ParamDef>& full, const ModelSpec& s, int tp, int tp_rank,
                                    bool sequence_parallel) {
  if (tp <= 1) return full;
  const int64_t hd = s.head_dim;
  const RowRange heads = split_rows(s.num_heads, tp, tp_rank);
  // kv heads: split when there are at least tp of them, else the one serving this rank's query heads.
  RowRange kv;
  if (s.num_kv_heads >= tp) {
    kv = split_rows(s.num_kv_heads, tp, tp_rank);
  } else {
    kv.start = heads.start / (s.num_heads / s.num_kv_heads);
    kv.size = 1;
  }
  const int kv_group = kv_group_size(s, tp);
  std::vector<ParamDef> out = full;
  for (ParamDef& d : out) {
    const std::string mod = module_of(d.name);
    const bool weight = ends_with(d.name, ".weight");
    if (mod == "embed_tokens" || mod == "lm_head") {
      slice(d, 0, split_rows(d.shape[0], tp, tp_rank));
    } else if (mod == "q_proj") {
      slice(d, 0, {heads.start * hd, heads.size * hd});
    } else if (mod == "k_proj" || mod == "v_proj") {
      slice(d, 0, {kv.start * hd, kv.size * hd});
      if (kv_group > 1) {
        d.grad_sum = TpGradSum::KvGroup;
        d.counts_in_norm = tp_rank % kv_group == 0;
      }
    } else if ((mod == "gate_proj" || mod == "up_proj") && d.layer >= 0) {
      slice(d, 0, split_rows(d.shape[0], tp, tp_rank));
    } else if ((mod == "o_proj" || mod == "down_proj") && weight) {
      const int64_t cols = d.shape[1];
      slice(d, 1, mod == "o_proj" ? RowRange{heads.start * hd, heads.size * hd} : split_rows(cols, tp, tp_rank));
    } else {
      // Replicated: norms, row-parallel biases, position embeddings, Qwen3's q/k norms, an MoE block's router and
      // shared-expert gate. Their gradient is partial where the rank saw part of their use: its sequence slice
      // (sequence parallelism), its heads (q/k norms), its slice of the experts' widths (the gates).
      const bool per_head_norm = mod == "q_norm" || mod == "k_norm";
      // An MoE block's router and shared-expert gate weigh the experts' partial outputs (moe.cpp): partial gradients.
      const bool moe_gate = s.moe && (mod == "gate" || mod == "shared_expert_gate");
      if (sequence_parallel || per_head_norm || moe_gate) d.grad_sum = TpGradSum::Tensor;
      d.counts_in_norm = tp_rank == 0;
    }
  }
  return out;
}

at::Tensor tp_slice(const ParamDef& d, const at::Tensor& full) {
  if (d.tp_dim < 0) return full;
  return full.narrow(d.tp_dim, d.tp_start, d.shape[static_cast<std::size_t>(d.tp_dim)]);
}

namespace {

Group& group_of(int64_t addr) { return *reinterpret_cast<Group*>(addr); }

// Under the step program's phases (program/emit_mesh.cpp push_tp): a unit's tp collectives in forward (and in a
// checkpointed unit's recomputed forward, which runs inside its backward) and in backward.
CollectiveTag tag_of(const TpContext& tp) {
  const bool bwd = tp.in_backward != nullptr && *tp.in_backward;
  return CollectiveTag{bwd ? Phase::TpBackwardCollectives : Phase::TpForwardCollectives, GroupKind::Tensor, tp.unit};
}

// The sequence dimension (1 of [B, T, H]) first and contiguous, as one flat buffer for the group's
// all-gather / reduce-scatter (rank r's part lands at [r*n, (r+1)*n)).
at::Tensor seq_major(const at::Tensor& x) {
  at::Tensor buf = at::empty({x.size(1), x.size(0), x.size(2)}, x.options());
  buf.copy_(x.transpose(0, 1));
  return buf;
}

at::Tensor all_gather_seq(Group& g, const at::Tensor& x, const CollectiveTag& tag) {
  at::Tensor local = seq_major(x);
  at::Tensor full = at::empty({local.size(0) * g.size(), local.size(1), local.size(2)}, x.options());
  g.all_gather(local.view({-1}), full.view({-1}), tag).wait();
  // Batch-major and contiguous once, here: a transposed view would make every linear reading it (q, k and v; gate
  // and up) fold its own contiguous copy for the GEMM (at::matmul's reshape of a non-viewable input) and save that
  // copy for its weight gradient, five copies of the gathered input a layer where autograd should keep one
  // (measured: tests/accuracy grid row 56, 0.8 MiB of 13.3).
  return full.transpose(0, 1).contiguous();
}

at::Tensor reduce_scatter_seq(Group& g, const at::Tensor& y, const CollectiveTag& tag) {
  at::Tensor full = seq_major(y);  // scratch of the reduce-scatter
  const int64_t T = full.size(0);
  FSDP_ASSERT(T % g.size() == 0, "sequence parallelism: the sequence must split evenly over tp");
  at::Tensor part = at::empty({T / g.size(), full.size(1), full.size(2)}, y.options());
  g.reduce_scatter_sum(full.view({-1}), part.view({-1}), tag).wait();
  return part.transpose(0, 1);
}

at::Tensor all_reduce(Group& g, const at::Tensor& y, const CollectiveTag& tag) {
  at::Tensor out = y.contiguous().clone();
  g.all_reduce_sum(out, tag).wait();
  return out;
}

CollectiveTag saved_tag(AutogradContext* ctx) {
  return CollectiveTag{Phase::TpBackwardCollectives, GroupKind::Tensor,
                       static_cast<int>(ctx->saved_data["unit"].toInt())};
}

void save(AutogradContext* ctx, int64_t group, int64_t unit) {
  ctx->saved_data["group"] = group;
  ctx->saved_data["unit"] = unit;
}

// Megatron's f (copy_to_tensor_model_parallel_region): identity forward, all-reduce backward.
struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t group, int64_t unit) {
    save(ctx, group, unit);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduce(group_of(ctx->saved_data["group"].toInt()), g[0], saved_tag(ctx)), at::Tensor(), at::Tensor()};
  }
};

// Megatron's g (reduce_from_tensor_model_parallel_region): all-reduce forward, identity backward.
struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, at::Tensor y, int64_t group, int64_t tag_addr) {
    return all_reduce(group_of(group), y, *reinterpret_cast<const CollectiveTag*>(tag_addr));
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor(), at::Tensor()}; }
};

// gather_from_sequence_parallel_region: all-gather along the sequence forward, reduce-scatter backward.
struct GatherSeq : public torch::autograd::Function<GatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t group, int64_t tag_addr) {
    const auto& tag = *reinterpret_cast<const CollectiveTag*>(tag_addr);
    save(ctx, group, tag.unit);
    return all_gather_seq(group_of(group), x, tag);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {reduce_scatter_seq(group_of(ctx->saved_data["group"].toInt()), g[0], saved_tag(ctx)), at::Tensor(),
            at::Tensor()};
  }
};

// reduce_scatter_to_sequence_parallel_region: reduce-scatter along the sequence forward, all-gather backward.
struct ScatterSeq : public torch::autograd::Function<ScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor y, int64_t group, int64_t tag_addr) {
    const auto& tag = *reinterpret_cast<const CollectiveTag*>(tag_addr);
    save(ctx, group, tag.unit);
    return reduce_scatter_seq(group_of(group), y, tag);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_gather_seq(group_of(ctx->saved_data["group"].toInt()), g[0], saved_tag(ctx)), at::Tensor(),
            at::Tensor()};
  }
};

// Megatron core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy: with m the row maximum over every
// rank's logits, loss = log(sum_v exp(l_v - m)) - (l_target - m), the three terms all-reduced over tp; the
// gradient is softmax - onehot(target) on each rank's own columns.
struct VocabParallelCE : public torch::autograd::Function<VocabParallelCE> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor logits, at::Tensor targets, int64_t group,
                            int64_t vocab_start, int64_t tag_addr) {
    Group& g = group_of(group);
    const auto& tag = *reinterpret_cast<const CollectiveTag*>(tag_addr);
    const int64_t V = logits.size(1);
    at::Tensor max = std::get<0>(logits.max(1));
    g.all_reduce_max(max, tag).wait();
    at::Tensor shifted = logits - max.unsqueeze(1);
    at::Tensor outside = (targets < vocab_start).logical_or(targets >= vocab_start + V);
    at::Tensor local = (targets - vocab_start).masked_fill(outside, 0);
    at::Tensor picked = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
    at::Tensor exp = shifted.exp_();
    at::Tensor sums = at::stack({exp.sum(1), picked});  // one all-reduce for both
    g.all_reduce_sum(sums, tag).wait();
    at::Tensor loss = sums[0].log() - sums[1];
    exp.div_(sums[0].unsqueeze(1));  // the softmax over the whole vocabulary, this rank's columns
    ctx->save_for_backward({exp, local, outside});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();
    at::Tensor inside = saved[2].logical_not().to(grad.scalar_type());
    grad.scatter_add_(1, saved[1].unsqueeze(1), -inside.unsqueeze(1));
    grad.mul_(grads[0].unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor tp_enter(const TpContext& tp, const at::Tensor& x) {
  if (!tp.active()) return x;
  const auto group = reinterpret_cast<int64_t>(tp.group);
  const CollectiveTag tag = tag_of(tp);
  if (tp.sequence_parallel) return GatherSeq::apply(x, group, reinterpret_cast<int64_t>(&tag));
  return CopyToTp::apply(x, group, static_cast<int64_t>(tp.unit));
}

at::Tensor tp_exit(const TpContext& tp, const at::Tensor& y) {
  if (!tp.active()) return y;
  const auto group = reinterpret_cast<int64_t>(tp.group);
  const CollectiveTag tag = tag_of(tp);
  if (tp.sequence_parallel) return ScatterSeq::apply(y, group, reinterpret_cast<int64_t>(&tag));
  return ReduceFromTp::apply(y, group, reinterpret_cast<int64_t>(&tag));
}

at::Tensor row_parallel_linear(const TpContext& tp, const ParamMap& p, const std::string& prefix, const at::Tensor& x) {
  if (!tp.active()) return linear(p, prefix, x);
  at::Tensor y = tp_exit(tp, at::linear(x, param(p, prefix + ".weight")));
  const at::Tensor* b = find_param(p, prefix + ".bias");
  return b != nullptr ? y + *b : y;
}

at::Tensor vocab_parallel_embedding(const TpContext& tp, const at::Tensor& w, const at::Tensor& tokens) {
  if (!tp.active()) return at::embedding(w, tokens);
  // Megatron VocabParallelEmbedding: ids outside this rank's rows look up row 0 and are zeroed.
  at::Tensor outside = (tokens < tp.vocab.start).logical_or(tokens >= tp.vocab.start + tp.vocab.size);
  at::Tensor local = (tokens - tp.vocab.start).masked_fill(outside, 0);
  return tp_exit(tp, at::embedding(w, local).masked_fill(outside.unsqueeze(-1), 0.0));
}

at::Tensor vocab_parallel_cross_entropy(const TpContext& tp, const at::Tensor& logits, const at::Tensor& targets) {
  // The loss's all-reduces belong to no unit (the step program's TpLossAllReduce).
  const CollectiveTag tag{Phase::TpLossAllReduce, GroupKind::Tensor, -1};
  return VocabParallelCE::apply(logits, targets, reinterpret_cast<int64_t>(tp.group), tp.vocab.start,
                                reinterpret_cast<int64_t>(&tag))
      .mean();
}

}  // namespace fsdp::exec
