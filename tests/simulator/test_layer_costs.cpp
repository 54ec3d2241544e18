// program/layer_costs.hpp: a layer's costs read from its own nodes of the module graph (golden numbers for the
// Llama-3-70B shape of configs/models/llama3-70b.yaml: hidden 8192, 64 query heads and 8 kv heads of 128, FFN
// 28672, Meta's model card).
#include <doctest/doctest.h>

#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/root_module_costs.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"

using namespace fsdp;

namespace {
// A strategy of `micro_batch` sequences of `seq` tokens, the rest at its defaults.
Strategy batch_of(int64_t micro_batch, int64_t seq) {
  Strategy s;
  s.micro_batch = micro_batch;
  s.seq_len = seq;
  return s;
}

// tiny-moe's plans below: 2 x 64 tokens, fp32, eager attention (the accuracy grid's).
Strategy tiny_moe_fp32() {
  Strategy s = batch_of(2, 64);
  s.param_dtype = DType::Fp32;
  s.attention = AttentionImpl::Eager;
  return s;
}

// The MoE block of decoder layer `layer` (the layer itself where it has none).
ModuleId moe_block_of(const ModuleGraph& g, ModuleId layer) {
  for (ModuleId c : g.children(layer))
    if (g.node(c).kind == ModuleKind::Moe) return c;
  return layer;
}
}  // namespace

