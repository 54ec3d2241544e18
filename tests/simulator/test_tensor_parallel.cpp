// Tensor parallelism (simulator/program/tensor_parallel.hpp): what one rank of a tp group holds and computes of a
// decoder layer, the collectives per layer, kv heads fewer than tp, the vocabulary-parallel head and loss, and the
// capability table's refusals of meshes that cannot run (simulator/strategy/capabilities.hpp).
#include <doctest/doctest.h>

#include <string>

#include "model/model_loader.hpp"
#include "program/tensor_parallel.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"
#include "strategy/capabilities.hpp"
#include "timeline/tp_linear_overlap.hpp"

using namespace fsdp;

namespace {

const ModuleGraph& llama8b() {
  static const ModuleGraph g(load_model("llama3-8b", FSDP_SOURCE_ROOT));
  return g;
}

// Llama 3 8B's decoder layer (hidden 4096, 32 heads of 128, 8 kv heads, MLP 14336): q and o 4096 x 4096, k and v
// 4096 x 1024, gate, up and down 4096 x 14336, two RMSNorms of 4096.
constexpr double kH = 4096, kKv = 1024, kFfn = 14336;
constexpr double kQo = 2 * kH * kH, kKvProj = 2 * kH * kKv, kMlp = 3 * kH * kFfn, kNorms = 2 * kH;

StepProgram emit(const Strategy& s, int64_t gpus) {
  static const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  ProgramInput in;
  in.graph = &llama8b();
  in.cluster = Cluster{1, gpus};
  in.strategy = s;
  in.runtime = &rt;
  return emit_step_program(in);
}

Strategy plan(int64_t tp, bool sp = true) {
  Strategy s;
  s.kind = StrategyKind::Ddp;
  s.seq_len = 4096;
  s.micro_batch = 1;
  s.mesh.tp = tp;
  s.mesh.sequence_parallel = sp;
  return s;
}

}  // namespace

TEST_CASE("tp: a layer's parameters split over the ranks, norms whole (Megatron-LM column/row-parallel linears)") {
  const ModuleGraph& g = llama8b();
  const ModuleId layer = g.layers().front();
  CHECK(static_cast<double>(g.params_under(layer)) == kQo + kKvProj + kMlp + kNorms);
  CHECK(tp_layer_params(g, layer, 1) == kQo + kKvProj + kMlp + kNorms);
  CHECK(tp_layer_params(g, layer, 2) == (kQo + kKvProj + kMlp) / 2 + kNorms);
  CHECK(tp_layer_params(g, layer, 8) == (kQo + kKvProj + kMlp) / 8 + kNorms);
  // 8 kv heads over 16 ranks: each holds one, replicated over 2 ranks, so k and v are 1/8, not 1/16.
  CHECK(tp_kv_heads_per_rank(g.spec(), 4) == 2);
  CHECK(tp_kv_heads_per_rank(g.spec(), 8) == 1);
  CHECK(tp_kv_heads_per_rank(g.spec(), 16) == 1);
  CHECK(tp_layer_params(g, layer, 16) == (kQo + kMlp) / 16 + kKvProj / 8 + kNorms);
  // The embedding and the head vocabulary-parallel, the final norm whole.
  for (ModuleId c : g.children(g.root())) {
    const ModuleKind k = g.node(c).kind;
    const double p = static_cast<double>(g.params_under(c));
    if (k == ModuleKind::Embedding || k == ModuleKind::Head) CHECK(tp_root_module_params(g, c, 4) == p / 4);
    if (k == ModuleKind::Norm) CHECK(tp_root_module_params(g, c, 4) == p);
  }
}

TEST_CASE("tp: model states of a DDP replica are 1/tp of the layers' linears, whole norms (emitted program)") {
  // Two GPUs, tp 2: one data-parallel replica, held by two tp ranks. DDP keeps fp32 parameters and AdamW's two
  // states of what the rank holds: (32 layers' split linears + norms) + (embedding + head) / 2 + final norm.
  const ModuleGraph& g = llama8b();
  const double vocab = 128256;
  const double per_rank = 32 * ((kQo + kKvProj + kMlp) / 2 + kNorms) + 2 * vocab * kH / 2 + kH;
  const StepProgram p = emit(plan(2), 2);
  double states = 0, params = 0;
  for (const MemEvent& e : p.persistent) {
    if (e.category == MemoryCategory::OptimizerStates) states += e.bytes;
    if (e.category == MemoryCategory::ShardedParams) params += e.bytes;
  }
  CHECK(params == doctest::Approx(per_rank * 4).epsilon(1e-12));
  CHECK(states == doctest::Approx(per_rank * 8).epsilon(1e-12));
  CHECK(p.layout.tp == 2);
  CHECK(p.layout.world == 1);  // the data-parallel degree
  CHECK(static_cast<double>(g.total_params()) > 2 * per_rank * 0.99);
}

