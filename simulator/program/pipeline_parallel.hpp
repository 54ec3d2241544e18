// Pipeline parallelism as a transform of the step: which decoder layers and which of the model's other parts a stage
// holds, how many micro-batches' activations its schedule keeps in flight, the point-to-point transfers between
// stages and the schedule's bubble. The simulator emits the program of the first and of the last stage (the first
// holds the most micro-batches in flight and the embedding; the last the final norm, the head and the loss, or under
// nanotron's compute-cost split the loss, the head maybe on the stage before) and reports the worse of the two's
// memory (under the compute-cost split, of every stage's); it times every stage and runs the step at the slowest
// one's pace, filled and drained through the others (simulate.cpp, pipeline_fill_drain_s).
//
// Sources:
//  - Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
//    (arXiv:2104.04473): sec. 2.2.1, GPipe and 1F1B (PipeDream-Flush) have the bubble (p - 1) x (t_f + t_b) over m
//    micro-batches of time m x (t_f + t_b): bubble fraction (p - 1) / m; 1F1B keeps at most p micro-batches in
//    flight (stage i: p - i), GPipe all m. Sec. 2.2.2, interleaved 1F1B with v model chunks per rank: the bubble
//    (p - 1) / v x (t_f + t_b), at v times the point-to-point communication, and more activations in flight.
//  - torch.distributed.pipelining (torch/distributed/pipelining/schedules.py, ScheduleInterleaved1F1B): the warm-up
//    of rank i runs (v - 1) x p + 2 (p - 1 - i) chunk forwards before its first backward, so (that + 1) chunks'
//    activations are live at once, each 1/v of the rank's layers. ScheduleGPipe, Schedule1F1B likewise.
//  - torchtitan (torchtitan/distributed/pipeline_parallel.py): the model split into stages of whole decoder layers,
//    the embedding on the first stage, the final norm and the output projection (and the loss) on the last; FSDP
//    applied to each stage's modules, so a stage's parameters are gathered per micro-batch unless
//    reshard_after_forward is off (torchtitan turns it off under pipeline parallelism for that reason).
#pragma once

#include <cstdint>
#include <vector>

#include "model/module_graph.hpp"
#include "program/wrap_units.hpp"
#include "strategy/mesh.hpp"

