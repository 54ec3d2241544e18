// Activation checkpointing modes as the frameworks define them (issue M12): none, full, every:N (torchtitan's
// selective layer AC), fraction:P (fms-fsdp's selective_checkpointing), selective-op (torchtitan's per-op SAC) and
// selective (ours, the attention core), decided per decoder layer by layer_ckpt. Goldens on llama3-8b
// (configs/models/llama3-8b.yaml: hidden 4096, 32 query heads and 8 kv heads of 128, FFN 14336, 32 layers) at
// micro-batch 1, seq 4096, bf16, flash attention, on 8 H100-80GB.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "compute/compute_cost.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "sim_fixtures.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

constexpr double kTokens = 4096;  // micro-batch 1 x seq 4096

Strategy llama_strategy(ActCkpt ck, int64_t every = 1) {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Fp32;
  s.micro_batch = 1;
  s.seq_len = 4096;
  s.attention = AttentionImpl::Flash;
  s.act_ckpt = ck;
  s.ckpt_every = every;
  return s;
}

const ModuleGraph& llama3_8b() {
  static const ModuleGraph g(zoo("llama3-8b"));
  return g;
}

std::vector<std::string> short_names(const ModuleGraph& g, const std::vector<ModuleId>& ids) {
  std::vector<std::string> out;
  for (ModuleId id : ids) out.push_back(g.node(id).short_name);
  return out;
}

// The activations the forward ops of the decoder-layer units allocate (wrap layer: one unit per layer).
double layer_activations(const StepProgram& p) {
  double total = 0;
  for (const Op& op : p.ops)
    if (op.kind == OpKind::Forward && op.layers > 0 && op.micro_batch == 0)
      for (const MemEvent& e : op.on_issue)
        if (e.category == MemoryCategory::Activations) total += e.bytes;
  return total;
}

// Seconds of the program's compute-stream ops, each priced alone (no overlap).
double compute_seconds(const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s) {
  double t = 0;
  for (const Op& op : p.ops)
    if (op.stream == Stream::Compute) t += op_duration(op, p, hw, c, s);
  return t;
}

}  // namespace

TEST_CASE(
    "checkpointing names: parse and print round-trip exactly; every:1 and fraction:1 are full; bad values refused") {
  for (const std::string name :
       {"none", "full", "selective", "selective-op", "every:2", "every:7", "fraction:0.4", "fraction:0.75"}) {
    Strategy s;
    REQUIRE(parse_act_ckpt(name, s));
    CHECK(act_ckpt_name(s) == name);
  }
  Strategy s;
  REQUIRE(parse_act_ckpt("every:1", s));
  CHECK(s.act_ckpt == ActCkpt::Full);
  CHECK(s.ckpt_every == 1);
  CHECK(act_ckpt_name(s) == "full");
  REQUIRE(parse_act_ckpt("every:4", s));
  CHECK(s.act_ckpt == ActCkpt::Full);
  CHECK(s.ckpt_every == 4);
  CHECK(s.ckpt_fraction == 0);
  REQUIRE(parse_act_ckpt("fraction:0.4", s));
  CHECK(s.act_ckpt == ActCkpt::Full);
  CHECK(s.ckpt_every == 1);  // the one clears the other
  CHECK(s.ckpt_fraction == 0.4);
  CHECK_FALSE(checkpoints_every_layer(s));
  REQUIRE(parse_act_ckpt("fraction:1", s));
  CHECK(s.ckpt_fraction == 0);
  CHECK(checkpoints_every_layer(s));
  CHECK(act_ckpt_name(s) == "full");
  for (const std::string bad :
       {"every:0", "every:x", "every:", "every:-2", "every:2x", "Full", "selective_op", "", "fraction:0",
        "fraction:1.5", "fraction:", "fraction:x", "fraction:-0.5", "fraction:0.5x", "fraction:nan", "fraction:inf"}) {
    Strategy t;
    t.ckpt_every = 3;
    CHECK_FALSE(parse_act_ckpt(bad, t));
    CHECK(t.ckpt_every == 3);  // a refused name leaves the strategy as it was
  }
  // The mode alone (no N or P to carry): every:N with N >= 2 and fraction:P with P < 1 are refused.
  ActCkpt m{};
  CHECK_FALSE(parse_act_ckpt("every:2", m));
  CHECK_FALSE(parse_act_ckpt("fraction:0.5", m));
  CHECK(parse_act_ckpt("every:1", m));
  CHECK(m == ActCkpt::Full);
  CHECK(parse_act_ckpt("selective-op", m));
  CHECK(m == ActCkpt::SelectiveOp);
}

