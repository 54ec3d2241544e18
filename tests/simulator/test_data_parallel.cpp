// program/data_parallel.hpp: the data-parallel dimension as data. Each strategy's plan under the runtimes whose
// profile keys change it (DeepSpeed's ZeRO layout, nanotron's fp32 accumulator, fsdp-run's flat gradient copy), the
// shard group and communicators, and the ops it builds.
#include <doctest/doctest.h>

#include "program/data_parallel.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;

namespace {

Strategy strategy(StrategyKind kind) {
  Strategy s;
  s.kind = kind;
  s.param_dtype = DType::Bf16;
  s.master_dtype = DType::Fp32;
  s.reduce_dtype = DType::Fp32;
  return s;
}

// The builders' context over `lay`, on a backend with low-precision collectives.
DataParallelContext context(const Strategy& s, const RuntimeProfile& rt, const DataParallelPlan& plan,
                            const StepLayout& lay) {
  DataParallelContext c;
  c.s = &s;
  c.rt = &rt;
  c.plan = &plan;
  c.layout = &lay;
  c.wire = CollectiveWire{&lay, false};
  return c;
}

}  // namespace

TEST_CASE("data parallel: PyTorch's strategies keep fp32 storage and reduce as their placement says") {
  const RuntimeProfile rt = test::runtime("pytorch");
  const DataParallelPlan ddp = data_parallel_plan(strategy(StrategyKind::Ddp), rt, 8);
  CHECK(ddp.mixed);
  CHECK_FALSE(ddp.zero_layout);
  CHECK(ddp.param_storage_dtype == DType::Fp32);
  CHECK(ddp.grad_buffer_dtype == DType::Fp32);
  CHECK(ddp.reducer_buckets);
  CHECK(ddp.bucketed);
  CHECK_FALSE(ddp.reduces_every_micro_batch);
  CHECK_FALSE(ddp.gathers_params_after_step);

  const DataParallelPlan no_shard = data_parallel_plan(strategy(StrategyKind::NoShard), rt, 8);
  CHECK_FALSE(no_shard.bucketed);
  CHECK_FALSE(no_shard.reducer_buckets);

  Strategy fsdp = strategy(StrategyKind::Fsdp);
  DataParallelPlan p = data_parallel_plan(fsdp, rt, 8);
  CHECK(p.place.params_sharded);
  CHECK(p.reduces_every_micro_batch);
  CHECK_FALSE(p.partitions_replicated_grads);
  fsdp.grad_sync = GradSync::LastMicroBatch;
  p = data_parallel_plan(fsdp, rt, 8);
  CHECK_FALSE(p.reduces_every_micro_batch);
}

TEST_CASE("data parallel: DeepSpeed's ZeRO stages keep low-precision storage with an fp32 master") {
  const RuntimeProfile rt = test::runtime("deepspeed");
  const DataParallelPlan z1 = data_parallel_plan(strategy(StrategyKind::Zero1), rt, 8);
  CHECK(z1.zero_layout);
  CHECK(z1.param_storage_dtype == DType::Bf16);
  CHECK(z1.grad_buffer_dtype == DType::Bf16);
  CHECK(z1.bucketed);
  CHECK_FALSE(z1.reducer_buckets);
  CHECK(z1.gathers_params_after_step);

  const DataParallelPlan z2 = data_parallel_plan(strategy(StrategyKind::Zero2), rt, 8);
  CHECK(z2.partitions_replicated_grads);
  CHECK(z2.reduces_every_micro_batch);
  CHECK(z2.gathers_params_after_step);
  CHECK_FALSE(z2.flat_grad_copy);  // DeepSpeed's profile does not copy into a flat buffer

  const DataParallelPlan z3 = data_parallel_plan(strategy(StrategyKind::Zero3), rt, 8);
  CHECK(z3.grad_buffer_dtype == DType::Fp32);  // reduce-scattered into the partition in the reduce dtype
  CHECK(z3.grad_partition_persistent);
  CHECK(z3.step_in_sub_groups);
  CHECK_FALSE(z3.gathers_params_after_step);
  // ZeRO-3's own master partition even in the parameters' dtype (zero3_master_copy_same_dtype).
  Strategy same = strategy(StrategyKind::Zero3);
  same.master_dtype = DType::Bf16;
  CHECK(data_parallel_plan(same, rt, 8).zero_layout);
  same.kind = StrategyKind::Zero2;
  CHECK_FALSE(data_parallel_plan(same, rt, 8).zero_layout);

  // FSDP on the same runtime keeps PyTorch's layout.
  CHECK_FALSE(data_parallel_plan(strategy(StrategyKind::Fsdp), rt, 8).zero_layout);
}