namespace fsdp {

// The decoder layers of pipeline rank `stage`: the layers split into pp x v model chunks as evenly as they go (the
// first chunks take one more when they do not divide: torchtitan's even split), rank i holding chunks i, i + pp,
// ...; returned as a contiguous range of that many layers for the rank's program.
struct StageLayers {
  int64_t first = 0, last = -1;
  int64_t count() const { return last - first + 1; }
};
StageLayers stage_layers(int64_t num_layers, int64_t pp, int64_t virtual_stages, int64_t stage);
// A stage's decoder layers (counted from the first decoder layer, as the splits count them) in the graph's layer index
// (ModuleGraph::layers: a vision tower's `vision` blocks first): shifted past those blocks, which the first stage holds
// with the embeddings (stage_holds: the tower's other parts).
StageLayers graph_stage_layers(const StageLayers& decoder, int64_t vision, int64_t stage);
// nanotron's split (RuntimeProfile::pipeline_split_by_cost), huggingface/nanotron src/nanotron/models/base.py
// build_model @ 67c5ebb6a925cb47026b22013af8bd1bb6c46d93: the model's PipelineBlocks in module order (llama.py
// LlamaForTraining: model.token_position_embeddings, model.decoder[0 .. L-1], model.final_layer_norm, model.lm_head,
// model.cast_to_fp32, then loss) with LlamaModel.get_block_compute_costs' costs (a decoder layer 4 x heads x d_qkv x
// hidden + 3 x ffn x hidden, d_qkv = hidden // heads; the lm_head, a TensorParallelColumnLinear, vocab x hidden; the
// embedding, the norm, the cast and the loss are not in the table: 0). Walking them in order, a block goes to the
// current rank, which moves on by one after a block whose cumulative cost is above total x (rank + 1) / pp. The
// final norm and the head can so land on a stage before the fp32 cast and the loss (the 1B of the Ultra-Scale
// Playbook on 8 stages: the head on stage 6, the cast and the loss alone on 7), the head's bf16 logits then sent to
// the loss's stage point-to-point. Dense decoder layers only. `closes`: whether the rank moves on after a block whose
// cumulative cost is above its threshold (Exceeded, the published rule) or at or above it (Reached: the Ultra-Scale
// Playbook's runs, RuntimeProfile::pipeline_stage_closes_on_reaching); the two differ only where a cumulative cost
// equals a threshold.
enum class StageClose { Exceeded, Reached };
struct CostSplit {
  std::vector<int64_t> layer_stage;  // per decoder layer
  int64_t norm_stage = 0, head_stage = 0, cast_stage = 0, loss_stage = 0;
};
CostSplit pipeline_split_by_cost(const ModelSpec& m, int64_t pp, StageClose closes);
// Stage `stage`'s decoder layers under that split (a stage left with none: count() 0); stage_layers_in reads them
// from a split already computed.
StageLayers stage_layers_by_cost(const ModelSpec& m, int64_t pp, int64_t stage, StageClose closes);
StageLayers stage_layers_in(const CostSplit& split, int64_t stage);

// The stages holding the model's parts after the decoder layers: the final norm with the LM head, and the loss (with
// nanotron's cast of the logits to fp32 before it). The even split (torchtitan) puts both on the last stage;
// nanotron's, pipeline_split_by_cost's head_stage and loss_stage. Where nanotron's walk would part the norm from the
// head or the cast from the loss (a stage boundary between blocks of cost 0, only where the walk lags more than a
// stage behind the cumulative cost), the norm is counted with the head and the cast with the loss.
struct PipelineTail {
  int64_t head_stage = 0;
  int64_t loss_stage = 0;
  bool split() const { return head_stage != loss_stage; }
};
// `closes`: pipeline_split_by_cost's, where by_cost. The second reads a split already computed.
PipelineTail pipeline_tail(const ModelSpec& m, int64_t pp, bool by_cost, StageClose closes);
PipelineTail pipeline_tail(const CostSplit& split);

// Whether pipeline rank `stage` holds the model part `module` (a child of the graph's root): the embeddings (and a
// vision tower) on the first stage, the final norm and head on tail.head_stage, the loss on tail.loss_stage.
bool stage_holds(const ModuleGraph& g, ModuleId module, int64_t stage, const PipelineTail& tail);
// Whether a part of the root (a child of the graph's root other than a stack of blocks that run) counts among stage
// `stage`'s root parameters: where stage_holds places it, and a stack the model holds and never runs (a vision
// tower's blocks past its feature layer, vision_tower.cpp), the tower's, on the first stage. The stacks of blocks
// that run are the layer units'.
bool stage_root_holds(const ModuleGraph& g, ModuleId module, int64_t stage, const PipelineTail& tail);

// The wrap units of one stage: units clipped to the stage's layers (their parameters recounted), the root keeping
// the model parts the stage holds.
std::vector<WrapUnit> stage_units(const ModuleGraph& g, const std::vector<WrapUnit>& units, const StageLayers& layers,
                                  int64_t stage, const PipelineTail& tail);

// Micro-batches whose activations stage `stage` holds at once under the schedule, in units of the stage's whole
// activations of one micro-batch (interleaved: chunks of 1/v of them), over `micro_batches` per step.
double in_flight_micro_batches(const MeshSpec& mesh, int64_t stage, int64_t micro_batches);
// Of those, the micro-batches whose loss graph (the log-probabilities the loss saved) the loss's stage holds at once:
// as many under GPipe and 1F1B; one under interleaved 1F1B, whose last rank holds the loss in its last model chunk
// and spends its warm-up, (v - 1) x p chunk forwards, on its earlier chunks (torch.distributed.pipelining runs p
// micro-batches on a chunk before the next: schedules.py _get_1f1b_rank_ops, forward chunk (step // p) % v), so that
// each loss forward is followed by its backward.
double in_flight_loss_micro_batches(const MeshSpec& mesh, int64_t stage, int64_t micro_batches);

// The schedule's bubble: (pp - 1) / v of one micro-batch's forward and backward on the slowest stage.
double pipeline_bubble_s(const MeshSpec& mesh, double micro_batch_s);

// The fill and drain of a step whose stages run at different paces, stage_micro_batch_s[j] the time stage j takes for
// one micro-batch's forward and backward, `slowest` the stage that sets the steady state. GPipe and 1F1B (one model
// chunk per rank): the first micro-batch's forward crosses the stages before the slowest and its backward the
// same stages back, the stages after it turn the first micro-batch around before its first backward, and the last
// micro-batch's backward drains through the stages before it: the other stages' forward and backward once each,
// sum over j != slowest of stage_micro_batch_s[j]. With equal stages that is Narayanan et al. 2021 sec. 2.2.1's
// (p - 1) x (t_f + t_b). Interleaved 1F1B keeps pipeline_bubble_s over the slowest stage (its chunks alternate
// between ranks, so no one stage's pace sets the fill).
double pipeline_fill_drain_s(const MeshSpec& mesh, const std::vector<double>& stage_micro_batch_s, size_t slowest);

// Point-to-point transfers one rank makes per micro-batch and direction: v (one per model chunk boundary).
int pipeline_transfers_per_micro_batch(const MeshSpec& mesh);

// The order in which stage `stage` of `pp` runs its passes over `micro_batches` (GPipe, 1F1B; Narayanan et al. 2021
// sec. 2.2.1 PipeDream-Flush, torch.distributed.pipelining Schedule1F1B / ScheduleGPipe, fsdp-run's
// run_micro_batches): the forwards it runs before its first backward (GPipe: all of them; 1F1B: pp - stage - 1),
// then a forward and a backward in turn, then the remaining backwards.
int64_t pipeline_warmup(PipelineSchedule schedule, int64_t pp, int64_t stage, int64_t micro_batches);
// Whether the stage's schedule orders its passes so (pp > 1, GPipe or 1F1B); interleaved 1F1B's chunks are not.
bool pipeline_orders_passes(PipelineSchedule schedule, int64_t pp);
// A unit kept gathered after its forward (the root, a no-reshard strategy's units, FSDP2's last unit) is resharded
// at the end of each backward. Under that order micro-batch k's forward finds it resharded, and gathers it, only
// for k = 0 or after a backward (k > warmup); micro-batch k's backward gathers it again when a backward ran just
// before (k >= max(micro_batches - warmup, 1)). Without an ordered pipeline a forward follows the previous
// micro-batch's backward, and a backward its own forward.
bool pipeline_kept_unit_gathered_in_forward(PipelineSchedule schedule, int64_t pp, int64_t stage, int64_t micro_batches,
                                            int64_t k);
bool pipeline_kept_unit_regathered_in_backward(PipelineSchedule schedule, int64_t pp, int64_t stage,
                                               int64_t micro_batches, int64_t k);

}  // namespace fsdp