TEST_CASE("layer_ckpt: every:N checkpoints torchtitan's layers N-1, 2N-1, ...; the other modes apply to all") {
  Strategy s = llama_strategy(ActCkpt::Full, 2);
  for (int64_t l = 0; l < 32; ++l) CHECK(layer_ckpt(s, l) == (l % 2 == 1 ? ActCkpt::Full : ActCkpt::None));
  s.ckpt_every = 3;  // torchtitan's counter c = l + 1: c % 3 == 0 at layers 2, 5, 8, ...
  for (int64_t l = 0; l < 32; ++l) CHECK(layer_ckpt(s, l) == ((l + 1) % 3 == 0 ? ActCkpt::Full : ActCkpt::None));
  for (ActCkpt ck : {ActCkpt::None, ActCkpt::Full, ActCkpt::Selective, ActCkpt::SelectiveOp}) {
    s = llama_strategy(ck);
    for (int64_t l = 0; l < 32; ++l) CHECK(layer_ckpt(s, l) == ck);
  }
}

TEST_CASE("layer_ckpt: fraction:P checkpoints fms-fsdp's blocks, by hand") {
  // fms_fsdp/policies/ac_handler.py apply_fsdp_checkpointing: block c (from 1) when c x P >= cut-off, the cut-off
  // 1/2, then 3/2, 5/2, ... after each block checkpointed. Its docstring: P = 1/2 [ac, no-ac, ac, no-ac, ...],
  // P = 1/3 [no-ac, ac, no-ac, no-ac, ac, no-ac, ...], P = 2/3 [ac, no-ac, ac, ac, no-ac, ac, ...].
  auto checkpointed = [](double p, int64_t layers) {
    Strategy s = llama_strategy(ActCkpt::Full);
    s.ckpt_fraction = p;
    std::vector<int64_t> out;
    for (int64_t l = 0; l < layers; ++l)
      if (layer_ckpt(s, l) == ActCkpt::Full) out.push_back(l);
    return out;
  };
  CHECK(checkpointed(0.5, 8) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(checkpointed(1.0 / 3.0, 9) == std::vector<int64_t>{1, 4, 7});
  CHECK(checkpointed(2.0 / 3.0, 6) == std::vector<int64_t>{0, 2, 3, 5});
  // P = 0.4 over 16 blocks: c x 0.4 = 0.8 (c 2), 1.6 (4), 2.8 (7), 3.6 (9), 4.8 (12), 5.6 (14) reach 0.5, 1.5, ...
  CHECK(checkpointed(0.4, 16) == std::vector<int64_t>{1, 3, 6, 8, 11, 13});
  // The count is the fraction rounded half up: floor(L x P + 1/2) of L layers.
  for (double p : {0.1, 0.21, 0.39, 0.5, 0.73, 0.89})
    for (int64_t layers : {16, 32, 40, 48, 80}) {
      CAPTURE(p);
      CAPTURE(layers);
      CHECK(static_cast<double>(checkpointed(p, layers).size()) == std::floor(static_cast<double>(layers) * p + 0.5));
    }
}

TEST_CASE("selective-op: torchtitan's policy over a Llama layer's ops in forward order, by hand") {
  const ModuleGraph& g = llama3_8b();
  const OpSacLayer sac = g.op_sac(g.layers()[5]);
  // The aten.mm's of a layer count wq 1, wk 2, wv 3, wo 4, w1 5, w3 6, w2 7: the odd ones are saved, and the SDPA
  // kernel's outputs (torchtitan _apply_op_sac; module_graph.cpp ModuleGraph::op_sac).
  CHECK(short_names(g, sac.cached_ops) ==
        std::vector<std::string>{"q_proj", "v_proj", "attention", "gate_proj", "down_proj"});
  CHECK(short_names(g, sac.recomputed_mms) == std::vector<std::string>{"k_proj", "o_proj", "up_proj"});
  // Bytes kept per token, bf16 (2 bytes) and fp32 (4):
  //   layer input (the checkpoint's)  4096 x 2 =  8,192
  //   wq output                       4096 x 2 =  8,192
  //   wv output                       1024 x 2 =  2,048
  //   attention output                4096 x 2 =  8,192
  //   its log-sum-exp                   32 x 4 =    128
  //   w1 (gate) output               14336 x 2 = 28,672
  //   w2 (down) output                4096 x 2 =  8,192
  //                                             = 63,616 bytes per token: 260,571,136 bytes (248.5 MiB) per layer
  for (const char* rt_name : {"pytorch", "fsdp-run"}) {
    const RuntimeProfile rt = runtime(rt_name);
    const Strategy s = llama_strategy(ActCkpt::SelectiveOp);
    const ActivationQuery q = activation_query(s, rt);
    CHECK(g.saved_bytes_per_token(g.layers()[5], q, ActCkpt::SelectiveOp) == 63616.0);
    const LayerCostInput in{&g, &s, &rt, q, kTokens};
    const LayerCost c = layer_cost(in, g.layers()[5]);
    CHECK(c.ckpt == ActCkpt::SelectiveOp);
    CHECK(c.saved_bytes == 63616.0 * kTokens);
    // Backward rematerialises what the layer saves without checkpointing, less what the policy cached and autograd
    // would have saved anyway: the layer input (as the first norm's input: its bytes in the norm's dtype, at most
    // the cached bf16 copy), v, the attention output and log-sum-exp, and the gate output.
    const double input = std::min(tensor_bytes(TensorClass::NormInput, q), 2.0) * 4096;
    const double overlap = input + 1024 * 2 + 4096 * 2 + 32 * 4 + 14336 * 2;
    CHECK(c.recompute_bytes == doctest::Approx(c.saved_bytes_unckpt - overlap * kTokens));
    // The recomputed GEMMs are the even ones: k, o and up projections.
    std::vector<int> flagged;
    for (size_t i = 0; i < c.shape.gemms.size(); ++i)
      if (c.shape.gemms[i].op_sac_recomputed) flagged.push_back(static_cast<int>(i));
    CHECK(flagged == std::vector<int>{1, 3, 5});
    const double h = 4096, kv = 1024, ffn = 14336;
    CHECK(c.recompute_matmul_flops_per_token == 2.0 * (h * kv + h * h + h * ffn));
  }
}

TEST_CASE("selective-op compiled: the partitioner keeps only the cached outputs the backward reads") {
  const ModuleGraph& g = llama3_8b();
  const ModuleId layer = g.layers()[5];
  // Of the cached outputs only w2's (down_proj) feeds no module and is saved by none: the residual sum reads it, and
  // an add's backward reads nothing. wq's output feeds the rotary, wv's and the attention's the core and o_proj, w1's
  // the SiLU: the backward (or its recomputation) reads each.
  CHECK(g.op_sac(layer).unread == std::vector<std::string>{"layers.5.mlp.out"});
  const Strategy s = llama_strategy(ActCkpt::SelectiveOp);
  ActivationQuery q = activation_query(s, runtime("torchtitan"));
  CHECK(q.sac_keeps_unread_outputs);  // eager: 63,616 bytes per token (the by-hand case above)
  CHECK(g.saved_bytes_per_token(layer, q, ActCkpt::SelectiveOp) == 63616.0);
  q = activation_query(s, runtime("torchtitan-compile"));
  CHECK_FALSE(q.sac_keeps_unread_outputs);  // compiled: less w2's output, 4096 x 2 = 8,192 bytes per token
  CHECK(g.saved_bytes_per_token(layer, q, ActCkpt::SelectiveOp) == 63616.0 - 8192.0);
  // Gemma 2's post-feedforward norm saves the down projection's output (its input): read, so kept compiled too.
  const ModuleGraph gemma(zoo("gemma2-9b"));
  CHECK(gemma.op_sac(gemma.layers()[0]).unread.empty());
}

TEST_CASE("selective-op follows op order, not Llama's indices: biased linears, GPT-2's MLP, MoE routers") {
  // Qwen2-style q/k/v biases: a biased linear is aten.addmm, neither saved nor counted; the count starts at o_proj.
  ModelSpec m = zoo("llama3-8b");
  m.num_layers = 2;
  m.qkv_bias = true;
  const ModuleGraph biased(m);
  const OpSacLayer b = biased.op_sac(biased.layers()[0]);
  CHECK(short_names(biased, b.cached_ops) == std::vector<std::string>{"attention", "o_proj", "up_proj"});
  CHECK(short_names(biased, b.recomputed_mms) ==
        std::vector<std::string>{"q_proj", "k_proj", "v_proj", "gate_proj", "down_proj"});
  // An MoE layer: the router is force-recomputed and routed experts run grouped GEMMs (not saved).
  const ModuleGraph moe(zoo("mixtral-8x7b"));
  const OpSacLayer e = moe.op_sac(moe.layers()[0]);
  CHECK(short_names(moe, e.cached_ops) == std::vector<std::string>{"q_proj", "v_proj", "attention"});
  for (ModuleId id : e.recomputed_mms) {
    const ModuleNode& n = moe.node(id);
    if (n.kind == ModuleKind::Router) continue;
    if (n.short_name == "k_proj" || n.short_name == "o_proj") continue;
    CHECK(n.name.find(".experts.") != std::string::npos);
  }
}

TEST_CASE("memory goldens per mode on llama3-8b: saved bytes per layer; every:2 is the mean of none and full") {
  const ModuleGraph& g = llama3_8b();
  const RuntimeProfile rt = runtime("pytorch");
  struct Golden {
    ActCkpt ck;
    int64_t every;
    double bytes_per_token;  // per checkpointed-mode layer
  };
  // none: every tensor autograd saves with the pytorch runtime's HF modules, per token:
  //   2 norms: fp32 input 4096 x 4, rstd 4, the normalised bf16 copy 4096 x 2     2 x 24,580 = 49,160
  //   the q/k/v and gate/up linears' inputs (the norms' outputs), 4096 x 2      2 x  8,192 = 16,384
  //   flash attention: q, k, v, output (4096, 1024, 1024, 4096 x 2), lse 32 x 4             = 20,608
  //   SiLU's input, its output and the up projection (gating), down's input: 4 x 14336 x 2 = 114,688
  //                                                                                        = 200,840
  // full: the layer's input, 4096 x 2; selective (ours): none less the attention core's log-sum-exp (32 x 4);
  // selective-op: the hand count above.
  const double none = 200840.0;
  const std::vector<Golden> goldens{{ActCkpt::None, 1, none},
                                    {ActCkpt::Full, 1, 8192.0},
                                    {ActCkpt::Selective, 1, none - 32 * 4},
                                    {ActCkpt::SelectiveOp, 1, 63616.0}};
  for (const Golden& gd : goldens) {
    const Strategy s = llama_strategy(gd.ck, gd.every);
    const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), kTokens};
    CAPTURE(act_ckpt_name(s));
    CHECK(layer_cost(in, g.layers()[0]).saved_bytes == doctest::Approx(gd.bytes_per_token * kTokens));
    const StepProgram p = program(g, s, rt, 1, 8);
    CHECK(layer_activations(p) == doctest::Approx(32 * gd.bytes_per_token * kTokens));
  }
  // every:2: 16 layers checkpointed (1, 3, ..., 31) and 16 not: per layer pair, none + full.
  const Strategy s = llama_strategy(ActCkpt::Full, 2);
  const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), kTokens};
  CHECK(layer_cost(in, g.layers()[0]).saved_bytes == doctest::Approx(none * kTokens));
  CHECK(layer_cost(in, g.layers()[1]).saved_bytes == doctest::Approx(8192.0 * kTokens));
  const StepProgram p = program(g, s, rt, 1, 8);
  CHECK(layer_activations(p) == doctest::Approx(16 * (none + 8192.0) * kTokens));
  // Under wrap every:4 (units of four layers, one op each) the same bytes, summed per unit.
  Strategy s4 = s;
  s4.wrap = WrapPolicy{WrapKind::EveryK, 4, 0};
  CHECK(layer_activations(program(g, s4, rt, 1, 8)) == doctest::Approx(16 * (none + 8192.0) * kTokens));
  // The peak: full < every:2 < none, and selective-op between full and none.
  auto peak = [&](const Strategy& st) {
    const HardwareProfile hw = hardware("h100-80gb");
    return simulate(SimulationInput{&g, &hw, &rt, Cluster{1, 8}, st}).memory.peak_allocated;
  };
  const double p_none = peak(llama_strategy(ActCkpt::None)), p_full = peak(llama_strategy(ActCkpt::Full));
  const double p_every = peak(s), p_op = peak(llama_strategy(ActCkpt::SelectiveOp));
  CHECK(p_full < p_every);
  CHECK(p_every < p_none);
  CHECK(p_full < p_op);
  CHECK(p_op < p_none);
}

