#include "simulate.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "program/pipeline_parallel.hpp"
#include "program/stage_timing_key.hpp"
#include "strategy/capabilities.hpp"

namespace fsdp {

void validate_profiles(const HardwareProfile& hw, const RuntimeProfile& rt) {
  if (!hw.calibrated) return;
  const auto& cal = *hw.calibrated;
  if (cal.runtime != rt.name)
    throw InputError(hw.source + ": calibrated.runtime: this profile was calibrated with runtime '" + cal.runtime +
                     "' (" + cal.runtime_build + "); its measured overheads and in-step factors are that executor's, " +
                     "not runtime '" + rt.name + "''s: plan with --runtime " + cal.runtime +
                     " or calibrate a profile for this runtime");
  if (cal.cost_model_version != kCostModelVersion)
    throw InputError(hw.source + ": calibrated.cost_model_version: this profile was fitted against cost model " +
                     "version " + std::to_string(cal.cost_model_version) + ", this fsdp-plan prices with version " +
                     std::to_string(kCostModelVersion) + ": its fitted factors no longer mean the same; run " +
                     "fsdp-run calibrate again");
}

std::optional<std::string> float8_hardware_refusal(const HardwareProfile& hw) {
  if (hw.device_is_host() || !hw.compute_capability.known() || !hw.compute_capability.at_least(8, 9))
    return "--float8: " + hw.name +
           (hw.compute_capability.known() ? " has compute capability " + to_string(hw.compute_capability)
                                          : std::string(" gives no compute capability")) +
           "; float8 GEMMs need FP8 tensor cores (compute capability 8.9 or later: L40S, H100, H200)";
  if (!(hw.peak_flops_fp8.value > 0))
    return hw.source + ": device.peak_flops.fp8: --float8 needs the GPU's dense FP8 tensor-core peak";
  if (!(hw.float8_cast_efficiency > 0))
    return hw.source +
           ": device.float8_cast_efficiency: --float8 needs the rate of the compiled float8 cast kernels "
           "(docs/hardware.md \"Float8 linears\")";
  return std::nullopt;
}

std::optional<std::string> attention_hardware_refusal(const HardwareProfile& hw, AttentionImpl a) {
  if (a != AttentionImpl::Flash3 && a != AttentionImpl::Flex) return std::nullopt;
  const bool fa3 = a == AttentionImpl::Flash3;
  const std::string flag = std::string("--attention ") + to_string(a) + ": ";
  if (fa3 && (hw.device_is_host() || !hw.compute_capability.known() || hw.compute_capability.major != 9))
    return flag + hw.name +
           (hw.compute_capability.known() ? " has compute capability " + to_string(hw.compute_capability)
                                          : std::string(" gives no compute capability")) +
           "; FlashAttention-3 is built for Hopper (compute capability 9.0: H100, H200, H800, H20): use "
           "--attention flash (FlashAttention-2) or sdpa";
  if (!fa3 && hw.device_is_host())
    return flag + "flex_attention is priced on CUDA devices (a compiled Triton kernel); " + hw.name +
           " is a host device: use --attention sdpa or eager";
  const HardwareProfile::KernelRatio& ratio = fa3 ? hw.flash3_ratio : hw.flex_ratio;
  if (!ratio.given())
    return hw.source + ": device." + (fa3 ? "flash_attention_3_ratio" : "flex_attention_ratio") + ": " + flag +
           "it is priced relative to the flash curves by this ratio, which the profile does not give "
           "(docs/hardware.md \"Attention kernels\")";
  return std::nullopt;
}

void validate_strategy(const Strategy& s, const ModelSpec& m, const Cluster& c, const RuntimeSupport& rt,
                       const std::function<std::string(const std::string&)>& name_of) {
  auto bad = [&](const std::string& flag, const std::string& msg) {
    throw InputError((name_of ? name_of(flag) : flag) + ": " + msg);
  };
  if (c.nodes <= 0) bad("--nodes", "must be at least 1, got " + std::to_string(c.nodes));
  constexpr int64_t kMaxCount = int64_t{1} << 20;  // beyond any cluster; keeps products exact
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  if (c.nodes > kMaxCount) bad("--nodes", "must be at most 2^20");
  if (c.gpus_per_node > kMaxCount) bad("--gpus-per-node", "must be at most 2^20");
  if (s.micro_batch > kMaxSize) bad("--micro-batch", "must be at most 2^31");
  if (s.seq_len > kMaxSize) bad("--seq", "must be at most 2^31");
  if (s.grad_accum > kMaxCount) bad("--grad-accum", "must be at most 2^20");
  if (c.gpus_per_node <= 0) bad("--gpus-per-node", "must be at least 1, got " + std::to_string(c.gpus_per_node));
  if (s.micro_batch <= 0) bad("--micro-batch", "must be at least 1");
  if (s.seq_len <= 0) bad("--seq", "must be at least 1");
  if (s.grad_accum <= 0) bad("--grad-accum", "must be at least 1");
  if (s.seq_len > m.max_positions && m.position_embedding == PositionEmbedding::Learned)
    bad("--seq",
        std::to_string(s.seq_len) + " exceeds the model's learned positions (" + std::to_string(m.max_positions) + ")");
  if (s.forward_prefetch < 0 || s.backward_prefetch < 0) bad("--prefetch", "must not be negative");
  // Which knob combinations can run: the one capability table (strategy/capabilities.hpp), which the planner's
  // search and fsdp-run read too, with what the runtime runs.
  if (auto v = first_violation(s, m, MeshWorld{c.world_size(), c.gpus_per_node}, rt)) bad(v->flag, v->reason);
  if (s.wrap.kind == WrapKind::EveryK && s.wrap.every_k > m.num_layers)
    bad("--wrap",
        "every:" + std::to_string(s.wrap.every_k) + " exceeds the model's " + std::to_string(m.num_layers) + " layers");
  if (s.ckpt_every < 1 || (s.ckpt_every > 1 && s.act_ckpt != ActCkpt::Full))
    bad("--act-ckpt", "every:N needs N >= 1 and applies to full checkpointing only");
  if (s.ckpt_fraction < 0 || s.ckpt_fraction >= 1 ||
      (s.ckpt_fraction > 0 && (s.act_ckpt != ActCkpt::Full || s.ckpt_every > 1)))
    bad("--act-ckpt", "fraction:P needs 0 < P <= 1 and applies to full checkpointing only");
  // fms-fsdp's first checkpointed block is the first c with c x P >= 1/2 (layer_ckpt), so one exists among the
  // model's layers exactly when its last block reaches it (the same product layer_ckpt forms).
  if (s.ckpt_fraction > 0 && static_cast<double>(m.num_layers) * s.ckpt_fraction < 0.5)
    bad("--act-ckpt", act_ckpt_name(s) + " checkpoints none of the model's " + std::to_string(m.num_layers) +
                          " layers (fms-fsdp's spacing needs layers x P >= 1/2)");
  if (s.ckpt_every > m.num_layers)
    bad("--act-ckpt", "every:" + std::to_string(s.ckpt_every) + " exceeds the model's " + std::to_string(m.num_layers) +
                          " layers (it would checkpoint none)");
  if ((s.param_dtype == DType::Fp32) != (s.master_dtype == DType::Fp32) && s.master_dtype != DType::Fp32)
    bad("--master-dtype", "low-precision masters with a different compute dtype are not supported");
  // No default rank: the recipes differ (PEFT's LoraConfig defaults r to 8, peft/tuners/lora/config.py; torchtune's
  // shipped LoRA configs use 8 to 64), and the adapters' memory and time scale with it.
  if (s.method != Method::Full && s.lora.rank <= 0)
    bad("--lora-rank", std::string(to_string(s.method)) +
                           " needs the adapters' rank, a positive integer (e.g. --lora-rank 8, PEFT's default r)");
}

void check_trained_length(const ModelSpec& m, int64_t seq_len, const std::string& seq_source) {
  // A vision-language model's language model runs the text and the sample's image tokens (language_model_strategy).
  const int64_t image = m.vision ? std::max<int64_t>(0, m.vision->image_tokens) : 0;
  const int64_t limit = std::max(m.max_positions, m.rope_scaled_positions);
  if (m.position_embedding != PositionEmbedding::Rope || seq_len + image <= limit) return;
  const std::string length = image > 0 ? std::to_string(seq_len) + " plus " + std::to_string(image) +
                                             " image tokens (" + std::to_string(seq_len + image) + ")"
                                       : std::to_string(seq_len);
  std::string msg = seq_source + " " + length + " exceeds " + m.name +
                    "'s max_positions (max_position_embeddings) of " + std::to_string(m.max_positions);
  if (m.rope_scaled_positions > 0)
    msg += " and its rope_scaling's extension to " + std::to_string(m.rope_scaled_positions) +
           " (factor x original_max_position_embeddings)";
  msg += ": the model was not trained for that length";
  if (m.rope_scaled_positions == 0)
    msg += " (a config.json whose rope_scaling has a factor, or rope_scaled_positions in a model file, extends it)";
  throw InputError(msg);
}

void check_lora_targets(const Strategy& s, const ModuleGraph& g,
                        const std::function<std::string(const std::string&)>& name_of) {
  if (s.method == Method::Full) return;
  std::vector<std::string> linears;  // the adaptable linears' names, in the order the graph first holds them
  for (ModuleId leaf : g.leaves_under(g.root())) {
    const ModuleNode& n = g.node(leaf);
    if (n.lora_target && std::find(linears.begin(), linears.end(), n.short_name) == linears.end())
      linears.push_back(n.short_name);
  }
  for (const std::string& t : s.lora.target_modules)
    if (std::find(linears.begin(), linears.end(), t) == linears.end()) {
      std::string list;
      for (const std::string& l : linears) list += (list.empty() ? "" : ", ") + l;
      const std::string flag = "--lora-targets";
      throw InputError((name_of ? name_of(flag) : flag) + ": '" + t + "' names no linear of " + g.spec().name +
                       " that LoRA adapts (its linears: " + list + ")");
    }
}

Strategy language_model_strategy(const Strategy& s, const ModelSpec& m) {
  if (!m.vision) return s;
  if (m.vision->image_tokens <= 0)
    throw InputError("--image-tokens: " + m.name +
                     "'s vision tower takes images at any resolution, so the image tokens of a sample are not in "
                     "its config: give --image-tokens N (the language-model tokens of the sample's images)");
  Strategy out = s;
  out.seq_len += m.vision->image_tokens;
  return out;
}

double model_flops_per_token(const ModuleGraph& g, int64_t seq_len, bool frozen_base, VisionTraining vision,
                             int64_t doc_len) {
  const ModelSpec& m = g.spec();
  // Non-embedding parameters do the GEMM work; the head's GEMM is counted through its (possibly tied)
  // weight: 6 * (N - embedding) + 6 * head (tied: the embedding matrix acts as the head).
  double n = static_cast<double>(g.total_params());
  double emb = static_cast<double>(m.vocab_size * m.hidden_size);
  if (m.position_embedding == PositionEmbedding::Learned) emb += static_cast<double>(m.max_positions * m.hidden_size);
  double dense = n - emb + (m.tied_embeddings ? static_cast<double>(m.vocab_size * m.hidden_size) : 0.0);
  if (m.moe) {
    // Only experts_per_token of num_experts experts run per token, in each MoE layer (model_spec.hpp is_moe_layer).
    double gate = m.gated_mlp ? 3.0 : 2.0;
    double expert = gate * static_cast<double>(m.hidden_size * m.moe->expert_ffn_size);
    dense -= static_cast<double>(m.moe_layers()) * expert *
             static_cast<double>(m.moe->num_experts - m.moe->experts_per_token);
  }
  // A vision tower's parameters do their GEMM work on its own tokens (ModuleGraph::token_ratio: per sequence token,
  // vision tokens / seq for the blocks and embeddings, image tokens / seq for the projector); the held blocks
  // (past the feature layer) none. A frozen part (Strategy::train_vision) runs its forward alone: 2 FLOPs a parameter
  // and token, not 6 (its projector, trained beside a frozen tower, also needs no input gradient of its first linear:
  // counted as 6 all the same, an overcount of under 0.1% of a 7B VLM's).
  double forward_only = 0;
  for (ModuleId c : g.children(g.root())) {
    const ModuleNode& n = g.node(c);
    if (n.tokens_per_sample == 0 && n.runs) continue;
    const double p = static_cast<double>(g.params_under(c));
    dense -= p;
    if (!n.runs) continue;
    if (ModuleGraph::frozen(g.vision_part(c), vision)) {
      forward_only += p * g.token_ratio(c, seq_len);
    } else {
      dense += p * g.token_ratio(c, seq_len);
    }
  }
  // Each layer's score and value GEMMs, forward + backward (3x the forward): 6 s d_q for a causal global layer,
  // a sliding layer's band for a local one (seq_flops_per_token); a vision block's over its image, per
  // sequence token.
  double attention = 0;
  for (ModuleId layer : g.layers()) {
    const double passes = ModuleGraph::frozen(g.vision_part(layer), vision) ? 1.0 : 3.0;
    for (ModuleId leaf : g.leaves_under(layer))
      attention += passes * seq_flops_per_token(g.node(leaf), seq_len, doc_len) * g.token_ratio(layer, seq_len);
  }
  // A frozen base (LoRA) needs no weight gradients: forward 2N + input gradients 2N.
  return (frozen_base ? 4.0 : 6.0) * dense + 2.0 * forward_only + attention;
}

std::optional<SdpaResolution> resolve_sdpa(const ModuleGraph& g, const HardwareProfile& hw, const RuntimeProfile& rt,
                                           const Strategy& s) {
  if (s.attention != AttentionImpl::Sdpa || hw.device_is_host()) return std::nullopt;
  if (!hw.compute_capability.known())
    throw InputError(hw.source +
                     ": attention sdpa chooses its kernel by the GPU's compute capability, which this profile does "
                     "not give: add device.compute_capability (docs/hardware.md \"Attention kernels\")");
  const ModelSpec& m = g.spec();
  SdpaInputs in;
  in.dtype = s.param_dtype;
  in.head_dim_qk = m.head_dim;
  // MLA's v head differs from its q/k head (nope + rope): model_spec.hpp MlaSpec.
  in.head_dim_v = m.mla ? m.mla->v_head_dim : m.head_dim;
  in.cc = hw.compute_capability;
  // GPT-2's attention-probability dropout: attn_pdrop = 0.1 (Hugging Face GPT2Config's default and the released
  // configs), the only dropout the model format has (ModelSpec::dropout).
  in.dropout_p = m.dropout ? 0.1 : 0.0;
  in.requires_grad = true;
  if (!rt.torch_version.empty()) in.torch = parse_torch_version(rt.torch_version);
  if (!rt.cudnn_version.empty()) in.cudnn = parse_cudnn_version(rt.cudnn_version);
  bool any_global = false, any_masked = false;
  for (int64_t i = 0; i < m.num_layers; ++i) (sdpa_layer_masked(m, i, s.seq_len) ? any_masked : any_global) = true;
  SdpaResolution r;
  r.global = select_sdpa_kernel(in);
  if (any_masked) {
    SdpaInputs masked = in;
    masked.arbitrary_mask = true;
    r.windowed = select_sdpa_kernel(masked);
  }
  auto needs_ratio = [&](const SdpaChoice& c) {
    const char* key = c.kernel == SdpaKernel::MemoryEfficient ? "memory_efficient"
                      : c.kernel == SdpaKernel::Cudnn         ? "cudnn"
                                                              : nullptr;
    if (key == nullptr) return;
    const HardwareProfile::KernelRatio& ratio =
        c.kernel == SdpaKernel::Cudnn ? hw.sdpa_cudnn_ratio : hw.sdpa_memory_efficient_ratio;
    if (!ratio.given())
      throw InputError(hw.source + ": attention sdpa runs the " + to_string(c.kernel) + " kernel here (" + c.reason +
                       "), priced relative to the flash curves by device.sdpa_kernel_ratio." + key +
                       ", which this profile does not give (docs/hardware.md \"Attention kernels\")");
  };
  if (any_global) needs_ratio(r.global);
  if (r.windowed) needs_ratio(*r.windowed);
  const std::string g_text = describe(r.global, s.param_dtype);
  if (!r.windowed) {
    r.description = g_text;
  } else if (!any_global) {
    r.description = describe(*r.windowed, s.param_dtype) + " (sliding-window layers: an attention mask)";
  } else if (r.windowed->kernel == r.global.kernel) {
    r.description = g_text;
  } else {
    r.description = g_text + " for global layers, " + to_string(r.windowed->kernel) +
                    " for sliding-window layers (an attention mask)";
  }
  r.notes = r.global.notes;
  return r;
}

namespace {

// The program input of `in`'s language model (language_model_strategy): the SDPA kernels its stack dispatches and
// what the backend cannot do.
ProgramInput program_input(const SimulationInput& in) {
  FSDP_ASSERT(in.graph && in.hardware && in.runtime, "simulate needs graph, hardware and runtime");
  if (in.strategy.float8 != Float8Recipe::None)
    if (const std::optional<std::string> why = float8_hardware_refusal(*in.hardware)) throw InputError(*why);
  if (const std::optional<std::string> why = attention_hardware_refusal(*in.hardware, in.strategy.attention))
    throw InputError(*why);
  // The language model runs the sample's text tokens and its image tokens (language_model_strategy).
  const Strategy s = language_model_strategy(in.strategy, in.graph->spec());
  const std::optional<SdpaResolution> sdpa = resolve_sdpa(*in.graph, *in.hardware, *in.runtime, s);
  ProgramInput pi;
  if (sdpa) {
    pi.sdpa_global = sdpa->global.kernel;
    pi.sdpa_windowed = sdpa->windowed ? sdpa->windowed->kernel : sdpa->global.kernel;
  }
  pi.graph = in.graph;
  pi.cluster = in.cluster;
  pi.strategy = s;
  pi.runtime = in.runtime;
  // What the backend cannot do (configs/backends: Gloo in LibTorch 1.13 has no bf16/fp16 collectives and
  // gathers through a flat buffer of its own), and where the device's memory is.
  pi.fp32_collectives_only = !in.hardware->backend.low_precision_collectives;
  pi.backend_gather_buffer = in.hardware->backend.gather_flat_buffer;
  pi.host_device = in.hardware->device_is_host();
  return pi;
}

}  // namespace

StepProgram emit_stage_program(const SimulationInput& in, int64_t stage) {
  ProgramInput pi = program_input(in);
  pi.pipeline_stage = stage;
  return emit_step_program(pi, in.memo);
}

Prediction simulate(const SimulationInput& in, StepProgram* program_out) {
  const ProgramInput pi = program_input(in);
  const Strategy& s = pi.strategy;
  const std::optional<SdpaResolution> sdpa = resolve_sdpa(*in.graph, *in.hardware, *in.runtime, s);
  // The stages of a pipeline plan derive their wrap units and layer costs alike, and so do many plans of a search:
  // once for all of them (program/emit_memo.hpp), in the caller's memo where it gives one.
  EmitMemo local_memo;
  EmitMemo& memo = in.memo != nullptr ? *in.memo : local_memo;
  StepProgram prog = emit_step_program(pi, &memo);
  Prediction p;
  p.params = in.graph->total_params();
  auto walk = [&](const StepProgram& program) {
    MemoryResult mem =
        walk_memory(program, *in.runtime, in.cluster.gpus_per_node, !in.hardware->device_is_host(), in.memory_samples);
    if (!in.hardware->device_is_host()) cap_reserved_at_device(mem, in.hardware->usable_device_memory.value);
    return mem;
  };
  p.memory = walk(prog);
  p.time = run_timeline(prog, *in.hardware, in.cluster, s);
  if (s.mesh.pp > 1) {
    // Pipeline parallelism: the first stage (the most micro-batches in flight, the embedding) was emitted; the last
    // (the loss, and the final norm and the head unless nanotron's split put them on the stage before) is too, and
    // the plan's memory is the worse of the two (pipeline_parallel.hpp).
    ProgramInput last = pi;
    last.pipeline_stage = s.mesh.pp - 1;
    StepProgram last_prog = emit_step_program(last, &memo);
    MemoryResult last_mem = walk(last_prog);
    TimelineResult last_time = run_timeline(last_prog, *in.hardware, in.cluster, s);
    auto stage_label = [&](int64_t stage) {
      return "stage " + std::to_string(stage + 1) + "/" + std::to_string(s.mesh.pp) + " ";
    };
    // The plan's memory: a stage's walk replaces it (its peak phase named with the stage) when that needs more.
    auto keep_worse = [&](MemoryResult&& m, int64_t stage) {
      if (m.device_total <= p.memory.device_total) return;
      p.memory = std::move(m);
      p.memory.peak_phase = stage_label(stage) + p.memory.peak_phase;
    };
    p.memory.peak_phase = stage_label(0) + p.memory.peak_phase;
    p.first_stage_memory = p.memory;
    keep_worse(std::move(last_mem), s.mesh.pp - 1);
    // Its step time: the pipeline runs at its slowest stage's pace. GPipe and 1F1B fill and drain through the other
    // stages once each, at their own paces (pipeline_fill_drain_s), so every stage is timed: the stages between the
    // first and the last hold decoder layers only, whose split may differ (nanotron's by compute cost) and whose
    // memory never exceeds the first stage's (fewer micro-batches in flight, no embedding) for the even split; their
    // programs are timed, not walked. Under nanotron's compute-cost split (RuntimeProfile::pipeline_split_by_cost) a
    // stage between may hold more layers than the first, or the final norm and the head apart from the loss
    // (pipeline_parallel.hpp pipeline_split_by_cost): each of its programs is walked too, and the worst memory
    // reported. Interleaved 1F1B keeps its bubble over the slower of the first and last.
    const bool interleaved = s.mesh.pp_schedule == PipelineSchedule::Interleaved1F1B;
    const bool walk_between = in.runtime->pipeline_split_by_cost;
    std::vector<TimelineResult> times;
    std::vector<StepProgram> programs;
    times.push_back(std::move(p.time));
    programs.push_back(std::move(prog));
    // Stages between of equal timing keys time alike, bit for bit (program/stage_timing_key.hpp, with the proof):
    // one is emitted and timed, the others take its timeline (and are emitted afterwards only where the slowest is
    // one of them and the caller wants its program). Not where the stages between are walked too.
    std::vector<std::pair<StageTimingKey, size_t>> timed;  // a key and the stage timed for it
    std::vector<bool> reused(static_cast<size_t>(s.mesh.pp), false);
    for (int64_t stage = 1; !interleaved && stage < s.mesh.pp - 1; ++stage) {
      ProgramInput mid = pi;
      mid.pipeline_stage = stage;
      std::optional<StageTimingKey> key;
      if (!walk_between) key = stage_timing_key(*in.graph, s, *in.runtime, memo.strategy_units(*in.graph, s), stage);
      if (key) {
        const auto same = std::find_if(timed.begin(), timed.end(), [&](const auto& k) { return k.first == *key; });
        if (same != timed.end()) {
          TimelineResult alike = times[same->second];
          times.push_back(std::move(alike));
          programs.push_back(StepProgram{});
          reused[static_cast<size_t>(stage)] = true;
          continue;
        }
        timed.emplace_back(std::move(*key), times.size());
      }
      StepProgram mid_prog = emit_step_program(mid, &memo);
      if (walk_between) keep_worse(walk(mid_prog), stage);
      times.push_back(run_timeline(mid_prog, *in.hardware, in.cluster, s));
      programs.push_back(program_out ? std::move(mid_prog) : StepProgram{});
    }
    times.push_back(std::move(last_time));
    programs.push_back(std::move(last_prog));
    // The slowest stage: the longest step without its own bubble (interleaved: with it, as before).
    auto paced = [&](const TimelineResult& t) { return interleaved ? t.step_s : t.step_s - t.pipeline_bubble_s; };
    size_t slowest = 0;
    std::vector<double> per_micro_batch, reduction_tails;
    for (size_t j = 0; j < times.size(); ++j) {
      per_micro_batch.push_back(times[j].pipeline_micro_batch_s);
      reduction_tails.push_back(times[j].pipeline_reduction_tail_s);
      if (paced(times[j]) > paced(times[slowest])) slowest = j;
    }
    p.time = std::move(times[slowest]);
    if (program_out && reused[slowest]) {
      // The slowest is a stage that took an equal stage's timeline: its own program, whose ops those timings are.
      ProgramInput mid = pi;
      mid.pipeline_stage = static_cast<int64_t>(slowest);
      programs[slowest] = emit_step_program(mid, &memo);
      FSDP_ASSERT(programs[slowest].ops.size() == p.time.ops.size(), "a stage of equal timing key has equal ops");
    }
    prog = std::move(programs[slowest]);
    if (!interleaved) {
      // The bubble and the step move together; the exposed communication (idle less the bubble) is unchanged.
      const double fill_drain = pipeline_fill_drain_s(s.mesh, per_micro_batch, slowest);
      p.time.step_s += fill_drain - p.time.pipeline_bubble_s;
      p.time.pipeline_bubble_s = fill_drain;
    }
    // A stage whose reductions follow its whole backward sends the last micro-batch's input gradient only once they
    // are done (DataParallelPlan::reduces_after_stage_backward), so the last backward reaches the stage before it that
    // much later: every other stage's reduction tail is on the drain's path, in turn (the slowest stage's own is in
    // its step already), reported as the pipeline's reduction chain. Interleaved 1F1B times the first and the last
    // stage only: the ranks between, decoder layers only, take the first's.
    double others_tails = 0;
    for (size_t j = 0; j < reduction_tails.size(); ++j)
      if (j != slowest) others_tails += reduction_tails[j];
    others_tails += static_cast<double>(s.mesh.pp - static_cast<int64_t>(reduction_tails.size())) * reduction_tails[0];
    p.time.step_s += others_tails;
    p.time.pipeline_reduction_chain_s = others_tails;
  }
  p.usable_bytes = in.hardware->usable_device_memory.value;
  p.fits = p.memory.device_total <= p.usable_bytes;
  p.host_fits = p.memory.host_bytes_per_node <= in.hardware->host_memory.value;
  // Tokens: every data-parallel replica (world / (tp x pp) of them) runs micro_batch x seq x grad_accum per step;
  // its tp x pp ranks share them.
  double tokens_per_replica = static_cast<double>(s.micro_batch * s.seq_len * s.grad_accum);
  p.tokens_per_step = tokens_per_replica * static_cast<double>(s.mesh.dp(in.cluster.world_size()));
  p.tokens_per_s_per_gpu =
      p.time.step_s > 0 ? tokens_per_replica / static_cast<double>(s.mesh.model_parallel()) / p.time.step_s : 0.0;
  p.model_flops_per_token =
      in.model_flops_per_token > 0
          ? in.model_flops_per_token
          : model_flops_per_token(*in.graph, s.seq_len, s.method != Method::Full, s.train_vision, s.doc_len);
  // MFU is defined against the datasheet peak (PaLM, arXiv 2204.02311 App. B), not the clock a profile says it holds.
  double peak = in.hardware->rated_peak_flops(s.param_dtype).value;
  p.mfu = peak > 0 ? p.tokens_per_s_per_gpu * p.model_flops_per_token / peak : 0.0;
  if (sdpa) {
    p.attention = sdpa->description;
    p.attention_notes = sdpa->notes;
  } else {
    p.attention = to_string(s.attention);
    // SDPA on a CPU runs its CPU kernels (math / the flash CPU kernel), priced by the CPU profile's curves as
    // before the dispatch was modelled.
    if (s.attention == AttentionImpl::Sdpa) p.attention += " (CPU kernels, priced as flash)";
  }
  if (program_out) *program_out = std::move(prog);
  return p;
}

}  // namespace fsdp
