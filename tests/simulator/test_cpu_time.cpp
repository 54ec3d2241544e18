// Step time on a CPU "device" (docs/hardware.md, "Ranks sharing a CPU's cores" and "Host overhead"): one
// in-order resource per rank, compute slowed when ranks get fewer cores than the profile was measured with,
// the eager runtime's per-pass host overhead, elementwise rates per dtype, and the training loop's own work.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "compute/compute_cost.hpp"
#include "sim_fixtures.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

ModelSpec small_model() { return load_model(root() + "/tests/data/models/acc-small.yaml", root()); }

Strategy fsdp_strategy(DType dtype, ActCkpt ckpt) {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.wrap.kind = WrapKind::Layer;
  s.param_dtype = dtype;
  s.reduce_dtype = DType::Fp32;
  s.act_ckpt = ckpt;
  s.micro_batch = 2;
  s.seq_len = 64;
  s.attention = AttentionImpl::Eager;
  return s;
}

double serial_sum(const StepProgram& prog, const HardwareProfile& hw, const Cluster& c, const Strategy& s) {
  double t = 0;
  for (const Op& op : prog.ops) t += op_duration(op, prog, hw, c, s);
  return t;
}

}  // namespace

TEST_CASE("a CPU rank runs its compute, collectives and copies one after another") {
  ModuleGraph g(small_model());
  RuntimeProfile rt = runtime("fsdp-run");
  const Strategy s = fsdp_strategy(DType::Fp32, ActCkpt::None);
  const Cluster c{1, 2};
  HardwareProfile cpu = hardware("cpu");
  StepProgram prog;
  Prediction p = simulate(SimulationInput{&g, &cpu, &rt, c, s}, &prog);
  REQUIRE(p.time.comm_s > 0);
  // Nothing overlaps: the step is the sum of every op's duration, and all communication is exposed.
  CHECK(p.time.step_s == doctest::Approx(serial_sum(prog, cpu, c, s)));
  CHECK(p.time.exposed_comm_s == doctest::Approx(p.time.comm_s));
  CHECK(p.time.contention_s == 0);
  // The same profile as a GPU with NCCL overlaps collectives with compute (prefetch): faster than serial.
  HardwareProfile gpu = cpu;
  gpu.device_kind = "cuda";
  gpu.backend = load_backend("nccl", root());
  gpu.device_cores = 0;
  gpu.compute_slowdown_during_comm = 0;
  StepProgram gprog;
  Prediction gp = simulate(SimulationInput{&g, &gpu, &rt, c, s}, &gprog);
  CHECK(gp.time.step_s < serial_sum(gprog, gpu, c, s) - 1e-9);
}

TEST_CASE("ranks beyond the cores the profile was measured with slow every op of the rank") {
  ModuleGraph g(small_model());
  RuntimeProfile rt = runtime("fsdp-run");
  const Strategy s = fsdp_strategy(DType::Fp32, ActCkpt::None);
  HardwareProfile hw = hardware("cpu");
  hw.device_cores = 1;  // measured with one core per rank (2 ranks on the 2 cores)
  const StepProgram two = program(g, s, rt, 1, 2), four = program(g, s, rt, 1, 4);
  REQUIRE(two.ops.size() == four.ops.size());
  int compared = 0;
  for (std::size_t i = 0; i < two.ops.size(); ++i) {
    const Op& op = four.ops[i];
    if (op.kind != OpKind::Forward || op.layers == 0) continue;
    // Same per-rank work (layers' GEMMs do not depend on the world size); 4 ranks on 2 cores: half a core each.
    CHECK(op_duration(op, four, hw, Cluster{1, 4}, s) ==
          doctest::Approx(2.0 * op_duration(two.ops[i], two, hw, Cluster{1, 2}, s)));
    ++compared;
  }
  CHECK(compared == 4);
  // Collectives: their transfer too (the transport's thread copies on the rank's cores), not their latency
  // (every rank waits in the collective; nothing else competes for the cores).
  int collectives = 0;
  for (std::size_t i = 0; i < four.ops.size(); ++i) {
    const Op& op = four.ops[i];
    if (op.collective == CollectiveKind::None || op.comm_bytes <= 0) continue;
    HardwareProfile one = hw;
    one.device_cores = 0.5;  // as if measured with 4 ranks: no slowdown
    const CommGroup g =
        contiguous_group(hw, 4, op.group == GroupKind::World ? 4 : static_cast<int>(four.layout.shard_size));
    const CollectiveCost cc =
        collective_cost(hw,
                        op.collective == CollectiveKind::AllGather       ? CollectiveKind::AllGather
                        : op.collective == CollectiveKind::ReduceScatter ? CollectiveKind::ReduceScatter
                                                                         : CollectiveKind::AllReduce,
                        Bytes(op.comm_bytes), g);
    REQUIRE(cc.transfer.value > 0);
    CHECK(op_duration(op, four, hw, Cluster{1, 4}, s) - op_duration(op, four, one, Cluster{1, 4}, s) ==
          doctest::Approx(hw.in_step_factor(4, s.param_dtype) * cc.transfer.value));
    ++collectives;
  }
  CHECK(collectives > 0);
}

