// Expert parallelism (MeshSpec::ep, program/expert_parallel.hpp): what a rank stores, gathers, computes and sends of a
// mixture-of-experts model's routed experts, against the model's own counts, and the plans rule ExpertParallel
// refuses.
//
// Golden numbers: Mixtral 8x7B (configs/models/mixtral-8x7b.yaml: 32 layers, hidden 4096, 8 experts of width 14336,
// top 2) has 3 x 4096 x 14336 = 176,160,768 parameters per expert, 1,409,286,144 routed per layer; one micro-batch of
// 2 x 4096 tokens dispatches 8192 x 2 token copies of 4096 elements, 134,217,728 bytes in bf16, per all-to-all.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "model/module_graph.hpp"
#include "program/expert_parallel.hpp"
#include "program/layer_costs.hpp"
#include "program/step_program.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using namespace fsdp;

constexpr double kExpertParams = 3.0 * 4096.0 * 14336.0;
constexpr double kRoutedPerLayer = 8.0 * kExpertParams;
constexpr double kDispatchBytes = 8192.0 * 2.0 * 4096.0 * 2.0;

Strategy mixtral_fsdp(int64_t ep) {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.act_ckpt = ActCkpt::Full;
  s.micro_batch = 2;
  s.seq_len = 4096;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Fp32;
  s.mesh.ep = ep;
  return s;
}

double sum_events(const StepProgram& p, MemoryCategory c, bool persistent) {
  double b = 0;
  if (persistent) {
    for (const MemEvent& e : p.persistent)
      if (e.category == c) b += e.bytes;
    return b;
  }
  return b;
}

// The unsharded parameter bytes the first forward gather of layer unit `unit` allocates.
double gathered_bytes_of(const StepProgram& p, int unit) {
  for (const Op& op : p.ops)
    if (op.kind == OpKind::Gather && op.unit == unit && op.phase == Phase::FwdAllGather)
      for (const MemEvent& e : op.on_issue)
        if (e.category == MemoryCategory::UnshardedParams) return e.bytes;
  return 0;
}

}  // namespace

TEST_CASE("expert parallel: Mixtral's routed experts are counted from its graph") {
  const RuntimeProfile rt = fsdp::test::runtime("torchtitan");
  const Strategy s = mixtral_fsdp(1);
  auto cost_of = [&](const ModuleGraph& g, ModuleId layer) {
    return layer_cost(LayerCostInput{&g, &s, &rt, activation_query(s, rt), 8192.0}, layer);
  };
  const ModuleGraph g(fsdp::test::zoo("mixtral-8x7b"));
  for (ModuleId layer : g.layers()) {
    const LayerCost lc = cost_of(g, layer);
    CHECK(lc.routed_params == doctest::Approx(kRoutedPerLayer).epsilon(1e-12));
    // Top 2 of hidden-wide rows per token.
    CHECK(lc.dispatch_elems_per_token == doctest::Approx(2.0 * 4096.0).epsilon(1e-12));
    // Each routed expert's linear is flagged for the ep transform, the router's and attention's are not.
    size_t routed = 0;
    for (const GemmShape& gs : lc.shape.gemms) routed += gs.routed ? 1 : 0;
    CHECK(routed == 8 * 3);
  }
  // A dense model has none.
  const ModuleGraph dense(fsdp::test::zoo("llama3-8b"));
  const LayerCost lc = cost_of(dense, dense.layers().front());
  CHECK(lc.routed_params == 0);
  CHECK(lc.dispatch_elems_per_token == 0);
  CHECK(ep_layer_all_to_alls(lc, true, 8, 8192.0, 2.0).calls == 0);
}

