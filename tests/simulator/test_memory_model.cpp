// Golden numbers and properties of the per-GPU memory model (memory/memory_walk.cpp over
// program/step_program.cpp).
#include <doctest/doctest.h>

#include <cmath>

#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "sim_fixtures.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

// A GPT-3-style decoder with ~7.5B parameters (the ZeRO paper's example model size).
ModelSpec gpt_like(int64_t hidden, int64_t layers, int64_t heads) {
  ModelSpec m;
  m.name = "gpt-test";
  m.family = "decoder";
  m.hidden_size = hidden;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = heads;
  m.head_dim = hidden / heads;
  m.ffn_size = 4 * hidden;
  m.gated_mlp = false;
  m.activation = ActivationFn::Gelu;
  m.vocab_size = 51200;
  m.tied_embeddings = true;
  m.norm = NormType::LayerNorm;
  m.norm_eps = 1e-5;
  m.position_embedding = PositionEmbedding::Learned;
  m.max_positions = 2048;
  m.qkv_bias = m.attn_out_bias = m.mlp_bias = true;
  m.dropout = true;
  return m;
}

Strategy zero_strategy(StrategyKind k, DType reduce) {
  Strategy s;
  s.kind = k;
  s.param_dtype = DType::Fp16;
  s.reduce_dtype = reduce;
  s.master_dtype = DType::Fp32;
  s.micro_batch = 1;
  s.seq_len = 1024;
  return s;
}

}  // namespace

TEST_CASE("ZeRO paper worked example: 7.5B params, 64 GPUs, mixed-precision Adam (K = 12)") {
  // Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
  // (arXiv 1910.02054), Figure 1 / sec. 5.1: model states per GPU for Psi = 7.5B, N_d = 64, K = 12:
  //   baseline DP: (2 + 2 + K) * Psi            = 16 * 7.5e9           = 120 GB
  //   P_os (ZeRO-1): 2 Psi + 2 Psi + K Psi / N  = 30e9 + 1.406e9       = 31.4 GB
  //   P_os+g (ZeRO-2): 2 Psi + (2 + K) Psi / N  = 15e9 + 1.641e9       = 16.6 GB
  //   P_os+g+p (ZeRO-3): (2 + 2 + K) Psi / N    = 120e9 / 64           = 1.9 GB
  // The simulator's model states per parameter must give exactly these coefficients, and, scaled to the
  // paper's Psi, the GB the paper prints (Figure 1: 120, 31.4, 16.6 and 1.9 GB, one decimal).
  ModuleGraph g(gpt_like(4096, 36, 32));
  RuntimeProfile rt = runtime("deepspeed");
  const double P = static_cast<double>(g.total_params());
  const double N = 64;
  const double psi = 7.5e9;
  struct Row {
    StrategyKind kind;
    double coefficient;
    double paper_gb;
  };
  for (Row r : {Row{StrategyKind::Ddp, 16.0, 120.0}, Row{StrategyKind::Zero1, 4.0 + 12.0 / N, 31.4},
                Row{StrategyKind::Zero2, 2.0 + 14.0 / N, 16.6}, Row{StrategyKind::Zero3, 16.0 / N, 1.9}}) {
    CAPTURE(to_string(r.kind));
    StepProgram p = program(g, zero_strategy(r.kind, DType::Fp16), rt, 8, 8);
    double states = total(model_state_bytes(p));
    // DDP's buckets are communication buffers, not model states.
    if (r.kind == StrategyKind::Ddp) states -= cat(model_state_bytes(p), MemoryCategory::CommBuffers);
    CHECK(states / P == doctest::Approx(r.coefficient).epsilon(1e-4));  // padding of shards only
    // The simulator's bytes per parameter at Psi = 7.5e9 against the paper's printed figure, to its rounding.
    const double simulated_gb = states / P * psi / 1e9;
    CAPTURE(simulated_gb);
    CHECK(std::fabs(simulated_gb - r.paper_gb) <= 0.05 + 1e-9);
  }
}

TEST_CASE("DeepSpeed estimators: ZeRO-3 4*largest_layer + 18*P/N, ZeRO-2 2*P + 18*P/N") {
  // deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs (offload none):
  //   gpu = largest_layer_memory + 18 * total_params / total_gpus, largest_layer_memory = 4 * largest_layer
  //   (fp16 params + fp16 grads of the largest gathered layer; 18 = 2 fp16 param partition + 4 fp32 master
  //   + 8 Adam + 4 fp32 gradient partition).
  // deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs (offload none, after
  // PR #5099): gpu = 2 * total_params + 18 * total_params / total_gpus.
  ModuleGraph g(zoo("llama2-7b"));
  RuntimeProfile rt = runtime("deepspeed");
  const double P = static_cast<double>(g.total_params());
  const double N = 16;
  StepProgram z3 = program(g, zero_strategy(StrategyKind::Zero3, DType::Fp32), rt, 2, 8);
  CHECK(total(model_state_bytes(z3)) == doctest::Approx(18.0 * P / N).epsilon(1e-4));
  // The largest gathered unit: its fp16 params (all-gather) and fp16 grads (backward) = 4 bytes/param.
  int64_t largest = 0;
  for (const auto& u : z3.units) largest = std::max(largest, u.params);
  double unit_bytes = 0;
  // The unit's unsharded grads: allocated by its backward (and, for the root, the head's in the loss
  // backward) in the first micro-batch.
  for (const Op& op : z3.ops) {
    if (op.micro_batch != 0 || (op.kind != OpKind::Backward && op.kind != OpKind::LossBackward)) continue;
    if (op.unit < 0 || z3.units[static_cast<size_t>(op.unit)].params != largest) continue;
    for (const MemEvent& e : op.on_issue)
      if (e.category == MemoryCategory::UnshardedGrads && e.bytes > 0) unit_bytes += e.bytes;
    for (const MemEvent& e : op.on_complete)
      if (e.category == MemoryCategory::UnshardedGrads && e.bytes > 0) unit_bytes += e.bytes;
  }
  unit_bytes *= 2.0;  // + the same size of unsharded params
  CHECK(unit_bytes == doctest::Approx(4.0 * static_cast<double>(largest)).epsilon(1e-3));

  StepProgram z2 = program(g, zero_strategy(StrategyKind::Zero2, DType::Fp32), rt, 2, 8);
  double at_step = total(model_state_bytes(z2));
  for (const Op& op : z2.ops)
    if (op.kind == OpKind::OptimizerStep) at_step += op.transient_bytes;  // the fp32 gradient partition
  CHECK(at_step == doctest::Approx(2.0 * P + 18.0 * P / N).epsilon(1e-4));
}

TEST_CASE("Korthikanti et al. activation formula sbh(34 + 5as/h) for a GPT layer without flash attention") {
  // Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198)
  // sec. 4.1, eq. (1): activations per layer = s*b*h*(34 + 5*a*s/h) bytes with 16-bit activations,
  // dropout and no recomputation. Our graph also keeps the LayerNorms' fp32 mean and rstd per token
  // (2 norms x 2 x 4 bytes = 16 bytes per token), which the paper's s*b*h terms leave out.
  for (auto [h, a, s] : {std::tuple{4096L, 32L, 2048L}, std::tuple{12288L, 96L, 2048L}, std::tuple{2048L, 16L, 512L}}) {
    ModuleGraph g(gpt_like(h, 2, a));
    ActivationQuery q;
    q.compute = DType::Fp16;
    q.attention = AttentionImpl::Eager;
    q.seq_len = s;
    const double b = 1;
    double ours = g.saved_bytes_per_token(g.layers()[0], q, ActCkpt::None) * static_cast<double>(s) * b;
    double paper = static_cast<double>(s) * b * static_cast<double>(h) *
                   (34.0 + 5.0 * static_cast<double>(a) * static_cast<double>(s) / static_cast<double>(h));
    double stats = 16.0 * static_cast<double>(s) * b;
    CAPTURE(h);
    CHECK(ours == doctest::Approx(paper + stats).epsilon(1e-12));
    // Selective recomputation drops exactly the 5as^2b attention term (sec. 4.2).
    double selective = g.saved_bytes_per_token(g.layers()[0], q, ActCkpt::Selective) * static_cast<double>(s) * b;
    CHECK(selective == doctest::Approx(34.0 * static_cast<double>(s) * b * static_cast<double>(h) + stats));
  }
}

