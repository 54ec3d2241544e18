#include "strategy/capabilities.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "runtime/kernel_library.hpp"
#include "runtime/runtime_profile.hpp"

namespace fsdp {

namespace {

struct Ctx {
  const Strategy& s;
  const ModelSpec& m;
  const MeshWorld& w;
  const RuntimeSupport& rt;
  int64_t tp() const { return s.mesh.tp; }
  int64_t pp() const { return s.mesh.pp; }
  int64_t dp() const { return w.world / s.mesh.model_parallel(); }
  bool mesh() const { return !s.mesh.is_data_parallel_only(); }
};

std::string n(int64_t v) { return std::to_string(v); }

// Whether `ranks` consecutive ranks fill whole nodes of `gpn` or share one (evenly): the groups whose costs
// comm/comm_group.cpp contiguous_group prices (a group's ranks per node uniform).
bool node_aligned(int64_t ranks, int64_t gpn) { return gpn % ranks == 0 || ranks % gpn == 0; }

struct Rule {
  CapabilityRule id;
  const char* summary;
  // Empty when the rule holds; otherwise the flag it blames and the reason.
  std::function<std::optional<CapabilityViolation>(const Ctx&)> check;
};

std::optional<CapabilityViolation> broken(CapabilityRule id, const std::string& flag, const std::string& reason) {
  return CapabilityViolation{id, flag, reason};
}

// A knob the runtime's profile does not run (its `runs.KEY`, RuntimeSupport::*has): "R does not DO (its profile has
// no runs.KEY): INSTEAD, or use a runtime that does (the shipped ones that set it)".
std::optional<CapabilityViolation> not_run(const Ctx& c, CapabilityRule id, const std::string& flag,
                                           const std::string& does, const std::string& key, bool RuntimeSupport::*has,
                                           const std::string& instead) {
  const std::string others = c.rt.config_root.empty() ? "" : shipped_runtimes_running(c.rt.config_root, has);
  return broken(id, flag,
                c.rt.runtime_name + " does not " + does + " (its profile has no runs." + key + "): " + instead +
                    (others.empty() ? "" : ", or use a runtime that does (" + others + ")"));
}

// The table, in the order the rules are checked: the mesh's shape first (later rules divide by it).
const std::array<Rule, static_cast<size_t>(CapabilityRule::kCount)>& rules() {
  using R = CapabilityRule;
  static const std::array<Rule, static_cast<size_t>(R::kCount)> table{{
      {R::MeshWorld, "tp x pp does not divide the GPUs",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.w.world % c.s.mesh.model_parallel() == 0) return std::nullopt;
         return broken(R::MeshWorld, c.tp() > 1 ? "--tp" : "--pp",
                       "tp " + n(c.tp()) + " x pp " + n(c.pp()) + " = " + n(c.s.mesh.model_parallel()) +
                           " does not divide the " + n(c.w.world) + " GPUs");
       }},
      // torchtitan's ParallelDims puts tp innermost so that its group is inside a node on NVLink (parallel_dims.py);
      // Megatron-LM's guidance is the same (Narayanan et al. 2021, arXiv:2104.04473 sec. 3.2, takeaway 1).
      {R::TpWithinNode, "tp group larger than a node",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.tp() <= 1 || (c.tp() <= c.w.gpus_per_node && c.w.gpus_per_node % c.tp() == 0)) return std::nullopt;
         return broken(R::TpWithinNode, "--tp",
                       "tp " + n(c.tp()) + " must divide the " + n(c.w.gpus_per_node) +
                           " GPUs of a node (its all-gathers and reduce-scatters run on every layer: inside a node, "
                           "on NVLink)");
       }},
      // A pipeline stage holds world / pp consecutive ranks (pp is the outermost dimension of torchtitan's mesh,
      // torchtitan/distributed/parallel_dims.py, and of nanotron's, src/nanotron/parallel/context.py): they fill whole
      // nodes or share one. A stage straddling nodes unevenly (12 ranks over nodes of 8) has data-parallel and
      // tensor-parallel communicators with different ranks on each node, which the collective costs do not price
      // (comm/comm_group.hpp: a group's ranks per node are uniform).
      {R::PpStageNodes, "a pipeline stage straddles nodes unevenly",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.pp() <= 1) return std::nullopt;
         const int64_t stage = c.w.world / c.pp(), gpn = c.w.gpus_per_node;
         if (node_aligned(stage, gpn)) return std::nullopt;
         return broken(R::PpStageNodes, "--pp",
                       "pp " + n(c.pp()) + " over " + n(c.w.world) + " GPUs puts " + n(stage) +
                           " ranks in a stage, which straddle nodes of " + n(gpn) +
                           " GPUs unevenly: not modelled (a stage's ranks fill whole nodes or share one)");
       }},
      // Megatron-LM ParallelAttention and torchtitan's Attention split the heads evenly (n_heads // tp).
      {R::TpHeads, "tp does not divide the attention heads",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.tp() <= 1 || c.m.num_heads % c.tp() == 0) return std::nullopt;
         return broken(
             R::TpHeads, "--tp",
             "tp " + n(c.tp()) + " does not divide the " + n(c.m.num_heads) + " attention heads of " + c.m.name);
       }},
      // Megatron-LM: num_query_groups divisible by tp, or tp divisible by it (each group then replicated over
      // tp / groups ranks: megatron/core/transformer/attention.py, num_query_groups_per_partition).
      {R::TpKvHeads, "tp neither divides nor is a multiple of the kv heads",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const int64_t kv = c.m.num_kv_heads;
         if (c.tp() <= 1 || kv <= 0 || kv % c.tp() == 0 || c.tp() % kv == 0) return std::nullopt;
         return broken(R::TpKvHeads, "--tp",
                       "tp " + n(c.tp()) + " neither divides the " + n(kv) + " kv heads of " + c.m.name +
                           " nor is a multiple of them (to replicate each over tp / kv ranks)");
       }},
      // Megatron-LM's ColumnParallelLinear: output_size_per_partition = divide(output_size, world_size)
      // (megatron/core/utils.py divide asserts divisibility); torchtitan's ColwiseParallel shards evenly by DTensor.
      // The same for every MLP a layer has: the dense one, each routed expert, the shared experts.
      {R::TpFfn, "tp does not divide the MLP width",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.tp() <= 1) return std::nullopt;
         std::vector<std::pair<const char*, int64_t>> widths{{"the MLP's intermediate size", c.m.ffn_size}};
         if (c.m.moe) {
           widths.push_back({"the routed experts' intermediate size", c.m.moe->expert_ffn_size});
           if (c.m.moe->shared_experts > 0)
             widths.push_back({"the shared experts' intermediate size", c.m.moe->shared_ffn()});
         }
         for (const auto& [what, ffn] : widths) {
           if (ffn <= 0 || ffn % c.tp() == 0 || (c.rt.uneven_ffn_split && ffn >= c.tp())) continue;
           return broken(R::TpFfn, "--tp",
                         "tp " + n(c.tp()) + (c.rt.uneven_ffn_split ? " exceeds" : " does not divide") + " " + what +
                             " " + n(ffn) + " of " + c.m.name);
         }
         return std::nullopt;
       }},
      // Mixture-of-experts layers split each expert's width over tp (torchtitan's TensorParallel plan for grouped
      // experts without expert parallelism; Megatron-LM's expert tensor parallelism): modelled, but for experts with
      // biases (a row-parallel bias inside the experts' weighted sum) and for the per-op checkpointing policy, whose
      // saved set of a routed block under tp is not modelled. Expert parallelism is a different mesh dimension, not
      // modelled.
      {R::TpModelParts, "tensor parallelism of a part not modelled",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.tp() <= 1) return std::nullopt;
         const bool moe_sac = c.m.moe && c.s.act_ckpt == ActCkpt::SelectiveOp;
         if (moe_sac)
           return broken(R::TpModelParts, "--act-ckpt",
                         "selective-op checkpointing of the mixture-of-experts layers of " + c.m.name +
                             " under tensor parallelism is not modelled; use --act-ckpt full, selective or none");
         const char* part = c.m.moe && c.m.mlp_bias ? "mixture-of-experts layers whose experts have biases"
                            : c.m.mla               ? "multi-head latent attention"
                            : c.m.vision            ? "a vision tower"
                                                    : nullptr;
         if (part == nullptr) return std::nullopt;
         return broken(
             R::TpModelParts, "--tp",
             std::string("tensor parallelism of ") + part + " is not modelled; plan " + c.m.name + " with --tp 1");
       }},
      // The embedding and the head are split by vocabulary rows over tp (Megatron-LM VocabParallelEmbedding,
      // megatron/core/tensor_parallel/layers.py; torchtitan's RowwiseParallel embedding and ColwiseParallel output):
      // a tp larger than the vocabulary leaves a rank without a row.
      {R::TpVocab, "tp larger than the vocabulary",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.tp() <= 1 || c.m.vocab_size >= c.tp()) return std::nullopt;
         return broken(R::TpVocab, "--tp",
                       "tp " + n(c.tp()) + " exceeds the " + n(c.m.vocab_size) + "-entry vocabulary of " + c.m.name +
                           " (every tp rank holds a row of the embedding and the head)");
       }},
      // Sequence parallelism scatters the sequence dimension over tp in equal parts: Megatron-LM's
      // _split_along_first_dim asserts "First dimension of the tensor should be divisible by tensor parallel size"
      // (megatron/core/tensor_parallel/mappings.py); torchtitan's SequenceParallel shards Shard(1) the same way.
      {R::TpSequenceSplit, "sequence parallelism with a sequence not divisible by tp",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.tp() <= 1 || !c.s.mesh.sequence_parallel || c.s.seq_len % c.tp() == 0) return std::nullopt;
         return broken(R::TpSequenceSplit, "--seq",
                       "sequence parallelism splits the sequence over tp: " + n(c.s.seq_len) +
                           " tokens are not divisible by tp " + n(c.tp()) + " (or use --sequence-parallel false)");
       }},
      {R::MeshLora, "LoRA with tp or pp not modelled",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (!c.mesh() || c.s.method == Method::Full) return std::nullopt;
         return broken(R::MeshLora, c.tp() > 1 ? "--tp" : "--pp",
                       std::string(to_string(c.s.method)) +
                           " with tensor or pipeline parallelism is not modelled; use --tp 1 --pp 1");
       }},
      {R::MeshOffload, "offload with tp or pp where the runtime does not run it",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (!c.mesh() || c.s.offload == Offload::None || c.rt.mesh_offload) return std::nullopt;
         return broken(
             R::MeshOffload, "--offload",
             c.rt.runtime_name + " does not offload under tensor or pipeline parallelism; use --offload none");
       }},
      {R::PpLayers, "fewer decoder layers than pipeline stages",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const int64_t chunks = c.pp() * c.s.mesh.pp_virtual_stages;
         if (c.pp() <= 1 || chunks <= c.m.num_layers) return std::nullopt;
         return broken(R::PpLayers, "--pp",
                       "pp " + n(c.pp()) + " x " + n(c.s.mesh.pp_virtual_stages) + " virtual stages = " + n(chunks) +
                           " model chunks, more than the " + n(c.m.num_layers) + " decoder layers of " + c.m.name);
       }},
      {R::PpVirtualStages, "virtual stages without the interleaved schedule",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const bool interleaved = c.s.mesh.pp_schedule == PipelineSchedule::Interleaved1F1B;
         const int64_t v = c.s.mesh.pp_virtual_stages;
         if (c.pp() > 1 && interleaved && v < 2)
           return broken(R::PpVirtualStages, "--pp-virtual-stages",
                         "interleaved-1f1b needs at least 2 virtual stages per pipeline rank");
         if (v > 1 && (!interleaved || c.pp() <= 1))
           return broken(R::PpVirtualStages, "--pp-virtual-stages",
                         "virtual stages (" + n(v) + ") apply to --pp-schedule interleaved-1f1b with --pp > 1 only");
         return std::nullopt;
       }},
      // torch.distributed.pipelining ScheduleInterleaved1F1B (torch 2.4-2.5 schedules.py): "Interleaved 1F1B
      // requires the number of microbatches to be a multiple of the number of stages"; Megatron-LM asserts the same
      // (schedules.py forward_backward_pipelining_with_interleaving).
      {R::PpInterleavedMicroBatches, "interleaved 1F1B with micro-batches not a multiple of pp",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.pp() <= 1 || c.s.mesh.pp_schedule != PipelineSchedule::Interleaved1F1B || c.s.grad_accum % c.pp() == 0)
           return std::nullopt;
         return broken(R::PpInterleavedMicroBatches, "--grad-accum",
                       "interleaved-1f1b needs the micro-batches per step (" + n(c.s.grad_accum) +
                           ") to be a multiple of pp " + n(c.pp()));
       }},
      // DeepSpeed's PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
      // (deepspeed/runtime/pipe/engine.py); torchtitan composes pp with FSDP (fully_shard per stage) and DDP.
      {R::PpStrategy, "pipeline parallelism with ZeRO-2/3",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.pp() <= 1 || c.rt.pipeline_partitioned_gradients ||
             (c.s.kind != StrategyKind::Zero2 && c.s.kind != StrategyKind::Zero3))
           return std::nullopt;
         return broken(R::PpStrategy, "--strategy",
                       std::string(to_string(c.s.kind)) +
                           " with pipeline parallelism: DeepSpeed's pipeline engine refuses ZeRO-2/3 (partitioned "
                           "gradients); use fsdp, hsdp, zero1 or ddp");
       }},
      {R::PpTiedEmbeddings, "tied embeddings split over pipeline stages",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.pp() <= 1 || !c.m.tied_embeddings || c.rt.pipeline_tied_embeddings) return std::nullopt;
         return broken(R::PpTiedEmbeddings, "--pp",
                       "pp " + n(c.pp()) + " with the tied embeddings of " + c.m.name +
                           ": the embedding (first stage) and the head (last stage) would share a weight across "
                           "stages, which " +
                           c.rt.runtime_name + " does not synchronise; use --pp 1 or a model with an untied head");
       }},
      {R::HsdpGroup, "HSDP group does not divide the data-parallel ranks",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const int64_t dp = c.dp();
         if (c.s.kind == StrategyKind::Hsdp) {
           if (c.s.hsdp_group <= 0)
             return broken(R::HsdpGroup, "--hsdp-group", "hsdp needs a shard-group size (e.g. --hsdp-group 8)");
           if (dp % c.s.hsdp_group != 0)
             return broken(
                 R::HsdpGroup, "--hsdp-group",
                 n(c.s.hsdp_group) + " does not divide the " +
                     (c.mesh() ? "data-parallel degree " + n(dp) + " (world / (tp x pp))" : "world size " + n(dp)));
           // A shard group spans group x tp consecutive ranks (tp innermost): they fill whole nodes or share one, as
           // a pipeline stage's (rule PpStageNodes); the search tries node-aligned groups only.
           const int64_t span = c.s.hsdp_group * c.tp(), gpn = c.w.gpus_per_node;
           if (!node_aligned(span, gpn))
             return broken(R::HsdpGroup, "--hsdp-group",
                           "a shard group of " + n(c.s.hsdp_group) +
                               (c.tp() > 1 ? " ranks tp " + n(c.tp()) + " apart spans " + n(span) + " ranks, which"
                                           : " ranks would") +
                               " straddle nodes of " + n(gpn) +
                               " GPUs unevenly: not modelled (a shard group fills whole nodes or shares one)");
         } else if (c.s.hsdp_group != 0 && c.s.hsdp_group != dp) {
           return broken(R::HsdpGroup, "--hsdp-group", "only meaningful with --strategy hsdp");
         }
         return std::nullopt;
       }},
      // Expert parallelism as torchtitan builds it (torchtitan/distributed/parallel_dims.py @ b5bcd76c6: ep divides
      // dp_shard x cp x tp, the experts FSDP-sharded over the rest; models/common/moe_sharding.py: the routed experts
      // Shard(0) on the ep mesh): FSDP2 (fsdp, fsdp-grad-op, or hsdp within its shard group) of a model with routed
      // experts that ep divides, on ep consecutive ranks that fill whole nodes or share one (comm_group.hpp prices
      // uniform groups). Priced with tp 1 (beside pipeline stages too: each stage's experts,
      // program/expert_parallel.hpp), full fine-tuning.
      {R::ExpertParallel, "expert parallelism not as priced",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const int64_t ep = c.s.mesh.ep;
         if (ep == 1) return std::nullopt;
         if (ep < 1) return broken(R::ExpertParallel, "--ep", "must be at least 1");
         if (!c.m.moe || c.m.moe->num_experts <= 0)
           return broken(R::ExpertParallel, "--ep", c.m.name + " has no routed experts to split; use --ep 1");
         if (c.m.moe->num_experts % ep != 0)
           return broken(
               R::ExpertParallel, "--ep",
               "ep " + n(ep) + " does not divide the " + n(c.m.moe->num_experts) + " routed experts of " + c.m.name);
         if (!c.rt.expert_parallel)
           return broken(R::ExpertParallel, "--ep",
                         c.rt.runtime_name + " does not run expert parallelism (torchtitan's runtimes do); use --ep 1");
         const StrategyKind k = c.s.kind;
         if (k != StrategyKind::Fsdp && k != StrategyKind::FsdpGradOp && k != StrategyKind::Hsdp)
           return broken(R::ExpertParallel, "--ep",
                         std::string("expert parallelism is priced with FSDP (fsdp, fsdp-grad-op, hsdp: torchtitan's), "
                                     "not ") +
                             to_string(k));
         if (c.tp() > 1)
           return broken(R::ExpertParallel, "--ep",
                         "expert parallelism beside tensor parallelism (torchtitan's ep over tp, or expert tensor "
                         "parallelism) is not modelled; use --tp 1 with --ep");
         if (c.s.method != Method::Full)
           return broken(R::ExpertParallel, "--ep", "expert parallelism with LoRA / QLoRA is not modelled");
         const int64_t shard = k == StrategyKind::Hsdp ? c.s.hsdp_group : c.dp();
         if (shard % ep != 0)
           return broken(R::ExpertParallel, "--ep",
                         "ep " + n(ep) + " does not divide the " + n(shard) +
                             (k == StrategyKind::Hsdp ? " ranks of an HSDP shard group" : " data-parallel ranks"));
         if (!node_aligned(ep, c.w.gpus_per_node))
           return broken(R::ExpertParallel, "--ep",
                         "an ep group of " + n(ep) + " consecutive ranks would straddle nodes of " +
                             n(c.w.gpus_per_node) + " GPUs unevenly: not modelled");
         return std::nullopt;
       }},
      // Packed documents attended one by one (Strategy::doc_len): flash attention's varlen kernel over the packed
      // sequence's document boundaries (flash_attn_varlen_func, Dao et al. FlashAttention-2; Transformers'
      // _flash_attention_forward takes them from packed position_ids, modeling_flash_attention_utils.py), on a
      // runtime that runs it (RuntimeSupport::document_masking). Priced for a language model's global causal layers:
      // not within local windows, not beside a vision tower's image tokens.
      {R::DocumentMasking, "packed documents not as priced",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const int64_t d = c.s.doc_len;
         if (d == 0) return std::nullopt;
         if (d < 0) return broken(R::DocumentMasking, "--doc-len", "must be at least 1");
         if (d >= c.s.seq_len)
           return broken(R::DocumentMasking, "--doc-len",
                         "documents of " + n(d) + " tokens fill the " + n(c.s.seq_len) +
                             "-token sequence: one document a sequence is the default (drop --doc-len)");
         if (!c.rt.document_masking)
           return not_run(c, R::DocumentMasking, "--doc-len", "attend packed documents one by one", "document_masking",
                          &RuntimeSupport::document_masking, "plan it without --doc-len");
         if (c.s.attention != AttentionImpl::Flash && c.s.attention != AttentionImpl::Flash3 &&
             c.s.attention != AttentionImpl::Flex)
           return broken(R::DocumentMasking, "--attention",
                         std::string("packed documents are attended one by one by flash attention's varlen kernel "
                                     "or flex_attention's block mask, not ") +
                             to_string(c.s.attention) + ": use --attention flash (or flash3, flex) with --doc-len");
         if (c.m.sliding_window > 0)
           return broken(R::DocumentMasking, "--doc-len",
                         "packed documents beside the local attention windows of " + c.m.name + " are not modelled");
         if (c.m.vision)
           return broken(R::DocumentMasking, "--doc-len",
                         "packed documents beside the image tokens of " + c.m.name + " are not modelled");
         return std::nullopt;
       }},
      // The attention kernels only some runtimes call (RuntimeSupport::flash_attention_3, flex_attention):
      // FlashAttention-3 (Shah et al. 2024) through Transformers' attn_implementation "flash_attention_3" or torch's
      // FA3 varlen, in fp16 and bf16 (flash-attention hopper/flash_api.cpp: fp8 forward only, no fp32) over head
      // dimensions up to 256 ("FlashAttention forward only supports head dimension at most 256"); torch's
      // flex_attention (He et al. 2024, arXiv:2412.05496) through torchtitan's attn_backend "flex". The GPU side is
      // simulate.hpp attention_hardware_refusal's.
      {R::AttentionKernel, "an attention kernel the runtime, dtype or head width do not run",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const bool fa3 = c.s.attention == AttentionImpl::Flash3;
         if (!fa3 && c.s.attention != AttentionImpl::Flex) return std::nullopt;
         if (!(fa3 ? c.rt.flash_attention_3 : c.rt.flex_attention))
           return not_run(c, R::AttentionKernel, "--attention",
                          std::string("run ") + (fa3 ? "FlashAttention-3" : "flex_attention"),
                          fa3 ? "flash_attention_3" : "flex_attention",
                          fa3 ? &RuntimeSupport::flash_attention_3 : &RuntimeSupport::flex_attention,
                          "use --attention flash");
         if (!fa3) return std::nullopt;
         if (c.s.param_dtype != DType::Bf16 && c.s.param_dtype != DType::Fp16)
           return broken(R::AttentionKernel, "--param-dtype",
                         std::string("FlashAttention-3 trains in bf16 or fp16, not ") + to_string(c.s.param_dtype));
         const int64_t v_head = c.m.mla ? c.m.mla->v_head_dim : c.m.head_dim;
         if (c.m.head_dim > 256 || v_head > 256)
           return broken(R::AttentionKernel, "--attention",
                         c.m.name + "'s attention heads are " + n(std::max(c.m.head_dim, v_head)) +
                             " wide; FlashAttention-3 supports head dimensions up to 256");
         return std::nullopt;
       }},
      // Liger-Kernel patches a Hugging Face model's modules (Strategy::kernels; runtime/kernel_library.hpp): a runtime
      // that builds that model under Transformers or accelerate (RuntimeSupport::liger_kernel), and a model type it has
      // a patch for, else nothing would be swapped and the plan would price kernels that never run.
      {R::KernelLibrary, "a kernel library the runtime does not apply or the model has no patch for",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.kernels == KernelLibrary::None) return std::nullopt;
         if (!c.rt.liger_kernel)
           return not_run(c, R::KernelLibrary, "--kernels", "apply Liger-Kernel", "liger_kernel",
                          &RuntimeSupport::liger_kernel, "use --kernels none");
         // Its fused cross-entropy takes the whole head weight and the whole sequence of hidden states (a plain
         // tensor, not a vocabulary-parallel DTensor), and its loss ends the model's forward, not a stage's.
         if (c.mesh())
           return broken(R::KernelLibrary, c.tp() > 1 ? "--tp" : "--pp",
                         "Liger-Kernel's fused linear cross-entropy under tensor or pipeline parallelism is not "
                         "modelled (it takes the whole head weight and the model's whole output): use --kernels none "
                         "with a mesh, or data parallelism alone");
         if (c.m.hf_model_type.empty())
           return broken(R::KernelLibrary, "--kernels",
                         c.m.name +
                             " names no Hugging Face model_type (its model file's hf_model_type), which "
                             "Liger-Kernel patches by");
         if (!liger_patches(c.m.hf_model_type)) {
           std::string types;
           for (const std::string& t : liger_model_types()) types += (types.empty() ? "" : ", ") + t;
           return broken(R::KernelLibrary, "--kernels",
                         "Liger-Kernel has no patch for " + c.m.name + " (model_type " + c.m.hf_model_type +
                             "); it patches " + types);
         }
         return std::nullopt;
       }},
      {R::OffloadStrategy, "offload without a ZeRO stage",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.offload == Offload::None || (c.s.kind != StrategyKind::Ddp && c.s.kind != StrategyKind::NoShard))
           return std::nullopt;
         return broken(
             R::OffloadStrategy, "--offload",
             std::string(to_string(c.s.kind)) + " keeps everything on the GPU; offload needs zero1/2/3, fsdp or hsdp");
       }},
      {R::ParamsOffloadSharding, "params offload without sharded parameters",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.offload != Offload::Params || shards_params(c.s.kind)) return std::nullopt;
         return broken(R::ParamsOffloadSharding, "--offload",
                       "params offload needs sharded parameters (zero3, fsdp, fsdp-grad-op, hsdp)");
       }},
      // DDP, ZeRO-1 and no-shard already reduce on the last micro-batch only (DDP no_sync); DeepSpeed's ZeRO-2/3
      // refuse it (deepspeed/runtime/engine.py no_sync: "no_sync context manager is incompatible with gradient
      // partitioning logic of ZeRO stage 2/3").
      {R::GradSyncStrategy, "grad_sync last-micro-batch where it does not apply",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.grad_sync != GradSync::LastMicroBatch || grad_sync_applies(c.s)) return std::nullopt;
         if (c.s.offload != Offload::None)
           return broken(R::GradSyncStrategy, "--grad-sync", "last-micro-batch with offload is not modelled");
         const bool reduces_last =
             c.s.kind == StrategyKind::Ddp || c.s.kind == StrategyKind::Zero1 || c.s.kind == StrategyKind::NoShard;
         return broken(R::GradSyncStrategy, "--grad-sync",
                       std::string("last-micro-batch applies to fsdp, fsdp-grad-op and hsdp, not ") +
                           to_string(c.s.kind) +
                           (reduces_last ? " (which reduces on the last micro-batch already)"
                                         : " (DeepSpeed's engine refuses no_sync with partitioned gradients)"));
       }},
      {R::RuntimeMesh, "the runtime does not run this mesh",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         const std::string who = c.rt.runtime_name;
         if (c.tp() > 1 && !c.rt.tensor_parallel)
           return broken(R::RuntimeMesh, "--tp", who + " does not run tensor parallelism; use --tp 1");
         if (c.tp() > 1 && c.s.mesh.sequence_parallel && !c.rt.sequence_parallel)
           return broken(R::RuntimeMesh, "--sequence-parallel",
                         who + " does not run sequence parallelism; use --sequence-parallel false");
         if (c.tp() > 1 && c.s.mesh.async_tp && !c.rt.async_tp)
           return broken(R::RuntimeMesh, "--async-tp", who + " does not run async tensor parallelism");
         if (c.tp() > 1 && c.s.kind == StrategyKind::Zero3 && !c.rt.tp_with_zero3)
           return broken(
               R::RuntimeMesh, "--tp",
               who + " runs tensor parallelism with ZeRO stages 1 and 2, not zero3; use --tp 1 or zero1/zero2");
         if (c.pp() > 1 && !c.rt.pipeline_parallel)
           return broken(R::RuntimeMesh, "--pp", who + " does not run pipeline parallelism; use --pp 1");
         if (c.pp() > 1 && c.s.mesh.pp_schedule == PipelineSchedule::Interleaved1F1B && !c.rt.interleaved_pipeline)
           return broken(R::RuntimeMesh, "--pp-schedule", who + " does not run interleaved-1f1b");
         return std::nullopt;
       }},
      {R::Float8Runtime, "float8 where the runtime does not run it",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.float8 != Float8Recipe::None && !c.rt.float8_linears) {
           if (!c.rt.float8_compiled_runtime.empty())
             return broken(R::Float8Runtime, "--float8",
                           c.rt.runtime_name +
                               " runs eagerly and fsdp-plan prices float8 linears compiled only; use "
                               "--runtime " +
                               c.rt.float8_compiled_runtime + ", or --float8 none");
           return broken(R::Float8Runtime, "--float8",
                         c.rt.runtime_name + " does not train float8 linears; use --float8 none");
         }
         if (c.s.float8_all_gather && !c.rt.float8_all_gather)
           return broken(R::Float8Runtime, "--float8-all-gather",
                         c.rt.runtime_name +
                             " all-gathers parameters in the compute dtype (the float8 all-gather is "
                             "an FSDP2 extension); use --float8-all-gather false");
         return std::nullopt;
       }},
      {R::Float8AllGather, "float8 all-gather without tensorwise float8 and sharded parameters",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (!c.s.float8_all_gather) return std::nullopt;
         if (c.s.float8 != Float8Recipe::Tensorwise)
           return broken(R::Float8AllGather, "--float8-all-gather",
                         std::string("the float8 all-gather applies to --float8 tensorwise (torchao casts the weight "
                                     "with one scale before the gather), not ") +
                             to_string(c.s.float8));
         if (!fsdp_family(c.s.kind))
           return broken(R::Float8AllGather, "--float8-all-gather",
                         std::string("the float8 all-gather is FSDP's (fsdp, fsdp-grad-op, hsdp), not ") +
                             to_string(c.s.kind) + "'s");
         return std::nullopt;
       }},
      {R::Float8ModelParts, "float8 with parts it is not modelled for",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.float8 == Float8Recipe::None) return std::nullopt;
         if (c.m.moe)
           return broken(R::Float8ModelParts, "--float8",
                         "float8 of " + c.m.name +
                             "'s mixture-of-experts layers (grouped expert GEMMs) is not "
                             "modelled; use --float8 none");
         if (c.s.method != Method::Full)
           return broken(R::Float8ModelParts, "--float8",
                         "float8 with LoRA / QLoRA is not modelled; use --float8 none");
         if (c.tp() > 1 && !c.s.mesh.sequence_parallel)
           return broken(R::Float8ModelParts, "--float8",
                         "float8 under tensor parallelism without sequence parallelism is not modelled (torchtitan's "
                         "float8 tp runs with it); use --sequence-parallel true or --float8 none");
         return std::nullopt;
       }},
      {R::RuntimeStrategy, "the runtime does not run this strategy, offload, checkpointing or wrap",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (!c.rt.runs(c.s.kind))
           return broken(R::RuntimeStrategy, "--strategy",
                         c.rt.runtime_name + " runs " + c.rt.strategies_text() + ", not " + to_string(c.s.kind) +
                             " (its runtime profile's runs.strategies)");
         if (!c.rt.runs(policy_of(c.s)))
           return broken(R::RuntimeStrategy, "--act-ckpt",
                         c.rt.runtime_name + " checkpoints " + c.rt.ckpt_policies_text() + ", not " +
                             act_ckpt_name(c.s) + " (its runtime profile's runs.act_ckpt)");
         if (!c.rt.runs(c.s.offload))
           return broken(R::RuntimeStrategy, "--offload",
                         c.rt.runtime_name + " offloads " + c.rt.offloads_text() + ", not " + to_string(c.s.offload) +
                             " (its runtime profile's runs.offload)");
         if (shards_params(c.s.kind) && !c.rt.runs(c.s.wrap.kind))
           return broken(R::RuntimeStrategy, "--wrap",
                         c.rt.runtime_name + " wraps " + c.rt.wraps_text() + ", not " + to_string(c.s.wrap) +
                             " (its runtime profile's runs.wrap)");
         return std::nullopt;
       }},
      {R::TrainVision, "frozen vision parts without a vision tower, or the projector alone with LoRA",
       [](const Ctx& c) -> std::optional<CapabilityViolation> {
         if (c.s.train_vision == VisionTraining::All) return std::nullopt;
         if (!c.m.vision)
           return broken(R::TrainVision, "--train-vision",
                         std::string(to_string(c.s.train_vision)) + " applies to a vision-language model; " + c.m.name +
                             " has no vision tower (use all)");
         // Under LoRA the base is frozen: none leaves the tower without adapters (ActivationQuery::vision_unadapted);
         // a projector trained whole beside adapted language-model linears is not modelled.
         if (c.s.method != Method::Full && c.s.train_vision == VisionTraining::Projector)
           return broken(R::TrainVision, "--train-vision",
                         std::string("projector with ") + to_string(c.s.method) +
                             " is not modelled (a projector trained whole beside the adapters); use none (the tower "
                             "and projector without adapters) or all");
         return std::nullopt;
       }},
  }};
  return table;
}

}  // namespace

