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

StageLayers stage_layers_by_cost(const ModelSpec& m, int64_t pp, int64_t stage) {
  FSDP_ASSERT(pp >= 1 && stage >= 0 && stage < pp, "pipeline stage out of range");
  const double h = static_cast<double>(m.hidden_size);
  const double layer = 4.0 * static_cast<double>(m.num_heads * m.head_dim) * h +
                       (m.gated_mlp ? 3.0 : 2.0) * static_cast<double>(m.ffn_size) * h;
  const double head = static_cast<double>(m.vocab_size) * h;
  const double total = static_cast<double>(m.num_layers) * layer + head;
  StageLayers out{-1, -2};
  int64_t rank = 0;
  double cumulative = 0;  // the embedding costs nothing: it stays on stage 0 and moves no threshold
  for (int64_t l = 0; l < m.num_layers; ++l) {
    if (rank == stage) {
      if (out.first < 0) out.first = l;
      out.last = l;
    }
    cumulative += layer;
    if (rank < pp - 1 && cumulative > total * static_cast<double>(rank + 1) / static_cast<double>(pp)) ++rank;
  }
  if (out.first < 0) out = StageLayers{0, -1};  // a stage left with the head alone
  return out;
}

bool stage_holds(const ModuleGraph& g, ModuleId module, int64_t stage, int64_t pp) {
  switch (g.node(module).kind) {
    case ModuleKind::Embedding:
    case ModuleKind::PositionEmbedding:
    case ModuleKind::Vision:
      return stage == 0;
    case ModuleKind::Norm:
    case ModuleKind::Head:
    case ModuleKind::Loss:
      return stage == pp - 1;
    default:
      return true;
  }
}

std::vector<WrapUnit> stage_units(const ModuleGraph& g, const std::vector<WrapUnit>& units, const StageLayers& layers,
                                  int64_t stage, int64_t pp) {
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
        if (g.node(m).kind != ModuleKind::LayerStack && stage_holds(g, m, stage, pp)) c.params += g.params_under(m);
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

}  // namespace fsdp
