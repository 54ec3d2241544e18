// Issue M15 (fsdp-run half): tensor parallelism (+ sequence parallelism, of dense and mixture-of-experts layers) and
// pipeline parallelism on a mesh with the data-parallel strategies. Each mesh plan trains like one unsharded process on
// the same global batch (5 AdamW steps, fp32, clipping active): the same losses, gradient norms and gathered parameters
// within 1e-5; checkpoints resume on the same mesh and reshard onto another. World 2 runs tp 2 and pp 2, world 4 the
// 2-D meshes.
#include <filesystem>
#include <map>
#include <tuple>

#include "dist/comm.hpp"
#include "dist_env.hpp"
#include "equivalence.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "shard/sharded_model.hpp"
#include "test_common.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec::test {
namespace {

// small_model with heads tensor parallelism can split: 4 query heads of 16 sharing 2 kv heads (kv heads replicated
// at tp 4), hidden 64, ffn 91 and vocab 251 (split unevenly over tp), 3 layers (split 2 + 1 over pp 2). kv_heads 1:
// replicated kv heads at tp 2.
ModelSpec mesh_model(int64_t kv_heads = 2) {
  ModelSpec m = small_model();
  m.name = "exec-test-mesh";
  m.hidden_size = 64;
  m.num_heads = 4;
  m.num_kv_heads = kv_heads;
  m.head_dim = 16;
  return m;
}

// The GPT-2-style variant: LayerNorm, learned positions, GELU, biases (the row-parallel ones replicated), tied head.
ModelSpec mesh_gpt_model(bool tied) {
  ModelSpec m = small_gpt_model();
  m.name = "exec-test-mesh-gpt";
  m.hidden_size = 64;
  m.num_heads = 4;
  m.num_kv_heads = 4;
  m.head_dim = 16;
  m.tied_embeddings = tied;
  return m;
}

// small_moe_model with mesh_model's attention (4 heads of 16 over 2 kv heads, hidden 64): routed experts of 29 and a
// shared expert of 37, split unevenly over tp.
ModelSpec mesh_moe_model(bool mixtral_like) {
  ModelSpec m = small_moe_model(mixtral_like);
  m.name += "-mesh";
  m.hidden_size = 64;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  return m;
}

// AdamW's epsilon of every equivalence plan (test_common.hpp kEquivalenceEps): at 1e-8 an element whose gradient is
// at rounding level moves by up to +-lr in either run, and tensor parallelism changes the forward's summation order
// (partial products summed over tp).
constexpr double kEps = kEquivalenceEps;

// A plan of `kind` on a mesh of tp x pp over `world` ranks: `rows` rows a step in all, each data-parallel replica's
// as micro-batches of `micro_batch`.
PlanFile mesh_plan(StrategyKind kind, int world, int64_t tp, int64_t pp, const ModelSpec& model, int64_t rows = 2,
                   int64_t micro_batch = 2, double eps = kEps) {
  PlanFile p = small_plan(kind, "layer", world, micro_batch, model);
  p.strategy.mesh.tp = tp;
  p.strategy.mesh.pp = pp;
  const int64_t dp = world / (tp * pp);
  REQUIRE(rows % (micro_batch * dp) == 0);
  p.strategy.grad_accum = rows / (micro_batch * dp);
  p.strategy.hsdp_group = kind == StrategyKind::Hsdp ? std::max<int64_t>(1, dp / 2) : 0;
  p.training.eps = eps;
  return p;
}

// One unsharded process on `rows` rows a step (cached by model, rows and AdamW's epsilon).
const Outcome& reference(const ModelSpec& model, int64_t rows, double eps) {
  static std::map<std::tuple<std::string, int64_t, double>, Outcome> cache;
  const auto key = std::make_tuple(
      model.name + (model.tied_embeddings ? "-tied" : "") + std::to_string(model.num_kv_heads), rows, eps);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto solo = Comm::emulate(1);
  PlanFile p = small_plan(StrategyKind::NoShard, "layer", 1, rows, model);
  p.training.eps = eps;
  return cache[key] = train(p, *solo);
}

std::string describe(const PlanFile& p) {
  const MeshSpec& m = p.strategy.mesh;
  return std::string(to_string(p.strategy.kind)) + " " + p.model.name + " tp " + std::to_string(m.tp) +
         (m.tp > 1 && !m.sequence_parallel ? " (no sp)" : "") + " pp " + std::to_string(m.pp) +
         (m.pp > 1 ? std::string(" ") + to_string(m.pp_schedule) : "") + " dp " +
         std::to_string(p.cluster.world_size() / m.model_parallel()) + " accum " +
         std::to_string(p.strategy.grad_accum) + " ckpt " + act_ckpt_name(p.strategy);
}

// Trains `p` and compares it with the unsharded run on the same rows; returns the differences and notes them.
Difference check_mesh(Comm& comm, const PlanFile& p, Difference& worst) {
  const int64_t rows =
      p.strategy.micro_batch * p.strategy.grad_accum * (p.cluster.world_size() / p.strategy.mesh.model_parallel());
  const Outcome& ref = reference(p.model, rows, p.training.eps);
  CHECK(ref.result.steps.front().grad_norm > 1.0);  // clipping active
  const Outcome got = train(p, comm);
  const Difference d = compare_runs(got, ref, describe(p));
  worst.relative = std::max(worst.relative, d.relative);
  worst.loss_abs = std::max(worst.loss_abs, d.loss_abs);
  worst.param_abs = std::max(worst.param_abs, d.param_abs);
  if (comm.rank() == 0)
    MESSAGE(describe(p) << ": relative " << d.relative << ", loss abs " << d.loss_abs << ", param abs " << d.param_abs
                        << ", peak " << static_cast<double>(got.result.peak_bytes) / (1 << 20) << " MiB");
  return d;
}

}  // namespace