TEST_CASE("host overhead: per decoder layer pass, the recomputed forward, and the head around the loss") {
  ModuleGraph g(small_model());
  RuntimeProfile rt = runtime("fsdp-run");
  const Cluster c{1, 1};
  HardwareProfile base = hardware("cpu");
  // The shipped cpu.yaml carries calibrate's host overheads: the step is compared against none at all.
  base.host_overhead_fp32 = base.host_overhead_bf16 = HostOverhead{};
  HardwareProfile hw = base;
  hw.host_overhead_fp32 = HostOverhead{Seconds(200e-6), Seconds(300e-6), Seconds(40e-6), Seconds(90e-6)};
  hw.host_overhead_bf16 = HostOverhead{Seconds(250e-6), Seconds(350e-6), Seconds(50e-6), Seconds(120e-6)};
  const double layers = static_cast<double>(g.spec().num_layers);
  for (DType dt : {DType::Fp32, DType::Bf16}) {
    for (ActCkpt ckpt : {ActCkpt::None, ActCkpt::Full}) {
      const Strategy s = fsdp_strategy(dt, ckpt);
      const HostOverhead& ho = hw.host_overhead(dt);
      const double with = simulate(SimulationInput{&g, &hw, &rt, c, s}).time.step_s;
      const double without = simulate(SimulationInput{&g, &base, &rt, c, s}).time.step_s;
      // One rank: every op is serial, so the step grows by exactly the overhead of its passes.
      const double recompute = ckpt == ActCkpt::Full ? ho.layer_forward.value : 0.0;
      const double expected = layers * (ho.layer_forward.value + ho.layer_backward.value + recompute) +
                              ho.head_forward.value + ho.head_backward.value;
      CAPTURE(static_cast<int>(dt));
      CAPTURE(static_cast<int>(ckpt));
      CHECK(with - without == doctest::Approx(expected).epsilon(1e-6));
    }
  }
}

namespace {

std::vector<const Op*> ops_of(const StepProgram& p, OpKind k) {
  std::vector<const Op*> out;
  for (const Op& op : p.ops)
    if (op.kind == k) out.push_back(&op);
  return out;
}

}  // namespace

