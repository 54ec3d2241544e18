// Step time on a CPU "device" (docs/hardware.md, "Ranks sharing a CPU's cores" and "Host overhead"): one
// in-order resource per rank, compute slowed when ranks get fewer cores than the profile was measured with,
// and the eager runtime's per-pass host overhead.
#include <doctest/doctest.h>

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
  // The same profile as a GPU overlaps collectives with compute (prefetch): faster than serial.
  HardwareProfile gpu = cpu;
  gpu.device_kind = "cuda";
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
  // Collectives too: Gloo's thread shares the rank's cores (4-rank group priced by the same model, x2).
  for (std::size_t i = 0; i < four.ops.size(); ++i) {
    const Op& op = four.ops[i];
    if (op.collective == CollectiveKind::None || op.comm_bytes <= 0) continue;
    HardwareProfile one = hw;
    one.device_cores = 0.5;  // as if measured with 4 ranks: no slowdown
    CHECK(op_duration(op, four, hw, Cluster{1, 4}, s) ==
          doctest::Approx(2.0 * op_duration(op, four, one, Cluster{1, 4}, s)));
  }
}

TEST_CASE("host overhead: per decoder layer pass, the recomputed forward, and the head around the loss") {
  ModuleGraph g(small_model());
  RuntimeProfile rt = runtime("fsdp-run");
  const Cluster c{1, 1};
  HardwareProfile base = hardware("cpu");
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
