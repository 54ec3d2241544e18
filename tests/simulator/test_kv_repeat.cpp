// Grouped k and v repeated to the query heads before the fused attention kernel (RuntimeProfile::kv_repeat): who
// repeats and when (program/step_program.cpp kv_repeated), the q-wide copies the kernel saves under eager autograd
// (model/module_graph.cpp build_attention, TensorClass::KvRepeated) and the copies' traffic (program/layer_costs.cpp).
#include <doctest/doctest.h>

#include <string>

#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;
using fsdp::test::contains;

namespace {

constexpr double kBf16 = 2;

Strategy with(AttentionImpl attention) {
  Strategy s;
  s.seq_len = 4096;
  s.attention = attention;
  return s;
}

RuntimeProfile repeating(KvRepeat r, const std::string& torch = "2.11.0") {
  RuntimeProfile rt = test::runtime("pytorch");
  rt.kv_repeat = r;
  rt.torch_version = torch;
  return rt;
}

// Bytes a decoder layer of `model` saves per token (seq 4096, bf16) under `rt`.
double layer_bytes(const std::string& model, const RuntimeProfile& rt, AttentionImpl attention,
                   ActCkpt ckpt = ActCkpt::None) {
  const ModuleGraph g(test::zoo(model));
  return g.saved_bytes_per_token(g.layers().front(), activation_query(with(attention), rt), ckpt);
}

}  // namespace

TEST_CASE("kv repeat: each runtime as its model code repeats the grouped heads") {
  for (const char* name :
       {"pytorch", "pytorch-fsdp1", "deepspeed", "transformers-fsdp", "transformers-fsdp1", "transformers-deepspeed"}) {
    INFO(name);
    CHECK(test::runtime(name).kv_repeat == KvRepeat::WithoutSdpaGqa);
  }
  // The compiled profiles repeat as the modules they compile do.
  for (const char* name : {"pytorch-compile", "pytorch-fsdp1-compile"}) {
    INFO(name);
    CHECK(test::runtime(name).kv_repeat == KvRepeat::WithoutSdpaGqa);
  }
  for (const char* name : {"torchtitan", "torchtitan-compile", "torchtitan-2503-compile", "torchtitan-2506-compile",
                           "torchtune", "fsdp-run", "fms-fsdp", "fms-fsdp-compile"}) {
    INFO(name);
    CHECK(test::runtime(name).kv_repeat == KvRepeat::Always);
  }
  for (const char* name : {"nanotron", "torchtitan-2510", "torchtitan-2606", "torchtitan-2510-qwen3"}) {
    INFO(name);
    CHECK(test::runtime(name).kv_repeat == KvRepeat::Never);
  }
  CHECK(contains(test::runtime_load_error("base: pytorch\nname: bad\nmodules:\n  kv_repeat: sometimes\n", "kvr"),
                 "modules.kv_repeat"));
}

TEST_CASE("kv repeat: Hugging Face's sdpa path repeats under a mask or before torch 2.5") {
  const RuntimeProfile hf = repeating(KvRepeat::WithoutSdpaGqa);
  // torch 2.11, no mask: enable_gqa, nothing repeated; a mask (a sliding window reached) repeats.
  CHECK_FALSE(kv_repeated(with(AttentionImpl::Sdpa), hf, false));
  CHECK(kv_repeated(with(AttentionImpl::Sdpa), hf, true));
  // torch 2.4: repeat_kv whatever the mask.
  CHECK(kv_repeated(with(AttentionImpl::Sdpa), repeating(KvRepeat::WithoutSdpaGqa, "2.4.0"), false));
  // A torch release not stated is taken as recent.
  CHECK_FALSE(kv_repeated(with(AttentionImpl::Sdpa), repeating(KvRepeat::WithoutSdpaGqa, ""), false));
  // flash-attn takes the grouped heads; eager attention's repeat is counted as its own tensors.
  CHECK_FALSE(kv_repeated(with(AttentionImpl::Flash), repeating(KvRepeat::WithoutSdpaGqa, "2.4.0"), true));
  CHECK_FALSE(kv_repeated(with(AttentionImpl::Eager), repeating(KvRepeat::WithoutSdpaGqa, "2.4.0"), true));
  CHECK(kv_repeated(with(AttentionImpl::Flash), repeating(KvRepeat::Always), false));
  CHECK_FALSE(kv_repeated(with(AttentionImpl::Sdpa), repeating(KvRepeat::Never, "2.4.0"), true));
}

