// program/layer_costs.hpp: a layer's costs read from its own nodes of the module graph (golden numbers for the
// Llama-3-70B shape of configs/models/llama3-70b.yaml: hidden 8192, 64 query heads and 8 kv heads of 128, FFN
// 28672, Meta's model card).
#include <doctest/doctest.h>

#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"

using namespace fsdp;

TEST_CASE("layer costs: the attention shape, GEMMs and parameters come from the layer's nodes") {
  const ModuleGraph g(load_model("llama3-70b", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  Strategy s;
  s.micro_batch = 1;
  s.seq_len = 4096;
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
  // Every layer of this model has one structure: one class, the same cost.
  for (int64_t cls : g.layer_classes()) CHECK(cls == 0);
  const LayerCost last = layer_cost(in, g.layers().back());
  CHECK(last.params == c.params);
  CHECK(last.saved_bytes == c.saved_bytes);
}