TEST_CASE("expert parallel: a rank stores what FSDP alone stores, gathers its own experts and computes as much") {
  const ModuleGraph g(fsdp::test::zoo("mixtral-8x7b"));
  const RuntimeProfile rt = fsdp::test::runtime("torchtitan");
  const StepProgram base = fsdp::test::program(g, mixtral_fsdp(1), rt, 2, 8);
  const double layer_params = static_cast<double>(base.units[1].params);
  for (int64_t ep : {2, 4, 8}) {
    CAPTURE(ep);
    const StepProgram p = fsdp::test::program(g, mixtral_fsdp(ep), rt, 2, 8);
    REQUIRE(p.units.size() == base.units.size());
    // The shards (E/ep experts over shard/ep ranks) are the same bytes as E experts over the shard.
    for (MemoryCategory c : {MemoryCategory::ShardedParams, MemoryCategory::OptimizerStates})
      CHECK(sum_events(p, c, true) == doctest::Approx(sum_events(base, c, true)).epsilon(1e-9));
    // A layer gathers its dense parameters and its own E/ep experts, in bf16 (padding to the 16 ranks aside).
    const double expected = 2.0 * (layer_params - kRoutedPerLayer + kRoutedPerLayer / static_cast<double>(ep));
    CHECK(gathered_bytes_of(p, 1) == doctest::Approx(expected).epsilon(1e-6));
    CHECK(gathered_bytes_of(p, 1) < gathered_bytes_of(base, 1));
    // Balanced routing: the same GEMM FLOPs in E/ep experts' GEMMs of ep times the tokens.
    double base_flops = 0, flops = 0;
    size_t base_routed = 0, routed = 0;
    for (const GemmShape& gs : base.layer_shapes[0].gemms) {
      base_flops += 2.0 * static_cast<double>(gs.m) * gs.weight * static_cast<double>(gs.n * gs.k);
      base_routed += gs.routed ? 1 : 0;
    }
    for (const GemmShape& gs : p.layer_shapes[0].gemms) {
      flops += 2.0 * static_cast<double>(gs.m) * gs.weight * static_cast<double>(gs.n * gs.k);
      routed += gs.routed ? 1 : 0;
      if (gs.routed) CHECK(gs.weight == doctest::Approx(2.0 / 8.0 * static_cast<double>(ep)));
    }
    CHECK(flops == doctest::Approx(base_flops).epsilon(1e-12));
    CHECK(routed * static_cast<size_t>(ep) == base_routed);
    // Per micro-batch: each layer's dispatch and combine forward, their reverses and the recomputed forward's
    // (full checkpointing) backward, every one of the micro-batch's token copies.
    int forward_calls = 0, backward_calls = 0;
    for (const Op& op : p.ops) {
      if (op.kind != OpKind::EpAllToAll || op.micro_batch != 0) continue;
      CHECK(op.group == GroupKind::Expert);
      CHECK(op.collective == CollectiveKind::AllToAll);
      CHECK(op.comm_bytes == doctest::Approx(kDispatchBytes));
      (op.phase == Phase::EpForwardAllToAll ? forward_calls : backward_calls) += op.comm_calls;
    }
    CHECK(forward_calls == 2 * 32);
    CHECK(backward_calls == 4 * 32);
  }
  // ep = the shard group: every rank holds its own experts whole, and the experts' FSDP gather moves nothing.
  const Strategy whole = mixtral_fsdp(8);
  const StepProgram one_node = fsdp::test::program(g, whole, rt, 1, 8);
  const StepProgram dense_only = fsdp::test::program(g, mixtral_fsdp(1), rt, 1, 8);
  double wire = 0, wire_dense = 0;
  for (const Op& op : one_node.ops)
    if (op.kind == OpKind::Gather && op.unit == 1 && op.phase == Phase::FwdAllGather) wire = op.comm_bytes;
  for (const Op& op : dense_only.ops)
    if (op.kind == OpKind::Gather && op.unit == 1 && op.phase == Phase::FwdAllGather) wire_dense = op.comm_bytes;
  CHECK(wire == doctest::Approx(wire_dense * (layer_params - kRoutedPerLayer) / layer_params).epsilon(1e-3));
  // The per-op policy saves all_to_all_single's output: no exchange again in backward.
  Strategy sac = mixtral_fsdp(8);
  sac.act_ckpt = ActCkpt::SelectiveOp;
  int sac_backward = 0;
  for (const Op& op : fsdp::test::program(g, sac, rt, 2, 8).ops)
    if (op.kind == OpKind::EpAllToAll && op.micro_batch == 0 && op.phase == Phase::EpBackwardAllToAll)
      sac_backward += op.comm_calls;
  CHECK(sac_backward == 2 * 32);
}

TEST_CASE("expert parallel: a rank's MoE backward holds what a model of its E/ep experts holds") {
  // Balanced routing: at ep 2 a rank walks back 4 of tiny-moe's 8 experts, which received all its token copies, and
  // only those 4 have weight gradients: the block's working memory is the same model's with 4 experts, at ep 1.
  const RuntimeProfile rt = fsdp::test::runtime("torchtitan");
  ModelSpec eight = fsdp::test::zoo("tiny-moe");
  ModelSpec four = eight;
  four.moe->num_experts = 4;
  const ModuleGraph g8(eight), g4(four);
  for (ActCkpt ck : {ActCkpt::None, ActCkpt::Full}) {
    CAPTURE(to_string(ck));
    Strategy s = mixtral_fsdp(2);
    s.act_ckpt = ck;
    Strategy whole = s;
    whole.mesh.ep = 1;
    const LayerCost split = layer_cost(LayerCostInput{&g8, &s, &rt, activation_query(s, rt), 256.0}, g8.layers()[0]);
    const LayerCost half =
        layer_cost(LayerCostInput{&g4, &whole, &rt, activation_query(whole, rt), 256.0}, g4.layers()[0]);
    const LayerCost all =
        layer_cost(LayerCostInput{&g8, &whole, &rt, activation_query(whole, rt), 256.0}, g8.layers()[0]);
    REQUIRE(split.moe_backward_transient != 0);
    CHECK(split.moe_backward_transient == doctest::Approx(half.moe_backward_transient).epsilon(1e-12));
    CHECK(split.moe_backward_transient != doctest::Approx(all.moe_backward_transient));
  }
}

