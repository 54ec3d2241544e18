// Float8 linears (Strategy::float8, torchao.float8): which of a layer's linears run their GEMMs in float8, and the
// memory-bound casting each adds around them. The GEMMs' rate is compute/compute_cost.hpp float8_linear_gemm_times; the
// float8 all-gather's bytes are the step program's (step_emitter.hpp gathered_bytes). Sources: docs/hardware.md
// "Float8 linears".
#pragma once

#include <cstdint>

#include "model/module_graph.hpp"
#include "strategy/strategy.hpp"

namespace fsdp {

// An E4M3 / E5M2 element: what a float8 tensor holds, gathers and saves per element.
inline constexpr double kFloat8ElementBytes = 1.0;

// Whether linear `n` of a decoder layer is a Float8Linear under the strategy: every linear whose both widths are
// multiples of 16 (torch._scaled_mm refuses others: "Expected both dimensions of mat2 to be divisble by 16", aten
// Blas.cpp), as torchtitan converts every nn.Linear but the head (torchtitan/float8.py @
// 9dec370ad26b5f8e9a7333a0e36165018262644b: module_filter_fn=lambda mod, fqn: fqn != "output"). Not the
// output head (torchtitan filters `output`, and the head is no decoder-layer node) nor a router. Mixture-of-experts
// models are refused with float8 (simulate.cpp validate_strategy): their experts are grouped GEMMs, not nn.Linear.
bool float8_linear(const ModuleNode& n, const Strategy& s);

// Bytes the casts of a float8 linear's activations move, per element of the tensor cast, after torchao's roofline of
// the compiled casts (torchao/testing/training/roofline_utils.py @ 36027d82d1ad9949597ea16002ff4940374b1b94,
// get_tensor_memory_traffic_ovhd_s, roles input and grad_output, without fusion into the producing kernel: its
// benchmarks/float8/float8_roofline.py default, enable_fusion_modeling = False):
//  - tensorwise: a max(abs) reduction reads the bf16 tensor (2 B), then one kernel reads it again and writes the
//    float8 copy row-major and column-major (2 + 1 + 1 B): 6 B;
//  - rowwise: one kernel reads the tensor and writes its row-scaled float8 copy and a transposed bf16 copy (2 + 1 + 2
//    B), another reads the transposed copy and writes its float8 (2 + 1 B): 8 B.
// The input is cast in forward (the linear's input: in_features per token), the incoming gradient in backward
// (out_features per token). Priced at HardwareProfile::float8_cast_bandwidth.
double float8_activation_cast_bytes_per_element(Float8Recipe recipe);

// Rowwise's backward GEMMs (grad_input, grad_weight) run without fast accumulation, where torchao calls cuBLAS's
// tensorwise kernel with unit scales and multiplies its bf16 output by the outer product of the row scales afterwards
// (torchao/float8/float8_ops.py addmm_float8_unwrapped @ 890e0ac8 and 0afa4c1: "The rowwise CUTLASS-based kernel is
// so slow without fast-accum that we'd rather use the tensorwise cuBLAS-based kernel and do the scaling manually
// afterwards"; Float8LinearConfig gives fast accumulation to the output GEMM only): one pass that reads and writes each
// output element (2 + 2 B), over the grad_input (in_features per token) and the grad_weight (per weight element). 0 for
// the other recipes.
double float8_backward_rescale_bytes_per_element(Float8Recipe recipe);

// The elements a decoder layer's float8 linears cast per token on one rank (each times the recipe's bytes above):
// `forward` the inputs', `backward` the incoming gradients', `rescale` the rowwise grad_input outputs'
// (float8_backward_rescale_bytes_per_element). Without tensor parallelism every linear casts its own input
// (in_features) and gradient (out_features), as torchao's roofline counts one linear. Under tensor parallelism with
// sequence parallelism (the only float8 tp torchtitan runs: parallelize_llama.py apply_tp), per rank of `tp`:
//  - tensorwise, torchao's float8 TP styles (float8_tensor_parallel.py): a column-parallel block's input is cast once,
//    on the sequence shard, before it is gathered in float8 (PrepareFloat8ModuleInput: h / tp per distinct input, the
//    attention's and the MLP's: `forward_shard`); a row-parallel linear casts its split input (in / tp); backward, a
//    column linear its split output gradient (out x its share), a row linear its output gradient on the sequence shard
//    before the gather (h / tp: `backward_shard`). A cast on a shard writes the row-major float8 copy only (the
//    column-major one of the gathered tensor is no concatenation of the shards'), so each linear's weight-gradient
//    GEMM copies the gathered float8 operand it reads transposed (torchao float8_ops.py addmm_float8_unwrapped:
//    .t().contiguous() of an operand not in the layout torch._scaled_mm needs): `transposed`, h per column linear (its
//    gathered input) and per row linear (its gathered output gradient);
//  - rowwise, the plain TP styles (torchtitan applies torchao's float8 styles to tensorwise only): each column linear
//    casts the gathered input (in_features), each row linear its split input (in / tp); backward, column linears their
//    split output gradients, row linears the gathered output gradient (out_features); the grad_input outputs rescaled:
//    a column linear's whole (in_features, before its reduce-scatter), a row linear's split (in / tp).
struct Float8CastElems {
  double forward = 0, backward = 0, rescale = 0;
  double forward_shard = 0, backward_shard = 0, transposed = 0;  // tensorwise under tp (above)
};
// A tensorwise cast of a sequence shard before its float8 gather: max(abs) reads 2 B, the cast reads 2 and writes the
// row-major copy, 1 (torchao's roofline kernels 1 and 3 with one output layout). And the transposed copy of a gathered
// float8 tensor: 1 + 1 B.
double float8_shard_cast_bytes_per_element();
double float8_transpose_bytes_per_element();
Float8CastElems float8_cast_elems_per_token(const ModuleGraph& g, ModuleId layer, const Strategy& s);

// What casting a float8 linear's weight moves per micro-batch, forward and backward, per weight element this rank
// holds unsharded (`shard_size`: the FSDP group its weights are sharded over; 1 when they are not):
//  - tensorwise, bf16 all-gather: forward max(abs) (2 B) and the cast (2 + 1 B), backward the transposed cast again
//    (2 + 1 B) (the same roofline's role weight: 5 B and 3 B);
//  - tensorwise, float8 all-gather (Strategy::float8_all_gather): each all-gather casts this rank's shard first
//    (2 + 1 B per shard element, forward and backward: torchao fsdp_utils.py fsdp_pre_all_gather), and the backward's
//    grad-input GEMM needs the gathered float8 weight column-major: one transposed copy (1 + 1 B; torchao
//    float8_ops.py addmm_float8_unwrapped makes the second operand column-major with .t().contiguous()). The
//    per-step max(abs) of all the shards (precompute_float8_dynamic_scale_for_fsdp: one fused reduction and one
//    all-reduce of a scalar per linear) is left out: 2 B per shard element once per step, under 0.1% of a step;
//  - rowwise: forward the row-scaled cast (2 + 1 B), backward a transposed bf16 copy (2 + 2 B) and its cast (2 + 1
//    B) (the roofline's rowwise weight kernels 1-3), and the grad_weight's rescale (float8_backward_rescale_bytes_
//    per_element, 4 B).
// Priced at HardwareProfile::float8_cast_bandwidth, as the activations' casts.
struct Float8WeightCastBytes {
  double forward = 0, backward = 0;
};
Float8WeightCastBytes float8_weight_cast_bytes_per_element(Float8Recipe recipe, bool float8_all_gather,
                                                           double shard_size);

}  // namespace fsdp
