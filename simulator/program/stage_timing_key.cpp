#include "program/stage_timing_key.hpp"

#include <algorithm>

#include "program/pipeline_parallel.hpp"
#include "program/step_trace.hpp"

namespace fsdp {

std::optional<StageTimingKey> stage_timing_key(const ModuleGraph& g, const Strategy& s, const RuntimeProfile& rt,
                                               const std::vector<WrapUnit>& units, int64_t stage) {
  const MeshSpec& mesh = s.mesh;
  if (mesh.pp < 3 || stage <= 0 || stage >= mesh.pp - 1) return std::nullopt;
  if (mesh.pp_schedule == PipelineSchedule::Interleaved1F1B || mesh.pp_virtual_stages != 1) return std::nullopt;
  if (rt.pipeline_split_by_cost) return std::nullopt;
  // The even split (emit_step_program's, by_cost false): the stage's layers.
  const StageLayers layers = graph_stage_layers(
      stage_layers(g.spec().num_layers, mesh.pp, mesh.pp_virtual_stages, stage), g.first_decoder_layer(), stage);
  StageTimingKey key;
  constexpr int64_t kModes = 8;  // more than ActCkpt's values
  for (int64_t l = layers.first; l <= layers.last; ++l) {
    key.layers.push_back(g.layer_classes()[static_cast<size_t>(l)] * kModes + static_cast<int64_t>(layer_ckpt(s, l)));
    key.layers.push_back(g.params_under(g.layers()[static_cast<size_t>(l)]));
  }
  // The units stage_units keeps, clipped to the stage's layers as it clips them (without their names and parameters,
  // which it derives from the layers).
  for (const WrapUnit& u : units) {
    StageTimingKey::Unit k;
    k.is_root = u.is_root;
    if (u.num_layers() > 0) {
      const int64_t first = std::max(u.first_layer, layers.first), last = std::min(u.last_layer, layers.last);
      if (first > last && !u.is_root) continue;
      if (first <= last) {
        k.first = first - layers.first;
        k.last = last - layers.first;
      }
    }
    key.units.push_back(k);
  }
  // The micro-batches the program emits (StepLayout::micro_batches_emitted: the first, one middle, the last).
  for (int k : emitted_micro_batches(s.grad_accum))
    key.kept_gathers.push_back(
        2 * pipeline_kept_unit_gathered_in_forward(mesh.pp_schedule, mesh.pp, stage, s.grad_accum, k) +
        pipeline_kept_unit_regathered_in_backward(mesh.pp_schedule, mesh.pp, stage, s.grad_accum, k));
  return key;
}

}  // namespace fsdp