TEST_CASE("mesh: tensor parallelism (tp 2) equals one unsharded process") {
  Comm& comm = *g_comm;
  if (comm.size() != 2) return;
  Difference worst;
  for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Ddp}) {
    check_mesh(comm, mesh_plan(kind, 2, 2, 1, mesh_model()), worst);
    PlanFile no_sp = mesh_plan(kind, 2, 2, 1, mesh_model());
    no_sp.strategy.mesh.sequence_parallel = false;
    check_mesh(comm, no_sp, worst);
  }
  // kv heads replicated (1 kv head, tp 2), Qwen3's per-head q/k norms, the GPT-2-style block (biases, LayerNorm,
  // learned positions under sequence parallelism, the tied head vocabulary-parallel).
  check_mesh(comm, mesh_plan(StrategyKind::Fsdp, 2, 2, 1, mesh_model(1)), worst);
  {
    ModelSpec qwen = mesh_model();
    qwen.name = "exec-test-mesh-qwen3";
    qwen.qk_norm = QkNorm::PerHead;
    check_mesh(comm, mesh_plan(StrategyKind::Fsdp, 2, 2, 1, qwen), worst);
  }
  // Mixture-of-experts layers, each expert's width split (router and shared gate whole, their gradients summed over
  // tp): Qwen2-MoE-style (a gated shared expert) with and without sequence parallelism, Mixtral-style (no shared
  // expert, top-k renormalised) under full checkpointing.
  for (bool mixtral : {false, true}) {
    const ModelSpec moe = mesh_moe_model(mixtral);
    for (bool sp : {true, false}) {
      if (mixtral && !sp) continue;
      PlanFile p = mesh_plan(StrategyKind::Fsdp, 2, 2, 1, moe);
      p.strategy.mesh.sequence_parallel = sp;
      if (mixtral) REQUIRE(parse_act_ckpt("full", p.strategy));
      check_mesh(comm, p, worst);
    }
  }
  for (bool sp : {true, false}) {
    PlanFile gpt = mesh_plan(StrategyKind::Zero2, 2, 2, 1, mesh_gpt_model(true));
    gpt.strategy.mesh.sequence_parallel = sp;
    check_mesh(comm, gpt, worst);
  }
  // Checkpointing recomputes the tp collectives in backward; accumulation over 2 micro-batches.
  for (const char* ckpt : {"full", "selective"}) {
    PlanFile p = mesh_plan(StrategyKind::Fsdp, 2, 2, 1, mesh_model(), 4, 2);
    REQUIRE(parse_act_ckpt(ckpt, p.strategy));
    check_mesh(comm, p, worst);
  }
  {
    PlanFile p = mesh_plan(StrategyKind::Fsdp, 2, 2, 1, mesh_model());
    p.strategy.offload = Offload::Optimizer;
    check_mesh(comm, p, worst);
  }
  if (comm.rank() == 0)
    MESSAGE("tp 2: largest relative difference " << worst.relative << ", loss " << worst.loss_abs << ", parameter "
                                                 << worst.param_abs);
}

