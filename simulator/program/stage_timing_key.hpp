// Which stages between the first and the last of a pipeline plan time alike: simulate() times every stage of a GPipe
// or 1F1B plan (simulate.cpp), up to pp - 2 of them between the first and the last, and under the even split most of
// them hold the same layers in the same wrap units, so one timeline serves every stage of equal key.
//
// The key of a stage j between the first and the last (0 < j < pp - 1), its layers f_j .. f_j + n - 1: n; for each
// offset i < n the graph's class of layer f_j + i (ModuleGraph::layer_classes), its checkpointing mode (layer_ckpt)
// and its parameters; and the stage's wrap units (pipeline_parallel.hpp stage_units: the strategy's units clipped to
// the stage's layers, the root kept) in order, each as whether it is the root and its first and last layer less f_j.
// A unit's parameters follow (stage_units): its layers' (equal by the key), and the root's besides those the model
// parts of the root that the stage holds, the same for every stage between under the even split (stage_holds: the
// embedding and a vision tower on the first stage only, the final norm, head and loss on the last only, the others
// on every stage). Claim: two such stages j and k of one plan with equal keys have bit-identical timelines
// (run_timeline). Proof: let d = f_k - f_j.
//  1. Emission (step_program.cpp emit_step_program) reads the stage through (a) the layout's stage predicates:
//     first_stage(), holds_head(), holds_loss(), receives_logits(), sends_logits(), all false for both, as the key
//     is only given under the even split with one model chunk per rank (head, final norm and loss on the last stage,
//     the embedding on the first: pipeline_tail, stage_holds), and pp > 1 for both; (b) the stage's units (their
//     layer ranges, roots and parameters: equal up to the shift d by the key; their names feed op labels only);
//     (c) per decoder layer l of a unit or of the stage, the graph's class of l, its checkpointing mode and the cost
//     class (graph class, mode) they select: equal at l and l + d by the key, and the class costs themselves do not
//     depend on the stage (emit_memo.hpp); (d) the in-flight micro-batches of the schedule
//     (pp_in_flight_bytes), which differ by stage but enter memory events only; (e) where the schedule has the stage
//     gather the units it keeps after forward (pipeline_kept_unit_gathered_in_forward / _regathered_in_backward of
//     each emitted micro-batch: the stage's warm-up), equal by the key. So the two op lists are equal field by field
//     but for memory events, and first_layer / last_layer shifted by d.
//  2. run_timeline reads of an op its stream, kind, phase, micro-batch, dependencies, barrier flag and cost fields,
//     and per layer l in [first_layer, last_layer] the shape class layer_shape_of[l] (one per graph class) and
//     layer_ckpt(s, l) (op_cost.cpp op_duration, host_issue_seconds, tp_overlap_gemms; async_tp_overlap.cpp), equal
//     at l and l + d by the key; of the program, its units' is_root (equal), holds_head() (false for both) and what
//     no stage changes (layer shapes, head GEMM, attention batch, host issue, SDPA kernels). It never reads memory
//     events or names. So it runs the same floating-point operations in the same order on equal values: the results
//     are bit-identical. tests/simulator/test_stage_timing_key.cpp checks it over a grid of plans.
// Not given (nullopt) for the first and last stage, interleaved 1F1B, or nanotron's compute-cost split (whose stages
// between may hold the head, and are walked too).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/module_graph.hpp"
#include "program/wrap_units.hpp"
#include "runtime/runtime_profile.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

struct StageTimingKey {
  std::vector<int64_t> layers;  // per offset: graph class x 8 + checkpointing mode, then the layer's parameters
  struct Unit {
    bool is_root = false;
    int64_t first = -1, last = -1;  // less the stage's first layer (-1 where the unit holds no layer)
    bool operator==(const Unit&) const = default;
  };
  std::vector<Unit> units;
  // Per emitted micro-batch, where the schedule has the stage gather its kept units (pipeline_parallel.hpp
  // pipeline_kept_unit_gathered_in_forward, pipeline_kept_unit_regathered_in_backward): 2 x forward + backward.
  std::vector<int> kept_gathers;
  bool operator==(const StageTimingKey&) const = default;
};

// The key of pipeline stage `stage` of strategy `s`, its units clipped from the strategy's `units`
// (strategy_units), or nullopt where the claim above is not made.
std::optional<StageTimingKey> stage_timing_key(const ModuleGraph& g, const Strategy& s, const RuntimeProfile& rt,
                                               const std::vector<WrapUnit>& units, int64_t stage);

}  // namespace fsdp
