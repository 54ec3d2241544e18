// One training configuration: the execution-strategy input (the third of
// model / hardware / strategy). Plain data, filled from CLI flags or plan.yaml.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strategy/mesh.hpp"

namespace fsdp {

enum class StrategyKind {
  NoShard,     // replicate everything, all-reduce grads (FSDP NO_SHARD; DDP without buckets' overlap semantics)
  Ddp,         // DistributedDataParallel: replicas, bucketed all-reduce overlapped with backward
  Zero1,       // optimizer states sharded
  Zero2,       // optimizer states and gradients sharded
  Zero3,       // params, grads, optimizer sharded (DeepSpeed stage 3; same lifecycle as FSDP FULL_SHARD)
  Fsdp,        // FULL_SHARD
  FsdpGradOp,  // SHARD_GRAD_OP: params stay unsharded from forward to backward
  Hsdp,        // shard within groups of hsdp_group GPUs, replicate across groups
};

enum class WrapKind { Layer, EveryK, Size, Model };
// Activation checkpointing of a decoder layer (layer_ckpt says which applies to which layer):
//   None        autograd keeps every tensor the layer's backward needs;
//   Full        the whole layer is recomputed in backward from its input (torch.utils.checkpoint of the block);
//   Selective   ours: only the attention core's internals are recomputed (Korthikanti et al. 2022,
//               arXiv 2205.05198 sec. 4.2), everything else is kept;
//   SelectiveOp torchtitan's per-op policy (selective_ac_option = "op"): the whole layer is checkpointed, but the
//               outputs of every other matmul and of the attention kernel are cached (ModuleGraph::op_sac).
enum class ActCkpt { None, Full, Selective, SelectiveOp };
enum class Offload { None, Optimizer, Params };
enum class DType { Fp32, Bf16, Fp16 };
enum class Optimizer { AdamW, Sgd };
enum class Method { Full, Lora, QLora };
// Flash: FlashAttention-2 (the flash-attn package, or SDPA's flash backend, which runs FA2's kernels). Flash3:
// FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608), Hopper only (flash-attn's hopper/ build targets sm90), through
// Transformers' attn_implementation "flash_attention_3" or torch's FA3 varlen (rule AttentionKernel). Flex:
// torch.nn.attention.flex_attention (compiled Triton, block-sparse over a BlockMask; torchtitan's attn_backend "flex";
// rule AttentionKernel). Sdpa: whatever torch.nn.functional.scaled_dot_product_attention dispatches
// (compute/sdpa_dispatch.hpp). Eager: unfused.
enum class AttentionImpl { Flash, Sdpa, Eager, Flash3, Flex };
// When a sharded-gradient strategy (fsdp, fsdp-grad-op, hsdp) reduces its gradients under accumulation: after every
// micro-batch's backward (FSDP's default), or only after the last, the earlier micro-batches accumulating the
// unsharded gradients on every rank (FSDP1 FullyShardedDataParallel.no_sync(), FSDP2
// FSDPModule.set_requires_gradient_sync(False); Lightning Fabric's no_backward_sync and accelerate's
// accumulate() call them): 1/K of the reduce-scatters, at the memory of the whole unsharded gradient.
enum class GradSync { EveryMicroBatch, LastMicroBatch };
// Float8 training of the decoder layers' linears as torchao.float8 does it (convert_to_float8_training swaps each
// nn.Linear for a Float8Linear; torchtitan's `model.converters = float8` leaves the output head in the compute dtype):
// each linear's three GEMMs run on the FP8 tensor cores (torch._scaled_mm), its inputs cast to float8 with dynamic
// scales first. The recipes are torchao's (torchao/float8/config.py Float8LinearRecipeName): tensorwise (one scale
// per tensor, the fastest), rowwise (one scale per row, more accurate, extra casting). Sources and formulas:
// docs/hardware.md "Float8 linears".
enum class Float8Recipe { None, Tensorwise, Rowwise };
// What of a vision-language model's vision side trains, beside its language model (Method::Full): everything (the
// tower and its projector), the projector alone (the tower frozen), or neither. ms-swift freezes both by default
// (TunerArguments freeze_vit = True, freeze_aligner = True, swift/llm/argument/tuner_args.py); LLaVA's fine-tuning
// stage trains the projector beside the language model with the tower frozen (Liu et al. 2023, arXiv 2304.08485
// sec. 4.2). A frozen part keeps no gradient, no optimizer state, saves nothing for backward and runs no backward:
// no gradient flows into it (its inputs, the pixels, need none).
enum class VisionTraining { All, Projector, None };
// A library of fused kernels swapped into a Hugging Face model before training (not searched: the user's choice, like
// the attention kernel). Liger: Liger-Kernel's patches as Transformers applies them under TrainingArguments
// use_liger_kernel (trainer.py _apply_liger_kernel_to_instance, the patch's defaults: rope, rms_norm, swiglu and
// fused_linear_cross_entropy true, cross_entropy false; linkedin/Liger-Kernel src/liger_kernel/transformers/
// monkey_patch.py): what each kernel changes, runtime/kernel_library.hpp; rule KernelLibrary.
enum class KernelLibrary { None, Liger };

struct WrapPolicy {
  WrapKind kind = WrapKind::Layer;
  int64_t every_k = 1;     // for EveryK
  int64_t min_params = 0;  // for Size (like size_based_auto_wrap_policy's min_num_params)
};

struct LoraSpec {
  int64_t rank = 0;
  std::vector<std::string> target_modules;  // names like q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
};

struct Strategy {
  StrategyKind kind = StrategyKind::Fsdp;
  int64_t hsdp_group = 0;  // shard-group size for Hsdp (0 = not used)
  WrapPolicy wrap;
  bool reshard_after_forward = true;
  ActCkpt act_ckpt = ActCkpt::None;
  // With act_ckpt Full: only every ckpt_every-th decoder layer is checkpointed (torchtitan's selective layer AC,
  // selective_ac_option = "N"; layer_ckpt); 1 = every layer (plain full checkpointing).
  int64_t ckpt_every = 1;
  // With act_ckpt Full: the fraction of the decoder layers checkpointed, in (0, 1), placed as fms-fsdp's selective
  // checkpointing places them (layer_ckpt); 0 = not used (every layer, or every ckpt_every-th).
  double ckpt_fraction = 0;
  Offload offload = Offload::None;
  DType param_dtype = DType::Bf16;   // the dtype compute uses
  DType reduce_dtype = DType::Fp32;  // gradient reduction dtype
  DType master_dtype = DType::Fp32;  // dtype of the sharded master params and optimizer states
  int64_t micro_batch = 1;
  int64_t seq_len = 4096;
  // Packed documents: each sequence holds documents of this many tokens (the length-weighted mean, sum L^2 / sum L,
  // for uneven ones), and attention stays within a document (block-causal), as flash attention's varlen kernel
  // computes it from the packed sequence's document boundaries. 0: one document a sequence (causal over it).
  int64_t doc_len = 0;
  int64_t grad_accum = 1;
  Optimizer optimizer = Optimizer::AdamW;
  Method method = Method::Full;
  LoraSpec lora;
  AttentionImpl attention = AttentionImpl::Flash;
  int64_t forward_prefetch = 1;   // units gathered ahead in forward
  int64_t backward_prefetch = 1;  // units gathered ahead in backward
  int64_t ddp_bucket_mb = 25;     // DDP bucket_cap_mb
  GradSync grad_sync = GradSync::EveryMicroBatch;
  Float8Recipe float8 = Float8Recipe::None;
  // With float8 tensorwise under FSDP2: the sharded weights of the float8 linears are cast to float8 before FSDP's
  // all-gather, which then moves and holds 1 byte per weight (torchao enable_fsdp_float8_all_gather, fsdp_utils.py
  // WeightWithDynamicFloat8CastTensor fsdp_pre_all_gather / fsdp_post_all_gather).
  bool float8_all_gather = false;
  VisionTraining train_vision = VisionTraining::All;  // a vision-language model's trained vision parts
  KernelLibrary kernels = KernelLibrary::None;        // fused kernels patched into the model (runtime/kernel_library)
  // Tensor and pipeline parallelism on the same mesh (strategy/mesh.hpp); kind then names the data-parallel
  // strategy over the dp = world / (tp x pp) ranks that hold the same model slice.
  MeshSpec mesh;
};

// Text names used in CLI flags and plan.yaml (round-trip exactly).
const char* to_string(StrategyKind);
const char* to_string(ActCkpt);  // the mode's name alone; a strategy's policy is act_ckpt_name
const char* to_string(Offload);
const char* to_string(DType);
const char* to_string(Optimizer);
const char* to_string(Method);
const char* to_string(AttentionImpl);
const char* to_string(GradSync);        // "every-micro-batch", "last-micro-batch"
const char* to_string(Float8Recipe);    // "none", "tensorwise", "rowwise"
const char* to_string(VisionTraining);  // "all", "projector", "none"
const char* to_string(KernelLibrary);   // "none", "liger"
std::string to_string(const WrapPolicy&);

bool parse_strategy_kind(const std::string&, StrategyKind&);
// The checkpointing policy's text name: "none", "full", "selective" (ours, the attention core),
// "selective-op" (torchtitan's per-op policy), "every:N" (full on every N-th layer, N >= 2; "every:1" is
// "full" and parses to it) or "fraction:P" (full on the fraction P of the layers, 0 < P < 1, fms-fsdp's spacing;
// "fraction:1" is "full").
std::string act_ckpt_name(ActCkpt mode, int64_t every);
std::string act_ckpt_name(const Strategy&);
// Every knob of a strategy as text (the LoRA modules as a set), for comparing strategies: equal texts, equal
// strategies.
std::string strategy_identity(const Strategy& s);
// Sets the strategy's act_ckpt, ckpt_every and ckpt_fraction from a name; false (the strategy unchanged) if it is
// none of them.
bool parse_act_ckpt(const std::string&, Strategy&);
bool parse_act_ckpt(const std::string&, ActCkpt& mode);  // a mode alone: every:N and fraction:P are refused
inline constexpr const char* kActCkptNames = "none, full, selective, selective-op, every:N, fraction:P";
// Whether full checkpointing covers every decoder layer (not every:N, not fraction:P).
bool checkpoints_every_layer(const Strategy&);
bool parse_offload(const std::string&, Offload&);
bool parse_dtype(const std::string&, DType&);
bool parse_optimizer(const std::string&, Optimizer&);
bool parse_method(const std::string&, Method&);
bool parse_attention(const std::string&, AttentionImpl&);
bool parse_grad_sync(const std::string&, GradSync&);
bool parse_float8(const std::string&, Float8Recipe&);
bool parse_kernel_library(const std::string&, KernelLibrary&);
bool parse_vision_training(const std::string&, VisionTraining&);
inline constexpr const char* kFloat8Names = "none, tensorwise, rowwise";
inline constexpr const char* kVisionTrainingNames = "all, projector, none";
inline constexpr const char* kKernelLibraryNames = "none, liger";
// Whether grad_sync last-micro-batch means something for this strategy: an FSDP-family kind without offload (DDP and
// ZeRO-1 reduce on the last micro-batch anyway; DeepSpeed refuses no_sync with partitioned gradients; offload with
// it is not modelled).
bool grad_sync_applies(const Strategy&);
bool parse_wrap(const std::string&, WrapPolicy&);  // "layer", "every:K", "size:N", "model"

// The checkpointing mode of decoder layer `layer` (0-based) under the strategy: every consumer (memory walk,
// step program, op costs, layer costs, fsdp-run) asks this per layer. every:N checkpoints the layers torchtitan's
// _apply_layer_sac does: it counts the blocks it wraps from 1 and checkpoints block c where c % N == 0, i.e.
// layer indices N-1, 2N-1, ... (torchtitan/distributed/activation_checkpoint.py at pytorch/torchtitan@1f029641).
// fraction:P checkpoints the blocks fms-fsdp's apply_fsdp_checkpointing picks (foundation-model-stack/fms-fsdp
// fms_fsdp/policies/ac_handler.py @ 4eb97d80b08f7b89068c7f4c312e233fded2343d): counting blocks from 1, block c when
// c x P reaches the cut-off, which starts at 1/2 and grows by 1 at each block checkpointed (P = 1/2: blocks 1, 3,
// 5, ...; P = 2/3: 1, 2, 4, 5, ...), evenly spaced.
ActCkpt layer_ckpt(const Strategy&, int64_t layer);
// What a mode recomputes in backward: the layer's GEMMs (all under Full; SelectiveOp those it does not cache),
// the attention kernel's forward, the memory-bound kernels (norms, rotary, activations, adds), and so the eager
// runtime's layer forward once more.
bool recomputes_attention(ActCkpt);
bool recomputes_layer_forward(ActCkpt);  // the layer's forward runs again (Full, SelectiveOp)

int dtype_bytes(DType);
bool shards_params(StrategyKind);  // zero3, fsdp, fsdp-grad-op, hsdp
// PyTorch FSDP's kinds (fsdp, fsdp-grad-op, hsdp): what grad_sync last-micro-batch and the float8 all-gather (an FSDP2
// extension) apply to; zero3 shards its parameters with DeepSpeed's layout.
bool fsdp_family(StrategyKind);
bool shards_grads(StrategyKind);      // zero2 and all that shard params
bool shards_optimizer(StrategyKind);  // zero1 and above

}  // namespace fsdp
