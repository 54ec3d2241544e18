// The torchtune runtime (configs/runtimes/torchtune.yaml): what its distributed recipes run, refused otherwise by the
// capability table with the profile's reason (its loss: test_chunked_loss.cpp).
#include <doctest/doctest.h>

#include <string>

#include "model/module_graph.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;

TEST_CASE("torchtune runtime: FSDP2 over every decoder layer, full or no checkpointing, TP without sequence parallel") {
  const ModelSpec m = test::zoo("llama3-8b");
  const Strategy fsdp = test::fsdp_full_ckpt(1, 4096);
  CHECK(test::refusal(fsdp, m, "torchtune") == "");
  auto refused = [&](const Strategy& s, const std::string& flag) { test::check_refused(s, m, "torchtune", flag); };
  Strategy ddp = fsdp;
  ddp.kind = StrategyKind::Ddp;
  refused(ddp, "--strategy");
  Strategy hsdp = fsdp;
  hsdp.kind = StrategyKind::Hsdp;
  hsdp.hsdp_group = 4;
  refused(hsdp, "--strategy");
  Strategy every = fsdp;
  every.act_ckpt = ActCkpt::Full;
  every.ckpt_every = 2;
  refused(every, "--act-ckpt");
  Strategy optimizer_offload = fsdp;
  optimizer_offload.offload = Offload::Optimizer;
  refused(optimizer_offload, "--offload");
  Strategy tp = fsdp;
  tp.mesh.tp = 2;
  tp.mesh.sequence_parallel = false;
  CHECK(test::refusal(tp, m, "torchtune") == "");
  tp.mesh.sequence_parallel = true;
  refused(tp, "--sequence-parallel");
  Strategy pp = fsdp;
  pp.mesh.pp = 2;
  refused(pp, "--pp");
}

TEST_CASE(
    "torchtune runtime: under tp the head's vocabulary shards are gathered and the loss runs whole on each rank") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  Strategy s = test::fsdp_full_ckpt(1, 8192);
  s.param_dtype = DType::Bf16;
  s.mesh.tp = 2;
  s.mesh.sequence_parallel = false;
  const RuntimeProfile torchtune = test::runtime("torchtune");
  REQUIRE(torchtune.tp_head_output_replicated);
  RuntimeProfile vocab_parallel = torchtune;
  vocab_parallel.tp_head_output_replicated = false;
  const double logits = 8192.0 * 128256.0 * 2.0;  // the whole bf16 logits of the micro-batch
  auto ops = [&](const RuntimeProfile& rt) { return test::program(g, s, rt, 1, 8).ops; };
  // Gathered: one all-gather of the whole logits in the head's forward, no vocabulary-parallel all-reduce, and the
  // loss's kernels and memory over the whole vocabulary (twice the shard's), its chunks as without tp.
  int gathers = 0, loss_all_reduces = 0;
  double loss_bytes = 0, loss_copy = 0;
  for (const Op& op : ops(torchtune)) {
    if (op.kind == OpKind::TpCollective && op.tp_head && op.collective == CollectiveKind::AllGather &&
        op.comm_bytes == doctest::Approx(logits))
      ++gathers;
    if (op.phase == Phase::TpLossAllReduce) ++loss_all_reduces;
    if (op.kind == OpKind::Loss && op.micro_batch == 0) {
      loss_bytes = op.elementwise_bytes;
      loss_copy = op.device_copy_bytes;
      CHECK(op.transient_bytes == doctest::Approx(logits + logits * 2.0 / 8.0));  // bf16 chunks + one fp32 chunk
    }
  }
  CHECK(gathers == 1);
  CHECK(loss_all_reduces == 0);
  // torch.cat of the gathered shards along the vocabulary (read and write the bf16 logits), and the upcast
  // `logits.float()` (read 2, write 4 bytes a logit).
  CHECK(loss_copy == doctest::Approx(2.0 * logits + 3.0 * logits));
  // PyTorch's log_softmax forward over the whole fp32 logits: 4 passes of 4 bytes a logit (program/emit_loss.cpp).
  CHECK(loss_bytes == doctest::Approx(4.0 * 2.0 * logits));
  // The vocabulary-parallel loss reads the shard (half the logits: the bf16 read, the fp32 upcast and
  // log-probabilities), its all-reduces, no gather of the logits.
  double shard_bytes = 0;
  int shard_all_reduces = 0, shard_gathers = 0;
  for (const Op& op : ops(vocab_parallel)) {
    if (op.kind == OpKind::Loss && op.micro_batch == 0) shard_bytes = op.elementwise_bytes;
    if (op.phase == Phase::TpLossAllReduce) ++shard_all_reduces;
    if (op.kind == OpKind::TpCollective && op.tp_head && op.collective == CollectiveKind::AllGather) ++shard_gathers;
  }
  CHECK(shard_bytes == doctest::Approx(0.5 * (logits + 2.0 * logits + 2.0 * logits)));
  CHECK(shard_all_reduces > 0);
  CHECK(shard_gathers == 0);
}