TEST_CASE("expert parallel: an all-to-all sends each peer its slice, over NVLink in a node and the NICs across") {
  const HardwareProfile hw = fsdp::test::hardware("h100-80gb");
  const double s = kDispatchBytes;
  // 8 ranks of a node: 7/8 of the buffer over NVLink.
  const CommGroup node = contiguous_group(hw, 8, 8);
  const CollectiveCost c8 = all_to_all_cost(hw, Bytes(s), node);
  const double nvlink =
      hw.intra_node.bandwidth.value * tier_bus_efficiency(hw.intra_node, CollectiveKind::AllToAll).at(s);
  CHECK(c8.transfer.value == doctest::Approx(s * 7.0 / 8.0 / nvlink));
  CHECK(c8.latency.value == doctest::Approx(hw.collective_base_latency.value + hw.intra_node.latency.value));
  // 16 ranks over 2 nodes: half the buffer leaves the node, through the rank's share of its NICs, which binds.
  const CommGroup two = contiguous_group(hw, 8, 16);
  const CollectiveCost c16 = all_to_all_cost(hw, Bytes(s), two);
  const double nic = hw.nics_per_node * hw.inter_node.bandwidth.value / hw.gpus_per_node *
                     tier_bus_efficiency(hw.inter_node, CollectiveKind::AllToAll).at(s);
  CHECK(c16.transfer.value == doctest::Approx(std::max(s * 8.0 / 16.0 / nic, s * 7.0 / 16.0 / nvlink)));
  CHECK(c16.time.value > c8.time.value);
  // NCCL's maintainer: on 2 nodes half the traffic is inter-node, so busbw ((n-1)/n x S / time) is about twice the
  // network bandwidth per GPU (NVIDIA/nccl-tests#130); n-1 of n ranks remote: 15/16 of twice it here.
  CHECK((15.0 / 16.0) * s / c16.transfer.value == doctest::Approx(15.0 / 16.0 * 2.0 * nic));
  CHECK(collective_cost(hw, CollectiveKind::AllToAll, Bytes(s), node).time.value == doctest::Approx(c8.time.value));
  CHECK(all_to_all_cost(hw, Bytes(s), contiguous_group(hw, 8, 1)).time.value == 0);
}

TEST_CASE("expert parallel: the plans it is not priced for are refused by name") {
  const ModelSpec mixtral = fsdp::test::zoo("mixtral-8x7b");
  const Cluster two_nodes{2, 8};
  auto refusal = [&](const Strategy& s, const ModelSpec& m, const RuntimeSupport& rt = RuntimeSupport{}) {
    try {
      validate_strategy(s, m, two_nodes, rt);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal(mixtral_fsdp(8), mixtral).empty());
  CHECK(refusal(mixtral_fsdp(16), mixtral).find("ep 16 does not divide the 8 routed experts") != std::string::npos);
  CHECK(refusal(mixtral_fsdp(2), fsdp::test::zoo("llama3-8b")).find("has no routed experts") != std::string::npos);
  CHECK(refusal(mixtral_fsdp(3), mixtral).find("ep 3 does not divide the 8 routed experts") != std::string::npos);
  Strategy zero2 = mixtral_fsdp(2);
  zero2.kind = StrategyKind::Zero2;
  CHECK(refusal(zero2, mixtral).find("priced with FSDP") != std::string::npos);
  Strategy tp = mixtral_fsdp(2);
  tp.mesh.tp = 2;
  CHECK(refusal(tp, mixtral).find("beside tensor parallelism") != std::string::npos);
  Strategy pp = mixtral_fsdp(4);
  pp.mesh.pp = 2;
  CHECK(refusal(pp, mixtral).empty());  // each stage's experts over the stage's dp ranks
  Strategy hsdp = mixtral_fsdp(8);
  hsdp.kind = StrategyKind::Hsdp;
  hsdp.hsdp_group = 4;
  CHECK(refusal(hsdp, mixtral).find("does not divide the 4 ranks of an HSDP shard group") != std::string::npos);
  hsdp.hsdp_group = 8;
  CHECK(refusal(hsdp, mixtral).empty());
  Strategy lora = mixtral_fsdp(2);
  lora.method = Method::Lora;
  lora.lora.rank = 8;
  lora.lora.target_modules = {"q_proj"};
  CHECK(refusal(lora, mixtral).find("LoRA") != std::string::npos);
  // A runtime that dispatches no tokens (plain FSDP2, DeepSpeed, nanotron, fsdp-run) refuses it; torchtitan's run it.
  CHECK(refusal(mixtral_fsdp(2), mixtral, fsdp::test::runtime("pytorch").support)
            .find("pytorch does not run expert parallelism") != std::string::npos);
  CHECK(refusal(mixtral_fsdp(2), mixtral, fsdp::test::runtime("torchtitan").support).empty());
  CHECK_FALSE(fsdp::test::runtime("fsdp-run").support.expert_parallel);
}
