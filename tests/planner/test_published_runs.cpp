// The validation set: every published run of tests/accuracy/published simulated and compared with its measurement
// (issue M12). The table is printed (`fsdp-plan validate` prints the same); the gates below hold each row and the
// medians where they are today, so that a change moving any prediction further from its measurement fails. The
// goal (issue M12: time median <= 5% and every row <= 10%; memory median <= 3%, every row <= 8%) is not met yet:
// README "Accuracy on published runs" gives the table and what is missing.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "comm/collective_cost.hpp"
#include "comm/comm_group.hpp"
#include "core/errors.hpp"
#include "hardware/hardware_profile.hpp"
#include "validate/published_runs.hpp"
#include "validate/row_breakdown.hpp"

using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;
const std::string kDir = kRoot + "/tests/accuracy/published";

// Today's worst row plus about 5 points, per quantity (the table printed by this test; README "Accuracy on published
// runs", 2026-12-02, with eager PyTorch's elementwise kernels at 0.54 of HBM, the compile, nanotron, torchtitan and
// transformers-deepspeed runtimes, DeepSpeed's ZeRO-3 layout, grad_sync, the reduce stream pool and the attention
// curves read at the call's sequence: time 14.7% worst of the rows with every knob stated, 23.3% of the others, median
// 4.4% (4.6% before nanotron's kernels were priced as it runs them); memory 6.9% and 16.8%, median 2.8%: 4.4% before
// the step segments and nanotron's fragmentation fraction fitted on the playbook's data-parallel rows,
// tests/accuracy/published/fitted.txt). A row
// priced with a neighbour for a knob its source does not state, or that fsdp-plan does not model (the table's
// "priced with" line), has its own, wider band: its error is partly the approximation's.
// With compute under communication at the measured 18.9% (docs/hardware.md "Compute under communication",
// 2026-12-02): 12.3% worst of the rows with every knob stated (fms-llama2-13b-a100-128gpu-hsdp-mb1-2024-02, 14.7%
// before), median 4.0%: the row band at that worst plus about 5 points (0.20 before).
// The data-parallel A100 rows over 10% (2026-12-03, issue M12; the test case "the A100 rows over 10%" at the end of
// this file pins the numbers): fms-fsdp's 13B HSDP micro-batch-1 run (+12.3%) is the one whose backward barely holds
// its inter-node all-reduces (27.5 ms a layer, 94% of the backward at the stated 400 Gb/s a node; +4.6% at 350 Gb/s),
// llm-foundry's 70B on 128 A100-40GB (+13.2%) is compute-bound in the prediction (under 1% of the step exposed): no
// mechanism priced for either. torchtitan's 70B micro-batch-1 per-op run went from +12.0% to -1.8% with its A100
// rows priced on AWS p4de (hwprofiles/p4de-a100-80gb.yaml, the cluster of the repo's launcher; its eight A100 rows
// +1.4..+12.0% -> -5.4..+0.7%, the time median 4.0% -> 3.9%). Bands unchanged: the worst row with every knob stated
// is still fms-fsdp's 13B (12.3%).
// FSDP1's flat gradient concatenated from its views' gradients at each unit's post-backward (2026-12-03,
// configs/runtimes/pytorch-fsdp1.yaml flat_grad_cat_in_backward: autograd's SplitWithSizesBackward): every FSDP1 row
// 0.3-4.2 points slower, fms-fsdp's 13B HSDP run +12.3% -> +11.7% (still the worst with every knob stated),
// llm-foundry's 70B on 128 A100-40GB +13.2% -> +11.1%, time median 3.8% -> 3.6%. The approximated band at today's
// worst approximated row plus about 5 points (0.29 at 23.3%): the playbook's 1B ZeRO-1 run on 32 nodes, +17.5%
// (usp-1b-h100-32n-mbs1-ga1-zero1, nanotron runtime, not moved by this), the FSDP1 rows' worst +11.1%.
// fms-fsdp's eight "Selective AC" rows (2026-12-03), priced with the fraction of blocks checkpointed that their
// published HFU / MFU implies (fms-fsdp.yaml's header; they were listed, not priced): A100 +9.0% (13B), +0.1%, -0.3%,
// +6.5% (13B every:2); H100 +15.6% (13B), +7.6%, +15.8% (70B), +8.0%. Approximated rows (the inference is named),
// inside kTimeApproximatedRowBand; the bands unchanged.
constexpr size_t kFmsInferredCheckpointingRows = 8;
constexpr double kTimeRowBand = 0.17;
constexpr double kTimeApproximatedRowBand = 0.23;
constexpr double kMemoryRowBand = 0.12;
constexpr double kMemoryApproximatedRowBand = 0.22;
constexpr double kTimeMedianBand = 0.10;
constexpr double kMemoryMedianBand = 0.05;
// The Ultra-Scale Playbook's rows, priced with the nanotron runtime and p5's measured EFA factor (2026-12-03): time
// median 2.9%, worst 17.5% but for usp-1b-h100-8n-mbs2-ga2-zero0 (+115%: measured 16,057 tok/s, half of the same
// cell's ZeRO-1 run and of its 1-node and 16-node neighbours, gated by no band); 2.5% and 16.2% before nanotron's
// fp32 gradient accumulator's add was priced at the fp32 rate (program/emit_replicated.cpp). (Time median 3.8% and the
// 3B rows 2-12% slow before nanotron.yaml priced its Triton norm, in-place rotary and fp32 vocabulary-parallel loss:
// configs/runtimes/nanotron.yaml norm_kernel, rotary_kernel, loss_kernels.) Memory median 2.2%, worst 10.7%
// (usp-1b-h100-8n-mbs2-ga2-zero1; they were 4.2% and 12.2% before the memory walk's step segments and nanotron's
// fragmentation fraction, fitted on these 30 rows: configs/runtimes/nanotron.yaml, fitted.txt).
const std::string kPlaybook = "ultrascale-playbook";
// torchao's README benchmark (torchao.yaml): torchtitan's trainer, whose runtime's fragmentation fraction is fitted on
// its three rows' memory (configs/runtimes/torchtitan.yaml).
const std::string kTorchao = "torchao";
// The playbook's DP x TP x PP runs (ultrascale-playbook-mesh.yaml, M15): a block of their own, gated where they are
// (2026-12-02, stages split by nanotron's compute cost, its asynchronous tensor-parallel linears overlapping their
// collectives and gathering into its MemoryBuffer, every stage timed and 1F1B's fill and drain at the other stages'
// paces, nanotron's kernels priced as it runs them, the head and the loss on the stages nanotron's split gives them:
// time median 3.9%, worst 14.3% but for the 3B tp 4 run at micro-batch 4 (4.2% and 14.9% before the accumulator's
// fp32 rate, 2026-12-03); memory reserved median 4.8%, the rows
// without tensor parallelism within 8.2% (they were +10% to +18% with the fraction fitted on PyTorch's FSDP runs), the
// tensor-parallel rows -12.8% to +9.4% with the reduce-scatters' recorded inputs held for their pass
// (configs/runtimes/nanotron.yaml allocator.collective_inputs_held_for_the_pass, not fitted; median 8.0% and the tp
// rows -28.4% to +0.7% without it, -20.2% to +11.8% before nanotron's own fraction); allocated after the backward
// median 1.3%, worst 10.3%; 2026-12-04: 0.5% and 2.3% with the stages the runs built, below). The 1B pipeline rows are
// within 6% but for pp 4 (-10.1%, -14.9% before the accumulator's
// fp32 rate) and pp 8 (-14.3%: nanotron's
// split puts the final norm and the head on stage 6 and the fp32 cast and the loss alone on stage 7, the bf16 logits
// sent between them, simulator/program/pipeline_parallel.hpp; priced together on the last stage it was -26.5%, and the
// loss's stage, its fp32 loss kernels and the logits' two transfers, now sets the pace); they were 3-25% slow with the
// layers' kernels priced as eager PyTorch's and the loss as log_softmax's. (2026-12-03, M15: pp 4's first
// stage, layers 0-5 and the embedding, must run within 27.6 ms a micro-batch, 3.533 s / 128, and was priced 31.7 ms;
// the tp-1 cells take the same time per token at micro-batch 1, 2 and 4, so not host-bound; pricing the fp32
// accumulator's add at the fp32 rate, as it computes, took pp 4 to -10.1% and the playbook's 1-D time median from 2.5%
// to 2.9%, kept: README, "The one-node tp-1 pipeline rows".) The row band at today's worst plus about 3 points (0.30
// before the split).
const std::string kPlaybookMesh = "ultrascale-playbook-mesh";
constexpr double kMeshTimeRowBand = 0.18;
constexpr double kMeshTimeMedianBand = 0.06;
// The 3B tp 4 run at micro-batch 4 (+46.1%, dp 2 pp 2 on 2 nodes): bench_final2's same mesh on 2 nodes takes 194-211
// ms per pipeline slot at micro-batch 1, 2 and 4 alike (jobs of 3.57G_dp2_tp4_pp2 at mbs 1, 2, 4), against 69 ms on
// one node at micro-batch 1: a floor per slot of the cross-node pipeline the model does not have (README, the mesh
// rows' accuracy). Not nanotron's 100 ms metadata poll (p2p.py _send_meta / _recv_meta @ 67c5ebb6): tp-1 pipelines
// across nodes pay nothing (job 14098578) and tp-2 floors are under 100 ms (14098594); bench_final2's tp > 1
// pipelines on 2-8 nodes take about the stage's host issue time times 1 + tp / 2 a slot, no mechanism found. Its own
// band, at today's worst plus about 3 points (0.60 with the micro-batch-1 run in it, 0.35 with
// 31.9% before nanotron's layer kernels were priced as it runs them). The micro-batch-1 run on one node (+56.6%
// before, then gated here at 0.60) is host-bound: nanotron's host issue time (configs/runtimes/nanotron.yaml
// host_issue, fitted on bench_final2's other micro-batch-1 cells) took it to -4.5%, inside the rows' band.
const std::vector<std::string> kMeshPerMicroBatchOutliers = {"uspm-3b-h100-2n-dp2-tp4-pp2-mbs4-ga32-zero1"};
constexpr double kMeshOutlierTimeRowBand = 0.50;
// The rows without tensor parallelism: today's worst +12.8%, the 3B dp 8 pp 8 run (+6.3% before nanotron's qkv copy
// was held with its saved q, 2026-12-05: configs/runtimes/nanotron.yaml modules.mha_qkv_copy_saved; 0.12 then).
constexpr double kMeshMemoryRowBand = 0.15;
// 2026-12-04: the runs built the 1B's stage 0 with the embedding and 10, 5 and 3 layers at pp 2, 4 and 8, one fewer at
// pp 2 and 4 than base.py's published rule (bench_final2's 'Local Params', configs/runtimes/nanotron.yaml
// pipeline_stage_threshold): the five 1B pipeline rows' allocated peak after the backward went from +4.9..+10.3% to
// -1.7..-0.6%, and their reserved peaks moved with their stage 0: pp 2 +8.3% -> +6.0%, pp 4 +2.5% -> -5.3%, tp 2 x pp
// 2 -2.3% -> -10.6%, tp 2 x pp 4 +3.1% -> -12.9%, tp 4 x pp 2 -10.6% -> -18.2% (a layer's activations and state less,
// and the step segment a pipeline's in-flight event had hidden: memory_walk.cpp). That last run is this block's own
// reserved-memory outlier: its mesh at dp 1 and ZeRO-0 measures 7.6, 30.4 and 56.1 GiB at micro-batch 1, 8 and 16
// (jobs 14098542, 14098533, 14098534; predicted -14.1%, -18.2%, -18.3%), while the same mesh and micro-batch 8 at dp
// 2, 4 and 8 (ZeRO-1, jobs 14098574, 14098651, 14098789) measure 26.0, 24.2 and 23.9 GiB (-9.4%, -5.5%, -5.5%) and
// tp 8 at dp 1 measures 10.8 GiB at micro-batch 8 (job 14098582: 0.36 of tp 4's where the activations halve). Its own
// band, at today's error plus about 3 points; the others keep theirs. 2026-12-05, with nanotron's qkv copy held by the
// saved q (modules.mha_qkv_copy_saved; the fraction refitted, 0.106 -> 0.086): this run -18.2% -> -14.9%, and the 3B
// tp 4 x pp 2 run on 2 nodes +9.6% -> +15.0%. The two models pull apart: from micro-batch 1 to 2 on one node the
// playbook's 3B data-parallel rows add 19.0 GiB measured, 20.6 predicted (19.6 without the copy), its 1B ZeRO-0 rows
// 13.5, 12.0 (11.6), though both are multi-head and nanotron copies and keeps qkv alike. Both here, 0.21 before.
const std::vector<std::string> kMeshMemoryOutliers = {"uspm-1b-h100-1n-dp1-tp4-pp2-mbs8-ga32-zero0",
                                                      "uspm-3b-h100-2n-dp2-tp4-pp2-mbs4-ga32-zero1"};
