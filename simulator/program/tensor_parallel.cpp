#include "program/tensor_parallel.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace fsdp {

namespace {

// A linear reading the hidden stream is column-parallel (q, k, v, gate, up: its outputs split); one reading a
// split width is row-parallel (the attention output and the MLP's down projection: its inputs split).
bool column_parallel(const ModelSpec& m, int64_t in_features) { return in_features == m.hidden_size; }

// A column-parallel linear producing k or v (GQA/MQA: narrower than q), whose heads follow tp_kv_heads_per_rank.
bool kv_projection(const ModelSpec& m, int64_t in_features, int64_t out_features) {
  return column_parallel(m, in_features) && m.kv_dim() != m.q_dim() && out_features == m.kv_dim();
}

// The share of a kv projection one rank holds: kv_per_rank / kv.
double kv_share(const ModelSpec& m, int64_t tp) {
  return static_cast<double>(tp_kv_heads_per_rank(m, tp)) / static_cast<double>(m.num_kv_heads);
}

double linear_share(const ModelSpec& m, const ModuleNode& n, int64_t tp) {
  if (tp_replicated_gate(n)) return 1.0;
  if (kv_projection(m, n.in_features, n.out_features)) return kv_share(m, tp);
  return 1.0 / static_cast<double>(tp);
}

// `own` with `extra`'s calls added to the entries of their kinds (a new entry where `own` has none), in the kinds'
// order (all-gathers, reduce-scatters, all-reduces).
std::vector<TpCollective> with_calls_of(std::vector<TpCollective> own, const std::vector<TpCollective>& extra) {
  for (const TpCollective& c : extra) {
    auto it = std::find_if(own.begin(), own.end(), [&](const TpCollective& o) { return o.kind == c.kind; });
    if (it != own.end()) {
      it->calls += c.calls;
    } else {
      own.push_back(c);
    }
  }
  std::stable_sort(own.begin(), own.end(),
                   [](const TpCollective& x, const TpCollective& y) { return x.kind < y.kind; });
  return own;
}

// The norms of layer `layer`'s attention (q_norm, k_norm), which each tp rank runs on its own heads.
std::vector<ModuleId> attention_norms(const ModuleGraph& g, ModuleId layer) {
  std::vector<ModuleId> out;
  for (ModuleId child : g.children(layer))
    if (g.node(child).kind == ModuleKind::Attention)
      for (ModuleId leaf : g.leaves_under(child))
        if (g.node(leaf).kind == ModuleKind::Norm) out.push_back(leaf);
  return out;
}

// The linears of layer `layer` (under `under`: the layer itself, or one of its blocks) that read a norm's output, the
// column-parallel inputs sequence parallelism gathers: q/k/v, a dense MLP's gate/up, an MoE block's shared experts'
// gate/up and shared gate (the routed experts read gathered copies of their tokens).
std::vector<ModuleId> column_readers(const ModuleGraph& g, ModuleId layer, ModuleId under) {
  const ModelSpec& m = g.spec();
  std::vector<std::string> norm_outputs;  // the builders name a norm's output `<norm>.out` (module_graph.cpp)
  for (ModuleId leaf : g.leaves_under(layer))
    if (g.node(leaf).kind == ModuleKind::Norm) norm_outputs.push_back(g.node(leaf).name + ".out");
  std::vector<ModuleId> readers;
  for (ModuleId leaf : g.leaves_under(under)) {
    const ModuleNode& n = g.node(leaf);
    if (n.kind != ModuleKind::Linear || !column_parallel(m, n.in_features) || n.saved.empty()) continue;
    if (std::find(norm_outputs.begin(), norm_outputs.end(), n.saved.front().id) != norm_outputs.end())
      readers.push_back(leaf);
  }
  return readers;
}

}  // namespace

int64_t tp_kv_heads_per_rank(const ModelSpec& m, int64_t tp) {
  if (tp <= 1 || m.num_kv_heads <= 0) return m.num_kv_heads;
  return std::max<int64_t>(1, m.num_kv_heads / tp);
}

double norm_saved_bytes_per_token(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q) {
  double b = 0;
  for (ModuleId leaf : g.leaves_under(layer))
    if (g.node(leaf).kind == ModuleKind::Norm) b += g.saved_bytes_per_token(leaf, q, ActCkpt::None);
  // The attention's q/k norms run on the rank's heads, so what they save is split like the heads.
  for (ModuleId leaf : attention_norms(g, layer)) b -= g.saved_bytes_per_token(leaf, q, ActCkpt::None);
  return b;
}

