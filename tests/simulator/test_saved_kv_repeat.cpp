// Grouped k and v repeated to the query heads before the fused attention kernel (RuntimeProfile::saved_kv_repeat):
// the kernel saves the q-wide copies (model/module_graph.cpp build_attention, TensorClass::KvRepeated); who repeats
// and when (program/step_program.cpp kv_saved_repeated).
#include <doctest/doctest.h>

#include <string>

#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
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

RuntimeProfile repeating(SavedKvRepeat r, const std::string& torch = "2.11.0") {
  RuntimeProfile rt = test::runtime("pytorch");
  rt.saved_kv_repeat = r;
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

TEST_CASE("saved kv repeat: each runtime as its model code repeats the grouped heads") {
  for (const char* name :
       {"pytorch", "pytorch-fsdp1", "deepspeed", "transformers-fsdp", "transformers-fsdp1", "transformers-deepspeed"}) {
    INFO(name);
    CHECK(test::runtime(name).saved_kv_repeat == SavedKvRepeat::WithoutSdpaGqa);
  }
  for (const char* name : {"torchtitan", "torchtune", "fsdp-run"}) {
    INFO(name);
    CHECK(test::runtime(name).saved_kv_repeat == SavedKvRepeat::Always);
  }
  for (const char* name : {"nanotron", "torchtitan-2510", "torchtitan-2606", "torchtitan-2510-qwen3", "pytorch-compile",
                           "pytorch-fsdp1-compile", "torchtitan-compile", "torchtitan-2506-compile"}) {
    INFO(name);
    CHECK(test::runtime(name).saved_kv_repeat == SavedKvRepeat::Never);
  }
  CHECK(contains(test::runtime_load_error("base: pytorch\nname: bad\nmodules:\n  saved_kv_repeat: sometimes\n", "kvr"),
                 "modules.saved_kv_repeat"));
}

TEST_CASE("saved kv repeat: Hugging Face's sdpa path repeats under a mask or before torch 2.5") {
  const RuntimeProfile hf = repeating(SavedKvRepeat::WithoutSdpaGqa);
  // torch 2.11, no mask: enable_gqa, nothing repeated; a mask (a sliding window reached) repeats.
  CHECK_FALSE(kv_saved_repeated(with(AttentionImpl::Sdpa), hf, false));
  CHECK(kv_saved_repeated(with(AttentionImpl::Sdpa), hf, true));
  // torch 2.4: repeat_kv whatever the mask.
  CHECK(kv_saved_repeated(with(AttentionImpl::Sdpa), repeating(SavedKvRepeat::WithoutSdpaGqa, "2.4.0"), false));
  // A torch release not stated is taken as recent.
  CHECK_FALSE(kv_saved_repeated(with(AttentionImpl::Sdpa), repeating(SavedKvRepeat::WithoutSdpaGqa, ""), false));
  // flash-attn takes the grouped heads; eager attention's repeat is counted as its own tensors.
  CHECK_FALSE(kv_saved_repeated(with(AttentionImpl::Flash), repeating(SavedKvRepeat::WithoutSdpaGqa, "2.4.0"), true));
  CHECK_FALSE(kv_saved_repeated(with(AttentionImpl::Eager), repeating(SavedKvRepeat::WithoutSdpaGqa, "2.4.0"), true));
  CHECK(kv_saved_repeated(with(AttentionImpl::Flash), repeating(SavedKvRepeat::Always), false));
  CHECK_FALSE(kv_saved_repeated(with(AttentionImpl::Sdpa), repeating(SavedKvRepeat::Never, "2.4.0"), true));
}

TEST_CASE("saved kv repeat: the fused kernel saves k and v at q's width, 2 (q - kv) a token and layer more") {
  // Llama 3 8B: 32 query heads and 8 kv heads of 128 (q 4096, kv 1024): 2 x 3072 bf16 elements more.
  const RuntimeProfile always = repeating(SavedKvRepeat::Always), never = repeating(SavedKvRepeat::Never);
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
}

TEST_CASE("saved kv repeat: Mistral's sliding layers repeat once the sequence reaches the window") {
  // Mistral 7B (every layer slides over 4096 keys; 32 heads, 8 kv heads of 128) under the pytorch runtime with sdpa
  // on one micro-batch: from 4096 tokens Hugging Face passes the window's mask and repeats k and v in every layer,
  // 2 x 3072 x 2 bytes a token in each of the 32 layers (the peak falls in the last layers' backward, so 31 or 32 of
  // them count); at 2048 tokens it passes none and uses enable_gqa.
  const ModuleGraph g(test::zoo("mistral-7b"));
  auto activations = [&](int64_t seq, SavedKvRepeat r) {
    Strategy s;
    s.kind = StrategyKind::Fsdp;
    s.seq_len = seq;
    s.micro_batch = 1;
    s.act_ckpt = ActCkpt::None;
    s.attention = AttentionImpl::Sdpa;
    RuntimeProfile rt = test::runtime("pytorch");
    rt.saved_kv_repeat = r;
    const Prediction p = test::predict_node(g, s, "h100-80gb", rt);
    return test::cat(p.memory.breakdown, MemoryCategory::Activations);
  };
  const double per_layer = 4096.0 * 2 * (4096 - 1024) * kBf16;
  const double more = activations(4096, SavedKvRepeat::WithoutSdpaGqa) - activations(4096, SavedKvRepeat::Never);
  CHECK(more >= 31 * per_layer - 1);
  CHECK(more <= 32 * per_layer + 1);
  CHECK(activations(2048, SavedKvRepeat::WithoutSdpaGqa) == doctest::Approx(activations(2048, SavedKvRepeat::Never)));
}