constexpr double kMeshOutlierMemoryRowBand = 0.18;
// The tensor-parallel rows (today's worst -12.8%, the 3B dp2 tp4 pp4 run; -28.4% before their reduce-scatters' inputs
// were held) are gated as the playbook's data-parallel rows are (kPlaybookMemoryRowBand, below): M15 asks the mesh
// rows to pass the same gates (0.16 of their own before, 2026-12-03).
constexpr double kMeshMemoryMedianBand = 0.08;      // 6.8% (4.8% before the stages the runs built, above; 0.10 at 8.0%)
constexpr double kMeshStepAllocatedRowBand = 0.05;  // today's worst 2.3% plus about 3 points (0.12 at 10.3%)
// torchtitan's FSDP2 x TP runs in bf16 (torchtitan-mesh.yaml, M15: the async-TP benchmark's 70B on 256 and 8B on 64
// Grand Teton H100s, vanilla and async TP, and the 2024-08 405B on 128), held out, no memory published. 2026-12-02:
// vanilla TP +6.4% (70B, full AC) and +15.2% (8B, per-op SAC), the eager 405B +1.7%, async TP +9.4% (70B) and +17.7%
// (8B). They were +21.3%, +28.4%, +17.7%, +32.2% and +46.8% before the Grand Teton's 500 W clock
// (hwprofiles/grand-teton-h100-96gb.yaml, fitted on torchtitan's four 1-D rows on those hosts) and async TP priced as
// PyTorch decomposes it (timeline/async_tp_overlap.hpp: the chunks' GEMMs on M/tp rows, the copy-engine pulls, the
// staging copy and the partials' reduction; before, 1/tp of each fused collective exposed). The predicted async
// speed-ups are 12% (both) against the measured 10% and 9%. Gated at today's worst plus about 3 points, inside the
// data-parallel rows' approximated row band, and at the data-parallel median band. 2026-12-03: with torchtitan's
// complex rotary priced as it runs (three kernels, which Inductor leaves to ATen: program/layer_costs.cpp
// rotary_complex_bytes) and a compiled GQA layer's repeated k and v written for SDPA, the compiled rows went from
// +6.4/+9.4% (70B) and +15.2/+17.7% (8B) to +4.3/+7.0% and +11.4/+13.3%, the eager 405B from +1.7% to +2.7%: the
// row band 0.21 -> 0.16. 2026-12-03, with DTensor's sequence-dimension collectives copying their whole tensor on
// the compute stream (program/tensor_parallel.hpp tp_sequence_layout_copy_bytes): 70B -7.1% (vanilla) and +4.6%
// (async), 8B -4.2% and +9.0%, 405B -3.9%, every row within 10% (median 6.9% -> 4.6%): the row band 0.16 -> 0.12,
// the median band the mesh rows' own, 0.07 (4.6% plus about 3 points). 2026-12-03, with async TP's fused gathers
// returning the gathered tensor sequence-major, which the weight gradients' reshape copies
// (program/tensor_parallel.hpp tp_async_gathered_layout_copy_bytes): async 70B +4.6% -> +0.1%, 8B +9.0% -> +2.1%
// (median 4.6% -> 3.9%, worst 9.0% -> 7.1%, the 70B vanilla row): the row band 0.12 -> 0.10, the median band 0.07
// (3.9% plus about 3 points). 2026-12-05, with DTensor's loss_parallel kernels priced as loss.py runs them (7 fp32
// passes forward, 8 backward; runtime_profile.hpp TpLossBackward::LossParallel): 70B -4.3% / +1.7%, 8B -2.2% /
// +2.4%, 405B -1.6%; the pipeline rows (float8, gated here) -2.8%, -5.5%, +0.1%: the row band 0.10 -> 0.09 (the
// interleaved row's 5.5% plus about 3 points).
const std::string kTorchtitanMesh = "torchtitan-mesh";
// torchtitan's 1-D bf16 Grand Teton rows, the Grand Teton clock's fitting set (fitted.txt).
const std::vector<std::string> kGrandTetonClockRows = {
    "titan-h100-llama3-8b-8gpu-fsdp", "titan-h100-llama3-8b-8gpu-fsdp-compile", "titan-h100-llama3-8b-128gpu-fsdp",
    "titan-h100-llama3-8b-128gpu-fsdp-compile"};