double column_input_bytes_per_token(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q) {
  const std::vector<ModuleId> readers = column_readers(g, layer, layer);
  return readers.empty() ? 0.0 : g.saved_bytes_per_token(readers, q, ActCkpt::None);
}

double moe_tp_whole_saved_bytes_per_token(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q) {
  double whole = 0;
  for (ModuleId block : g.children(layer)) {
    if (g.node(block).kind != ModuleKind::Moe) continue;
    whole += g.saved_bytes_per_token(block, q, ActCkpt::None);
    // The experts' own tensors, split: what each saves beyond its input (a routed expert's gathered copy of its
    // tokens, a shared expert's norm output), its first linear's saved tensor.
    for (ModuleId e : g.children(block)) {
      if (g.node(e).kind != ModuleKind::Mlp) continue;
      const SavedTensor* input = nullptr;
      for (ModuleId leaf : g.leaves_under(e))
        if (g.node(leaf).kind == ModuleKind::Linear && !g.node(leaf).saved.empty()) {
          input = &g.node(leaf).saved.front();
          break;
        }
      FSDP_ASSERT(input != nullptr, "an expert's first linear saves its input");
      whole -= g.saved_bytes_per_token(e, q, ActCkpt::None) - input->elems_per_token * tensor_bytes(input->cls, q);
    }
    // The norm output and what its readers save, counted with the column-parallel inputs.
    const std::vector<ModuleId> readers = column_readers(g, layer, block);
    if (!readers.empty()) whole -= g.saved_bytes_per_token(readers, q, ActCkpt::None);
  }
  return whole;
}

double tp_layer_params(const ModuleGraph& g, ModuleId layer, int64_t tp) {
  const ModelSpec& m = g.spec();
  double p = 0;
  for (ModuleId leaf : g.leaves_under(layer)) {
    const ModuleNode& n = g.node(leaf);
    const double own = static_cast<double>(n.params);
    p += n.kind == ModuleKind::Linear ? own * linear_share(m, n, tp) : own;  // norms (and q/k norms) replicated
  }
  return p;
}

double tp_root_module_params(const ModuleGraph& g, ModuleId module, int64_t tp) {
  const ModuleKind k = g.node(module).kind;
  const double p = static_cast<double>(g.params_under(module));
  // Vocabulary-parallel embedding and head (Megatron-LM VocabParallelEmbedding, ColumnParallelLinear output layer;
  // torchtitan: RowwiseParallel on tok_embeddings, ColwiseParallel on output); learned positions too.
  if (k == ModuleKind::Embedding || k == ModuleKind::Head || k == ModuleKind::PositionEmbedding)
    return p / static_cast<double>(tp);
  return p;
}

std::vector<ModuleId> tp_column_linears(const ModuleGraph& g, ModuleId layer) {
  return column_readers(g, layer, layer);
}

double tp_linear_share(const ModelSpec& m, const ModuleNode& n, int64_t tp) { return linear_share(m, n, tp); }

