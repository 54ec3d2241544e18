// Issue M15: the mesh's pieces that need no peers: row splits, pipeline stages, the tensor-parallel parameter
// slices, and the refusals of meshes fsdp-run cannot run (one message naming the plan key).
#include <set>

#include "core/errors.hpp"
#include "model/tensor_parallel.hpp"
#include "model/transformer.hpp"
#include "runtime/runtime_profile.hpp"
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

TEST_CASE("mesh refusals: the capability table's first violation, one message naming the plan key") {
  ModelSpec m = small_model();  // 3 heads, 1 kv head, 3 layers, ffn 91
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
  CHECK(refused(2) == "strategy.tp: tp 2 does not divide the 3 attention heads of exec-test");
  CHECK(refused(3) == "strategy.tp: tp 2 x pp 1 = 2 does not divide the 3 GPUs");
  s.mesh.tp = 3;
  CHECK(refused(3).empty());  // ffn 91 splits unevenly over 3 (uneven_ffn_split)
  s.seq_len = 25;
  CHECK(refused(3).find("strategy.seq_len: sequence parallelism splits the sequence over tp: 25 tokens are not "
                        "divisible by tp 3") == 0);
  s.mesh.sequence_parallel = false;
  CHECK(refused(3).empty());
  s.mesh.async_tp = true;
  CHECK(refused(3) == "strategy.async_tp: fsdp-run does not run async tensor parallelism");
  s.mesh = MeshSpec{};
  s.mesh.pp = 4;
  CHECK(refused(4) ==
        "strategy.pp: pp 4 x 1 virtual stages = 4 model chunks, more than the 3 decoder layers of "
        "exec-test");
  s.mesh.pp = 2;
  s.mesh.pp_schedule = PipelineSchedule::Interleaved1F1B;
  s.mesh.pp_virtual_stages = 2;
  s.grad_accum = 2;
  m.num_layers = 4;  // 2 stages x 2 virtual stages: one layer each
  CHECK(refused(2) == "strategy.pp_schedule: fsdp-run does not run interleaved-1f1b");
  m.num_layers = 3;
  s.mesh.pp_virtual_stages = 1;
  CHECK(refused(2).find("strategy.pp_virtual_stages: interleaved-1f1b") == 0);
  s.mesh.pp_schedule = PipelineSchedule::OneFOneB;
  s.grad_accum = 1;
  CHECK(refused(2).empty());
  // ZeRO-2 under a pipeline: DeepSpeed refuses it and the simulator does not price it; fsdp-run runs it.
  s.kind = StrategyKind::Zero2;
  CHECK(refused(2).empty());
  s.kind = StrategyKind::Fsdp;
  m.tied_embeddings = true;
  CHECK(refused(2).find("strategy.pp: pp 2 with the tied embeddings of exec-test: ") == 0);
  CHECK(refused(2).find("which fsdp-run does not synchronise") != std::string::npos);
  m.tied_embeddings = false;
  s.kind = StrategyKind::Hsdp;
  s.hsdp_group = 2;
  CHECK(refused(2) == "strategy.hsdp_group: 2 does not divide the data-parallel degree 1 (world / (tp x pp))");
  CHECK(refused(4).empty());
  // LoRA on a mesh (rule MeshLora) and tp of MoE layers whose experts have biases (TpModelParts; without biases
  // they run: test_mesh.cpp).
  s.kind = StrategyKind::Fsdp;
  s.hsdp_group = 0;
  s.method = Method::Lora;
  s.lora.rank = 4;
  CHECK(refused(2).find("strategy.pp: lora with tensor or pipeline parallelism") == 0);
  s.method = Method::Full;
  s.mesh = MeshSpec{};
  s.mesh.tp = 2;
  ModelSpec moe = small_moe_model();
  moe.num_heads = 4;
  moe.num_kv_heads = 2;
  moe.ffn_size = 64;
  s.mesh.sequence_parallel = false;  // the test strategy's 25 tokens do not split over tp 2
  CHECK_NOTHROW(check_mesh_supported(moe, s, 2));
  moe.mlp_bias = true;
  try {
    check_mesh_supported(moe, s, 2);
    FAIL("tp of MoE layers with expert biases ran");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("strategy.tp: tensor parallelism of mixture-of-experts layers whose experts have "
                                     "biases") == 0);
  }
  // Through the plan check fsdp-run runs before any rank starts.
  PlanFile p = small_plan(StrategyKind::Fsdp, "layer", 4);
  p.strategy.mesh.tp = 2;
  CHECK_THROWS_WITH_AS(check_plan_runnable(p), doctest::Contains("strategy.tp: tp 2"), InputError);
  p.strategy.mesh.tp = 1;
  p.model = small_moe_model();
  p.strategy.mesh.pp = 2;
  CHECK_NOTHROW(check_plan_runnable(p));
}

TEST_CASE("mesh: fsdp-run's RuntimeSupport and its runtime profile's mesh section agree") {
  // fsdp-plan --runtime fsdp-run reads configs/runtimes/fsdp-run.yaml; fsdp-run checks with fsdp_run_support(). The
  // flags a profile can say must agree, so the planner never proposes a mesh fsdp-run refuses.
  const RuntimeSupport run = fsdp_run_support();
  const RuntimeSupport plan = load_runtime("fsdp-run", FSDP_SOURCE_ROOT).support;
  CHECK(run.runtime_name == plan.runtime_name);
  CHECK(run.tensor_parallel == plan.tensor_parallel);
  CHECK(run.sequence_parallel == plan.sequence_parallel);
  CHECK(run.async_tp == plan.async_tp);
  CHECK(run.pipeline_parallel == plan.pipeline_parallel);
  CHECK(run.interleaved_pipeline == plan.interleaved_pipeline);
  CHECK(run.pipeline_tied_embeddings == plan.pipeline_tied_embeddings);
  CHECK(run.expert_parallel == plan.expert_parallel);
  // Beyond what the simulator prices (no profile key): fsdp-run runs them, fsdp-plan never plans them.
  CHECK(run.pipeline_partitioned_gradients);
  CHECK_FALSE(plan.pipeline_partitioned_gradients);
  CHECK(run.uneven_ffn_split);
  CHECK_FALSE(plan.uneven_ffn_split);
  // Offload under a mesh: both (the step program places each stage's and tp slice's shards; grid rows 79-82).
  CHECK(run.mesh_offload);
  CHECK(plan.mesh_offload);
}

}  // namespace fsdp::exec::test
