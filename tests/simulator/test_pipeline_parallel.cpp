// Pipeline parallelism (simulator/program/pipeline_parallel.hpp): the stages' layers, the micro-batches in flight
// per schedule, the bubble, the send-recv between stages, and a whole simulation's view of them.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memory/memory_walk.hpp"
#include "model/model_loader.hpp"
#include "program/pipeline_parallel.hpp"
#include "simulate.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;

namespace {

MeshSpec pipeline(int64_t pp, PipelineSchedule sched, int64_t v = 1) {
  MeshSpec m;
  m.pp = pp;
  m.pp_schedule = sched;
  m.pp_virtual_stages = v;
  return m;
}

struct Setup {
  ModuleGraph graph{load_model("llama3-8b", FSDP_SOURCE_ROOT)};
  HardwareProfile hw = load_hardware("h100-80gb", FSDP_SOURCE_ROOT);
  RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
};
const Setup& setup() {
  static const Setup s;
  return s;
}

Prediction run(const Strategy& s, int64_t nodes, StepProgram* prog = nullptr) {
  const Setup& st = setup();
  const Cluster c{nodes, 8};
  validate_strategy(s, st.graph.spec(), c);
  return simulate(SimulationInput{&st.graph, &st.hw, &st.rt, c, s}, prog);
}

Strategy fsdp_pp(int64_t pp, PipelineSchedule sched, int64_t accum) {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.act_ckpt = ActCkpt::Full;
  s.seq_len = 4096;
  s.micro_batch = 1;
  s.grad_accum = accum;
  s.mesh.pp = pp;
  s.mesh.pp_schedule = sched;
  return s;
}

}  // namespace

TEST_CASE("pp: layers split into stages as evenly as they go, the first chunks one more") {
  // Llama 3.1 405B's 126 layers over 8 stages: 126 = 8 x 15 + 6, so stages 0-5 hold 16 and 6-7 hold 15.
  CHECK(stage_layers(126, 8, 1, 0).first == 0);
  CHECK(stage_layers(126, 8, 1, 0).count() == 16);
  CHECK(stage_layers(126, 8, 1, 5).count() == 16);
  CHECK(stage_layers(126, 8, 1, 6).first == 96);
  CHECK(stage_layers(126, 8, 1, 7).first == 111);
  CHECK(stage_layers(126, 8, 1, 7).last == 125);
  // Interleaved: 32 layers in 4 x 2 = 8 chunks of 4; each rank holds two chunks.
  CHECK(stage_layers(32, 4, 2, 0).count() == 8);
  CHECK(stage_layers(32, 4, 2, 3).last == 31);
}

TEST_CASE("pp: micro-batches in flight per schedule (Narayanan et al. 2021 sec. 2.2)") {
  // 1F1B: stage i holds p - i micro-batches (at most m); GPipe all m.
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::OneFOneB), 0, 8) == 4);
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::OneFOneB), 3, 8) == 1);
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::OneFOneB), 0, 2) == 2);
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::GPipe), 3, 8) == 8);
  // Interleaved, p = 4, v = 2, rank 0: warm-up (v - 1) p + 2 (p - 1) = 10 chunk forwards, 11 chunks live, each
  // half the rank's layers: 5.5 micro-batches' worth.
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::Interleaved1F1B, 2), 0, 8) == 5.5);
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::Interleaved1F1B, 2), 3, 8) == 2.5);
  CHECK(in_flight_micro_batches(MeshSpec{}, 0, 8) == 1);
}

TEST_CASE("pp: the loss graphs in flight on the loss's stage: as many as micro-batches, one when interleaved") {
  // The interleaved last rank's warm-up ((v - 1) x p chunk forwards) runs its earlier chunks only, so each loss
  // forward is followed by its backward.
  CHECK(in_flight_loss_micro_batches(pipeline(4, PipelineSchedule::GPipe), 3, 8) == 8);
  CHECK(in_flight_loss_micro_batches(pipeline(4, PipelineSchedule::OneFOneB), 3, 8) == 1);
  CHECK(in_flight_loss_micro_batches(pipeline(4, PipelineSchedule::Interleaved1F1B, 2), 3, 8) == 1);
  CHECK(in_flight_micro_batches(pipeline(4, PipelineSchedule::Interleaved1F1B, 2), 3, 8) == 2.5);
  CHECK(in_flight_loss_micro_batches(MeshSpec{}, 0, 8) == 1);
}