TEST_CASE(
    "tp: per-layer activations 1/tp with Megatron's sequence parallelism, the norms' and linears' inputs whole "
    "without it") {
  // Korthikanti et al. 2022 Table 2: sbh(34 + 5as/h) -> /t with SP; 10 sbh replicated without it. Here the
  // replicated part is what the layer's norms save and the column-parallel linears' inputs.
  const ModuleGraph& g = llama8b();
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  Strategy s = plan(1);
  const ActivationQuery q = activation_query(s, rt);
  const double tokens = 4096;
  const LayerCostInput in{&g, &s, &rt, q, tokens};
  const ModuleId layer = g.layers().front();
  const LayerCost whole = layer_cost(in, layer, ActCkpt::None);
  const double norms = tokens * norm_saved_bytes_per_token(g, layer, q);
  const double cols = tokens * column_input_bytes_per_token(g, layer, q);
  REQUIRE(norms > 0);
  REQUIRE(norms + cols < whole.saved_bytes);
  for (int64_t tp : {2, 4, 8}) {
    CAPTURE(tp);
    LayerCost sp = whole, plain = whole;
    MeshSpec m;
    m.tp = tp;
    shard_layer_for_tp(sp, g, layer, norms, cols, 0.0, true, m);
    m.sequence_parallel = false;
    shard_layer_for_tp(plain, g, layer, norms, cols, 0.0, true, m);
    CHECK(sp.saved_bytes == doctest::Approx(whole.saved_bytes / static_cast<double>(tp)));
    CHECK(plain.saved_bytes ==
          doctest::Approx(norms + cols + (whole.saved_bytes - norms - cols) / static_cast<double>(tp)));
    // GEMM FLOPs follow the split weights; the attention's heads split.
    CHECK(sp.matmul_flops_per_token == doctest::Approx(whole.matmul_flops_per_token / static_cast<double>(tp)));
    CHECK(sp.attention_flops_per_token == doctest::Approx(whole.attention_flops_per_token / static_cast<double>(tp)));
    CHECK(sp.shape.heads == 32 / tp);
  }
  // Full checkpointing keeps the layer's input: s/tp of it with SP, all of it without.
  const LayerCost full = layer_cost(in, layer, ActCkpt::Full);
  LayerCost sp = full, plain = full;
  MeshSpec m;
  m.tp = 4;
  shard_layer_for_tp(sp, g, layer, norms, cols, 0.0, true, m);
  m.sequence_parallel = false;
  shard_layer_for_tp(plain, g, layer, norms, cols, 0.0, true, m);
  CHECK(sp.saved_bytes == doctest::Approx(full.saved_bytes / 4));
  CHECK(plain.saved_bytes == doctest::Approx(full.saved_bytes));
}

TEST_CASE("tp: a runtime that saves the gathered input of the column-parallel linears keeps it whole under SP") {
  // PyTorch DTensor / fsdp-run: q/k/v save the all-gathered input_layernorm output, gate/up the
  // post_attention_layernorm one: two s x b x h tensors in the compute dtype, whole on every tp rank.
  const ModuleGraph& g = llama8b();
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  REQUIRE_FALSE(rt.sp_saves_column_input_shard);
  REQUIRE(load_runtime("nanotron", FSDP_SOURCE_ROOT).sp_saves_column_input_shard);
  Strategy s = plan(1);
  const ActivationQuery q = activation_query(s, rt);
  const double tokens = 4096;
  const LayerCostInput in{&g, &s, &rt, q, tokens};
  const ModuleId layer = g.layers().front();
  const double bytes = static_cast<double>(dtype_bytes(s.param_dtype));
  CHECK(column_input_bytes_per_token(g, layer, q) == doctest::Approx(2 * 4096 * bytes));
  const double norms = tokens * norm_saved_bytes_per_token(g, layer, q);
  const double gathered = tokens * column_input_bytes_per_token(g, layer, q);
  MeshSpec m;
  m.tp = 4;
  for (ActCkpt mode : {ActCkpt::None, ActCkpt::Selective, ActCkpt::Full, ActCkpt::SelectiveOp}) {
    CAPTURE(static_cast<int>(mode));
    const LayerCost whole = layer_cost(in, layer, mode);
    LayerCost kept = whole, shard = whole;
    shard_layer_for_tp(kept, g, layer, norms, gathered, 0.0, false, m);
    shard_layer_for_tp(shard, g, layer, norms, gathered, 0.0, true, m);
    CHECK(kept.saved_bytes_unckpt == doctest::Approx(shard.saved_bytes_unckpt + gathered * 3 / 4));
    const bool keeps_inputs = mode == ActCkpt::None || mode == ActCkpt::Selective;
    CHECK(kept.saved_bytes == doctest::Approx(shard.saved_bytes + (keeps_inputs ? gathered * 3 / 4 : 0.0)));
    // What the backward rebuilds and its working memory are the shard's either way.
    CHECK(kept.recompute_bytes == doctest::Approx(shard.recompute_bytes));
    CHECK(kept.elementwise_bytes_per_token == doctest::Approx(shard.elementwise_bytes_per_token));
  }
  // Without SP every rank holds the whole input whatever the runtime does with a shard it never has.
  m.sequence_parallel = false;
  const LayerCost whole = layer_cost(in, layer, ActCkpt::None);
  LayerCost kept = whole, shard = whole;
  shard_layer_for_tp(kept, g, layer, norms, gathered, 0.0, false, m);
  shard_layer_for_tp(shard, g, layer, norms, gathered, 0.0, true, m);
  CHECK(kept.saved_bytes == doctest::Approx(shard.saved_bytes));
  CHECK(kept.saved_bytes == doctest::Approx(norms + gathered + (whole.saved_bytes - norms - gathered) / 4));
}