constexpr double kTitanMeshTimeRowBand = 0.09;
constexpr double kTitanMeshTimeMedianBand = 0.07;
// The same file's Float8 runs (M15, 2026-12-02): the async-TP benchmark's float8 tensorwise and rowwise rows (8), the
// 2024-08 405B 2-D Float8 rows (2) and the end-2024 tables' 70B FSDP 32 x TP 8 (2) and 405B FSDP 8 x TP 8 x PP 8 rows
// (1F1B, Interleaved 1F1B, and the CP-1 row at sequence 32768): torchtitan's only published FSDP x TP x PP runs.
// Float8 linears are priced since 2026-12-03 (program/float8_linears.hpp), under tensor parallelism with torchao's
// float8 TP styles (tensorwise: shards cast, gathers in float8) or the plain ones (rowwise), compiled only: 11 rows
// priced, held out (the async-TP benchmark's priced with torchtitan-2506-compile, as their bf16 twins now): 70B
// tensorwise vanilla / async +0.7% / -1.6%, rowwise +5.1% / +7.1%; 8B tensorwise +10.9% / +11.4%, rowwise +8.0% /
// +5.6%; the 2024-08 405B float8 + async TP +1.4%; the end-2024 70B 2D -1.7% / +5.9%, reserved -10.5% / -4.8%
// (tensorwise +3.3 / +1.4 / +15.0 / +16.0 / +3.4 / +0.9 / +9.0% before the weight-gradient GEMMs' transposed copies of
// the gathered float8 operands were priced). The 8B tp 8 rows' measured float8 speed-up is 16%, the predicted 27%;
// the async rowwise rows' measured gain over vanilla is 4-6%, predicted 3-6% since Inductor's missing all-gather
// fusion under rowwise scales is priced (tensor_parallel.hpp TpUnitShape::gathers_fuse, 2026-12-04; 12-14% and
// +19.0% / +16.6% before, band 0.22). 2026-12-05, the float8 gradient GEMMs at the measured FP8-over-bf16 efficiency
// (hardware_profile.hpp float8_matmul_ratio, stas00's MAMF table; compute_cost.hpp float8_linear_gemm_times): 70B
// tensorwise -2.6% / -5.2%, rowwise +2.4% / +4.2%; 8B tensorwise +8.6% / +8.8%, rowwise +6.4% / +3.9%; 405B -3.0%;
// 70B 2D -4.9% / +2.0% (band 0.15 before). 2026-12-05, with DTensor's loss_parallel kernels priced (above): 8B
// tensorwise +5.7% / +5.6%, rowwise +4.3% / +1.9%, 70B within -5.6..+3.9% (band 0.12 before); and each float8 GEMM
// priced by its pass, in the layers and in async TP's fused calls, which priced them at the bf16 rate before
// (timeline.hpp gemm_pass_times): 8B tensorwise +5.9% / +3.1%, rowwise +4.5% / +0.9%, 70B within -6.3..+3.5%. Band at
// today's worst (-6.3%) plus about 3 points. And torchtitan's only
// published FSDP x TP x PP runs, the end-2024 405B on 512 GPUs (FSDP 8 x TP 8 x PP 8, float8 + async TP, full AC),
// priced with the micro-batch count torchtitan's defaults give (pipeline_llama.py: pp micro-batches of the local batch;
// micro_batch_inferred) and its 405B toml's float8 all-gather, the stage's gradient sync deferred to the last backward
// as torch.distributed.pipelining does (data_parallel.cpp), its reductions after the stage's whole backward and before
// the input gradient's send, so every stage's are on the drain's path (DataParallelPlan::reduces_after_stage_backward):
// 1F1B +1.8%, interleaved 1F1B (2 stages a rank) -1.3%, the CP-1 row at sequence 32768 +3.7% (+11.7%, +11.6%, +11.3%
// with the reductions inside the backward; gated by the torchtitan mesh rows' band); their reserved memory (max over
// ranks, measured 82.5 / 72.7 / 75.3 GiB) -7.1%, +9.8% and +1.8% with FSDP2's unsynced gradients kept in the reduce
// dtype (fp32) between backwards (runtime_profile.hpp unsynced_grads_in_reduce_dtype), the interleaved last rank
// holding one micro-batch's loss (pipeline_parallel.hpp in_flight_loss_micro_batches) and each stage's outputs held to
// the step's end (runtime_profile.hpp pipeline_outputs_to_step_end: -8.8%, +6.4%, -0.1% without); -27.6%, -1.8%,
// -20.6% before,
// -43.0%, -20.7%, -37.6% with the gradients reduced every micro-batch. Gated by the float8 rows' memory band. Listed,
// not priced (count and reason gated so that none is lost or priced as bf16 by accident): the eager 2024-08 405B float8
// row (refused: float8 is priced compiled only).
constexpr size_t kTitanMeshFloat8Rows = 1;
constexpr size_t kTitanMeshFloat8PricedRows = 14;
constexpr double kFloat8MeshTimeRowBand = 0.09;
constexpr size_t kTitanMeshPipelineRows = 3;
// And one bf16 FSDP 2 x TP 2 measurement from a torchtitan issue (#1207) that does not state its batch: listed, not
// priced.
const std::string kTitanMeshBatchNotStated = "titan-issue1207-h100-llama3-8b-4gpu-fsdp2-tp2-sac-bf16";
const std::string kPlaybookOutlier = "usp-1b-h100-8n-mbs2-ga2-zero0";
constexpr double kPlaybookTimeRowBand = 0.20;
constexpr double kPlaybookTimeMedianBand = 0.035;
constexpr double kPlaybookMemoryRowBand = 0.14;
constexpr double kPlaybookMemoryMedianBand = 0.04;
// Rows priced with configs/runtimes/torchtitan.yaml (torchtitan's own Llama and loop, 2026-12-02: the 8- and 128-GPU
// Grand Teton H100 rows at +5.2% and +8.5% reserved, the compiled ones +5.7% and +8.7% since the compiled per-op
// policy keeps only what the backward reads; +12.2% and +16.8% before; +0.7% and +2.9% since torchtitan's own
// fragmentation fraction, 2026-12-05): today's worst plus about 3 points, tighter than the approximated band their
// "torch version not stated" line gives them.
constexpr double kTorchtitanMemoryRowBand = 0.06;
// Their time (torchtitan.yaml, 12 rows), 2026-12-03: within 5.5% (the 8-GPU Grand Teton eager row), median 1.8%, with
// torchtitan's complex rotary priced as its three kernels, eager and compiled (Inductor generates no code for complex
// tensors; program/layer_costs.cpp rotary_complex_bytes), and a compiled GQA layer's repeated k and v written for
// SDPA; they were within 8.7%, median 4.9%, the compiled Grand Teton rows' predicted speed-up 29.8% against the
// measured 15.7% (19.8% now). Today's worst plus about 3 points. The float8 rows priced with torchtitan-compile
// share it: since their gradient GEMMs run at the measured FP8-over-bf16 efficiency (2026-12-05) the 8-GPU one is
// -8.7% (-6.1% before), the closest row to the band, left as it was.
constexpr double kTorchtitanTimeRowBand = 0.09;
// torchtitan's 1-D Float8 runs (torchao tensorwise Float8Linear, compiled; program/float8_linears.hpp), held out,
// 2026-12-03: the end-2024 Grand Teton tables' 8B on 8 and 128 H100s -5.2% and -2.3% (their bf16 twins -1.2% and
// +2.1%: the measured float8 speed-up 28-29% against the predicted 23%), the CP-1 row at sequence 32768 +7.5%, the June
// 2025 H200 benchmark's 32 and 64 GPUs +7.4% and +9.2% (configs/runtimes/torchtitan-2506-compile.yaml); reserved
// memory +1.5%, +3.4%, -0.5%, -0.0%, -1.9% (+6.0%, +9.0%, +4.0%, +5.0%, +3.2% before torchtitan's own fragmentation
// fraction, 2026-12-05; the H200 rows were +46% priced with the end-2024 profile's eager loss: the June 2025 torchtitan
// compiles its loss). And torchao's README benchmark (torchao.yaml: 8B on 8 H100s of an unstated variant, so memory
// only; the rows that fraction is fitted on): tensorwise with the float8 all-gather -0.3%, rowwise +0.1% (the bf16 run
// +0.4%; +3.4%, +3.9%, +4.2% before); their
// predicted speed-ups over the bf16 run 27.7% and 16.4% against the measured 25.0% and 10.1% (rowwise's output GEMM
// is priced at tensorwise's rate: docs/hardware.md "Float8 linears"). 2026-12-05, the gradient GEMMs at the measured
// FP8-over-bf16 efficiency (hardware_profile.hpp float8_matmul_ratio): the Grand Teton rows -8.7% and -6.0% (their
// measured speed-up, 28-29%, further from the predicted 19-20%), the CP-1 row +5.2%, the H200 rows +4.8% and +6.5%;
// torchao's speed-ups 23.8% (tensorwise) and 13.2% (rowwise) predicted against 25.0% and 10.1%. Bands at today's worst
// plus about 3 points.
constexpr size_t kFloat8Rows = 7;
constexpr size_t kFloat8TimedRows = 5;
constexpr double kFloat8TimeRowBand = 0.12;
constexpr double kFloat8MemoryRowBand = 0.07;
// torchtitan's FSDP x TP (x PP) float8 rows' reserved memory (torchtitan-mesh.yaml): -14.9%, -9.5%, -11.2%, +4.9%,
// -2.7% since torchtitan's fragmentation fraction was fitted on torchao's rows (2026-12-05; -10.5%, -4.9%, -7.2%,
// +9.8%, -1.7% at pytorch.yaml's 0.25): the 70B tp 8 runs reserved 20 and 16 GiB over the predicted allocated peak.
// 2026-12-05, DTensor's loss_parallel backward priced as loss.py runs it (three fp32 logits-sized tensors beside the
// saved log-probabilities, not two; runtime_profile.hpp TpLossBackward::LossParallel): the 70B rows -2.0% and +4.2%,
// the 405B pipeline rows -11.2%, +8.1% (the interleaved last rank's loss) and -2.7% (band 0.18 before). Today's worst
// plus about 3 points.
constexpr double kFloat8MeshMemoryRowBand = 0.14;
// The playbook runs' second memory figure, the peak allocated from the end of the micro-batches through the step
// (nanotron's "Mem Alloc", measured.step_peak_allocated_gib), 2026-12-02: 30 rows within 0.6% (model states, the
// fp32 gradient accumulator and ZeRO-1's all_gather_coalesced staging, configs/runtimes/nanotron.yaml). Gated at
// 2%: a lost staging copy is 15-20% on the ZeRO-1 rows, a lost DDP bucket 10% on the ZeRO-0 ones.
constexpr double kStepAllocatedRowBand = 0.02;

