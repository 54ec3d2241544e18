// Packed documents (Strategy::doc_len, `--doc-len`): a sequence of documents attended one by one by flash attention's
// varlen kernel costs each document's causal triangle, the chunked count with chunks of doc_len
// (compute/compute_cost.hpp causal_keys_per_query), in the layer's attention time and in the model's FLOPs (MFU); its
// memory is the whole sequence's (flash attention keeps O(s) whatever the mask). Rule DocumentMasking refuses it
// where it is not priced.
//
// Golden numbers: Llama 3 8B (32 query heads of 128) at seq 8192 attends 8192 / 2 = 4096 keys a query causally; in
// documents of 512, 512 / 2 = 256: 16 times fewer score and value FLOPs.
#include <doctest/doctest.h>

#include "compute/compute_cost.hpp"
#include "core/errors.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using namespace fsdp;

Strategy fsdp_full(int64_t doc_len) {
  Strategy s = test::fsdp_full_ckpt(1, 8192);
  s.doc_len = doc_len;
  return s;
}

Prediction predict(const ModuleGraph& g, const Strategy& s, const std::string& runtime) {
  return test::predict_node(g, s, "h100-80gb", runtime);
}

std::string refusal(const Strategy& s, const ModelSpec& m, const std::string& runtime) {
  return test::refusal(s, m, runtime);
}

}  // namespace

TEST_CASE("packed documents: each document's causal triangle, in the layer's attention and the model's FLOPs") {
  CHECK(causal_keys_per_query(8192, 0) == 4096.0);
  CHECK(causal_keys_per_query(8192, 512, true) == 256.0);
  // Uneven: 8192 = 3 documents of 2500 and one of 692 (the chunked count's last chunk).
  CHECK(causal_keys_per_query(8192, 2500, true) ==
        doctest::Approx((3.0 * 2500.0 * 2500.0 + 692.0 * 692.0) / (2.0 * 8192.0)));
  const ModuleGraph g(test::zoo("llama3-8b"));
  const ModuleId layer = g.layers().front();
  for (ModuleId leaf : g.leaves_under(layer)) {
    const ModuleNode& n = g.node(leaf);
    if (n.kind != ModuleKind::AttentionCore) continue;
    CHECK(masked_per_document(n, 8192, 512));
    CHECK_FALSE(masked_per_document(n, 8192, 0));
    CHECK_FALSE(masked_per_document(n, 8192, 8192));
    CHECK(seq_flops_per_token(n, 8192, 512) * 16.0 == doctest::Approx(seq_flops_per_token(n, 8192)));
  }
  // The model's FLOPs per token (MFU): the attention term 16 times smaller, the GEMMs' 6N as before.
  const double whole = model_flops_per_token(g, 8192);
  const double docs = model_flops_per_token(g, 8192, false, VisionTraining::All, 512);
  const double six_n = model_flops_per_token(g, 1);  // one token attends one key: 6N plus a negligible attention term
  CHECK(docs < whole);
  CHECK((whole - six_n) / (docs - six_n) == doctest::Approx(16.0).epsilon(0.01));
}

TEST_CASE("packed documents: the step is faster by attention alone, its memory the whole sequence's") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const Prediction whole = predict(g, fsdp_full(0), "pytorch");
  const Prediction docs = predict(g, fsdp_full(512), "pytorch");
  const Prediction docs_2k = predict(g, fsdp_full(2048), "pytorch");
  CHECK(docs.time.step_s < docs_2k.time.step_s);
  CHECK(docs_2k.time.step_s < whole.time.step_s);
  // GEMMs, collectives and the optimizer are untouched: the saving is within the compute of the attention cores.
  CHECK(whole.time.step_s - docs.time.step_s < 0.5 * whole.time.step_s);
  CHECK(docs.memory.peak_allocated == whole.memory.peak_allocated);
  CHECK(docs.memory.device_total == whole.memory.device_total);
  // MFU counts the attention the documents do: fewer FLOPs a token, at a higher rate.
  CHECK(docs.model_flops_per_token < whole.model_flops_per_token);
  CHECK(docs.tokens_per_s_per_gpu > whole.tokens_per_s_per_gpu);
}

TEST_CASE("packed documents: refused where they are not priced, naming the flag") {
  const ModelSpec llama = test::zoo("llama3-8b");
  CHECK(refusal(fsdp_full(512), llama, "pytorch").empty());
  // DeepSpeed under Transformers (ms-swift's runtime) runs it with its ZeRO stages.
  Strategy zero3 = fsdp_full(512);
  zero3.kind = StrategyKind::Zero3;
  CHECK(refusal(zero3, llama, "transformers-deepspeed").empty());
  // Runtimes that attend over the whole packed sequence.
  for (const char* rt : {"fsdp-run", "torchtitan-2510", "nanotron", "pytorch-compile"}) {
    CAPTURE(rt);
    Strategy s = fsdp_full(512);
    if (std::string(rt) == "nanotron") s.kind = StrategyKind::Ddp;
    CHECK(refusal(s, llama, rt).find("--doc-len: ") == 0);
    CHECK(refusal(s, llama, rt).find("runs.document_masking") != std::string::npos);
  }
  // Flash attention's varlen kernel only.
  Strategy sdpa = fsdp_full(512);
  sdpa.attention = AttentionImpl::Sdpa;
  CHECK(refusal(sdpa, llama, "pytorch").find("--attention: ") == 0);
  // Documents as long as the sequence: the default, said.
  CHECK(refusal(fsdp_full(8192), llama, "pytorch").find("one document a sequence is the default") != std::string::npos);
  // Local attention windows (Mistral 7B's sliding window) and vision towers are not modelled with them.
  CHECK(refusal(fsdp_full(512), test::zoo("mistral-7b"), "pytorch").find("local attention windows") !=
        std::string::npos);
  Strategy vlm = fsdp_full(512);
  vlm.seq_len = 2048;
  CHECK(refusal(vlm, test::zoo("llava-1.5-7b"), "pytorch").find("beside the image tokens") != std::string::npos);
}