TEST_CASE("flash attention keeps activations linear in the sequence, eager quadratic") {
  ModuleGraph g(zoo("llama3-8b"));
  auto per_token = [&](AttentionImpl impl, int64_t seq) {
    ActivationQuery q;
    q.attention = impl;
    q.seq_len = seq;
    return g.saved_bytes_per_token(g.layers()[0], q, ActCkpt::None);
  };
  CHECK(per_token(AttentionImpl::Flash, 1024) == doctest::Approx(per_token(AttentionImpl::Flash, 8192)));
  // Eager keeps the softmax output: heads x seq elements per token in the compute dtype (bf16).
  CHECK(per_token(AttentionImpl::Eager, 8192) - per_token(AttentionImpl::Eager, 1024) ==
        doctest::Approx(32.0 * (8192 - 1024) * 2.0));
}

namespace {

MemoryResult walk(const ModuleGraph& g, const Strategy& s, const RuntimeProfile& rt, int64_t nodes, int64_t gpn) {
  StepProgram p = program(g, s, rt, nodes, gpn);
  return walk_memory(p, rt, gpn);
}

double sharded_states(const MemoryResult& r) {
  return cat(r.breakdown, MemoryCategory::ShardedParams) + cat(r.breakdown, MemoryCategory::OptimizerStates) +
         cat(r.breakdown, MemoryCategory::MasterParams);
}

}  // namespace

TEST_CASE("properties: more GPUs, checkpointing and offload never raise GPU memory; categories non-negative") {
  RuntimeProfile rt = runtime("fsdp-run");
  for (const char* name : {"llama3-8b", "gpt2", "mixtral-8x7b"}) {
    ModuleGraph g(zoo(name));
    for (StrategyKind k : {StrategyKind::Ddp, StrategyKind::Zero1, StrategyKind::Zero2, StrategyKind::Zero3,
                           StrategyKind::Fsdp, StrategyKind::FsdpGradOp, StrategyKind::NoShard}) {
      Strategy s;
      s.kind = k;
      s.seq_len = 2048;
      CAPTURE(name);
      CAPTURE(to_string(k));
      double prev_states = INFINITY;
      for (int64_t nodes : {1, 2, 4, 8}) {
        MemoryResult r = walk(g, s, rt, nodes, 8);
        for (double v : r.breakdown) CHECK(v >= 0.0);
        CHECK(sharded_states(r) <= prev_states * (1 + 1e-9));
        prev_states = sharded_states(r);
      }
      double prev_act = INFINITY;
      for (ActCkpt ck : {ActCkpt::None, ActCkpt::Selective, ActCkpt::Full}) {
        Strategy c = s;
        c.act_ckpt = ck;
        StepProgram p = program(g, c, rt, 1, 8);
        double act = 0;
        for (const Op& op : p.ops)
          for (const MemEvent& e : op.on_issue)
            if (e.category == MemoryCategory::Activations && op.kind == OpKind::Forward) act += e.bytes;
        CHECK(act <= prev_act);
        prev_act = act;
      }
      double prev_peak = INFINITY;
      for (Offload off : {Offload::None, Offload::Optimizer, Offload::Params}) {
        if (off == Offload::Params && !shards_params(k)) continue;
        Strategy c = s;
        c.offload = off;
        MemoryResult r = walk(g, c, rt, 1, 8);
        CHECK(r.peak_allocated <= prev_peak * (1 + 1e-9));
        prev_peak = r.peak_allocated;
      }
    }
  }
}

TEST_CASE(
    "offloaded gradient shards: to the host after every reduction (FSDP2), on the device until the step (fsdp-run)") {
  // 70B on 8 GPUs with parameter offload, accumulation 2: FSDP2's foreach_reduce copies each reduced shard to the host
  // and frees it (RuntimeProfile::offloaded_grads_kept_on_device), so at most a few units' shards are on the device
  // at the peak; fsdp-run keeps every unit's fp32 shard (70.55B x 4 B / 8 = 32.9 GiB).
  ModuleGraph g(zoo("llama3-70b"));
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.act_ckpt = ActCkpt::Full;
  s.offload = Offload::Params;
  s.grad_accum = 2;
  const double all_shards = static_cast<double>(g.total_params()) * 4.0 / 8.0;
  const double one_layer = all_shards / static_cast<double>(g.spec().num_layers);
  const MemoryResult kept = walk(g, s, runtime("fsdp-run"), 1, 8);
  CHECK(cat(kept.breakdown, MemoryCategory::ShardedGrads) == doctest::Approx(all_shards).epsilon(0.01));
  for (const char* name : {"pytorch", "pytorch-fsdp1", "torchtitan", "deepspeed"}) {
    CAPTURE(name);
    Strategy d = s;
    if (std::string(name) == "deepspeed") d.kind = StrategyKind::Zero3;
    const RuntimeProfile rt = runtime(name);
    CHECK_FALSE(rt.offloaded_grads_kept_on_device);
    const MemoryResult copied = walk(g, d, rt, 1, 8);
    CHECK(cat(copied.breakdown, MemoryCategory::ShardedGrads) <= 2.0 * one_layer);
    // Every reduction copies its shard to the host: both micro-batches' copies, each unit's.
    const StepProgram p = program(g, d, rt, 1, 8);
    int copies = 0;
    for (const Op& op : p.ops) copies += op.kind == OpKind::CopyToHost;
    CHECK(copies == 2 * static_cast<int>(p.units.size()));
  }
  CHECK(runtime("fsdp-run").offloaded_grads_kept_on_device);
}

TEST_CASE("the token embedding as a unit of its own: released after its forward, gathered again for its backward") {
  // torchtitan since #1094 shards tok_embeddings on its own (RuntimeProfile::embedding_own_unit): its bf16 weight
  // (128256 x 4096 x 2 B = 0.98 GiB for Llama 3 8B) is not held from the embedding's forward to the root's backward.
  ModuleGraph g(zoo("llama3-8b"));
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.seq_len = 8192;
  s.act_ckpt = ActCkpt::Full;
  const RuntimeProfile own = runtime("torchtitan-2510");
  CHECK(own.embedding_own_unit);
  RuntimeProfile in_root = own;
  in_root.embedding_own_unit = false;
  const double embed_bytes = 128256.0 * 4096.0 * 2.0;
  auto backward_gathers_of_root = [](const StepProgram& p) {
    int n = 0;
    for (const Op& op : p.ops) n += op.kind == OpKind::Gather && op.unit == 0 && op.phase == Phase::BwdAllGather;
    return n;
  };
  const MemoryResult split = walk(g, s, own, 1, 8), whole = walk(g, s, in_root, 1, 8);
  // The peak (the loss backward) no longer holds the embedding's weight.
  CHECK(whole.peak_allocated - split.peak_allocated == doctest::Approx(embed_bytes).epsilon(0.01));
  CHECK(backward_gathers_of_root(program(g, s, own, 1, 8)) == 1);
  CHECK(backward_gathers_of_root(program(g, s, in_root, 1, 8)) == 0);
  // Not where the layers stay gathered after forward (SHARD_GRAD_OP), nor for a head tied to the embedding, nor
  // under a pipeline.
  Strategy grad_op = s;
  grad_op.kind = StrategyKind::FsdpGradOp;
  grad_op.reshard_after_forward = false;
  CHECK(backward_gathers_of_root(program(g, grad_op, own, 1, 8)) == 0);
  ModuleGraph tied(zoo("gemma3-1b"));
  CHECK(backward_gathers_of_root(program(tied, s, own, 1, 8)) == 0);
  Strategy pp = s;
  pp.mesh.pp = 2;
  pp.grad_accum = 2;
  CHECK(backward_gathers_of_root(program(g, pp, own, 1, 8)) == 0);
}

TEST_CASE("more prefetch never lowers peak memory") {
  RuntimeProfile rt = runtime("fsdp-run");
  ModuleGraph g(zoo("llama2-7b"));
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  double prev = 0;
  for (int64_t depth : {0, 1, 2, 4}) {
    s.forward_prefetch = s.backward_prefetch = depth;
    double peak = walk(g, s, rt, 1, 8).peak_allocated;
    CHECK(peak >= prev);
    prev = peak;
  }
}