std::string scratch_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("fsdp-published-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The message load_published_runs refuses `dir` with ("" when it loads); the directory is removed.
std::string load_error(const std::string& dir) {
  std::string what;
  try {
    load_published_runs(dir);
  } catch (const InputError& e) {
    what = e.what();
  }
  std::filesystem::remove_all(dir);
  return what;
}

const char* kRowTemplate = R"(source:
  id: one
  title: "t"
  cite: "c"
  url: null
  independent_of: []
rows:
  - id: r1
    model: llama3-8b
    model_shape: null
    gpu: h100-80gb-sxm
    power_limit_w: null
    nodes: 1
    gpus_per_node: 8
    intra_node: nvlink4-nvswitch
    nics_per_node: null
    nic_bandwidth_gbps: null
    fabric: null
    framework: torchtitan
    framework_version: null
    torch_version: null
    runtime: fsdp2
    strategy: fsdp
    hsdp_shard_group: null
    compile: false
    act_ckpt: full
    param_dtype: bf16
    reduce_dtype: fp32
    fp8: false
    micro_batch: 1
    seq: 8192
    grad_accum: 1
    global_batch_tokens: null
    attention: flash
    optimizer: adamw
    offload: none
    measured:
      tokens_per_s_per_gpu: 5000
      step_time_s: null
      mfu: null
      tflops_per_gpu: null
      peak_memory_gib: 40
      memory_kind: reserved
    quote: "q"
)";

// kRowTemplate with each `from` replaced by its `to` (each must occur in it).
std::string template_with(const std::vector<std::pair<std::string, std::string>>& swaps) {
  std::string text = kRowTemplate;
  for (const auto& [from, to] : swaps) {
    const auto pos = text.find(from);
    REQUIRE(pos != std::string::npos);
    text.replace(pos, from.size(), to);
  }
  return text;
}

}  // namespace

