// A vision-language model's frozen vision parts (Strategy::train_vision, --train-vision all | projector | none):
// parameters, gradients, optimizer state, activations, backward ops and MFU, against Qwen2.5-VL-7B's published counts
// and the step program's own invariants.
//
// Golden numbers: Qwen/Qwen2.5-VL-7B-Instruct has 8,292,166,656 parameters, 676,550,144 of them in its `visual`
// module (the patch embedding, the 32 blocks and the merger, Qwen2.5-VL's projector), 7,615,616,512 left to train
// when it is frozen (a Qwen2.5-VL fine-tuning script's printed model.parameters() sums; tests/simulator/
// test_vlm_families.cpp's header). ms-swift freezes the tower and the aligner by default (swift/llm/argument/
// tuner_args.py TunerArguments: freeze_vit = True, freeze_aligner = True).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "input_fixtures.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/step_program.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using namespace fsdp;
using fsdp::test::cat;

constexpr int64_t kQwen25VlParams = 8'292'166'656;
constexpr int64_t kQwen25VlVisual = 676'550'144;

ModelSpec qwen25_vl() {
  ModelSpec m = fsdp::test::read_hf_fixture("qwen2.5-vl-7b").spec;
  m.vision->image_tokens = 1024;  // the run's --image-tokens (dynamic resolution)
  return m;
}

Strategy vlm_strategy(StrategyKind kind, VisionTraining t) {
  Strategy s;
  s.kind = kind;
  s.act_ckpt = ActCkpt::Full;
  s.micro_batch = 1;
  s.seq_len = 4096;
  s.train_vision = t;
  return language_model_strategy(s, qwen25_vl());
}

// Parameters of the root's vision parts of one kind (ModuleGraph::vision_part).
int64_t part_params(const ModuleGraph& g, ModuleGraph::VisionPart part) {
  int64_t p = 0;
  for (ModuleId c : g.children(g.root()))
    if (g.vision_part(c) == part) p += g.params_under(c);
  return p;
}

// DDP's reducer buckets, allocated once for every trained parameter (the gradients themselves where the runtime
// views them as the buckets, else a copy: emit_replicated.cpp), in bytes.
double bucket_bytes(const StepProgram& p) {
  double b = 0;
  for (const MemEvent& e : p.persistent)
    if (e.category == MemoryCategory::UnshardedGrads || e.category == MemoryCategory::CommBuffers) b += e.bytes;
  return b;
}

}  // namespace