TEST_CASE("pp: the bubble is (p - 1) / v micro-batches; v transfers per micro-batch when interleaved") {
  CHECK(pipeline_bubble_s(pipeline(4, PipelineSchedule::OneFOneB), 2.0) == 6.0);
  CHECK(pipeline_bubble_s(pipeline(4, PipelineSchedule::GPipe), 2.0) == 6.0);
  CHECK(pipeline_bubble_s(pipeline(4, PipelineSchedule::Interleaved1F1B, 2), 2.0) == 3.0);
  CHECK(pipeline_bubble_s(MeshSpec{}, 2.0) == 0.0);
  CHECK(pipeline_transfers_per_micro_batch(pipeline(4, PipelineSchedule::Interleaved1F1B, 3)) == 3);
  CHECK(pipeline_transfers_per_micro_batch(pipeline(4, PipelineSchedule::OneFOneB)) == 1);
}

TEST_CASE("pp: the fill and drain over stages of unequal pace: the other stages' micro-batch once each") {
  // Stage times 2, 3, 5, 1 s per micro-batch, stage 2 the slowest: GPipe and 1F1B fill and drain through stages 0, 1
  // and 3 once each, 2 + 3 + 1 = 6 s, not 3 x 5 s of the slowest's pace.
  const std::vector<double> paces = {2.0, 3.0, 5.0, 1.0};
  CHECK(pipeline_fill_drain_s(pipeline(4, PipelineSchedule::OneFOneB), paces, 2) == 6.0);
  CHECK(pipeline_fill_drain_s(pipeline(4, PipelineSchedule::GPipe), paces, 2) == 6.0);
  // Equal stages: Narayanan et al. 2021 sec. 2.2.1's (p - 1) x (t_f + t_b), pipeline_bubble_s.
  const std::vector<double> equal = {2.0, 2.0, 2.0, 2.0};
  CHECK(pipeline_fill_drain_s(pipeline(4, PipelineSchedule::OneFOneB), equal, 0) ==
        pipeline_bubble_s(pipeline(4, PipelineSchedule::OneFOneB), 2.0));
  // Interleaved 1F1B keeps (p - 1) / v of the slowest stage's micro-batch: 3 / 2 x 5 s.
  CHECK(pipeline_fill_drain_s(pipeline(4, PipelineSchedule::Interleaved1F1B, 2), paces, 2) == 7.5);
  CHECK(pipeline_fill_drain_s(MeshSpec{}, {4.0}, 0) == 0.0);
}

TEST_CASE("pp: a simulated step: stages' layers, send-recv on the pipeline group, the bubble in the step time") {
  StepProgram prog;
  const Strategy s = fsdp_pp(4, PipelineSchedule::OneFOneB, 8);
  const Prediction p = run(s, 2, &prog);
  // 16 GPUs, pp 4: 4 data-parallel ranks per stage; the program is one stage's 8 layers.
  CHECK(prog.layout.world == 4);
  CHECK(prog.layout.stage_last_layer - prog.layout.stage_first_layer + 1 == 8);
  int transfers = 0;
  for (const Op& op : prog.ops)
    if (op.stream == Stream::Pipeline) {
      ++transfers;
      CHECK(op.collective == CollectiveKind::SendRecv);
      CHECK(op.group == GroupKind::Pipeline);
      CHECK(op.comm_bytes == 4096.0 * 4096.0 * 2.0);  // one micro-batch's s x h in bf16
    }
  CHECK(transfers == 2 * 3);  // one each way per emitted micro-batch (3 of 8)
  // The bubble: the other three stages' micro-batch once each, at their own paces (pipeline_fill_drain_s); the
  // first stage holds the embedding, the last the head and the loss, the two between 8 layers each.
  const Setup& st = setup();
  const SimulationInput in{&st.graph, &st.hw, &st.rt, Cluster{2, 8}, s};
  std::vector<double> paces;
  double slowest_pace = 0, others = 0;
  for (int64_t stage = 0; stage < 4; ++stage) {
    const TimelineResult t = run_timeline(emit_stage_program(in, stage), st.hw, in.cluster, s);
    CHECK(t.pipeline_micro_batch_s == doctest::Approx((t.step_s - t.pipeline_bubble_s - t.optimizer_phase_s) / 8.0));
    paces.push_back(t.pipeline_micro_batch_s);
    others += t.pipeline_micro_batch_s;
    slowest_pace = std::max(slowest_pace, t.pipeline_micro_batch_s);
  }
  others -= slowest_pace;
  CHECK(p.time.pipeline_bubble_s == doctest::Approx(others));
  // The middle stages are one and the same program; the last (8 layers, head and loss) sets the pace, and the fill
  // and drain is shorter than 3 of its micro-batches.
  CHECK(paces[1] == doctest::Approx(paces[2]));
  CHECK(paces[3] == doctest::Approx(slowest_pace));
  CHECK(p.time.pipeline_bubble_s < 3.0 * slowest_pace);
  const double per_micro_batch = (p.time.step_s - p.time.pipeline_bubble_s - p.time.optimizer_phase_s) / 8.0;
  CHECK(per_micro_batch == doctest::Approx(slowest_pace));
  CHECK(p.time.pp_comm_s > 0);
  // tokens/s per GPU: a replica's tokens over its 4 stages.
  CHECK(p.tokens_per_s_per_gpu == doctest::Approx(4096.0 * 8.0 / 4.0 / p.time.step_s));
  CHECK(p.tokens_per_step == 4096.0 * 8.0 * 4.0);
  CHECK(p.memory.peak_phase.rfind("stage ", 0) == 0);
}