void shard_layer_for_tp(LayerCost& lc, const ModuleGraph& g, ModuleId layer, double norm_saved_bytes,
                        double column_input_bytes, double moe_whole_saved_bytes, bool sp_keeps_column_input_shard,
                        const MeshSpec& mesh) {
  const int64_t tp = mesh.tp;
  if (tp <= 1) return;
  const ModelSpec& m = g.spec();
  const double t = static_cast<double>(tp);
  // Parameters: linears split (kv projections per kv head held), the rest replicated. GEMM FLOPs follow the
  // linears' weights (each weight element is one multiply-add per token).
  // An MoE block's gates stay whole (tp_replicated_gate), their gradients partial whatever the sequence layout.
  double linear_before = 0, linear_after = 0, gate_params = 0, gate_weights = 0;
  lc.replicated_params = 0;
  double partial = 0;
  for (ModuleId leaf : attention_norms(g, layer)) partial += static_cast<double>(g.node(leaf).params);
  for (ModuleId leaf : g.leaves_under(layer)) {
    const ModuleNode& n = g.node(leaf);
    if (tp_replicated_gate(n)) gate_params += static_cast<double>(n.params);
    if (tp_replicated_gate(n) && n.kind == ModuleKind::Linear)
      gate_weights += static_cast<double>(n.in_features * n.out_features);
    if (n.kind != ModuleKind::Linear || tp_replicated_gate(n)) {
      lc.replicated_params += static_cast<double>(n.params);
      continue;
    }
    const double w = static_cast<double>(n.in_features * n.out_features);
    linear_before += w;
    linear_after += w * linear_share(m, n, tp);
  }
  lc.tp_partial_grad_params = mesh.sequence_parallel ? lc.replicated_params : partial + gate_params;
  const double gemm_share = linear_before > 0 ? linear_after / linear_before : 1.0 / t;
  lc.params = tp_layer_params(g, layer, tp);
  lc.linear_params = (lc.linear_params - gate_weights) * gemm_share + gate_weights;
  lc.float8_params *= gemm_share;  // no gate is a float8 linear (float8_linears.hpp: MoE is refused with float8)
  // The gates' FLOPs (their GEMMs, whole on every rank) stay; the recomputed ones where the whole forward runs again.
  double gate_flops = 0;
  for (const GemmShape& gs : lc.shape.gemms)
    if (gs.tp_replicated) gate_flops += 2.0 * static_cast<double>(gs.n * gs.k) * gs.weight;
  const double gate_recompute = lc.ckpt == ActCkpt::Full ? gate_flops : 0.0;
  lc.matmul_flops_per_token = (lc.matmul_flops_per_token - gate_flops) * gemm_share + gate_flops;
  lc.recompute_matmul_flops_per_token =
      (lc.recompute_matmul_flops_per_token - gate_recompute) * gemm_share + gate_recompute;
  // Attention: the heads split; each rank's scores are over its heads only.
  lc.attention_flops_per_token /= t;
  for (GemmShape& gs : lc.shape.gemms) {
    if (gs.tp_replicated) continue;
    if (!column_parallel(m, gs.k)) {
      gs.k = std::max<int64_t>(1, gs.k / tp);
    } else if (kv_projection(m, gs.k, gs.n)) {
      gs.n = tp_kv_heads_per_rank(m, tp) * m.head_dim;
    } else {
      gs.n = std::max<int64_t>(1, gs.n / tp);
    }
  }
  lc.shape.heads = std::max<int64_t>(1, lc.shape.heads / tp);
  lc.shape.kv_heads = tp_kv_heads_per_rank(m, tp);
  // Activations (Korthikanti et al. 2022 Table 2): with sequence parallelism everything a layer saves is 1/tp
  // (the norms and the checkpointed input on s/tp tokens); without it the norms' inputs (and a fully checkpointed
  // layer's input, the residual stream between blocks) stay whole on every rank.
  auto split = [&](double bytes, double replicated) {
    if (mesh.sequence_parallel) return bytes / t;
    replicated = std::min(replicated, bytes);
    return replicated + (bytes - replicated) / t;
  };
  // An MoE block's tensors over all the tokens stay whole (moe_tp_whole_saved_bytes_per_token) where the layer's mode
  // saves the block's tensors (not under full checkpointing; the per-op policy is refused for MoE under tp:
  // capabilities.cpp TpModelParts).
  const double unckpt_before = lc.saved_bytes_unckpt;
  const bool saves_block = lc.ckpt == ActCkpt::None || lc.ckpt == ActCkpt::Selective;
  const double ckpt_replicated = lc.ckpt == ActCkpt::Full ? lc.saved_bytes : norm_saved_bytes;
  const double ckpt_whole = saves_block ? moe_whole_saved_bytes : 0.0;
  lc.saved_bytes = split(lc.saved_bytes - ckpt_whole, ckpt_replicated) + ckpt_whole;
  lc.saved_bytes_unckpt =
      split(lc.saved_bytes_unckpt - moe_whole_saved_bytes, norm_saved_bytes) + moe_whole_saved_bytes;
  const double act_share = unckpt_before > 0 ? lc.saved_bytes_unckpt / unckpt_before : 1.0 / t;
  // The column-parallel linears' inputs (the norm outputs) stay whole where each rank holds the whole sequence of
  // them: without SP (Korthikanti et al. 2022 Table 2: the QKV and MLP inputs are among the 10 sbh not split), and
  // with SP in a runtime that saves the gathered input (RuntimeProfile::sp_saves_column_input_shard false: PyTorch
  // DTensor, fsdp-run). They count where the layer's mode saves the linears' inputs: without checkpointing and under
  // ours (attention core only); full checkpointing keeps the layer input alone, and the per-op policy recomputes the
  // gathers (an all-gather is not in torchtitan's _save_list).
  if (!mesh.sequence_parallel || !sp_keeps_column_input_shard) {
    const double whole = column_input_bytes * (1.0 - 1.0 / t);
    lc.saved_bytes_unckpt += whole;
    if (lc.ckpt == ActCkpt::None || lc.ckpt == ActCkpt::Selective) lc.saved_bytes += whole;
  }
  lc.recompute_bytes *= act_share;
  // Working memory and memory-bound traffic: per rank over its heads and its slice of the MLP (and of the tokens
  // between blocks with SP); without SP the norms' share stays whole, as the saved tensors' does.
  lc.forward_transient *= act_share;
  lc.backward_transient = std::max(lc.backward_transient * act_share, lc.moe_backward_transient);
  lc.elementwise_bytes_per_token *= act_share;
  lc.elementwise_backward_bytes_per_token *= act_share;
}