TEST_CASE("published runs: every row simulated against its measurement, the table printed and gated") {
  const ValidationReport rep = validate_published(kDir, kRoot);
  std::printf("%s", format_validation(rep).c_str());
  {
    // README "Accuracy on published runs" quotes the summary (fsdp-plan validate --summary): kept equal to it, so a
    // change of any prediction is a change of that copy too.
    std::ifstream in(kRoot + "/README.md");
    const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string begin = "<!-- accuracy-summary:begin -->\n```\n", end = "```\n<!-- accuracy-summary:end -->";
    const auto b = readme.find(begin), e = readme.find(end);
    REQUIRE(b != std::string::npos);
    REQUIRE(e != std::string::npos);
    CHECK(readme.substr(b + begin.size(), e - b - begin.size()) == format_validation_summary(rep));
  }
  std::set<std::string> sources_with_rows;
  std::vector<double> time_errors, memory_errors, playbook_time, playbook_memory, step_allocated;
  std::vector<double> mesh_time, mesh_memory, titan_mesh_time;
  size_t titan_mesh_float8 = 0, titan_mesh_pipeline = 0, inferred_ckpt = 0, float8_rows = 0, float8_timed = 0,
         titan_mesh_float8_priced = 0;
  for (const RowResult& r : rep.results) {
    CAPTURE(r.row->id);
    // fms-fsdp's selective rows: their checkpointing inferred from HFU / MFU (fms-fsdp.yaml's header), every one
    // priced and its inference on the "priced with" line.
    if (!r.row->act_ckpt_inferred.empty()) {
      ++inferred_ckpt;
      CHECK(r.simulated);
      CHECK(std::count(
                r.approximations.begin(), r.approximations.end(),
                "checkpointing not stated: " + r.row->act_ckpt + ", inferred from " + r.row->act_ckpt_inferred) == 1);
    }
    // Three constants are fitted on published rows (fitted.txt): nanotron's fragmentation fraction, on the playbook's
    // 30 data-parallel rows' memory, torchtitan's, on torchao's three rows' memory, and the Grand Teton H100's 500 W
    // clock, on torchtitan's four 1-D Grand Teton rows' time; every other row is held out.
    CHECK(r.fitted_memory == (r.row->source_id == kPlaybook || r.row->source_id == kTorchao));
    CHECK(r.fitted_time == (std::count(kGrandTetonClockRows.begin(), kGrandTetonClockRows.end(), r.row->id) > 0));
    if (!r.simulated) {
      if (r.row->source_id == kTorchtitanMesh && r.row->id == kTitanMeshBatchNotStated) {
        CHECK(r.not_simulated == "micro-batch not stated");
      } else if (r.row->source_id == kTorchtitanMesh) {
        CHECK(r.row->fp8);
        CHECK((r.not_simulated.rfind("refused: --float8: ", 0) == 0 || r.not_simulated == "micro-batch not stated"));
        ++titan_mesh_float8;
      }
      continue;
    }
    if (r.row->source_id == kPlaybookMesh) {
      // Their own block (above): not in the data-parallel rows' medians.
      REQUIRE(r.time_error);
      REQUIRE(r.memory_error);
      REQUIRE(r.step_allocated_error);
      mesh_time.push_back(*r.time_error);
      mesh_memory.push_back(*r.memory_error);
      CHECK(std::fabs(*r.time_error) <=
            (std::count(kMeshPerMicroBatchOutliers.begin(), kMeshPerMicroBatchOutliers.end(), r.row->id) > 0
                 ? kMeshOutlierTimeRowBand
                 : kMeshTimeRowBand));
      CHECK(std::fabs(*r.memory_error) <=
            (std::count(kMeshMemoryOutliers.begin(), kMeshMemoryOutliers.end(), r.row->id) > 0
                 ? kMeshOutlierMemoryRowBand
             : r.row->tp > 1 ? kPlaybookMemoryRowBand
                             : kMeshMemoryRowBand));
      CHECK(std::fabs(*r.step_allocated_error) <= kMeshStepAllocatedRowBand);
      continue;
    }
    if (r.row->source_id == kTorchtitanMesh && r.row->fp8) {
      REQUIRE(r.time_error);
      ++titan_mesh_float8_priced;
      if (r.row->pp > 1) ++titan_mesh_pipeline;
      CHECK(std::fabs(*r.time_error) <= (r.row->pp > 1 ? kTitanMeshTimeRowBand : kFloat8MeshTimeRowBand));
      if (r.memory_error) CHECK(std::fabs(*r.memory_error) <= kFloat8MeshMemoryRowBand);
      continue;
    }
    if (r.row->source_id == kTorchtitanMesh) {
      REQUIRE(r.time_error);
      titan_mesh_time.push_back(*r.time_error);
      CHECK(std::fabs(*r.time_error) <= kTitanMeshTimeRowBand);
      continue;
    }
    if (r.row->fp8) {
      ++float8_rows;
      REQUIRE(r.memory_error);
      CHECK(std::fabs(*r.memory_error) <= kFloat8MemoryRowBand);
      if (r.time_error) {
        ++float8_timed;
        CHECK(std::fabs(*r.time_error) <= kFloat8TimeRowBand);
      }
    }
    if (r.row->source_id == kPlaybook) {
      if (r.time_error) {
        playbook_time.push_back(*r.time_error);
        if (r.row->id != kPlaybookOutlier) CHECK(std::fabs(*r.time_error) <= kPlaybookTimeRowBand);
      }
      if (r.memory_error) {
        playbook_memory.push_back(*r.memory_error);
        CHECK(std::fabs(*r.memory_error) <= kPlaybookMemoryRowBand);
      }
    }
    if (r.time_error) {
      sources_with_rows.insert(r.row->source_id);
      time_errors.push_back(*r.time_error);
      if (r.row->id != kPlaybookOutlier)
        CHECK(std::fabs(*r.time_error) <= (r.approximations.empty() ? kTimeRowBand : kTimeApproximatedRowBand));
      if (r.runtime == "torchtitan" || r.runtime == "torchtitan-compile")
        CHECK(std::fabs(*r.time_error) <= kTorchtitanTimeRowBand);
    }
    if (r.step_allocated_error) {
      step_allocated.push_back(*r.step_allocated_error);
      CHECK(std::fabs(*r.step_allocated_error) <= kStepAllocatedRowBand);
    }
    if (r.memory_error) {
      memory_errors.push_back(*r.memory_error);
      CHECK(std::fabs(*r.memory_error) <= (r.approximations.empty() ? kMemoryRowBand : kMemoryApproximatedRowBand));
      if (r.runtime == "torchtitan") CHECK(std::fabs(*r.memory_error) <= kTorchtitanMemoryRowBand);
    }
  }
  // The set's size is part of what it proves (issue M12: 40 runs, 5 independent sources): a row or a source lost
  // from the data must not pass silently.
  CHECK(time_errors.size() >= 40);
  CHECK(sources_with_rows.size() >= 5);
  CHECK(summarise(time_errors).median_abs <= kTimeMedianBand);
  CHECK(memory_errors.size() >= 8);
  CHECK(summarise(memory_errors).median_abs <= kMemoryMedianBand);
  CHECK(playbook_time.size() == 30);
  CHECK(summarise(playbook_time).median_abs <= kPlaybookTimeMedianBand);
  CHECK(playbook_memory.size() == 30);
  CHECK(summarise(playbook_memory).median_abs <= kPlaybookMemoryMedianBand);
  CHECK(step_allocated.size() == 30);
  CHECK(mesh_time.size() == 14);
  CHECK(summarise(mesh_time).median_abs <= kMeshTimeMedianBand);
  CHECK(summarise(mesh_memory).median_abs <= kMeshMemoryMedianBand);
  CHECK(inferred_ckpt == kFmsInferredCheckpointingRows);
  CHECK(titan_mesh_time.size() == 5);
  CHECK(titan_mesh_float8 == kTitanMeshFloat8Rows);
  CHECK(titan_mesh_float8_priced == kTitanMeshFloat8PricedRows);
  CHECK(float8_rows == kFloat8Rows);
  CHECK(float8_timed == kFloat8TimedRows);
  CHECK(titan_mesh_pipeline == kTitanMeshPipelineRows);
  CHECK(summarise(titan_mesh_time).median_abs <= kTitanMeshTimeMedianBand);
}

