// Issue M15: the mesh's pieces that need no peers: row splits, pipeline stages, the tensor-parallel parameter
// slices, and the refusals of meshes fsdp-run cannot run (one message naming the plan key).
#include <set>

#include "core/errors.hpp"
#include "model/tensor_parallel.hpp"
#include "model/transformer.hpp"
#include "shard/mesh.hpp"
#include "test_common.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec::test {

TEST_CASE("mesh: row splits, pipeline stages and tensor-parallel slices cover every parameter once") {
  // 251 rows over 2: 126 + 125; over 4: 63, 63, 63, 62.
  CHECK(split_rows(251, 2, 0).size == 126);
  CHECK(split_rows(251, 2, 1).start == 126);
  CHECK(split_rows(251, 2, 1).size == 125);
  CHECK(split_rows(251, 4, 3).start == 189);
  CHECK(split_rows(251, 4, 3).size == 62);
  CHECK(stage_layers(3, 2, 0) == std::make_pair(0, 1));
  CHECK(stage_layers(3, 2, 1) == std::make_pair(2, 2));
  CHECK(stage_layers(4, 4, 3) == std::make_pair(3, 3));

  ModelSpec m = small_model();
  m.hidden_size = 64;
  m.num_heads = 4;
  m.head_dim = 16;
  for (int64_t kv : {1, 2, 4}) {
    m.num_kv_heads = kv;
    const std::vector<ParamDef> full = model_param_defs(m);
    for (int tp : {2, 4}) {
      if (kv % tp != 0 && tp % kv != 0) continue;
      CAPTURE(kv);
      CAPTURE(tp);
      // Each parameter's slices, over the tp ranks, cover its rows exactly once (the kv heads of a kv group once
      // per group), and the gradient norm counts every element once.
      std::vector<std::vector<ParamDef>> ranks;
      for (int r = 0; r < tp; ++r) ranks.push_back(tp_param_defs(full, m, tp, r, true));
      for (std::size_t i = 0; i < full.size(); ++i) {
        int64_t counted = 0;
        std::set<std::pair<int64_t, int64_t>> slices;
        for (int r = 0; r < tp; ++r) {
          const ParamDef& d = ranks[static_cast<std::size_t>(r)][i];
          CHECK(d.whole_shape() == full[i].shape);
          if (d.counts_in_norm) counted += d.numel();
          if (d.tp_dim >= 0) slices.insert({d.tp_start, d.shape[static_cast<std::size_t>(d.tp_dim)]});
        }
        CHECK(counted == full[i].numel());
        if (slices.empty()) continue;
        int64_t next = 0;
        for (const auto& [start, size] : slices) {
          CHECK(start == next);
          next = start + size;
        }
        CHECK(next == full[i].shape[static_cast<std::size_t>(ranks[0][i].tp_dim)]);
      }
      // Under tensor parallelism every norm's gradient is partial (sequence parallelism); kv replicated below tp.
      const ParamDef& k = ranks[0][3];
      REQUIRE(k.name == "model.layers.0.self_attn.k_proj.weight");
      CHECK((k.grad_sum == TpGradSum::KvGroup) == (kv < tp));
      CHECK(ranks[0][1].grad_sum == TpGradSum::Tensor);  // input_layernorm
      CHECK(tp_param_defs(full, m, tp, 0, false)[1].grad_sum == TpGradSum::None);
    }
  }
}

TEST_CASE("mesh refusals: one message naming the plan key") {
  ModelSpec m = small_model();  // 3 heads, 1 kv head, 3 layers
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.seq_len = 24;
  auto refused = [&](int world) {
    try {
      check_mesh_supported(m, s, world);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  s.mesh.tp = 2;
  CHECK(refused(2).find("strategy.tp 2 does not divide the model's num_heads 3") != std::string::npos);
  CHECK(refused(3).find("does not divide the world size 3") != std::string::npos);
  s.mesh.tp = 3;
  CHECK(refused(3).empty());
  s.seq_len = 25;
  CHECK(refused(3).find("strategy.seq_len 25 is not divisible by strategy.tp 3") != std::string::npos);
  s.mesh.sequence_parallel = false;
  CHECK(refused(3).empty());
  s.mesh.async_tp = true;
  CHECK(refused(3).find("strategy.async_tp") != std::string::npos);
  s.mesh = MeshSpec{};
  s.mesh.pp = 4;
  CHECK(refused(4).find("strategy.pp 4 exceeds the model's num_layers 3") != std::string::npos);
  s.mesh.pp = 2;
  s.mesh.pp_schedule = PipelineSchedule::Interleaved1F1B;
  CHECK(refused(2).find("interleaved-1f1b") != std::string::npos);
  s.mesh.pp_schedule = PipelineSchedule::OneFOneB;
  CHECK(refused(2).empty());
  m.tied_embeddings = true;
  CHECK(refused(2).find("tied embeddings") != std::string::npos);
  m.tied_embeddings = false;
  s.kind = StrategyKind::Hsdp;
  s.hsdp_group = 2;
  CHECK(refused(2).find("hsdp_group 2 must divide the data-parallel size 1") != std::string::npos);
  CHECK(refused(4).empty());
  // Through the plan check fsdp-run runs before any rank starts.
  PlanFile p = small_plan(StrategyKind::Fsdp, "layer", 4);
  p.strategy.mesh.tp = 2;
  CHECK_THROWS_WITH_AS(check_plan_runnable(p), doctest::Contains("strategy.tp 2"), InputError);
  p.strategy.mesh.tp = 1;
  p.model = small_moe_model();
  p.strategy.mesh.pp = 2;
  CHECK_NOTHROW(check_plan_runnable(p));
}

}  // namespace fsdp::exec::test