TEST_CASE("the peak is reported with its phase and the breakdown sums to the peak") {
  RuntimeProfile rt = runtime("pytorch");
  ModuleGraph g(zoo("llama3-8b"));
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  MemoryResult r = walk(g, s, rt, 1, 8);
  CHECK_FALSE(r.peak_phase.empty());
  double sum = 0;
  for (size_t i = 0; i < kNumMemoryCategories; ++i) {
    auto c = static_cast<MemoryCategory>(i);
    if (c == MemoryCategory::Fragmentation || c == MemoryCategory::Nccl || c == MemoryCategory::Workspace) continue;
    sum += r.breakdown[i];
  }
  CHECK(sum == doctest::Approx(r.peak_allocated).epsilon(1e-9));
  CHECK(r.reserved_peak >= r.peak_allocated);
  CHECK(r.device_total >= r.reserved_peak);
}

TEST_CASE("LoRA and QLoRA: frozen base without grads or optimizer state, adapters trainable") {
  ModuleGraph g(zoo("llama2-7b"));
  RuntimeProfile rt = runtime("fsdp-run");
  const ModelSpec& m = g.spec();
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.method = Method::Lora;
  s.lora.rank = 16;
  s.lora.target_modules = {"q_proj", "v_proj"};
  const double N = 8;
  // Adapters on q and v: r * (in + out) each, per layer (Hu et al. 2021, arXiv 2106.09685 sec. 4).
  const double lora = static_cast<double>(m.num_layers) * 16.0 *
                      static_cast<double>((m.hidden_size + m.q_dim()) + (m.hidden_size + m.kv_dim()));
  const double P = static_cast<double>(g.total_params());
  // PEFT under FSDP2 (the pytorch runtime): the adapters live in their units, sharded like the base.
  {
    StepProgram pp = program(g, s, runtime("pytorch"), 1, 8);
    MemoryBreakdown st = model_state_bytes(pp);
    CHECK(cat(st, MemoryCategory::OptimizerStates) == doctest::Approx(8.0 * lora / N).epsilon(1e-3));
    CHECK(cat(st, MemoryCategory::ShardedGrads) == doctest::Approx(4.0 * lora / N).epsilon(1e-3));
    // The frozen base is stored in the compute dtype (bf16), plus the fp32 adapter shards.
    CHECK(cat(st, MemoryCategory::ShardedParams) == doctest::Approx((2.0 * P + 4.0 * lora) / N).epsilon(1e-3));
  }
  // fsdp-run: one replicated fp32 adapter leaf outside the units, with its gradient and Adam states on every
  // rank (sharding.lora_adapters: replicated); the base sharded in fp32 masters, cast for each use like trained
  // parameters (sharding.lora_base_dtype: master).
  StepProgram lp = program(g, s, rt, 1, 8);
  MemoryBreakdown states = model_state_bytes(lp);
  CHECK(cat(states, MemoryCategory::OptimizerStates) == doctest::Approx(8.0 * lora).epsilon(1e-3));
  CHECK(cat(states, MemoryCategory::ShardedGrads) == 0);
  CHECK(cat(states, MemoryCategory::UnshardedGrads) == doctest::Approx(4.0 * lora).epsilon(1e-3));
  CHECK(cat(states, MemoryCategory::ShardedParams) == doctest::Approx(4.0 * P / N + 4.0 * lora).epsilon(1e-3));
  // Replicated (ddp): the whole fp32 base on every rank, its bf16 casts held from forward to backward as the
  // trained parameters' are.
  {
    Strategy d = s;
    d.kind = StrategyKind::Ddp;
    StepProgram dp = program(g, d, rt, 1, 8);
    CHECK(cat(model_state_bytes(dp), MemoryCategory::ShardedParams) ==
          doctest::Approx(4.0 * P + 4.0 * lora).epsilon(1e-3));
    double casts = 0;
    for (const Op& op : dp.ops)
      if (op.micro_batch == 0 && op.kind == OpKind::Forward)
        for (const MemEvent& e : op.on_issue)
          if (e.category == MemoryCategory::UnshardedParams) casts += e.bytes;
    CHECK(casts == doctest::Approx(2.0 * P).epsilon(1e-3));
  }
  // QLoRA: the decoder linears in 4.127-bit NF4 (Dettmers et al. 2023 sec. 3) shrink a bf16 base ~3.5x.
  s.method = Method::QLora;
  StepProgram qp = program(g, s, rt, 1, 8);
  double q_params = cat(model_state_bytes(qp), MemoryCategory::ShardedParams);
  const double bf16_base = 2.0 * P / N + 4.0 * lora;
  CHECK(q_params < bf16_base / 3.0);
  CHECK(q_params > bf16_base / 4.0);
  // Backward of a frozen base computes input gradients only: less GEMM work than full fine-tuning.
  Strategy full = s;
  full.method = Method::Full;
  double lora_passes = 0, full_passes = 0;
  for (const Op& op : qp.ops)
    if (op.kind == OpKind::Backward) lora_passes += op.gemm_passes * op.layers;
  for (const Op& op : program(g, full, rt, 1, 8).ops)
    if (op.kind == OpKind::Backward) full_passes += op.gemm_passes * op.layers;
  CHECK(lora_passes == doctest::Approx(full_passes / 2.0));
}

// nanotron's FP32GradientAccumulator layout (configs/runtimes/nanotron.yaml; huggingface/nanotron
// src/nanotron/optim/gradient_accumulator.py @ 67c5ebb6a925cb47026b22013af8bd1bb6c46d93): bf16 parameters (2), an
// fp32 gradient buffer of every parameter (4), fp32 masters (4) and AdamW states (8) with the optimizer, and under
// DDP its bf16 buckets (2, gradient_as_bucket_view False). DDP: 2 + 4 + 4 + 8 = 18 B of model states plus 2 of
// buckets; ZeRO-1 (masters and states sharded, the fp32 gradient buffer not): 2 + 4 + 12 / N. The bf16 .grad lives
// within each micro-batch's backward only (set to None once accumulated).
TEST_CASE("nanotron runtime: bf16 params, full fp32 gradient buffer, masters and states with the optimizer") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  RuntimeProfile rt = runtime("nanotron");
  CHECK(rt.fp32_grad_accumulation);
  CHECK(rt.zero1_grads_reduced_after_backward);
  const double P = static_cast<double>(g.total_params());
  const double N = 16;
  Strategy s = zero_strategy(StrategyKind::Ddp, DType::Fp32);
  s.param_dtype = DType::Bf16;
  s.grad_accum = 4;
  StepProgram ddp = program(g, s, rt, 2, 8);
  const MemoryBreakdown ms = model_state_bytes(ddp);
  CHECK(cat(ms, MemoryCategory::ShardedParams) / P == doctest::Approx(2.0));
  CHECK(cat(ms, MemoryCategory::ShardedGrads) / P == doctest::Approx(4.0));
  CHECK(cat(ms, MemoryCategory::MasterParams) / P == doctest::Approx(4.0));
  CHECK(cat(ms, MemoryCategory::OptimizerStates) / P == doctest::Approx(8.0));
  CHECK(cat(ms, MemoryCategory::CommBuffers) / P == doctest::Approx(2.0));
  s.kind = StrategyKind::Zero1;
  StepProgram z1 = program(g, s, rt, 2, 8);
  const MemoryBreakdown mz = model_state_bytes(z1);
  double states = total(mz) - cat(mz, MemoryCategory::CommBuffers);
  CHECK(states / P == doctest::Approx(2.0 + 4.0 + 12.0 / N).epsilon(1e-4));  // padding of shards only
  // The bf16 gradients each backward allocates are all freed again within the step.
  double grads = 0;
  for (const Op& op : z1.ops) {
    for (const MemEvent& e : op.on_issue)
      if (e.category == MemoryCategory::UnshardedGrads) grads += e.bytes;
    for (const MemEvent& e : op.on_complete)
      if (e.category == MemoryCategory::UnshardedGrads) grads += e.bytes;
  }
  CHECK(grads == doctest::Approx(0.0).epsilon(1e-9));
}