TEST_CASE("torchtune runtime: the head's output key is parsed strictly") {
  const std::string base = "base: pytorch\nname: t\nsharding:\n  tp_head_output: ";
  CHECK(test::runtime_load_error(base + "replicated\n", "head_ok") == "");
  CHECK(test::runtime_load_error(base + "vocab-parallel\n", "head_vp") == "");
  const std::string m = test::runtime_load_error(base + "gathered\n", "head_bad");
  CHECK(m.find("sharding.tp_head_output") != std::string::npos);
  CHECK(m.find("vocab-parallel, replicated") != std::string::npos);
  CHECK_FALSE(test::runtime("pytorch").tp_head_output_replicated);
}

// torchtune's recipes step a fused AdamW (65 of the 69 distributed configs at a6290a5, and the export), except under
// tensor parallelism, which full_finetune_distributed refuses with a fused optimizer: there torch.optim's foreach
// AdamW, the pytorch profile's step (configs/runtimes/torchtune.yaml training_loop).
TEST_CASE("torchtune runtime: a fused AdamW step, foreach under tensor parallelism") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const RuntimeProfile tune = test::runtime("torchtune"), pytorch = test::runtime("pytorch");
  auto step = [&](int64_t tp, const RuntimeProfile& rt) {
    Strategy s = test::fsdp_full_ckpt(1, 4096);
    s.mesh.tp = tp;
    s.mesh.sequence_parallel = false;
    const StepProgram p = test::program(g, s, rt, 1, 8);
    for (const Op& o : p.ops)
      if (o.kind == OpKind::OptimizerStep) return o;
    FAIL("no optimizer step");
    return Op{};
  };
  // The rank's fp32 shard: 8.03B parameters over 8 ranks (tp 1), over 4 data-parallel ranks of a half (tp 2).
  const double shard_tp1 = g.total_params() / 8.0;
  CHECK(step(1, tune).elementwise_bytes == doctest::Approx(28 * shard_tp1).epsilon(0.01));
  CHECK(step(1, tune).transient_bytes == 0);
  CHECK(step(1, pytorch).elementwise_bytes == doctest::Approx(84 * shard_tp1).epsilon(0.01));
  // Under tp 2 the same as the pytorch profile's step: 84 B and the foreach sqrt list of the shard.
  CHECK(step(2, tune).elementwise_bytes == doctest::Approx(step(2, pytorch).elementwise_bytes));
  CHECK(step(2, tune).transient_bytes == doctest::Approx(step(2, pytorch).transient_bytes));
  CHECK(step(2, tune).transient_bytes > 0);
}

TEST_CASE("torchtune runtime: adamw_under_tp is parsed strictly") {
  const std::string base = "base: torchtune\nname: bad\ntraining_loop:\n  adamw_under_tp: ";
  CHECK(test::runtime_load_error(base + "{bytes_per_param: 84}\n", "tp1").find("temporaries_per_param") !=
        std::string::npos);
  CHECK(test::runtime_load_error(base + "{bytes_per_param: -1, temporaries_per_param: 1}\n", "tp2")
            .find("bytes_per_param") != std::string::npos);
  CHECK(test::runtime_load_error(base + "{bytes_per_param: 84, temporaries_per_param: 1, fused: no}\n", "tp3")
            .find("fused") != std::string::npos);
  CHECK_FALSE(test::runtime("pytorch").adamw_under_tp.has_value());
}