TEST_CASE("pp: GPipe holds every micro-batch's activations, 1F1B at most pp on the first stage") {
  // The first stage's own program (simulate reports the worse of the first and last stages; the last, with the
  // logits, is the worse here).
  const Setup& st = setup();
  auto first_stage_activations = [&](const Strategy& s) {
    ProgramInput in;
    in.graph = &st.graph;
    in.cluster = Cluster{2, 8};
    in.strategy = s;
    in.runtime = &st.rt;
    const StepProgram prog = emit_step_program(in);
    const MemoryResult m = walk_memory(prog, st.rt, 8, true);
    return m.breakdown[static_cast<size_t>(MemoryCategory::Activations)];
  };
  const double one = first_stage_activations(fsdp_pp(4, PipelineSchedule::OneFOneB, 8));
  const double gpipe = first_stage_activations(fsdp_pp(4, PipelineSchedule::GPipe, 8));
  const double single = first_stage_activations(fsdp_pp(4, PipelineSchedule::OneFOneB, 1));
  // Full checkpointing: each micro-batch in flight keeps its 8 layers' inputs and the stage's output, held for its
  // backward (s x h in bf16 each, 32 MiB): GPipe holds 8 micro-batches, 1F1B 4 on stage 0, one alone 1; the peak adds
  // the working set of one layer.
  const double inputs = (8.0 + 1.0) * 4096.0 * 4096.0 * 2.0;
  CHECK(gpipe - one == doctest::Approx(4.0 * inputs).epsilon(0.01));
  CHECK(one - single == doctest::Approx(3.0 * inputs).epsilon(0.01));
}

TEST_CASE("pp: nanotron's compute-cost split, the head counted (Llama 3 8B on 8 stages: 5 4 4 5 4 4 4 2)") {
  // nanotron src/nanotron/models/base.py build_model with LlamaModel.get_block_compute_costs: the printed split of
  // Llama 3 8B over 8 stages is embedding + 5 layers, 4, 4, 5, 4, 4, 4, and 2 layers + final norm, head and loss.
  const ModelSpec& m = setup().graph.spec();
  const int64_t expected[8] = {5, 4, 4, 5, 4, 4, 4, 2};
  int64_t first = 0;
  for (int64_t stage = 0; stage < 8; ++stage) {
    CAPTURE(stage);
    const StageLayers s = stage_layers_by_cost(m, 8, stage, StageClose::Exceeded);
    CHECK(s.first == first);
    CHECK(s.count() == expected[stage]);
    first += s.count();
  }
  CHECK(first == 32);
  // The nanotron runtime profile asks for it; the emitted last stage then holds 2 layers.
  const RuntimeProfile nanotron = load_runtime("nanotron", FSDP_SOURCE_ROOT);
  CHECK(nanotron.pipeline_split_by_cost);
  CHECK_FALSE(setup().rt.pipeline_split_by_cost);
  ProgramInput in;
  in.graph = &setup().graph;
  in.cluster = Cluster{1, 8};
  in.strategy = fsdp_pp(8, PipelineSchedule::OneFOneB, 8);
  in.strategy.kind = StrategyKind::Zero1;
  in.runtime = &nanotron;
  in.pipeline_stage = 7;
  const StepProgram last = emit_step_program(in);
  CHECK(last.layout.stage_first_layer == 30);
  CHECK(last.layout.stage_last_layer == 31);
  // Simulated, every stage is timed: stages 0 and 3 (5 layers) set the pace, and the fill and drain runs through the
  // others at theirs, 4- and 2-layer stages included, so it is well under 7 of the slowest stage's micro-batches.
  const SimulationInput sim{in.graph, &setup().hw, &nanotron, in.cluster, in.strategy};
  validate_strategy(in.strategy, in.graph->spec(), in.cluster);
  const Prediction p = simulate(sim);
  std::vector<double> paces;
  for (int64_t stage = 0; stage < 8; ++stage)
    paces.push_back(
        run_timeline(emit_stage_program(sim, stage), setup().hw, in.cluster, in.strategy).pipeline_micro_batch_s);
  const size_t slowest = static_cast<size_t>(std::max_element(paces.begin(), paces.end()) - paces.begin());
  CHECK((slowest == 0 || slowest == 3));
  double others = 0;
  for (size_t j = 0; j < paces.size(); ++j) others += j == slowest ? 0.0 : paces[j];
  CHECK(p.time.pipeline_bubble_s == doctest::Approx(others));
  // A 4-layer stage runs at about 4/5 of a 5-layer one's pace: the fill and drain is near (5 x 4 + 5 + 2 + head) / 5
  // of the slowest's micro-batch, not 7.
  CHECK(paces[1] == doctest::Approx(paces[2]));
  CHECK(paces[1] < 0.85 * paces[slowest]);
  CHECK(p.time.pipeline_bubble_s < 6.0 * paces[slowest]);
}

