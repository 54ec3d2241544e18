// FlashAttention-3 (--attention flash3, Shah et al. 2024, arXiv:2407.08608): priced at its ratio to the flash
// (FlashAttention-2) curves, device.flash_attention_3_ratio, read from the FA3 paper's H100 figures beside the FA2
// curve (hwprofiles/h100-80gb.yaml); Hopper only, bf16/fp16, head dims up to 256, on runtimes that call it (rule
// AttentionKernel, simulate.hpp attention_hardware_refusal). Memory is flash's: the same saved q, k, v, output and
// logsumexp.
//
// Golden numbers: the FA3 paper's head-dim-128 figures, FA3 over FA2 at seq 512..16k: forward (causal) 292/191,
// 423/260, 521/298, 579/319, 602/333, 616/335 (mean 1.7276); backward 316/214, 424/260, 501/291, 542/310, 559/318,
// 561/322 (mean 1.6796).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "core/errors.hpp"
#include "model/module_graph.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"
#include "timeline/timeline.hpp"

namespace {

using namespace fsdp;

Strategy flash(AttentionImpl a, int64_t doc_len = 0) { return test::fsdp_8k(a, doc_len); }

Prediction predict(const ModuleGraph& g, const Strategy& s, const std::string& hw_name, const std::string& runtime) {
  return test::predict_node(g, s, hw_name, runtime);
}

using test::error_of;

}  // namespace

TEST_CASE("flash3: the paper's FA3 / FA2 ratios, on every layer's attention forward and backward") {
  const double fwd = (292.0 / 191 + 423.0 / 260 + 521.0 / 298 + 579.0 / 319 + 602.0 / 333 + 616.0 / 335) / 6;
  const double bwd = (316.0 / 214 + 424.0 / 260 + 501.0 / 291 + 542.0 / 310 + 559.0 / 318 + 561.0 / 322) / 6;
  for (const char* name : {"h100-80gb", "h200-141gb", "grand-teton-h100-96gb", "p5-h100-80gb"}) {
    const HardwareProfile hw = test::hardware(name);
    CAPTURE(name);
    CHECK(hw.flash3_ratio.forward == doctest::Approx(fwd).epsilon(0.005));
    CHECK(hw.flash3_ratio.backward == doctest::Approx(bwd).epsilon(0.005));
  }
  const ModuleGraph g(test::zoo("llama3-8b"));
  const HardwareProfile hw = test::hardware("h100-80gb");
  const RuntimeProfile rt = test::runtime("pytorch");
  const Strategy fa2 = flash(AttentionImpl::Flash), fa3 = flash(AttentionImpl::Flash3);
  const OpPrices p2 = price_layers(test::program(g, fa2, rt, 1, 8), hw, fa2);
  const OpPrices p3 = price_layers(test::program(g, fa3, rt, 1, 8), hw, fa3);
  REQUIRE(p2.layers.size() == p3.layers.size());
  for (size_t i = 0; i < p2.layers.size(); ++i) {
    CHECK(p2.layers[i].attention_forward / p3.layers[i].attention_forward == doctest::Approx(1.73));
    CHECK(p2.layers[i].attention_backward / p3.layers[i].attention_backward == doctest::Approx(1.68));
    CHECK(p3.layers[i].gemm_forward == p2.layers[i].gemm_forward);
    CHECK(p3.layers[i].gemm_gradient == p2.layers[i].gemm_gradient);
  }
}

TEST_CASE("flash3: Llama 3 8B at seq 8192 on 8 H100s runs faster by attention alone, in flash's memory") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  const Prediction fa2 = predict(g, flash(AttentionImpl::Flash), "h100-80gb", "pytorch");
  const Prediction fa3 = predict(g, flash(AttentionImpl::Flash3), "h100-80gb", "pytorch");
  MESSAGE("llama3-8b seq 8192 fsdp full AC mb 1, 8 H100, pytorch: flash " << fa2.tokens_per_s_per_gpu << ", flash3 "
                                                                          << fa3.tokens_per_s_per_gpu);
  CHECK(std::lround(fa2.tokens_per_s_per_gpu) == 5678);
  CHECK(std::lround(fa3.tokens_per_s_per_gpu) == 6110);
  CHECK(fa3.memory.peak_allocated == fa2.memory.peak_allocated);
  CHECK(fa3.memory.device_total == fa2.memory.device_total);
  CHECK(fa3.model_flops_per_token == fa2.model_flops_per_token);
  CHECK(fa3.attention == "flash3");
  // Packed documents: FA3's varlen kernel over them (Transformers' flash_attention_3, as flash_attention_2).
  const Prediction docs = predict(g, flash(AttentionImpl::Flash3, 512), "h100-80gb", "pytorch");
  CHECK(docs.tokens_per_s_per_gpu > fa3.tokens_per_s_per_gpu);
}

