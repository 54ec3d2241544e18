#include "program/pipeline_parallel.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace fsdp {

StageLayers stage_layers(int64_t num_layers, int64_t pp, int64_t virtual_stages, int64_t stage) {
  FSDP_ASSERT(pp >= 1 && virtual_stages >= 1 && stage >= 0 && stage < pp, "pipeline stage out of range");
  const int64_t chunks = pp * virtual_stages;
  FSDP_ASSERT(chunks <= num_layers, "capabilities refuse fewer layers than model chunks");
  const int64_t base = num_layers / chunks, extra = num_layers % chunks;
  auto chunk_layers = [&](int64_t c) { return base + (c < extra ? 1 : 0); };
  auto rank_layers = [&](int64_t r) {
    int64_t n = 0;
    for (int64_t c = r; c < chunks; c += pp) n += chunk_layers(c);
    return n;
  };
  StageLayers out;
  for (int64_t r = 0; r < stage; ++r) out.first += rank_layers(r);
  out.last = out.first + rank_layers(stage) - 1;
  return out;
}

StageLayers graph_stage_layers(const StageLayers& decoder, int64_t vision, int64_t stage) {
  FSDP_ASSERT(vision >= 0, "a graph has at least its decoder layers");
  StageLayers out{decoder.first + vision, decoder.last + vision};
  if (stage == 0) out.first = 0;
  return out;
}

CostSplit pipeline_split_by_cost(const ModelSpec& m, int64_t pp, StageClose closes) {
  FSDP_ASSERT(pp >= 1, "pipeline stages at least 1");
  // LlamaModel.get_block_compute_costs (llama.py @ 67c5ebb6): integers, as Python computes them.
  const int64_t d_qkv = m.hidden_size / m.num_heads;
  const int64_t layer = 4 * m.num_heads * d_qkv * m.hidden_size + 3 * m.ffn_size * m.hidden_size;
  const int64_t head = m.vocab_size * m.hidden_size;
  // The blocks in module order and their costs: embedding, decoder layers, final norm, lm_head, cast, loss.
  std::vector<int64_t> costs{0};
  for (int64_t l = 0; l < m.num_layers; ++l) costs.push_back(layer);
  costs.insert(costs.end(), {0, head, 0, 0});
  int64_t total = 0;
  for (int64_t c : costs) total += c;  // np.cumsum(...)[-1]
  // base.py build_model: thresholds = [cumsum[-1] * ((rank + 1) / pp_size)] in float64; the block is built on the
  // current rank, which moves on once the block's cumulative cost is above the rank's threshold (`closes`: or at it).
  std::vector<int64_t> rank_of;
  int64_t rank = 0, cumulative = 0;
  for (int64_t c : costs) {
    FSDP_ASSERT(rank < pp, "build_model asserts target_pp_rank_idx < pp_size (the last threshold is the total)");
    rank_of.push_back(rank);
    cumulative += c;
    const double threshold = static_cast<double>(total) * (static_cast<double>(rank + 1) / static_cast<double>(pp));
    const double reached = static_cast<double>(cumulative);
    // The last rank's threshold is the total: under Reached the head reaches it before the cost-0 cast and loss,
    // which stay on that rank (the runs built them there: the 1B pp 4's last stage computed its loss).
    if (rank + 1 < pp && (closes == StageClose::Reached ? reached >= threshold : reached > threshold)) ++rank;
  }
  CostSplit out;
  out.layer_stage.assign(rank_of.begin() + 1, rank_of.begin() + 1 + m.num_layers);
  const size_t tail = static_cast<size_t>(m.num_layers) + 1;
  out.norm_stage = rank_of[tail];
  out.head_stage = rank_of[tail + 1];
  out.cast_stage = rank_of[tail + 2];
  out.loss_stage = rank_of[tail + 3];
  return out;
}

StageLayers stage_layers_in(const CostSplit& split, int64_t stage) {
  StageLayers out{-1, -2};
  for (size_t l = 0; l < split.layer_stage.size(); ++l)
    if (split.layer_stage[l] == stage) {
      if (out.first < 0) out.first = static_cast<int64_t>(l);
      out.last = static_cast<int64_t>(l);
    }
  if (out.first < 0) out = StageLayers{0, -1};  // a stage without decoder layers (the head's, the loss's)
  return out;
}

StageLayers stage_layers_by_cost(const ModelSpec& m, int64_t pp, int64_t stage, StageClose closes) {
  FSDP_ASSERT(pp >= 1 && stage >= 0 && stage < pp, "pipeline stage out of range");
  return stage_layers_in(pipeline_split_by_cost(m, pp, closes), stage);
}

PipelineTail pipeline_tail(const ModelSpec& m, int64_t pp, bool by_cost, StageClose closes) {
  if (pp <= 1) return PipelineTail{};
  if (!by_cost) return PipelineTail{pp - 1, pp - 1};
  return pipeline_tail(pipeline_split_by_cost(m, pp, closes));
}

PipelineTail pipeline_tail(const CostSplit& split) { return PipelineTail{split.head_stage, split.loss_stage}; }

bool stage_holds(const ModuleGraph& g, ModuleId module, int64_t stage, const PipelineTail& tail) {
  switch (g.node(module).kind) {
    case ModuleKind::Embedding:
    case ModuleKind::PositionEmbedding:
    case ModuleKind::Vision:
      return stage == 0;
    case ModuleKind::Norm:
    case ModuleKind::Head:
      return stage == tail.head_stage;
    case ModuleKind::Loss:
      return stage == tail.loss_stage;
    default:
      return true;
  }
}