TEST_CASE("train-vision: Qwen2.5-VL-7B's frozen visual module leaves its published trainable count") {
  const ModelSpec m = qwen25_vl();
  const ModuleGraph g(m);
  REQUIRE(g.total_params() == kQwen25VlParams);
  // The visual module is the tower (embeddings, blocks) and the merger (the projector).
  CHECK(part_params(g, ModuleGraph::VisionPart::Tower) + part_params(g, ModuleGraph::VisionPart::Projector) ==
        kQwen25VlVisual);
  // DDP on one GPU in fp32: its buckets hold the trained parameters' gradients, 4 bytes each.
  const RuntimeProfile rt = fsdp::test::runtime("pytorch");
  for (const auto& [t, trained] :
       {std::pair{VisionTraining::All, kQwen25VlParams},
        std::pair{VisionTraining::None, kQwen25VlParams - kQwen25VlVisual},
        std::pair{VisionTraining::Projector, kQwen25VlParams - part_params(g, ModuleGraph::VisionPart::Tower)}}) {
    CAPTURE(to_string(t));
    Strategy s = vlm_strategy(StrategyKind::Ddp, t);
    s.param_dtype = s.reduce_dtype = s.master_dtype = DType::Fp32;
    const StepProgram p = fsdp::test::program(g, s, rt, 1, 1);
    CHECK(bucket_bytes(p) == doctest::Approx(4.0 * static_cast<double>(trained)).epsilon(1e-12));
  }
  CHECK(kQwen25VlParams - kQwen25VlVisual == 7'615'616'512);
}

TEST_CASE("train-vision: a frozen block runs no backward, saves nothing and gets no reduce-scatter") {
  const ModelSpec m = qwen25_vl();
  const ModuleGraph g(m);
  const int64_t blocks = g.first_decoder_layer();
  REQUIRE(blocks == 32);
  const RuntimeProfile rt = fsdp::test::runtime("fsdp-run");
  for (const char* wrap : {"layer", "every:3", "model"}) {
    for (StrategyKind kind : {StrategyKind::Fsdp, StrategyKind::FsdpGradOp, StrategyKind::Ddp}) {
      CAPTURE(wrap);
      CAPTURE(to_string(kind));
      for (VisionTraining t : {VisionTraining::All, VisionTraining::None}) {
        CAPTURE(to_string(t));
        Strategy s = vlm_strategy(kind, t);
        REQUIRE(parse_wrap(wrap, s.wrap));
        const StepProgram p = fsdp::test::program(g, s, rt, 1, 8);
        CHECK(p.frozen_layers == (t == VisionTraining::None ? blocks : 0));
        bool vision_backward = false, vision_reduced = false, vision_saves = false;
        double unsharded_params = 0;
        for (const Op& op : p.ops) {
          const bool vision_unit = op.unit > 0 && p.units[static_cast<size_t>(op.unit)].last_layer < blocks;
          if (op.kind == OpKind::Backward && op.first_layer >= 0 && op.first_layer < blocks) vision_backward = true;
          if (vision_unit && (op.kind == OpKind::ReduceScatter || op.kind == OpKind::AllReduce)) vision_reduced = true;
          if (vision_unit && op.kind == OpKind::Forward)
            for (const MemEvent& e : op.on_issue)
              if (e.category == MemoryCategory::Activations && e.bytes > 0) vision_saves = true;
          for (const MemEvent& e : op.on_issue)
            if (e.category == MemoryCategory::UnshardedParams) unsharded_params += e.bytes;
          for (const MemEvent& e : op.on_complete)
            if (e.category == MemoryCategory::UnshardedParams) unsharded_params += e.bytes;
        }
        const bool frozen = t == VisionTraining::None;
        CHECK(vision_backward == !frozen);
        if (std::string(wrap) != "model") CHECK(vision_saves == !frozen);  // model: the blocks are the root's
        if (frozen) CHECK_FALSE(vision_reduced);
        if (!frozen && kind != StrategyKind::Ddp && std::string(wrap) != "model") CHECK(vision_reduced);
        // Every gather (and every replica's weight cast) is released within the step: a frozen unit kept after
        // forward (fsdp-grad-op) is resharded when the backward ends.
        CHECK(std::abs(unsharded_params) < 1.0);
      }
    }
  }
}

TEST_CASE("train-vision: MFU counts a frozen part's forward alone, and the step loses its backward") {
  const ModelSpec m = qwen25_vl();
  const ModuleGraph g(m);
  const int64_t seq = 4096 + 1024;  // the language model's sequence: the text and the image tokens
  // Per sequence token: the vision parts' parameters times their tokens (ModuleGraph::token_ratio), and the vision
  // blocks' attention GEMMs, once per pass.
  double tower = 0, projector = 0, attention = 0;
  for (ModuleId c : g.children(g.root())) {
    const ModuleNode& n = g.node(c);
    if (!n.runs) continue;
    const double p = static_cast<double>(g.params_under(c)) * g.token_ratio(c, seq);
    if (g.vision_part(c) == ModuleGraph::VisionPart::Tower) tower += p;
    if (g.vision_part(c) == ModuleGraph::VisionPart::Projector) projector += p;
  }
  for (int64_t l = 0; l < g.first_decoder_layer(); ++l) {
    const ModuleId layer = g.layers()[static_cast<size_t>(l)];
    for (ModuleId leaf : g.leaves_under(layer))
      attention += seq_flops_per_token(g.node(leaf), seq) * g.token_ratio(layer, seq);
  }
  const double all = model_flops_per_token(g, seq, false, VisionTraining::All);
  // A frozen part: 2 FLOPs a parameter and token instead of 6, its attention once instead of three times.
  CHECK(all - model_flops_per_token(g, seq, false, VisionTraining::Projector) ==
        doctest::Approx(4.0 * tower + 2.0 * attention).epsilon(1e-9));
  CHECK(all - model_flops_per_token(g, seq, false, VisionTraining::None) ==
        doctest::Approx(4.0 * (tower + projector) + 2.0 * attention).epsilon(1e-9));

  // The step: 8 H100s, FSDP, full checkpointing. No vision backward (nor its recomputation) and no vision gradients.
  const HardwareProfile hw = fsdp::test::hardware("h100-80gb");
  const RuntimeProfile rt = fsdp::test::runtime("pytorch");
  double step_all = 0, peak_all = 0;
  for (VisionTraining t : {VisionTraining::All, VisionTraining::None}) {
    SimulationInput in;
    in.graph = &g;
    in.hardware = &hw;
    in.runtime = &rt;
    in.cluster = Cluster{1, 8};
    in.strategy = vlm_strategy(StrategyKind::Fsdp, t);
    in.strategy.seq_len = 4096;  // simulate adds the image tokens itself
    const Prediction p = simulate(in);
    if (t == VisionTraining::All) {
      step_all = p.time.step_s;
      peak_all = p.memory.peak_allocated;
      continue;
    }
    CHECK(p.time.step_s < step_all);
    CHECK(p.memory.peak_allocated < peak_all);
    CHECK(p.model_flops_per_token == doctest::Approx(model_flops_per_token(g, seq, false, t)));
  }
}

TEST_CASE("train-vision: refused without a vision tower, and the projector alone with LoRA, by name") {
  const ModelSpec llama = fsdp::test::zoo("llama3-8b");
  Strategy s;
  s.train_vision = VisionTraining::None;
  CHECK_THROWS_WITH_AS(validate_strategy(s, llama, Cluster{1, 8}),
                       "--train-vision: none applies to a vision-language model; llama3-8b has no vision tower "
                       "(use all)",
                       InputError);
  const ModelSpec vlm = qwen25_vl();
  s.method = Method::Lora;
  s.lora.rank = 8;
  s.lora.target_modules = {"q_proj"};
  s.seq_len = 4096;
  CHECK_NOTHROW(validate_strategy(s, vlm, Cluster{1, 8}));
  s.train_vision = VisionTraining::Projector;
  CHECK_THROWS_WITH_AS(validate_strategy(s, vlm, Cluster{1, 8}),
                       doctest::Contains("--train-vision: projector with lora is not modelled"), InputError);
  s.method = Method::Full;
  CHECK_NOTHROW(validate_strategy(s, vlm, Cluster{1, 8}));
  Strategy parsed;
  CHECK(parse_vision_training("projector", parsed.train_vision));
  CHECK(parsed.train_vision == VisionTraining::Projector);
  CHECK_FALSE(parse_vision_training("frozen", parsed.train_vision));
}

TEST_CASE("train-vision: LoRA with none adapts the language model's linears alone") {
  // PEFT's target_modules match module names: on Qwen2.5-VL, q_proj and v_proj name the language model's attention
  // alone (its vision blocks fuse q, k and v into `qkv`), and ms-swift's all-linear leaves the tower out under
  // freeze_vit. The graph names a vision block's linears as a decoder layer's, so `none` is what keeps their adapters
  // out: rank 8 on q_proj (3584 -> 3584) and v_proj (3584 -> 4 kv heads x 128) of 28 layers.
  const ModelSpec m = qwen25_vl();
  const ModuleGraph g(m);
  const RuntimeProfile rt = fsdp::test::runtime("pytorch");
  auto adapters = [&](VisionTraining t) {
    Strategy s = vlm_strategy(StrategyKind::Fsdp, t);
    s.method = Method::Lora;
    s.lora.rank = 8;
    s.lora.target_modules = {"q_proj", "v_proj"};
    const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), 4096.0};
    double total = 0;
    for (ModuleId layer : g.layers()) total += layer_cost(in, layer).lora_params;
    return total;
  };
  constexpr double kLanguageModel = 28.0 * 8 * ((3584 + 3584) + (3584 + 512));
  CHECK(adapters(VisionTraining::None) == kLanguageModel);
  // all: the 32 vision blocks' q_proj and v_proj (1280 -> 1280) adapted too, as before --train-vision.
  CHECK(adapters(VisionTraining::All) == kLanguageModel + 32.0 * 8 * (2 * (1280 + 1280)));
  // And none runs no vision backward under LoRA either: the step is shorter than all's.
  const HardwareProfile hw = fsdp::test::hardware("h100-80gb");
  double step[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    SimulationInput in;
    in.graph = &g;
    in.hardware = &hw;
    in.runtime = &rt;
    in.cluster = Cluster{1, 8};
    in.strategy = vlm_strategy(StrategyKind::Fsdp, i == 0 ? VisionTraining::All : VisionTraining::None);
    in.strategy.seq_len = 4096;
    in.strategy.method = Method::Lora;
    in.strategy.lora.rank = 8;
    in.strategy.lora.target_modules = {"q_proj", "v_proj"};
    step[i] = simulate(in).time.step_s;
  }
  CHECK(step[1] < step[0]);
}
