// Which combinations of knobs make a plan that can run: ONE table (capabilities.cpp kRules), read by the simulator's
// validator (simulate.cpp validate_strategy: the first violation is an InputError naming the flag), by the planner's
// search (planner/search/plan_search.cpp: violations are counted per rule and reported, never simulated) and by
// fsdp-run, which adds its own limits by clearing flags of RuntimeSupport.
//
// The rules cover the device mesh (strategy/mesh.hpp: tp x pp beside the data-parallel strategy, ep inside its shard
// group) and the
// data-parallel knobs that exclude each other (offload without a ZeRO stage, grad_sync on strategies that cannot
// defer their reduction). Each rule has an id (CapabilityRule), the flag it blames and its reason text with numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_spec.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

enum class CapabilityRule : uint8_t {
  MeshWorld,        // tp x pp must divide the world
  TpWithinNode,     // the tp group inside one node (NVLink): tp divides the GPUs per node
  PpStageNodes,     // a pipeline stage's ranks fill whole nodes or share one (no stage straddles nodes unevenly)
  TpHeads,          // attention heads split evenly over tp
  TpKvHeads,        // kv heads split over tp, or tp a multiple of them (each kv head replicated)
  TpFfn,            // the MLP's intermediate width split evenly
  TpModelParts,     // parts tensor parallelism is not modelled for (MLA, vision towers, MoE with biases or per-op AC)
  TpVocab,          // every tp rank holds a row of the vocabulary (embedding and head split by rows)
  TpSequenceSplit,  // sequence parallelism splits the sequence evenly over tp
  MeshLora,         // LoRA / QLoRA with tp or pp
  MeshOffload,      // offload with tp or pp where the runtime does not run it (RuntimeSupport::mesh_offload)
  PpLayers,         // at least one decoder layer per (virtual) stage
  PpVirtualStages,  // virtual stages with the interleaved schedule only, and at least 2 there
  PpInterleavedMicroBatches,  // interleaved 1F1B: micro-batches a multiple of pp
  PpStrategy,                 // pipeline parallelism with ZeRO-2/3 (partitioned gradients)
  PpTiedEmbeddings,           // tied embeddings split over stages (RuntimeSupport::pipeline_tied_embeddings)
  HsdpGroup,                  // an HSDP shard group divides the data-parallel ranks
  ExpertParallel,             // ep splits routed experts over a node-aligned part of the FSDP shard group
  DocumentMasking,            // packed documents attended one by one: flash varlen on a runtime that runs it
  AttentionKernel,            // FlashAttention-3 or flex_attention where the runtime (or FA3's dtype, head dims) cannot
  KernelLibrary,              // a kernel library (Liger) the runtime does not apply, or that has no patch for the model
  OffloadStrategy,            // offload needs a ZeRO stage / FSDP
  ParamsOffloadSharding,      // params offload needs sharded parameters
  GradSyncStrategy,           // last-micro-batch only where the strategy can defer its reduce-scatter
  RuntimeMesh,                // the runtime cannot run this mesh dimension (RuntimeSupport)
  Float8Runtime,              // float8 linears (or their float8 all-gather) where the runtime does not run them
  Float8AllGather,            // the float8 all-gather needs tensorwise float8 and FSDP's sharded parameters
  Float8ModelParts,           // float8 with parts it is not modelled for (MoE experts, LoRA, tp without SP)
  RuntimeStrategy,            // a strategy, offload, checkpointing or wrap the runtime does not run (RuntimeSupport)
  TrainVision,  // frozen vision parts (Strategy::train_vision) need a vision tower; LoRA takes all or none
  kCount
};
const char* to_string(CapabilityRule);  // a short summary: "tp does not divide the attention heads"

// A checkpointing policy's family, as a runtime runs it or not: none, full (every decoder layer), selective (the
// attention core), selective-op (a per-op save list), every (every N-th layer, N > 1), fraction (a fraction of the
// layers). parse_ckpt_policy reads these names; policy_of gives a strategy's.
enum class CkptPolicy : uint8_t { None, Full, Selective, SelectiveOp, Every, Fraction };
const char* to_string(CkptPolicy);
bool parse_ckpt_policy(const std::string&, CkptPolicy&);
CkptPolicy policy_of(const Strategy&);
// A wrap policy's family, as a runtime builds its units or not: layer (one decoder layer a unit), every (N layers a
// unit), size (units closed at a parameter count: FSDP1's size_based_auto_wrap_policy), model (the root alone).
const char* wrap_family_name(WrapKind);
bool parse_wrap_family(const std::string&, WrapKind&);