TEST_CASE("time per mode on llama3-8b, 8 x H100: what each mode recomputes, priced layer by layer") {
  const ModuleGraph& g = llama3_8b();
  const RuntimeProfile rt = runtime("pytorch");
  const HardwareProfile hw = hardware("h100-80gb");
  const Cluster c{1, 8};
  const DType dt = DType::Bf16;
  const double fwd_ratio = hw.matmul_forward_ratio(dt);
  // One layer's pieces, priced as op_cost.cpp prices them: its GEMMs (x W^T), the attention forward, the memory-bound
  // traffic of its forward.
  const Strategy none_s = llama_strategy(ActCkpt::None);
  const StepProgram none_p = program(g, none_s, rt, 1, 8);
  const LayerShape& shape = none_p.layer_shapes.at(0);
  double gemms = 0, sac_gemms = 0;
  for (const GemmShape& gs : shape.gemms) {
    const double t = matmul_time(hw, gs.m, gs.n, gs.k, dt).value;
    gemms += t;
    if (gs.op_sac_recomputed) sac_gemms += t;
  }
  const AttentionShape a{1, 4096, 32, 8, 128, true};  // batch, seq, heads, kv heads, head dim, causal
  const double attn_fwd = attention_forward_time(hw, a, dt).value;
  const LayerCostInput in{&g, &none_s, &rt, activation_query(none_s, rt), kTokens};
  const double ew = kTokens * layer_cost(in, g.layers()[0]).elementwise_bytes_per_token;
  const double ew_again =
      memory_bound_time(hw, Bytes(3.0 * ew), dt).value - memory_bound_time(hw, Bytes(2.0 * ew), dt).value;
  const HostOverhead& ho = hw.host_overhead(dt);
  // What a layer's backward adds per mode: full reruns all its GEMMs, the attention forward and the memory-bound
  // kernels; selective-op the GEMMs it did not cache (k, o, up) and the memory-bound kernels, not the attention
  // (the SDPA output is cached); ours the attention forward only.
  const double add_full = fwd_ratio * gemms + attn_fwd + ew_again + ho.layer_forward.value;
  const double add_op = fwd_ratio * sac_gemms + ew_again + ho.layer_forward.value;
  const double add_sel = attn_fwd;
  const double base = compute_seconds(none_p, hw, c, none_s);
  auto added = [&](const Strategy& s) { return compute_seconds(program(g, s, rt, 1, 8), hw, c, s) - base; };
  CHECK(added(llama_strategy(ActCkpt::Full)) == doctest::Approx(32 * add_full).epsilon(1e-9));
  CHECK(added(llama_strategy(ActCkpt::SelectiveOp)) == doctest::Approx(32 * add_op).epsilon(1e-9));
  CHECK(added(llama_strategy(ActCkpt::Selective)) == doctest::Approx(32 * add_sel).epsilon(1e-9));
  // every:2: half the layers as full, half as none, for units of one layer and of four.
  CHECK(added(llama_strategy(ActCkpt::Full, 2)) == doctest::Approx(16 * add_full).epsilon(1e-9));
  Strategy every4 = llama_strategy(ActCkpt::Full, 2);
  every4.wrap = WrapPolicy{WrapKind::EveryK, 4, 0};
  Strategy none4 = none_s;
  none4.wrap = every4.wrap;
  CHECK(compute_seconds(program(g, every4, rt, 1, 8), hw, c, every4) -
            compute_seconds(program(g, none4, rt, 1, 8), hw, c, none4) ==
        doctest::Approx(16 * add_full).epsilon(1e-9));
  // The per-op policy recomputes 3 of 7 GEMMs, less than full, more than nothing.
  CHECK(sac_gemms > 0);
  CHECK(sac_gemms < 0.5 * gemms);
  // The whole step, printed for the record (issue M12's golden numbers): none <= every:2 <= full, and the per-op
  // policy between none and full.
  auto step = [&](const Strategy& s) {
    const Prediction pr = simulate(SimulationInput{&g, &hw, &rt, c, s});
    const LayerCostInput lin{&g, &s, &rt, activation_query(s, rt), kTokens};
    MESSAGE(act_ckpt_name(s) << ": step " << pr.time.step_s << " s, peak " << pr.memory.peak_allocated / 1073741824.0
                             << " GiB; saved bytes of layers 0, 1: " << layer_cost(lin, g.layers()[0]).saved_bytes
                             << ", " << layer_cost(lin, g.layers()[1]).saved_bytes);
    return pr.time.step_s;
  };
  const double t_none = step(none_s), t_sel = step(llama_strategy(ActCkpt::Selective));
  const double t_op = step(llama_strategy(ActCkpt::SelectiveOp)), t_every = step(llama_strategy(ActCkpt::Full, 2));
  const double t_full = step(llama_strategy(ActCkpt::Full));
  CHECK(t_none <= t_every);
  CHECK(t_every <= t_full);
  CHECK(t_none <= t_op);
  CHECK(t_op <= t_full);
  CHECK(t_none <= t_sel);
}

