// The module graph: a ModelSpec expanded into modules (Boost.Graph).
//   - Contains edges form the module tree: model -> embedding, layers.i ->
//     self_attn / mlp / norms -> linear layers, final norm, lm_head, loss.
//   - Feeds edges are the data flow between leaf modules (who consumes whose output).
// Leaf modules know their parameter count, forward FLOPs per token and the
// tensors they keep for backward (per token, by dtype class), from which
// saved-activation bytes are derived for a dtype and attention implementation.
// Wrap units (wrap_units.hpp) are sets of nodes of this graph.
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

enum class ModuleKind {
  Model,
  Embedding,          // token embedding
  PositionEmbedding,  // learned positions (GPT-2)
  LayerStack,         // the ModuleList of decoder layers
  DecoderLayer,
  Attention,  // self_attn container
  Mlp,        // mlp container (dense)
  Moe,        // MoE block container
  Norm,
  Linear,
  Rotary,         // rotary position embedding applied to q and k
  AttentionCore,  // softmax(QK^T)V (flash / sdpa / eager)
  Activation,     // SiLU / GELU (and the gating multiply for gated MLPs)
  Dropout,
  Router,
  Head,    // lm_head (a Linear whose output is the logits)
  Loss,    // causal-LM cross entropy
  Vision,  // a vision tower's part outside its block stack: the patch embeddings, the projector (vision_tower.cpp)
  Scale,   // an elementwise multiply by a learned hidden-wide vector (InternViT's layer scale ls1, ls2)
};

const char* to_string(ModuleKind);

// What dtype a tensor has at run time.
enum class TensorClass {
  Compute,       // the compute dtype (param_dtype)
  Residual,      // the residual stream: compute dtype, or fp32 under autocast over fp32 params (DDP)
  Fp32,          // always fp32 (norm statistics, attention log-sum-exp, softmax stats)
  Byte,          // dropout masks (torch.bool, 1 byte)
  Index,         // token ids (int64)
  NormInput,     // a norm's saved input: residual dtype, or fp32 when the runtime's norm upcasts first
  NormInternal,  // the normalised pre-weight tensor some runtimes keep (compute dtype), else nothing
  NormSquared,   // an RMSNorm's x^2, kept where the runtime's mean keeps its input (norm dtype), else nothing
  LogProbs,      // the loss's log-probabilities: fp32 when logits are upcast, else the compute dtype
  SoftmaxOut,    // eager attention's softmax output: fp32 when the runtime's softmax runs in fp32
  SoftmaxCast,   // its cast back to the compute dtype (only when that differs from fp32)
  PointwiseOut,  // a pointwise op's output that only pointwise ops consume (a gated MLP's SiLU output): the compute
                 // dtype where the runtime's autograd saves it, else nothing (recomputed in the backward)
  QkvCopyKv,     // k's and v's thirds of a multi-head layer's qkv copy, kept by the saved q that views it: the
                 // compute dtype where the runtime hands q over so (ActivationQuery::mha_qkv_copy_saved), else nothing
  FusedQkvQk,    // q's and k's parts of a fused qkv projection's output, kept by the saved value that views it: the
                 // compute dtype where the runtime runs such modules (ActivationQuery::value_view_keeps_fused_qkv)
  KvRepeated,    // what repeating k and v to the query heads adds to the fused kernel's saved k and v, in a layer
                 // attending every earlier token: the compute dtype where the run repeats them
                 // (ActivationQuery::kv_repeated) and its autograd keeps the copies (pointwise_outputs_saved: eager;
                 // the compiled partitioner recomputes them from the kv-wide projections), else nothing
  KvRepeatedWindowed,  // the same in a sliding-window layer (ActivationQuery::kv_repeated_windowed)
};

// A tensor kept for backward. Sizes are per token; `per_seq` tensors scale
// with the sequence length once more (eager attention scores: heads x seq per token).
struct SavedTensor {
  std::string id;              // unique within the model: the same tensor saved by two ops counts once
  double elems_per_token = 0;  // fractional for MoE experts (each sees k/E of the tokens on average)
  bool per_seq = false;
  TensorClass cls = TensorClass::Compute;
  bool attention_internal = false;  // produced inside the attention core (dropped by selective checkpointing)
  bool eager_only = false;          // only materialised by eager (non-fused) attention
  bool fused_only = false;          // only kept by fused (flash / sdpa) attention
  bool kernel_output = false;       // an output of the node's own kernel beside its result (the attention kernel's
                                    // log-sum-exp; eager attention's probabilities), cached with the result by a
                                    // per-op checkpointing policy (ModuleGraph::op_sac)
};