TEST_CASE("tp: collectives per layer, forward and backward, with and without sequence parallelism") {
  MeshSpec sp;
  sp.tp = 4;
  MeshSpec ar = sp;
  ar.sequence_parallel = false;
  TpUnitShape two{2, 0, 0, false, false, 1000.0, 0};
  // Forward: 2 all-gathers + 2 reduce-scatters per layer with SP; 2 all-reduces without.
  auto f = tp_forward_collectives(two, sp);
  REQUIRE(f.size() == 2);
  CHECK((f[0].kind == CollectiveKind::AllGather && f[0].calls == 4 && f[0].bytes == 1000.0));
  CHECK(f[0].gathered_bytes == 1000.0);
  CHECK((f[1].kind == CollectiveKind::ReduceScatter && f[1].calls == 4));
  auto fa = tp_forward_collectives(two, ar);
  REQUIRE(fa.size() == 1);
  CHECK((fa[0].kind == CollectiveKind::AllReduce && fa[0].calls == 4));
  // Backward: the conjugates, plus the forward's again for recomputed layers.
  TpUnitShape recomputed{2, 2, 0, false, false, 1000.0, 0};
  auto b = tp_backward_collectives(recomputed, sp);
  REQUIRE(b.size() == 2);
  CHECK((b[0].kind == CollectiveKind::AllGather && b[0].calls == 8));
  CHECK((b[1].kind == CollectiveKind::ReduceScatter && b[1].calls == 8));
  CHECK(tp_backward_collectives(recomputed, ar)[0].calls == 8);
  // The root: the embedding's output reduce-scattered (all-reduced), the head's input gathered (SP only).
  TpUnitShape root{0, 0, 0, true, true, 1000.0, 0};
  auto r = tp_forward_collectives(root, sp);
  REQUIRE(r.size() == 2);
  CHECK((r[0].kind == CollectiveKind::AllGather && r[0].calls == 1));
  CHECK((r[1].kind == CollectiveKind::ReduceScatter && r[1].calls == 1));
  CHECK(tp_forward_collectives(root, ar)[0].calls == 1);
  // The head's own, which the step program emits with the head: forward its input gathered (SP only); backward its
  // input gradient reduce-scattered (all-reduced), after its input is gathered again where column inputs are.
  auto hf = tp_head_collectives(root, sp, false);
  REQUIRE(hf.size() == 1);
  CHECK((hf[0].kind == CollectiveKind::AllGather && hf[0].calls == 1 && hf[0].gathered_bytes == 1000.0));
  CHECK(tp_head_collectives(root, ar, false).empty());
  auto hb = tp_head_collectives(root, sp, true);
  REQUIRE(hb.size() == 1);
  CHECK((hb[0].kind == CollectiveKind::ReduceScatter && hb[0].calls == 1));
  REQUIRE(tp_head_collectives(root, ar, true).size() == 1);
  CHECK(tp_head_collectives(root, ar, true)[0].kind == CollectiveKind::AllReduce);
  TpUnitShape regathering = root;
  regathering.column_inputs_regathered = true;
  auto hr = tp_head_collectives(regathering, sp, true);
  REQUIRE(hr.size() == 2);
  CHECK((hr[0].kind == CollectiveKind::AllGather && hr[1].kind == CollectiveKind::ReduceScatter));
  CHECK(tp_head_collectives(two, sp, false).empty());  // a unit without the head
  CHECK(tp_head_collectives(two, sp, true).empty());
  // No tp, no collectives.
  CHECK(tp_forward_collectives(two, MeshSpec{}).empty());
  // Async TP leaves the first of tp chunks exposed.
  MeshSpec async = sp;
  async.async_tp = true;
  CHECK(tp_exposed_fraction(async) == 0.25);
  CHECK(tp_exposed_fraction(sp) == 1.0);
}