namespace {

// The Ultra-Scale Playbook's nanotron 1B (tests/accuracy/published/models): hidden 2048, 16 layers, 32 heads, ffn
// 8192, vocabulary 131072. Its decoder layer costs 4 x 2048^2 + 3 x 8192 x 2048 = 2^26 in nanotron's
// get_block_compute_costs and its lm_head 131072 x 2048 = 2^28: 4 layers, the whole model 20 layers' worth.
struct Nanotron1B {
  ModuleGraph graph{
      load_model(std::string(FSDP_SOURCE_ROOT) + "/tests/accuracy/published/models/nanotron-1b-ultrascale.yaml",
                 FSDP_SOURCE_ROOT)};
  RuntimeProfile rt = load_runtime("nanotron", FSDP_SOURCE_ROOT);
};
const Nanotron1B& nanotron_1b() {
  static const Nanotron1B s;
  return s;
}

// One stage's program of the 1B under nanotron, data parallel 1, one micro-batch of 4096 tokens.
StepProgram nanotron_1b_stage(int64_t pp, int64_t stage) {
  ProgramInput in;
  in.graph = &nanotron_1b().graph;
  in.cluster = Cluster{1, 8};
  in.strategy = fsdp_pp(pp, PipelineSchedule::OneFOneB, 8);
  in.strategy.kind = StrategyKind::Ddp;
  in.strategy.act_ckpt = ActCkpt::None;
  in.runtime = &nanotron_1b().rt;
  in.pipeline_stage = stage;
  return emit_step_program(in);
}

// The bytes of a stage's first point-to-point op of `phase` (0 where it has none).
double pp_bytes(const StepProgram& p, Phase phase) {
  for (const Op& op : p.ops)
    if (op.kind == OpKind::PipelineTransfer && op.phase == phase) return op.comm_bytes;
  return 0.0;
}
const Op* first_op(const StepProgram& p, OpKind kind) {
  for (const Op& op : p.ops)
    if (op.kind == kind) return &op;
  return nullptr;
}

}  // namespace

