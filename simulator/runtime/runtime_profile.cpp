#include "runtime/runtime_profile.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/config_map.hpp"
#include "core/config_path.hpp"
#include "core/errors.hpp"
#include "core/versions.hpp"

namespace fsdp {

namespace {

std::filesystem::path runtime_dir(const std::string& config_root) {
  return std::filesystem::path(config_root) / "configs" / "runtimes";
}

std::string canonical(const std::string& path) {
  std::error_code ec;
  auto c = std::filesystem::weakly_canonical(path, ec);
  return ec ? std::filesystem::absolute(path, ec).lexically_normal().string() : c.string();
}

// Whether to read `key` of `m`: always in a profile written whole (every key is required), and only where the
// derived profile gives it (an absent key keeps the base's value), as hardware profiles' `base:` does
// (simulator/hardware/hardware_profile.cpp).
bool given(const ConfigMap& m, const std::string& key, bool inherit) { return !inherit || m.has(key); }

// The files being loaded, the outermost first: canonical path (cycle detection) and the path as written.
using Chain = std::vector<std::pair<std::string, std::string>>;

RuntimeProfile load_file(const std::string& path, const std::string& config_root, Chain& chain);

// `base: NAME_OR_PATH` of the profile in `map` (file `path`): a shipped runtime's name, or a path to a .yaml file
// (relative to this one), loaded whole.
RuntimeProfile load_base(ConfigMap& map, const std::string& path, const std::string& config_root, Chain& chain) {
  const std::string base = map.get_string("base");
  std::string base_path;
  if (base.find('/') != std::string::npos || base.find(".yaml") != std::string::npos) {
    std::filesystem::path p(base);
    if (p.is_relative()) p = std::filesystem::path(path).parent_path() / p;
    base_path = p.lexically_normal().string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(base_path, ec)) map.fail("base", "no such file: " + base_path);
  } else {
    try {
      base_path = resolve_config(base, runtime_dir(config_root), "base", "runtime");
    } catch (const InputError& e) {
      map.fail("base", e.what());
    }
  }
  const std::string key = canonical(base_path);
  for (size_t i = 0; i < chain.size(); ++i)
    if (chain[i].first == key) {
      std::string cycle;
      for (size_t j = i; j < chain.size(); ++j) cycle += chain[j].second + " -> ";
      map.fail("base", "the bases form a cycle: " + cycle + base_path);
    }
  try {
    RuntimeProfile r = load_file(base_path, config_root, chain);
    r.base_source = base_path;
    return r;
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + " (in " + base_path + ", the base of " + path + ")");
  }
}