// What a runtime can execute; the simulator prices everything (the flags below set, but for one). A runtime profile
// clears the flags of what its runtime does not run (configs/runtimes/*.yaml section `mesh`, runtime_profile.hpp),
// so that `fsdp-plan --runtime R` neither simulates nor proposes a plan R refuses; fsdp-run checks its plans against
// its own (executor/shard/mesh.cpp fsdp_run_support). `runtime_name` names the runtime in the reason text.
struct RuntimeSupport {
  bool tensor_parallel = true;
  bool sequence_parallel = true;
  bool async_tp = true;
  bool pipeline_parallel = true;
  bool interleaved_pipeline = true;
  // Tied embeddings (the embedding on the first stage, the head on the last sharing one weight) under pp > 1:
  // Megatron-LM keeps a copy on each end and all-reduces their gradients over an embedding group
  // (megatron/core/models/common/language_module/language_module.py setup_embeddings_and_output_layer).
  bool pipeline_tied_embeddings = true;
  // ZeRO-2/3 (partitioned gradients) under pp > 1. Clear by default: DeepSpeed's pipeline engine refuses them and
  // the simulator's step program follows it (rule PpStrategy), for every runtime profile. A runtime that composes
  // them (fsdp-run: each stage reduce-scatters its gradients over its data-parallel group) sets it for its own
  // check; no profile key sets it, as the simulator does not price that composition.
  bool pipeline_partitioned_gradients = false;
  // An MLP width tp does not divide, split into rows as even as they go. Clear by default: Megatron-LM's
  // ColumnParallelLinear divides the width with megatron/core/utils.py divide(), which asserts divisibility, and the
  // simulator prices even slices only (rule TpFfn); fsdp-run splits unevenly (executor/model/tensor_parallel.cpp
  // split_rows) and sets it for its own check. No profile key sets it.
  bool uneven_ffn_split = false;
  // Offload with tp or pp: each stage's and tp slice's own shards on the host (fsdp-run: tests/executor/test_mesh.cpp
  // runs optimizer offload with tp 2; the step program places them as without a mesh, checked on the accuracy grid's
  // offload rows under tp and pp, tests/accuracy/README.md). A profile clears it with `mesh: {offload: false}`
  // (rule MeshOffload).
  bool mesh_offload = true;
  // Tensor parallelism beside ZeRO-3's partitioned parameters. Clear in DeepSpeed's profile: its AutoTP training
  // composes TP with ZeRO stages 0, 1 and 2 (www.deepspeed.ai/tutorials/autotp-training); `mesh: {tp_with_zero3:
  // false}` (rule RuntimeMesh).
  bool tp_with_zero3 = true;
  // Float8 linears (Strategy::float8: torchao.float8's Float8Linear, which FSDP2, FSDP1 and torch.compile compose
  // with) and their float8 all-gather (an FSDP2 extension: torchao fsdp_utils.py implements fsdp_pre_all_gather /
  // fsdp_post_all_gather, the hooks of FSDP2's per-parameter all-gather). A profile clears them with
  // `float8: {linears: false}` (DeepSpeed's engine, nanotron and fsdp-run swap no linears), `float8: {all_gather:
  // false}` (FSDP1's flat parameters all-gather in the compute dtype); rule Float8Runtime.
  bool float8_linears = true;
  bool float8_all_gather = true;
  // The shipped runtime that prices this one's float8 linears compiled (`float8: {compiled_runtime: NAME}`, which a
  // derived profile inherits; `none` or absent: none): an eager runtime's casts are chains of kernels fsdp-plan does
  // not price (configs/runtimes/pytorch.yaml), so rule Float8Runtime names the compiled twin instead of saying the
  // framework trains no float8.
  std::string float8_compiled_runtime;
  // Expert parallelism (MeshSpec::ep): torchtitan's (parallelism.expert_parallel_degree). PyTorch's FSDP alone,
  // DeepSpeed under Transformers, nanotron and fsdp-run dispatch no tokens to other ranks: their profiles clear it
  // with `mesh: {expert_parallel: false}` (rule ExpertParallel).
  bool expert_parallel = true;
  // Packed documents attended one by one (Strategy::doc_len): a runtime whose flash attention takes the packed
  // sequence's document boundaries and runs the varlen kernel over them (profile `runs: {document_masking: true}`;
  // absent: false, attention over the whole sequence); rule DocumentMasking.
  bool document_masking = false;
  // FlashAttention-3 (--attention flash3): a runtime whose attention calls it (profile `runs: {flash_attention_3:
  // true}`; absent: false); rule AttentionKernel. The GPU side (Hopper, the dtype, head dims, the profile's ratio) is
  // simulate.hpp flash3_refusal's.
  bool flash_attention_3 = false;
  // torch's flex_attention (--attention flex): a runtime whose attention calls it (profile `runs: {flex_attention:
  // true}`; absent: false); rule AttentionKernel. The GPU side (the profile's ratio) is attention_hardware_refusal's.
  bool flex_attention = false;
  // Liger-Kernel's patches (--kernels liger): a runtime that trains a Hugging Face model under Transformers' Trainer or
  // accelerate, which apply them (profile `runs: {liger_kernel: true}`; absent: false); rule KernelLibrary.
  bool liger_kernel = false;
  // The data-parallel strategies and offload modes the runtime runs (profile section `runs`; empty: every one the
  // simulator prices). nanotron runs DDP and its ZeRO-1 without offload; PyTorch's FSDP2 has no ZeRO-1/2 and offloads
  // parameters, gradients and the optimizer step together (CPUOffloadPolicy); rule RuntimeStrategy.
  std::vector<StrategyKind> strategies;
  std::vector<Offload> offloads;
  // And the checkpointing policies, by family (CkptPolicy; empty: all). DeepSpeed under Transformers and nanotron
  // checkpoint every decoder layer or none; the attention-core policy (`selective`, Megatron-LM's selective
  // recompute) is fsdp-run's.
  std::vector<CkptPolicy> ckpt_policies;
  // And the sharding units it builds, by family (WrapKind; empty: all). torchtitan's apply_fsdp and DeepSpeed's
  // per-module ZeRO-3 fetch make one decoder layer a unit; FSDP2 takes any group of blocks (fully_shard of a module
  // list) but has no size-based auto wrap, FSDP1 the reverse. Applies to the strategies that shard parameters.
  std::vector<WrapKind> wraps;
  bool runs(StrategyKind k) const;
  bool runs(Offload o) const;
  bool runs(CkptPolicy p) const;
  bool runs(WrapKind w) const;
  // "ddp, zero1": the lists as written (empty where the runtime runs them all).
  std::string strategies_text() const;
  std::string offloads_text() const;
  std::string ckpt_policies_text() const;
  std::string wraps_text() const;
  std::string runtime_name = "the simulator";
  // The config root the profile was read from (load_runtime; empty for a support built in code): a refusal names the
  // shipped runtimes there that run what this one does not (runtime/runtime_profile.hpp shipped_runtimes_running).
  std::string config_root;
};

struct CapabilityViolation {
  CapabilityRule rule = CapabilityRule::MeshWorld;
  std::string flag;    // the CLI flag it blames ("--tp"); plan.yaml keys map from it
  std::string reason;  // with the numbers: "tp 8 does not divide the 28 attention heads of qwen2.5-7b"
};

struct MeshWorld {
  int64_t world = 1;          // ranks in all (dp x tp x pp)
  int64_t gpus_per_node = 1;  // ranks per node
};

// The first rule of the table that `s` breaks for model `m` on `w` and runtime `rt`, or nullopt.
std::optional<CapabilityViolation> first_violation(const Strategy& s, const ModelSpec& m, const MeshWorld& w,
                                                   const RuntimeSupport& rt = RuntimeSupport{});

// Whether layer `layer`'s kv heads are replicated over the tp group (tp a multiple of them, more than them): each
// rank then holds one kv head, as Megatron-LM (num_query_groups < tensor_model_parallel_size) and torchtitan do.
bool tp_replicates_kv_heads(const ModelSpec& m, int64_t tp);

}  // namespace fsdp