TEST_CASE("pp: nanotron's split of the playbook's 1B on 8 stages: head on stage 6, fp32 cast and loss alone on 7") {
  // base.py build_model over the blocks embedding, 16 layers, final norm, lm_head, cast_to_fp32, loss (costs 0, 16 x 1,
  // 0, 4, 0, 0 layers' worth; thresholds 2.5, 5, ..., 20): a rank moves on after a block whose cumulative cost is
  // above its threshold, so the layers go 3 3 2 3 2 3 (stage 1 takes layer 5: 5 is not above 5), stage 6 the norm and
  // the head (cumulative 20 > 17.5: the cast moves on), stage 7 the cast and the loss (20 is not above 20).
  const ModelSpec& m = nanotron_1b().graph.spec();
  const CostSplit split = pipeline_split_by_cost(m, 8, StageClose::Exceeded);
  const int64_t expected[8] = {3, 3, 2, 3, 2, 3, 0, 0};
  for (int64_t stage = 0; stage < 8; ++stage) {
    CAPTURE(stage);
    CHECK(std::count(split.layer_stage.begin(), split.layer_stage.end(), stage) == expected[stage]);
    CHECK(stage_layers_by_cost(m, 8, stage, StageClose::Exceeded).count() == expected[stage]);
  }
  CHECK(split.norm_stage == 6);
  CHECK(split.head_stage == 6);
  CHECK(split.cast_stage == 7);
  CHECK(split.loss_stage == 7);
  const PipelineTail tail = pipeline_tail(m, 8, true, StageClose::Exceeded);
  CHECK(tail.head_stage == 6);
  CHECK(tail.loss_stage == 7);
  CHECK(tail.split());
  // torchtitan's even split keeps the norm, the head and the loss on the last stage.
  CHECK(pipeline_tail(m, 8, false, StageClose::Reached).head_stage == 7);
  CHECK(pipeline_tail(m, 8, false, StageClose::Reached).loss_stage == 7);

  // The emitted stages (the shipped runtime closes a stage where its threshold is reached: stage 6 also holds layer
  // 15, below): 6 computes the head and sends its bf16 logits, 4096 tokens x 131072 x 2 bytes, receiving their
  // gradient back; 7 receives them, runs the cast and the loss without the head GEMM, and sends the gradient.
  const double logits = 4096.0 * 131072.0 * 2.0;
  const double hidden = 4096.0 * 2048.0 * 2.0;
  const StepProgram head = nanotron_1b_stage(8, 6), loss = nanotron_1b_stage(8, 7);
  CHECK(head.layout.stage_first_layer == 15);
  CHECK(head.layout.stage_last_layer == 15);
  CHECK(pp_bytes(head, Phase::PipelineRecvActivations) == doctest::Approx(hidden));
  CHECK(pp_bytes(head, Phase::PipelineSendActivations) == doctest::Approx(logits));
  CHECK(pp_bytes(head, Phase::PipelineRecvGradients) == doctest::Approx(logits));
  CHECK(pp_bytes(head, Phase::PipelineSendGradients) == doctest::Approx(hidden));
  CHECK(pp_bytes(loss, Phase::PipelineRecvActivations) == doctest::Approx(logits));
  CHECK(pp_bytes(loss, Phase::PipelineSendGradients) == doctest::Approx(logits));
  CHECK(pp_bytes(loss, Phase::PipelineSendActivations) == 0.0);
  const Op* head_fwd = first_op(head, OpKind::Loss);
  const Op* loss_fwd = first_op(loss, OpKind::Loss);
  REQUIRE(head_fwd != nullptr);
  REQUIRE(loss_fwd != nullptr);
  CHECK(head_fwd->head_passes == 1);
  CHECK(head_fwd->elementwise_bytes == 0.0);
  CHECK(loss_fwd->head_passes == 0);
  CHECK(loss_fwd->elementwise_bytes > 0.0);
  // Memory: the head's stage holds layer 15 and the final norm (2048 parameters; the lm_head's weight is tied to the
  // embedding, which the module graph counts once, on stage 0), the loss's stage no parameters; the head's stage
  // holds the bf16 logits until they are sent.
  int64_t head_params = 0, loss_params = 0;
  for (const WrapUnit& u : head.units) head_params += u.params;
  for (const WrapUnit& u : loss.units) loss_params += u.params;
  const ModuleGraph& g = nanotron_1b().graph;
  CHECK(head_params == 2048 + g.params_under(g.layers()[15]));
  CHECK(loss_params == 0);
  const MemoryResult head_mem = walk_memory(head, nanotron_1b().rt, 8, true);
  CHECK(head_mem.breakdown[static_cast<size_t>(MemoryCategory::Activations)] >= logits);
}

TEST_CASE("pp: nanotron's split keeps the head and the loss together where the walk does (the 1B on 4 stages)") {
  // Thresholds 5, 10, 15, 20 layers' worth: layers 6 5 5 (after layer 4 the cumulative 5 is not above 5, after layer
  // 5 it is), then the norm, head, cast and loss on stage 3 (20 is not above 20).
  const ModelSpec& m = nanotron_1b().graph.spec();
  const CostSplit split = pipeline_split_by_cost(m, 4, StageClose::Exceeded);
  const int64_t expected[4] = {6, 5, 5, 0};
  for (int64_t stage = 0; stage < 4; ++stage) {
    CAPTURE(stage);
    CHECK(stage_layers_by_cost(m, 4, stage, StageClose::Exceeded).count() == expected[stage]);
  }
  CHECK(split.head_stage == 3);
  CHECK(split.loss_stage == 3);
  CHECK_FALSE(pipeline_tail(m, 4, true, StageClose::Exceeded).split());
  // The last stage receives the hidden states and computes head and loss in one: no logits cross a boundary.
  const StepProgram last = nanotron_1b_stage(4, 3);
  CHECK(pp_bytes(last, Phase::PipelineRecvActivations) == doctest::Approx(4096.0 * 2048.0 * 2.0));
  CHECK(pp_bytes(last, Phase::PipelineSendActivations) == 0.0);
  const Op* loss_fwd = first_op(last, OpKind::Loss);
  REQUIRE(loss_fwd != nullptr);
  CHECK(loss_fwd->head_passes == 1);
  CHECK(loss_fwd->elementwise_bytes > 0.0);
}