TEST_CASE("layer costs: the attention shape, GEMMs and parameters come from the layer's nodes") {
  const ModuleGraph g(load_model("llama3-70b", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  const Strategy s = batch_of(1, 4096);
  LayerCostInput in{&g, &s, &rt, activation_query(s, rt), 4096.0};
  const LayerCost c = layer_cost(in, g.layers().front());
  CHECK(c.shape.heads == 64);
  CHECK(c.shape.kv_heads == 8);
  CHECK(c.shape.head_dim == 128);
  // q, k, v, o, gate, up, down, in execution order.
  REQUIRE(c.shape.gemms.size() == 7);
  CHECK(c.shape.gemms[0].n == 8192);   // q_proj: 8192 -> 64 x 128
  CHECK(c.shape.gemms[1].n == 1024);   // k_proj: 8192 -> 8 x 128
  CHECK(c.shape.gemms[6].k == 28672);  // down_proj: 28672 -> 8192
  const double attn = 8192.0 * 8192 * 2 + 8192.0 * 1024 * 2, mlp = 3.0 * 8192 * 28672, norms = 2.0 * 8192;
  CHECK(c.params == attn + mlp + norms);
  CHECK(c.linear_params == attn + mlp);
  // Every leaf's sequence-independent FLOPs: 2 per weight per token in the linears, and the norms', rotary's and
  // activation's few per element (0.013% here); the attention core 4 x q width x seq, halved by the causal mask.
  CHECK(c.matmul_flops_per_token > 2.0 * (attn + mlp));
  CHECK(c.matmul_flops_per_token == doctest::Approx(2.0 * (attn + mlp)).epsilon(2e-4));
  CHECK(c.attention_flops_per_token == doctest::Approx(4.0 * 8192 * 4096 * 0.5));
  // Every layer of this model has one structure, but the first one's input norm reads the embedding's output
  // (ModuleNode::reads_embedding, what a LoRA run keeps differs there): two classes, the same cost here.
  CHECK(g.layer_classes()[0] == 0);
  for (size_t l = 1; l < g.layer_classes().size(); ++l) CHECK(g.layer_classes()[l] == 1);
  const LayerCost last = layer_cost(in, g.layers().back());
  CHECK(last.params == c.params);
  CHECK(last.saved_bytes == c.saved_bytes);
}

// configs/models/tiny-moe.yaml under fsdp-run, fp32, 2 x 64 tokens: hidden 128, 8 routed experts of 96, top-2, one
// shared expert of 192 behind its gate. What the MoE block keeps for backward, per token, each tensor named in
// module_graph.cpp build_mlp_block and allocated by executor/model/moe.cpp: the router's input (128 x 4 B), fp32
// probabilities (8 x 4) and top-k indices (2 x 8); the dispatch indices (2 x 2 x 8), the experts' outputs in token
// order and their weights (2 x 128 x 4, 2 x 4); each token's k = 2 routed copies (2 x 128 x 4) with the experts'
// gate, activation, up and product (2 x 4 x 96 x 4); the shared expert's four (4 x 192 x 4), its gate's sigmoid (4)
// and the shared output it multiplies (128 x 4).
TEST_CASE("layer costs: an MoE block's saved tensors and its backward at the first expert (tiny-moe, fsdp-run)") {
  const ModuleGraph g(load_model("tiny-moe", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  Strategy s = tiny_moe_fp32();
  const ActivationQuery q = activation_query(s, rt);
  const ModuleId block = moe_block_of(g, g.layers().front());
  REQUIRE(g.node(block).kind == ModuleKind::Moe);
  const double router = 128 * 4 + 8 * 4 + 2 * 8, dispatch = 2 * 2 * 8, combine = 2 * 128 * 4 + 2 * 4;
  const double routed = 2 * 128 * 4 + 2 * 4 * 96 * 4, shared = 4 * 192 * 4 + 4 + 128 * 4;
  CHECK(g.saved_bytes_per_token(block, q, ActCkpt::None) == router + dispatch + combine + routed + shared);

  // The backward peaks at the first expert's (the last one autograd walks): the incoming and the block input's
  // gradients (2 x 128), the joined outputs' gradient with the 7 other experts' input gradients (2 x 2 x 128 less
  // the first expert's 2/8 share), that expert's two ffn-wide gradients for its 2/8 of the tokens, every weight
  // gradient but the first expert's gate and up projections, less what is released by then: the shared path's and
  // the weighting's saved tensors and 7/8 of the experts' (their gathered inputs stay: one buffer).
  const double tokens = 128, pb = 4;
  const double expert = 3 * 96 * 128, shared_params = 3 * 192 * 128 + 128;
  const double acts = tokens * pb * (2 * 128 + 2 * 2 * 128 - 0.25 * 128 + 2 * 0.25 * 96);
  const double grads = pb * (shared_params + 7 * expert + 96 * 128);
  const double released = tokens * (shared + combine + (routed - 2 * 128 * 4) * 7.0 / 8.0);
  LayerCostInput in{&g, &s, &rt, q, tokens};
  const LayerCost c = layer_cost(in, g.layers().front());
  CHECK(c.backward_transient == doctest::Approx(acts + grads - released));
  // fsdp-run measured 828,032 bytes for it (tests/accuracy/README.md "Q/k norms and MoE"): within 2%.
  CHECK(c.backward_transient == doctest::Approx(828032).epsilon(0.02));
}

// program/root_module_costs.hpp: the token embedding and the final norm of the Llama-3-70B shape (vocabulary 128256,
// hidden 8192), one sequence of 4096 tokens in bf16 under the eager `pytorch` runtime (HF RMSNorm: 32 bytes an
// element). The embedding's backward is ATen's embedding_backward_cuda_kernel: the zeroed gradient table, the
// output gradient read, fp32 partial sums written and read back, the rows written.
TEST_CASE("root module costs: the embedding lookup and its backward, the final norm, under tp and LoRA") {
  const ModuleGraph g(load_model("llama3-70b", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  Strategy s = batch_of(1, 4096);
  ModuleId embedding = g.root(), norm = g.root();
  for (ModuleId c : g.children(g.root())) {
    if (g.node(c).kind == ModuleKind::Embedding) embedding = c;
    if (g.node(c).kind == ModuleKind::Norm) norm = c;
  }
  REQUIRE(embedding != g.root());
  REQUIRE(norm != g.root());
  const double tokens = 4096, h = 8192, vocab = 128256, b = 2;
  RootModuleTraffic e = root_module_traffic(g, embedding, s, rt, activation_query(s, rt), tokens);
  CHECK(e.forward_bytes == doctest::Approx(2 * tokens * h * b));
  CHECK(e.backward_bytes == doctest::Approx(vocab * h * b + 2 * tokens * h * b + 2 * tokens * h * 4));
  const RootModuleTraffic n = root_module_traffic(g, norm, s, rt, activation_query(s, rt), tokens);
  CHECK(n.forward_bytes == doctest::Approx(tokens * h * 32));
  CHECK(n.backward_bytes == doctest::Approx(2 * tokens * h * 32));
  // Vocabulary-parallel over tp 4: a quarter of the table zeroed, the out-of-slice rows zeroed in forward; the final
  // norm on a quarter of the sequence (sequence parallelism).
  s.mesh.tp = 4;
  e = root_module_traffic(g, embedding, s, rt, activation_query(s, rt), tokens);
  CHECK(e.forward_bytes == doctest::Approx(4 * tokens * h * b));
  CHECK(e.backward_bytes == doctest::Approx(vocab / 4 * h * b + 2 * tokens * h * b + 2 * tokens * h * 4));
  CHECK(root_module_traffic(g, norm, s, rt, activation_query(s, rt), tokens).forward_bytes ==
        doctest::Approx(tokens / 4 * h * 32));
  // A frozen embedding (LoRA) gets no weight gradient: no backward kernel.
  s.mesh.tp = 1;
  s.method = Method::Lora;
  CHECK(root_module_traffic(g, embedding, s, rt, activation_query(s, rt), tokens).backward_bytes == 0.0);
  // The compiled runtime prices the norm as the layers' fused kernel: read x, write y.
  const RuntimeProfile compiled = load_runtime("pytorch-compile", FSDP_SOURCE_ROOT);
  s.method = Method::Full;
  CHECK(root_module_traffic(g, norm, s, compiled, activation_query(s, compiled), tokens).forward_bytes ==
        doctest::Approx(tokens * h * 2 * b));
}

TEST_CASE("saved tensors under LoRA: a frozen linear keeps its input only where it carries an adapter") {
  // Llama 3 8B, fp32 compute (4 bytes an element), flash attention. Adapters on q, k, v and o: the attention block
  // keeps what full training keeps (q, k and v read the one norm output; o's input is the attention core's saved
  // output), plus each adapter's rank-wide intermediate; the MLP's frozen gate, up and down keep nothing of their own:
  // the post-attention norm's output (hidden) and down's input, the gated product (ffn), are no longer saved; nor are
  // the two norms' normalised tensors (hidden each, in the compute dtype), which their weight multiply keeps for the
  // frozen weights' gradients only.
  const ModuleGraph g(load_model("llama3-8b", FSDP_SOURCE_ROOT));
  const ModelSpec& m = g.spec();
  const RuntimeProfile rt = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  Strategy full;
  full.param_dtype = DType::Fp32;
  full.master_dtype = DType::Fp32;
  full.seq_len = 4096;
  full.attention = AttentionImpl::Flash;
  Strategy lora = full;
  lora.method = Method::Lora;
  lora.lora.rank = 16;
  lora.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const ModuleId layer = g.layers()[3];
  const double f = g.saved_bytes_per_token(layer, activation_query(full, rt), ActCkpt::None);
  const double l = g.saved_bytes_per_token(layer, activation_query(lora, rt), ActCkpt::None);
  const double h = static_cast<double>(m.hidden_size);
  CHECK(f - l == doctest::Approx(4.0 * (h + static_cast<double>(m.ffn_size) - 4.0 * 16.0) + 2.0 * 4.0 * h));
  // Adapters on the MLP too: its linears' inputs are kept again (the norms' normalised tensors still are not).
  lora.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const double all = g.saved_bytes_per_token(layer, activation_query(lora, rt), ActCkpt::None);
  CHECK(all - f == doctest::Approx(4.0 * 7.0 * 16.0 - 2.0 * 4.0 * h));
  // The frozen LM head keeps no input; the final norm no normalised tensor.
  ModuleId head = g.root(), final_norm = g.root();
  for (ModuleId c : g.children(g.root())) {
    if (g.node(c).kind == ModuleKind::Head) head = c;
    if (g.node(c).kind == ModuleKind::Norm) final_norm = c;
  }
  REQUIRE(head != g.root());
  REQUIRE(final_norm != g.root());
  CHECK(g.saved_bytes_per_token(head, activation_query(full, rt), ActCkpt::None) == doctest::Approx(4.0 * h));
  CHECK(g.saved_bytes_per_token(head, activation_query(lora, rt), ActCkpt::None) == 0.0);
  CHECK(g.saved_bytes_per_token(final_norm, activation_query(full, rt), ActCkpt::None) -
            g.saved_bytes_per_token(final_norm, activation_query(lora, rt), ActCkpt::None) ==
        doctest::Approx(4.0 * h));
  // Eager attention: its PV matmul keeps no output, so a frozen o_proj without an adapter leaves the attention's
  // output unsaved (flash keeps it as the kernel's own).
  Strategy eager_lora = lora;
  eager_lora.attention = AttentionImpl::Eager;
  eager_lora.lora.target_modules = {"q_proj"};
  Strategy flash_lora = eager_lora;
  flash_lora.attention = AttentionImpl::Flash;
  Strategy eager_full = full;
  eager_full.attention = AttentionImpl::Eager;
  const double q_eager = g.saved_bytes_per_token(layer, activation_query(eager_lora, rt), ActCkpt::None);
  const double q_flash = g.saved_bytes_per_token(layer, activation_query(flash_lora, rt), ActCkpt::None);
  eager_lora.lora.target_modules = {"q_proj", "o_proj"};
  const double qo_eager = g.saved_bytes_per_token(layer, activation_query(eager_lora, rt), ActCkpt::None);
  CHECK(qo_eager - q_eager == doctest::Approx(4.0 * static_cast<double>(m.q_dim()) + 4.0 * 16.0));
  flash_lora.lora.target_modules = {"q_proj", "o_proj"};
  CHECK(g.saved_bytes_per_token(layer, activation_query(flash_lora, rt), ActCkpt::None) - q_flash ==
        doctest::Approx(4.0 * 16.0));
  // Full fine-tuning is as it was: every linear's input.
  CHECK_FALSE(activation_query(full, rt).frozen_base);
}

TEST_CASE("saved tensors under LoRA on an MoE layer, in the first layer, and fsdp-run's adapter casts (tiny-moe)") {
  // tiny-moe under fsdp-run, fp32, eager attention, 2 x 64 tokens: hidden 128, 8 routed experts of 96, top-2, one
  // shared expert of 192 behind its gate (the block's full-training set: the MoE test case above).
  const ModuleGraph g(load_model("tiny-moe", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  const Strategy s = tiny_moe_fp32();
  Strategy lora = s;
  lora.method = Method::Lora;
  lora.lora.rank = 8;
  lora.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const ModuleId block = moe_block_of(g, g.layers()[1]);
  REQUIRE(g.node(block).kind == ModuleKind::Moe);
  // Frozen experts without adapters: the router keeps its probabilities and choice but not its input (its only
  // gradient is the input's), the experts keep neither their gathered tokens nor their down projections' inputs
  // (their gate, activation and up outputs stay: the block input's gradient flows through them), the shared gate its
  // sigmoid and operand but not its input; the dispatch maps and the weighting's operands stay.
  const double router = 8 * 4 + 2 * 8, dispatch = 2 * 2 * 8, combine = 2 * 128 * 4 + 2 * 4;
  const double routed = 3 * 2 * 96 * 4, shared = 3 * 192 * 4 + 4 + 128 * 4;
  CHECK(g.saved_bytes_per_token(block, activation_query(lora, rt), ActCkpt::None) ==
        doctest::Approx(router + dispatch + combine + routed + shared));
  // Adapters on the experts' gate projections: each keeps its gathered tokens again (the router still not its
  // input, which the shared expert's adapted gate projection now keeps), with its rank-wide intermediate.
  lora.lora.target_modules = {"gate_proj"};
  const double adapted = g.saved_bytes_per_token(block, activation_query(lora, rt), ActCkpt::None);
  CHECK(adapted - (router + dispatch + combine + routed + shared) ==
        doctest::Approx(2 * 128 * 4 + 8 * 4 * (2.0 / 8.0) * 8 + 128 * 4 + 8 * 4));
  // The first layer's input norm keeps nothing under a frozen base (its input, the frozen embedding's output, needs
  // no gradient, nor its weight): the first layer is a class of its own and keeps less than the second by the norm's
  // input, its squares (fsdp-run's mean keeps them: norm_mean_keeps_input) and its statistics, fp32; with full
  // training they keep the same.
  lora.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  CHECK(g.layer_classes()[0] != g.layer_classes()[1]);
  const double first = g.saved_bytes_per_token(g.layers()[0], activation_query(lora, rt), ActCkpt::None);
  const double second = g.saved_bytes_per_token(g.layers()[1], activation_query(lora, rt), ActCkpt::None);
  CHECK(second - first == doctest::Approx(4.0 * (128 + 128 + 1)));
  CHECK(g.saved_bytes_per_token(g.layers()[0], activation_query(s, rt), ActCkpt::None) ==
        g.saved_bytes_per_token(g.layers()[1], activation_query(s, rt), ActCkpt::None));
  // With adapters on the experts' gate projections only, no gradient reaches the first layer's attention or its
  // post-attention norm (nothing before them trains), nor its router or shared gate: they keep nothing there; the
  // second layer's input carries the first layer's gradient, and its attention keeps what a frozen one keeps.
  lora.lora.target_modules = {"gate_proj"};
  auto part = [&](ModuleId layer, const std::string& short_name) {
    for (ModuleId c : g.children(layer))
      if (g.node(c).short_name == short_name)
        return g.saved_bytes_per_token(c, activation_query(lora, rt), ActCkpt::None);
    FAIL("no " << short_name);
    return 0.0;
  };
  for (const char* p : {"input_layernorm", "self_attn", "post_attention_layernorm"}) {
    CAPTURE(p);
    CHECK(part(g.layers()[0], p) == 0.0);
    CHECK(part(g.layers()[1], p) > 0.0);
  }
  // The router's probabilities and choice (8 x 4 + 2 x 8) and the shared gate's tensors (its sigmoid, 4, and the
  // shared output, 128 x 4) are not kept in the first layer's block.
  CHECK(part(g.layers()[1], "block_sparse_moe") - part(g.layers()[0], "block_sparse_moe") ==
        doctest::Approx(8 * 4 + 2 * 8 + 4 + 128 * 4));
  lora.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  // fsdp-run keeps the adapters as one fp32 leaf and casts them at each use: under bf16 a layer keeps its adapters'
  // casts (r x (in + out) per adapted linear, 2 bytes) beside its activations; in fp32 nothing is cast.
  const double tokens = 128;
  LayerCostInput fp32_in{&g, &lora, &rt, activation_query(lora, rt), tokens};
  const LayerCost fp32 = layer_cost(fp32_in, g.layers()[1]);
  const double adapters = 8.0 * ((128 + 128) + (128 + 64) + (128 + 64) + (128 + 128));
  CHECK(fp32.lora_params == adapters);
  Strategy bf16 = lora;
  bf16.param_dtype = DType::Bf16;
  LayerCostInput bf16_in{&g, &bf16, &rt, activation_query(bf16, rt), tokens};
  const LayerCost half = layer_cost(bf16_in, g.layers()[1]);
  CHECK(half.saved_bytes - tokens * g.saved_bytes_per_token(g.layers()[1], bf16_in.query, ActCkpt::None) ==
        doctest::Approx(2.0 * adapters));
  CHECK(fp32.saved_bytes == doctest::Approx(tokens * second));
}