TEST_CASE("tp: which collectives async TP fuses with a GEMM (Inductor's micro_pipeline_tp patterns)") {
  MeshSpec sp;
  sp.tp = 8;
  // Llama reads each block's input with separate projections (q, k, v; gate, up): no block has a single reader,
  // so their input gradients are sums of GEMM outputs and their reduce-scatters stay whole.
  const ModuleGraph& g = llama8b();
  CHECK(single_linear_blocks(g, g.layers().front()) == 0);
  // GPT-2's MLP reads its input with one linear (c_fc, no gate): that block's input gradient is one GEMM's output.
  const ModuleGraph gpt2(load_model("gpt2", FSDP_SOURCE_ROOT));
  CHECK(single_linear_blocks(gpt2, gpt2.layers().front()) == 1);
  // Forward: every layer collective fuses (all-gather -> the column-parallel GEMMs, the row-parallel GEMM ->
  // reduce-scatter); the head's input gather (eager, outside the compiled blocks) and the embedding's reduce-scatter
  // of a lookup do not.
  TpUnitShape root_layers{2, 0, 0, true, true, 1000.0, 0};
  auto f = tp_forward_collectives(root_layers, sp);
  REQUIRE(f.size() == 2);
  CHECK((f[0].kind == CollectiveKind::AllGather && f[0].calls == 5 && f[0].fused_calls == 4));
  CHECK((f[1].kind == CollectiveKind::ReduceScatter && f[1].calls == 5 && f[1].fused_calls == 4));
  // Backward, two layers recomputed, one block read by one linear: the output gradients' gathers and the recomputed
  // forward's fuse, the embedding's gradient gather does not; of the blocks' input-gradient reduce-scatters the
  // single-reader block's fuses, the other three and the head's stay whole; the recomputed forward's fuse.
  TpUnitShape b_shape{2, 2, 0, true, true, 1000.0, 1};
  auto b = tp_backward_collectives(b_shape, sp);
  REQUIRE(b.size() == 2);
  CHECK((b[0].kind == CollectiveKind::AllGather && b[0].calls == 4 + 1 + 4 && b[0].fused_calls == 4 + 4));
  CHECK((b[1].kind == CollectiveKind::ReduceScatter && b[1].calls == 4 + 1 + 4 && b[1].fused_calls == 1 + 4));
  // Two layers under torchtitan's per-op policy: their gathers run again (the recomputed GEMMs' inputs), their
  // reduce-scatters do not (the policy saves reduce_scatter_tensor outputs).
  TpUnitShape sac{2, 0, 2, false, false, 1000.0, 0};
  auto bs = tp_backward_collectives(sac, sp);
  REQUIRE(bs.size() == 2);
  CHECK((bs[0].kind == CollectiveKind::AllGather && bs[0].calls == 4 + 4));
  CHECK((bs[1].kind == CollectiveKind::ReduceScatter && bs[1].calls == 4));
  // Without sequence parallelism there is nothing to fuse: the pass matches all-gathers and reduce-scatters only.
  MeshSpec ar = sp;
  ar.sequence_parallel = false;
  for (const TpCollective& c : tp_backward_collectives(b_shape, ar)) CHECK(c.fused_calls == 0);
}

TEST_CASE("tp: the emitted program's tp ops: bytes and counts per layer, the vocabulary-parallel loss") {
  const StepProgram p = emit(plan(4), 8);
  const double act = 4096.0 * 4096.0 * 2.0;  // s x b x h in bf16
  int layer_fwd = 0, loss = 0;
  for (const Op& op : p.ops) {
    if (op.stream != Stream::TensorParallel) continue;
    CHECK(op.group == GroupKind::Tensor);
    CHECK(op.kind == OpKind::TpCollective);
    if (op.phase == Phase::TpForwardCollectives && op.unit == 1 && op.micro_batch == 0) {
      ++layer_fwd;
      CHECK(op.comm_bytes == act);
      CHECK(op.comm_calls == 2);  // one layer: 2 all-gathers, then 2 reduce-scatters
      // The reduce-scatters read the row linears' full-sequence outputs, freed once they are issued: what
      // ProcessGroupNCCL records on its stream (Op::stream_recorded_bytes); the gathers' inputs are saved shards.
      CHECK(op.stream_recorded_bytes == (op.collective == CollectiveKind::ReduceScatter ? 2 * act : 0.0));
    }
    if (op.phase == Phase::TpLossAllReduce) {
      // fsdp-run's fused form: the maximum (one fp32 per token), then the target logit and the sum of exponentials
      // in one call (two per token).
      ++loss;
      CHECK(op.collective == CollectiveKind::AllReduce);
      CHECK(op.comm_calls == 1);
      CHECK(op.comm_bytes == 4096.0 * 4.0 * loss);
    }
  }
  CHECK(layer_fwd == 2);
  CHECK(loss == 2);
  // Without sequence parallelism the all-reduces write in place: nothing is freed under them.
  for (const Op& op : emit(plan(4, false), 8).ops) CHECK(op.stream_recorded_bytes == 0);
  // The head computes its quarter of the 128,256-entry vocabulary.
  CHECK(p.head_gemm.n == 128256 / 4);
  // Communicators: the data-parallel world of 2, and the tp group.
  CHECK(p.communicators == 2);
}