struct ModuleNode {
  std::string name;  // dotted path, e.g. "layers.3.self_attn.q_proj"
  ModuleKind kind = ModuleKind::Model;
  int64_t layer = -1;                         // decoder layer index, -1 outside the stack
  int64_t params = 0;                         // parameters owned directly by this module (not its children)
  double flops_per_token = 0;                 // forward FLOPs per token, sequence-independent part
  double flops_per_token_per_seq = 0;         // forward FLOPs per token that scale with the sequence (attention)
  int64_t in_features = 0, out_features = 0;  // Linear / Head shapes (for GEMM cost)
  bool lora_target = false;                   // a Linear that LoRA may adapt
  // A norm that reads the first layer's input, the embedding's output (or a vision stack's patch embeddings): under a
  // frozen base (ActivationQuery::frozen_base) no gradient flows into it.
  bool reads_embedding = false;
  std::string short_name;  // q_proj, k_proj, ... (matches Hugging Face names)
  std::vector<SavedTensor> saved;
  int64_t output_elems_per_token = 0;  // the module's output (for the live working set); a DecoderLayer's: the
                                       // residual stream's width (its hidden size)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // AttentionCore: the layer's own attention shape
  int64_t window = 0;     // AttentionCore: keys a query attends at most (a sliding layer's window); 0: all earlier keys
  bool chunked = false;   // AttentionCore: the window is fixed chunks of `window` tokens (ModelSpec::chunked_attention)
  std::string output_id;  // Linear / Router / AttentionCore: the id its output has where a consumer saves it
  // A vision module (a vision block, the tower's embeddings or its projector): it runs on this many tokens of a
  // sample, not on the language model's sequence, and its per-token fields are per one of those tokens
  // (ModuleGraph::token_ratio). 0: the language model's sequence.
  int64_t tokens_per_sample = 0;
  // AttentionCore of a vision block: bidirectional attention over this many keys per query (its image or window),
  // whatever the sequence; 0: causal over the sequence (seq_flops_per_token).
  int64_t attention_keys = 0;
  // false: parameters the model holds that no step runs (a vision tower's blocks past its feature layer).
  bool runs = true;
};

// Forward FLOPs per token of a node's sequence-dependent part (attention's score and value GEMMs) at sequence
// length seq: causal, each query attends the earlier keys, at most `window` of them (compute_cost.hpp). With packed
// documents of doc_len tokens (Strategy::doc_len; 0: none) a global layer's query attends the earlier keys of its
// document: the chunked count over chunks of doc_len (causal_keys_per_query).
double seq_flops_per_token(const ModuleNode& n, int64_t seq, int64_t doc_len = 0);
// Whether a node's attention is the causal self-attention that packed documents mask per document: a language
// layer's, global (no local window of its own), with documents shorter than the sequence.
bool masked_per_document(const ModuleNode& n, int64_t seq, int64_t doc_len);

enum class EdgeKind { Contains, Feeds };
struct ModuleEdge {
  EdgeKind kind = EdgeKind::Contains;
};

using ModuleGraphBase = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, ModuleNode, ModuleEdge>;
using ModuleId = ModuleGraphBase::vertex_descriptor;

// torchtitan's per-op selective activation checkpointing (ActCkpt::SelectiveOp) of one decoder layer, derived from
// the layer's nodes in forward order (ModuleGraph::op_sac).
struct OpSacLayer {
  std::vector<ModuleId> cached_ops;      // leaves whose outputs are cached from forward to backward
  std::vector<ModuleId> recomputed_mms;  // matmul leaves (linears, router) run again in backward
  std::vector<SavedTensor> cached;       // what the layer keeps: its input (the checkpoint's) and the cached outputs
  // Of `cached`, the outputs its backward never reads: a linear whose output only enters the residual sum (no
  // module it feeds, none saves it: the attention's output projection, the MLP's down projection without a
  // post-norm). Eager checkpointing keeps them all the same; a compiled layer does not
  // (ActivationQuery::sac_keeps_unread_outputs).
  std::vector<std::string> unread;
};