TEST_CASE("published runs: a row the simulator can price matches a direct simulation") {
  const std::string d = scratch_dir("direct");
  write(d + "/one.yaml", kRowTemplate);
  const ValidationReport rep = validate_published(d, kRoot);
  REQUIRE(rep.results.size() == 1);
  const RowResult& r = rep.results[0];
  REQUIRE(r.simulated);
  CHECK(r.hardware == "h100-80gb");
  CHECK(r.runtime == "torchtitan");  // framework torchtitan on FSDP2, eager: configs/runtimes/torchtitan.yaml
  REQUIRE(r.time_error);
  CHECK(*r.time_error == doctest::Approx((*r.predicted_tokens_per_s - 5000.0) / 5000.0));
  REQUIRE(r.memory_error);
  CHECK(*r.measured_memory_gib == 40.0);
  // The breakdown is the same simulation's: one GPU's 1 x 8192 tokens over the predicted step, the compute stream's
  // busy time and the collectives within it, the memory against the h100-80gb profile's usable 81559 MiB.
  REQUIRE(r.breakdown);
  const RowResult::Breakdown& b = *r.breakdown;
  CHECK(*r.predicted_tokens_per_s == doctest::Approx(8192.0 / b.step_s));
  CHECK(b.compute_s <= b.step_s + 1e-9);
  CHECK(b.exposed_comm_s <= b.comm_s + 1e-9);
  CHECK(b.contention_s <= b.compute_s);
  CHECK(b.usable_gib == doctest::Approx(81559.0 / 1024.0));
  CHECK(b.device_total_gib > 0);
  // The memory at the allocated peak: where it falls and what is live then, fragmentation, NCCL and workspace
  // included, summing to the device total.
  CHECK(b.peak_allocated_gib <= b.reserved_peak_gib);
  CHECK(b.reserved_peak_gib <= b.device_total_gib);
  CHECK_FALSE(b.peak_phase.empty());
  double categories = 0;
  for (double v : b.memory) categories += v;
  CHECK(categories / (1024.0 * 1024.0 * 1024.0) == doctest::Approx(b.device_total_gib));
  // `fsdp-plan validate --breakdown TEXT`: a header, the row's line and its memory line; a text no row's id contains
  // is an error.
  const std::string text = format_breakdown(rep, "r1");
  CHECK(std::count(text.begin(), text.end(), '\n') == 3);
  CHECK(text.find("r1 ") != std::string::npos);
  CHECK(text.find("\n  memory: allocated ") != std::string::npos);
  CHECK(text.find(" at " + b.peak_phase + ", reserved ") != std::string::npos);
  CHECK(text.find(" activations ") != std::string::npos);
  CHECK_THROWS_WITH_AS(format_breakdown(rep, "no-such-row"), doctest::Contains("no simulated row's id contains"),
                       InputError);
  std::filesystem::remove_all(d);
}

TEST_CASE("published runs: a pipeline row's memory is the stage it names: its logging rank's first, or the largest") {
  // llama3-8b on pp 2, one micro-batch of 4 x 8192 a step: the last stage's loss (the fp32 logits of 32768 tokens x
  // 128256) needs more than the first stage's 16 checkpointed layers, so the plan's memory is the last stage's.
  const std::string kind = "      memory_kind: reserved\n";
  auto row = [&](const std::string& memory_of) {
    std::vector<std::pair<std::string, std::string>> swaps{
        {"    micro_batch: 1\n", "    tp: 1\n    pp: 2\n    pp_schedule: 1f1b\n    micro_batch: 4\n"}};
    if (!memory_of.empty()) swaps.emplace_back(kind, kind + "      memory_of: " + memory_of + "\n");
    return template_with(swaps);
  };
  auto evaluated = [&](const std::string& memory_of) {
    const std::string d = scratch_dir("memory-of");
    write(d + "/one.yaml", row(memory_of));
    const ValidationReport rep = validate_published(d, kRoot);
    std::filesystem::remove_all(d);
    REQUIRE(rep.results.size() == 1);
    REQUIRE(rep.results[0].simulated);
    return rep.results[0];
  };
  const RowResult largest = evaluated("largest-stage"), first = evaluated("first-stage");
  REQUIRE(largest.breakdown);
  CHECK(largest.breakdown->peak_phase.rfind("stage 2/2 ", 0) == 0);
  CHECK(*largest.predicted_memory_gib == doctest::Approx(largest.breakdown->reserved_peak_gib));
  CHECK(*first.predicted_memory_gib < *largest.predicted_memory_gib);
  CHECK(*first.predicted_tokens_per_s == *largest.predicted_tokens_per_s);
  // Required on a pipeline row with a memory figure, refused on a row without stages, its value one of the two.
  std::string d = scratch_dir("memory-of-missing");
  write(d + "/one.yaml", row(""));
  CHECK(load_error(d).find("memory_of") != std::string::npos);
  d = scratch_dir("memory-of-bad");
  write(d + "/one.yaml", row("every-stage"));
  CHECK(load_error(d).find("memory_of") != std::string::npos);
  d = scratch_dir("memory-of-flat");
  write(d + "/one.yaml", template_with({{kind, kind + "      memory_of: first-stage\n"}}));
  CHECK(load_error(d).find("only for a row with pipeline stages") != std::string::npos);
}

TEST_CASE("published runs: a torch.compile row is priced by its runtime's compiled profile where one is shipped") {
  // configs/runtimes/pytorch-compile.yaml (FSDP2, DDP) and pytorch-fsdp1-compile.yaml; DeepSpeed has none.
  auto priced = [](const std::string& runtime, const std::string& strategy) {
    // framework litgpt: not a framework with a runtime profile of its own.
    const std::string text = template_with({{"compile: false", "compile: true"},
                                            {"framework: torchtitan", "framework: litgpt"},
                                            {"runtime: fsdp2", "runtime: " + runtime},
                                            {"strategy: fsdp\n", "strategy: " + strategy + "\n"}});
    const std::string d = scratch_dir("compile-" + runtime);
    write(d + "/one.yaml", text);
    const ValidationReport rep = validate_published(d, kRoot);
    std::filesystem::remove_all(d);
    REQUIRE(rep.results.size() == 1);
    REQUIRE(rep.results[0].simulated);
    return rep.results[0];
  };
  auto said = [](const RowResult& r, const std::string& what) {
    return std::find(r.approximations.begin(), r.approximations.end(), what) != r.approximations.end();
  };
  const RowResult fsdp2 = priced("fsdp2", "fsdp");
  CHECK(fsdp2.runtime == "pytorch-compile");
  CHECK_FALSE(said(fsdp2, "torch.compile priced as eager"));
  const RowResult fsdp1 = priced("fsdp1", "fsdp");
  CHECK(fsdp1.runtime == "pytorch-fsdp1-compile");
  CHECK_FALSE(said(fsdp1, "torch.compile priced as eager"));
  const RowResult ds = priced("deepspeed", "zero3");
  CHECK(ds.runtime == "deepspeed");
  CHECK(said(ds, "torch.compile priced as eager"));
}