// The Ultra-Scale Playbook's runs closed a stage where its cumulative cost reached the threshold
// (configs/runtimes/nanotron.yaml pipeline_stage_threshold: reached): rank 0's parameter count in bench_final2
// ('Local Params') is the embedding and 10, 5 and 3 decoder layers of the 1B at pp 2, 4 and 8 (940M, 604M, 470M),
// where the published `>` builds 11 and 6 at pp 2 and 4 (the 1B's costs put those thresholds on layer boundaries).
TEST_CASE("pp: the playbook's runs close a stage where its threshold is reached (the 1B's stage 0 at pp 2, 4, 8)") {
  const ModelSpec& m = nanotron_1b().graph.spec();
  const ModuleGraph& g = nanotron_1b().graph;
  CHECK(nanotron_1b().rt.pipeline_split_by_cost);
  CHECK(nanotron_1b().rt.pipeline_stage_closes_on_reaching);
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> splits = {
      {2, {10, 6}}, {4, {5, 5, 5, 1}}, {8, {3, 2, 3, 2, 3, 2, 1, 0}}};
  for (const auto& [pp, layers] : splits) {
    CAPTURE(pp);
    for (int64_t stage = 0; stage < pp; ++stage) {
      CAPTURE(stage);
      CHECK(stage_layers_by_cost(m, pp, stage, StageClose::Reached).count() == layers[static_cast<size_t>(stage)]);
    }
    // The head's threshold is the total: the cast and the loss stay on the last rank with it (pp 2, 4), or follow
    // the head to the last rank (pp 8: the head reaches 17.5 of 20 on stage 6).
    const CostSplit split = pipeline_split_by_cost(m, pp, StageClose::Reached);
    CHECK(split.loss_stage == pp - 1);
    CHECK(split.head_stage == (pp == 8 ? 6 : pp - 1));
  }
  // Rank 0's parameters as bench_final2 logs them: the embedding (tied to the head, counted once) and its layers.
  const int64_t embedding = 131072LL * 2048LL, layer = g.params_under(g.layers()[0]);
  const std::vector<std::pair<int64_t, double>> local = {{2, 940e6}, {4, 604e6}, {8, 470e6}};
  for (const auto& [pp, logged] : local) {
    CAPTURE(pp);
    const double stage0 =
        static_cast<double>(embedding + stage_layers_by_cost(m, pp, 0, StageClose::Reached).count() * layer);
    CHECK(stage0 == doctest::Approx(logged).epsilon(0.005));  // the CSV's three significant digits
  }
  // The emitted first stage of pp 4 holds those 5 layers.
  const StepProgram first = nanotron_1b_stage(4, 0);
  CHECK(first.layout.stage_first_layer == 0);
  CHECK(first.layout.stage_last_layer == 4);
}

TEST_CASE(
    "pp: gradients synchronised on the last micro-batch keep each stage's unsharded gradients (pipelining + FSDP)") {
  Strategy every = fsdp_pp(4, PipelineSchedule::OneFOneB, 8);
  Strategy last = every;
  last.grad_sync = GradSync::LastMicroBatch;
  StepProgram every_prog, last_prog;
  run(every, 2, &every_prog);
  run(last, 2, &last_prog);
  auto reduce_scatters = [](const StepProgram& p) {
    int n = 0;
    for (const Op& op : p.ops) n += op.kind == OpKind::ReduceScatter ? 1 : 0;
    return n;
  };
  // One reduce-scatter per unit on the last micro-batch only, against one per unit and emitted micro-batch.
  CHECK(reduce_scatters(every_prog) == 3 * reduce_scatters(last_prog));
}

TEST_CASE("pp: a schedule that keeps the stage's units gathered defers their gradient sync to the last backward") {
  // torch.distributed.pipelining (torchtitan's runtimes: sharding.pipeline_reshard_after_backward last) turns the
  // stage's gradient sync off for every backward and reduces once after the last: grad_sync every-micro-batch emits
  // what last-micro-batch emits; fsdp-run (each) reduces every micro-batch.
  const Setup& st = setup();
  const RuntimeProfile titan = load_runtime("torchtitan", FSDP_SOURCE_ROOT);
  REQUIRE(titan.pipeline_keeps_units_gathered);
  REQUIRE_FALSE(st.rt.pipeline_keeps_units_gathered);
  const Strategy every = fsdp_pp(4, PipelineSchedule::OneFOneB, 8);
  Strategy last = every;
  last.grad_sync = GradSync::LastMicroBatch;
  const Cluster c{2, 8};
  auto reduce_scatters = [&](const RuntimeProfile& rt, const Strategy& s) {
    StepProgram p;
    simulate(SimulationInput{&st.graph, &st.hw, &rt, c, s}, &p);
    int n = 0;
    for (const Op& op : p.ops) n += op.kind == OpKind::ReduceScatter ? 1 : 0;
    return n;
  };
  CHECK(reduce_scatters(titan, every) == reduce_scatters(titan, last));
  CHECK(reduce_scatters(st.rt, every) == 3 * reduce_scatters(titan, every));
}