RuntimeProfile parse(ConfigMap& map, const std::string& path, const std::string& config_root, Chain& chain) {
  // A derived profile starts from its base: each key below overrides it, mapping by mapping, key by key.
  const bool derived = map.has("base");
  RuntimeProfile r = derived ? load_base(map, path, config_root, chain) : RuntimeProfile{};
  r.source = path;
  r.name = map.get_string("name");  // always the file's own
  // A mapping of the profile: read whole in a profile written whole, only where given in a derived one.
  auto section = [&](const char* key, auto&& read) {
    if (!given(map, key, derived)) return;
    ConfigMap m = map.get_map(key);
    auto has = [&](const char* k) { return given(m, k, derived); };
    read(m, has);
    m.finish();
  };
  section("allocator", [&](ConfigMap& alloc, auto&& has) {
    if (has("rounding")) r.allocation_rounding = alloc.get_bytes("rounding");
    if (has("fragmentation_fraction")) {
      r.fragmentation_fraction = alloc.get_double("fragmentation_fraction");
      if (r.fragmentation_fraction < 0 || r.fragmentation_fraction > 1)
        alloc.fail("fragmentation_fraction", "must be within [0, 1]");
    }
    if (alloc.has("sharded_grads_in_reduce_stream_pool"))
      r.sharded_grads_in_reduce_stream_pool = alloc.get_bool("sharded_grads_in_reduce_stream_pool");
    if (alloc.has("collective_inputs_held_for_the_pass"))
      r.collective_inputs_held_for_the_pass = alloc.get_bool("collective_inputs_held_for_the_pass");
  });
  if (given(map, "context_memory", derived)) r.context_memory = map.get_bytes("context_memory");
  if (given(map, "nccl_memory_per_communicator", derived))
    r.nccl_memory_per_communicator = map.get_bytes("nccl_memory_per_communicator");
  // A boolean key of a section, read where given (the section's `has`).
  auto flags_of = [](ConfigMap& m, auto& has) {
    return [&m, &has](const char* key, bool& field) {
      if (has(key)) field = m.get_bool(key);
    };
  };
  section("modules", [&](ConfigMap& mod, auto&& has) {
    auto flag = flags_of(mod, has);
    flag("norm_saves_fp32_input", r.norm_saves_fp32_input);
    flag("logits_upcast_fp32", r.logits_upcast_fp32);
    // Optional even in a profile written whole (absent: autocast's fp32 residual, RuntimeProfile).
    if (mod.has("replicated_residual"))
      r.replicated_residual_fp32 = mod.get_enum("replicated_residual", {"fp32", "compute-dtype"}) == "fp32";
    flag("logits_kept_by_caller", r.logits_kept_by_caller);
    flag("loss_backward_in_place", r.loss_backward_in_place);
    if (has("checkpoint_region"))
      r.checkpoint_per_unit = mod.get_enum("checkpoint_region", {"layer", "unit"}) == "unit";
    flag("checkpointed_forward_keeps_layer_tensors", r.checkpointed_forward_keeps_layer_tensors);
    flag("eager_softmax_fp32", r.eager_softmax_fp32);
    flag("norm_mean_keeps_input", r.norm_mean_keeps_input);
    flag("pointwise_outputs_saved", r.pointwise_outputs_saved);
    flag("sac_keeps_unread_outputs", r.sac_keeps_unread_outputs);
    flag("fused_elementwise", r.fused_elementwise);
    // Optional even in a profile written whole (absent: PyTorch's eager kernels, RuntimeProfile).
    if (mod.has("norm_kernel")) r.norm_single_kernel = mod.get_enum("norm_kernel", {"eager", "single"}) == "single";
    if (mod.has("rotary_kernel")) {
      const std::string rotary =
          mod.get_enum("rotary_kernel", {"eager", "flash-attn-in-place", "complex", "rotate-half-fp32", "in-place"});
      r.rotary_kernel = rotary == "flash-attn-in-place" ? RotaryKernel::FlashAttnInPlace
                        : rotary == "complex"           ? RotaryKernel::Complex
                        : rotary == "rotate-half-fp32"  ? RotaryKernel::RotateHalfFp32
                        : rotary == "in-place"          ? RotaryKernel::InPlace
                                                        : RotaryKernel::Eager;
    }
    if (mod.has("activation_kernel"))
      r.glu_single_kernel = mod.get_enum("activation_kernel", {"eager", "single"}) == "single";
    if (mod.has("attention_output_copy")) r.attention_output_copy = mod.get_bool("attention_output_copy");
    if (mod.has("mha_qkv_copy_saved")) r.mha_qkv_copy_saved = mod.get_bool("mha_qkv_copy_saved");
    if (mod.has("value_view_keeps_fused_qkv"))
      r.value_view_keeps_fused_qkv = mod.get_bool("value_view_keeps_fused_qkv");
    if (mod.has("kv_repeat")) {
      const std::string repeat = mod.get_enum("kv_repeat", {"never", "always", "without-sdpa-gqa"});
      r.kv_repeat = repeat == "always"             ? KvRepeat::Always
                    : repeat == "without-sdpa-gqa" ? KvRepeat::WithoutSdpaGqa
                                                   : KvRepeat::Never;
    }
    if (mod.has("loss_output_chunks")) {
      r.loss_output_chunks = mod.get_int("loss_output_chunks");
      if (r.loss_output_chunks < 2)
        mod.fail("loss_output_chunks", "must be at least 2 (leave it out for the whole sequence at once)");
    }
    if (mod.has("loss_kernels")) {
      const std::string loss =
          mod.get_enum("loss_kernels", {"log-softmax", "vocab-parallel", "compiled", "fused-linear"});
      r.loss_vocab_parallel_kernels = loss == "vocab-parallel";
      r.loss_compiled = loss == "compiled";
      r.loss_fused_linear = loss == "fused-linear";
    }
  });
  section("sharding", [&](ConfigMap& sh, auto&& has) {
    auto flag = flags_of(sh, has);
    flag("allgather_copy_out", r.allgather_copy_out);
    flag("root_reshard_after_forward", r.root_reshard_after_forward);
    // Optional even in a profile written whole: a runtime that says nothing reshards its last layer unit as the
    // strategy says (FSDP2 fully_shard, FSDP1 and ZeRO-3 apply one setting to every unit); torchtitan.yaml sets it
    // false.
    if (sh.has("last_unit_reshard_after_forward"))
      r.last_unit_reshard_after_forward = sh.get_bool("last_unit_reshard_after_forward");
    const bool split_given = sh.has("pipeline_stage_split");
    if (split_given)
      r.pipeline_split_by_cost = sh.get_enum("pipeline_stage_split", {"layers", "compute-cost"}) == "compute-cost";
    // The compute-cost split names when a stage closes: required where this mapping sets that split (the two rules
    // differ on ties), and a derived profile may give it alone over a base with that split.
    if (sh.has("pipeline_stage_threshold") || (split_given && r.pipeline_split_by_cost)) {
      if (!r.pipeline_split_by_cost)
        sh.fail("pipeline_stage_threshold", "applies only with pipeline_stage_split: compute-cost");
      r.pipeline_stage_closes_on_reaching =
          sh.get_enum("pipeline_stage_threshold", {"exceeded", "reached"}) == "reached";
    }
    if (sh.has("tp_linear_async_overlap")) r.tp_linear_async_overlap = sh.get_bool("tp_linear_async_overlap");
    if (sh.has("tp_sequence_collective_copy"))
      r.tp_sequence_collective_copy = sh.get_bool("tp_sequence_collective_copy");
    if (sh.has("pipeline_reshard_after_backward"))
      r.pipeline_keeps_units_gathered = sh.get_enum("pipeline_reshard_after_backward", {"each", "last"}) == "last";
    if (sh.has("pipeline_outputs_to_step_end")) {
      const std::string kept = sh.get_enum("pipeline_outputs_to_step_end", {"none", "last-stage", "every-stage"});
      r.pipeline_outputs_to_step_end = kept == "every-stage"  ? RuntimeProfile::PipelineOutputsKept::EveryStage
                                       : kept == "last-stage" ? RuntimeProfile::PipelineOutputsKept::LastStage
                                                              : RuntimeProfile::PipelineOutputsKept::None;
    }
    if (sh.has("unsynced_grads_kept_in"))
      r.unsynced_grads_in_reduce_dtype =
          sh.get_enum("unsynced_grads_kept_in", {"compute-dtype", "reduce-dtype"}) == "reduce-dtype";
    if (sh.has("tp_head_output"))
      r.tp_head_output_replicated = sh.get_enum("tp_head_output", {"vocab-parallel", "replicated"}) == "replicated";
    if (sh.has("tp_loss_all_reduces"))
      r.tp_loss_all_reduces_fused = sh.get_enum("tp_loss_all_reduces", {"separate", "fused"}) == "fused";
    if (sh.has("unit_grads_released"))
      r.unit_grads_held_through_reduce_issue =
          sh.get_enum("unit_grads_released", {"after-copy-in", "after-reduce-issue"}) == "after-reduce-issue";
    if (sh.has("offloaded_grads"))
      r.offloaded_grads_kept_on_device =
          sh.get_enum("offloaded_grads", {"to-host-per-reduction", "on-device-until-step"}) == "on-device-until-step";
    if (sh.has("embedding_unit")) r.embedding_own_unit = sh.get_enum("embedding_unit", {"root", "own"}) == "own";
    if (sh.has("tp_loss_backward")) {
      const std::string v = sh.get_enum("tp_loss_backward", {"as-loss", "probabilities-copy", "loss-parallel"});
      r.tp_loss_backward = v == "probabilities-copy" ? RuntimeProfile::TpLossBackward::ProbabilitiesCopy
                           : v == "loss-parallel"    ? RuntimeProfile::TpLossBackward::LossParallel
                                                     : RuntimeProfile::TpLossBackward::AsLoss;
    }
    if (sh.has("tp_norm_grad_sum"))
      r.tp_norm_grad_sum_per_unit = sh.get_enum("tp_norm_grad_sum", {"per-step", "per-unit"}) == "per-unit";
    if (sh.has("sp_column_input_saved"))
      r.sp_saves_column_input_shard = sh.get_enum("sp_column_input_saved", {"gathered", "shard"}) == "shard";
    // Optional too (absent: PyTorch's behaviour): DeepSpeed ZeRO-3's layout and its default reduction dtype.
    for (auto [key, field] : {std::pair{"zero3_master_copy_same_dtype", &r.zero3_master_copy_same_dtype},
                              std::pair{"zero3_grad_partition_persistent", &r.zero3_grad_partition_persistent}})
      if (sh.has(key)) *field = sh.get_bool(key);
    if (sh.has("default_reduce_dtype"))
      r.reduce_in_compute_dtype_by_default = sh.get_enum("default_reduce_dtype", {"fp32", "compute"}) == "compute";
    flag("reduce_dtype_copy_of_grads", r.grads_in_reduce_dtype_before_reduce);
    // Optional (absent: false, per-parameter gradients reduced as they are).
    if (sh.has("flat_grad_cat_in_backward")) r.flat_grad_cat_in_backward = sh.get_bool("flat_grad_cat_in_backward");
    flag("ddp_gradient_as_bucket_view", r.ddp_gradient_as_bucket_view);
    flag("autocast_keeps_weight_casts", r.autocast_caches_weight_casts);
    flag("grads_persist", r.grads_persist);
    flag("replicated_grads_via_flat_copy", r.replicated_grads_via_flat_copy);
    flag("zero_low_precision_params", r.zero_low_precision_params);
    flag("zero_param_gather_per_unit", r.zero_param_gather_per_unit);
    // Optional (absent: 0, no staging copies).
    for (auto [key, field] : {std::pair{"zero_param_gather_replica_copies", &r.zero_param_gather_replica_copies},
                              std::pair{"zero_param_gather_shard_copies", &r.zero_param_gather_shard_copies}})
      if (sh.has(key)) {
        *field = sh.get_double(key);
        if (!(*field >= 0) || !std::isfinite(*field)) sh.fail(key, "must be a non-negative number of copies");
      }
    flag("fp32_grad_accumulation", r.fp32_grad_accumulation);
    flag("zero1_grads_reduced_after_backward", r.zero1_grads_reduced_after_backward);
    if (has("lora_adapters"))
      r.lora_adapters_replicated = sh.get_enum("lora_adapters", {"in_units", "replicated"}) == "replicated";
    if (sh.has("lora_base_dtype"))
      r.lora_base_in_master_dtype = sh.get_enum("lora_base_dtype", {"compute", "master"}) == "master";
  });
  // The software stack (optional in every profile; a derived one overrides it key by key), strictly parsed here
  // (compute/sdpa_dispatch.hpp) and kept as written for the report.
  if (map.has("sdpa")) {
    ConfigMap sd = map.get_map("sdpa");
    if (sd.has("torch_version")) {
      r.torch_version = sd.get_string("torch_version");
      if (!parse_torch_version(r.torch_version))
        sd.fail("torch_version", "'" + r.torch_version + "' is not a torch release: expected e.g. \"2.11.0\"");
    }
    if (sd.has("cudnn_version")) {
      r.cudnn_version = sd.get_string("cudnn_version");
      if (!parse_cudnn_version(r.cudnn_version))
        sd.fail("cudnn_version", "'" + r.cudnn_version + "' is not a cuDNN version: expected e.g. \"9.19\"");
    }
    sd.finish();
  }
  section("training_loop", [&](ConfigMap& loop, auto&& has) {
    auto non_negative = [&](const char* key, double& field, const char* what) {
      if (!has(key)) return;
      field = loop.get_double(key);
      if (!(field >= 0)) loop.fail(key, std::string("must be a non-negative number of ") + what);
    };
    non_negative("adamw_bytes_per_param", r.adamw_bytes_per_param, "bytes");
    non_negative("sgd_bytes_per_param", r.sgd_bytes_per_param, "bytes");
    non_negative("grad_norm_bytes_per_grad", r.grad_norm_bytes_per_grad, "bytes");
    non_negative("grad_pass_bytes_per_grad", r.grad_pass_bytes_per_grad, "bytes");
    if (has("loss_all_reduce")) r.loss_all_reduce = loop.get_bool("loss_all_reduce");
    non_negative("adamw_temporaries_per_param", r.adamw_temporaries_per_param, "elements per parameter");
    non_negative("grad_norm_temporary_bytes_per_grad", r.grad_norm_temporary_bytes_per_grad, "bytes");
    if (has("step_per_unit")) r.step_per_unit = loop.get_bool("step_per_unit");
    // Optional (absent: the usual step under tp too); both keys of the map are required.
    if (loop.has("adamw_under_tp")) {
      ConfigMap tp = loop.get_map("adamw_under_tp");
      RuntimeProfile::AdamwStep step;
      step.bytes_per_param = tp.get_double("bytes_per_param");
      step.temporaries_per_param = tp.get_double("temporaries_per_param");
      if (!(step.bytes_per_param >= 0)) tp.fail("bytes_per_param", "must be a non-negative number of bytes");
      if (!(step.temporaries_per_param >= 0))
        tp.fail("temporaries_per_param", "must be a non-negative number of elements per parameter");
      tp.finish();
      r.adamw_under_tp = step;
    }
    // Optional (absent: 0, no sub-group copies).
    if (loop.has("zero3_step_sub_group_elems")) {
      r.zero3_step_sub_group_elems = loop.get_double("zero3_step_sub_group_elems");
      if (!(r.zero3_step_sub_group_elems >= 0))
        loop.fail("zero3_step_sub_group_elems", "must be a non-negative number of elements");
    }
  });
  // Optional in every profile (absent: no host issue time); a derived profile overrides it key by key, a profile
  // written whole gives every key of the section.
  if (map.has("host_issue")) {
    ConfigMap hi = map.get_map("host_issue");
    const bool inherit = derived && !r.host_issue.empty();
    for (auto [key, field] : {std::pair{"layer_forward", &r.host_issue.layer_forward},
                              std::pair{"layer_backward", &r.host_issue.layer_backward},
                              std::pair{"head_forward", &r.host_issue.head_forward},
                              std::pair{"head_backward", &r.host_issue.head_backward}})
      if (given(hi, key, inherit)) {
        *field = hi.get_duration(key);
        if (!(field->value >= 0) || !std::isfinite(field->value)) hi.fail(key, "must be a non-negative duration");
      }
    if (given(hi, "scope", inherit))
      r.host_issue.tensor_parallel_only = hi.get_enum("scope", {"tensor-parallel", "all"}) == "tensor-parallel";
    hi.finish();
  }
  // Optional in every profile (absent: the runtime runs every mesh the simulator prices); a derived profile
  // overrides it key by key.
  if (map.has("mesh")) {
    ConfigMap mesh = map.get_map("mesh");
    for (auto [key, field] :
         {std::pair{"tensor_parallel", &r.support.tensor_parallel},
          std::pair{"sequence_parallel", &r.support.sequence_parallel}, std::pair{"async_tp", &r.support.async_tp},
          std::pair{"pipeline_parallel", &r.support.pipeline_parallel},
          std::pair{"interleaved_pipeline", &r.support.interleaved_pipeline},
          std::pair{"pipeline_tied_embeddings", &r.support.pipeline_tied_embeddings},
          std::pair{"offload", &r.support.mesh_offload}, std::pair{"tp_with_zero3", &r.support.tp_with_zero3},
          std::pair{"expert_parallel", &r.support.expert_parallel}})
      if (mesh.has(key)) *field = mesh.get_bool(key);
    mesh.finish();
  }
  // Optional (absent: the runtime runs float8 linears and their float8 all-gather, as the simulator prices them).
  if (map.has("float8")) {
    ConfigMap f8 = map.get_map("float8");
    for (auto [key, field] :
         {std::pair{"linears", &r.support.float8_linears}, std::pair{"all_gather", &r.support.float8_all_gather}})
      if (f8.has(key)) *field = f8.get_bool(key);
    if (f8.has("compiled_runtime")) {
      const std::string twin = f8.get_string("compiled_runtime");
      // The name a refusal offers for --runtime: a shipped profile's.
      std::error_code ec;
      if (twin != "none" && !std::filesystem::is_regular_file(runtime_dir(config_root) / (twin + ".yaml"), ec))
        f8.fail("compiled_runtime", "'" + twin + "' is not a shipped runtime (configs/runtimes/" + twin + ".yaml)");
      r.support.float8_compiled_runtime = twin == "none" ? "" : twin;
    }
    f8.finish();
  }
  // Optional (absent: every data-parallel strategy and offload mode the simulator prices); a derived profile overrides
  // each list whole.
  if (map.has("runs")) {
    ConfigMap runs = map.get_map("runs");
    // Each list: names `parse` reads (else an error naming the key and what the names are), replacing the base's.
    auto read_list = [&runs](const char* key, auto& out, auto parse, const char* what) {
      if (!runs.has(key)) return;
      out.clear();
      for (const std::string& name : runs.get_string_list(key)) {
        typename std::remove_reference_t<decltype(out)>::value_type v;
        if (!parse(name, v)) runs.fail(key, "'" + name + "' is not " + what);
        out.push_back(v);
      }
    };
    read_list("strategies", r.support.strategies, parse_strategy_kind,
              "a strategy (ddp, no-shard, zero1, zero2, zero3, fsdp, fsdp-grad-op, hsdp)");
    if (runs.has("strategies") && r.support.strategies.empty()) runs.fail("strategies", "names no strategy");
    read_list("offload", r.support.offloads, parse_offload, "an offload mode (none, optimizer, params)");
    if (!r.support.runs(Offload::None)) runs.fail("offload", "must include none");
    read_list("act_ckpt", r.support.ckpt_policies, parse_ckpt_policy,
              "a checkpointing policy (none, full, selective, selective-op, every, fraction)");
    if (!r.support.runs(CkptPolicy::None)) runs.fail("act_ckpt", "must include none");
    read_list("wrap", r.support.wraps, parse_wrap_family, "a wrap family (layer, every, size, model)");
    if (!r.support.runs(WrapKind::Layer)) runs.fail("wrap", "must include layer");
    if (runs.has("document_masking")) r.support.document_masking = runs.get_bool("document_masking");
    if (runs.has("flash_attention_3")) r.support.flash_attention_3 = runs.get_bool("flash_attention_3");
    if (runs.has("flex_attention")) r.support.flex_attention = runs.get_bool("flex_attention");
    if (runs.has("liger_kernel")) r.support.liger_kernel = runs.get_bool("liger_kernel");
    runs.finish();
  }
  r.support.runtime_name = r.name;
  r.support.config_root = config_root;
  map.finish();
  return r;
}