// FP32GradientAccumulator.backward's fp32_grad.add_(bf16 grad) computes in fp32 (type promotion), so its 2 + 4 + 4
// bytes a parameter are priced at the fp32 elementwise rate, not the bf16 eager kernels' (docs/hardware.md
// "Elementwise kernels": p5's bf16 rate is 0.54 of its 3.35 TB/s, fp32 the full rate). By hand, the 16-layer
// gpt_like(2048) model's P parameters: 10 P / 3.35e12 s a micro-batch, 1.85x faster than at the bf16 rate.
TEST_CASE("nanotron: the fp32 gradient accumulator's add is priced at the fp32 elementwise rate") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  RuntimeProfile rt = runtime("nanotron");
  HardwareProfile hw = hardware("p5-h100-80gb");
  Strategy s = zero_strategy(StrategyKind::Ddp, DType::Fp32);
  s.param_dtype = DType::Bf16;
  s.grad_accum = 2;
  const Cluster c{1, 8};
  StepProgram p = program(g, s, rt, 1, 8);
  const double P = static_cast<double>(g.total_params());
  int adds = 0;
  for (const Op& op : p.ops) {
    if (!op.elementwise_in_master_dtype) continue;
    ++adds;
    CHECK(op.elementwise_bytes == doctest::Approx(10.0 * P));
    const double t = op_duration(op, p, hw, c, s);
    CHECK(t == doctest::Approx(10.0 * P / hw.elementwise_bandwidth(DType::Fp32).value));
    CHECK(hw.elementwise_bandwidth(DType::Fp32).value == doctest::Approx(3.35e12));
    CHECK(t < 0.6 * 10.0 * P / hw.elementwise_bandwidth(DType::Bf16).value);
  }
  CHECK(adds == 2);  // one a micro-batch
}

// trainer.py training_step: without DDP (ZeRO-1 with accumulate_grad_in_fp32) the fp32 gradient buffer is
// all-reduced after train_batch_iter, so the whole all-reduce is exposed; DDP's bucketed all-reduce overlaps the
// last backward. One all-reduce of P fp32 over the world, after the last backward and before the optimizer.
TEST_CASE("nanotron ZeRO-1: one fp32 all-reduce of every gradient after the backward, exposed") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  RuntimeProfile rt = runtime("nanotron");
  HardwareProfile hw = hardware("p5-h100-80gb");
  Strategy s = zero_strategy(StrategyKind::Zero1, DType::Fp32);
  s.param_dtype = DType::Bf16;
  s.grad_accum = 2;
  const Cluster c{4, 8};
  ProgramInput in;
  in.graph = &g;
  in.cluster = c;
  in.strategy = s;
  in.runtime = &rt;
  StepProgram p = emit_step_program(in);
  int all_reduces = 0;
  double bytes = 0;
  for (const Op& op : p.ops)
    if (op.kind == OpKind::AllReduce) {
      ++all_reduces;
      bytes = op.comm_bytes;
    }
  CHECK(all_reduces == 1);
  CHECK(bytes == doctest::Approx(4.0 * static_cast<double>(g.total_params())));
  TimelineResult t = run_timeline(p, hw, c, s);
  // Nothing runs beside it: its time is exposed (the optimizer waits for it).
  const CommGroup world = make_group(hw, 32, 8);
  const double ar_s = collective_time(hw, CollectiveKind::AllReduce, Bytes(bytes), world).value;
  CHECK(t.exposed_comm_s >= 0.99 * ar_s);
  // It starts when the last backward (and the accumulation into the fp32 buffer) has ended, and the optimizer
  // starts when it has ended.
  int ar = -1, last_bwd = -1, opt = -1;
  for (int i = 0; i < static_cast<int>(p.ops.size()); ++i) {
    const OpKind k = p.ops[static_cast<size_t>(i)].kind;
    if (k == OpKind::AllReduce) ar = i;
    if (k == OpKind::Backward || k == OpKind::Reshard) last_bwd = ar < 0 ? i : last_bwd;
    if (k == OpKind::OptimizerStep) opt = i;
  }
  REQUIRE(ar >= 0);
  REQUIRE(last_bwd >= 0);
  REQUIRE(opt > ar);
  CHECK(t.ops[static_cast<size_t>(ar)].start >= t.ops[static_cast<size_t>(last_bwd)].end);
  CHECK(t.ops[static_cast<size_t>(opt)].start >= t.ops[static_cast<size_t>(ar)].end);
  // With the flag off the ZeRO-1 gradients go in buckets during the last backward instead (several all-reduces).
  RuntimeProfile overlapped = rt;
  overlapped.zero1_grads_reduced_after_backward = false;
  in.runtime = &overlapped;
  StepProgram q = emit_step_program(in);
  int buckets = 0;
  for (const Op& op : q.ops) buckets += op.kind == OpKind::AllReduce ? 1 : 0;
  CHECK(buckets > 1);
}

// deepspeed/runtime/zero/stage3.py (configs/runtimes/deepspeed.yaml): the bf16 partition, a master partition of its
// own in every dtype, one persistent gradient partition buffer in the reduce dtype, and the step's flat copy of a
// sub-group of gradients (and its cast to the master dtype). Golden numbers per parameter over N ranks.
TEST_CASE("DeepSpeed ZeRO-3: own master partition, persistent gradient buffer, the sub-group copy at the step") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  const RuntimeProfile rt = runtime("deepspeed");
  REQUIRE(rt.zero3_master_copy_same_dtype);
  REQUIRE(rt.zero3_grad_partition_persistent);
  REQUIRE(rt.zero3_step_sub_group_elems == 1e9);
  REQUIRE(rt.reduce_in_compute_dtype_by_default);
  const double P = static_cast<double>(g.total_params());
  const double N = 16;
  Strategy s = zero_strategy(StrategyKind::Zero3, DType::Bf16);
  s.param_dtype = DType::Bf16;
  auto persistent = [](const StepProgram& p, MemoryCategory c) {
    double b = 0;
    for (const MemEvent& e : p.persistent)
      if (e.category == c) b += e.bytes;
    return b;
  };
  auto step_transient = [](const StepProgram& p) {
    for (const Op& o : p.ops)
      if (o.kind == OpKind::OptimizerStep) return o.transient_bytes;
    return -1.0;
  };
  SUBCASE("fp32 masters: bf16 grads, 2 + 2 + 4 + 8 bytes per parameter, and the flatten + fp32 cast") {
    const StepProgram p = program(g, s, rt, 2, 8);
    CHECK(persistent(p, MemoryCategory::ShardedParams) * N / P == doctest::Approx(2.0).epsilon(1e-3));
    CHECK(persistent(p, MemoryCategory::ShardedGrads) * N / P == doctest::Approx(2.0).epsilon(1e-3));
    CHECK(persistent(p, MemoryCategory::MasterParams) * N / P == doctest::Approx(4.0).epsilon(1e-3));
    CHECK(persistent(p, MemoryCategory::OptimizerStates) * N / P == doctest::Approx(8.0).epsilon(1e-3));
    // The whole partition is under one sub-group of 1e9 elements: 2 B flat + 4 B fp32 per element.
    CHECK(step_transient(p) == doctest::Approx(persistent(p, MemoryCategory::ShardedGrads) / 2.0 * 6.0));
  }
  SUBCASE("bf16 masters and states (bf16_master_weights_and_grads): the master is still a copy") {
    s.master_dtype = DType::Bf16;
    const StepProgram p = program(g, s, rt, 2, 8);
    CHECK(persistent(p, MemoryCategory::MasterParams) * N / P == doctest::Approx(2.0).epsilon(1e-3));
    CHECK(persistent(p, MemoryCategory::OptimizerStates) * N / P == doctest::Approx(4.0).epsilon(1e-3));
    // The flat bf16 copy only: .to(bf16) of a bf16 tensor is the tensor itself.
    CHECK(step_transient(p) == doctest::Approx(persistent(p, MemoryCategory::ShardedGrads)));
  }
  SUBCASE("PyTorch's FSDP keeps none of this: no master copy in one dtype, gradients allocated by the step") {
    s.kind = StrategyKind::Fsdp;
    s.master_dtype = DType::Bf16;
    const StepProgram p = program(g, s, runtime("pytorch"), 2, 8);
    CHECK(persistent(p, MemoryCategory::MasterParams) == 0);
    CHECK(persistent(p, MemoryCategory::ShardedGrads) == 0);
  }
}