TEST_CASE("pp: pipelining reduces after the stage's backward, and the drain waits for every stage's reductions") {
  // torch.distributed.pipelining (torchtitan): every backward with gradient sync off, then FSDP2's post-backward by
  // hand after the stage's last backward, the compute stream waiting for its reductions before the input gradient is
  // sent; fsdp-run reduces each unit inside the backward.
  const Setup& st = setup();
  const RuntimeProfile titan = load_runtime("torchtitan", FSDP_SOURCE_ROOT);
  const Strategy s = fsdp_pp(4, PipelineSchedule::OneFOneB, 8);
  const SimulationInput in{&st.graph, &st.hw, &titan, Cluster{2, 8}, s};
  const StepProgram prog = emit_stage_program(in, 1);
  REQUIRE(prog.first_reduction_after_backward > 0);
  int last_backward = -1, first_rs = -1, last_rs = -1, send = -1;
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const Op& op = prog.ops[i];
    if (op.micro_batch != 7) continue;
    const int at = static_cast<int>(i);
    if (op.kind == OpKind::Backward) last_backward = at;
    if (op.kind == OpKind::ReduceScatter) {
      if (first_rs < 0) first_rs = at;
      last_rs = at;
    }
    if (op.phase == Phase::PipelineSendGradients) send = at;
  }
  REQUIRE(last_backward >= 0);
  REQUIRE(send >= 0);
  CHECK(first_rs > last_backward);
  CHECK(prog.first_reduction_after_backward > last_backward);
  CHECK(prog.first_reduction_after_backward < first_rs);
  CHECK(std::count(prog.ops[static_cast<size_t>(send)].deps.begin(), prog.ops[static_cast<size_t>(send)].deps.end(),
                   last_rs) == 1);
  const SimulationInput run_in{&st.graph, &st.hw, &st.rt, Cluster{2, 8}, s};
  const StepProgram fsdp_run_prog = emit_stage_program(run_in, 1);
  CHECK(fsdp_run_prog.first_reduction_after_backward == -1);
  CHECK(run_timeline(fsdp_run_prog, st.hw, run_in.cluster, s).pipeline_reduction_tail_s == 0);
  // The step: the slowest stage's own (its tail in it), the fill and drain through the others at their paces (the
  // bubble), and each other stage's reduction tail once (the reduction chain, reported apart from the bubble).
  std::vector<double> paces, tails, steps;  // steps: without the stage's own bubble, what sets the slowest
  for (int64_t stage = 0; stage < 4; ++stage) {
    const TimelineResult t = run_timeline(emit_stage_program(in, stage), st.hw, in.cluster, s);
    steps.push_back(t.step_s - t.pipeline_bubble_s);
    CHECK(t.pipeline_reduction_tail_s > 0);
    CHECK(t.pipeline_micro_batch_s ==
          doctest::Approx((t.step_s - t.pipeline_bubble_s - t.optimizer_phase_s - t.pipeline_reduction_tail_s) / 8.0));
    paces.push_back(t.pipeline_micro_batch_s);
    tails.push_back(t.pipeline_reduction_tail_s);
  }
  const Prediction p = simulate(in);
  const size_t slowest = static_cast<size_t>(std::max_element(steps.begin(), steps.end()) - steps.begin());
  double fill_drain = 0, chain = 0;
  for (size_t j = 0; j < 4; ++j)
    if (j != slowest) {
      fill_drain += paces[j];
      chain += tails[j];
    }
  CHECK(p.time.pipeline_bubble_s == doctest::Approx(fill_drain));
  CHECK(p.time.pipeline_reduction_chain_s == doctest::Approx(chain));
  CHECK(p.time.pipeline_reduction_tail_s == doctest::Approx(tails[slowest]));
  CHECK(p.time.step_s == doctest::Approx(steps[slowest] + fill_drain + chain));
  // The report names it on its own line; a plan without reductions after the backward has none.
  CHECK(run_timeline(fsdp_run_prog, st.hw, run_in.cluster, s).pipeline_reduction_chain_s == 0);
  CHECK(simulate(run_in).time.pipeline_reduction_chain_s == 0);
}

