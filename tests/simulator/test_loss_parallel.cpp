// DTensor's loss_parallel (RuntimeProfile::TpLossBackward::LossParallel; configs/runtimes/torchtitan.yaml): the
// vocabulary-parallel cross-entropy as torch/distributed/tensor/parallel/loss.py runs it, its forward decomposed op by
// op and its backward fused, against aten's kernels (AsLoss) and fsdp-run's probabilities copy; what each holds and
// moves over one rank's vocabulary shard, and the peak of a plan whose loss backward is its peak.
#include <doctest/doctest.h>

#include "model/module_graph.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using namespace fsdp;
using TLB = RuntimeProfile::TpLossBackward;

// Llama 3 8B under FSDP x tp 8 with sequence parallelism on one node, bf16, `sequences` 8192-token sequences, every
// layer checkpointed.
Strategy titan_tp8(int64_t sequences) {
  Strategy s = test::fsdp_full_ckpt(sequences, 8192);
  s.param_dtype = DType::Bf16;
  s.mesh.tp = 8;
  s.mesh.sequence_parallel = true;
  return s;
}

}  // namespace

TEST_CASE("loss_parallel: DTensor's decomposed forward and fused backward hold one fp32 logits tensor more") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const Strategy s = titan_tp8(2);
  const RuntimeProfile titan = test::runtime("torchtitan");
  REQUIRE(titan.tp_loss_backward == TLB::LossParallel);
  REQUIRE(titan.logits_upcast_fp32);
  RuntimeProfile aten = titan;
  aten.tp_loss_backward = TLB::AsLoss;
  // One rank's shard of the logits: 2 x 8192 tokens x 128256 / 8 vocabulary entries (configs/models/llama3-8b.yaml).
  const double shard = 2.0 * 8192.0 * 128256.0 / 8.0, fp32 = 4.0 * shard, bf16 = 2.0 * shard;
  // Forward: the fp32 upcast and the shifted copy beside the saved log-probabilities (aten's kernel: the upcast).
  CHECK(test::node_op(g, s, titan, OpKind::Loss).transient_bytes == doctest::Approx(2.0 * fp32));
  CHECK(test::node_op(g, s, aten, OpKind::Loss).transient_bytes == doctest::Approx(fp32));
  // Its kernels: the upcast copy (read 2, write 4 bytes a logit) and 7 fp32 passes (amax, the shifted copy, exp, sum,
  // the log-probabilities).
  CHECK(test::node_op(g, s, titan, OpKind::Loss).elementwise_bytes == doctest::Approx(bf16 + fp32 + 7.0 * fp32));
  // Backward: the zeros, exp(x) and their sum (then the product) beside the saved log-probabilities, where aten's
  // backward allocates the two gradients and fsdp-run's clones the probabilities once.
  CHECK(test::node_op(g, s, titan, OpKind::LossBackward).transient_bytes == doctest::Approx(3.0 * fp32));
  CHECK(test::node_op(g, s, aten, OpKind::LossBackward).transient_bytes == doctest::Approx(2.0 * fp32));
  RuntimeProfile copy = titan;
  copy.tp_loss_backward = TLB::ProbabilitiesCopy;
  CHECK(test::node_op(g, s, copy, OpKind::LossBackward).transient_bytes == doctest::Approx(fp32));
  // Its kernels: zeros (1), exp (2), the sum (3), the product (2) fp32 passes, then the upcast's backward cast.
  CHECK(test::node_op(g, s, titan, OpKind::LossBackward).elementwise_bytes ==
        doctest::Approx(8.0 * fp32 + fp32 + bf16));
  // Without tp the loss is aten's whatever the key says: the same ops as the AsLoss profile's.
  Strategy one = s;
  one.mesh.tp = 1;
  one.mesh.sequence_parallel = false;
  for (const OpKind k : {OpKind::Loss, OpKind::LossBackward}) {
    CHECK(test::node_op(g, one, titan, k).transient_bytes ==
          doctest::Approx(test::node_op(g, one, aten, k).transient_bytes));
    CHECK(test::node_op(g, one, titan, k).elementwise_bytes ==
          doctest::Approx(test::node_op(g, one, aten, k).elementwise_bytes));
  }
}

TEST_CASE("loss_parallel: where the loss backward is the peak, the peak rises by the fp32 shard it adds") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  // Eight sequences: 8.4 GB of fp32 logits a rank, more than the optimizer step's temporaries.
  const Strategy s = titan_tp8(8);
  const RuntimeProfile titan = test::runtime("torchtitan");
  RuntimeProfile aten = titan;
  aten.tp_loss_backward = TLB::AsLoss;
  const Prediction lp = test::predict_node(g, s, "h100-80gb", titan), as = test::predict_node(g, s, "h100-80gb", aten);
  REQUIRE(lp.memory.peak_phase == "loss backward (micro-batch 1)");
  const double fp32 = 4.0 * 8.0 * 8192.0 * 128256.0 / 8.0;
  CHECK(lp.memory.peak_allocated - as.memory.peak_allocated == doctest::Approx(fp32).epsilon(0.01));
  // And the extra passes take time.
  CHECK(lp.time.step_s > as.time.step_s);
}