const char* to_string(CapabilityRule r) {
  const auto i = static_cast<size_t>(r);
  if (i >= rules().size()) return "?";
  FSDP_ASSERT(rules()[i].id == r, "the capability table is not in CapabilityRule's order");
  return rules()[i].summary;
}

namespace {
// A runtime's list (RuntimeSupport): empty means every value.
template <typename T>
bool listed_or_all(const std::vector<T>& values, T v) {
  return values.empty() || std::find(values.begin(), values.end(), v) != values.end();
}
template <typename T, typename Name>
std::string listed(const std::vector<T>& values, Name name) {
  std::string t;
  for (const T& v : values) t += (t.empty() ? "" : ", ") + std::string(name(v));
  return t;
}
template <typename T>
std::string listed(const std::vector<T>& values) {
  return listed(values, [](T v) { return to_string(v); });
}
constexpr std::array<std::pair<WrapKind, const char*>, 4> kWrapFamilies{
    {{WrapKind::Layer, "layer"}, {WrapKind::EveryK, "every"}, {WrapKind::Size, "size"}, {WrapKind::Model, "model"}}};
constexpr std::array<std::pair<CkptPolicy, const char*>, 6> kCkptPolicies{{{CkptPolicy::None, "none"},
                                                                           {CkptPolicy::Full, "full"},
                                                                           {CkptPolicy::Selective, "selective"},
                                                                           {CkptPolicy::SelectiveOp, "selective-op"},
                                                                           {CkptPolicy::Every, "every"},
                                                                           {CkptPolicy::Fraction, "fraction"}}};
// A name table's lookups, both ways.
template <typename T, size_t N>
const char* name_in(const std::array<std::pair<T, const char*>, N>& table, T v) {
  for (const auto& [value, name] : table)
    if (value == v) return name;
  return "?";
}
template <typename T, size_t N>
bool value_in(const std::array<std::pair<T, const char*>, N>& table, const std::string& text, T& out) {
  for (const auto& [value, name] : table)
    if (text == name) {
      out = value;
      return true;
    }
  return false;
}
}  // namespace