// CUDACachingAllocator's OOM retry frees its cached blocks before failing: reserved memory stays within the device
// while the allocated peak fits; a peak that does not fit is left as it is (the plan does not fit).
TEST_CASE("reserved memory is capped at the device while the allocated peak fits") {
  MemoryResult r;
  r.peak_allocated = 70;
  r.reserved_peak = 85;
  r.breakdown[static_cast<size_t>(MemoryCategory::Fragmentation)] = 15;
  r.device_total = 86;  // 1 of context and NCCL
  cap_reserved_at_device(r, 80);
  CHECK(r.capped_at_device);
  CHECK(r.reserved_peak == 79);
  CHECK(r.device_total == 80);
  CHECK(r.breakdown[static_cast<size_t>(MemoryCategory::Fragmentation)] == 9);
  MemoryResult over = r;
  over.capped_at_device = false;
  over.peak_allocated = 79.5;
  over.reserved_peak = 90;
  over.device_total = 91;
  cap_reserved_at_device(over, 80);
  CHECK_FALSE(over.capped_at_device);
  CHECK(over.device_total == 91);
  MemoryResult fits = r;
  fits.capped_at_device = false;
  fits.reserved_peak = 60;
  fits.device_total = 61;
  cap_reserved_at_device(fits, 80);
  CHECK_FALSE(fits.capped_at_device);
  CHECK(fits.reserved_peak == 60);
}

// grad_sync last-micro-batch (FSDP1 no_sync, FSDP2 set_requires_gradient_sync(False)): micro-batches before the last
// keep every unit's unsharded gradient, the last reduce-scatters the sum, once per unit.
TEST_CASE("grad_sync last-micro-batch: the unsharded gradients are kept across micro-batches, reduced once") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  const RuntimeProfile rt = runtime("pytorch-fsdp1");
  Strategy s = zero_strategy(StrategyKind::Fsdp, DType::Bf16);
  s.param_dtype = s.master_dtype = DType::Bf16;  // bf16-true, as LitGPT's rows
  s.grad_accum = 4;
  const StepProgram every = program(g, s, rt, 1, 4);
  s.grad_sync = GradSync::LastMicroBatch;
  const StepProgram last = program(g, s, rt, 1, 4);
  auto count = [](const StepProgram& p, OpKind k, int mb) {
    int c = 0;
    for (const Op& o : p.ops) c += o.kind == k && (mb < 0 || o.micro_batch == mb) ? 1 : 0;
    return c;
  };
  const int units = static_cast<int>(last.units.size());
  // Emitted micro-batches: the first, one middle, the last (StepLayout::micro_batches_emitted).
  CHECK(count(every, OpKind::ReduceScatter, -1) == 3 * units);
  CHECK(count(last, OpKind::ReduceScatter, -1) == units);
  CHECK(count(last, OpKind::ReduceScatter, 3) == units);
  // What micro-batch 0 leaves allocated: the whole unsharded bf16 gradient (padded units), and no sharded one.
  double kept = 0, sharded_before_last = 0, balance = 0;
  auto tally = [&](const Op& o, const MemEvent& e) {
    if (e.category == MemoryCategory::UnshardedGrads) {
      if (o.micro_batch == 0) kept += e.bytes;
      balance += e.bytes;
    }
    if (e.category == MemoryCategory::ShardedGrads && e.bytes > 0 && o.micro_batch < 3) sharded_before_last += e.bytes;
  };
  for (const Op& o : last.ops) {
    for (const MemEvent& e : o.on_issue) tally(o, e);
    for (const MemEvent& e : o.on_complete) tally(o, e);
  }
  const double P = static_cast<double>(g.total_params());
  CHECK(kept / (2.0 * P) == doctest::Approx(1.0).epsilon(0.01));
  CHECK(sharded_before_last == 0);
  CHECK(balance == doctest::Approx(0.0).epsilon(1e-9));
  // The peak carries that gradient: higher than reducing every micro-batch by about the gradient less its shard.
  const MemoryResult me = walk_memory(every, rt, 4), ml = walk_memory(last, rt, 4);
  CHECK(ml.peak_allocated - me.peak_allocated > 0.5 * 2.0 * P);
  CHECK(ml.peak_allocated - me.peak_allocated < 2.0 * P);
  // Only where it means something.
  for (StrategyKind k : {StrategyKind::Ddp, StrategyKind::Zero1, StrategyKind::Zero2, StrategyKind::Zero3}) {
    Strategy bad = s;
    bad.kind = k;
    CHECK_THROWS_WITH_AS(validate_strategy(bad, g.spec(), Cluster{1, 4}), doctest::Contains("--grad-sync"), InputError);
  }
  Strategy off = s;
  off.offload = Offload::Optimizer;
  CHECK_THROWS_WITH_AS(validate_strategy(off, g.spec(), Cluster{1, 4}), doctest::Contains("offload"), InputError);
  CHECK_NOTHROW(validate_strategy(s, g.spec(), Cluster{1, 4}));
}

// FSDP2 keeps an unsynced unit's gradient in the reduce dtype: its post-backward reshards, upcasts the compute-dtype
// gradient into unsharded_accumulated_grad (both alive while it is written) and later backwards add into it; FSDP1's
// no_sync keeps the compute-dtype flat gradient (RuntimeProfile::unsynced_grads_in_reduce_dtype).
TEST_CASE(
    "grad_sync last-micro-batch under FSDP2: the kept gradients are in the reduce dtype, FSDP1's in the compute") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  const RuntimeProfile fsdp2 = runtime("pytorch"), fsdp1 = runtime("pytorch-fsdp1");
  REQUIRE(fsdp2.unsynced_grads_in_reduce_dtype);
  REQUIRE_FALSE(fsdp1.unsynced_grads_in_reduce_dtype);
  Strategy s = zero_strategy(StrategyKind::Fsdp, DType::Fp32);
  s.param_dtype = DType::Bf16;
  s.grad_accum = 4;
  s.grad_sync = GradSync::LastMicroBatch;
  // What micro-batch 0 leaves allocated in unsharded gradients, and the bytes it copies in its post-backward.
  auto kept_after_first = [&](const RuntimeProfile& rt, const Strategy& st) {
    const StepProgram p = program(g, st, rt, 1, 4);
    double kept = 0, copied = 0, balance = 0;
    auto tally = [&](const Op& o, const MemEvent& e) {
      if (e.category != MemoryCategory::UnshardedGrads) return;
      balance += e.bytes;
      if (o.micro_batch == 0) kept += e.bytes;
    };
    for (const Op& o : p.ops) {
      for (const MemEvent& e : o.on_issue) tally(o, e);
      for (const MemEvent& e : o.on_complete) tally(o, e);
      if (o.micro_batch == 0 && o.phase == Phase::PostBackward) copied += o.device_copy_bytes;
    }
    CHECK(balance == doctest::Approx(0.0).epsilon(1e-9));
    return std::pair{kept, copied};
  };
  const double P = static_cast<double>(g.total_params());
  RuntimeProfile fsdp2_compute = fsdp2;
  fsdp2_compute.unsynced_grads_in_reduce_dtype = false;
  const auto [kept2, copied2] = kept_after_first(fsdp2, s);
  const auto [kept2c, copied2c] = kept_after_first(fsdp2_compute, s);
  CHECK(kept2 / (4.0 * P) == doctest::Approx(1.0).epsilon(0.01));
  CHECK(kept2c / (2.0 * P) == doctest::Approx(1.0).epsilon(0.01));
  CHECK(kept_after_first(fsdp1, s).first == doctest::Approx(kept2c));
  // The upcast reads the bf16 gradient and writes the fp32 one.
  CHECK(copied2 - copied2c == doctest::Approx(6.0 * P).epsilon(0.01));
  // FSDP2 upcasts only where the reduce dtype differs from the compute dtype.
  Strategy same = s;
  same.reduce_dtype = DType::Bf16;
  CHECK(kept_after_first(fsdp2, same).first == doctest::Approx(kept_after_first(fsdp2_compute, same).first));
  // The peak carries the difference: the whole model's gradient at 2 more bytes an element (within its padding).
  const MemoryResult m2 = walk_memory(program(g, s, fsdp2, 1, 4), fsdp2, 4);
  const MemoryResult m2c = walk_memory(program(g, s, fsdp2_compute, 1, 4), fsdp2_compute, 4);
  CHECK((m2.peak_allocated - m2c.peak_allocated) / (2.0 * P) == doctest::Approx(1.0).epsilon(0.02));
}