bool stage_root_holds(const ModuleGraph& g, ModuleId module, int64_t stage, const PipelineTail& tail) {
  const ModuleNode& n = g.node(module);
  if (n.kind == ModuleKind::LayerStack) return !n.runs && stage == 0;
  return stage_holds(g, module, stage, tail);
}

std::vector<WrapUnit> stage_units(const ModuleGraph& g, const std::vector<WrapUnit>& units, const StageLayers& layers,
                                  int64_t stage, const PipelineTail& tail) {
  std::vector<WrapUnit> out;
  auto layer_params = [&](int64_t first, int64_t last) {
    int64_t p = 0;
    for (int64_t l = first; l <= last; ++l) p += g.params_under(g.layers()[static_cast<size_t>(l)]);
    return p;
  };
  for (const WrapUnit& u : units) {
    WrapUnit c = u;
    if (u.num_layers() > 0) {
      c.first_layer = std::max(u.first_layer, layers.first);
      c.last_layer = std::min(u.last_layer, layers.last);
      if (c.first_layer > c.last_layer) {
        if (!u.is_root) continue;
        c.first_layer = c.last_layer = -1;
      }
    }
    if (u.is_root) {
      c.params = c.num_layers() > 0 ? layer_params(c.first_layer, c.last_layer) : 0;
      for (ModuleId m : g.children(g.root()))
        if (stage_root_holds(g, m, stage, tail)) c.params += g.params_under(m);
    } else {
      c.params = layer_params(c.first_layer, c.last_layer);
      if (c.first_layer != u.first_layer || c.last_layer != u.last_layer)
        c.name = c.first_layer == c.last_layer
                     ? "layers." + std::to_string(c.first_layer)
                     : "layers." + std::to_string(c.first_layer) + "-" + std::to_string(c.last_layer);
    }
    out.push_back(std::move(c));
  }
  return out;
}

double in_flight_micro_batches(const MeshSpec& mesh, int64_t stage, int64_t micro_batches) {
  const int64_t p = mesh.pp, m = micro_batches;
  if (p <= 1) return 1.0;
  switch (mesh.pp_schedule) {
    case PipelineSchedule::GPipe:
      return static_cast<double>(m);
    case PipelineSchedule::OneFOneB:
      return static_cast<double>(std::min(m, p - stage));
    case PipelineSchedule::Interleaved1F1B: {
      const int64_t v = mesh.pp_virtual_stages;
      const int64_t warmup = (v - 1) * p + 2 * (p - 1 - stage);
      return static_cast<double>(std::min(m * v, warmup + 1)) / static_cast<double>(v);
    }
  }
  return 1.0;
}

double in_flight_loss_micro_batches(const MeshSpec& mesh, int64_t stage, int64_t micro_batches) {
  if (mesh.pp > 1 && mesh.pp_schedule == PipelineSchedule::Interleaved1F1B) return 1.0;
  return in_flight_micro_batches(mesh, stage, micro_batches);
}

double pipeline_bubble_s(const MeshSpec& mesh, double micro_batch_s) {
  if (mesh.pp <= 1) return 0.0;
  const double v =
      mesh.pp_schedule == PipelineSchedule::Interleaved1F1B ? static_cast<double>(mesh.pp_virtual_stages) : 1.0;
  return static_cast<double>(mesh.pp - 1) / v * micro_batch_s;
}

double pipeline_fill_drain_s(const MeshSpec& mesh, const std::vector<double>& stage_micro_batch_s, size_t slowest) {
  FSDP_ASSERT(slowest < stage_micro_batch_s.size(), "the slowest stage is one of the stages");
  if (mesh.pp <= 1) return 0.0;
  if (mesh.pp_schedule == PipelineSchedule::Interleaved1F1B)
    return pipeline_bubble_s(mesh, stage_micro_batch_s[slowest]);
  FSDP_ASSERT(static_cast<int64_t>(stage_micro_batch_s.size()) == mesh.pp, "one time per pipeline stage");
  double others = 0;
  for (size_t j = 0; j < stage_micro_batch_s.size(); ++j)
    if (j != slowest) others += stage_micro_batch_s[j];
  return others;
}

int pipeline_transfers_per_micro_batch(const MeshSpec& mesh) {
  return mesh.pp_schedule == PipelineSchedule::Interleaved1F1B ? static_cast<int>(mesh.pp_virtual_stages) : 1;
}

int64_t pipeline_warmup(PipelineSchedule schedule, int64_t pp, int64_t stage, int64_t micro_batches) {
  if (schedule == PipelineSchedule::GPipe) return micro_batches;
  return std::min(std::max<int64_t>(pp - stage - 1, 0), micro_batches);
}

bool pipeline_orders_passes(PipelineSchedule schedule, int64_t pp) {
  return pp > 1 && schedule != PipelineSchedule::Interleaved1F1B;
}

bool pipeline_kept_unit_gathered_in_forward(PipelineSchedule schedule, int64_t pp, int64_t stage, int64_t micro_batches,
                                            int64_t k) {
  if (!pipeline_orders_passes(schedule, pp)) return true;
  return k == 0 || k > pipeline_warmup(schedule, pp, stage, micro_batches);
}

bool pipeline_kept_unit_regathered_in_backward(PipelineSchedule schedule, int64_t pp, int64_t stage,
                                               int64_t micro_batches, int64_t k) {
  if (!pipeline_orders_passes(schedule, pp)) return false;
  return k >= std::max<int64_t>(micro_batches - pipeline_warmup(schedule, pp, stage, micro_batches), 1);
}

}  // namespace fsdp
