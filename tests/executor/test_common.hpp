// Common header of the executor tests. LibTorch headers come BEFORE doctest: glog's
// CHECK macros (pulled in by c10) would otherwise replace doctest's silently.
#pragma once

#include <ATen/ATen.h>
// clang-format off
#include <doctest/doctest.h>
// clang-format on

#include <cstdint>
#include <map>
#include <string>

#include "planfile/plan_file.hpp"

namespace fsdp::exec::test {

// A very small Llama-shaped model whose unit sizes are odd (hidden 63, ffn 91,
// vocab 251), so every world size > 1 pads its flat shards; GQA (4 heads, 2 kv heads).
inline ModelSpec small_model() {
  ModelSpec m;
  m.name = "exec-test";
  m.family = "decoder";
  m.hidden_size = 63;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
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

inline PlanFile small_plan(StrategyKind kind, const std::string& wrap, int world, int64_t micro_batch = 2) {
  PlanFile p;
  p.model_name = "exec-test";
  p.model = small_model();
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
  return p;
}

// ||a - b|| / ||b||, the relative error measure of the equivalence tests.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double nb = b.to(at::kDouble).norm().item<double>();
  const double d = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  return nb == 0 ? d : d / nb;
}

}  // namespace fsdp::exec::test
