// Google Benchmarks: simulate() configurations per second for llama3-70b, the timeline of one
// step on 64 GPUs, and the planner's whole search (issue M1/M2/M3 speed requirements).
#include <benchmark/benchmark.h>

#include "model/model_loader.hpp"
#include "search/allocator_tuning.hpp"
#include "search/plan_search.hpp"
#include "simulate.hpp"

namespace {

struct Fixture {
  fsdp::ModelSpec spec = fsdp::load_model("llama3-70b", FSDP_SOURCE_ROOT);
  fsdp::ModuleGraph graph{spec};
  fsdp::HardwareProfile hw = fsdp::load_hardware("a100-80gb", FSDP_SOURCE_ROOT);
  fsdp::RuntimeProfile rt = fsdp::load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// One llama3-70b FSDP plan on 64 GPUs (full checkpointing, micro-batch 1 x 16) on the given mesh: simulate() per
// second.
void simulate_70b(benchmark::State& state, int64_t tp, int64_t pp) {
  Fixture& f = fixture();
  fsdp::Strategy s;
  s.kind = fsdp::StrategyKind::Fsdp;
  s.act_ckpt = fsdp::ActCkpt::Full;
  s.micro_batch = 1;
  s.grad_accum = 16;
  s.mesh.tp = tp;
  s.mesh.pp = pp;
  fsdp::SimulationInput in{&f.graph, &f.hw, &f.rt, fsdp::Cluster{8, 8}, s};
  for (auto _ : state) benchmark::DoNotOptimize(fsdp::simulate(in));
  state.counters["configs_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_SimulateLlama3_70b_64Gpus(benchmark::State& state) { simulate_70b(state, 1, 1); }
BENCHMARK(BM_SimulateLlama3_70b_64Gpus)->Unit(benchmark::kMicrosecond);

void BM_TimelineLlama3_70b_64Gpus(benchmark::State& state) {
  Fixture& f = fixture();
  fsdp::Strategy s;
  s.kind = fsdp::StrategyKind::Fsdp;
  s.grad_accum = 16;
  fsdp::ProgramInput pi{&f.graph, fsdp::Cluster{8, 8}, s, &f.rt};
  fsdp::StepProgram prog = fsdp::emit_step_program(pi);
  for (auto _ : state) benchmark::DoNotOptimize(fsdp::run_timeline(prog, f.hw, fsdp::Cluster{8, 8}, s));
  state.counters["steps_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TimelineLlama3_70b_64Gpus)->Unit(benchmark::kMicrosecond);

// The whole search of `graph` on `cluster`, fsdp-plan's default global batch; evaluated configurations per second.
void search(benchmark::State& state, const fsdp::ModuleGraph& graph, const fsdp::HardwareProfile& hw,
            fsdp::Cluster cluster) {
  fsdp::SearchRequest req;
  req.graph = &graph;
  req.hardware = &hw;
  req.runtime = &fixture().rt;
  req.cluster = cluster;
  req.global_batch_tokens = 4194304;
  int64_t evaluated = 0;
  for (auto _ : state) evaluated += fsdp::search_plans(req).evaluated;
  state.counters["configs_per_s"] = benchmark::Counter(static_cast<double>(evaluated), benchmark::Counter::kIsRate);
}

void BM_SearchLlama3_70b_8Nodes(benchmark::State& state) {
  search(state, fixture().graph, fixture().hw, fsdp::Cluster{8, 8});
}
BENCHMARK(BM_SearchLlama3_70b_8Nodes)->Unit(benchmark::kMillisecond);

// The whole mesh search (tp x pp x every data-parallel knob) of Llama 3.1 405B on 128 nodes of H100, the README's
// "Tensor and pipeline parallelism" figure (issue M15: under 1 s on the 2-core build machine).
void BM_SearchLlama31_405b_128NodesH100(benchmark::State& state) {
  static const fsdp::ModuleGraph graph{fsdp::load_model("llama3.1-405b", FSDP_SOURCE_ROOT)};
  static const fsdp::HardwareProfile hw = fsdp::load_hardware("h100-80gb", FSDP_SOURCE_ROOT);
  search(state, graph, hw, fsdp::Cluster{128, 8});
}
BENCHMARK(BM_SearchLlama31_405b_128NodesH100)->Unit(benchmark::kMillisecond);

// One FSDP + TP 8 + PP 2 (1F1B) configuration of llama3-70b on 64 GPUs: two stage programs, their memory walks and
// timelines.
void BM_SimulateLlama3_70b_64Gpus_Tp8Pp2(benchmark::State& state) { simulate_70b(state, 8, 2); }
BENCHMARK(BM_SimulateLlama3_70b_64Gpus_Tp8Pp2)->Unit(benchmark::kMicrosecond);

}  // namespace

// fsdp-plan's main keeps freed memory for reuse (search/allocator_tuning.hpp); the benchmarks run as it does.
int main(int argc, char** argv) {
  fsdp::keep_freed_memory_for_reuse();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