// FSDP2 / FSDP1 allocate the sharded gradients on the reduce-scatter stream; freed by zero_grad, their blocks stay in
// that stream's pool (CUDACachingAllocator reuses a block only on its own stream): reserved beyond the fraction.
TEST_CASE("the reduce stream's pool keeps the sharded gradients' blocks reserved at a peak where they are freed") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  const RuntimeProfile rt = runtime("pytorch");
  REQUIRE(rt.sharded_grads_in_reduce_stream_pool);
  Strategy s = zero_strategy(StrategyKind::Fsdp, DType::Fp32);
  s.param_dtype = DType::Bf16;
  s.seq_len = 4096;
  s.micro_batch = 4;
  const StepProgram p = program(g, s, rt, 1, 8);
  const MemoryResult r = walk_memory(p, rt, 8);
  const double grads = cat(model_state_bytes(p), MemoryCategory::ShardedGrads);
  REQUIRE(grads > 0);
  // The peak is in the first micro-batch's loss backward, before any reduce-scatter: the whole pool is cached.
  REQUIRE(r.peak_phase.find("loss backward") != std::string::npos);
  CHECK(r.reduce_pool_cached == doctest::Approx(grads).epsilon(1e-3));
  const double persistent = [&] {
    double b = 0;
    for (const MemEvent& e : p.persistent) b += e.bytes;
    return b;
  }();
  CHECK(r.reserved_peak - r.peak_allocated ==
        doctest::Approx(rt.fragmentation_fraction * (r.peak_allocated - persistent) + grads).epsilon(1e-6));
  // Not on a CPU device (no caching allocator), not for DDP (gradients on the compute stream), not for DeepSpeed
  // (its gradient partition is persistent).
  CHECK(walk_memory(p, rt, 8, /*cuda=*/false).reduce_pool_cached == 0);
  Strategy ddp = s;
  ddp.kind = StrategyKind::Ddp;
  CHECK(walk_memory(program(g, ddp, rt, 1, 8), rt, 8).reduce_pool_cached == 0);
  Strategy z3 = s;
  z3.kind = StrategyKind::Zero3;
  const RuntimeProfile ds = runtime("deepspeed");
  CHECK(walk_memory(program(g, z3, ds, 1, 8), ds, 8).reduce_pool_cached == 0);
}

namespace {

constexpr double kSegGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kSegMiB = 1024.0 * 1024.0;

// A hand-built step: 10 GiB of persistent states, one forward saving 3 GiB with 1 GiB of working memory, its
// backward, the optimizer, and a parameter gather in the step window staging `staging` bytes whose largest tensor is
// `largest` (Op::largest_block_bytes).
StepProgram step_with_gather(double staging, double largest) {
  StepProgram p;
  p.persistent.push_back({MemoryCategory::ShardedParams, 10 * kSegGiB});
  Op f;
  f.kind = OpKind::Forward;
  f.phase = Phase::Forward;
  f.on_issue.push_back({MemoryCategory::Activations, 3 * kSegGiB});
  f.transient_bytes = 1 * kSegGiB;
  p.ops.push_back(f);
  Op b;
  b.kind = OpKind::Backward;
  b.phase = Phase::Backward;
  b.on_complete.push_back({MemoryCategory::Activations, -3 * kSegGiB});
  p.ops.push_back(b);
  Op o;
  o.kind = OpKind::OptimizerStep;
  o.phase = Phase::OptimizerStep;
  o.after_all_comm = true;
  p.ops.push_back(o);
  Op g = make_collective_op(OpKind::ParamAllGather, Stream::AllGather, -1, 0, Phase::ParamAllGather,
                            CollectiveKind::AllGather, GroupKind::World);
  g.on_issue.push_back({MemoryCategory::CommBuffers, staging});
  g.on_complete.push_back({MemoryCategory::CommBuffers, -staging});
  g.largest_block_bytes = largest;
  p.ops.push_back(g);
  return p;
}

}  // namespace

// c10/cuda/CUDACachingAllocator.cpp: a request no cached block of its pool can hold (get_free_block's best fit finds
// none; blocks of different segments never merge) gets a segment of its own (alloc_block), kept cached after it is
// freed. A block the step window allocates that is larger than every block the micro-batches allocated so adds its
// segment to what the micro-batches reserved; one that fits in a cached block adds nothing.
TEST_CASE("step segments: a step block larger than every micro-batch block adds its own segment to reserved") {
  RuntimeProfile rt = runtime("pytorch");
  rt.sharded_grads_in_reduce_stream_pool = false;
  const double f = rt.fragmentation_fraction;
  // 5 GiB staged, its largest tensor 4 GiB: larger than the 3 GiB of activations and the 1 GiB of working memory.
  const MemoryResult big = walk_memory(step_with_gather(5 * kSegGiB, 4 * kSegGiB), rt, 8);
  CHECK(big.peak_allocated == doctest::Approx(15 * kSegGiB));
  CHECK(big.step_segments == doctest::Approx(4 * kSegGiB));
  // The micro-batches reserved their peak (14 GiB) and its fragmentation; the gather's 4 GiB tensor comes on top.
  CHECK(big.reserved_peak == doctest::Approx(14 * kSegGiB + f * 4 * kSegGiB + 4 * kSegGiB));
  CHECK(cat(big.breakdown, MemoryCategory::Fragmentation) == doctest::Approx(big.reserved_peak - big.peak_allocated));
  // Its largest tensor no larger than the activations' block: the cache holds it, the fraction alone is added.
  const MemoryResult fits = walk_memory(step_with_gather(5 * kSegGiB, 3 * kSegGiB), rt, 8);
  CHECK(fits.step_segments == 0);
  CHECK(fits.reserved_peak == doctest::Approx(15 * kSegGiB + f * 5 * kSegGiB));
  // No largest tensor stated (an event that may sum tensors of any size): assumed to fit the cache.
  CHECK(walk_memory(step_with_gather(5 * kSegGiB, 0), rt, 8).step_segments == 0);
  // Segments are rounded as the allocator sizes them: a 3 MiB block (between 1 and 10 MiB) gets a 20 MiB segment
  // (kLargeBuffer), 11 MiB is rounded up to 12 (kRoundLarge 2 MiB).
  StepProgram small = step_with_gather(3 * kSegMiB, 3 * kSegMiB);
  small.ops[0].on_issue.items[0].bytes = small.ops[1].on_complete.items[0].bytes = 0;
  small.ops[0].transient_bytes = 1 * kSegMiB;
  CHECK(walk_memory(small, rt, 8).step_segments == doctest::Approx(20 * kSegMiB));
  StepProgram eleven = step_with_gather(11 * kSegMiB, 11 * kSegMiB);
  eleven.ops[0].on_issue.items[0].bytes = eleven.ops[1].on_complete.items[0].bytes = 0;
  eleven.ops[0].transient_bytes = 1 * kSegMiB;
  CHECK(walk_memory(eleven, rt, 8).step_segments == doctest::Approx(12 * kSegMiB));
  // No caching allocator on a CPU run: reserved is what is allocated.
  const MemoryResult cpu = walk_memory(step_with_gather(5 * kSegGiB, 4 * kSegGiB), rt, 8, /*cuda=*/false);
  CHECK(cpu.step_segments == 0);
  CHECK(cpu.reserved_peak == cpu.peak_allocated);
}

