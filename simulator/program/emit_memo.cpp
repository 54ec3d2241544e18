#include "program/emit_memo.hpp"

#include <utility>

#include "core/errors.hpp"

namespace fsdp {

// A field added to the activation query, the LoRA spec or the mesh may be one the derivations read: it must join
// CostKey (or be shown not read) before these sizes are updated.
// The LoRA fields (frozen_base, adapted, lora_rank, vision_unadapted) are the strategy's method, target modules, rank
// and train_vision, which CostKey holds.
static_assert(sizeof(ActivationQuery) == 72, "ActivationQuery changed: review EmitMemo::CostKey");
static_assert(sizeof(LoraSpec) == 32, "LoraSpec changed: review EmitMemo::CostKey");
static_assert(sizeof(MeshSpec) == 48, "MeshSpec changed: review EmitMemo::CostKey");

EmitMemo::CostKey EmitMemo::cost_key(const ActivationQuery& q, const Strategy& s) {
  return CostKey{q.compute,
                 q.attention,
                 q.seq_len,
                 q.autocast_fp32_residual,
                 q.norm_fp32_internal,
                 q.logits_upcast_fp32,
                 q.softmax_fp32,
                 q.norm_mean_keeps_input,
                 q.pointwise_outputs_saved,
                 q.sac_keeps_unread_outputs,
                 q.mha_qkv_copy_saved,
                 q.value_view_keeps_fused_qkv,
                 q.kv_repeated,
                 q.kv_repeated_windowed,
                 s.seq_len,
                 s.micro_batch,
                 s.param_dtype,
                 s.method,
                 s.lora.rank,
                 s.lora.target_modules,
                 s.act_ckpt,
                 s.ckpt_every,
                 s.ckpt_fraction,
                 s.mesh.tp,
                 s.mesh.sequence_parallel,
                 s.float8,
                 s.train_vision,
                 s.mesh.ep,
                 s.kernels};
}

void EmitMemo::bind(const ModuleGraph& g, const RuntimeProfile& rt) {
  if (graph_ == nullptr) graph_ = &g;
  if (runtime_ == nullptr) runtime_ = &rt;
  FSDP_ASSERT(graph_ == &g && runtime_ == &rt, "an emit memo serves one graph and one runtime");
}

const std::vector<WrapUnit>& EmitMemo::strategy_units(const ModuleGraph& g, const Strategy& s) {
  if (graph_ == nullptr) graph_ = &g;
  FSDP_ASSERT(graph_ == &g, "an emit memo serves one graph");
  const WrapPolicy policy = strategy_wrap_policy(s);
  const auto key = std::make_tuple(policy.kind, policy.every_k, policy.min_params);
  auto it = units_.find(key);
  if (it == units_.end()) it = units_.emplace(key, build_wrap_units(g, policy)).first;
  return it->second;
}

const EmitMemo::LayerClasses* EmitMemo::find(const CostKey& key) const {
  const auto it = classes_.find(key);
  return it == classes_.end() ? nullptr : &it->second;
}

void EmitMemo::store(CostKey key, LayerClasses classes) { classes_.emplace(std::move(key), std::move(classes)); }

}  // namespace fsdp
