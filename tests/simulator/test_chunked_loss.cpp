// The loss chunk by chunk (RuntimeProfile::loss_output_chunks; configs/runtimes/torchtune.yaml: torchtune's
// CEWithChunkedOutputLoss over TransformerDecoder.chunked_output, 8 chunks): what the loss's forward and backward
// hold against the whole-sequence loss, the same kernels' bytes and time, and the key parsed strictly.
#include <doctest/doctest.h>

#include <string>

#include "model/module_graph.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using namespace fsdp;

// Llama 3 8B, FSDP in bf16, one 8192-token sequence, every layer checkpointed.
Strategy llama_8k() {
  Strategy s = test::fsdp_full_ckpt(1, 8192);
  s.param_dtype = DType::Bf16;
  return s;
}

}  // namespace

TEST_CASE("chunked loss: torchtune's 8 chunks hold the compute-dtype logits and one chunk's fp32 copy, not all") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const Strategy s = llama_8k();
  const RuntimeProfile chunked = test::runtime("torchtune");
  REQUIRE(chunked.loss_output_chunks == 8);
  RuntimeProfile whole = chunked;
  whole.loss_output_chunks = 1;
  const double logits = 8192.0 * 128256.0;  // configs/models/llama3-8b.yaml vocab_size
  // Forward: the 8 bf16 chunks (2 bytes a logit) beside one chunk's fp32 copy (4 / 8), where the whole sequence's
  // fp32 logits (4) are transient; the fp32 log-probabilities (4) are saved either way.
  CHECK(test::node_op(g, s, chunked, OpKind::Loss).transient_bytes == doctest::Approx((2.0 + 4.0 / 8.0) * logits));
  CHECK(test::node_op(g, s, whole, OpKind::Loss).transient_bytes == doctest::Approx(4.0 * logits));
  // Backward: one chunk's fp32 gradients of the log-probabilities and of the logits and its bf16 gradient, where the
  // whole sequence's two fp32 gradients are transient at once.
  CHECK(test::node_op(g, s, chunked, OpKind::LossBackward).transient_bytes ==
        doctest::Approx((4.0 + 4.0 + 2.0) / 8.0 * logits));
  CHECK(test::node_op(g, s, whole, OpKind::LossBackward).transient_bytes == doctest::Approx(8.0 * logits));
  // The kernels move the same bytes.
  for (const OpKind k : {OpKind::Loss, OpKind::LossBackward}) {
    const Op c = test::node_op(g, s, chunked, k), w = test::node_op(g, s, whole, k);
    CHECK(c.elementwise_softmax);
    CHECK(w.elementwise_softmax);
    CHECK(c.elementwise_bytes > 0.0);
    CHECK(c.device_copy_bytes == doctest::Approx(w.device_copy_bytes));
    CHECK(c.elementwise_bytes == doctest::Approx(w.elementwise_bytes));
  }
  // Simulated on 8 H100s: the peak falls by what the loss held (the loss is this plan's peak), the step's time stays.
  const Prediction c = test::predict_node(g, s, "h100-80gb", chunked), w = test::predict_node(g, s, "h100-80gb", whole);
  MESSAGE("llama3-8b seq 8192 on 8 H100s, torchtune: peak allocated "
          << c.memory.peak_allocated / (1 << 30) << " GiB chunked, " << w.memory.peak_allocated / (1 << 30)
          << " GiB whole");
  CHECK(c.memory.peak_allocated < w.memory.peak_allocated - 2.0 * logits);
  CHECK(c.time.step_s == doctest::Approx(w.time.step_s));
}

TEST_CASE("chunked loss: priced whole where torchtune's chunked loss is not what runs") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const RuntimeProfile chunked = test::runtime("torchtune");
  RuntimeProfile whole = chunked;
  whole.loss_output_chunks = 1;
  // fp32 parameters: the logits are fp32 already, nothing is upcast, chunk by chunk or not.
  Strategy fp32 = llama_8k();
  fp32.param_dtype = DType::Fp32;
  CHECK(test::node_op(g, fp32, chunked, OpKind::Loss).transient_bytes ==
        doctest::Approx(test::node_op(g, fp32, whole, OpKind::Loss).transient_bytes));
  // A compiled loss keeps its own single pass.
  RuntimeProfile compiled = chunked;
  compiled.loss_compiled = true;
  RuntimeProfile compiled_whole = compiled;
  compiled_whole.loss_output_chunks = 1;
  const Strategy s = llama_8k();
  CHECK(test::node_op(g, s, compiled, OpKind::LossBackward).transient_bytes ==
        doctest::Approx(test::node_op(g, s, compiled_whole, OpKind::LossBackward).transient_bytes));
}

TEST_CASE("chunked loss: the key is parsed strictly") {
  const std::string base = "base: torchtune\nname: t\nmodules:\n  loss_output_chunks: ";
  CHECK(test::runtime_load_error(base + "4\n", "chunks4") == "");
  for (const std::string bad : {"1", "0", "-8", "eight"}) {
    CAPTURE(bad);
    const std::string m = test::runtime_load_error(base + bad + "\n", "chunks_bad");
    CHECK(m.find("modules.loss_output_chunks") != std::string::npos);
  }
  CHECK(test::runtime("pytorch").loss_output_chunks == 1);
}