TEST_CASE("data parallel: nanotron's fp32 accumulator, ZeRO-1 reduced after the backward") {
  const RuntimeProfile rt = test::runtime("nanotron");
  const DataParallelPlan z1 = data_parallel_plan(strategy(StrategyKind::Zero1), rt, 8);
  CHECK(z1.fp32_grad_accumulator);
  CHECK(z1.param_storage_dtype == DType::Bf16);
  CHECK(z1.grad_buffer_dtype == DType::Bf16);
  CHECK(z1.reduce_after_backward);
  CHECK(data_parallel_plan(strategy(StrategyKind::Ddp), rt, 8).fp32_grad_accumulator);
  // nanotron builds DDP (and its buckets) only with more than one data-parallel rank (trainer.py init_model).
  CHECK(data_parallel_plan(strategy(StrategyKind::Ddp), rt, 2).reducer_buckets);
  CHECK_FALSE(data_parallel_plan(strategy(StrategyKind::Ddp), rt, 1).reducer_buckets);
  CHECK(data_parallel_plan(strategy(StrategyKind::Ddp), test::runtime("pytorch"), 1).reducer_buckets);
  CHECK_FALSE(data_parallel_plan(strategy(StrategyKind::Ddp), rt, 8).reduce_after_backward);
  CHECK_FALSE(data_parallel_plan(strategy(StrategyKind::Zero2), rt, 8).fp32_grad_accumulator);
  Strategy fp32 = strategy(StrategyKind::Zero1);
  fp32.param_dtype = DType::Fp32;
  CHECK_FALSE(data_parallel_plan(fp32, rt, 8).fp32_grad_accumulator);
}

TEST_CASE("data parallel: fsdp-run's ZeRO-2 reduce-scatters its flat gradient copy") {
  const RuntimeProfile rt = test::runtime("fsdp-run");
  CHECK(data_parallel_plan(strategy(StrategyKind::Zero2), rt, 8).flat_grad_copy);
  CHECK_FALSE(data_parallel_plan(strategy(StrategyKind::Zero1), rt, 8).flat_grad_copy);
}

TEST_CASE("data parallel: shard groups and communicators") {
  const RuntimeProfile rt = test::runtime("pytorch");
  Strategy h = strategy(StrategyKind::Hsdp);
  h.hsdp_group = 8;
  CHECK(dp_shard_size(h, 32) == 8);
  CHECK(dp_communicators(data_parallel_plan(h, rt, 8), 32) == 3);
  CHECK(dp_communicators(data_parallel_plan(h, rt, 8), 1) == 0);
  CHECK(dp_shard_size(strategy(StrategyKind::Ddp), 32) == 1);
  CHECK(dp_shard_size(strategy(StrategyKind::NoShard), 32) == 1);
  for (StrategyKind k :
       {StrategyKind::Zero1, StrategyKind::Zero2, StrategyKind::Zero3, StrategyKind::Fsdp, StrategyKind::FsdpGradOp})
    CHECK(dp_shard_size(strategy(k), 32) == 32);
  CHECK(dp_communicators(data_parallel_plan(strategy(StrategyKind::Fsdp), rt, 8), 32) == 1);
}

TEST_CASE("data parallel: the ops it builds") {
  const RuntimeProfile rt = test::runtime("pytorch");
  const Strategy s = strategy(StrategyKind::Fsdp);
  const DataParallelPlan plan = data_parallel_plan(s, rt, 8);
  StepLayout lay;
  lay.world = 4;
  lay.shard_size = 4;
  DataParallelContext c = context(s, rt, plan, lay);
  c.pb = 2;
  c.mb = 4;
  c.rb = 4;
  c.sb = 4;
  c.gb = 4;
  CHECK(c.shard(10) == 3);
  CHECK(c.padded(10) == 12);

  // A reduce-scatter of 12 gradient elements into a shard of 3, the sharded gradient kept on issue.
  const Op r = dp_reduce_scatter_op(c, 1, 0, 12, 12, 10, 12 * 4, MemEvent{MemoryCategory::ShardedGrads, 12});
  CHECK(r.kind == OpKind::ReduceScatter);
  CHECK(r.group == GroupKind::Shard);
  CHECK(r.comm_bytes == 48);
  CHECK(r.comm_dtype == WireType::Fp32);
  REQUIRE(r.on_issue.count == 2);
  CHECK(r.on_issue.items[1].category == MemoryCategory::ShardedGrads);
  CHECK(r.on_complete.items[0].bytes == -(48 + 12));

  // Over a backend without low-precision collectives a bf16 all-reduce travels as fp32.
  Strategy bf = s;
  bf.reduce_dtype = DType::Bf16;
  c.s = &bf;
  c.rb = 2;
  c.wire.fp32_only = true;
  const Op a = dp_replica_all_reduce_op(c, 2, 0, 5);
  CHECK(a.group == GroupKind::Replica);
  CHECK(a.comm_dtype == WireType::Bf16);  // a group of one (no replicas here) communicates nothing: no staging
  lay.replicas = 2;
  const Op staged = dp_replica_all_reduce_op(c, 2, 0, 5);
  CHECK(staged.comm_dtype == WireType::Fp32);
  CHECK(staged.comm_bytes == 20);
}

TEST_CASE("data parallel: ZeRO-1/2 gather the updated parameters after the step, per unit where the runtime does") {
  const Strategy s = strategy(StrategyKind::Zero1);
  for (const char* name : {"pytorch", "fsdp-run"}) {
    const RuntimeProfile rt = test::runtime(name);
    const DataParallelPlan plan = data_parallel_plan(s, rt, 8);
    StepLayout lay;
    lay.world = 8;
    lay.shard_size = 8;
    DataParallelContext c = context(s, rt, plan, lay);
    c.sb = 4;
    const std::vector<Op> ops = dp_step_param_gathers(c, {100, 200, 300}, 600, 7);
    INFO(name);
    CHECK(ops.size() == (rt.zero_param_gather_per_unit ? 3u : 1u));
    CHECK(ops.front().kind == OpKind::ParamAllGather);
    CHECK(ops.front().deps.items[0] == 7);
    CHECK(ops.front().comm_bytes == (rt.zero_param_gather_per_unit ? 400 : 2400));
  }
}