// DTensor's sequence-dimension collectives copy the whole [B, S, H] tensor once each (funcol all_gather_tensor's
// cat of the rank-major chunks, reduce_scatter_tensor's cat before it): read and write, 2 x its bytes; the fused
// calls of async TP and the all-reduces without sequence parallelism copy nothing.
TEST_CASE("tp: the sequence-parallel collectives' layout copies, and what the compute ops gain from them") {
  MeshSpec sp;
  sp.tp = 4;
  const TpUnitShape two{2, 0, 0, false, false, 1000.0, 0};
  // Forward: 4 all-gathers + 4 reduce-scatters of 1000 bytes, each copied once (r + w).
  CHECK(tp_sequence_layout_copy_bytes(tp_forward_collectives(two, sp), sp) == 8 * 2 * 1000.0);
  // Async TP fuses every layer collective of the forward: nothing copied; the root's embedding reduce-scatter
  // (a lookup's output) is not fused: one copy.
  MeshSpec async = sp;
  async.async_tp = true;
  CHECK(tp_sequence_layout_copy_bytes(tp_forward_collectives(two, async), async) == 0.0);
  const TpUnitShape root{0, 0, 0, true, false, 1000.0, 0};
  CHECK(tp_sequence_layout_copy_bytes(tp_forward_collectives(root, async), async) == 2 * 1000.0);
  MeshSpec ar = sp;
  ar.sequence_parallel = false;
  CHECK(tp_sequence_layout_copy_bytes(tp_forward_collectives(two, ar), ar) == 0.0);
  // In the emitted program (fsdp-run's profile sets tp_sequence_collective_copy: its all_gather_seq and
  // reduce_scatter_seq copy too), a layer unit's forward op carries its two all-gathers' and two reduce-scatters'
  // copies more than the same program without the key.
  static const RuntimeProfile copying = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  REQUIRE(copying.tp_sequence_collective_copy);
  RuntimeProfile plain = copying;
  plain.tp_sequence_collective_copy = false;
  auto forward_bytes = [](const RuntimeProfile& rt) {
    ProgramInput in;
    in.graph = &llama8b();
    in.cluster = Cluster{1, 8};
    in.strategy = plan(4);
    in.runtime = &rt;
    for (const Op& op : emit_step_program(in).ops)
      if (op.kind == OpKind::Forward && op.unit == 1 && op.micro_batch == 0)
        return op.elementwise_bytes + op.device_copy_bytes;
    return -1.0;
  };
  const double act = 4096.0 * 4096.0 * 2.0;  // s x b x h in bf16
  CHECK(forward_bytes(copying) - forward_bytes(plain) == doctest::Approx(4 * 2 * act));
}

// Async TP's fused all-gathers return the gathered tensor sequence-major ([s, b, k] storage of a [b, s, k] view:
// _symmetric_memory's unflatten), which a weight gradient's reshape to [b * s, k] cannot view: per layer in backward
// the two output gradients' and the two column inputs' gathered tensors are copied (read and write), whatever the
// checkpointing; nothing with one sequence a micro-batch (the layouts coincide), without async TP or without
// sequence parallelism.
TEST_CASE("tp: async TP's gathered tensors are copied for the weight gradients of a batch-first layout") {
  MeshSpec async;
  async.tp = 4;
  async.async_tp = true;
  const TpUnitShape two{2, 0, 0, false, false, 1000.0, 0};
  const TpUnitShape two_full{2, 2, 0, false, false, 1000.0, 0};
  CHECK(tp_async_gathered_layout_copy_bytes(two, async, 2) == 2 * 4 * 2 * 1000.0);
  CHECK(tp_async_gathered_layout_copy_bytes(two_full, async, 16) == 2 * 4 * 2 * 1000.0);
  CHECK(tp_async_gathered_layout_copy_bytes(two, async, 1) == 0.0);
  MeshSpec vanilla = async;
  vanilla.async_tp = false;
  CHECK(tp_async_gathered_layout_copy_bytes(two, vanilla, 2) == 0.0);
  MeshSpec no_sp = async;
  no_sp.sequence_parallel = false;
  CHECK(tp_async_gathered_layout_copy_bytes(two, no_sp, 2) == 0.0);
}

