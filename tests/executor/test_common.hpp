// Common header of the executor tests. LibTorch headers come BEFORE doctest: glog's
// CHECK macros (pulled in by c10) would otherwise replace doctest's silently.
#pragma once

#include <ATen/ATen.h>
// clang-format off
#include <doctest/doctest.h>
// clang-format on

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "planfile/plan_file.hpp"

namespace fsdp::exec::test {

// The outcome of a shell command line: exit code and stdout + stderr together.
struct ShellResult {
  int code = -1;
  std::string out;
};

inline ShellResult sh(const std::string& cmd) {
  ShellResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// A very small Llama-shaped model (RMSNorm, RoPE, SwiGLU, grouped-query attention with
// 3 query heads sharing 1 kv head). Unit sizes are 2 mod 4 (hidden 66, ffn 91, vocab 251),
// so world size 4 pads every flat shard.
inline ModelSpec small_model() {
  ModelSpec m;
  m.name = "exec-test";
  m.family = "decoder";
  m.hidden_size = 66;
  m.num_layers = 3;
  m.num_heads = 3;
  m.num_kv_heads = 1;
  m.head_dim = 22;
  m.ffn_size = 91;
  m.gated_mlp = true;
  m.activation = ActivationFn::Silu;
  m.vocab_size = 251;
  m.tied_embeddings = false;
  m.norm = NormType::RmsNorm;
  m.norm_eps = 1e-5;
  m.position_embedding = PositionEmbedding::Rope;
  m.rope_theta = 10000;
  m.max_positions = 64;
  return m;
}

// A GPT-2-shaped variant (LayerNorm, learned positions, GELU MLP, biases, tied head) whose
// unit sizes are odd (hidden 63, ffn 91), so world sizes 2 and 4 both pad.
inline ModelSpec small_gpt_model() {
  ModelSpec m = small_model();
  m.name = "exec-test-gpt";
  m.hidden_size = 63;
  m.num_heads = 3;
  m.num_kv_heads = 3;
  m.head_dim = 21;
  m.gated_mlp = false;
  m.activation = ActivationFn::GeluTanh;
  m.tied_embeddings = true;
  m.norm = NormType::LayerNorm;
  m.position_embedding = PositionEmbedding::Learned;
  m.rope_theta = 0;
  // No qkv bias: the key bias's gradient is analytically zero (softmax is shift-invariant),
  // so Adam would amplify rounding noise in it and no two summation orders agree.
  m.qkv_bias = false;
  m.attn_out_bias = true;
  m.mlp_bias = true;
  return m;
}

// small_model with Qwen3's q/k norms per head (Qwen3Attention: q_norm, k_norm over head_dim before rotary).
inline ModelSpec small_qwen3_model() {
  ModelSpec m = small_model();
  m.name = "exec-test-qwen3";
  m.qk_norm = QkNorm::PerHead;
  return m;
}

// small_model's attention with MoE MLPs after a dense first layer: 5 routed experts of 29, top-2, the probabilities
// as they are (Qwen2-MoE's norm_topk_prob false), one shared expert of 37 behind its sigmoid gate (Qwen2-MoE). Odd
// sizes, so every world size pads; mixtral_like turns it into Mixtral's block (renormalised top-k, no shared expert).
inline ModelSpec small_moe_model(bool mixtral_like = false) {
  ModelSpec m = small_model();
  m.name = mixtral_like ? "exec-test-mixtral" : "exec-test-moe";
  MoeSpec e;
  e.num_experts = 5;
  e.experts_per_token = 2;
  e.expert_ffn_size = 29;
  e.shared_experts = mixtral_like ? 0 : 1;
  e.shared_expert_ffn_size = mixtral_like ? 0 : 37;
  e.shared_expert_gate = !mixtral_like;
  e.norm_topk_prob = mixtral_like;
  e.first_dense_layers = 1;
  m.moe = e;
  return m;
}

// AdamW's epsilon of the equivalence plans: 1e-6, not torch's 1e-8. AdamW's first update of an element is
// lr * g / (|g| + eps), lr times its sign for any |g| well above eps, so an element whose gradient is at rounding
// level (a sum whose order follows the micro-batch's shape: the reference's GEMMs over world x micro-batch rows, a
// rank's over its own rows and then the all-reduce) moves by +-lr in either run. With 1e-8 the dense model at world 4
// differed from the reference by 1.47e-5 (layers.2.mlp.up_proj) on a Xeon whose OpenBLAS picks its AVX-512 SGEMM
// kernels (2026-12-05), and by less than 1e-5 with its AVX2 kernels (OPENBLAS_CORETYPE=Haswell), losses and gradient
// norms within 1e-6 either way; the MoE, LoRA and mesh suites met the same at world 4 before.
constexpr double kEquivalenceEps = 1e-6;

inline PlanFile small_plan(StrategyKind kind, const std::string& wrap, int world, int64_t micro_batch = 2,
                           const ModelSpec& model = small_model()) {
  PlanFile p;
  p.model_name = model.name;
  p.model = model;
  p.cluster.hardware = "cpu";
  p.cluster.device = "cpu";
  p.cluster.nodes = 1;
  p.cluster.gpus_per_node = world;
  p.strategy.kind = kind;
  p.strategy.hsdp_group = kind == StrategyKind::Hsdp ? std::max(1, world / 2) : 0;
  parse_wrap(wrap, p.strategy.wrap);
  p.strategy.param_dtype = DType::Fp32;
  p.strategy.reduce_dtype = DType::Fp32;
  p.strategy.master_dtype = DType::Fp32;
  p.strategy.micro_batch = micro_batch;
  p.strategy.seq_len = 24;
  p.strategy.grad_accum = 1;
  p.strategy.attention = AttentionImpl::Sdpa;
  p.training.lr = 1e-3;
  p.training.weight_decay = 0.1;
  p.training.grad_clip = 1.0;
  p.training.eps = kEquivalenceEps;
  return p;
}

// ||a - b|| / ||b||, the relative error measure of the equivalence tests.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double nb = b.to(at::kDouble).norm().item<double>();
  const double d = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  return nb == 0 ? d : d / nb;
}

}  // namespace fsdp::exec::test