// A pipeline transfer's event that sums many tensors living on (the stage's other micro-batches in flight) is no
// block: the program bounds their largest tensor (StepProgram::pipeline_transfer_tensor_bound), and the step window's
// gather is compared with that.
TEST_CASE("step segments: a pipeline transfer's event bounds the cached blocks by the program's tensor bound") {
  RuntimeProfile rt = runtime("pytorch");
  rt.sharded_grads_in_reduce_stream_pool = false;
  StepProgram p = step_with_gather(5 * kSegGiB, 4 * kSegGiB);
  // Before the forward, a receive holding 6 GiB of other micro-batches' activations, released after the backward.
  Op recv = make_collective_op(OpKind::PipelineTransfer, Stream::Pipeline, -1, 0, Phase::PipelineRecvActivations,
                               CollectiveKind::SendRecv, GroupKind::Pipeline);
  recv.on_issue.push_back({MemoryCategory::Activations, 6 * kSegGiB});
  p.ops.insert(p.ops.begin(), recv);
  p.ops[2].on_complete.push_back({MemoryCategory::Activations, -6 * kSegGiB});
  CHECK(walk_memory(p, rt, 8).step_segments == 0);  // taken as one 6 GiB block, it would hold the gather's 4 GiB
  p.pipeline_transfer_tensor_bound = 1 * kSegGiB;
  const MemoryResult bounded = walk_memory(p, rt, 8);
  CHECK(bounded.step_segments == doctest::Approx(4 * kSegGiB));
  CHECK(bounded.peak_allocated == doctest::Approx(20 * kSegGiB));  // the allocated books do not change
  // A bound above the gather's tensor: the cache holds it.
  p.pipeline_transfer_tensor_bound = 4.5 * kSegGiB;
  CHECK(walk_memory(p, rt, 8).step_segments == 0);
  // Only a pipeline transfer's events are bounded: the forward's 3 GiB block still holds a 3 GiB gather.
  StepProgram q = step_with_gather(5 * kSegGiB, 3 * kSegGiB);
  q.pipeline_transfer_tensor_bound = 1 * kSegGiB;
  CHECK(walk_memory(q, rt, 8).step_segments == 0);
}

// nanotron's ZeRO-1 parameter gather (configs/runtimes/nanotron.yaml zero_param_gather_replica_copies): c10d's flat
// output of the whole bf16 replica is its largest tensor. At a small micro-batch it is larger than the fp32 logits
// (the micro-batches' largest block) and gets a segment of its own; at a large one the logits' block holds it.
TEST_CASE("step segments: nanotron's ZeRO-1 gather stages the replica in a segment of its own at small micro-batches") {
  ModuleGraph g(gpt_like(2048, 8, 16));
  const RuntimeProfile rt = runtime("nanotron");
  Strategy s = zero_strategy(StrategyKind::Zero1, DType::Fp32);
  s.param_dtype = DType::Bf16;
  s.grad_accum = 2;
  const double replica = 2.0 * static_cast<double>(g.total_params());         // bf16
  const double logits_fp32 = static_cast<double>(s.seq_len) * 51200.0 * 4.0;  // one sequence's fp32 logits
  REQUIRE(replica > logits_fp32);
  const MemoryResult small = walk(g, s, rt, 2, 8);
  CHECK(small.step_segments == doctest::Approx(std::ceil(replica / (2 * kSegMiB)) * 2 * kSegMiB).epsilon(1e-3));
  s.micro_batch = 8;  // fp32 logits 8 x 1024 x 51200 x 4 = 1.6 GiB > the replica's 0.95 GiB
  REQUIRE(static_cast<double>(s.micro_batch) * logits_fp32 > replica);
  const MemoryResult large = walk(g, s, rt, 2, 8);
  CHECK(large.step_segments == 0);
  // What the search's micro-batch pruning relies on (plan_search.cpp): the device total less the step segments
  // never falls as the micro-batch grows.
  CHECK(large.device_total - large.step_segments >= small.device_total - small.step_segments);
  // DDP stages nothing after the backward.
  s.micro_batch = 1;
  s.kind = StrategyKind::Ddp;
  CHECK(walk(g, s, rt, 2, 8).step_segments == 0);
}

namespace {

// A hand-built tensor-parallel micro-batch: 10 GiB of persistent states; two forward layers saving 2 GiB each, each
// followed by its reduce-scatters, whose inputs (1 GiB) ProcessGroupNCCL records on its stream; the head and loss with
// 3 GiB of working memory; the loss backward with 4 GiB; a backward freeing the activations, its reduce-scatter.
StepProgram tp_micro_batch() {
  StepProgram p;
  p.persistent.push_back({MemoryCategory::ShardedParams, 10 * kSegGiB});
  auto compute = [&](OpKind k, Phase ph, double saved, double transient) {
    Op o;
    o.kind = k;
    o.phase = ph;
    if (saved > 0) o.on_issue.push_back({MemoryCategory::Activations, saved});
    if (saved < 0) o.on_complete.push_back({MemoryCategory::Activations, saved});
    o.transient_bytes = transient;
    p.ops.push_back(o);
  };
  auto reduce_scatter = [&](Phase ph) {
    Op rs = make_collective_op(OpKind::TpCollective, Stream::TensorParallel, -1, 0, ph, CollectiveKind::ReduceScatter,
                               GroupKind::Tensor);
    rs.stream_recorded_bytes = 1 * kSegGiB;
    p.ops.push_back(rs);
  };
  compute(OpKind::Forward, Phase::Forward, 2 * kSegGiB, 0);
  reduce_scatter(Phase::TpForwardCollectives);
  compute(OpKind::Forward, Phase::Forward, 2 * kSegGiB, 0);
  reduce_scatter(Phase::TpForwardCollectives);
  compute(OpKind::Loss, Phase::HeadLossForward, 0, 3 * kSegGiB);
  compute(OpKind::LossBackward, Phase::LossBackward, 0, 4 * kSegGiB);
  compute(OpKind::Backward, Phase::Backward, -4 * kSegGiB, 0);
  reduce_scatter(Phase::TpBackwardCollectives);
  return p;
}

}  // namespace

// c10/cuda/CUDACachingAllocator.cpp: a freed block with streams recorded on it returns to its pool only once an event
// recorded on those streams at the free has completed (free -> insert_events, process_events at each malloc); a
// runtime issuing a pass ahead of the GPU (nanotron: allocator.collective_inputs_held_for_the_pass) keeps every
// reduce-scatter input of the pass reserved beside what the pass allocates after it.
TEST_CASE("recorded collective inputs: held in reserved memory until their pass is issued, not beyond") {
  RuntimeProfile rt = runtime("nanotron");
  REQUIRE(rt.collective_inputs_held_for_the_pass);
  const double f = rt.fragmentation_fraction;
  const MemoryResult r = walk_memory(tp_micro_batch(), rt, 8);
  // Allocated peaks in the loss backward: 10 + 4 (both layers' activations) + 4 (its working memory).
  CHECK(r.peak_allocated == doctest::Approx(18 * kSegGiB));
  // Reserved peaks in the loss forward: 17 GiB allocated (10 + 4 + 3), both forward reduce-scatters' inputs held
  // (2 GiB), and the fraction of its 7 GiB of dynamic memory: 19 + 7f, over the allocated peak's 18 + 8f. Were the
  // forward's inputs still held in the loss backward (a new pass), it would be 18 + 2 + 8f.
  CHECK(r.reserved_peak == doctest::Approx(19 * kSegGiB + f * 7 * kSegGiB));
  CHECK(r.collective_inputs_held == doctest::Approx(2 * kSegGiB));
  CHECK(cat(r.breakdown, MemoryCategory::Fragmentation) == doctest::Approx(r.reserved_peak - r.peak_allocated));
  // A runtime that does not hold them (PyTorch's profile): the allocated peak and its fraction.
  rt.collective_inputs_held_for_the_pass = false;
  const MemoryResult plain = walk_memory(tp_micro_batch(), rt, 8);
  CHECK(plain.reserved_peak == doctest::Approx(18 * kSegGiB + f * 8 * kSegGiB));
  CHECK(plain.collective_inputs_held == 0);
  CHECK_FALSE(runtime("pytorch").collective_inputs_held_for_the_pass);
  // No caching allocator on a CPU run.
  rt.collective_inputs_held_for_the_pass = true;
  CHECK(walk_memory(tp_micro_batch(), rt, 8, /*cuda=*/false).reserved_peak == doctest::Approx(18 * kSegGiB));
}

