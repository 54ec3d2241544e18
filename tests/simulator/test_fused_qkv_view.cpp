// A fused qkv projection whose value reaches the attention kernel as a view (ModelSpec::value_views_fused_qkv:
// Hugging Face's Phi3Attention and GPTNeoXAttention), under a runtime that trains those modules
// (RuntimeProfile::value_view_keeps_fused_qkv): the kernel's saved value keeps the whole projection output, its q and
// k parts beside the rotated q and k the kernel saves too (model/module_graph.cpp build_attention).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/config_map.hpp"
#include "input_fixtures.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;
using fsdp::test::contains;
using fsdp::test::input_error;

namespace {

constexpr double kBf16 = 2;

// Bytes one decoder layer saves per token at seq 4096, bf16, under `runtime` with the flag forced to `keeps`.
double layer_bytes(const ModelSpec& spec, const std::string& runtime, bool keeps, ActCkpt ckpt = ActCkpt::None,
                   AttentionImpl attention = AttentionImpl::Flash) {
  const ModuleGraph g(spec);
  RuntimeProfile rt = load_runtime(runtime, FSDP_SOURCE_ROOT);
  rt.value_view_keeps_fused_qkv = keeps;
  Strategy s;
  s.seq_len = 4096;
  s.attention = attention;
  return g.saved_bytes_per_token(g.layers().front(), activation_query(s, rt), ckpt);
}

ModelSpec zoo(const std::string& name) { return load_model(name, FSDP_SOURCE_ROOT); }

// Phi-3 mini with fewer kv heads than query heads (Phi-3 medium's 40 / 10 ratio of 4), the fused projection kept.
ModelSpec phi3_gqa() {
  ModelSpec m = zoo("phi3-mini-4k");
  m.num_kv_heads = 8;
  return m;
}

}  // namespace

TEST_CASE("fused qkv view: Phi-3 and GPT-NeoX hand the kernel a view of the fused output, read and written back") {
  CHECK(zoo("phi3-mini-4k").value_views_fused_qkv);
  CHECK(zoo("pythia-1b").value_views_fused_qkv);
  // Separate projections (Llama), a fused one whose value is copied (Falcon-7B's multi-query index, ChatGLM's
  // expand) or whose q and k stay views with it (GPT-2: no rotary): no retention beyond what is counted.
  for (const char* name : {"llama3-8b", "falcon-7b", "chatglm2-6b", "gpt2"})
    CHECK_FALSE(zoo(name).value_views_fused_qkv);
  // The config.json readers agree (test_hf_config.cpp compares every fixture with its zoo twin).
  CHECK(fsdp::test::read_hf_fixture("phi3-mini-4k").spec.value_views_fused_qkv);
  CHECK(fsdp::test::read_hf_fixture("pythia-1b").spec.value_views_fused_qkv);
  CHECK_FALSE(fsdp::test::read_hf_fixture("falcon-7b").spec.value_views_fused_qkv);
  // plan.yaml writes the key only where it is set, and reads it back.
  YAML::Emitter out;
  emit_model_map(zoo("phi3-mini-4k"), out);
  CHECK(contains(out.c_str(), "value_views_fused_qkv: true"));
  ConfigMap map = ConfigMap::load_string(out.c_str(), "plan.yaml");
  CHECK(parse_model_map(map).value_views_fused_qkv);
  YAML::Emitter llama;
  emit_model_map(zoo("llama3-8b"), llama);
  CHECK_FALSE(contains(llama.c_str(), "value_views_fused_qkv"));
}

TEST_CASE("fused qkv view: the model key is parsed strictly") {
  CHECK(contains(fsdp::test::zoo_edit_error("gpt2", "dropout:", "value_views_fused_qkv: true\ndropout:"),
                 "value_views_fused_qkv"));
  CHECK(contains(fsdp::test::zoo_edit_error("pythia-1b", "value_views_fused_qkv: true", "value_views_fused_qkv: 1.5"),
                 "value_views_fused_qkv"));
}

TEST_CASE("fused qkv view: the runtimes that train Hugging Face's modules keep the output, the others do not") {
  for (const char* name : {"pytorch", "pytorch-fsdp1", "pytorch-compile", "pytorch-fsdp1-compile", "transformers-fsdp",
                           "transformers-fsdp1", "deepspeed", "transformers-deepspeed"}) {
    INFO(name);
    CHECK(load_runtime(name, FSDP_SOURCE_ROOT).value_view_keeps_fused_qkv);
  }
  for (const char* name : {"torchtune", "torchtitan", "nanotron", "fsdp-run"}) {
    INFO(name);
    CHECK_FALSE(load_runtime(name, FSDP_SOURCE_ROOT).value_view_keeps_fused_qkv);
  }
  CHECK(
      contains(test::runtime_load_error("base: pytorch\nname: bad\nmodules:\n  value_view_keeps_fused_qkv: 2\n", "vv"),
               "modules.value_view_keeps_fused_qkv"));
}