RuntimeProfile load_file(const std::string& path, const std::string& config_root, Chain& chain) {
  ConfigMap map = ConfigMap::load_file(path);
  chain.emplace_back(canonical(path), path);
  RuntimeProfile r = parse(map, path, config_root, chain);
  chain.pop_back();
  return r;
}

}  // namespace

RuntimeProfile load_runtime(const std::string& name_or_path, const std::string& config_root) {
  const std::string path = resolve_config(name_or_path, runtime_dir(config_root), "--runtime", "runtime");
  Chain chain;
  return load_file(path, config_root, chain);
}

std::string shipped_runtimes_running(const std::string& config_root, bool RuntimeSupport::*flag) {
  static std::mutex mu;
  static std::map<std::string, std::vector<RuntimeSupport>> shipped;  // by root, sorted by name
  const std::lock_guard<std::mutex> lock(mu);
  auto it = shipped.find(config_root);
  if (it == shipped.end()) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(runtime_dir(config_root), ec))
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
    std::sort(names.begin(), names.end());
    std::vector<RuntimeSupport> supports;
    for (const std::string& name : names) {
      try {
        supports.push_back(load_runtime(name, config_root).support);
      } catch (const InputError&) {
        // A profile that does not load is refused where it is named; it offers nothing here.
      }
    }
    it = shipped.emplace(config_root, std::move(supports)).first;
  }
  std::string out;
  for (const RuntimeSupport& s : it->second)
    if (s.*flag) out += (out.empty() ? "" : ", ") + s.runtime_name;
  return out;
}

}  // namespace fsdp