TEST_CASE("the training loop around the step: gradient norm, its all-reduce, the optimizer and the loss all-reduce") {
  ModuleGraph g(small_model());
  const RuntimeProfile fr = runtime("fsdp-run"), pt = runtime("pytorch");
  const double P = static_cast<double>(g.total_params());
  // fsdp-run, FSDP over 2 ranks: every rank owns half of the gradients and of the optimizer.
  {
    const Strategy s = fsdp_strategy(DType::Bf16, ActCkpt::None);
    const StepProgram p = program(g, s, fr, 1, 2);
    const auto norm = ops_of(p, OpKind::GradNorm), scalar = ops_of(p, OpKind::ScalarAllReduce),
               opt = ops_of(p, OpKind::OptimizerStep);
    REQUIRE(norm.size() == 1);
    REQUIRE(scalar.size() == 2);
    REQUIRE(opt.size() == 1);
    const double owned = std::ceil(P / 2);
    CHECK(norm[0]->elementwise_bytes ==
          doctest::Approx(owned * (fr.grad_norm_bytes_per_grad + fr.grad_pass_bytes_per_grad)));
    CHECK(norm[0]->after_all_comm);
    CHECK(opt[0]->elementwise_bytes == doctest::Approx(owned * fr.adamw_bytes_per_param));
    // The partial norms summed over the shard group before the step, which waits for them; the loss last.
    CHECK(scalar[0]->phase == Phase::GradientNormAllReduce);
    CHECK(scalar[0]->group == GroupKind::Shard);
    CHECK(scalar[0]->comm_bytes == 8);
    CHECK(scalar[0] < opt[0]);
    CHECK(std::find(opt[0]->deps.begin(), opt[0]->deps.end(), static_cast<int>(scalar[0] - p.ops.data())) !=
          opt[0]->deps.end());
    CHECK(scalar[1]->phase == Phase::LossAllReduce);
    CHECK(scalar[1]->group == GroupKind::Mesh);  // every rank of the mesh (here the data-parallel world)
    CHECK(scalar[1] == &p.ops.back());
    // On a CPU rank everything is serial: the optimizer phase is the sum of the ops from the norm on.
    HardwareProfile cpu = hardware("cpu");
    const Cluster c{1, 2};
    const Prediction pr = simulate(SimulationInput{&g, &cpu, &fr, c, s});
    double tail = 0;
    for (const Op* op = norm[0]; op <= &p.ops.back(); ++op) tail += op_duration(*op, p, cpu, c, s);
    CHECK(pr.time.optimizer_phase_s == doctest::Approx(tail));
    CHECK(pr.time.optimizer_phase_s < pr.time.step_s);
  }
  // DDP replicates the optimizer: the norm needs no all-reduce; the loss is still summed over the world.
  {
    Strategy s = fsdp_strategy(DType::Fp32, ActCkpt::None);
    s.kind = StrategyKind::Ddp;
    const StepProgram p = program(g, s, fr, 1, 2);
    REQUIRE(ops_of(p, OpKind::GradNorm).size() == 1);
    CHECK(ops_of(p, OpKind::GradNorm)[0]->elementwise_bytes ==
          doctest::Approx(P * (fr.grad_norm_bytes_per_grad + fr.grad_pass_bytes_per_grad)));
    REQUIRE(ops_of(p, OpKind::ScalarAllReduce).size() == 1);
    CHECK(ops_of(p, OpKind::ScalarAllReduce)[0]->phase == Phase::LossAllReduce);
    // One rank: nothing to sum.
    CHECK(ops_of(program(g, s, fr, 1, 1), OpKind::ScalarAllReduce).empty());
  }
  // PyTorch's loop (../shared/calibration): no clipping, no loss all-reduce; foreach AdamW's 84 B.
  {
    const Strategy s = fsdp_strategy(DType::Bf16, ActCkpt::None);
    const StepProgram p = program(g, s, pt, 1, 2);
    CHECK(ops_of(p, OpKind::GradNorm).empty());
    CHECK(ops_of(p, OpKind::ScalarAllReduce).empty());
    REQUIRE(ops_of(p, OpKind::OptimizerStep).size() == 1);
    CHECK(ops_of(p, OpKind::OptimizerStep)[0]->elementwise_bytes == doctest::Approx(std::ceil(P / 2) * 84.0));
  }
}

