// torch's flex_attention (--attention flex, torchtitan's attn_backend "flex"): priced at its ratio to the flash
// (FlashAttention-2) curves, device.flex_attention_ratio (A100: the FlexAttention blog's 0.90 forward, 0.85 backward;
// H100/H200: PyTorch's GTC 2025 abstract, 1.25 and 1.03), and over packed documents slower by its block mask's partial
// blocks (compute_cost.hpp flex_document_block_factor: (N + 3B) / (N + B), B = 128). Memory is flash's. Refused on
// runtimes that do not call it (rule AttentionKernel) and on profiles without the ratio.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>

#include "compute/compute_cost.hpp"
#include "core/errors.hpp"
#include "model/module_graph.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"
#include "timeline/timeline.hpp"

namespace {

using namespace fsdp;

Strategy with(AttentionImpl a, int64_t doc_len = 0) { return test::fsdp_8k(a, doc_len); }

// Each layer's attention forward and backward time, flash over the kernel's.
std::pair<double, double> flash_over(const ModuleGraph& g, const std::string& hw_name, AttentionImpl a,
                                     int64_t doc_len) {
  const HardwareProfile hw = test::hardware(hw_name);
  const RuntimeProfile rt = test::runtime("torchtitan-2606");
  const Strategy fa2 = with(AttentionImpl::Flash, doc_len), k = with(a, doc_len);
  const OpPrices p2 = price_layers(test::program(g, fa2, rt, 1, 8), hw, fa2);
  const OpPrices pk = price_layers(test::program(g, k, rt, 1, 8), hw, k);
  REQUIRE(p2.layers.size() == pk.layers.size());
  return {p2.layers[0].attention_forward / pk.layers[0].attention_forward,
          p2.layers[0].attention_backward / pk.layers[0].attention_backward};
}

// The key blocks flex_attention visits for a sequence of `seq` tokens packed with documents of `n` (the first cut
// `offset` tokens in), each query block from the start block of the document holding its first token to itself;
// over the document pricing's count of pairs, each document's tiles starting at its first token (varlen).
double block_visits_over_varlen(int64_t seq, int64_t n, int64_t offset, int64_t block) {
  double visited = 0;
  for (int64_t q = 0; q < seq; q += block) {
    const int64_t start = q < offset ? 0 : q - (q - offset) % n;
    visited += double(q / block - start / block + 1);
  }
  visited *= double(block * block);
  double varlen = 0;  // per document of L tokens: ceil(L / B) (ceil(L / B) + 1) / 2 tiles, the last partial
  auto tiles = [&](int64_t len) {
    const int64_t m = (len + block - 1) / block;
    return double(m * (m + 1) / 2) * double(block * block);
  };
  if (offset > 0) varlen += tiles(offset);
  for (int64_t d = offset; d < seq; d += n) varlen += tiles(std::min(n, seq - d));
  return visited / varlen;
}

using test::refusal;

}  // namespace

TEST_CASE("flex: the document factor is the block mask's visits over the varlen kernel's, averaged over offsets") {
  CHECK(flex_document_block_factor(0) == 1.0);
  CHECK(flex_document_block_factor(512) == doctest::Approx(896.0 / 640.0));
  CHECK(flex_document_block_factor(2048) == doctest::Approx((2048.0 + 384.0) / (2048.0 + 128.0)));
  // Counted block by block over every offset of the first document boundary (step 8 tokens), in 8192 tokens.
  for (int64_t n : {512, 1024, 2048}) {
    double sum = 0;
    int count = 0;
    for (int64_t offset = 0; offset < n; offset += 8, ++count) sum += block_visits_over_varlen(8192, n, offset, 128);
    CAPTURE(n);
    CHECK(sum / count == doctest::Approx(flex_document_block_factor(n)).epsilon(0.03));
  }
}

TEST_CASE("flex: the published ratios per GPU, and the document factor on top") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  for (const char* a100 : {"a100-80gb", "a100-40gb", "a800-80gb", "p4de-a100-80gb"}) {
    CAPTURE(a100);
    CHECK(test::hardware(a100).flex_ratio.forward == 0.90);
    CHECK(test::hardware(a100).flex_ratio.backward == 0.85);
  }
  for (const char* hopper : {"h100-80gb", "h200-141gb", "p5-h100-80gb"}) {
    CAPTURE(hopper);
    CHECK(test::hardware(hopper).flex_ratio.forward == 1.25);
    CHECK(test::hardware(hopper).flex_ratio.backward == 1.03);
  }
  auto [f, b] = flash_over(g, "a100-80gb", AttentionImpl::Flex, 0);
  CHECK(f == doctest::Approx(0.90));
  CHECK(b == doctest::Approx(0.85));
  std::tie(f, b) = flash_over(g, "h100-80gb", AttentionImpl::Flex, 0);
  CHECK(f == doctest::Approx(1.25));
  CHECK(b == doctest::Approx(1.03));
  // 512-token documents: the partial blocks cost 1.40 more than the varlen kernel's tiles.
  std::tie(f, b) = flash_over(g, "h100-80gb", AttentionImpl::Flex, 512);
  CHECK(f == doctest::Approx(1.25 / 1.4));
  CHECK(b == doctest::Approx(1.03 / 1.4));
}

TEST_CASE("flex: flash's memory; refused by runtime and by a profile without the ratio") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  auto run = [&](const Strategy& s) { return test::predict_node(g, s, "h100-80gb", "torchtitan-2606"); };
  const Prediction fa2 = run(with(AttentionImpl::Flash)), flex = run(with(AttentionImpl::Flex));
  const Prediction docs = run(with(AttentionImpl::Flex, 1024));
  MESSAGE("llama3-8b seq 8192 fsdp full AC mb 1, 8 H100, torchtitan-2606: flash "
          << fa2.tokens_per_s_per_gpu << ", flex " << flex.tokens_per_s_per_gpu << ", flex over 1024-token documents "
          << docs.tokens_per_s_per_gpu);
  CHECK(flex.memory.device_total == fa2.memory.device_total);
  CHECK(flex.tokens_per_s_per_gpu > fa2.tokens_per_s_per_gpu);  // 1.25 and 1.03 on H100
  CHECK(docs.tokens_per_s_per_gpu > flex.tokens_per_s_per_gpu);
  CHECK(flex.attention == "flex");
  for (const char* runtime : {"pytorch", "fsdp-run", "torchtitan", "torchtitan-2510", "deepspeed", "nanotron"}) {
    CAPTURE(runtime);
    Strategy s = with(AttentionImpl::Flex);
    if (std::string(runtime) == "deepspeed") s.kind = StrategyKind::Zero3;
    if (std::string(runtime) == "nanotron") s.kind = StrategyKind::Ddp;
    CHECK(refusal(s, g.spec(), runtime).find("does not run flex_attention") != std::string::npos);
  }
  CHECK(refusal(with(AttentionImpl::Flex, 1024), g.spec(), "torchtitan-2606") == "");
  CHECK(attention_hardware_refusal(test::hardware("l40s-48gb"), AttentionImpl::Flex)
            ->find("device.flex_attention_ratio") != std::string::npos);
  CHECK(attention_hardware_refusal(test::hardware("cpu"), AttentionImpl::Flex)->find("host device") !=
        std::string::npos);
  CHECK_FALSE(attention_hardware_refusal(test::hardware("a100-40gb"), AttentionImpl::Flex));
  CHECK_FALSE(attention_hardware_refusal(test::hardware("cpu"), AttentionImpl::Flash));
}