// How saved bytes are counted for a run.
struct ActivationQuery {
  DType compute = DType::Bf16;
  AttentionImpl attention = AttentionImpl::Flash;
  int64_t seq_len = 0;
  bool autocast_fp32_residual = false;   // DDP-style autocast over fp32 params: residual stream in fp32
  bool norm_fp32_internal = false;       // runtime's norm upcasts to fp32 and keeps the fp32 input (HF RMSNorm)
  bool logits_upcast_fp32 = false;       // runtime's loss upcasts logits to fp32
  bool softmax_fp32 = false;             // runtime's eager softmax runs in fp32 and is cast back
  bool norm_mean_keeps_input = false;    // runtime's mean(x^2) in RMSNorm keeps x^2 for backward
  bool pointwise_outputs_saved = true;   // runtime's autograd keeps PointwiseOut tensors (eager ops' backward formulas)
  bool sac_keeps_unread_outputs = true;  // per-op checkpointing keeps the cached outputs no backward reads (eager)
  bool mha_qkv_copy_saved = false;       // runtime's saved q views a multi-head layer's whole qkv copy (QkvCopyKv)
  bool value_view_keeps_fused_qkv = false;  // runtime's saved value views a fused qkv output (FusedQkvQk)
  // The model's code repeats k and v to the query heads before the fused kernel, in the layers attending every
  // earlier token and in the sliding-window ones (whose mask the sdpa path may pass): program/step_program.cpp
  // kv_repeated; TensorClass::KvRepeated and KvRepeatedWindowed.
  bool kv_repeated = false;
  bool kv_repeated_windowed = false;
  // LoRA (Strategy::method lora / qlora): the base linears are frozen. Autograd saves a linear's input for its weight
  // gradient only where the weight requires one (derivatives.yaml mm: mat2's gradient reads self; the generated
  // backward nodes save a variable only when an output that reads it needs a gradient, should_compute_output): a
  // frozen linear without an adapter saves nothing of its own, and a module that trains nothing and reads nothing a
  // gradient flows through (the first layer up to its first adapter) nothing at all. An adapted one (`adapted`: the
  // target modules' short names) keeps its input for the adapter A's gradient and A's output, `lora_rank` wide, for
  // B's (Hu et al. 2021, arXiv 2106.09685: h = W0 x + B A x).
  bool frozen_base = false;
  std::vector<std::string> adapted;
  int64_t lora_rank = 0;
  // The vision tower's linears get no adapter whatever their names (Strategy::train_vision none: PEFT's targets over
  // the language model alone, ms-swift's all-linear with freeze_vit): the tower trains nothing and saves nothing.
  bool vision_unadapted = false;
};

// Whether a module belongs to a vision-language model's vision tower (its embeddings, blocks or held blocks:
// vision_tower.*, vision_tower.cpp), by its dotted name.
inline bool in_vision_tower(const ModuleNode& n) { return n.name.rfind("vision_tower.", 0) == 0; }

class ModuleGraph {
 public:
  explicit ModuleGraph(ModelSpec spec);
  const ModelSpec& spec() const { return spec_; }
  const ModuleGraphBase& graph() const { return g_; }
  const ModuleNode& node(ModuleId id) const { return g_[id]; }
  ModuleId root() const { return root_; }
  // The layer stack in order: a vision tower's blocks (VisionSpec::run_layers), then the decoder layers. A layer
  // node's `layer` is its index here.
  const std::vector<ModuleId>& layers() const { return layers_; }
  // The index in layers() of the first decoder layer: the vision tower's blocks that run before it (0 without one).
  int64_t first_decoder_layer() const { return static_cast<int64_t>(layers_.size()) - spec_.num_layers; }
  // Per decoder layer: the index of the first layer of the same structure (its class).
  const std::vector<int64_t>& layer_classes() const { return layer_class_; }
  // Contains edges, in build order, and the leaf modules under a module in execution order: derived once when the
  // graph is built (the planner asks for them per unit of every candidate it simulates).
  const std::vector<ModuleId>& children(ModuleId id) const { return children_[id]; }
  std::vector<ModuleId> consumers(ModuleId id) const;  // Feeds edges out
  const std::vector<ModuleId>& leaves_under(ModuleId id) const { return leaves_[id]; }

  // The tokens module `id` runs on per token of the language model's sequence `seq`: a vision module's
  // tokens_per_sample / seq, else 1. Per-token fields times this are per sequence token.
  double token_ratio(ModuleId id, int64_t seq) const;
  // Which part of a vision-language model a module of the root's (or one under it) belongs to: the vision tower (its
  // embeddings, blocks and held blocks: vision_tower.*, vision_tower.cpp), the projector (multi_modal_projector.*),
  // or the language model (None).
  enum class VisionPart { None, Tower, Projector };
  VisionPart vision_part(ModuleId id) const;
  // Whether that part is frozen when a run trains `t` of the vision side (Strategy::train_vision).
  static bool frozen(VisionPart part, VisionTraining t) {
    return (part == VisionPart::Tower && t != VisionTraining::All) ||
           (part == VisionPart::Projector && t == VisionTraining::None);
  }