TEST_CASE("elementwise traffic is priced at the dtype's calibrated rate; the optimizer side at the master dtype's") {
  ModuleGraph g(small_model());
  const RuntimeProfile rt = runtime("fsdp-run");
  const Strategy s = fsdp_strategy(DType::Bf16, ActCkpt::None);
  const Cluster c{1, 1};
  HardwareProfile hw = hardware("cpu");
  const StepProgram p = program(g, s, rt, 1, 1);
  const Op* fwd = nullptr;
  const Op* opt = nullptr;
  for (const Op& op : p.ops) {
    if (op.kind == OpKind::Forward && op.layers > 0 && !fwd) fwd = &op;
    if (op.kind == OpKind::OptimizerStep) opt = &op;
  }
  REQUIRE(fwd);
  REQUIRE(opt);
  const double f0 = op_duration(*fwd, p, hw, c, s), o0 = op_duration(*opt, p, hw, c, s);
  // A bf16 rate slows the layer's elementwise kernels by exactly their bytes at the new rate less their bytes at
  // the profile's (cpu.yaml has calibrate's per-dtype rates); the fp32 optimizer does not move.
  HardwareProfile slow = hw;
  slow.elementwise_bandwidth_bf16 = BytesPerSecond(hw.memory_bandwidth.value / 4);
  const double share = cpu_compute_slowdown(hw, 1);
  CHECK(op_duration(*fwd, p, slow, c, s) - f0 ==
        doctest::Approx(share * fwd->elementwise_bytes *
                        (4.0 / hw.memory_bandwidth.value - 1.0 / hw.elementwise_bandwidth(DType::Bf16).value)));
  CHECK(op_duration(*opt, p, slow, c, s) == doctest::Approx(o0));
  slow.elementwise_bandwidth_fp32 = BytesPerSecond(hw.memory_bandwidth.value / 2);
  CHECK(op_duration(*opt, p, slow, c, s) - o0 ==
        doctest::Approx(share * opt->elementwise_bytes *
                        (2.0 / hw.memory_bandwidth.value - 1.0 / hw.elementwise_bandwidth(DType::Fp32).value)));
}

TEST_CASE(
    "collectives cost in_step_factor times their isolated price (its shared-cores one when ranks outnumber "
    "the cores; fp32 plans their own); nothing else does") {
  ModuleGraph g(small_model());
  const RuntimeProfile rt = runtime("fsdp-run");
  HardwareProfile hw = hardware("cpu");
  REQUIRE(hw.cpu_cores == 2);
  hw.collective_in_step_factor = 1.0;  // isolated prices (cpu.yaml carries measured in-step factors)
  hw.collective_in_step_factor_shared_cores = std::nullopt;
  hw.collective_in_step_factor_fp32 = std::nullopt;
  hw.collective_in_step_factor_shared_cores_fp32 = std::nullopt;
  HardwareProfile in_step = hw;
  in_step.collective_in_step_factor = 1.4;
  in_step.collective_in_step_factor_shared_cores = 0.7;
  in_step.collective_in_step_factor_fp32 = 2.1;
  in_step.collective_in_step_factor_shared_cores_fp32 = 1.3;
  for (auto [ranks, dt] :
       {std::pair{2, DType::Bf16}, std::pair{4, DType::Bf16}, std::pair{2, DType::Fp32}, std::pair{4, DType::Fp32}}) {
    INFO(ranks << " ranks on 2 cores, " << to_string(dt));
    const Strategy s = fsdp_strategy(dt, ActCkpt::None);
    const Cluster c{1, ranks};
    const double factor = dt == DType::Fp32 ? (ranks == 2 ? 2.1 : 1.3) : (ranks == 2 ? 1.4 : 0.7);
    const StepProgram p = program(g, s, rt, 1, ranks);
    int collectives = 0;
    for (const Op& op : p.ops) {
      const double a = op_duration(op, p, hw, c, s), b = op_duration(op, p, in_step, c, s);
      if (op.collective != CollectiveKind::None && op.comm_bytes > 0) {
        CHECK(b == doctest::Approx(factor * a));
        ++collectives;
      } else {
        CHECK(b == doctest::Approx(a));
      }
    }
    CHECK(collectives > 0);
  }
}