TEST_CASE("tp and pp: the capability table refuses what cannot run, naming the flag and the numbers") {
  const ModelSpec& m = llama8b().spec();
  auto violation = [&](Strategy s, int64_t world, int64_t gpn = 8) {
    return first_violation(s, m, MeshWorld{world, gpn});
  };
  Strategy s = plan(3);
  auto v = violation(s, 8);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::MeshWorld);
  CHECK(v->flag == "--tp");
  CHECK(v->reason == "tp 3 x pp 1 = 3 does not divide the 8 GPUs");
  s = plan(16);
  v = violation(s, 32);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpWithinNode);
  // A pipeline stage's world / pp ranks fill whole nodes or share one. On 3 nodes of 8: pp 2 puts 12 ranks in a stage,
  // pp 4 six and pp 8 three, all refused (the communicators' costs threw instead: `fsdp-plan --model 8b --nodes 3`
  // stopped with "a group of 12 consecutive ranks does not cover whole nodes of 8 ranks" before 2026-12-04); pp 3
  // fills a node a stage, pp 6, 12 and 24 put 4, 2 and 1 ranks in a stage, which share a node.
  Strategy piped = plan(1);
  for (const auto& [pp, refused] : std::vector<std::pair<int64_t, bool>>{
           {2, true}, {3, false}, {4, true}, {6, false}, {8, true}, {12, false}, {24, false}}) {
    CAPTURE(pp);
    piped.mesh.pp = pp;
    v = violation(piped, 24);
    CHECK((v && v->rule == CapabilityRule::PpStageNodes) == refused);
  }
  piped.mesh.pp = 2;
  v = violation(piped, 24);
  REQUIRE(v);
  CHECK(v->flag == "--pp");
  CHECK(v->reason ==
        "pp 2 over 24 GPUs puts 12 ranks in a stage, which straddle nodes of 8 GPUs unevenly: not modelled (a stage's "
        "ranks fill whole nodes or share one)");
  piped.mesh.pp = 4;
  CHECK_FALSE(violation(piped, 32));  // 8 ranks a stage, a node each
  CHECK_FALSE(violation(piped, 8));   // 2 ranks a stage, four stages a node
  // Heads: 32 do not split over 64; kv heads: 8 and tp 12 neither divide nor multiply.
  ModelSpec odd = m;
  odd.num_heads = 28;
  odd.num_kv_heads = 4;
  s = plan(8);
  v = first_violation(s, odd, MeshWorld{8, 8});
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpHeads);
  CHECK(v->reason.find("28 attention heads") != std::string::npos);
  odd = m;
  odd.num_heads = 24;
  odd.num_kv_heads = 6;
  odd.ffn_size = 24 * 512;
  s = plan(4);
  v = first_violation(s, odd, MeshWorld{8, 8});
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpKvHeads);
  // kv heads fewer than tp: replicated, allowed.
  odd.num_kv_heads = 2;
  CHECK_FALSE(first_violation(s, odd, MeshWorld{8, 8}));
  CHECK(tp_replicates_kv_heads(odd, 4));
  // Pipeline: ZeRO-2/3 refused; interleaved needs micro-batches a multiple of pp; virtual stages need it.
  s = plan(1);
  s.mesh.pp = 2;
  s.kind = StrategyKind::Zero3;
  v = violation(s, 8);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::PpStrategy);
  s.kind = StrategyKind::Fsdp;
  s.mesh.pp_schedule = PipelineSchedule::Interleaved1F1B;
  s.mesh.pp_virtual_stages = 2;
  s.grad_accum = 3;
  v = violation(s, 8);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::PpInterleavedMicroBatches);
  CHECK(v->flag == "--grad-accum");
  s.grad_accum = 4;
  CHECK_FALSE(violation(s, 8));
  s.mesh.pp_schedule = PipelineSchedule::OneFOneB;
  v = violation(s, 8);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::PpVirtualStages);
  s.mesh.pp_virtual_stages = 1;
  s.mesh.pp = 64;
  v = violation(s, 64);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::PpLayers);
  // A runtime that does not run a dimension says so by name.
  RuntimeSupport fsdp_run;
  fsdp_run.tensor_parallel = false;
  fsdp_run.runtime_name = "fsdp-run";
  s = plan(2);
  v = first_violation(s, m, MeshWorld{8, 8}, fsdp_run);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::RuntimeMesh);
  CHECK(v->reason == "fsdp-run does not run tensor parallelism; use --tp 1");
  // validate_strategy throws the first violation as an InputError naming the flag.
  s = plan(3);
  CHECK_THROWS_WITH_AS(validate_strategy(s, m, Cluster{1, 8}), "--tp: tp 3 x pp 1 = 3 does not divide the 8 GPUs",
                       InputError);
}