int64_t single_linear_blocks(const ModuleGraph& g, ModuleId layer) {
  const ModelSpec& m = g.spec();
  int64_t n = 0;
  for (ModuleId child : g.children(layer)) {
    const ModuleKind k = g.node(child).kind;
    if (k != ModuleKind::Attention && k != ModuleKind::Mlp) continue;
    int64_t readers = 0;
    for (ModuleId leaf : g.leaves_under(child)) {
      const ModuleNode& l = g.node(leaf);
      if (l.kind == ModuleKind::Linear && column_parallel(m, l.in_features)) ++readers;
    }
    if (readers == 1) ++n;
  }
  return n;
}

std::vector<TpCollective> tp_forward_collectives(const TpUnitShape& u, const MeshSpec& mesh) {
  std::vector<TpCollective> out;
  if (mesh.tp <= 1) return out;
  const double a = u.activation_bytes;
  if (mesh.sequence_parallel) {
    // Per layer: all-gather before the attention and the MLP (g-bar), reduce-scatter after each (g); the embedding's
    // output reduce-scattered into the sequence shards (the head's gather: tp_head_collectives, below). Under async TP
    // the layers' fuse with their GEMMs; the head's and the embedding's do not (header).
    const int ag = static_cast<int>(2 * u.layers);
    const int rs = static_cast<int>(2 * u.layers) + (u.embedding ? 1 : 0);
    const double lg = u.layer_gather();
    if (ag > 0) out.push_back({CollectiveKind::AllGather, ag, lg, lg, u.gathers_fuse ? ag : 0});
    if (rs > 0) out.push_back({CollectiveKind::ReduceScatter, rs, a, 0.0, static_cast<int>(2 * u.layers)});
  } else {
    // Per layer an all-reduce after the attention's and the MLP's row-parallel linears; the embedding's one.
    const int ar = static_cast<int>(2 * u.layers) + (u.embedding ? 1 : 0);
    if (ar > 0) out.push_back({CollectiveKind::AllReduce, ar, a, 0.0, 0});
  }
  return with_calls_of(std::move(out), tp_head_collectives(u, mesh, false));
}

std::vector<TpCollective> tp_backward_collectives(const TpUnitShape& u, const MeshSpec& mesh) {
  std::vector<TpCollective> out;
  if (mesh.tp <= 1) return out;
  const double a = u.activation_bytes;
  // The layers whose forward runs again in backward repeat its collectives (Korthikanti et al. 2022 sec. 5: full
  // recomputation re-runs the forward's communication). Under the per-op policy only the gathers run again: it saves
  // every reduce_scatter_tensor output (torchtitan parallelize_llama.py _save_list @ 820504e20d11), while the
  // gathered inputs of the GEMMs it recomputes (every second one: k, the output projection, up) are not saved.
  const int64_t rerun = u.recomputed_layers + u.sac_op_layers;
  const int again = static_cast<int>(2 * rerun);
  const int again_rs = static_cast<int>(2 * u.recomputed_layers);
  if (mesh.sequence_parallel) {
    // Conjugates: the forward's all-gathers become reduce-scatters of the input gradients and vice versa; the
    // embedding's output gradient gathered; where the column inputs are regathered, once more per column-parallel
    // block of the layers whose forward does not run again (the head's: tp_head_collectives, below). Fused under
    // async TP (header): the output gradients' gathers (left operand of the input-gradient GEMM), the re-run
    // forward's collectives and the input-gradient reduce-scatters of the blocks read by one linear; whole: the
    // embedding's gradient gather, the head's (the head runs outside the compiled blocks) and the other blocks'
    // input-gradient reduce-scatters.
    int ag = static_cast<int>(2 * u.layers) + again;
    if (u.column_inputs_regathered) ag += static_cast<int>(2 * (u.layers - rerun));
    const int ag_fused = u.gathers_fuse ? static_cast<int>(2 * u.layers) + again : 0;
    const int rs = static_cast<int>(2 * u.layers) + again_rs;
    const int rs_fused = static_cast<int>(u.single_linear_blocks) + again_rs;
    const double lg = u.layer_gather();
    // The layers' gathers (float8 ones at a byte an element) and the embedding's output gradient, in the compute
    // dtype: one entry where they move alike.
    if (lg == a) {
      ag += u.embedding ? 1 : 0;
    } else if (u.embedding) {
      out.push_back({CollectiveKind::AllGather, 1, a, a, 0});
    }
    if (ag > 0) out.push_back({CollectiveKind::AllGather, ag, lg, lg, ag_fused});
    if (rs > 0) out.push_back({CollectiveKind::ReduceScatter, rs, a, 0.0, rs_fused});
  } else {
    // f: an all-reduce of the input gradient before each column-parallel block (attention, MLP).
    const int ar = static_cast<int>(2 * u.layers) + again;
    if (ar > 0) out.push_back({CollectiveKind::AllReduce, ar, a, 0.0, 0});
  }
  return with_calls_of(std::move(out), tp_head_collectives(u, mesh, true));
}