namespace {

// One rank of acc-small under fsdp-run on the shipped cpu profile (`base`), and a copy of it to change (`hw`).
struct OneRank {
  ModuleGraph g{small_model()};
  RuntimeProfile rt = runtime("fsdp-run");
  Cluster c{1, 1};
  HardwareProfile base = hardware("cpu");
  HardwareProfile hw = base;
};

}  // namespace

TEST_CASE("the forward GEMM's ratio: forward passes at r, backward gradients at (3 - r) / 2, recompute at r") {
  OneRank one;
  const ModuleGraph& g = one.g;
  const Cluster c = one.c;
  const HardwareProfile& hw = one.base;
  HardwareProfile& fr = one.hw;
  fr.matmul_forward_ratio_fp32 = 1.5;
  const RuntimeProfile& rt = one.rt;
  for (ActCkpt ckpt : {ActCkpt::None, ActCkpt::Full}) {
    const Strategy s = fsdp_strategy(DType::Fp32, ckpt);
    const StepProgram p = program(g, s, rt, 1, 1);
    // The GEMM time of the layers an op computes, each with its own shapes.
    auto layer_gemms_of = [&](const Op& op) {
      double t = 0;
      for (int64_t l = op.first_layer; l >= 0 && l <= op.last_layer; ++l)
        for (const GemmShape& gs : p.layer_shapes[static_cast<size_t>(p.layer_shape_of[static_cast<size_t>(l)])].gemms)
          t += matmul_time(hw, gs.m, gs.n, gs.k, DType::Fp32).value;
      return t;
    };
    const double head = matmul_time(hw, p.head_gemm.m, p.head_gemm.n, p.head_gemm.k, DType::Fp32).value;
    // cpu.yaml's own fp32 ratio (calibrate's, 1.013 with OpenBLAS) is r0: moving it to 1.5 adds (1.5 - r0) of a
    // GEMM's mean time to each forward GEMM and takes (1.5 - r0) / 2 from each of the two gradient GEMMs.
    const double dr = 1.5 - hw.matmul_forward_ratio(DType::Fp32);
    int checked = 0;
    for (const Op& op : p.ops) {
      const double d = op_duration(op, p, fr, c, s) - op_duration(op, p, hw, c, s);
      if (op.kind == OpKind::Forward && op.layers > 0) {
        CHECK(d == doctest::Approx(dr * layer_gemms_of(op)));
        ++checked;
      }
      if (op.kind == OpKind::Backward && op.layers > 0) {
        // Two gradient passes at -dr / 2 each (-dr together), plus +dr for a recomputed forward.
        CHECK(d == doctest::Approx((ckpt == ActCkpt::Full ? 0.0 : -dr) * layer_gemms_of(op)));
        ++checked;
      }
      if (op.kind == OpKind::Loss) CHECK(d == doctest::Approx(dr * head));
      if (op.kind == OpKind::LossBackward) CHECK(d == doctest::Approx(-dr * head));
    }
    CHECK(checked == 8);
  }
  CHECK(hw.matmul_forward_ratio(DType::Fp16) == 1.0);  // absent (cpu.yaml has fp32 and bf16): the three GEMMs alike
  CHECK(fr.matmul_forward_ratio(DType::Bf16) == hw.matmul_forward_ratio(DType::Bf16));  // fp32's ratio is fp32's alone
}