TEST_CASE("flash3: refused off Hopper, without the profile's ratio, in fp32, over 256-wide heads, by runtime") {
  const ModuleGraph g(test::zoo("llama3-8b"));
  CHECK(error_of([&] {
          predict(g, flash(AttentionImpl::Flash3), "a100-80gb", "pytorch");
        }).find("a100-80gb has compute capability 8.0; FlashAttention-3 is built for Hopper") != std::string::npos);
  CHECK(error_of([&] {
          predict(g, flash(AttentionImpl::Flash3), "l40s-48gb", "pytorch");
        }).find("compute capability 8.9") != std::string::npos);
  // A Hopper profile without the ratio: the key named.
  HardwareProfile bare = test::hardware("h100-80gb");
  bare.flash3_ratio = {};
  CHECK(attention_hardware_refusal(bare, AttentionImpl::Flash3)->find("device.flash_attention_3_ratio") !=
        std::string::npos);
  CHECK_FALSE(attention_hardware_refusal(test::hardware("h200-141gb"), AttentionImpl::Flash3));
  // The plan's side, counted by the search: the dtype, the head width, the runtime.
  Strategy fp32 = flash(AttentionImpl::Flash3);
  fp32.param_dtype = DType::Fp32;
  using test::refusal;
  CHECK(refusal(fp32, g.spec(), "pytorch").find("--param-dtype: FlashAttention-3 trains in bf16 or fp16, not fp32") !=
        std::string::npos);
  ModelSpec wide = g.spec();
  wide.head_dim = 512;
  CHECK(refusal(flash(AttentionImpl::Flash3), wide, "pytorch")
            .find("heads are 512 wide; FlashAttention-3 supports head dimensions up to 256") != std::string::npos);
  for (const char* runtime : {"fsdp-run", "nanotron", "torchtitan", "torchtitan-2510", "pytorch-compile",
                              "pytorch-fsdp1-compile", "torchtitan-compile"}) {
    CAPTURE(runtime);
    CHECK(refusal(flash(AttentionImpl::Flash3), g.spec(), runtime).find("does not run FlashAttention-3") !=
          std::string::npos);
  }
  for (const char* runtime : {"pytorch", "pytorch-fsdp1", "deepspeed", "transformers-deepspeed", "torchtitan-2606",
                              "torchtitan-2606-qwen3"}) {
    CAPTURE(runtime);
    Strategy s = flash(AttentionImpl::Flash3);
    if (std::string(runtime).find("deepspeed") != std::string::npos) s.kind = StrategyKind::Zero3;
    CHECK(refusal(s, g.spec(), runtime) == "");
  }
  // Packed documents with flash3 where the runtime's varlen runs them; sdpa still refused.
  CHECK(refusal(flash(AttentionImpl::Flash3, 512), g.spec(), "torchtitan-2606") == "");
  CHECK(refusal(flash(AttentionImpl::Sdpa, 512), g.spec(), "torchtitan-2606")
            .find("use --attention flash (or flash3, flex) with --doc-len") != std::string::npos);
}

TEST_CASE("flash3: a profile's ratio is read strictly, as the SDPA kernels' are") {
  const std::string base = "base: h100-80gb\nname: x\ndevice:\n  flash_attention_3_ratio: ";
  const std::string root = test::root();
  CHECK(parse_hardware_text(base + "{forward: 1.5, backward: 1.4}\n", "x.yaml", root).flash3_ratio.backward == 1.4);
  // Past the peak: 3 x the forward curve's highest efficiency (0.339) > 1.
  CHECK_THROWS_WITH_AS(parse_hardware_text(base + "{forward: 3.0, backward: 1.4}\n", "x.yaml", root),
                       doctest::Contains("device.flash_attention_3_ratio.forward (3) takes the attention curve above"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_hardware_text(base + "{forward: 173, backward: 168}\n", "x.yaml", root),
                       doctest::Contains("must be within (0, 4]"), InputError);
  CHECK_THROWS_AS(parse_hardware_text(base + "{forward: 1.7}\n", "x.yaml", root), InputError);
  CHECK_THROWS_AS(parse_hardware_text(base + "{forward: 1.7, backward: 1.6, causal: 1.8}\n", "x.yaml", root),
                  InputError);
}