TEST_CASE(
    "every:2, fraction:0.6 and selective-op walk balanced and time finite for every strategy, wrap, world and "
    "runtime") {
  const ModuleGraph g(load_model(std::string(FSDP_TEST_DATA) + "/models/acc-small.yaml", root()));
  const RuntimeProfile runtimes[] = {runtime("fsdp-run"), runtime("pytorch")};
  const HardwareProfile hws[] = {hardware("cpu"), hardware("a100-80gb")};
  const WrapPolicy wraps[] = {{WrapKind::Layer, 1, 0}, {WrapKind::EveryK, 2, 0}, {WrapKind::Model, 1, 0}};
  int simulated = 0;
  for (const auto& hw : hws)
    for (const auto& rt : runtimes)
      for (StrategyKind k : {StrategyKind::NoShard, StrategyKind::Ddp, StrategyKind::Zero1, StrategyKind::Zero2,
                             StrategyKind::Zero3, StrategyKind::Fsdp, StrategyKind::FsdpGradOp, StrategyKind::Hsdp})
        for (int64_t world : {1, 2, 4})
          for (const WrapPolicy& w : wraps)
            for (const auto& [ck, every, fraction] :
                 {std::tuple{ActCkpt::Full, int64_t{2}, 0.0}, std::tuple{ActCkpt::Full, int64_t{1}, 0.6},
                  std::tuple{ActCkpt::SelectiveOp, int64_t{1}, 0.0}})
              for (AttentionImpl attn : {AttentionImpl::Eager, AttentionImpl::Sdpa})
                for (DType pd : {DType::Bf16, DType::Fp32}) {
                  Strategy s;
                  s.kind = k;
                  s.hsdp_group = k == StrategyKind::Hsdp ? std::max<int64_t>(1, world / 2) : 0;
                  s.wrap = w;
                  s.act_ckpt = ck;
                  s.ckpt_every = every;
                  s.ckpt_fraction = fraction;
                  s.param_dtype = pd;
                  s.reduce_dtype = DType::Fp32;
                  s.micro_batch = 2;
                  s.seq_len = 64;
                  s.grad_accum = 2;
                  s.attention = attn;
                  const Cluster c{1, world};
                  INFO(to_string(k) << " " << to_string(w) << " " << act_ckpt_name(s) << " world " << world << " "
                                    << hw.name << " " << rt.name);
                  StepProgram p;
                  const Prediction pr = simulate(SimulationInput{&g, &hw, &rt, c, s}, &p);
                  ++simulated;
                  for (double b : pr.memory.breakdown) CHECK(b >= 0);
                  CHECK(std::isfinite(pr.time.step_s));
                  CHECK(pr.time.step_s > 0);
                  // The search's pruning bound holds for these modes too: the peak never falls as the batch grows.
                  Strategy bigger = s;
                  bigger.micro_batch = 4;
                  CHECK(simulate(SimulationInput{&g, &hw, &rt, c, bigger}).memory.device_total >=
                        pr.memory.device_total);
                  // Between no checkpointing and full checkpointing of every layer: the layers' saved activations
                  // and the compute ops' time.
                  Strategy none = s, full = s;
                  none.act_ckpt = ActCkpt::None;
                  none.ckpt_every = 1;
                  none.ckpt_fraction = 0;
                  full.act_ckpt = ActCkpt::Full;
                  full.ckpt_every = 1;
                  full.ckpt_fraction = 0;
                  const StepProgram pn = program(g, none, rt, 1, world), pf = program(g, full, rt, 1, world);
                  CHECK(layer_activations(p) <= layer_activations(pn));
                  CHECK(layer_activations(p) >= layer_activations(pf));
                  const double t = compute_seconds(p, hw, c, s);
                  CHECK(t >= compute_seconds(pn, hw, c, none) * (1 - 1e-9));
                  CHECK(t <= compute_seconds(pf, hw, c, full) * (1 + 1e-9));
                }
  MESSAGE("simulated " << simulated << " configurations");
}