TEST_CASE("published runs: an unnamed GPU variant prices memory only; bf16 masters; a kernel library is said") {
  auto evaluated = [](const std::string& from, const std::string& to) {
    const std::string text = template_with({{from, to}});
    const std::string d = scratch_dir("variant");
    write(d + "/one.yaml", text);
    const ValidationReport rep = validate_published(d, kRoot);
    std::filesystem::remove_all(d);
    REQUIRE(rep.results.size() == 1);
    return rep.results[0];
  };
  const RowResult exact = evaluated("gpu: h100-80gb-sxm", "gpu: h100-80gb-sxm");
  // "4xH100": the 80 GB SXM part's memory, no time comparison (HBM and NVLink or PCIe set the time), said.
  const RowResult h100 = evaluated("gpu: h100-80gb-sxm", "gpu: h100");
  REQUIRE(h100.simulated);
  CHECK(h100.hardware == "h100-80gb");
  CHECK_FALSE(h100.time_error);
  REQUIRE(h100.memory_error);
  CHECK(*h100.predicted_memory_gib == doctest::Approx(*exact.predicted_memory_gib));
  CHECK(std::find(h100.approximations.begin(), h100.approximations.end(),
                  "GPU variant not stated: memory priced as h100-80gb, time not compared") !=
        h100.approximations.end());
  // bf16-true: no fp32 masters, bf16 optimizer states: less memory than the fp32-master default.
  const RowResult bf16_true = evaluated("    param_dtype: bf16\n", "    param_dtype: bf16\n    master_dtype: bf16\n");
  REQUIRE(bf16_true.simulated);
  CHECK(*bf16_true.predicted_memory_gib < *exact.predicted_memory_gib);
  // A kernel library: Liger-Kernel is priced where the row's runtime applies it (here torchtitan's, which does not:
  // refused with rule KernelLibrary's reason); another library is said not to be modelled.
  const RowResult liger = evaluated("    param_dtype: bf16\n", "    param_dtype: bf16\n    kernel_library: liger\n");
  CHECK_FALSE(liger.simulated);
  CHECK(liger.not_simulated.find("does not apply Liger-Kernel") != std::string::npos);
  const RowResult unsloth =
      evaluated("    param_dtype: bf16\n", "    param_dtype: bf16\n    kernel_library: unsloth\n");
  CHECK_FALSE(unsloth.simulated);
  CHECK(unsloth.not_simulated == "kernel library 'unsloth' is not modelled");
}

TEST_CASE("published runs: torchtitan's rows are priced by its runtime, compiled by torchtitan-compile") {
  auto runtime_of = [](const std::string& from, const std::string& to) {
    const std::string d = scratch_dir("titan");
    write(d + "/one.yaml", template_with({{from, to}}));
    const ValidationReport rep = validate_published(d, kRoot);
    std::filesystem::remove_all(d);
    REQUIRE(rep.results.size() == 1);
    return rep.results[0].runtime;
  };
  const std::string compiled = runtime_of("compile: false", "compile: true");
  CHECK(compiled == "torchtitan-compile");
  CHECK(runtime_of("compile: false", "compile: false") == "torchtitan");
  CHECK(runtime_of("framework: torchtitan", "framework: litgpt") == "pytorch");
}

TEST_CASE("published runs: strict input, one message naming the file and key") {
  auto fails_with = [](const std::string& text, const std::string& file_name, const std::string& needle) {
    const std::string d = scratch_dir("bad");
    write(d + "/" + file_name, text);
    const std::string what = load_error(d);
    CAPTURE(what);
    CHECK(what.find(file_name) != std::string::npos);
    CHECK(what.find(needle) != std::string::npos);
  };
  const std::string t = kRowTemplate;
  auto with = [](const std::string& from, const std::string& to) { return template_with({{from, to}}); };
  fails_with(with("    quote: \"q\"\n", "    quote: \"q\"\n    colour: red\n"), "one.yaml", "colour");
  fails_with(with("    seq: 8192\n", ""), "one.yaml", "seq");
  fails_with(with("      memory_kind: reserved\n", "      memory_kind: peak\n"), "one.yaml", "memory_kind");
  fails_with(with("    nodes: 1\n    gpus_per_node: 8\n", "    nodes: null\n    gpus_per_node: null\n"), "one.yaml",
             "gpus");
  fails_with(with("    runtime: fsdp2\n", "    runtime: megatron\n"), "one.yaml", "runtime");
  // An inferred checkpointing needs the act_ckpt it explains.
  fails_with(with("    act_ckpt: full\n", "    act_ckpt: null\n    act_ckpt_inferred: \"from HFU / MFU\"\n"),
             "one.yaml", "act_ckpt_inferred");
  fails_with(t, "other.yaml", "id");  // source.id must be the file's name
  // One id in two files.
  const std::string d = scratch_dir("dup");
  write(d + "/one.yaml", t);
  std::string two = t;
  two.replace(two.find("id: one"), 7, "id: two");
  write(d + "/two.yaml", two);
  CHECK(load_error(d).find("row id 'r1'") != std::string::npos);
}

TEST_CASE("published runs: an inferred checkpointing is priced as given and named as an approximation") {
  const std::string d = scratch_dir("inferred");
  write(d + "/one.yaml",
        template_with({{"    act_ckpt: full\n",
                        "    act_ckpt: fraction:0.5\n    act_ckpt_inferred: \"HFU / MFU 1.16 = 1 + P x 0.33\"\n"},
                       // fms-fsdp's policy (a fraction of the blocks), under its runtime: torchtitan runs none.
                       {"framework: torchtitan", "framework: fms-fsdp"},
                       {"runtime: fsdp2", "runtime: fsdp1"}}));
  const ValidationReport rep = validate_published(d, kRoot);
  std::filesystem::remove_all(d);
  REQUIRE(rep.results.size() == 1);
  const RowResult& r = rep.results[0];
  REQUIRE(r.simulated);
  CHECK(r.plan.find("ckpt=fraction:0.5 ") != std::string::npos);
  const bool named = std::any_of(r.approximations.begin(), r.approximations.end(), [](const std::string& a) {
    return a == "checkpointing not stated: fraction:0.5, inferred from HFU / MFU 1.16 = 1 + P x 0.33";
  });
  CHECK(named);
}

TEST_CASE("published runs: a knob the simulator does not model is reported, not priced") {
  const std::string d = scratch_dir("skip");
  write(d + "/one.yaml", template_with({{"fp8: false", "fp8: true"}}));
  const ValidationReport rep = validate_published(d, kRoot);
  std::filesystem::remove_all(d);
  REQUIRE(rep.results.size() == 1);
  CHECK_FALSE(rep.results[0].simulated);
  CHECK(rep.results[0].not_simulated.find("float8") != std::string::npos);
  CHECK(format_validation(rep).find("not simulated (1 rows") != std::string::npos);
}

TEST_CASE("published runs: fitted.txt marks a row fitted for the quantity its constant's prefix names") {
  auto marks = [](const std::string& constant) {
    const std::string d = scratch_dir("fitted");
    write(d + "/one.yaml", kRowTemplate);
    write(d + "/fitted.txt", "# a comment\nr1 " + constant + "\n");
    const ValidationReport rep = validate_published(d, kRoot);
    std::filesystem::remove_all(d);
    REQUIRE(rep.results.size() == 1);
    return std::pair{rep.results[0].fitted_time, rep.results[0].fitted_memory};
  };
  CHECK(marks("memory: some allocator constant") == std::pair{false, true});
  CHECK(marks("time: some kernel efficiency") == std::pair{true, false});
  CHECK(marks("some constant of both") == std::pair{true, true});
}

