#include "runtime/runtime_profile.hpp"

#include <filesystem>

#include "core/config_map.hpp"
#include "core/config_path.hpp"
#include "core/errors.hpp"

namespace fsdp {

RuntimeProfile load_runtime(const std::string& name_or_path, const std::string& config_root) {
  const std::string path =
      resolve_config(name_or_path, std::filesystem::path(config_root) / "configs" / "runtimes", "--runtime", "runtime");
  ConfigMap map = ConfigMap::load_file(path);
  RuntimeProfile r;
  r.source = path;
  r.name = map.get_string("name");
  ConfigMap alloc = map.get_map("allocator");
  r.allocation_rounding = alloc.get_bytes("rounding");
  r.fragmentation_fraction = alloc.get_double("fragmentation_fraction");
  if (r.fragmentation_fraction < 0 || r.fragmentation_fraction > 1)
    alloc.fail("fragmentation_fraction", "must be within [0, 1]");
  alloc.finish();
  r.context_memory = map.get_bytes("context_memory");
  r.nccl_memory_per_communicator = map.get_bytes("nccl_memory_per_communicator");
  ConfigMap mod = map.get_map("modules");
  r.norm_saves_fp32_input = mod.get_bool("norm_saves_fp32_input");
  r.logits_upcast_fp32 = mod.get_bool("logits_upcast_fp32");
  r.logits_kept_by_caller = mod.get_bool("logits_kept_by_caller");
  r.checkpoint_per_unit = mod.get_enum("checkpoint_region", {"layer", "unit"}) == "unit";
  r.checkpointed_forward_keeps_layer_tensors = mod.get_bool("checkpointed_forward_keeps_layer_tensors");
  r.eager_softmax_fp32 = mod.get_bool("eager_softmax_fp32");
  r.norm_mean_keeps_input = mod.get_bool("norm_mean_keeps_input");
  mod.finish();
  ConfigMap sh = map.get_map("sharding");
  r.allgather_copy_out = sh.get_bool("allgather_copy_out");
  r.root_reshard_after_forward = sh.get_bool("root_reshard_after_forward");
  // Optional: a runtime that says nothing reshards its last layer unit as the strategy says (FSDP2 fully_shard,
  // FSDP1 and ZeRO-3 apply one setting to every unit); torchtitan.yaml sets it false.
  if (sh.has("last_unit_reshard_after_forward"))
    r.last_unit_reshard_after_forward = sh.get_bool("last_unit_reshard_after_forward");
  r.grads_in_reduce_dtype_before_reduce = sh.get_bool("reduce_dtype_copy_of_grads");
  r.ddp_gradient_as_bucket_view = sh.get_bool("ddp_gradient_as_bucket_view");
  r.autocast_caches_weight_casts = sh.get_bool("autocast_keeps_weight_casts");
  r.grads_persist = sh.get_bool("grads_persist");
  r.replicated_grads_via_flat_copy = sh.get_bool("replicated_grads_via_flat_copy");
  r.zero_low_precision_params = sh.get_bool("zero_low_precision_params");
  r.zero_param_gather_per_unit = sh.get_bool("zero_param_gather_per_unit");
  r.lora_adapters_replicated = sh.get_enum("lora_adapters", {"in_units", "replicated"}) == "replicated";
  sh.finish();
  ConfigMap loop = map.get_map("training_loop");
  auto non_negative = [&](const char* key) {
    const double v = loop.get_double(key);
    if (!(v >= 0)) loop.fail(key, "must be a non-negative number of bytes");
    return v;
  };
  r.adamw_bytes_per_param = non_negative("adamw_bytes_per_param");
  r.sgd_bytes_per_param = non_negative("sgd_bytes_per_param");
  r.grad_norm_bytes_per_grad = non_negative("grad_norm_bytes_per_grad");
  r.grad_pass_bytes_per_grad = non_negative("grad_pass_bytes_per_grad");
  r.loss_all_reduce = loop.get_bool("loss_all_reduce");
  r.adamw_temporaries_per_param = loop.get_double("adamw_temporaries_per_param");
  if (!(r.adamw_temporaries_per_param >= 0))
    loop.fail("adamw_temporaries_per_param", "must be a non-negative number of elements per parameter");
  r.grad_norm_temporary_bytes_per_grad = non_negative("grad_norm_temporary_bytes_per_grad");
  r.step_per_unit = loop.get_bool("step_per_unit");
  loop.finish();
  map.finish();
  return r;
}

}  // namespace fsdp