TEST_CASE("mesh: pipeline parallelism (pp 2, 1F1B and GPipe) equals one unsharded process") {
  Comm& comm = *g_comm;
  if (comm.size() != 2) return;
  Difference worst;
  for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Zero2, StrategyKind::Ddp}) {
    // 4 micro-batches of 1: the 1F1B warm-up, steady state and cool-down all run.
    check_mesh(comm, mesh_plan(kind, 2, 1, 2, mesh_model(), 4, 1), worst);
  }
  {
    PlanFile p = mesh_plan(StrategyKind::Fsdp, 2, 1, 2, mesh_model(), 4, 1);
    p.strategy.mesh.pp_schedule = PipelineSchedule::GPipe;
    check_mesh(comm, p, worst);
    // Waits that poll (fsdp-run's choice when every rank has a core): a send or receive is still waited for.
    comm.set_busy_poll(true);
    p.strategy.mesh.pp_schedule = PipelineSchedule::OneFOneB;
    check_mesh(comm, p, worst);
    comm.set_busy_poll(false);
  }
  {
    // Fewer micro-batches than stages, the GPT-2-style block, units kept gathered (fsdp-grad-op), checkpointing.
    PlanFile p = mesh_plan(StrategyKind::FsdpGradOp, 2, 1, 2, mesh_gpt_model(false), 2, 2);
    REQUIRE(parse_act_ckpt("full", p.strategy));
    check_mesh(comm, p, worst);
  }
  {
    PlanFile p = mesh_plan(StrategyKind::Fsdp, 2, 1, 2, mesh_model(), 4, 1);
    parse_wrap("model", p.strategy.wrap);  // each stage's layers in its root unit
    check_mesh(comm, p, worst);
  }
  if (comm.rank() == 0)
    MESSAGE("pp 2: largest relative difference " << worst.relative << ", loss " << worst.loss_abs << ", parameter "
                                                 << worst.param_abs);
}

TEST_CASE("mesh: 2-D meshes at world 4 (tp 2 x dp 2, pp 2 x dp 2, tp 2 x pp 2) equal one unsharded process") {
  Comm& comm = *g_comm;
  if (comm.size() != 4) return;
  Difference worst;
  for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Zero2, StrategyKind::Ddp, StrategyKind::Hsdp})
    check_mesh(comm, mesh_plan(kind, 4, 2, 1, mesh_model(), 4, 2), worst);
  for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::Zero2, StrategyKind::Ddp})
    check_mesh(comm, mesh_plan(kind, 4, 1, 2, mesh_model(), 8, 1), worst);
  check_mesh(comm, mesh_plan(StrategyKind::Fsdp, 4, 2, 2, mesh_model(), 4, 1), worst);
  // tp 4: the two kv heads each replicated over two ranks.
  check_mesh(comm, mesh_plan(StrategyKind::Fsdp, 4, 4, 1, mesh_model()), worst);
  // MoE layers: ZeRO-2 over tp 2 x dp 2 (both block styles), and tp 4 (every expert's width split unevenly). The
  // Qwen2-MoE-style block at dp 2 runs with AdamW's epsilon at 1e-4: at 1e-6 one element of layers.1's expert 0
  // down projection, its gradient at rounding level (a sum whose order follows the micro-batch's shape), moved by
  // +-lr in either run (relative 1.0e-2 there, losses within 1.4e-5), and did so alike over tp 1 x dp 4 and under
  // DDP and FSDP: AdamW's sign, not the sharding (at 1e-4 every such run was within 1.3e-7).
  check_mesh(comm, mesh_plan(StrategyKind::Zero2, 4, 2, 1, mesh_moe_model(true), 4, 2), worst);
  check_mesh(comm, mesh_plan(StrategyKind::Zero2, 4, 2, 1, mesh_moe_model(false), 4, 2, 1e-4), worst);
  check_mesh(comm, mesh_plan(StrategyKind::Fsdp, 4, 4, 1, mesh_moe_model(true)), worst);
  if (comm.rank() == 0)
    MESSAGE("world 4 meshes: largest relative difference " << worst.relative << ", loss " << worst.loss_abs
                                                           << ", parameter " << worst.param_abs);
}