TEST_CASE("pp: a stage holds each micro-batch's output for its backward, torch's pipelining to the step's end") {
  // Every schedule runs the backward on the stage's output (fsdp-run's pipeline.cpp keeps it per micro-batch in
  // flight); torch.distributed.pipelining also appends it to output_chunks, cleared when the next step starts: every
  // stage's at torchtitan's end-2024 nightly, the last stage's (the logits) since pytorch/pytorch#153383.
  const Setup& st = setup();
  using K = RuntimeProfile::PipelineOutputsKept;
  CHECK(load_runtime("torchtitan", FSDP_SOURCE_ROOT).pipeline_outputs_to_step_end == K::EveryStage);
  CHECK(load_runtime("pytorch", FSDP_SOURCE_ROOT).pipeline_outputs_to_step_end == K::LastStage);
  CHECK(st.rt.pipeline_outputs_to_step_end == K::None);
  const Strategy s = fsdp_pp(4, PipelineSchedule::OneFOneB, 8);
  const double output = 4096.0 * 4096.0 * 2.0;  // s x h in bf16, what stage 1 sends
  // The output events of stage 1's program: allocated with each send, freed with each gradient received (fsdp-run),
  // or all freed after the step's last op (torchtitan: the emitted micro-batches 0, 1 and 7 hold 1, 1 and 6).
  auto outputs = [&](const RuntimeProfile& rt) {
    const StepProgram p = emit_stage_program(SimulationInput{&st.graph, &st.hw, &rt, Cluster{2, 8}, s}, 1);
    std::vector<double> sent, freed_at_receive;
    double freed_at_end = 0;
    for (const MemEvent& e : p.ops.back().on_complete)
      if (e.category == MemoryCategory::Activations) freed_at_end -= e.bytes;
    for (const Op& op : p.ops) {
      if (op.phase == Phase::PipelineSendActivations)
        for (const MemEvent& e : op.on_issue)
          if (e.category == MemoryCategory::Activations) sent.push_back(e.bytes);
      if (op.phase == Phase::PipelineRecvGradients)
        for (const MemEvent& e : op.on_complete)
          if (e.category == MemoryCategory::Activations) freed_at_receive.push_back(-e.bytes);
    }
    return std::tuple{sent, freed_at_receive, freed_at_end};
  };
  const auto [run_sent, run_freed, run_end] = outputs(st.rt);
  REQUIRE(run_freed.size() == 3);
  for (double f : run_freed) CHECK(f == doctest::Approx(output));
  CHECK(run_end == 0);
  // The first emitted micro-batch's send also carries the in-flight micro-batches' lump.
  CHECK(run_sent.back() == doctest::Approx(output));
  const RuntimeProfile titan = load_runtime("torchtitan", FSDP_SOURCE_ROOT);
  const auto [titan_sent, titan_freed, titan_end] = outputs(titan);
  CHECK(titan_freed.empty());
  CHECK(titan_end == doctest::Approx(8.0 * output));
  CHECK(titan_sent.back() == doctest::Approx(6.0 * output));
  // torchtitan since e5ef99aab (2025-10-22, #1922: pp_schedule.step(..., return_outputs=False), which the schedules
  // pass on as forward_one_chunk(save_forward_output=...)) keeps none: each output freed with its gradient, as
  // fsdp-run's (configs/runtimes/torchtitan-2510.yaml, the --target torchtitan releases' runtime).
  const RuntimeProfile titan2510 = load_runtime("torchtitan-2510", FSDP_SOURCE_ROOT);
  CHECK(titan2510.pipeline_outputs_to_step_end == K::None);
  const auto [t2510_sent, t2510_freed, t2510_end] = outputs(titan2510);
  REQUIRE(t2510_freed.size() == 3);
  for (double f : t2510_freed) CHECK(f == doctest::Approx(output));
  CHECK(t2510_end == 0);
}

TEST_CASE("pp: logits the schedule holds are not counted again as the caller's") {
  // The pytorch runtime's Hugging Face caller keeps its logits through the loss (logits_kept_by_caller); under torch's
  // pipelining they are the last stage's output the schedule holds (to the step's end there): the loss's working set
  // is the fp32 upcast alone, the bf16 logits held once.
  const Setup& st = setup();
  const RuntimeProfile hf = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  REQUIRE(hf.logits_kept_by_caller);
  const Strategy s = fsdp_pp(2, PipelineSchedule::OneFOneB, 4);
  const StepProgram p = emit_stage_program(SimulationInput{&st.graph, &st.hw, &hf, Cluster{2, 8}, s}, 1);
  const double logits = 4096.0 * 128256.0;  // tokens x vocab of the loss's micro-batch
  const Op* loss = nullptr;
  for (const Op& op : p.ops)
    if (op.kind == OpKind::Loss && op.micro_batch == 0) loss = &op;
  REQUIRE(loss != nullptr);
  CHECK(loss->transient_bytes == doctest::Approx(4.0 * logits));
  double held = 0;
  for (const MemEvent& e : loss->on_issue)
    if (e.category == MemoryCategory::Activations) held += e.bytes;
  // The log-probabilities (fp32) and the bf16 logits.
  CHECK(held == doctest::Approx(4.0 * logits + 2.0 * logits));
}