std::vector<TpCollective> tp_head_collectives(const TpUnitShape& u, const MeshSpec& mesh, bool backward) {
  std::vector<TpCollective> out;
  if (mesh.tp <= 1 || !u.head) return out;
  const double a = u.activation_bytes;
  if (!mesh.sequence_parallel) {
    // f of a column-parallel linear on a replicated input: its input gradient all-reduced.
    if (backward) out.push_back({CollectiveKind::AllReduce, 1, a, 0.0, 0});
    if (!backward && u.head_output_gather_bytes > 0)
      out.push_back({CollectiveKind::AllGather, 1, u.head_output_gather_bytes, u.head_output_gather_bytes, 0});
    return out;
  }
  if (!backward) {
    out.push_back({CollectiveKind::AllGather, 1, a, a, 0});
    if (u.head_output_gather_bytes > 0)
      out.push_back({CollectiveKind::AllGather, 1, u.head_output_gather_bytes, u.head_output_gather_bytes, 0});
    return out;
  }
  if (u.column_inputs_regathered) out.push_back({CollectiveKind::AllGather, 1, a, a, 0});
  out.push_back({CollectiveKind::ReduceScatter, 1, a, 0.0, 0});
  return out;
}

double tp_sequence_layout_copy_bytes(const std::vector<TpCollective>& collectives, const MeshSpec& mesh) {
  if (mesh.tp <= 1 || !mesh.sequence_parallel) return 0.0;
  double bytes = 0;
  for (const TpCollective& c : collectives) {
    if (c.kind != CollectiveKind::AllGather && c.kind != CollectiveKind::ReduceScatter) continue;
    const int copied = c.calls - (mesh.async_tp ? c.fused_calls : 0);
    bytes += 2.0 * static_cast<double>(copied) * c.bytes;
  }
  return bytes;
}

double tp_async_gathered_layout_copy_bytes(const TpUnitShape& u, const MeshSpec& mesh, int64_t micro_batch) {
  if (mesh.tp <= 1 || !mesh.sequence_parallel || !mesh.async_tp || !u.gathers_fuse || micro_batch <= 1) return 0.0;
  // Per layer 2 output-gradient gathers + 2 column-input gathers, each read and written once (header).
  return 2.0 * 4.0 * static_cast<double>(u.layers) * u.activation_bytes;
}

std::vector<TpCollective> tp_loss_collectives(double tokens, bool fused) {
  constexpr double kFp32Bytes = 4.0;
  constexpr int kTerms = 3;  // logits max, target logit, sum of exponentials (header)
  const double one = tokens * kFp32Bytes;
  if (!fused) return {{CollectiveKind::AllReduce, kTerms, one, 0.0, 0}};
  return {{CollectiveKind::AllReduce, 1, one, 0.0, 0}, {CollectiveKind::AllReduce, 1, (kTerms - 1) * one, 0.0, 0}};
}

double tp_exposed_fraction(const MeshSpec& mesh) {
  return mesh.async_tp && mesh.tp > 1 ? 1.0 / static_cast<double>(mesh.tp) : 1.0;
}

}  // namespace fsdp