// FSDP2's all-gather copy-out (wait_for_unshard: split_with_sizes_copy into the per-parameter tensors) is a contiguous
// copy: its read and write are the forward op's device_copy_bytes, priced at HardwareProfile::copy_bandwidth
// (device.copy_efficiency), not at the eager elementwise rate; a profile without the key prices it at that rate.
TEST_CASE("FSDP2: the all-gather copy-out is priced at the device's copy rate") {
  ModuleGraph g(gpt_like(2048, 4, 16));
  const RuntimeProfile rt = runtime("pytorch");
  REQUIRE(rt.allgather_copy_out);
  Strategy s = zero_strategy(StrategyKind::Fsdp, DType::Fp32);
  s.param_dtype = DType::Bf16;
  const Cluster c{1, 8};
  const StepProgram p = program(g, s, rt, 1, 8);
  const HardwareProfile hw = hardware("h100-80gb");
  REQUIRE(hw.copy_efficiency > 0);
  HardwareProfile eager = hw;
  eager.copy_efficiency = 0;
  int forwards = 0;
  for (const Op& op : p.ops) {
    if (op.kind != OpKind::Forward) continue;
    ++forwards;
    CHECK(op.device_copy_bytes > 0);
    Op without = op;
    without.device_copy_bytes = 0;
    const double base = op_duration(without, p, hw, c, s);
    CHECK(op_duration(op, p, hw, c, s) - base ==
          doctest::Approx(op.device_copy_bytes / (hw.copy_efficiency * hw.memory_bandwidth.value)));
    CHECK(op_duration(op, p, eager, c, s) - base ==
          doctest::Approx(op.device_copy_bytes / hw.elementwise_bandwidth(DType::Bf16).value));
  }
  CHECK(forwards > 0);
}

// FSDP1's flat parameter (configs/runtimes/pytorch-fsdp1.yaml flat_grad_cat_in_backward): the module's parameters
// are views split off the unsharded flat parameter (torch/distributed/fsdp/_flat_param.py _get_unflat_views), so
// autograd's SplitWithSizesBackward concatenates their gradients into the flat gradient: each unit's post-backward
// reads its per-parameter gradients and writes the flat one (2 x its padded parameters x 2 B in bf16), both alive
// while it runs. Nothing else in the program moves.
TEST_CASE("FSDP1: the flat gradient concatenated from the views' gradients at each unit's post-backward") {
  ModuleGraph g(gpt_like(2048, 4, 16));
  const RuntimeProfile with = runtime("pytorch-fsdp1");
  REQUIRE(with.flat_grad_cat_in_backward);
  CHECK(runtime("pytorch-fsdp1-compile").flat_grad_cat_in_backward);  // derived from it: the same flat parameters
  CHECK_FALSE(runtime("pytorch").flat_grad_cat_in_backward);          // FSDP2's per-parameter DTensors
  RuntimeProfile without = with;
  without.flat_grad_cat_in_backward = false;
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Bf16;
  s.micro_batch = 2;
  s.seq_len = 1024;
  s.grad_accum = 2;
  const StepProgram a = program(g, s, with, 2, 8);
  const StepProgram b = program(g, s, without, 2, 8);
  REQUIRE(a.ops.size() == b.ops.size());
  const double P = static_cast<double>(g.total_params());
  double extra_bytes = 0, extra_transient = 0;
  int posts = 0;
  for (size_t i = 0; i < a.ops.size(); ++i) {
    const Op& x = a.ops[i];
    const Op& y = b.ops[i];
    CHECK(x.kind == y.kind);
    if (x.kind == OpKind::Reshard && x.phase == Phase::PostBackward) {
      ++posts;
      CHECK(x.elementwise_bytes == y.elementwise_bytes);
      CHECK(x.device_copy_bytes - y.device_copy_bytes ==
            doctest::Approx(2.0 * (x.transient_bytes - y.transient_bytes)));
      extra_bytes += x.device_copy_bytes - y.device_copy_bytes;
      extra_transient += x.transient_bytes - y.transient_bytes;
    } else {
      CHECK(x.elementwise_bytes == y.elementwise_bytes);
      CHECK(x.device_copy_bytes == y.device_copy_bytes);
      CHECK(x.transient_bytes == y.transient_bytes);
    }
  }
  CHECK(posts == 2 * static_cast<int>(a.units.size()));  // every unit, each micro-batch
  // Per micro-batch every parameter once (padding to the 16 ranks adds under 16 elements a unit), 2 B a gradient.
  CHECK(extra_transient == doctest::Approx(2.0 * 2.0 * P).epsilon(1e-4));
  CHECK(extra_bytes == doctest::Approx(2.0 * 2.0 * 2.0 * P).epsilon(1e-4));
}

TEST_CASE("replicas' weight casts: a checkpointed unit's cast again for its backward, the root's kept to it") {
  // fsdp-run's ZeRO-2 in bf16 over fp32 replicas with full checkpointing (executor/shard/sharded_model.cpp): a layer
  // unit's compute-dtype cast lives through its forward, is freed, and is cast again for its backward; the root's
  // (embedding, final norm, head: never in a checkpointed region) from its forward to its backward.
  const ModuleGraph g(load_model(std::string(FSDP_TEST_DATA) + "/models/acc-small.yaml", root()));
  const RuntimeProfile rt = runtime("fsdp-run");
  Strategy s;
  s.kind = StrategyKind::Zero2;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Fp32;
  s.master_dtype = DType::Fp32;
  s.act_ckpt = ActCkpt::Full;
  s.attention = AttentionImpl::Eager;
  s.micro_batch = 2;
  s.seq_len = 64;
  const StepProgram p = program(g, s, rt, 1, 2);
  auto events = [](const auto& list) {
    double sum = 0;
    for (const MemEvent& e : list)
      if (e.category == MemoryCategory::UnshardedParams) sum += e.bytes;
    return sum;
  };
  int checked = 0;
  for (const Op& op : p.ops) {
    if (op.kind != OpKind::Forward && op.kind != OpKind::Backward) continue;
    const WrapUnit& u = p.units[static_cast<size_t>(op.unit)];
    const double cast = 2.0 * static_cast<double>(u.params);
    CAPTURE(op.unit);
    if (op.kind == OpKind::Forward) {
      CHECK(events(op.on_issue) == doctest::Approx(cast));
      CHECK(events(op.on_complete) == doctest::Approx(u.num_layers() == 0 ? 0.0 : -cast));
    } else {
      CHECK(events(op.on_issue) == doctest::Approx(u.num_layers() == 0 ? 0.0 : cast));
      CHECK(events(op.on_complete) == doctest::Approx(-cast));
    }
    ++checked;
  }
  CHECK(checked == 2 * 5);  // the root and 4 layer units, forward and backward
  // Under autocast (the pytorch runtime) only the linears' weights are cast: of the root, the head's (vocab x hidden).
  const StepProgram ap = program(g, s, runtime("pytorch"), 1, 2);
  for (const Op& op : ap.ops)
    if (op.kind == OpKind::Forward && ap.units[static_cast<size_t>(op.unit)].num_layers() == 0)
      CHECK(events(op.on_issue) ==
            doctest::Approx(2.0 * static_cast<double>(g.spec().vocab_size * g.spec().hidden_size)));
  // fsdp-run casts the replica itself, the embedding's too: its residual stream is in the compute dtype; PyTorch's
  // autocast over fp32 replicas keeps it in fp32 (the embedding and the adds are not autocast).
  CHECK_FALSE(activation_query(s, rt).autocast_fp32_residual);
  CHECK(activation_query(s, runtime("pytorch")).autocast_fp32_residual);
  std::string text = runtime_text("fsdp-run");
  const std::string key = "  replicated_residual: compute-dtype\n";
  REQUIRE(text.find(key) != std::string::npos);
  text.replace(text.find(key), key.size(), "  replicated_residual: fp16\n");
  CHECK(runtime_load_error(text, "residual").find("replicated_residual") != std::string::npos);
}