TEST_CASE("fused qkv view: the saved value keeps q's and k's parts of the projection, q + kv a token and layer") {
  // Phi-3 mini: 32 heads and 32 kv heads of 96 (q = kv = 3072). Fused and eager attention alike keep q + kv more
  // (with as many kv heads as query heads repeat_kv hands the eager PV matmul the view itself).
  const ModelSpec phi3 = zoo("phi3-mini-4k");
  CHECK(layer_bytes(phi3, "pytorch", true) - layer_bytes(phi3, "pytorch", false) ==
        doctest::Approx((3072 + 3072) * kBf16));
  CHECK(layer_bytes(phi3, "pytorch", true, ActCkpt::None, AttentionImpl::Eager) -
            layer_bytes(phi3, "pytorch", false, ActCkpt::None, AttentionImpl::Eager) ==
        doctest::Approx((3072 + 3072) * kBf16));
  // Pythia 1B: 8 heads of 256 (q = kv = 2048), a quarter of each head rotated: q and k are written anew all the same.
  const ModelSpec pythia = zoo("pythia-1b");
  CHECK(layer_bytes(pythia, "pytorch", true) - layer_bytes(pythia, "pytorch", false) ==
        doctest::Approx((2048 + 2048) * kBf16));
  // Fewer kv heads: the fused kernel takes the grouped view (q + kv = 3072 + 768 more); eager attention's repeat_kv
  // copies the value to every head, so the view is not what its matmul saves.
  const ModelSpec gqa = phi3_gqa();
  CHECK(layer_bytes(gqa, "pytorch", true) - layer_bytes(gqa, "pytorch", false) ==
        doctest::Approx((3072 + 768) * kBf16));
  CHECK(layer_bytes(gqa, "pytorch", true, ActCkpt::None, AttentionImpl::Eager) ==
        doctest::Approx(layer_bytes(gqa, "pytorch", false, ActCkpt::None, AttentionImpl::Eager)));
  // A model whose value is its own tensor keeps nothing more.
  CHECK(layer_bytes(zoo("llama3-8b"), "pytorch", true) ==
        doctest::Approx(layer_bytes(zoo("llama3-8b"), "pytorch", false)));
}

TEST_CASE("fused qkv view: checkpointing modes") {
  const ModelSpec phi3 = zoo("phi3-mini-4k");
  // Checkpointing the attention core (ours): the core's inputs are what the region keeps, the view with them.
  CHECK(layer_bytes(phi3, "pytorch", true, ActCkpt::Selective) -
            layer_bytes(phi3, "pytorch", false, ActCkpt::Selective) ==
        doctest::Approx((3072 + 3072) * kBf16));
  // Per-op checkpointing caches the projections' outputs whole and recomputes the views: nothing more.
  CHECK(layer_bytes(phi3, "pytorch", true, ActCkpt::SelectiveOp) ==
        doctest::Approx(layer_bytes(phi3, "pytorch", false, ActCkpt::SelectiveOp)));
}

TEST_CASE("fused qkv view: a step's activations at the peak grow by the layers' q + kv") {
  // Phi-3 mini, one micro-batch of 2048 tokens on 8 A100s, FSDP, no checkpointing, under the Hugging Face runtime:
  // each of the 32 layers keeps 2048 tokens x 6144 elements x 2 bytes more (24 MiB); the peak falls in the backward of
  // the last layers, so those whose activations are still held count.
  const ModuleGraph g(zoo("phi3-mini-4k"));
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.seq_len = 2048;
  s.micro_batch = 1;
  s.act_ckpt = ActCkpt::None;
  auto activations = [&](bool keeps) {
    RuntimeProfile rt = test::runtime("pytorch");
    rt.value_view_keeps_fused_qkv = keeps;
    const Prediction p = test::predict_node(g, s, "a100-80gb", rt);
    return test::cat(p.memory.breakdown, MemoryCategory::Activations);
  };
  const double per_layer = 2048.0 * (3072 + 3072) * kBf16;
  const double more = activations(true) - activations(false);
  CHECK(more >= 31 * per_layer - 1);
  CHECK(more <= 32 * per_layer + 1);
}
