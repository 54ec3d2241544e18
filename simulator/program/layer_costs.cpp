#include "program/layer_costs.hpp"

#include <algorithm>

#include "core/errors.hpp"
#include "program/expert_parallel.hpp"
#include "program/float8_linears.hpp"

namespace fsdp {

namespace {

// The widths a layer's working set is made of, from its linears: q and kv projections, and the MLP's
// intermediate width summed over the MLPs a token passes (a dense MLP's ffn; MoE: each expert's ffn times
// the share of tokens it sees, shared experts whole).
struct Widths {
  double q = 0, kv = 0, ffn = 0;
  bool gated = false;
  bool rope = false;
  double norm_elems = 0;  // the elements the layer's norms normalise per token (q/k norms: their projections)
  bool dropout = false;
  double mlp_saved_per_token = 0;  // the MLP's saved tensors (released before the attention stage)
  double mlp_params = 0;           // its parameters, and those of its output projections (first gradients)
  double mlp_out_params = 0;
};

// A mixture-of-experts block's parts, for its backward (moe_stage in layer_cost); absent in a dense layer. Widths are
// per token; saved bytes per token; parameters whole.
struct MoeParts {
  bool present = false;
  double k = 0;                   // experts per token
  double experts = 0;             // routed experts
  double expert_ffn = 0;          // one routed expert's intermediate width
  double shared_ffn = 0;          // the shared experts' intermediate widths, summed
  double shared_params = 0;       // the shared experts' and the shared gate's parameters
  double shared_gate_params = 0;  // of which the shared gate's (whole on every tp rank)
  double shared_out_params = 0;   // the shared experts' output projections'
  double routed_params = 0;       // the routed experts'
  double routed_out_params = 0;   // their output projections'
  double shared_saved = 0;        // what the shared path saves beyond the block's input
  double shared_gate_saved = 0;   // of which the shared gate's: its sigmoid and the shared output (whole under tp)
  double routed_saved = 0;        // what the routed experts save, their gathered inputs included
  double dispatched = 0;          // of which the gathered inputs (k x hidden)
  double combine_saved = 0;       // the experts' outputs and their weights, kept by the weighting multiply
};

double token_fraction(const ModuleNode& n) {
  return n.flops_per_token / (2.0 * static_cast<double>(n.in_features) * static_cast<double>(n.out_features));
}

// The output projection of MLP `m` (its last linear).
const ModuleNode* last_linear(const ModuleGraph& g, ModuleId m) {
  const ModuleNode* last = nullptr;
  for (ModuleId leaf : g.leaves_under(m))
    if (g.node(leaf).kind == ModuleKind::Linear) last = &g.node(leaf);
  return last;
}

MoeParts moe_parts_of(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q) {
  MoeParts p;
  for (ModuleId c : g.children(layer)) {
    if (g.node(c).kind != ModuleKind::Moe) continue;
    p.present = true;
    std::vector<ModuleId> router, shared, routed;
    for (ModuleId e : g.children(c)) {
      const ModuleNode& n = g.node(e);
      if (n.kind == ModuleKind::Router) router.push_back(e);
      if (n.short_name == "expert") routed.push_back(e);
      if (n.short_name == "shared_expert" || n.short_name == "shared_expert_gate") shared.push_back(e);
    }
    FSDP_ASSERT(router.size() == 1 && !routed.empty(), "an MoE block has one router and routed experts");
    const ModuleNode& r = g.node(router[0]);
    const double h = static_cast<double>(r.in_features);
    p.experts = static_cast<double>(routed.size());
    // The gathered input of an expert is its container's saved tensor, hidden x k / E per token (module_graph.cpp),
    // kept for backward unless no expert's GEMM reads it there (LoRA with frozen, unadapted experts).
    const SavedTensor& in = g.node(routed[0]).saved.at(0);
    p.k = in.elems_per_token / h * p.experts;
    p.dispatched = g.keeps(routed[0], q, in.id) ? p.k * h * tensor_bytes(in.cls, q) : 0.0;
    p.combine_saved = p.k * (h + 1.0) * tensor_bytes(TensorClass::Compute, q);
    // The block's input is saved by the router and read again by the shared path: what the shared path and the
    // experts add beyond the router's tensors is what their backward releases.
    const double router_saved = g.saved_bytes_per_token(router, q, ActCkpt::None);
    auto with_router = [&](std::vector<ModuleId> ids) {
      ids.push_back(router[0]);
      return g.saved_bytes_per_token(ids, q, ActCkpt::None) - router_saved;
    };
    p.shared_saved = with_router(shared);
    p.routed_saved = with_router(routed);
    std::vector<ModuleId> gates;
    for (ModuleId e : shared)
      if (tp_replicated_gate(g.node(e))) {
        gates.push_back(e);
        p.shared_gate_params += static_cast<double>(g.node(e).params);
      }
    p.shared_gate_saved = gates.empty() ? 0.0 : with_router(gates);
    for (ModuleId e : routed) {
      p.routed_params += static_cast<double>(g.params_under(e));
      p.routed_out_params += static_cast<double>(last_linear(g, e)->params);
    }
    for (ModuleId leaf : g.leaves_under(routed[0]))
      if (g.node(leaf).kind == ModuleKind::Linear) {
        p.expert_ffn = static_cast<double>(g.node(leaf).out_features);
        break;
      }
    for (ModuleId e : shared) {
      p.shared_params += static_cast<double>(g.params_under(e));
      if (g.node(e).kind != ModuleKind::Mlp) continue;  // the shared gate
      p.shared_out_params += static_cast<double>(last_linear(g, e)->params);
      for (ModuleId leaf : g.leaves_under(e))
        if (g.node(leaf).kind == ModuleKind::Linear) {
          p.shared_ffn += static_cast<double>(g.node(leaf).out_features);
          break;
        }
    }
  }
  return p;
}

Widths widths_of(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q) {
  Widths w;
  for (ModuleId leaf : g.leaves_under(layer)) {
    const ModuleNode& n = g.node(leaf);
    if (n.kind == ModuleKind::Norm) w.norm_elems += static_cast<double>(n.output_elems_per_token);
    if (n.kind == ModuleKind::Rotary) w.rope = true;
    if (n.kind == ModuleKind::Dropout) w.dropout = true;
    if (n.kind != ModuleKind::Linear) continue;
    if (n.short_name == "q_proj" || n.short_name == "q_b_proj") w.q += static_cast<double>(n.out_features);
    if (n.short_name == "k_proj") w.kv += static_cast<double>(n.out_features);
    // MLA's kv_b_proj decompresses k_nope and v together: half its width stands for each (model_spec.hpp MlaSpec).
    if (n.short_name == "kv_b_proj") w.kv += 0.5 * static_cast<double>(n.out_features);
    if (n.short_name == "gate_proj") w.gated = true;
  }
  // The MLP blocks: a dense MLP, or each expert of an MoE block (Mlp nodes under the Moe container); the block's
  // saved tensors and parameters as a whole.
  std::vector<ModuleId> mlps;
  for (ModuleId c : g.children(layer)) {
    const ModuleNode& n = g.node(c);
    if (n.kind != ModuleKind::Mlp && n.kind != ModuleKind::Moe) continue;
    w.mlp_saved_per_token += g.saved_bytes_per_token(c, q, ActCkpt::None);
    w.mlp_params += static_cast<double>(g.params_under(c));
    if (n.kind == ModuleKind::Mlp) {
      mlps.push_back(c);
      continue;
    }
    for (ModuleId e : g.children(c))
      if (g.node(e).kind == ModuleKind::Mlp) mlps.push_back(e);
  }
  for (ModuleId m : mlps) {
    const ModuleNode* first = nullptr;
    const ModuleNode* last = nullptr;
    for (ModuleId leaf : g.leaves_under(m)) {
      const ModuleNode& n = g.node(leaf);
      if (n.kind != ModuleKind::Linear) continue;
      if (!first) first = &n;
      last = &n;
    }
    if (!first) continue;
    w.ffn += static_cast<double>(first->out_features) * token_fraction(*first);
    w.mlp_out_params += static_cast<double>(last->params);
  }
  return w;
}

// torchtitan's rotary embedding (pytorch/torchtitan torchtitan/models/llama/model.py apply_rotary_emb @
// 9dec370ad26b5f8e9a7333a0e36165018262644b): view_as_complex(x.float().reshape(..., -1, 2)) * freqs_cis, then
// view_as_real(...).flatten(3).type_as(x), for q and k. Three kernels move bytes (the reshapes and views do not):
// the upcast reads x and writes its fp32 copy (pb + 4 bytes per element), the complex multiply reads and writes
// complex64 (4 + 4 per real element; freqs_cis is seq x head_dim / 2, negligible), the downcast reads fp32 and
// writes x's dtype (4 + pb). A compiled layer runs the same three: Inductor generates no code for complex tensors
// (pytorch/pytorch torch/_inductor/lowering.py @ 0015748b977f49ad69b6c73c057ef49fe1346966
// unsupported_input_tensor and fallback_node_due_to_unsupported_type: a complex tensor falls the op back to ATen,
// "Torchinductor does not support code generation for complex operators. Performance may be worse than eager.", the
// warning torchtitan's compiled Llama raises: pytorch/torchtitan issue #15), so the multiply stays an ATen kernel whose
// fp32 input and complex output are written to memory between the two casts. The backward is the same three kernels on
// the gradient (ToCopyBackward, MulBackward0's grad * conj(freqs_cis), ToCopyBackward): as many bytes as the forward,
// not twice (backward_savings). The count checked on Liger-Kernel's H100 80GB benchmark of Hugging Face Llama 4's
// apply_rotary_emb, the same three ops (linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv @ ead96b61,
// llama4_rope, provider huggingface, bf16, T 16384, 32 query and 8 kv heads of 256): forward over q and k 1.455 ms,
// backward from q alone 1.482 ms; 20 bytes an element make 3.355 and 2.684 GB, 2.31 and 1.81 TB/s, 0.69 and 0.54
// of its 3.35 TB/s (the profiles' eager elementwise_efficiency is 0.54).
double rotary_complex_bytes(const Widths& w, double pb) { return (w.q + w.kv) * ((pb + 4.0) + 8.0 + (4.0 + pb)); }

// torchtitan's CosSinRoPE (pytorch/torchtitan torchtitan/models/common/rope.py CosSinRoPE.apply_rotary_emb @
// a9c5edc74b595216d91b5bef69d4446d5705b61a, its Qwen3's): query.float() and key.float(), then (x * cos) +
// (rotate_half(x) * sin) on the fp32 copies, then type_as: the upcast (pb + 4 bytes per element), Hugging Face's 7
// r/w passes (the eager rotary below) at 4 bytes, and the downcast (4 + pb). Its backward is the same ops' autograd
// formulas on fp32 gradients, twice the forward as the eager rotary's.
double rotary_rotate_half_fp32_bytes(const Widths& w, double pb) {
  return (w.q + w.kv) * ((pb + 4.0) + 7.0 * 2.0 * 4.0 + (4.0 + pb));
}

// Memory-bound traffic of the forward per token, one kernel per op (eager PyTorch): the non-GEMM kernels read their
// inputs and write their outputs (bytes = (in + out) x dtype):
//  - each norm: read x, write y, weight multiply (r/w): 4 h-wide tensors; a runtime whose norm upcasts (HF
//    LlamaRMSNorm: to(fp32), pow-mean, rsqrt-multiply, to(input dtype), weight multiply) moves 2h+4h, 4h,
//    4h+4h, 4h+2h and 2h+2h bytes per token: 32h (h: the width it normalises, a q/k norm's projection);
//    a single-kernel norm (RuntimeProfile::norm_single_kernel) reads x and writes y: 2 tensors;
//  - rotary (HF apply_rotary_pos_emb: q*cos, rotate_half (slice + cat), *sin, add): ~7 r/w passes over q, k;
//    flash-attn's in-place rotary (RotaryKernel::FlashAttnInPlace) one r/w pass over q and k, after k
//    and v are packed by a cat (r/w 2 kv) and a permuted contiguous copy (r/w 2 kv);
//  - grouped k and v repeated to the query heads where the model's code does (RuntimeProfile::kv_repeat): read kv,
//    write q, for each (transformers repeat_kv and torchtitan's: expand, then a reshape that copies);
//  - attention layout: q, k, v transposed to (batch, heads, seq, dim): one r/w pass; a sequence-first layer's
//    transposed attention output copied for the output projection when the micro-batch holds more than one
//    sequence (RuntimeProfile::attention_output_copy): one r/w pass over q;
//  - rotary in one in-place kernel (RotaryKernel::InPlace, Liger-Kernel's): one r/w pass over q and k;
//  - gated MLP: SiLU (r f, w f) and the gating multiply (r 2f, w f); as one kernel (RuntimeProfile::glu_single_kernel)
//    read gate and up, write the product (3f); plain MLP: GELU (r f, w f);
//  - two residual adds (r 2, w 1 tensors each, residual dtype); dropout (r, w, mask).
double eager_elementwise_bytes(const Widths& w, double h, double pb, double res, bool norm_fp32,
                               const RuntimeProfile& rt, int64_t micro_batch, bool kv_repeated) {
  double e = w.norm_elems * norm_traffic_per_element(rt, pb, norm_fp32).forward;
  if (w.rope) {
    switch (rt.rotary_kernel) {
      case RotaryKernel::Eager:
        e += 7.0 * 2.0 * (w.q + w.kv) * pb;
        break;
      case RotaryKernel::FlashAttnInPlace:
        e += (2.0 * (w.q + w.kv) + 2.0 * 2.0 * (2.0 * w.kv)) * pb;
        break;
      case RotaryKernel::Complex:
        e += rotary_complex_bytes(w, pb);
        break;
      case RotaryKernel::RotateHalfFp32:
        e += rotary_rotate_half_fp32_bytes(w, pb);
        break;
      case RotaryKernel::InPlace:
        e += 2.0 * (w.q + w.kv) * pb;
        break;
    }
  }
  e += 2.0 * (w.q + 2.0 * w.kv) * pb;
  if (kv_repeated) e += 2.0 * (w.q + w.kv) * pb;
  if (rt.attention_output_copy && micro_batch > 1) e += 2.0 * w.q * pb;
  e += (w.gated ? (rt.glu_single_kernel ? 3.0 : 5.0) : 2.0) * w.ffn * pb;
  e += 2.0 * 3.0 * h * res;
  if (w.dropout) e += 2.0 * (2.0 * h * pb + h);
  return e;
}

// What the backward of the layer's kernels moves less than twice their forward, per token; the eager kernels:
//  - a single-kernel norm's backward (flash-attn flash_attn/ops/triton/layer_norm.py _layer_norm_bwd @
//    0251105a2fb19d2957484b7f023cd8c115286ced, recompute_output False) reads x and dy and writes dx (its weight
//    gradient is one partial row per program): 3 tensors, not 4;
//  - Liger-Kernel's in-place rotary (one pass each way) and single-kernel gated activation (backward 5f, forward 3f);
//  - flash-attn's in-place rotary backward rewrites dq and dk in place (layers/rotary.py ApplyRotaryEmb.backward,
//    ApplyRotaryEmbKV_.backward: inplace=True), one pass as forward; of the packing, the cat's and the permute's
//    backwards are views (narrow, permute) and only the split of the packed kv into k and v, by flash attention's
//    separate dk and dv, is joined again by SplitBackward's cat (one copy of 2 kv): 2 (q + kv) + 2 x 2 kv, not twice
//    the forward's 2 (q + kv) + 2 x 2 x 2 kv.
// And in either mode, eager or compiled:
//  - torchtitan's complex rotary backward runs the forward's three kernels on the gradient (rotary_complex_bytes):
//    once the forward's bytes, not twice.
//  - the repeat of k and v to the query heads: its backward sums each q-wide gradient back to the kv heads (expand's
//    backward), once the forward's bytes: eager 2 (q + kv) (read kv, write q, for k and for v), compiled 2q
//    (fused_elementwise_bytes).
double backward_savings(const Widths& w, double pb, const RuntimeProfile& rt, bool eager, bool kv_repeated) {
  double saved = 0;
  if (w.rope && rt.rotary_kernel == RotaryKernel::Complex) saved += rotary_complex_bytes(w, pb);
  if (kv_repeated) saved += (eager ? 2.0 * (w.q + w.kv) : 2.0 * w.q) * pb;
  if (!eager) return saved;
  if (rt.norm_single_kernel) {
    const NormTraffic n = norm_traffic_per_element(rt, pb, false);
    saved += w.norm_elems * (2.0 * n.forward - n.backward);
  }
  // Liger-Kernel's in-place rotary runs its kernel once on dq and dk (ops/rope.py rope_backward); its single-kernel
  // SwiGLU backward reads dc, a and b and writes da and db (ops/swiglu.py _swiglu_backward_kernel, the SiLU recomputed
  // in registers): 5f, not twice the forward's 3f.
  if (w.rope && rt.rotary_kernel == RotaryKernel::InPlace) saved += 2.0 * (w.q + w.kv) * pb;
  if (w.gated && rt.glu_single_kernel) saved += w.ffn * pb;
  if (w.rope && rt.rotary_kernel == RotaryKernel::FlashAttnInPlace) {
    const double forward = 2.0 * (w.q + w.kv) + 2.0 * 2.0 * (2.0 * w.kv);
    const double backward = 2.0 * (w.q + w.kv) + 2.0 * (2.0 * w.kv);
    saved += (2.0 * forward - backward) * pb;
  }
  return saved;
}

// The same layer when each chain of pointwise ops and reductions between two GEMM / attention kernels is one
// kernel that reads the chain's inputs once and writes what leaves it (RuntimeProfile::fused_elementwise).
// Inductor's scheduler merges a producer's loop nest into its consumers' (pytorch/pytorch
// torch/_inductor/scheduler.py @ 26f1733f6a174ad8d3a7c9c08b372252b6e0bba8, Scheduler.fuse_nodes / fuse_nodes_once:
// can_fuse over pointwise and reduction nodes sharing an iteration space), and GEMMs and attention stay extern
// kernels between the chains. Per token:
//  - each norm: the upcast, the mean of squares, rsqrt, the multiply, the cast back and the weight in one reduction
//    kernel: read x, write y (2 tensors; its per-row statistic, 4 bytes, is left out);
//  - rotary: one kernel reads q and k and writes them rotated (2 tensors of q + kv); torchtitan's complex rotary
//    keeps its three kernels (rotary_complex_bytes: Inductor does not generate code for complex tensors);
//  - attention layout: nothing; the transposes to (batch, heads, seq, dim) are views, and Inductor's layout
//    constraint for SDPA asks only for a dense last dimension (torch/_inductor/lowering.py sdpa_constraint,
//    pytorch/pytorch @ 68b7b9529d9f296a6eb1a9db1a41ad6f8edee158: "sdpa requires dense last dimension"), which the
//    rotary kernel's output and the projections' views have. With fewer key/value heads than query heads the keys
//    and values are repeated to the query heads before SDPA (pytorch/torchtitan torchtitan/models/llama/model.py
//    repeat_kv @ 9dec370ad26b5f8e9a7333a0e36165018262644b: unsqueeze, expand, then reshape, which cannot view an
//    expanded dimension merged into the heads; Hugging Face's repeat_kv, transformers models/llama/modeling_llama.py,
//    is the same): SDPA is an extern kernel whose inputs Inductor writes to memory (lowering.py @ 0015748b
//    sdpa_constraint: ExternKernel.realize_input), k at q's width from the rotary kernel (q - kv more) and v copied
//    (read kv, write q): 2q more per token. Its backward sums the repeated gradients back inside the kernels that read
//    them (dk at q's width: q - kv more read; dv: read q, write kv): 2q too, once the forward's bytes
//    (backward_savings);
//  - gated MLP: SiLU(gate) * up in one kernel: read gate and up, write the product (3f); plain MLP: GELU (r f, w f);
//  - two residual adds (r 2, w 1 each, residual dtype), except that an add whose sum feeds the next norm inside the
//    layer (a sequential pre-norm block's post-attention norm) is that norm's kernel: it reads the add's inputs and
//    writes the sum (the next residual) and the normed output, so the sum is not read back (one h less);
//  - dropout: the mask is drawn inside its neighbour's kernel, which writes it (1 byte per element) for backward.
double fused_elementwise_bytes(const Widths& w, double h, double pb, double res, bool add_fused_into_norm,
                               const RuntimeProfile& rt, bool kv_repeated) {
  double e = w.norm_elems * norm_traffic_per_element(rt, pb, false).forward;
  if (w.rope) e += rt.rotary_kernel == RotaryKernel::Complex ? rotary_complex_bytes(w, pb) : 2.0 * (w.q + w.kv) * pb;
  if (kv_repeated) e += 2.0 * w.q * pb;
  e += (w.gated ? 3.0 : 2.0) * w.ffn * pb;
  e += 2.0 * 3.0 * h * res;
  if (add_fused_into_norm) e -= h * res;
  if (w.dropout) e += 2.0 * h;
  return e;
}

}  // namespace

bool tp_replicated_gate(const ModuleNode& n) {
  return n.kind == ModuleKind::Router || (n.kind == ModuleKind::Linear && n.short_name == "shared_expert_gate");
}

NormTraffic norm_traffic_per_element(const RuntimeProfile& rt, double pb, bool norm_fp32) {
  NormTraffic n;
  if (rt.fused_elementwise) {
    n.forward = 2.0 * pb;
  } else if (rt.norm_single_kernel) {
    // A single-kernel norm computes in fp32 in its registers whatever its input's dtype: 2 tensors either way; its
    // backward reads x and dy and writes dx (backward_savings).
    n.forward = 2.0 * pb;
    n.backward = 3.0 * pb;
    return n;
  } else {
    n.forward = norm_fp32 ? 32.0 : 4.0 * pb;
  }
  n.backward = 2.0 * n.forward;
  return n;
}

LayerCost layer_cost(const LayerCostInput& in, ModuleId layer) {
  FSDP_ASSERT(in.graph && in.strategy, "layer_cost needs a graph and a strategy");
  return layer_cost(in, layer, layer_ckpt(*in.strategy, in.graph->node(layer).layer));
}

LayerCost layer_cost(const LayerCostInput& in, ModuleId layer, ActCkpt ckpt) {
  FSDP_ASSERT(in.graph && in.strategy && in.runtime, "layer_cost needs a graph, a strategy and a runtime");
  const ModuleGraph& g = *in.graph;
  const Strategy& s = *in.strategy;
  const RuntimeProfile& rt = *in.runtime;
  const ActivationQuery& q = in.query;
  // A vision block runs on its own tokens of each sample (ModuleNode::tokens_per_sample): its bytes are counted
  // for those, and its per-token fields are returned per token of the language model's sequence (token_ratio).
  const ModuleNode& node = g.node(layer);
  const double ratio = g.token_ratio(layer, s.seq_len);
  const double tokens = in.tokens * ratio;
  const double pb = dtype_bytes(s.param_dtype);
  // The layer's own widths, from its nodes (module_graph.hpp): a model whose layers differ needs no change here.
  const double h = static_cast<double>(g.node(layer).output_elems_per_token);
  FSDP_ASSERT(h > 0, "a decoder layer node carries its hidden size");
  const double res = tensor_bytes(TensorClass::Residual, q);
  const Widths w = widths_of(g, layer, q);
  LayerCost c;
  c.ckpt = ckpt;
  c.params = static_cast<double>(g.params_under(layer));
  const int64_t toks = s.micro_batch * (node.tokens_per_sample > 0 ? node.tokens_per_sample : s.seq_len);
  // The GEMMs the per-op policy runs again (a property of the layer's op order, whatever its mode).
  const std::vector<ModuleId> sac_recomputed = g.op_sac(layer).recomputed_mms;
  for (ModuleId leaf : g.leaves_under(layer)) {
    const ModuleNode& n = g.node(leaf);
    c.matmul_flops_per_token += n.flops_per_token;
    c.attention_flops_per_token += seq_flops_per_token(n, s.seq_len, s.doc_len);
    if (n.kind == ModuleKind::AttentionCore) {
      c.shape.heads = n.heads;
      c.shape.kv_heads = n.kv_heads;
      c.shape.head_dim = n.head_dim;
      c.shape.window = n.window;
      c.shape.chunked = n.chunked;
      // Packed documents: flash attention's varlen kernel visits each document's causal triangle, the chunked count
      // with chunks of doc_len (compute_cost.hpp causal_keys_per_query).
      if (masked_per_document(n, s.seq_len, s.doc_len)) {
        c.shape.window = s.doc_len;
        c.shape.chunked = true;
      }
      if (n.attention_keys > 0) {
        c.shape.attn_seq = n.attention_keys;
        c.shape.attn_batch = (toks + n.attention_keys - 1) / n.attention_keys;
      }
    }
    if (n.kind != ModuleKind::Linear && n.kind != ModuleKind::Router) continue;
    const bool sac = std::find(sac_recomputed.begin(), sac_recomputed.end(), leaf) != sac_recomputed.end();
    if (ckpt == ActCkpt::Full || (ckpt == ActCkpt::SelectiveOp && sac))
      c.recompute_matmul_flops_per_token += n.flops_per_token;
    const bool f8 = float8_linear(n, s);
    const bool routed = routed_expert_linear(n);
    c.shape.gemms.push_back(
        GemmShape{toks, n.out_features, n.in_features, token_fraction(n), sac, tp_replicated_gate(n), f8, routed});
    if (f8) c.float8_params += static_cast<double>(n.in_features * n.out_features);
    if (n.kind != ModuleKind::Linear) continue;
    c.linear_params += static_cast<double>(n.in_features * n.out_features);
    // No adapter on a frozen vision tower (ActivationQuery::vision_unadapted).
    if (in.query.vision_unadapted && in_vision_tower(n)) continue;
    for (const auto& t : s.lora.target_modules)
      if (t == n.short_name) c.lora_params += static_cast<double>(s.lora.rank * (n.in_features + n.out_features));
  }
  if (s.method == Method::Full) c.lora_params = 0;
  c.matmul_flops_per_token *= ratio;
  c.attention_flops_per_token *= ratio;
  c.recompute_matmul_flops_per_token *= ratio;
  // torch.utils.checkpoint keeps only the region's input (the residual stream) per layer; the per-op policy also
  // the outputs it caches (ModuleGraph::op_sac).
  c.saved_bytes = ckpt == ActCkpt::Full ? tokens * h * res : tokens * g.saved_bytes_per_token(layer, q, ckpt);
  c.saved_bytes_unckpt = tokens * g.saved_bytes_per_token(layer, q, ActCkpt::None);
  c.recompute_bytes = tokens * g.recomputed_bytes_per_token(layer, q, ckpt);
  // Adapters kept in the master dtype outside the units (RuntimeProfile::lora_adapters_replicated: fsdp-run's fp32
  // flat leaf) are cast to the compute dtype at each use (executor/model/ops.cpp linear: A and B .to(dtype)), and
  // the two GEMMs keep those casts for their input gradients (derivatives.yaml mm: self's gradient reads mat2) from
  // the layer's forward to its backward: the layer's adapters once more, in the compute dtype, per micro-batch
  // (rematerialised with the rest of a fully checkpointed layer). Adapters that are parameters of their units come
  // already in the compute dtype from their gather (FSDP2's MixedPrecisionPolicy) and add nothing.
  if (s.method != Method::Full && rt.lora_adapters_replicated && s.param_dtype != s.master_dtype) {
    const double casts = c.lora_params * pb;
    (ckpt == ActCkpt::Full ? c.recompute_bytes : c.saved_bytes) += casts;
    c.saved_bytes_unckpt += casts;
  }

  const ModelSpec& m = g.spec();
  // Grouped-query attention: fewer key/value heads than query heads, repeated to them before the kernel where the
  // model's code does (RuntimeProfile::kv_repeat; a sliding layer's by its mask:
  // ActivationQuery::kv_repeated_windowed).
  const bool kv_repeated = c.shape.kv_heads > 0 && c.shape.kv_heads < c.shape.heads &&
                           (c.shape.window > 0 ? q.kv_repeated_windowed : q.kv_repeated);
  c.elementwise_bytes_per_token =
      rt.fused_elementwise
          ? fused_elementwise_bytes(w, h, pb, res, m.pre_mlp_norm && !m.parallel_block, rt, kv_repeated)
          : eager_elementwise_bytes(w, h, pb, res, q.norm_fp32_internal, rt, s.micro_batch, kv_repeated);
  c.elementwise_bytes_per_token *= ratio;
  c.elementwise_backward_bytes_per_token =
      2.0 * c.elementwise_bytes_per_token - ratio * backward_savings(w, pb, rt, !rt.fused_elementwise, kv_repeated);
  // Float8 linears cast their input in forward and the incoming gradient in backward, on this rank of the strategy's
  // tp group (float8_linears.hpp; shard_layer_for_tp leaves these as they are).
  if (s.float8 != Float8Recipe::None) {
    const double cast = float8_activation_cast_bytes_per_element(s.float8);
    const Float8CastElems f8 = float8_cast_elems_per_token(g, layer, s);
    const double shard = float8_shard_cast_bytes_per_element();
    c.float8_cast_bytes_per_token = ratio * (cast * f8.forward + shard * f8.forward_shard);
    c.float8_cast_backward_bytes_per_token =
        ratio * (cast * f8.backward + shard * f8.backward_shard + float8_transpose_bytes_per_element() * f8.transposed +
                 float8_backward_rescale_bytes_per_element(s.float8) * f8.rescale);
  }

  // Working memory of the forward beyond what it saves: the sublayer output and the residual sum (two
  // hidden-size tensors in the residual dtype), the usual transient of a pre-norm block. A checkpointed layer
  // runs without autograd, but a runtime whose layer keeps its intermediate tensors in locals until it returns
  // (fsdp-run's layer_forward, C++ temporaries living to the end of their statement) peaks at the MLP product
  // with the normed input, q, the repeated k and v and the attention output (q width each), the residual sum
  // and the post-attention norm's output, and the gate, activation, up and product tensors (ffn wide; plain
  // MLP: up and activation).
  const double residual = 2.0 * tokens * h * res;
  c.forward_transient = residual;
  if (ckpt == ActCkpt::Full && rt.checkpointed_forward_keeps_layer_tensors)
    c.forward_transient = std::max(residual, tokens * pb * (3.0 * h + 4.0 * w.q + (w.gated ? 4.0 : 2.0) * w.ffn));

  // Working memory of the backward, beyond the activations already counted: the larger of its two stages, as
  // autograd walks the layer in reverse (each node frees its saved tensors when it has run,
  // torch/csrc/autograd/engine.cpp: saved variables are released after the node's apply).
  //  - MLP stage (first): the incoming activation gradient (hidden size), the gradients of the MLP's
  //    intermediate tensors (gated: d(prod), d(act) and d(up) live together, while the output projection's
  //    saved input, the product, has been released: 2 ffn-wide net; plain: d(act) with the activation's output
  //    released, d(pre): 1 net), and the first weight gradient, the output projection's (measured on fsdp-run's
  //    allocation trace of a checkpointed layer's backward: tests/accuracy/README.md).
  //  - attention stage: the MLP's saved tensors are released and its weight gradients are complete; the
  //    hidden-size gradients, the q/k/v gradients and, for eager attention, the gradients of the probabilities
  //    and of the scores (heads x seq per token each, in the softmax's dtype; fused
  //    kernels recompute them in tiles).
  // The layer's weight gradients are allocated when its op completes (the ops' on_complete), so the stages
  // count only those produced before their peak; a frozen base (LoRA) produces none.
  const double trained = s.method == Method::Full ? 1.0 : 0.0;
  // A mixture-of-experts block's MLP stage is its shared experts' (they run last in forward, so first back); the
  // routed experts are a stage of their own (below).
  const MoeParts moe = moe_parts_of(g, layer, q);
  c.routed_params = moe.routed_params;
  c.dispatch_elems_per_token = moe.k * h;
  const double mlp_ffn = moe.present ? moe.shared_ffn : w.ffn;
  const double mlp_out_params = moe.present ? moe.shared_out_params : w.mlp_out_params;
  const double mlp_stage = tokens * pb * (h + (w.gated ? 2.0 : 1.0) * mlp_ffn) + trained * mlp_out_params * pb;
  double attn_stage =
      tokens * pb * (2.0 * h + w.q + 2.0 * w.kv) + trained * w.mlp_params * pb - tokens * w.mlp_saved_per_token;
  // q.attention: the attention whose tensors the run keeps (Eager also for sdpa dispatched to math).
  if (q.attention == AttentionImpl::Eager)
    attn_stage += 2.0 * tokens * static_cast<double>(c.shape.heads) *
                  static_cast<double>(c.shape.attn_seq > 0 ? c.shape.attn_seq : s.seq_len) *
                  tensor_bytes(TensorClass::SoftmaxOut, q);
  c.backward_transient = std::max(mlp_stage, attn_stage);
  // A mixture-of-experts block walks back its shared path, the weighting and the return to token order, then its
  // experts one by one (autograd runs the latest node first: the last expert first, moe.hpp), the dispatch, the
  // router. It peaks at the first expert's backward (the last one run), where these live together: the incoming
  // and the block input's gradients (hidden each), the gradient of the experts' joined outputs (k x hidden: the
  // cat's backward hands each expert a view of it) with the input gradients of the experts already walked (k x
  // hidden, less the first expert's k / E share, gathered by the split's backward), that expert's d(product),
  // d(activation) and d(up) (its k / E of the tokens; net 2 ffn wide, as a dense MLP stage), and the weight gradients
  // of every expert but the first one's gate and up projections. By then the shared path's saved tensors, the
  // weighting's and every other expert's are released, except the gathered inputs: one buffer that all the experts'
  // views keep (measured on fsdp-run's allocation trace: tests/accuracy/README.md, "MoE").
  // Under tensor parallelism (executor/model/moe.cpp) the block runs on the gathered tokens: the hidden-wide
  // gradients, the joined outputs', the gathered inputs and the weighting's tensors are whole on every rank, the
  // experts' widths, their weight gradients and intermediate tensors 1/tp; the shared gate stays whole.
  // Under expert parallelism (expert_parallel.hpp) the rank walks back its E/ep experts, which received as many token
  // copies as the rank sent (balanced routing): the first of them holds k / (E/ep) of the tokens, and only they have
  // weight gradients.
  if (moe.present) {
    const double t = static_cast<double>(std::max<int64_t>(1, s.mesh.tp));
    const double ep = static_cast<double>(std::max<int64_t>(1, s.mesh.ep));
    const double experts = moe.experts / ep, routed_params = moe.routed_params / ep;
    const double first = moe.k / experts;  // the first expert's share of the tokens, uniform load
    const double acts =
        tokens * pb * (2.0 * h + 2.0 * moe.k * h - first * h + (w.gated ? 2.0 : 1.0) * first * moe.expert_ffn / t);
    const double grads = trained * pb *
                         (moe.shared_gate_params + (moe.shared_params - moe.shared_gate_params) / t +
                          (routed_params * (1.0 - 1.0 / experts) + moe.routed_out_params / moe.experts) / t);
    const double released =
        tokens * (moe.shared_gate_saved + (moe.shared_saved - moe.shared_gate_saved) / t + moe.combine_saved +
                  (moe.routed_saved - moe.dispatched) * (1.0 - 1.0 / experts) / t);
    c.moe_backward_transient = acts + grads - released;
    c.backward_transient = std::max(c.backward_transient, c.moe_backward_transient);
  }
  return c;
}

}  // namespace fsdp