TEST_CASE("kv repeat: the fused kernel saves k and v at q's width, 2 (q - kv) a token and layer more") {
  // Llama 3 8B: 32 query heads and 8 kv heads of 128 (q 4096, kv 1024): 2 x 3072 bf16 elements more.
  const RuntimeProfile always = repeating(KvRepeat::Always), never = repeating(KvRepeat::Never);
  CHECK(layer_bytes("llama3-8b", always, AttentionImpl::Flash) -
            layer_bytes("llama3-8b", never, AttentionImpl::Flash) ==
        doctest::Approx(2 * (4096 - 1024) * kBf16));
  // Attention-core checkpointing keeps the core's inputs, the copies.
  CHECK(layer_bytes("llama3-8b", always, AttentionImpl::Flash, ActCkpt::Selective) -
            layer_bytes("llama3-8b", never, AttentionImpl::Flash, ActCkpt::Selective) ==
        doctest::Approx(2 * (4096 - 1024) * kBf16));
  // Per-op checkpointing caches the kernel's outputs and recomputes its inputs: nothing more kept.
  CHECK(layer_bytes("llama3-8b", always, AttentionImpl::Flash, ActCkpt::SelectiveOp) ==
        doctest::Approx(layer_bytes("llama3-8b", never, AttentionImpl::Flash, ActCkpt::SelectiveOp)));
  // Eager attention keeps its expanded copies either way; multi-head attention has nothing to repeat.
  CHECK(layer_bytes("llama3-8b", always, AttentionImpl::Eager) ==
        doctest::Approx(layer_bytes("llama3-8b", never, AttentionImpl::Eager)));
  CHECK(layer_bytes("llama2-7b", always, AttentionImpl::Flash) ==
        doctest::Approx(layer_bytes("llama2-7b", never, AttentionImpl::Flash)));
  // A compiled graph saves the kv-wide projections and repeats them again in the backward (pointwise_outputs_saved
  // false: the min-cut partitioner recomputes cheap copies).
  RuntimeProfile compiled = test::runtime("torchtitan-compile");
  REQUIRE(compiled.kv_repeat == KvRepeat::Always);
  RuntimeProfile compiled_never = compiled;
  compiled_never.kv_repeat = KvRepeat::Never;
  CHECK(layer_bytes("llama3-8b", compiled, AttentionImpl::Flash) ==
        doctest::Approx(layer_bytes("llama3-8b", compiled_never, AttentionImpl::Flash)));
}

TEST_CASE("kv repeat: the copies' traffic, read kv and write q for k and for v, and back in the backward") {
  // Llama 3 8B, one micro-batch of 4096 tokens: eager runtimes move 2 (q + kv) bf16 elements a token more forward
  // (read 2 kv, write 2 q) and as many backward (expand's backward sums each q-wide gradient back to kv); the compiled
  // layer's repeat kernel 2q each way (fused_elementwise_bytes).
  const ModuleGraph g(test::zoo("llama3-8b"));
  Strategy s;
  s.micro_batch = 1;
  s.seq_len = 4096;
  s.attention = AttentionImpl::Flash;
  auto cost = [&](const RuntimeProfile& rt) {
    const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), 4096.0};
    return layer_cost(in, g.layers().front(), ActCkpt::None);
  };
  for (const char* name : {"torchtitan", "torchtitan-compile"}) {
    INFO(name);
    RuntimeProfile always = test::runtime(name), never = always;
    always.kv_repeat = KvRepeat::Always;
    never.kv_repeat = KvRepeat::Never;
    const double copy = (always.fused_elementwise ? 2.0 * 4096 : 2.0 * (4096 + 1024)) * kBf16;
    CHECK(cost(always).elementwise_bytes_per_token - cost(never).elementwise_bytes_per_token == doctest::Approx(copy));
    CHECK(cost(always).elementwise_backward_bytes_per_token - cost(never).elementwise_backward_bytes_per_token ==
          doctest::Approx(copy));
  }
}

TEST_CASE("kv repeat: Mistral's sliding layers repeat once the sequence reaches the window") {
  // Mistral 7B (every layer slides over 4096 keys; 32 heads, 8 kv heads of 128) under the pytorch runtime with sdpa
  // on one micro-batch: from 4096 tokens Hugging Face passes the window's mask and repeats k and v in every layer,
  // 2 x 3072 x 2 bytes a token in each of the 32 layers (the peak falls in the last layers' backward, so 31 or 32 of
  // them count); at 2048 tokens it passes none and uses enable_gqa.
  const ModuleGraph g(test::zoo("mistral-7b"));
  auto activations = [&](int64_t seq, KvRepeat r) {
    Strategy s;
    s.kind = StrategyKind::Fsdp;
    s.seq_len = seq;
    s.micro_batch = 1;
    s.act_ckpt = ActCkpt::None;
    s.attention = AttentionImpl::Sdpa;
    RuntimeProfile rt = test::runtime("pytorch");
    rt.kv_repeat = r;
    const Prediction p = test::predict_node(g, s, "h100-80gb", rt);
    return test::cat(p.memory.breakdown, MemoryCategory::Activations);
  };
  const double per_layer = 4096.0 * 2 * (4096 - 1024) * kBf16;
  const double more = activations(4096, KvRepeat::WithoutSdpaGqa) - activations(4096, KvRepeat::Never);
  CHECK(more >= 31 * per_layer - 1);
  CHECK(more <= 32 * per_layer + 1);
  CHECK(activations(2048, KvRepeat::WithoutSdpaGqa) == doctest::Approx(activations(2048, KvRepeat::Never)));
}