TEST_CASE("tp: nanotron's asynchronous linears regather in backward and hide collectives under their own GEMMs") {
  MeshSpec sp;
  sp.tp = 4;
  sp.sequence_parallel = true;
  // tp_recompute_allgather: the column inputs gathered again in backward, per layer block and for the head.
  TpUnitShape regather{3, 0, 0, false, true, 1000.0, 0};
  regather.column_inputs_regathered = true;
  auto b = tp_backward_collectives(regather, sp);
  REQUIRE(b.size() == 2);
  CHECK((b[0].kind == CollectiveKind::AllGather && b[0].calls == 2 * 3 + 2 * 3 + 1));
  CHECK((b[1].kind == CollectiveKind::ReduceScatter && b[1].calls == 2 * 3 + 1));
  // One layer of two blocks; one collective takes 1 s.
  TpOverlapGemms g;
  g.layers.push_back({TpBlockGemms{2.0, 0.5, 1.0, 4.0}, TpBlockGemms{8.0, 3.0, 2.0, 2.0}});
  // Forward gathers under 1/tp of the column GEMM: 1 - 0.5 and 1 - 2 (hidden whole); reduce-scatters waited for.
  CHECK(tp_async_linear_exposed_s(CollectiveKind::AllGather, false, 1.0, 2, g, 4) == doctest::Approx(0.5));
  CHECK(tp_async_linear_exposed_s(CollectiveKind::ReduceScatter, false, 1.0, 2, g, 4) == doctest::Approx(2.0));
  // Backward: the regather under the input-gradient GEMM (0.5, 0), the row output gradient under 1/tp of the row's
  // (0, 0.5); the input gradient's reduce-scatter under the weight gradient (0.5, 0).
  CHECK(tp_async_linear_exposed_s(CollectiveKind::AllGather, true, 1.0, 4, g, 4) == doctest::Approx(1.0));
  CHECK(tp_async_linear_exposed_s(CollectiveKind::ReduceScatter, true, 1.0, 2, g, 4) == doctest::Approx(0.5));
  // Calls beyond the layers' (the embedding's) stay whole; the head hides its own under its GEMM.
  CHECK(tp_async_linear_exposed_s(CollectiveKind::ReduceScatter, false, 1.0, 3, g, 4) == doctest::Approx(3.0));
  TpOverlapGemms head;
  head.head = true;
  head.head_forward_s = 2.0;
  head.head_backward_s = 0.25;
  CHECK(tp_async_linear_exposed_s(CollectiveKind::AllGather, false, 1.0, 1, head, 4) == doctest::Approx(0.5));
  CHECK(tp_async_linear_exposed_s(CollectiveKind::AllGather, true, 1.0, 2, head, 4) == doctest::Approx(1.75));
}

TEST_CASE("capability table: the rules fsdp-run's profile adds, refused by the simulator when simulating for it") {
  const ModelSpec& m = llama8b().spec();
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  // configs/runtimes/fsdp-run.yaml section mesh: tp, sp and pp run; interleaved, async TP, tied embeddings over pp
  // do not.
  CHECK(rt.support.runtime_name == "fsdp-run");
  CHECK(rt.support.tensor_parallel);
  CHECK(rt.support.sequence_parallel);
  CHECK(rt.support.pipeline_parallel);
  CHECK_FALSE(rt.support.interleaved_pipeline);
  CHECK_FALSE(rt.support.async_tp);
  CHECK_FALSE(rt.support.pipeline_tied_embeddings);
  // A profile without the section runs every mesh the simulator prices.
  CHECK(load_runtime("torchtitan", FSDP_SOURCE_ROOT).support.interleaved_pipeline);

  const Cluster c{1, 8};
  // Async TP: the simulator prices it; fsdp-run's profile refuses it by name.
  Strategy s = plan(2);
  s.mesh.async_tp = true;
  CHECK_NOTHROW(validate_strategy(s, m, c));
  CHECK_THROWS_WITH_AS(validate_strategy(s, m, c, rt.support),
                       "--async-tp: fsdp-run does not run async tensor parallelism", InputError);
  // Interleaved 1F1B.
  s = plan(1);
  s.mesh.pp = 2;
  s.mesh.pp_schedule = PipelineSchedule::Interleaved1F1B;
  s.mesh.pp_virtual_stages = 2;
  s.grad_accum = 4;
  CHECK_NOTHROW(validate_strategy(s, m, c));
  CHECK_THROWS_WITH_AS(validate_strategy(s, m, c, rt.support), "--pp-schedule: fsdp-run does not run interleaved-1f1b",
                       InputError);
  // Tied embeddings over pipeline stages.
  ModelSpec tied = m;
  tied.tied_embeddings = true;
  s = plan(1);
  s.mesh.pp = 2;
  CHECK_NOTHROW(validate_strategy(s, tied, c));
  auto v = first_violation(s, tied, MeshWorld{8, 8}, rt.support);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::PpTiedEmbeddings);
  CHECK(v->flag == "--pp");
  CHECK(v->reason.find("which fsdp-run does not synchronise") != std::string::npos);
  // ZeRO-2/3 under a pipeline: refused by every profile (the simulator does not price it), run by a runtime that
  // says it composes them (fsdp-run's own check, executor/shard/mesh.cpp).
  s.kind = StrategyKind::Zero2;
  v = first_violation(s, m, MeshWorld{8, 8}, rt.support);
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::PpStrategy);
  RuntimeSupport composes = rt.support;
  composes.pipeline_partitioned_gradients = true;
  CHECK_FALSE(first_violation(s, m, MeshWorld{8, 8}, composes));
  // Rules for every runtime: sequence parallelism needs a sequence divisible by tp; tp at most the vocabulary.
  s = plan(2);
  s.seq_len = 4095;
  v = first_violation(s, m, MeshWorld{8, 8});
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpSequenceSplit);
  CHECK(v->flag == "--seq");
  s.mesh.sequence_parallel = false;
  CHECK_FALSE(first_violation(s, m, MeshWorld{8, 8}));
  ModelSpec tiny_vocab = m;
  tiny_vocab.vocab_size = 4;
  s = plan(8);
  v = first_violation(s, tiny_vocab, MeshWorld{8, 8});
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpVocab);
  // The table is in the enum's order (to_string asserts each row's id).
  for (size_t i = 0; i < static_cast<size_t>(CapabilityRule::kCount); ++i)
    CHECK_NOTHROW(to_string(static_cast<CapabilityRule>(i)));
}