TEST_CASE(
    "mesh checkpoints: resume on the same mesh, and reshard tp 2 -> tp 1 x dp 2 (dense and MoE) and pp 2 -> pp 1 x dp "
    "2") {
  namespace fs = std::filesystem;
  Comm& comm = *g_comm;
  if (comm.size() != 2) return;
  const char* port = std::getenv("MASTER_PORT");
  const std::string dir =
      (fs::temp_directory_path() / (std::string("fsdp_exec_mesh_") + (port ? port : "solo"))).string();
  // Saved on `from` after 3 steps, resumed on `from` itself and on `to` for 2 more: the losses and parameters of
  // 5 uninterrupted steps on `from`.
  auto resume_on = [&](const PlanFile& from, const PlanFile& to) {
    if (comm.rank() == 0) fs::remove_all(dir);
    comm.world().barrier();
    const Outcome straight = train(from, comm);
    std::map<std::string, at::Tensor> saved;
    {
      RunConfig first;
      first.steps = 3;
      first.seed = 7;
      first.checkpoint_dir = dir;
      first.checkpoint_every = 3;
      Trainer t(from, first, comm);
      t.run(nullptr);
      saved = t.model().full_state_dict();
    }
    // Export writes the whole parameters of the mesh's slices, and --init-from of the export cuts them again for
    // either mesh: bit for bit.
    const std::string exported = dir + ".safetensors";
    if (comm.rank() == 0) {
      CHECK(export_checkpoint(dir, exported) == static_cast<int64_t>(saved.size()));
      SafetensorsFile f(exported);
      for (const auto& [name, v] : saved) CHECK(at::equal(f.tensors().at(name), v));
    }
    comm.world().barrier();
    for (const PlanFile* onto : {&from, &to}) {
      RunConfig init;
      init.steps = 0;
      init.seed = 7;
      init.init_from = exported;
      Trainer t(*onto, init, comm);
      const auto loaded = t.model().full_state_dict();
      for (const auto& [name, v] : saved) CHECK(at::equal(loaded.at(name), v));
    }
    for (const PlanFile* onto : {&from, &to}) {
      RunConfig resume;
      resume.steps = 5;
      resume.seed = 7;
      resume.resume_dir = dir;
      Trainer t(*onto, resume, comm);
      const RunResult r = t.run(nullptr);
      CHECK(r.resumed_from == 3);
      REQUIRE(r.steps.size() == 2);
      const std::string what = describe(from) + " -> " + describe(*onto);
      INFO(what);
      for (std::size_t i = 0; i < 2; ++i)
        CHECK(r.steps[i].loss == doctest::Approx(straight.result.steps[3 + i].loss).epsilon(1e-6));
      const auto params = t.model().full_state_dict();
      double worst = 0;
      for (const auto& [name, v] : straight.params) worst = std::max(worst, rel_err(params.at(name), v));
      CHECK(worst <= 1e-6);
      if (comm.rank() == 0) MESSAGE(what << ": parameters after resuming within " << worst);
    }
    comm.world().barrier();
    if (comm.rank() == 0) {
      fs::remove_all(dir);
      fs::remove(exported);
    }
  };
  resume_on(mesh_plan(StrategyKind::Fsdp, 2, 2, 1, mesh_model()),
            mesh_plan(StrategyKind::Fsdp, 2, 1, 1, mesh_model(), 2, 1));
  // The experts' tp slices (rows of gate/up, columns of down per expert) rebuilt whole and cut again.
  resume_on(mesh_plan(StrategyKind::Fsdp, 2, 2, 1, mesh_moe_model(true)),
            mesh_plan(StrategyKind::Fsdp, 2, 1, 1, mesh_moe_model(true), 2, 1));
  resume_on(mesh_plan(StrategyKind::Zero2, 2, 1, 2, mesh_model(), 2, 1),
            mesh_plan(StrategyKind::Fsdp, 2, 1, 1, mesh_model(), 2, 1));
}

}  // namespace fsdp::exec::test