const char* to_string(CkptPolicy p) { return name_in(kCkptPolicies, p); }
bool parse_ckpt_policy(const std::string& text, CkptPolicy& out) { return value_in(kCkptPolicies, text, out); }
const char* wrap_family_name(WrapKind w) { return name_in(kWrapFamilies, w); }
bool parse_wrap_family(const std::string& text, WrapKind& out) { return value_in(kWrapFamilies, text, out); }

CkptPolicy policy_of(const Strategy& s) {
  switch (s.act_ckpt) {
    case ActCkpt::None:
      return CkptPolicy::None;
    case ActCkpt::Selective:
      return CkptPolicy::Selective;
    case ActCkpt::SelectiveOp:
      return CkptPolicy::SelectiveOp;
    case ActCkpt::Full:
      break;
  }
  if (s.ckpt_fraction > 0) return CkptPolicy::Fraction;
  return s.ckpt_every > 1 ? CkptPolicy::Every : CkptPolicy::Full;
}

bool RuntimeSupport::runs(StrategyKind k) const { return listed_or_all(strategies, k); }
bool RuntimeSupport::runs(Offload o) const { return listed_or_all(offloads, o); }
bool RuntimeSupport::runs(CkptPolicy p) const { return listed_or_all(ckpt_policies, p); }
bool RuntimeSupport::runs(WrapKind w) const { return listed_or_all(wraps, w); }
std::string RuntimeSupport::strategies_text() const { return listed(strategies); }
std::string RuntimeSupport::offloads_text() const { return listed(offloads); }
std::string RuntimeSupport::ckpt_policies_text() const { return listed(ckpt_policies); }
std::string RuntimeSupport::wraps_text() const { return listed(wraps, wrap_family_name); }

bool tp_replicates_kv_heads(const ModelSpec& m, int64_t tp) { return tp > m.num_kv_heads && m.num_kv_heads > 0; }

std::optional<CapabilityViolation> first_violation(const Strategy& s, const ModelSpec& m, const MeshWorld& w,
                                                   const RuntimeSupport& rt) {
  const Ctx c{s, m, w, rt};
  if (s.mesh.tp < 1) return broken(CapabilityRule::MeshWorld, "--tp", "must be at least 1");
  if (s.mesh.pp < 1) return broken(CapabilityRule::MeshWorld, "--pp", "must be at least 1");
  if (s.mesh.pp_virtual_stages < 1)
    return broken(CapabilityRule::PpVirtualStages, "--pp-virtual-stages", "must be at least 1");
  for (const Rule& r : rules())
    if (auto v = r.check(c)) return v;
  return std::nullopt;
}

}  // namespace fsdp