TEST_CASE("tp of mixture-of-experts layers: experts split, router and shared gate whole, the block's tensors whole") {
  // configs/models/tiny-moe.yaml: hidden 128, 8 routed experts of 96 (top-2, probabilities as they are), one shared
  // expert of 192 behind its sigmoid gate; fsdp-run in fp32.
  const ModuleGraph g(load_model("tiny-moe", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  const ModuleId layer = g.layers().front();
  constexpr double h = 128, e = 8, k = 2, ffn = 96, shared = 192;
  const double router = h * e, gate = h;
  const double attention = 2 * h * h + 2 * h * 64, norms = 2 * h;
  const double experts = e * 3 * h * ffn + 3 * h * shared;
  CHECK(static_cast<double>(g.params_under(layer)) == attention + norms + router + gate + experts);
  CHECK(tp_layer_params(g, layer, 2) == (attention + experts) / 2 + norms + router + gate);

  Strategy s = plan(1);
  s.param_dtype = DType::Fp32;
  s.seq_len = 64;
  const ActivationQuery q = activation_query(s, rt);
  const double tokens = 2 * 64;
  // Whole on every rank (fp32, int64 indices): the router's probabilities (E fp32) and chosen experts (k), the
  // dispatch's two index maps (2k), the experts' outputs and their weights (k x (h + 1)), the gathered copies the
  // routed experts read (k x h in all); the norm output and what the shared gate keeps (its sigmoid and the shared
  // output) are the column-parallel readers', counted with them.
  const double whole = e * 4 + k * 8 + 2 * k * 8 + k * (h + 1) * 4 + k * h * 4;
  CHECK(moe_tp_whole_saved_bytes_per_token(g, layer, q) == doctest::Approx(whole));
  const double cols = column_input_bytes_per_token(g, layer, q);
  CHECK(cols == doctest::Approx((2 * h + 1 + h) * 4));  // two norm outputs, the gate's sigmoid and shared output

  for (bool sp : {true, false}) {
    CAPTURE(sp);
    s.mesh.tp = 2;
    s.mesh.sequence_parallel = sp;
    const LayerCost one = layer_cost(LayerCostInput{&g, &s, &rt, q, tokens}, layer, ActCkpt::None);
    LayerCost two = one;
    const double norm_bytes = tokens * norm_saved_bytes_per_token(g, layer, q);
    shard_layer_for_tp(two, g, layer, norm_bytes, tokens * cols, tokens * whole, false, s.mesh);
    // The gates' gradients are partial whatever the layout (the experts' outputs they weigh are); under SP the
    // norms' too.
    CHECK(two.tp_partial_grad_params == (sp ? norms + router + gate : router + gate));
    CHECK(two.replicated_params == norms + router + gate);
    // Everything but the whole tensors, the norm outputs' readers and (without SP) the norms' inputs is split.
    const double kept = tokens * (whole + cols) + (sp ? 0.0 : norm_bytes);
    CHECK(two.saved_bytes_unckpt == doctest::Approx(kept + (one.saved_bytes_unckpt - kept) / 2));
    // The router's and the shared gate's GEMMs stay whole, every other one is halved.
    for (const GemmShape& gs : two.shape.gemms)
      if (gs.tp_replicated) CHECK((gs.n == e || gs.n == 1));
    const double gate_flops = 2 * h * e + 2 * h;
    CHECK(two.matmul_flops_per_token == doctest::Approx((one.matmul_flops_per_token - gate_flops) / 2 + gate_flops));
    // The block's backward stage, computed for the rank (layer_costs.cpp): its hidden-wide tensors whole.
    CHECK(two.moe_backward_transient > 0);
    CHECK(two.backward_transient >= two.moe_backward_transient);
  }
  // The capability table: MoE under tp is planned, but not with expert biases or the per-op policy.
  s.mesh.tp = 2;
  CHECK_FALSE(first_violation(s, g.spec(), MeshWorld{2, 2}));
  ModelSpec biased = g.spec();
  biased.mlp_bias = true;
  auto v = first_violation(s, biased, MeshWorld{2, 2});
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpModelParts);
  CHECK(v->reason.find("experts have biases") != std::string::npos);
  s.act_ckpt = ActCkpt::SelectiveOp;
  v = first_violation(s, g.spec(), MeshWorld{2, 2});
  REQUIRE(v);
  CHECK(v->flag == "--act-ckpt");
  s.act_ckpt = ActCkpt::None;
  ModelSpec odd = g.spec();
  odd.moe->expert_ffn_size = 97;
  v = first_violation(s, odd, MeshWorld{2, 2});
  REQUIRE(v);
  CHECK(v->rule == CapabilityRule::TpFfn);
  CHECK(v->reason == "tp 2 does not divide the routed experts' intermediate size 97 of tiny-moe");
}