// Issue M12's three A100 rows that were over 10% (2026-12-03; README "Accuracy on published runs"): what the
// prediction says each is bound by, the established numbers their band comments cite. torchtitan's 70B is priced on
// its launcher's cluster since (-1.8%, +12.0% on the DGX A100 profile); fms-fsdp's 13B and llm-foundry's 70B have no
// mechanism priced for them yet. These checks fail when a change to the cost model makes those statements stale.
TEST_CASE("published runs: the A100 rows over 10% - fms' 13B HSDP all-reduces, foundry's 70B, torchtitan's on EFA") {
  const ValidationReport rep = validate_published(kDir, kRoot);
  auto breakdown = [&](const std::string& id) {
    for (const RowResult& r : rep.results)
      if (r.row->id == id) {
        REQUIRE(r.breakdown);
        return *r.breakdown;
      }
    FAIL("row " << id << " not in the set");
    return RowResult::Breakdown{};
  };
  // fms-fsdp's HSDP on 16 nodes of the stated "400Gbps" a node (tests/accuracy/published/fms-fsdp.yaml): each
  // layer's bf16 gradient shard (1/8 of the layer) is all-reduced over the 16 replicas, one GPU a node, the 8 GPUs
  // of a node each in its own ring at 50 Gb/s (simulator/comm/collective_cost.cpp). By hand, Llama 2 13B's layer:
  // 4 x 5120^2 + 3 x 5120 x 13824 + 2 x 5120 = 317,204,480 parameters, x 2 B / 8 = 79,301,120 B; ring, 16 ranks:
  // 2 x 15/16 x 79,301,120 B / (6.25 GB/s x 0.878) = 27.10 ms + 8.4 us + 30 x 14 us = 27.52 ms (the tree:
  // 79,301,120 / (5.4875 GB/s x 0.92 x 0.5) + 8.4 us + 2 x 4 x 14 us = 31.54 ms). Llama 2 7B's layer (4096, 11008):
  // 202,383,360 parameters, 50,595,840 B a shard, 17.29 ms + 0.43 ms = 17.72 ms.
  HardwareProfile hw = load_hardware("a100-80gb", kRoot);
  hw.inter_node.bandwidth = BytesPerSecond(400e9 / 8.0 / static_cast<double>(hw.nics_per_node));
  const CommGroup replicas = strided_group(hw, 8, 8, 16);
  const double ar13 = collective_time(hw, CollectiveKind::AllReduce, Bytes(79301120.0), replicas).value;
  const double ar7 = collective_time(hw, CollectiveKind::AllReduce, Bytes(50595840.0), replicas).value;
  CHECK(ar13 == doctest::Approx(0.027524).epsilon(1e-3));
  CHECK(ar7 == doctest::Approx(0.017721).epsilon(1e-3));
  // Against the backward (two thirds of the compute without its slowdown beside collectives, no recompute): the 13B's
  // 40 all-reduces take 91% of its micro-batch-1 backward (1.10 of 1.21 s), the 7B's 32 take 44% of its
  // micro-batch-2 backward (0.57 of 1.30 s). The 13B row sits at the knee: with the node's network at 350 Gb/s
  // it predicts +4.0%, at 300 Gb/s -4.7% (the 7B HSDP rows move by 1.0-1.2 and 2.4-2.9 points; 2026-12-03). No
  // measured bus bandwidth of the runs' cluster (IBM Cloud's Vela) was found to price it on (README).
  const RowResult::Breakdown fms13 = breakdown("fms-llama2-13b-a100-128gpu-hsdp-mb1-2024-02");
  const RowResult::Breakdown fms7 = breakdown("fms-llama2-7b-a100-128gpu-hsdp-mb2-2024-02");
  const double bwd13 = 2.0 / 3.0 * (fms13.compute_s - fms13.contention_s);
  const double bwd7 = 2.0 / 3.0 * (fms7.compute_s - fms7.contention_s);
  CHECK(40.0 * ar13 / bwd13 > 0.85);
  CHECK(32.0 * ar7 / bwd7 < 0.5);
  // 0.116 s against 0.062 s exposed (0.164 s against 0.067 s before FSDP1's flat-gradient concatenation was priced:
  // its memory-bound copy at each unit's post-backward lengthens the backward the all-reduces hide under).
  CHECK(fms13.exposed_comm_s > 1.5 * fms7.exposed_comm_s);
  // llm-foundry's 70B on 128 A100-40GB (+11.1%, +13.2% before FSDP1's flat-gradient concatenation was priced): its
  // collectives hide behind the compute (under 1% of the step exposed), so neither the network nor NCCL's bandwidth at
  // its message sizes moves it; its predicted memory is 80% of the GPU (31.9 of 40 GiB), not at the allocator's
  // limit.
  const RowResult::Breakdown foundry70 = breakdown("foundry-mpt-70b-a100-40gb-128gpu-s2048-ac-pure");
  CHECK(foundry70.exposed_comm_s < 0.01 * foundry70.step_s);
  CHECK(foundry70.device_total_gib < 0.85 * foundry70.usable_gib);
  // torchtitan's A100 rows, priced on AWS p4de.24xlarge (4 x 100 Gb/s EFA, the cluster of the repo's launcher:
  // tests/accuracy/published/torchtitan.yaml): the 70B's collectives of a layer by hand, 64 ranks on 8 nodes, the
  // network binding (4 NICs x 12.5 GB/s x 0.96 at these sizes = 48 GB/s for a node's 8 ranks).
  // Layer: 2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 2 x 8192 = 855,654,400 parameters. The bf16 all-gather
  // (1,711,308,800 B): 63/64 x 1.7113e9 / 48e9 = 35.09 ms + 8.4 us + 56 x 3.4 us + 7 x 164 us = 36.44 ms; the fp32
  // reduce-scatter (3,422,617,600 B): 70.19 ms + 1.35 ms = 71.54 ms.
  const HardwareProfile p4de = load_hardware("p4de-a100-80gb", kRoot);
  const CommGroup world64 = make_group(p4de, 64, 8);
  const double ag70 = collective_time(p4de, CollectiveKind::AllGather, Bytes(1711308800.0), world64).value;
  const double rs70 = collective_time(p4de, CollectiveKind::ReduceScatter, Bytes(3422617600.0), world64).value;
  CHECK(ag70 == doctest::Approx(0.036440).epsilon(1e-3));
  CHECK(rs70 == doctest::Approx(0.071540).epsilon(1e-3));
  // Per step 80 x (forward gather + backward gather + reduce-scatter) = 11.55 s. At micro-batch 1 with per-op
  // checkpointing that is more than the compute (9.79 s without its slowdown beside collectives): the step is the
  // network's, and compute runs slowed beside a collective nearly throughout (1.67 s); at micro-batch 2 with full
  // checkpointing the compute (21.5 s) hides it. On the DGX A100 profile (8 x 200 Gb/s) the 70B micro-batch-1 row was
  // +12.0%, its collectives a quarter as long.
  const RowResult::Breakdown titan70 = breakdown("titan-a100-llama2-70b-64gpu-mb1-sel-op");
  const RowResult::Breakdown titan70full = breakdown("titan-a100-llama2-70b-64gpu-mb2-full");
  CHECK(80.0 * (2.0 * ag70 + rs70) > titan70.compute_s - titan70.contention_s);
  CHECK(80.0 * (2.0 * ag70 + rs70) < 0.6 * (titan70full.compute_s - titan70full.contention_s));
  CHECK(titan70.comm_s == doctest::Approx(80.0 * (2.0 * ag70 + rs70)).epsilon(0.01));
  CHECK(titan70.contention_s > 0.1 * titan70.step_s);
  CHECK(titan70.device_total_gib > 0.9 * titan70.usable_gib);
}