TEST_CASE("the runtime's per-unit machinery is charged once per unit and micro-batch, with its backward") {
  OneRank one;
  const ModuleGraph& g = one.g;
  const RuntimeProfile& rt = one.rt;
  const Cluster c = one.c;
  const HardwareProfile& base = one.base;
  HardwareProfile& hw = one.hw;
  hw.host_overhead_bf16.unit = Seconds(500e-6);
  // cpu.yaml's own bf16 unit time (calibrate's) is what 500 us replaces.
  const double du = 500e-6 - base.host_overhead(DType::Bf16).unit.value;
  for (int64_t accum : {1, 2}) {
    Strategy s = fsdp_strategy(DType::Bf16, ActCkpt::None);
    s.grad_accum = accum;
    StepProgram prog;
    const double with = simulate(SimulationInput{&g, &hw, &rt, c, s}, &prog).time.step_s;
    const double without = simulate(SimulationInput{&g, &base, &rt, c, s}).time.step_s;
    CAPTURE(accum);
    CHECK(with - without == doctest::Approx(du * static_cast<double>(prog.units.size() * accum)));
    // fp32's unit entry is not touched: nothing changes.
    const Strategy f = fsdp_strategy(DType::Fp32, ActCkpt::None);
    CHECK(simulate(SimulationInput{&g, &hw, &rt, c, f}).time.step_s ==
          doctest::Approx(simulate(SimulationInput{&g, &base, &rt, c, f}).time.step_s));
  }
}

TEST_CASE("without low-precision collectives (Gloo) bf16 data goes over the wire, and is priced, as fp32") {
  ModuleGraph g(small_model());
  const RuntimeProfile rt = runtime("fsdp-run");
  auto bytes_of = [&](const Strategy& s, bool fp32_only) {
    ProgramInput in;
    in.graph = &g;
    in.cluster = Cluster{1, 2};
    in.strategy = s;
    in.runtime = &rt;
    in.fp32_collectives_only = fp32_only;
    const StepProgram p = emit_step_program(in);
    std::vector<std::pair<OpKind, double>> out;
    for (const Op& op : p.ops)
      if (op.collective != CollectiveKind::None) out.emplace_back(op.kind, op.comm_bytes);
    return out;
  };
  // FSDP in bf16, reduced in bf16: the all-gathers send the fp32 master shard, the reduce-scatters stage in fp32.
  Strategy s = fsdp_strategy(DType::Bf16, ActCkpt::None);
  s.reduce_dtype = DType::Bf16;
  const auto nccl = bytes_of(s, false), gloo = bytes_of(s, true);
  REQUIRE(nccl.size() == gloo.size());
  int doubled = 0;
  for (std::size_t i = 0; i < nccl.size(); ++i) {
    CAPTURE(i);
    CHECK(nccl[i].first == gloo[i].first);
    if (nccl[i].first == OpKind::ScalarAllReduce) {
      CHECK(gloo[i].second == nccl[i].second);  // the fp64 norm and the fp32 loss are sent as they are
    } else {
      CHECK(gloo[i].second == doctest::Approx(2 * nccl[i].second));
      ++doubled;
    }
  }
  CHECK(doubled > 0);
  // fp32 data is sent as it is on either backend.
  const Strategy f = fsdp_strategy(DType::Fp32, ActCkpt::None);
  const auto nccl32 = bytes_of(f, false), gloo32 = bytes_of(f, true);
  REQUIRE(nccl32.size() == gloo32.size());
  for (std::size_t i = 0; i < nccl32.size(); ++i) CHECK(gloo32[i].second == nccl32[i].second);
  // DDP's bucket of bf16 gradients: all-reduced as fp32.
  Strategy d = s;
  d.kind = StrategyKind::Ddp;
  const auto dn = bytes_of(d, false), dg = bytes_of(d, true);
  REQUIRE(dn.size() == dg.size());
  REQUIRE(dn[0].first == OpKind::AllReduce);
  CHECK(dg[0].second == doctest::Approx(2 * dn[0].second));
}

