// What one decoder layer costs, read from its own nodes of the module graph (parameters, GEMM shapes,
// FLOPs, saved tensors, working set, memory-bound traffic): the step program sums these over a unit's
// layers, so a model whose layers differ (dense then MoE, sliding then global attention, other widths)
// needs no change in the emitters (step_emitter.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "model/module_graph.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;     // C[m,n] = A[m,k] B[k,n]; m = tokens of the micro-batch
  double weight = 1.0;             // fraction of tokens (MoE experts see k/E of them)
  bool op_sac_recomputed = false;  // run again in backward under ActCkpt::SelectiveOp (ModuleGraph::op_sac)
  // Not split by tensor parallelism: an MoE block's router and shared-expert gate, which every tp rank runs whole on
  // the gathered tokens (tp_replicated_gate).
  bool tp_replicated = false;
  bool float8 = false;  // a Float8Linear's GEMMs (program/float8_linears.hpp): priced at the FP8 peak
  bool routed = false;  // a routed expert's linear (expert_parallel.hpp routed_expert_linear), one entry per expert
};

// A layer's shapes for the compute cost model (timeline/op_cost.cpp).
struct LayerShape {
  std::vector<GemmShape> gemms;  // forward GEMMs (linears and the router)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t window = 0;    // a sliding layer's attention window (ModuleNode::window); 0: global
  bool chunked = false;  // the window is fixed chunks (ModuleNode::chunked)
  // A vision block's own attention (ModuleNode::attention_keys): bidirectional, attn_batch sequences (the
  // micro-batch's images or windows) of attn_seq keys each; 0: the program's, causal over the sequence.
  int64_t attn_seq = 0, attn_batch = 0;
};

struct LayerCost {
  double params = 0;         // every parameter of the layer
  double lora_params = 0;    // the adapters the strategy's LoRA targets add (0 for full fine-tuning)
  double linear_params = 0;  // its linears' weights (what QLoRA quantises)
  double float8_params = 0;  // the weights of its float8 linears (Strategy::float8; float8_linears.hpp)
  double routed_params = 0;  // its routed experts' (expert_parallel.hpp: a rank gathers 1/ep of them)
  // The routed token copies' elements per token its MoE block dispatches (k x hidden, the experts' input rows; 0 in a
  // dense layer): what expert parallelism's all-to-alls send (expert_parallel.hpp).
  double dispatch_elems_per_token = 0;
  double replicated_params =
      0;  // under tensor parallelism, what every tp rank holds whole (norms: tensor_parallel.cpp)
  // Of those, the ones whose gradient each tp rank computes only part of, summed over the tp group: every norm under
  // sequence parallelism (each rank saw its s/tp tokens), else the attention's q/k norms (each rank saw its heads).
  double tp_partial_grad_params = 0;
  ActCkpt ckpt = ActCkpt::None;  // the layer's checkpointing mode (layer_ckpt), which the fields below assume
  // Bytes of one micro-batch: saved for backward under the layer's checkpointing mode, without checkpointing, and
  // what its backward rematerialises (ModuleGraph::recomputed_bytes_per_token).
  double saved_bytes = 0;
  double saved_bytes_unckpt = 0;
  double recompute_bytes = 0;
  double matmul_flops_per_token = 0;
  double recompute_matmul_flops_per_token = 0;  // the GEMM FLOPs its backward runs again
  double attention_flops_per_token = 0;         // causal: half the score/value products
  double elementwise_bytes_per_token = 0;
  // Its backward's: twice the forward's (each kernel's backward reads its saved input and the incoming gradient and
  // writes the outgoing one), less what the runtime's in-place and single-kernel ops leave out (layer_costs.cpp).
  double elementwise_backward_bytes_per_token = 0;
  // Its float8 linears' casts of their inputs (forward) and incoming gradients (backward), per token
  // (float8_linears.hpp); priced apart from the elementwise bytes, at the cast kernels' rate.
  double float8_cast_bytes_per_token = 0;
  double float8_cast_backward_bytes_per_token = 0;
  double forward_transient = 0;   // working memory of its forward beyond what it saves
  double backward_transient = 0;  // working memory of its backward (recomputation not included)
  // Of which a mixture-of-experts block's stage (0 in a dense layer), already for one tp rank of the strategy's mesh:
  // its tensors over all the tokens stay whole under tp (shard_layer_for_tp keeps it as it is).
  double moe_backward_transient = 0;
  LayerShape shape;
};

struct LayerCostInput {
  const ModuleGraph* graph = nullptr;
  const Strategy* strategy = nullptr;
  const RuntimeProfile* runtime = nullptr;
  ActivationQuery query;
  double tokens = 0;  // of one micro-batch
};

// What one norm's kernels move per element they normalise (per token: times its width), forward and backward:
// eager (a runtime whose norm upcasts moves 32 bytes, HF LlamaRMSNorm's five kernels; one that does not, 4 tensors;
// a single-kernel norm 2 tensors, its backward 3) or fused by Inductor (2 tensors), as the layers' traffic counts
// them (layer_costs.cpp eager_elementwise_bytes, fused_elementwise_bytes, eager_backward_savings).
struct NormTraffic {
  double forward = 0, backward = 0;
};
NormTraffic norm_traffic_per_element(const RuntimeProfile& rt, double pb, bool norm_fp32);

// An MoE block's gates: its router, and the shared experts' sigmoid gate (ModuleNode short name
// "shared_expert_gate"). Tensor parallelism leaves them whole on every rank (their outputs are one score per expert,
// or one per token), and their weight gradients, taken against the experts' partial outputs, are partial
// (executor/model/moe.cpp).
bool tp_replicated_gate(const ModuleNode& n);

// A decoder layer under checkpointing mode `ckpt`, or under the mode the strategy gives it (layer_ckpt).
LayerCost layer_cost(const LayerCostInput& in, ModuleId layer, ActCkpt ckpt);
LayerCost layer_cost(const LayerCostInput& in, ModuleId layer);

}  // namespace fsdp
