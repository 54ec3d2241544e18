// Tensor parallelism (+ sequence parallelism) as a transform of the step: what one rank of a tp group holds and
// computes of each decoder layer, of the embedding and of the head, and the collectives that TP adds to a unit's
// forward and backward. "TP all-gather time" is here: tp_forward_collectives / tp_backward_collectives give the
// collectives, the step program emits them on Stream::TensorParallel (GroupKind::Tensor), op_cost.cpp prices them.
//
// Sources:
//  - Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053 sec. 3): the MLP's first linear(s) column-parallel, its
//    second row-parallel; attention heads split over the tp ranks (q, k, v column-parallel, the output projection
//    row-parallel); one all-reduce after each row-parallel linear in forward (g) and one before each column-parallel
//    linear's input gradient in backward (f): 2 + 2 per layer. Vocabulary-parallel embedding (an all-reduce of its
//    output) and vocabulary-parallel cross-entropy (all-reduces of the logits' max, the target logit and the sum of
//    exponentials over the tp group, s x b fp32 values each: megatron/core/tensor_parallel/cross_entropy.py).
//  - Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198 sec. 4.2.2, Fig. 5): each all-reduce becomes a
//    reduce-scatter (g) and an all-gather (g-bar), the norms and dropout run on s/tp tokens; per layer in forward 2
//    all-gathers + 2 reduce-scatters of the s x b x h activation, in backward their conjugates (2 + 2). The
//    activation memory per layer (their Table 2, eq. 2-4): sbh(34 + 5as/h) without TP; sbh(10 + 24/t + 5as/(ht))
//    with TP alone (the 10 sbh of the norms' and dropouts' inputs replicated); sbh/t (34 + 5as/h) with TP + SP.
//    Here the replicated part is what the layer's Norm modules save (the module graph's own tensors), the rest is
//    split 1/tp.
//  - torchtitan (torchtitan/models/llama3/infra/parallelize.py apply_tp) and PyTorch DTensor
//    (torch/distributed/tensor/parallel/style.py ColwiseParallel, RowwiseParallel, SequenceParallel,
//    PrepareModuleInput): the same plan; the norms replicated (their gradients summed over the tp group: here one
//    all-reduce per step, TpNormGradAllReduce, as Megatron's allreduce_layernorm_grads does).
//  - kv heads fewer than tp: each rank holds one kv head, replicated over tp / kv ranks (Megatron-LM
//    num_query_groups < tensor_model_parallel_size; attention.py num_query_groups_per_partition); its k and v
//    projections are then computed on every rank that holds it.
//  - Async TP (torchtitan parallelism.enable_async_tensor_parallel; Wang et al. 2022, "Overlap communication with
//    dependent computation via decomposition", ASPLOS'23): a collective fused with its GEMM is decomposed into tp
//    chunks overlapped with the partial GEMMs; what stays exposed is priced from PyTorch's decomposition (the chunks'
//    GEMMs, the copy-engine pulls, the staging copy, the partials' reduction: timeline/async_tp_overlap.hpp). Which
//    collectives fuse is Inductor's micro-pipeline pass (pytorch/pytorch torch/_inductor/fx_passes/
//    micro_pipeline_tp.py @ 00122fb1c8e5cc0f9871dbaa5343fde4546ff9da): an all-gather whose result is the left
//    operand of matmuls (fuse_all_gather_matmul), and a reduce-scatter whose input is one matmul's output with no
//    other user (fuse_matmul_reduce_scatter). So: the forward's (and a recomputed forward's) all-gathers before the
//    column-parallel linears and reduce-scatters after the row-parallel ones fuse, and in backward the all-gathers
//    of the output gradient (left operand of the input-gradient GEMM) fuse; the backward's reduce-scatter of a
//    block's input gradient fuses only where that gradient is one GEMM's output, i.e. the block reads its input
//    with one column-parallel linear (a fused qkv or gate_up projection, a plain MLP's up projection); with
//    separate q, k, v (gate, up) projections it is a sum of GEMM outputs and stays whole on the critical path. The
//    embedding's reduce-scatter (a lookup's output) and gradient all-gather (read by no GEMM), the loss's and the
//    norms' all-reduces never fuse, and neither do the head's input gather and its input-gradient reduce-scatter:
//    the pass runs on Inductor's graphs, and torchtitan compiles each TransformerBlock alone (parallelize_llama.py
//    apply_compile), leaving the final norm, the output projection and the loss eager (as the compiled runtimes
//    do: configs/runtimes/torchtitan-compile.yaml, pytorch-compile.yaml).
#pragma once

