#include "model/module_graph.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "compute/compute_cost.hpp"
#include "core/errors.hpp"
#include "model/module_parts.hpp"

namespace fsdp {

using namespace graph_parts;

const char* to_string(ModuleKind k) {
  switch (k) {
    case ModuleKind::Model:
      return "model";
    case ModuleKind::Embedding:
      return "embedding";
    case ModuleKind::PositionEmbedding:
      return "position_embedding";
    case ModuleKind::LayerStack:
      return "layers";
    case ModuleKind::DecoderLayer:
      return "decoder_layer";
    case ModuleKind::Attention:
      return "attention";
    case ModuleKind::Mlp:
      return "mlp";
    case ModuleKind::Moe:
      return "moe";
    case ModuleKind::Norm:
      return "norm";
    case ModuleKind::Linear:
      return "linear";
    case ModuleKind::Rotary:
      return "rotary";
    case ModuleKind::AttentionCore:
      return "attention_core";
    case ModuleKind::Activation:
      return "activation";
    case ModuleKind::Dropout:
      return "dropout";
    case ModuleKind::Router:
      return "router";
    case ModuleKind::Head:
      return "head";
    case ModuleKind::Loss:
      return "loss";
    case ModuleKind::Vision:
      return "vision";
    case ModuleKind::Scale:
      return "scale";
  }
  return "?";
}

double tensor_bytes(TensorClass cls, const ActivationQuery& q) {
  switch (cls) {
    case TensorClass::Compute:
      return dtype_bytes(q.compute);
    case TensorClass::Residual:
      return q.autocast_fp32_residual ? 4.0 : dtype_bytes(q.compute);
    case TensorClass::Fp32:
      return 4.0;
    case TensorClass::Byte:
      return 1.0;
    case TensorClass::Index:
      return 8.0;
    case TensorClass::NormInput:
      return q.norm_fp32_internal ? 4.0 : tensor_bytes(TensorClass::Residual, q);
    case TensorClass::NormInternal:
      return q.norm_fp32_internal ? dtype_bytes(q.compute) : 0.0;
    case TensorClass::NormSquared:
      return q.norm_mean_keeps_input ? tensor_bytes(TensorClass::NormInput, q) : 0.0;
    case TensorClass::LogProbs:
      return q.logits_upcast_fp32 ? 4.0 : dtype_bytes(q.compute);
    case TensorClass::SoftmaxOut:
      return q.softmax_fp32 ? 4.0 : dtype_bytes(q.compute);
    case TensorClass::SoftmaxCast:
      return q.softmax_fp32 && q.compute != DType::Fp32 ? dtype_bytes(q.compute) : 0.0;
    case TensorClass::PointwiseOut:
      return q.pointwise_outputs_saved ? dtype_bytes(q.compute) : 0.0;
    case TensorClass::QkvCopyKv:
      return q.mha_qkv_copy_saved ? dtype_bytes(q.compute) : 0.0;
    case TensorClass::FusedQkvQk:
      return q.value_view_keeps_fused_qkv ? dtype_bytes(q.compute) : 0.0;
    case TensorClass::KvRepeated:
      return q.kv_repeated && q.pointwise_outputs_saved ? dtype_bytes(q.compute) : 0.0;
    case TensorClass::KvRepeatedWindowed:
      return q.kv_repeated_windowed && q.pointwise_outputs_saved ? dtype_bytes(q.compute) : 0.0;
  }
  return 4.0;
}

ModuleGraph::ModuleGraph(ModelSpec spec) : spec_(std::move(spec)) {
  build();
  // Children are added after their parents, so a reverse sweep over vertices sums subtrees bottom-up.
  const size_t n = boost::num_vertices(g_);
  subtree_params_.assign(n, 0);
  children_.assign(n, {});
  for (size_t v = n; v-- > 0;) {
    subtree_params_[v] += g_[v].params;
    for (auto [it, end] = boost::in_edges(v, g_); it != end; ++it)
      if (g_[*it].kind == EdgeKind::Contains) subtree_params_[boost::source(*it, g_)] += subtree_params_[v];
  }
  for (size_t v = 0; v < n; ++v)
    for (auto [it, end] = boost::out_edges(v, g_); it != end; ++it)
      if (g_[*it].kind == EdgeKind::Contains) children_[v].push_back(boost::target(*it, g_));
  // A module's leaves are its own children's leaves in order (a leaf is its own); children come after their parent
  // in vertex order, so a reverse sweep has them ready.
  leaves_.assign(n, {});
  for (size_t v = n; v-- > 0;) {
    if (children_[v].empty()) {
      leaves_[v].push_back(static_cast<ModuleId>(v));
      continue;
    }
    for (ModuleId c : children_[v]) leaves_[v].insert(leaves_[v].end(), leaves_[c].begin(), leaves_[c].end());
  }
  // Layers of one structure share a class (the first such layer's index): what is derived from a layer's
  // nodes is derived once per class (program/layer_costs.hpp). The signature is every leaf's kind, short name,
  // shape, FLOPs and saved tensors, in execution order, whether it reads the embedding's output (the first layer's
  // input norm: ModuleNode::reads_embedding), and the layer's containers.
  // The signature is a byte string of those fields (their bytes as stored: exact equality, as the text it replaced,
  // at a fraction of its cost for the largest MoE models' thousands of experts).
  std::vector<std::string> signatures;
  auto put = [](std::string& sig, const auto& v) { sig.append(reinterpret_cast<const char*>(&v), sizeof v); };
  auto put_text = [&](std::string& sig, const std::string& t) {
    put(sig, t.size());
    sig += t;
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    std::string sig;
    put(sig, g_[layers_[i]].tokens_per_sample);
    for (ModuleId c : children(layers_[i])) put(sig, g_[c].kind);
    for (ModuleId leaf : leaves_under(layers_[i])) {
      const ModuleNode& n = g_[leaf];
      put(sig, n.kind);
      put_text(sig, n.short_name);
      for (const int64_t v :
           {n.params, n.in_features, n.out_features, n.output_elems_per_token, n.window, n.attention_keys})
        put(sig, v);
      put(sig, n.flops_per_token);
      put(sig, n.flops_per_token_per_seq);
      put(sig, n.chunked);
      put(sig, n.reads_embedding);
      put(sig, n.saved.size());
      for (const SavedTensor& t : n.saved) {
        put(sig, t.elems_per_token);
        put(sig, t.per_seq);
        put(sig, t.cls);
        put(sig, t.attention_internal);
        put(sig, t.eager_only);
        put(sig, t.fused_only);
      }
    }
    int64_t cls = static_cast<int64_t>(i);
    for (size_t j = 0; j < i; ++j)
      if (layer_class_[j] == static_cast<int64_t>(j) && signatures[j] == sig) {
        cls = static_cast<int64_t>(j);
        break;
      }
    layer_class_.push_back(cls);
    signatures.push_back(std::move(sig));
  }
}

ModuleGraph build_module_graph(const ModelSpec& spec) { return ModuleGraph(spec); }

ModuleId ModuleGraph::add(ModuleId parent, ModuleNode n) {
  ModuleId id = boost::add_vertex(std::move(n), g_);
  if (parent != id) boost::add_edge(parent, id, ModuleEdge{EdgeKind::Contains}, g_);
  return id;
}

void ModuleGraph::feeds(ModuleId from, ModuleId to) { boost::add_edge(from, to, ModuleEdge{EdgeKind::Feeds}, g_); }

namespace graph_parts {

ModuleNode linear(std::string name, std::string short_name, int64_t layer, int64_t in, int64_t out, bool bias,
                  const std::string& input_id, TensorClass input_cls) {
  ModuleNode n;
  n.name = std::move(name);
  n.short_name = std::move(short_name);
  n.kind = ModuleKind::Linear;
  n.layer = layer;
  n.in_features = in;
  n.out_features = out;
  n.params = in * out + (bias ? out : 0);
  // A GEMM of (tokens x in) by (in x out): 2*in*out FLOPs per token (multiply + add).
  n.flops_per_token = 2.0 * static_cast<double>(in) * static_cast<double>(out);
  n.lora_target = true;
  // autograd's linear saves its input for the weight gradient.
  n.saved.push_back(SavedTensor{input_id, static_cast<double>(in), false, input_cls});
  n.output_elems_per_token = out;
  n.output_id = n.name + ".out";  // the builders name it after the consumer that saves it, where one does
  return n;
}

NormShape hidden_norm(const ModelSpec& m) { return NormShape{m.hidden_size, m.hidden_size, 1}; }

ModuleNode norm(std::string name, NormType type, int64_t layer, const std::string& input_id, NormShape shape) {
  ModuleNode n;
  n.name = name;
  n.short_name = name.substr(name.rfind('.') + 1);
  n.kind = ModuleKind::Norm;
  n.layer = layer;
  const bool ln = type != NormType::RmsNorm;
  const double elems = static_cast<double>(shape.elems);
  // weight (+ bias for LayerNorm); OLMo 1's OlmoLayerNorm has neither (F.layer_norm(x, shape, None, None)).
  n.params = type == NormType::LayerNorm ? 2 * shape.weight : type == NormType::RmsNorm ? shape.weight : 0;
  n.flops_per_token = kNormFlopsPerElem * elems;
  // Backward needs the input and the per-row statistics (rstd; LayerNorm also the mean).
  n.saved.push_back(SavedTensor{input_id, elems, false, TensorClass::NormInput});
  n.saved.push_back(
      SavedTensor{name + ".stats", (ln ? 2.0 : 1.0) * static_cast<double>(shape.rows), false, TensorClass::Fp32});
  // Hugging Face LlamaRMSNorm computes in fp32 and multiplies the weight by the normalised tensor cast back
  // to the input dtype (transformers/models/llama/modeling_llama.py), so autograd also keeps that tensor.
  n.saved.push_back(SavedTensor{name + ".normalized", elems, false, TensorClass::NormInternal});
  // RMSNorm's variance x.pow(2).mean(-1): some runtimes' mean keeps the squared tensor (NormSquared).
  if (!ln) n.saved.push_back(SavedTensor{name + ".squared", elems, false, TensorClass::NormSquared});
  n.output_elems_per_token = shape.elems;
  return n;
}

ModuleNode norm(std::string name, const ModelSpec& m, int64_t layer, const std::string& input_id) {
  return norm(std::move(name), m.norm, layer, input_id, hidden_norm(m));
}

// q_norm / k_norm over `heads` heads of the projection (model_spec.hpp QkNorm).
NormShape qk_norm_shape(const ModelSpec& m, int64_t heads) {
  const int64_t width = heads * m.head_dim;
  const bool per_head = m.qk_norm == QkNorm::PerHead || m.qk_norm == QkNorm::L2;
  return per_head ? NormShape{m.head_dim, width, heads} : NormShape{width, width, 1};
}

ModuleNode qk_norm(std::string name, const ModelSpec& m, int64_t layer, const std::string& input_id, int64_t heads) {
  if (m.qk_norm != QkNorm::L2) return norm(std::move(name), m.norm, layer, input_id, qk_norm_shape(m, heads));
  // Llama4TextL2Norm: x * rsqrt(mean(x^2) + eps) in fp32, cast back, no weight: an RMSNorm's statistics and saved
  // input, without the weight and so without the normalised tensor kept for the weight's multiply.
  ModuleNode n = norm(std::move(name), NormType::RmsNorm, layer, input_id, qk_norm_shape(m, heads));
  n.params = 0;
  std::erase_if(n.saved, [](const SavedTensor& t) { return t.cls == TensorClass::NormInternal; });
  return n;
}

// InternVisionEncoderLayer: x + attn(norm1(x)) * ls1, then + mlp(norm2(x)) * ls2 (modeling_intern_vit.py @ 2d93b099).
// One multiply per element; autograd keeps the sublayer's output for ls's gradient (the vector itself is a parameter).
ModuleNode layer_scale(std::string name, int64_t layer, int64_t hidden, const std::string& input_id) {
  ModuleNode n;
  n.short_name = name.substr(name.rfind('.') + 1);
  n.name = std::move(name);
  n.kind = ModuleKind::Scale;
  n.layer = layer;
  n.params = hidden;
  n.flops_per_token = static_cast<double>(hidden);
  n.saved.push_back(SavedTensor{input_id, static_cast<double>(hidden), false, TensorClass::Compute});
  n.output_elems_per_token = hidden;
  return n;
}

// The MLP's activation function (with the gating multiply for gated MLPs), `f` elements per token.
ModuleNode activation(const std::string& mlp, int64_t layer, double f, int64_t ffn) {
  ModuleNode act;
  act.name = mlp + ".act_fn";
  act.short_name = "act_fn";
  act.kind = ModuleKind::Activation;
  act.layer = layer;
  act.flops_per_token = kActFlopsPerElem * f;
  act.output_elems_per_token = ffn;
  return act;
}

ModuleNode dropout(std::string name, int64_t layer, double elems, bool per_seq, bool attention_internal) {
  ModuleNode n;
  n.name = name;
  n.short_name = "dropout";
  n.kind = ModuleKind::Dropout;
  n.layer = layer;
  n.saved.push_back(SavedTensor{name + ".mask", elems, per_seq, TensorClass::Byte, attention_internal, true});
  return n;
}

}  // namespace graph_parts

ModuleId ModuleGraph::then_dropout(ModuleId parent, ModuleId after, const std::string& name, int64_t layer) {
  if (!cur_->dropout) return after;
  const ModuleId d = add(parent, dropout(name, layer, static_cast<double>(cur_->hidden_size), false, false));
  feeds(after, d);
  return d;
}

ModuleId ModuleGraph::build_attention(ModuleId layer, int64_t i, ModuleId src, const std::string& in_id) {
  const ModelSpec& m = *cur_;
  const std::string p = prefix_ + std::to_string(i);
  ModuleNode attn_c;
  attn_c.name = p + ".self_attn";
  attn_c.short_name = "self_attn";
  attn_c.kind = ModuleKind::Attention;
  attn_c.layer = i;
  ModuleId attn = add(layer, attn_c);
  if (m.mla) return build_mla(attn, i, src, in_id);
  ModuleId q = add(attn, linear(p + ".self_attn.q_proj", "q_proj", i, m.hidden_size, m.q_dim(), m.qkv_bias, in_id,
                                TensorClass::Compute));
  ModuleId k = add(attn, linear(p + ".self_attn.k_proj", "k_proj", i, m.hidden_size, m.kv_dim(), m.qkv_bias, in_id,
                                TensorClass::Compute));
  ModuleId v = add(attn, linear(p + ".self_attn.v_proj", "v_proj", i, m.hidden_size, m.kv_dim(), m.qkv_bias, in_id,
                                TensorClass::Compute));
  for (ModuleId x : {q, k, v}) feeds(src, x);
  // The projections' outputs as their consumers save them: the q/k norms' inputs, else (without rotary) the
  // attention core's q and k; v goes to the core as it is. Llama 4's NoPE layers rotate nothing, and its L2 q/k
  // norm runs on the rotary layers only, after rotary (the norms' inputs are then the rotary's outputs).
  const bool rope = m.rotary_layer(i);
  const bool l2 = m.qk_norm == QkNorm::L2;
  const bool qk_norms = m.qk_norm != QkNorm::None && (!l2 || rope);
  if (qk_norms && !l2) {
    g_[q].output_id = p + ".q_proj.out";
    g_[k].output_id = p + ".k_proj.out";
  } else if (!rope) {
    g_[q].output_id = p + ".attn.q";
    g_[k].output_id = p + ".attn.k";
  }
  g_[v].output_id = p + ".attn.v";
  ModuleId q_src = q, k_src = k;
  // q_norm and k_norm on the projections before rotary (Qwen3Attention, Gemma3Attention, Olmo2Attention), or after
  // it (Llama 4's L2 norm, whose inputs are the rotated q and k).
  auto add_qk_norms = [&](const std::string& q_in, const std::string& k_in) {
    const ModuleId qn = add(attn, qk_norm(p + ".self_attn.q_norm", m, i, q_in, m.num_heads));
    const ModuleId kn = add(attn, qk_norm(p + ".self_attn.k_norm", m, i, k_in, m.num_kv_heads));
    feeds(q_src, qn);
    feeds(k_src, kn);
    q_src = qn;
    k_src = kn;
  };
  if (qk_norms && !l2) add_qk_norms(p + ".q_proj.out", p + ".k_proj.out");
  if (rope) {
    ModuleNode rot;
    rot.name = p + ".self_attn.rotary";
    rot.short_name = "rotary";
    rot.kind = ModuleKind::Rotary;
    rot.layer = i;
    // q*cos + rotate_half(q)*sin on the rotated dims of q and k: 3 FLOPs per element (HF apply_rotary_pos_emb;
    // partial rotary passes the other dims through, GPTNeoXAttention).
    rot.flops_per_token = 3.0 * static_cast<double>((m.num_heads + m.num_kv_heads) * m.rotary_dims());
    rot.output_elems_per_token = m.q_dim() + m.kv_dim();
    ModuleId r = add(attn, rot);
    feeds(q_src, r);
    feeds(k_src, r);
    q_src = k_src = r;
  }
  if (qk_norms && l2) add_qk_norms(p + ".attn.q_rot", p + ".attn.k_rot");
  ModuleNode core;
  core.name = p + ".self_attn.core";
  core.short_name = "attention";
  core.kind = ModuleKind::AttentionCore;
  core.layer = i;
  core.heads = m.num_heads;
  core.kv_heads = m.num_kv_heads;
  core.head_dim = m.head_dim;
  core.window = cur_vision_ ? 0 : m.attention_window(i);
  core.chunked = core.window > 0 && m.chunked_attention;
  // A vision block attends within its image (or window), both ways: its keys are fixed, and its scores are heads x
  // keys per token whatever the language model's sequence; a decoder layer's are heads x seq (per_seq).
  core.attention_keys = cur_vision_ ? cur_vision_->attention_keys(i) : 0;
  const bool per_seq = core.attention_keys == 0;
  const double score = static_cast<double>(m.num_heads) * (per_seq ? 1.0 : static_cast<double>(core.attention_keys));
  // QK^T and PV: 2 GEMMs of 2*s*d FLOPs per token per head (non-causal count; see seq_flops_per_token).
  core.flops_per_token_per_seq = 4.0 * static_cast<double>(m.q_dim());
  const double qd = static_cast<double>(m.q_dim());
  const double kvd = static_cast<double>(m.kv_dim());
  const double heads = static_cast<double>(m.num_heads);
  // Fused kernels (FlashAttention-2, arXiv 2307.08691 Alg. 1/2; PyTorch SDPA) keep q, k, v, the output and
  // the per-row log-sum-exp (fp32) for backward.
  core.saved.push_back(SavedTensor{p + ".attn.q", qd, false, TensorClass::Compute});
  core.saved.push_back(SavedTensor{p + ".attn.k", kvd, false, TensorClass::Compute, false, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.v", kvd, false, TensorClass::Compute, false, false, true});
  // The output is the fused kernel's own (its backward reads it); eager attention's PV matmul keeps only its inputs,
  // so there the output is kept by the output projection that reads it, where that saves its input (not a frozen
  // o_proj without an adapter: ActivationQuery::frozen_base).
  core.saved.push_back(SavedTensor{p + ".attn.out", qd, false, TensorClass::Compute, false, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.lse", heads, false, TensorClass::Fp32, true, false, true, true});
  // A multi-head layer (as many kv heads as query heads) whose runtime copies the qkv projection's output into one
  // tensor and views q out of it (RuntimeProfile::mha_qkv_copy_saved): the fused kernel's saved q keeps k's and v's
  // thirds of that copy alive too, beside the k and v it saves.
  if (m.num_kv_heads == m.num_heads)
    core.saved.push_back(
        SavedTensor{p + ".attn.qkv_copy_kv", 2.0 * kvd, false, TensorClass::QkvCopyKv, false, false, true});
  // Grouped k and v repeated to the query heads before the fused kernel (a copy each: repeat_kv's expand then
  // reshape; RuntimeProfile::kv_repeat): the kernel saves them at q's width, q - kv more each, where autograd keeps
  // the copies (eager: a compiled graph saves the kv-wide tensors and repeats them again in the backward, the copy
  // being a cheap op to the min-cut partitioner, torch/_functorch/partitioners.py). A sliding layer has a class of
  // its own: the sdpa path passes its mask, and with a mask Hugging Face repeats them.
  if (core.kv_heads < core.heads)
    core.saved.push_back(SavedTensor{p + ".attn.kv_repeated", 2.0 * (qd - kvd), false,
                                     core.window > 0 ? TensorClass::KvRepeatedWindowed : TensorClass::KvRepeated, false,
                                     false, true});
  // A value that views the one fused qkv projection's output while the rotary writes q and k anew
  // (ModelSpec::value_views_fused_qkv; RuntimeProfile::value_view_keeps_fused_qkv): the saved value keeps that whole
  // output, q's and k's parts beside the rotated q and k. A fused kernel takes the grouped value as it is; eager
  // attention's repeat_kv copies it when there are fewer kv heads than query heads (the expanded copy below is what
  // its PV matmul saves), and returns it unchanged when there are as many. Not a kernel output: a per-op policy
  // caches the projection's output whole instead (op_sac).
  if (m.value_views_fused_qkv)
    core.saved.push_back(SavedTensor{p + ".attn.fused_qkv_qk", qd + kvd, false, TensorClass::FusedQkvQk, false, false,
                                     m.num_kv_heads != m.num_heads});
  // Eager attention (Korthikanti et al. 2022, sec. 4.1): K for QK^T, the softmax output (2as^2b), with
  // dropout its mask (as^2b) and output (2as^2b), and V for the PV GEMM. GQA's k/v are expanded to all
  // heads before the GEMMs (Hugging Face repeat_kv), so eager saves them at q width.
  core.saved.push_back(SavedTensor{p + ".attn.k_expanded", qd, false, TensorClass::Compute, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.v_expanded", qd, false, TensorClass::Compute, false, true});
  core.saved.push_back(
      SavedTensor{p + ".attn.probs", score, per_seq, TensorClass::SoftmaxOut, true, true, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.probs_cast", score, per_seq, TensorClass::SoftmaxCast, true, true});
  // Soft-capping the scores, cap * tanh(scores / cap) (Gemma2Attention eager path): tanh keeps its output
  // for backward, one more score-sized tensor; fused kernels cap in the tile (FlashAttention-2 >= 2.6 softcap).
  if (m.attn_logit_softcap > 0)
    core.saved.push_back(SavedTensor{p + ".attn.softcap", score, per_seq, TensorClass::Compute, true, true});
  if (m.dropout) {
    core.saved.push_back(SavedTensor{p + ".attn.dropout.mask", score, per_seq, TensorClass::Byte, true, true});
    core.saved.push_back(SavedTensor{p + ".attn.dropout.out", score, per_seq, TensorClass::Compute, true, true});
  }
  core.output_elems_per_token = m.q_dim();
  core.output_id = p + ".attn.out";
  ModuleId c = add(attn, core);
  feeds(q_src, c);
  feeds(k_src, c);
  feeds(v, c);
  ModuleId o = add(attn, linear(p + ".self_attn.o_proj", "o_proj", i, m.q_dim(), m.hidden_size, m.attn_out_bias,
                                p + ".attn.out", TensorClass::Compute));
  g_[o].output_id = p + ".attn.proj_out";  // a post-attention norm's input
  feeds(c, o);
  return then_dropout(attn, o, p + ".self_attn.resid_dropout", i);
}

// Multi-head latent attention (model_spec.hpp MlaSpec; DeepSeek-V2 paper arXiv:2405.04434 sec. 2.1, eqs. 9-19;
// the module layout of transformers models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3Attention, which
// DeepseekV2Attention shares). Per token, autograd keeps: the low-rank q latent and its norm's output (q_lora_rank
// each), the compressed kv latent c_KV and its norm's output (kv_lora_rank each: the inputs of kv_a_layernorm
// and kv_b_proj), then the attention core's decompressed q and k (heads x (nope + rope): k_nope from kv_b_proj
// with the one rotary key k_R, eq. 14, broadcast to every head) and v (heads x v_head_dim).
ModuleId ModuleGraph::build_mla(ModuleId attn, int64_t i, ModuleId src, const std::string& in_id) {
  const ModelSpec& m = *cur_;
  const MlaSpec& a = *m.mla;
  const std::string p = prefix_ + std::to_string(i);
  const std::string sa = p + ".self_attn.";
  const int64_t qk = m.num_heads * a.qk_head_dim();
  const int64_t v_width = m.num_heads * a.v_head_dim;
  auto low_rank = [&](const std::string& down, const std::string& ln, const std::string& up, int64_t down_out,
                      int64_t rank, int64_t up_out) {
    ModuleId d =
        add(attn, linear(sa + down, down, i, m.hidden_size, down_out, m.qkv_bias, in_id, TensorClass::Compute));
    g_[d].output_id = sa + down + ".latent";  // the latent's norm's input
    feeds(src, d);
    ModuleId n = add(attn, norm(sa + ln, NormType::RmsNorm, i, sa + down + ".latent", NormShape{rank, rank, 1}));
    feeds(d, n);
    ModuleId u = add(attn, linear(sa + up, up, i, rank, up_out, false, sa + ln + ".out", TensorClass::Compute));
    feeds(n, u);
    return u;
  };
  ModuleId q =
      a.q_lora_rank > 0
          ? low_rank("q_a_proj", "q_a_layernorm", "q_b_proj", a.q_lora_rank, a.q_lora_rank, qk)
          : add(attn, linear(sa + "q_proj", "q_proj", i, m.hidden_size, qk, false, in_id, TensorClass::Compute));
  if (a.q_lora_rank == 0) feeds(src, q);
  ModuleId kv = low_rank("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", a.kv_lora_rank + a.qk_rope_head_dim,
                         a.kv_lora_rank, m.num_heads * (a.qk_nope_head_dim + a.v_head_dim));
  ModuleNode rot;
  rot.name = sa + "rotary";
  rot.short_name = "rotary";
  rot.kind = ModuleKind::Rotary;
  rot.layer = i;
  // Rotary on q's rope part (heads x rope) and on the single shared key k_R (rope): 3 FLOPs per element.
  rot.flops_per_token = 3.0 * static_cast<double>((m.num_heads + 1) * a.qk_rope_head_dim);
  rot.output_elems_per_token = (m.num_heads + 1) * a.qk_rope_head_dim;
  ModuleId r = add(attn, rot);
  feeds(q, r);
  feeds(kv, r);
  ModuleNode core;
  core.name = sa + "core";
  core.short_name = "attention";
  core.kind = ModuleKind::AttentionCore;
  core.layer = i;
  core.heads = core.kv_heads = m.num_heads;
  // The kernel's head: transformers pads v to the q/k head for FlashAttention-2 when they differ
  // (DeepseekV3Attention.forward: F.pad(value_states, [0, qk_head_dim - v_head_dim])).
  core.head_dim = a.qk_head_dim();
  // QK^T over the q/k head and PV over the v head (non-causal count; see seq_flops_per_token).
  core.flops_per_token_per_seq = 2.0 * static_cast<double>(qk + v_width);
  const double heads = static_cast<double>(m.num_heads);
  core.saved.push_back(SavedTensor{p + ".attn.q", double(qk), false, TensorClass::Compute});
  core.saved.push_back(SavedTensor{p + ".attn.k", double(qk), false, TensorClass::Compute});
  // Fused kernels keep the padded v and output (q/k head wide); eager attention keeps them v_head_dim wide.
  core.saved.push_back(SavedTensor{p + ".attn.v", double(qk), false, TensorClass::Compute, false, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.o", double(qk), false, TensorClass::Compute, false, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.v_eager", double(v_width), false, TensorClass::Compute, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.lse", heads, false, TensorClass::Fp32, true, false, true, true});
  core.saved.push_back(SavedTensor{p + ".attn.probs", heads, true, TensorClass::SoftmaxOut, true, true, false, true});
  core.saved.push_back(SavedTensor{p + ".attn.probs_cast", heads, true, TensorClass::SoftmaxCast, true, true});
  core.output_elems_per_token = v_width;
  core.output_id = p + ".attn.out";
  ModuleId c = add(attn, core);
  feeds(r, c);
  feeds(kv, c);
  ModuleId o = add(attn, linear(sa + "o_proj", "o_proj", i, v_width, m.hidden_size, m.attn_out_bias, p + ".attn.out",
                                TensorClass::Compute));
  feeds(c, o);
  return o;
}

ModuleId ModuleGraph::build_mlp(ModuleId parent, int64_t i, const std::string& mp, const std::string& in_id,
                                int64_t ffn, double token_fraction) {
  const ModelSpec& m = *cur_;
  const double f = static_cast<double>(ffn) * token_fraction;
  // Routed experts see a gathered copy of their tokens (token_fraction < 1); dense MLPs read the norm output.
  const std::string input = token_fraction < 1.0 ? mp + ".in" : in_id;
  ModuleId last;
  if (m.gated_mlp) {
    ModuleId gate = add(
        parent, linear(mp + ".gate_proj", "gate_proj", i, m.hidden_size, ffn, m.mlp_bias, input, TensorClass::Compute));
    ModuleId up =
        add(parent, linear(mp + ".up_proj", "up_proj", i, m.hidden_size, ffn, m.mlp_bias, input, TensorClass::Compute));
    ModuleNode act = activation(mp, i, f, ffn);
    // SiLU saves its input (the gate output); the gating multiply saves both operands. SiLU's output feeds only
    // the multiply and, in backward, the multiply's gradient: a pointwise output a partitioning runtime recomputes
    // from the saved gate (PointwiseOut; AOTAutograd's min-cut partitioner, configs/runtimes/pytorch-compile.yaml).
    act.saved.push_back(SavedTensor{mp + ".gate.out", f, false, TensorClass::Compute});
    act.saved.push_back(SavedTensor{mp + ".act.out", f, false, TensorClass::PointwiseOut});
    act.saved.push_back(SavedTensor{mp + ".up.out", f, false, TensorClass::Compute});
    ModuleId a = add(parent, act);
    feeds(gate, a);
    feeds(up, a);
    g_[gate].output_id = mp + ".gate.out";
    g_[up].output_id = mp + ".up.out";
    ModuleId down = add(parent, linear(mp + ".down_proj", "down_proj", i, ffn, m.hidden_size, m.mlp_bias, mp + ".prod",
                                       TensorClass::Compute));
    g_[down].output_id = mp + ".out";  // a post-MLP norm's input
    feeds(a, down);
    last = down;
    for (ModuleId x : {gate, up, down}) g_[x].saved[0].elems_per_token *= token_fraction;
    for (ModuleId x : {gate, up, down}) g_[x].flops_per_token *= token_fraction;
  } else {
    ModuleId fc1 =
        add(parent, linear(mp + ".c_fc", "c_fc", i, m.hidden_size, ffn, m.mlp_bias, input, TensorClass::Compute));
    ModuleNode act = activation(mp, i, f, ffn);
    act.saved.push_back(SavedTensor{mp + ".fc1.out", f, false, TensorClass::Compute});
    ModuleId a = add(parent, act);
    feeds(fc1, a);
    g_[fc1].output_id = mp + ".fc1.out";
    ModuleId fc2 = add(parent, linear(mp + ".c_proj", "c_proj", i, ffn, m.hidden_size, m.mlp_bias, mp + ".act.out",
                                      TensorClass::Compute));
    g_[fc2].output_id = mp + ".out";
    feeds(a, fc2);
    for (ModuleId x : {fc1, fc2}) g_[x].saved[0].elems_per_token *= token_fraction;
    for (ModuleId x : {fc1, fc2}) g_[x].flops_per_token *= token_fraction;
    last = then_dropout(parent, fc2, mp + ".dropout", i);
  }
  return last;
}

ModuleId ModuleGraph::build_mlp_block(ModuleId layer, int64_t i, ModuleId src, const std::string& in_id) {
  const ModelSpec& m = *cur_;
  const std::string p = prefix_ + std::to_string(i);
  const double h = static_cast<double>(m.hidden_size);
  ModuleNode mlp_c;
  mlp_c.layer = i;
  if (!m.is_moe_layer(i)) {
    mlp_c.name = p + ".mlp";
    mlp_c.short_name = "mlp";
    mlp_c.kind = ModuleKind::Mlp;
    ModuleId mlp = add(layer, mlp_c);
    build_mlp(mlp, i, p + ".mlp", in_id, m.ffn_size, 1.0);
    feeds(src, mlp);
    return mlp;
  }
  const MoeSpec& moe = *m.moe;
  mlp_c.name = p + ".block_sparse_moe";
  mlp_c.short_name = "block_sparse_moe";
  mlp_c.kind = ModuleKind::Moe;
  ModuleId block = add(layer, mlp_c);
  ModuleNode router;
  router.name = p + ".block_sparse_moe.gate";
  router.short_name = "gate";
  router.kind = ModuleKind::Router;
  router.layer = i;
  router.in_features = m.hidden_size;
  router.out_features = moe.num_experts;
  // No bias (Mixtral: nn.Linear(..., bias=False)); DeepSeek-V3 adds e_score_correction_bias, one per expert.
  router.params = m.hidden_size * moe.num_experts + (moe.router_bias ? moe.num_experts : 0);
  router.flops_per_token = 2.0 * h * static_cast<double>(moe.num_experts);
  router.saved.push_back(SavedTensor{in_id, h, false, TensorClass::Compute});
  // Routing probabilities in fp32 for the top-k softmax (Mixtral's router upcasts).
  router.saved.push_back(
      SavedTensor{p + ".router.probs", static_cast<double>(moe.num_experts), false, TensorClass::Fp32});
  // The top-k choice, k int64 indices per token, kept by the gather of the chosen probabilities (torch.topk's
  // backward in MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock, probs.gather in fsdp-run's moe.cpp); renormalising
  // them (norm_topk_prob) keeps the chosen probabilities and their per-token sum, fp32, for the division's backward.
  const double k = static_cast<double>(moe.experts_per_token);
  router.saved.push_back(SavedTensor{p + ".router.topk_indices", k, false, TensorClass::Index});
  if (moe.norm_topk_prob)
    router.saved.push_back(SavedTensor{p + ".router.topk_probs_and_sum", k + 1.0, false, TensorClass::Fp32});
  router.output_elems_per_token = moe.num_experts;
  ModuleId r = add(block, router);
  feeds(src, r);
  // Token dispatch and combine, what a dropless top-k block keeps for backward beyond the experts' own tensors (each
  // token routed k times: k slots per token whatever the experts' load):
  //  - two int64 index maps of k per token: the token of each routed row in expert order (the dispatch gather's
  //    index) and the way back (fsdp-run's moe.cpp: the row of each (token, choice) slot); Hugging Face's per-expert
  //    top_x and idx (Qwen2MoeSparseMoeBlock: hidden_states[None, top_x], routing_weights[top_x, idx]),
  //    torchtitan's token_indices_experts_sorted (torchtitan/models/moe/moe.py TokenReorderer), Megatron-LM's
  //    sorted_indices (megatron/core/transformer/moe/moe_utils.py permute / unpermute);
  //  - the experts' outputs and their routing weights, k x hidden and k per token, kept by the weighting multiply
  //    (Hugging Face: expert_layer(current_state) * routing_weights[top_x, idx, None]). Hugging Face's combine,
  //    index_add_ of the weighted outputs, keeps its source too (a second k x hidden); fsdp-run's sum over each
  //    token's k outputs keeps nothing.
  // The gathered copies of the tokens each expert reads are the experts' own (build_mlp's "<expert>.in").
  g_[block].saved.push_back(SavedTensor{p + ".moe.dispatch_indices", 2.0 * k, false, TensorClass::Index});
  // Under an expert capacity (MoeSpec::expert_load_factor) the experts' rows are their capacity (padded) or what
  // fits in it (dropped beyond): the experts' outputs and everything each expert computes scale with it.
  const double load = moe.expert_load_factor();
  g_[block].saved.push_back(SavedTensor{p + ".moe.routed_out", k * h * load, false, TensorClass::Compute});
  g_[block].saved.push_back(SavedTensor{p + ".moe.routed_weights", k * load, false, TensorClass::Compute});
  const double frac = k / static_cast<double>(moe.num_experts) * load;
  for (int64_t e = 0; e < moe.num_experts; ++e) {
    ModuleNode ex;
    ex.name = p + ".block_sparse_moe.experts." + std::to_string(e);
    ex.short_name = "expert";
    ex.kind = ModuleKind::Mlp;
    ex.layer = i;
    ModuleId eid = add(block, ex);
    build_mlp(eid, i, ex.name, in_id, moe.expert_ffn_size, frac);
    // The gathered copy of the tokens routed to this expert.
    g_[eid].saved.push_back(SavedTensor{ex.name + ".in", h * frac, false, TensorClass::Compute});
    feeds(r, eid);
  }
  for (int64_t e = 0; e < moe.shared_experts; ++e) {
    ModuleNode ex;
    ex.name = p + ".block_sparse_moe.shared_experts." + std::to_string(e);
    ex.short_name = "shared_expert";
    ex.kind = ModuleKind::Mlp;
    ex.layer = i;
    ModuleId eid = add(block, ex);
    build_mlp(eid, i, ex.name, in_id, moe.shared_ffn(), 1.0);
    feeds(src, eid);
  }
  if (moe.shared_expert_gate) {
    // Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) * shared_expert(x); the gate is hidden -> 1 without a
    // bias, and the product keeps the sigmoid's output and the shared expert's output for backward.
    ModuleNode gate = linear(p + ".block_sparse_moe.shared_expert_gate", "shared_expert_gate", i, m.hidden_size, 1,
                             false, in_id, TensorClass::Compute);
    gate.lora_target = false;
    gate.saved.push_back(SavedTensor{p + ".shared_expert_gate.sigmoid", 1.0, false, TensorClass::Compute});
    gate.saved.push_back(SavedTensor{p + ".shared_expert.out", h, false, TensorClass::Compute});
    feeds(src, add(block, gate));
  }
  return block;
}

// A decoder layer from the spec's parts (model_spec.hpp): the optional norms around each sublayer, and the
// attention and MLP one after the other (x + attn, then + mlp) or in parallel on the layer input.
ModuleId ModuleGraph::build_layer(ModuleId stack, int64_t i, ModuleId input) {
  const ModelSpec& m = *cur_;
  const std::string p = prefix_ + std::to_string(i);
  ModuleNode ln;
  ln.name = p;
  ln.short_name = "layer";
  ln.kind = ModuleKind::DecoderLayer;
  ln.layer = i + layer_offset_;  // its index in layers(): vision blocks come first
  ln.output_elems_per_token = m.hidden_size;
  ln.tokens_per_sample = cur_vision_ ? cur_vision_->vision_tokens() : 0;
  ModuleId layer = add(stack, ln);
  // A norm of the layer fed by `src` and saving `in_id`; its output's id is "<name>.out".
  const std::string layer_in = p + ".in";
  auto layer_norm = [&](const std::string& short_name, ModuleId src, const std::string& in_id) {
    ModuleNode nn = norm(p + "." + short_name, m, i, in_id);
    nn.reads_embedding = i == 0 && in_id == layer_in;
    ModuleId n = add(layer, std::move(nn));
    feeds(src, n);
    return n;
  };

  ModuleId attn_src = input;
  std::string attn_in = layer_in;
  if (m.pre_attention_norm) {
    attn_src = layer_norm("input_layernorm", input, layer_in);
    attn_in = p + ".input_layernorm.out";
  }
  ModuleId attn_last = build_attention(layer, i, attn_src, attn_in);
  const bool scaled = cur_vision_ && cur_vision_->layer_scale;
  if (scaled) {
    const ModuleId ls1 = add(layer, layer_scale(p + ".ls1", i, m.hidden_size, p + ".attn.proj_out"));
    feeds(attn_last, ls1);
    attn_last = ls1;
  }
  // Gemma names the norm on the attention output post_attention_layernorm, and the one before the MLP
  // pre_feedforward_layernorm; Llama's post_attention_layernorm is the one before the MLP.
  if (m.post_attention_norm) attn_last = layer_norm("post_attention_layernorm", attn_last, p + ".attn.proj_out");

  ModuleId mlp_src = attn_last;
  std::string mlp_in = p + ".mid";  // the residual stream after the attention's add
  if (m.parallel_block) {
    // Both sublayers read the layer input: through their own norm (NeoX), or the input norm's output (Falcon-7B).
    mlp_src = m.pre_mlp_norm ? layer_norm("post_attention_layernorm", input, layer_in) : attn_src;
    mlp_in = m.pre_mlp_norm ? p + ".post_attention_layernorm.out" : attn_in;
  } else if (m.pre_mlp_norm) {
    const std::string name = m.post_attention_norm ? "pre_feedforward_layernorm" : "post_attention_layernorm";
    mlp_src = layer_norm(name, attn_last, mlp_in);
    mlp_in = p + "." + name + ".out";
  }
  ModuleId mlp = build_mlp_block(layer, i, mlp_src, mlp_in);
  if (m.post_mlp_norm) layer_norm("post_feedforward_layernorm", mlp, p + ".mlp.out");
  if (scaled) feeds(mlp, add(layer, layer_scale(p + ".ls2", i, m.hidden_size, p + ".mlp.out")));
  return layer;
}

void ModuleGraph::build() {
  const ModelSpec& m = spec_;
  ModuleNode root;
  root.name = "model";
  root.short_name = "model";
  root.kind = ModuleKind::Model;
  root_ = boost::add_vertex(root, g_);
  // A vision tower first (vision_tower.cpp): its blocks open the layer stack, its projector's image tokens join the
  // language model's sequence.
  const ModuleId image_tokens = m.vision ? build_vision() : root_;
  cur_ = &spec_;
  cur_vision_ = nullptr;
  prefix_ = "layers.";
  layer_offset_ = static_cast<int64_t>(layers_.size());

  ModuleNode emb;
  emb.name = "embed_tokens";
  emb.short_name = "embed_tokens";
  emb.kind = ModuleKind::Embedding;
  emb.params = m.vocab_size * m.hidden_size;
  emb.in_features = m.vocab_size;
  emb.out_features = m.hidden_size;
  // The backward of an embedding lookup needs the token ids (int64).
  emb.saved.push_back(SavedTensor{"input_ids", 1.0, false, TensorClass::Index});
  emb.output_elems_per_token = m.hidden_size;
  ModuleId e = add(root_, emb);
  ModuleId prev = e;
  if (m.position_embedding == PositionEmbedding::Learned) {
    ModuleNode pos;
    pos.name = "embed_positions";
    pos.short_name = "wpe";
    pos.kind = ModuleKind::PositionEmbedding;
    pos.params = m.max_positions * m.hidden_size;
    pos.output_elems_per_token = m.hidden_size;
    ModuleId pe = add(root_, pos);
    feeds(prev, pe);
    prev = pe;
  }
  prev = then_dropout(root_, prev, "embed_dropout", -1);
  ModuleNode stack;
  stack.name = "layers";
  stack.short_name = "layers";
  stack.kind = ModuleKind::LayerStack;
  ModuleId st = add(root_, stack);
  for (int64_t i = 0; i < m.num_layers; ++i) {
    ModuleId layer = build_layer(st, i, prev);
    if (i == 0 && image_tokens != root_) feeds(image_tokens, layer);
    layers_.push_back(layer);
    prev = layer;
  }
  ModuleId fn = add(root_, norm("norm", m, -1, "final.in"));
  feeds(prev, fn);
  ModuleNode head;
  head.name = "lm_head";
  head.short_name = "lm_head";
  head.kind = ModuleKind::Head;
  head.in_features = m.hidden_size;
  head.out_features = m.vocab_size;
  head.params = m.tied_embeddings ? 0 : m.vocab_size * m.hidden_size;
  head.flops_per_token = 2.0 * static_cast<double>(m.hidden_size) * static_cast<double>(m.vocab_size);
  head.saved.push_back(SavedTensor{"norm.out", static_cast<double>(m.hidden_size), false, TensorClass::Compute});
  head.output_elems_per_token = m.vocab_size;
  ModuleId hd = add(root_, head);
  feeds(fn, hd);
  if (m.tied_embeddings) feeds(e, hd);  // the head reads the embedding's weight
  ModuleNode loss;
  loss.name = "loss";
  loss.short_name = "loss";
  loss.kind = ModuleKind::Loss;
  // log_softmax + nll: a handful of FLOPs per logit.
  loss.flops_per_token = kActFlopsPerElem * static_cast<double>(m.vocab_size);
  // cross_entropy keeps the fp32 log-probabilities for backward (PyTorch log_softmax backward uses its output).
  loss.saved.push_back(SavedTensor{"loss.logprobs", static_cast<double>(m.vocab_size), false, TensorClass::LogProbs});
  loss.output_elems_per_token = 0;
  ModuleId ls = add(root_, loss);
  feeds(hd, ls);
}

std::vector<ModuleId> ModuleGraph::consumers(ModuleId id) const {
  std::vector<ModuleId> out;
  for (auto [it, end] = boost::out_edges(id, g_); it != end; ++it)
    if (g_[*it].kind == EdgeKind::Feeds) out.push_back(boost::target(*it, g_));
  return out;
}

int64_t ModuleGraph::params_under(ModuleId id) const { return subtree_params_[id]; }

int64_t ModuleGraph::total_params() const { return params_under(root_); }

bool masked_per_document(const ModuleNode& n, int64_t seq, int64_t doc_len) {
  return doc_len > 0 && doc_len < seq && n.kind == ModuleKind::AttentionCore && n.attention_keys == 0 && n.window == 0;
}

double seq_flops_per_token(const ModuleNode& n, int64_t seq, int64_t doc_len) {
  if (n.flops_per_token_per_seq == 0) return 0;
  // A vision block's bidirectional attention: every query attends all keys of its image or window.
  if (n.attention_keys > 0) return n.flops_per_token_per_seq * static_cast<double>(n.attention_keys);
  if (masked_per_document(n, seq, doc_len))
    return n.flops_per_token_per_seq * causal_keys_per_query(seq, doc_len, true);
  return n.flops_per_token_per_seq * causal_keys_per_query(seq, n.window, n.chunked);
}

double ModuleGraph::token_ratio(ModuleId id, int64_t seq) const {
  FSDP_ASSERT(seq > 0, "token_ratio needs a sequence length");
  const int64_t t = g_[id].tokens_per_sample;
  return t > 0 ? static_cast<double>(t) / static_cast<double>(seq) : 1.0;
}

ModuleGraph::VisionPart ModuleGraph::vision_part(ModuleId id) const {
  if (in_vision_tower(g_[id])) return VisionPart::Tower;
  if (g_[id].name.rfind("multi_modal_projector", 0) == 0) return VisionPart::Projector;
  return VisionPart::None;
}

double ModuleGraph::forward_flops_per_token(ModuleId id, int64_t seq) const {
  double total = 0;
  for (ModuleId leaf : leaves_under(id)) {
    const ModuleNode& n = g_[leaf];
    total += n.flops_per_token + seq_flops_per_token(n, seq);
  }
  return total;
}

namespace {

// A saved tensor's bytes per token, or nothing where the run does not keep it (eager-only or fused-only tensors
// under the other attention implementation).
std::optional<double> kept_bytes(const SavedTensor& t, const ActivationQuery& q) {
  const bool eager = q.attention == AttentionImpl::Eager;
  if (t.eager_only && !eager) return std::nullopt;
  if (t.fused_only && eager) return std::nullopt;
  const double elems = t.elems_per_token * (t.per_seq ? static_cast<double>(q.seq_len) : 1.0);
  return elems * tensor_bytes(t.cls, q);
}

// A linear's share of the tokens (routed experts see k/E of them): its FLOPs over a dense GEMM's.
double linear_token_fraction(const ModuleNode& n) {
  return n.flops_per_token / (2.0 * static_cast<double>(n.in_features) * static_cast<double>(n.out_features));
}

}  // namespace

// The tensors the modules in `ids` keep for backward without per-op caching, by id (each once), with their bytes
// per token: the leaves' (Selective leaves out the attention core's internals), then those owned by containers.
std::vector<std::pair<std::string, double>> ModuleGraph::saved_tensors(const std::vector<ModuleId>& ids,
                                                                       const ActivationQuery& q, ActCkpt ckpt) const {
  FSDP_ASSERT(q.seq_len > 0, "saved_bytes_per_token needs a sequence length");
  std::unordered_set<std::string> seen;
  // The inputs of frozen GEMMs without an adapter, not kept for them (below): a container's copy of the same tensor
  // (a routed expert's gathered tokens) is not kept either unless an adapted reader keeps it.
  std::unordered_set<std::string> unread_inputs;
  std::vector<std::pair<std::string, double>> out;
  auto adapted = [&q](const ModuleNode& n) {
    if (q.vision_unadapted && in_vision_tower(n)) return false;
    return n.lora_target && std::find(q.adapted.begin(), q.adapted.end(), n.short_name) != q.adapted.end();
  };
  // Under a frozen base, whether a module's output carries a gradient: an adapter's does, and so does whatever reads
  // one. A module that trains nothing and reads nothing that carries one keeps nothing for backward (autograd records
  // no node for it). The first layer's input carries none (ModuleNode::reads_embedding: the frozen embedding's
  // output); a producer outside the module's decoder layer (the layer before) is taken to carry one.
  std::unordered_map<ModuleId, bool> carries;
  auto parent_of = [this](ModuleId v) -> std::optional<ModuleId> {
    for (auto [it, end] = boost::in_edges(v, g_); it != end; ++it)
      if (g_[*it].kind == EdgeKind::Contains) return boost::source(*it, g_);
    return std::nullopt;
  };
  auto layer_of = [&](ModuleId v) {
    for (std::optional<ModuleId> cur = v; cur; cur = parent_of(*cur))
      if (g_[*cur].kind == ModuleKind::DecoderLayer) return *cur;
    return root_;
  };
  std::function<bool(ModuleId)> output_carries;
  // Whether a module reads something that carries a gradient: its producers' outputs (Feeds edges), or, where it has
  // none of its own, its container's (an MLP's projections read the MLP's input).
  auto input_carries = [&](ModuleId v) {
    if (g_[v].reads_embedding) return false;
    const ModuleId layer = layer_of(v);
    for (std::optional<ModuleId> cur = v; cur; cur = parent_of(*cur)) {
      bool fed = false, any = false;
      for (auto [it, end] = boost::in_edges(*cur, g_); it != end; ++it) {
        if (g_[*it].kind != EdgeKind::Feeds) continue;
        fed = true;
        const ModuleId src = boost::source(*it, g_);
        any = any || layer_of(src) != layer || output_carries(src);
      }
      if (fed) return any;
      if (*cur == layer) break;
    }
    return true;
  };
  output_carries = [&](ModuleId v) {
    if (auto it = carries.find(v); it != carries.end()) return it->second;
    bool c = false;
    if (children(v).empty()) {
      c = adapted(g_[v]) || input_carries(v);
    } else {
      for (ModuleId leaf : leaves_under(v)) c = c || output_carries(leaf);
    }
    carries[v] = c;
    return c;
  };
  for (ModuleId id : ids) {
    for (ModuleId leaf : leaves_under(id)) {
      const ModuleNode& n = g_[leaf];
      // Outside the gradient's path (LoRA: before the first adapter of the first layer): nothing kept.
      if (q.frozen_base && !output_carries(leaf)) {
        for (const SavedTensor& t : n.saved) unread_inputs.insert(t.id);
        continue;
      }
      // A frozen GEMM without an adapter (LoRA, ActivationQuery::frozen_base: a base linear it does not target, an MoE
      // router, Qwen2-MoE's shared-expert gate, a vision tower's linears, the LM head) keeps no input: its only
      // gradient is its input's, which reads the weight (derivatives.yaml mm). The router's probabilities and choice
      // and the shared gate's sigmoid and operand stay (saved[1...]): the block input's gradient flows through them.
      const bool gemm = n.kind == ModuleKind::Linear || n.kind == ModuleKind::Router || n.kind == ModuleKind::Head;
      size_t first_saved = 0;
      if (q.frozen_base && gemm && !adapted(n) && !n.saved.empty()) {
        unread_inputs.insert(n.saved.front().id);
        first_saved = 1;
      }
      // An adapted one keeps its input for A's gradient and the adapter's rank-wide intermediate beside it.
      if (q.frozen_base && gemm && adapted(n)) {
        if (q.lora_rank > 0 && seen.insert(n.name + ".lora_a.out").second)
          out.emplace_back(
              n.name + ".lora_a.out",
              static_cast<double>(q.lora_rank) * tensor_bytes(TensorClass::Compute, q) *
                  (n.saved.empty() ? 1.0 : n.saved.front().elems_per_token / static_cast<double>(n.in_features)));
      }
      // A frozen norm weight (LoRA trains the adapters only): its multiply, weight x the normalised tensor, keeps that
      // tensor for the weight's gradient only (derivatives.yaml mul.Tensor: the other operand's gradient reads self;
      // the generated node saves it only when that gradient is needed).
      const bool frozen_norm_weight = q.frozen_base && n.kind == ModuleKind::Norm;
      for (size_t i = first_saved; i < n.saved.size(); ++i) {
        const SavedTensor& t = n.saved[i];
        if (ckpt == ActCkpt::Selective && t.attention_internal) continue;
        if (frozen_norm_weight && t.cls == TensorClass::NormInternal) continue;
        const std::optional<double> b = kept_bytes(t, q);
        if (!b || !seen.insert(t.id).second) continue;
        out.emplace_back(t.id, *b);
      }
    }
    // Tensors owned by containers (e.g. an expert's gathered input).
    std::vector<ModuleId> stack{id};
    while (!stack.empty()) {
      ModuleId cur = stack.back();
      stack.pop_back();
      auto ch = children(cur);
      if (!ch.empty()) {
        for (const SavedTensor& t : g_[cur].saved)
          if (!(q.frozen_base && !output_carries(cur)) && !(unread_inputs.count(t.id) && !seen.count(t.id)) &&
              seen.insert(t.id).second)
            out.emplace_back(t.id, t.elems_per_token * tensor_bytes(t.cls, q));
        for (ModuleId c : ch) stack.push_back(c);
      }
    }
  }
  return out;
}

double ModuleGraph::saved_bytes_per_token(const std::vector<ModuleId>& ids, const ActivationQuery& q,
                                          ActCkpt ckpt) const {
  double total = 0;
  if (ckpt == ActCkpt::SelectiveOp) {
    FSDP_ASSERT(q.seq_len > 0, "saved_bytes_per_token needs a sequence length");
    std::unordered_set<std::string> seen;
    for (ModuleId id : ids) {
      const OpSacLayer sac = op_sac(id);
      for (const SavedTensor& t : sac.cached) {
        const bool unread = std::find(sac.unread.begin(), sac.unread.end(), t.id) != sac.unread.end();
        if (unread && !q.sac_keeps_unread_outputs) continue;
        const std::optional<double> b = kept_bytes(t, q);
        if (b && seen.insert(t.id).second) total += *b;
      }
    }
    return total;
  }
  for (const auto& [id, bytes] : saved_tensors(ids, q, ckpt)) total += bytes;
  return total;
}

bool ModuleGraph::keeps(ModuleId id, const ActivationQuery& q, const std::string& tensor) const {
  const auto kept = saved_tensors(std::vector<ModuleId>{id}, q, ActCkpt::None);
  return std::any_of(kept.begin(), kept.end(), [&](const auto& t) { return t.first == tensor; });
}

double ModuleGraph::saved_bytes_per_token(ModuleId id, const ActivationQuery& q, ActCkpt ckpt) const {
  return saved_bytes_per_token(std::vector<ModuleId>{id}, q, ckpt);
}

double ModuleGraph::recomputed_bytes_per_token(ModuleId layer, const ActivationQuery& q, ActCkpt ckpt) const {
  const std::vector<ModuleId> ids{layer};
  switch (ckpt) {
    case ActCkpt::None:
      return 0;
    case ActCkpt::Full:
      return saved_bytes_per_token(ids, q, ActCkpt::None);
    case ActCkpt::Selective:
      return std::max(0.0, saved_bytes_per_token(ids, q, ActCkpt::None) - saved_bytes_per_token(ids, q, ckpt));
    case ActCkpt::SelectiveOp: {
      // Everything the layer saves without checkpointing, but what the policy cached is not rebuilt: a tensor the
      // backward needs that is a cached output (same id) comes from the cache.
      std::unordered_map<std::string, double> cached;
      for (const SavedTensor& t : op_sac(layer).cached)
        if (const std::optional<double> b = kept_bytes(t, q)) cached[t.id] = std::max(cached[t.id], *b);
      double total = 0;
      for (const auto& [id, bytes] : saved_tensors(ids, q, ActCkpt::None)) {
        auto it = cached.find(id);
        total += bytes - (it == cached.end() ? 0.0 : std::min(bytes, it->second));
      }
      return total;
    }
  }
  return 0;
}

// torchtitan's per-op selective activation checkpointing (activation_checkpoint.mode = "selective",
// selective_ac_option = "op"; torchtitan/distributed/activation_checkpoint.py _apply_op_sac and the save list
// _op_sac_save_list of torchtitan/models/llama3/parallelize.py, pytorch/torchtitan@1f029641). Each decoder layer is
// wrapped in a non-reentrant checkpoint whose policy, called for every aten op of the layer's forward, returns
// MUST_SAVE for an op in the save list (aten.mm, the SDPA flash / efficient / cudnn / math kernels, flex attention,
// reduce_scatter, max) except every second aten.mm, counted per layer from 1 ("meta[mm_count_key] % 2 == 0" ->
// PREFER_RECOMPUTE), and PREFER_RECOMPUTE for every other op: norms, rotary, activations, the gating multiply, the
// residual adds. torch.utils.checkpoint keeps the MUST_SAVE outputs from forward to backward and replays them when
// backward recomputes the layer (torch/utils/checkpoint.py _CachingTorchDispatchMode / _CachedTorchDispatchMode),
// and keeps the layer's input to recompute from. Read by op order from the layer's nodes:
//  - a linear without a bias is one aten.mm (nn.Linear -> aten.linear -> mm on the flattened input); a biased one
//    runs as aten.addmm (aten/src/ATen/native/Linear.cpp linear: the fused-bias path _flatten_nd_linear), which is
//    neither in the list nor counted: recomputed;
//  - the router (moe.router.gate) is force-recomputed and not counted (per_op_sac_force_recompute_mm_shapes_by_fqns,
//    default ["moe.router.gate"], torchtitan/config/configs.py); routed experts run torch._grouped_mm, not in the
//    list: recomputed;
//  - the attention core is the SDPA kernel: its output and its log-sum-exp (fused kernels; the math kernel returns
//    the probabilities) are cached.
// Llama (torchtitan/models/common/attention.py: wq(x), wk(x), wv(x), sdpa, wo; feed_forward.py w2(silu(w1(x)) *
// w3(x)), w1 before w3): the mm's count wq 1, wk 2, wv 3, wo 4, w1 5, w3 6, w2 7, so the outputs of wq, wv, w1
// (gate_proj) and w2 (down_proj) and the attention's are cached; wk, wo and w3 (up_proj) are recomputed.
OpSacLayer ModuleGraph::op_sac(ModuleId layer) const {
  const ModuleNode& l = g_[layer];
  FSDP_ASSERT(l.kind == ModuleKind::DecoderLayer, "the per-op checkpointing policy applies to a decoder layer");
  OpSacLayer out;
  out.cached.push_back(
      SavedTensor{l.name + ".in", static_cast<double>(l.output_elems_per_token), false, TensorClass::Residual});
  int64_t mm_count = 0;
  for (ModuleId leaf : leaves_under(layer)) {
    const ModuleNode& n = g_[leaf];
    if (n.kind == ModuleKind::AttentionCore) {
      out.cached_ops.push_back(leaf);
      out.cached.push_back(
          SavedTensor{n.output_id, static_cast<double>(n.output_elems_per_token), false, TensorClass::Compute});
      for (const SavedTensor& t : n.saved)
        if (t.kernel_output) out.cached.push_back(t);
      continue;
    }
    if (n.kind == ModuleKind::Router) {
      out.recomputed_mms.push_back(leaf);
      continue;
    }
    if (n.kind != ModuleKind::Linear) continue;
    const double fraction = linear_token_fraction(n);
    const bool biased = n.params > n.in_features * n.out_features;
    constexpr double kWholeBatch = 1.0;
    const bool aten_mm = !biased && fraction >= kWholeBatch;
    if (aten_mm) ++mm_count;
    if (!aten_mm || mm_count % 2 == 0) {
      out.recomputed_mms.push_back(leaf);
      continue;
    }
    out.cached_ops.push_back(leaf);
    out.cached.push_back(
        SavedTensor{n.output_id, static_cast<double>(n.out_features) * fraction, false, TensorClass::Compute});
    if (consumers(leaf).empty() && !saved_in(layer, n.output_id)) out.unread.push_back(n.output_id);
  }
  return out;
}

bool ModuleGraph::saved_in(ModuleId layer, const std::string& id) const {
  for (ModuleId leaf : leaves_under(layer))
    for (const SavedTensor& t : g_[leaf].saved)
      if (t.id == id) return true;
  return false;
}

}  // namespace fsdp