TEST_CASE("the step's temporaries: fsdp-run's unit-by-unit norm and AdamW against torch.optim's foreach AdamW") {
  ModuleGraph g(small_model());
  const RuntimeProfile fr = runtime("fsdp-run"), pt = runtime("pytorch");
  const double P = static_cast<double>(g.total_params());
  // acc-small's largest wrap unit is the root (embedding + head + final norm), as fsdp-run wraps it.
  const ModelSpec& m = g.spec();
  const double root = 2.0 * static_cast<double>(m.vocab_size * m.hidden_size) + static_cast<double>(m.hidden_size);
  for (StrategyKind k : {StrategyKind::Ddp, StrategyKind::Zero1, StrategyKind::Fsdp}) {
    CAPTURE(to_string(k));
    Strategy s = fsdp_strategy(DType::Fp32, ActCkpt::Full);
    s.kind = k;
    const int ranks = 2;
    const bool sharded_opt = k != StrategyKind::Ddp;
    const double owned_root = sharded_opt ? std::ceil(root / ranks) : root;
    const double owned_all = sharded_opt ? std::ceil(P / ranks) : P;
    const StepProgram a = program(g, s, fr, 1, ranks);
    const auto norm = ops_of(a, OpKind::GradNorm), opt = ops_of(a, OpKind::OptimizerStep);
    REQUIRE(norm.size() == 1);
    REQUIRE(opt.size() == 1);
    // clip_grad_norm: the fp64 copy of the root's owned gradient and its square; adamw_update: sqrt(v) and its
    // quotient (fp32) of the root's owned parameters.
    CHECK(norm[0]->transient_bytes == doctest::Approx(16.0 * owned_root));
    CHECK(opt[0]->transient_bytes == doctest::Approx(2.0 * 4.0 * owned_root));
    // torch.optim's foreach AdamW: one fp32 list over everything the rank updates; clip_grad_norm_ keeps scalars.
    const StepProgram b = program(g, s, pt, 1, ranks);
    CHECK(ops_of(b, OpKind::GradNorm).empty());  // the calibration loop clips nothing (pytorch.yaml)
    CHECK(ops_of(b, OpKind::OptimizerStep)[0]->transient_bytes == doctest::Approx(4.0 * owned_all));
  }
}

TEST_CASE("Gloo's gather buffer: the bound counts it until its consumer waits, the floor only while it gathers") {
  ModuleGraph g(small_model());
  const RuntimeProfile rt = runtime("fsdp-run");
  HardwareProfile cpu = hardware("cpu");
  const Cluster c{1, 2};
  for (DType dt : {DType::Fp32, DType::Bf16}) {
    for (ActCkpt ck : {ActCkpt::None, ActCkpt::Full}) {
      CAPTURE(static_cast<int>(dt));
      CAPTURE(static_cast<int>(ck));
      Strategy s = fsdp_strategy(dt, ck);
      s.reshard_after_forward = true;
      StepProgram prog;
      const Prediction p = simulate(SimulationInput{&g, &cpu, &rt, c, s}, &prog);
      double largest = 0, layer = 0;
      for (const Op& op : prog.ops) {
        if (op.kind != OpKind::Gather) continue;
        CHECK(op.backend_buffer_bytes > 0);  // every Gloo gather has its flat fp32 output
        largest = std::max(largest, op.backend_buffer_bytes);
        if (op.phase == Phase::BwdAllGather) layer = op.backend_buffer_bytes;
      }
      REQUIRE(layer > 0);
      StepProgram bare = prog;
      for (Op& op : bare.ops) op.backend_buffer_bytes = 0;
      const double none = walk_memory(bare, rt, 2, false).peak_allocated;
      const double floor = p.memory.peak_allocated_floor, bound = p.memory.peak_allocated;
      // The floor still counts each buffer while its gather runs; the bound at most one more buffer than the floor.
      CHECK(none <= floor);
      CHECK(floor < bound);
      CHECK(bound - floor <= largest);
      // A full-checkpoint backward peaks after its recompute with the next layer's gather in flight: the bound
      // holds that layer's whole buffer, the floor none of it.
      if (ck == ActCkpt::Full) CHECK(bound - floor == doctest::Approx(layer));
    }
  }
  // A CUDA program has no backend buffer: one peak.
  HardwareProfile h100 = hardware("h100-80gb");
  const Prediction gpu = simulate(SimulationInput{&g, &h100, &rt, c, fsdp_strategy(DType::Bf16, ActCkpt::None)});
  CHECK(gpu.memory.peak_allocated_floor == gpu.memory.peak_allocated);
}