#include <cstdint>
#include <vector>

#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/op_kinds.hpp"
#include "program/wrap_units.hpp"
#include "strategy/mesh.hpp"

namespace fsdp {

// kv heads per rank: kv / tp, or one (replicated) when tp is a multiple of more than kv of them.
int64_t tp_kv_heads_per_rank(const ModelSpec& m, int64_t tp);

// Scales one decoder layer's costs (parameters, GEMM shapes and FLOPs, attention heads, saved activations, working
// memory, memory-bound traffic) to one rank of the tp group; `norm_saved_bytes` is what the layer's norms save of
// one micro-batch without checkpointing (replicated without sequence parallelism); `column_input_bytes` what its
// column-parallel linears save of the norm outputs they read (column_input_bytes_per_token), whole on every rank
// without sequence parallelism, and with it unless `sp_keeps_column_input_shard` (the runtime keeps the s/tp shard
// and gathers it again: RuntimeProfile::sp_saves_column_input_shard).
// `moe_whole_saved_bytes` what its MoE block saves of one micro-batch that stays whole on every rank
// (moe_tp_whole_saved_bytes_per_token; 0 in a dense layer). An MoE block's router and shared gate stay whole
// (tp_replicated_gate), their gradients summed over tp; each expert is split as a dense MLP (executor/model/moe.cpp).
void shard_layer_for_tp(LayerCost& lc, const ModuleGraph& g, ModuleId layer, double norm_saved_bytes,
                        double column_input_bytes, double moe_whole_saved_bytes, bool sp_keeps_column_input_shard,
                        const MeshSpec& mesh);

// What layer `layer`'s Norm modules that read the whole hidden stream save per token (ActCkpt::None): not the
// attention's q/k norms, which run on the rank's heads and save 1/tp of theirs.
double norm_saved_bytes_per_token(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q);

// What the layer's column-parallel linears save per token of the norm outputs they read (ActCkpt::None): the
// tensors sequence parallelism all-gathers (q/k/v share one, gate/up another).
double column_input_bytes_per_token(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q);

// What layer `layer`'s MoE block saves per token without checkpointing that tensor parallelism leaves whole on every
// rank (0 in a dense layer). The block runs on the gathered tokens (executor/model/moe.cpp; torchtitan's MoE under
// TP gathers the block's input, PrepareModuleInputOutput to Replicate): the router's tensors (its input, the norm
// output, is counted with the column-parallel inputs above), the dispatch indices, the gathered copies the routed
// experts read, the experts' outputs and their weights, the shared gate's sigmoid and the shared output are over all
// the tokens at full width; only the experts' own intermediate tensors are split (their widths 1/tp).
double moe_tp_whole_saved_bytes_per_token(const ModuleGraph& g, ModuleId layer, const ActivationQuery& q);

// Parameters one tp rank holds of a decoder layer: its linears split (kv projections per tp_kv_heads_per_rank),
// norms replicated.
double tp_layer_params(const ModuleGraph& g, ModuleId layer, int64_t tp);
// The column-parallel linears of decoder layer `layer`: those reading a norm's output (q, k, v, gate, up; their
// outputs split, their sequence-parallel input gathered); the others (the attention's output projection, the MLP's
// down projection) are row-parallel. And the share of a linear's weight (of its split width) one of `tp` ranks holds
// (kv projections per kv head held).
std::vector<ModuleId> tp_column_linears(const ModuleGraph& g, ModuleId layer);
double tp_linear_share(const ModelSpec& m, const ModuleNode& n, int64_t tp);
// Of a module outside the layers: the embedding and head vocabulary-parallel (1/tp), norms replicated.
double tp_root_module_params(const ModuleGraph& g, ModuleId module, int64_t tp);

// One kind of collective a unit's TP adds in one direction: `calls` collectives of `bytes` each (the full s x b x h
// buffer), and the gathered tensor each all-gather materialises (working memory while it runs).
struct TpCollective {
  CollectiveKind kind = CollectiveKind::None;
  int calls = 0;
  double bytes = 0;
  double gathered_bytes = 0;
  int fused_calls = 0;  // of the calls, those async TP fuses with their GEMM (micro_pipeline_tp.py, above)
};

struct TpUnitShape {
  int64_t layers = 0;             // decoder layers of the unit
  int64_t recomputed_layers = 0;  // of which backward runs the whole forward again (full checkpointing)
  int64_t sac_op_layers = 0;      // of which the per-op policy recomputes (selective-op: the gathers run again)
  bool embedding = false;         // the unit holds the (vocabulary-parallel) embedding
  bool head = false;              // the unit holds the final norm and the (vocabulary-parallel) head
  double activation_bytes = 0;    // one s x b x h activation of the micro-batch in the compute dtype
  // Of the layers' column-parallel blocks (attention, MLP: two a layer), those that read their input with one
  // linear, whose input gradient is then one GEMM's output (async TP fuses its reduce-scatter; above).
  int64_t single_linear_blocks = 0;
  // The column-parallel linears save only their sequence shard and gather it again in backward for the weight
  // gradient (nanotron's tp_recompute_allgather, default True: src/nanotron/config/parallelism_config.py,
  // tensor_parallel/functional.py _ColumnLinearAsyncCommunication.backward @ 67c5ebb6): one more all-gather per
  // column-parallel block, and the head's, in backward.
  bool column_inputs_regathered = false;
  // What one of the decoder layers' all-gathers moves (0: activation_bytes): one byte an element where float8
  // tensorwise linears cast before gathering (torchao float8_tensor_parallel.py: PrepareFloat8ModuleInput and
  // Float8ColwiseParallel cast the sequence shard before the Shard -> Replicate redistribute in forward;
  // Float8RowwiseParallel's NoopFwToFloat8BwDynamic, applied after its output's redistribute, casts the output gradient
  // before that redistribute's backward gathers it). The embedding's and the head's gathers stay in the compute dtype.
  double layer_gather_bytes = 0;
  double layer_gather() const { return layer_gather_bytes > 0 ? layer_gather_bytes : activation_bytes; }
  // Whether async TP fuses the decoder layers' all-gathers with the GEMMs that read them (the header's rule). Not
  // under float8 rowwise linears: Inductor's micro-pipeline pass fuses their matmul -> reduce-scatter (pytorch/pytorch
  // #149247, "Support for float8 rowwise scales when fusing matmul reduce-scatter", 2025-03) but not their all-gather
  // -> scaled_mm ("the all-gather-matmul patterns were NOT being fused properly", pytorch/pytorch#149990, open;
  // torchtitan #866 "Rowwise with AsyncTP runs at roughly same perf as vanilla TP"): those gathers stay whole, as
  // without async TP. torchtitan's June 2025 async TP benchmark measured the same: float8 rowwise 1.04x over vanilla TP
  // against tensorwise's 1.16x (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, Llama 3 70B on 256 H100s).
  bool gathers_fuse = true;
  // The whole logits the head's vocabulary shards are all-gathered into, in the compute dtype, where the runtime
  // replicates the head's output (RuntimeProfile::tp_head_output_replicated; 0: the vocabulary-parallel loss reads
  // the shards): one all-gather in the head's forward; its backward slices the gradient locally.
  double head_output_gather_bytes = 0;
};

// The column-parallel blocks of decoder layer `layer` (its Attention and Mlp children) that read their input with
// exactly one linear (a fused qkv / gate_up projection, a plain MLP's up projection).
int64_t single_linear_blocks(const ModuleGraph& g, ModuleId layer);

// Forward: per layer 2 all-gathers + 2 reduce-scatters with sequence parallelism, else 2 all-reduces; the embedding
// a reduce-scatter (all-reduce), the head's input an all-gather (nothing without SP: it is replicated).
std::vector<TpCollective> tp_forward_collectives(const TpUnitShape& u, const MeshSpec& mesh);
// Backward: the conjugates (all-gather <-> reduce-scatter, all-reduce for f), plus the forward's collectives again
// for the layers whose forward is recomputed, plus the column inputs' gathers again where they are regathered.
std::vector<TpCollective> tp_backward_collectives(const TpUnitShape& u, const MeshSpec& mesh);

// The head's collectives in one direction, which run with the head (the head+loss ops), not with its unit's forward
// and backward: forward, with sequence parallelism, the final norm's output gathered for the head; backward its
// input gradient reduce-scattered (all-reduced without sequence parallelism), after the gathering again of its
// input where the column inputs are regathered. tp_forward_collectives / tp_backward_collectives of a shape with
// `head` set include these; the step program emits them apart (emit_mesh.cpp push_tp_head).
std::vector<TpCollective> tp_head_collectives(const TpUnitShape& u, const MeshSpec& mesh, bool backward);

// The copies a batch-first sequence-parallel layout adds on the compute stream for `collectives` (one direction of a
// unit): DTensor gathers a Shard(1) activation with funcol.all_gather_tensor(gather_dim=1), which all-gathers into a
// rank-major buffer and then runs torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim), and reduce-scatters
// into Shard(1) with reduce_scatter_tensor(scatter_dim=1), which first runs torch.cat(torch.chunk(self, group_size,
// dim=scatter_dim)) (pytorch/pytorch torch/distributed/_functional_collectives.py all_gather_tensor,
// reduce_scatter_tensor; a cat reads and writes the whole tensor). fsdp-run does the same with a transpose copy
// (executor/model/tensor_parallel.cpp all_gather_seq, reduce_scatter_seq; its all-gather also copies the rank's
// shard, 1/tp of it, not counted). Per all-gather or reduce-scatter: read and write the whole s x b x h tensor. Under
// async TP the fused calls are Inductor's fused_all_gather_matmul / fused_matmul_reduce_scatter, which take the
// shards as they are (micro_pipeline_tp.py): no copy. 0 without sequence parallelism (all-reduces copy nothing).
double tp_sequence_layout_copy_bytes(const std::vector<TpCollective>& collectives, const MeshSpec& mesh);

// What async TP's fused all-gathers copy in backward for the weight gradients, under a batch-first
// sequence-parallel layout with more than one sequence a micro-batch (0 otherwise: without async TP, without
// sequence parallelism, or with micro_batch 1, where the two layouts below coincide). Inductor's micro-pipeline pass
// forces the shard's stride order so that A_shard.movedim(gather_dim, 0) is contiguous and replaces every other use
// of the gathered tensor with the fused op's A (pytorch/pytorch torch/_inductor/fx_passes/micro_pipeline_tp.py
// fuse_all_gather_matmul @ 00122fb1c8e5cc0f9871dbaa5343fde4546ff9da; later versions clear return_A only when the
// gathered node has no other user), and fused_all_gather_matmul returns A, and its GEMMs' outputs, as
// `t.view(*leading_dims, -1).flatten(0, 1).movedim(0, gather_dim)` of a rank-major [s, b, k] buffer
// (torch/distributed/_symmetric_memory/__init__.py _fused_all_gather_matmul_impl's unflatten @
// 006b161f8e5a26c8618dee34ee4d6b5dcaf578c0, the same in the mid-2025 version async_tp_overlap.hpp read). A linear's
// weight gradient reads its input as reshape(x, [b * s, k]), which a [b, s, k] tensor stored sequence-major cannot
// view, so Inductor writes it out (torch/_inductor/ir.py View.create, the same in every stored version read: an input
// without contiguous storage becomes an indexed View, copied when an extern GEMM reads it). Per layer, in backward:
// the two gathered output gradients (read by the row-parallel linears' weight gradients) and the two gathered column
// inputs (recomputed in backward, or saved by a forward that keeps them): read and write of 4 s x b x h tensors. A
// vanilla DTensor gather's cat (tp_sequence_layout_copy_bytes) leaves a contiguous [b, s, h] tensor, which views.
double tp_async_gathered_layout_copy_bytes(const TpUnitShape& u, const MeshSpec& mesh, int64_t micro_batch);

// Vocabulary-parallel cross-entropy's all-reduces over the tp group, in issue order: the logits' row maximum, the
// target logit and the sum of exponentials, one fp32 value per token each. Separate (`fused` false): three calls, as
// Megatron-LM's original cross_entropy.py, nanotron's _ShardedCrossEntropy and PyTorch's loss_parallel
// (torch/distributed/tensor/parallel/loss.py: the max and the sum in _log_softmax, the target in the nll_loss
// handler) issue them. Fused (true): the maximum, then the other two concatenated into one call of two values per
// token (Megatron core fusions/fused_cross_entropy.py @ 0cb4a9c81767: torch.cat((predicted_logits,
// sum_exp_logits)) all-reduced once; fsdp-run's VocabParallelCE, executor/model/tensor_parallel.cpp).
std::vector<TpCollective> tp_loss_collectives(double tokens, bool fused);

// The share of a fused collective's time that stays on the critical path (1 without async TP; 1/tp with it): the
// estimate kept for layers whose GEMMs do not read as attention + MLP blocks, where the decomposition's pricing
// (timeline/async_tp_overlap.hpp) has no GEMMs to pair a call with; the calls that are not fused
// (TpCollective::fused_calls) stay whole.
double tp_exposed_fraction(const MeshSpec& mesh);

}  // namespace fsdp