  int64_t total_params() const;
  int64_t params_under(ModuleId id) const;
  // Forward FLOPs per token of the modules under `id` at sequence length seq (causal attention halves the
  // score/value FLOPs: only the lower triangle is computed, FlashAttention-2 paper sec. 3.1.1; a sliding layer
  // computes only its window's band: seq_flops_per_token).
  double forward_flops_per_token(ModuleId id, int64_t seq) const;
  // Bytes saved for backward per token by the modules in `ids` (deduplicated by tensor id).
  double saved_bytes_per_token(const std::vector<ModuleId>& ids, const ActivationQuery& q, ActCkpt ckpt) const;
  // ckpt is the mode of the modules' layers: Selective drops the attention core's internals; SelectiveOp (decoder
  // layers only) counts what op_sac caches; Full is counted by the caller (the layer's input, layer_costs.cpp).
  double saved_bytes_per_token(ModuleId id, const ActivationQuery& q, ActCkpt ckpt) const;
  // What backward rematerialises per token when decoder layer `layer` runs under `ckpt`: nothing without
  // checkpointing; Full: everything it saves without; Selective: the attention core's internals; SelectiveOp: what
  // it saves without, less what op_sac cached.
  double recomputed_bytes_per_token(ModuleId layer, const ActivationQuery& q, ActCkpt ckpt) const;
  OpSacLayer op_sac(ModuleId layer) const;
  // Whether a module under `layer` saves the tensor `id` for its backward.
  bool saved_in(ModuleId layer, const std::string& id) const;
  // Whether the modules under `id` keep the tensor `tensor` for backward in the run `q` describes, without
  // checkpointing (a LoRA run's frozen GEMMs keep no input: saved_tensors).
  bool keeps(ModuleId id, const ActivationQuery& q, const std::string& tensor) const;

 private:
  std::vector<std::pair<std::string, double>> saved_tensors(const std::vector<ModuleId>& ids, const ActivationQuery& q,
                                                            ActCkpt ckpt) const;
  ModuleId add(ModuleId parent, ModuleNode n);
  void feeds(ModuleId from, ModuleId to);
  // With the model's dropout: a hidden-size Dropout node `name` under `parent`, fed by `after`, returned in its
  // place; without: `after`.
  ModuleId then_dropout(ModuleId parent, ModuleId after, const std::string& name, int64_t layer);
  void build();
  // The vision tower (vision_tower.cpp): embeddings, its blocks into layers_, the held blocks, the projector;
  // returns the projector's last node.
  ModuleId build_vision();
  ModuleId build_layer(ModuleId stack, int64_t i, ModuleId input);
  // A layer's attention block fed by `src` (whose output, saved by q/k/v, is `in_id`); returns its last node.
  ModuleId build_attention(ModuleId layer, int64_t i, ModuleId src, const std::string& in_id);
  // Multi-head latent attention (model_spec.hpp MlaSpec) under the attention container `attn`; returns o_proj.
  ModuleId build_mla(ModuleId attn, int64_t i, ModuleId src, const std::string& in_id);
  // A layer's MLP (dense or MoE) fed by `src` whose output is `in_id`; returns the container.
  ModuleId build_mlp_block(ModuleId layer, int64_t i, ModuleId src, const std::string& in_id);
  // One MLP (a dense MLP or an expert) under `parent`, reading `in_id`; returns its last node.
  ModuleId build_mlp(ModuleId parent, int64_t i, const std::string& mp, const std::string& in_id, int64_t ffn,
                     double token_fraction);

  ModelSpec spec_;
  // The stack the layer builders are building: its layers' spec (the model, or the vision blocks' own), the
  // layers' name prefix, the index in layers_ of its first layer, and the vision tower when it is one.
  ModelSpec vision_layers_spec_;
  const ModelSpec* cur_ = &spec_;
  const VisionSpec* cur_vision_ = nullptr;
  std::string prefix_ = "layers.";
  int64_t layer_offset_ = 0;
  std::vector<int64_t> subtree_params_;          // cached params_under per vertex
  std::vector<std::vector<ModuleId>> children_;  // per vertex: its Contains children in build order
  std::vector<std::vector<ModuleId>> leaves_;    // per vertex: the leaves under it in execution order
  ModuleGraphBase g_;
  ModuleId root_{};
  std::vector<ModuleId> layers_;
  std::vector<int64_t> layer_class_;
};

ModuleGraph build_module_graph(const ModelSpec& spec);

double tensor_bytes(TensorClass cls, const ActivationQuery& q);

}  // namespace fsdp
