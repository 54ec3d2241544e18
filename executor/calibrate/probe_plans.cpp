// The calibration probes' models and plans (probe_plans.hpp).
#include "calibrate/probe_plans.hpp"

#include <sstream>

#include "core/config_map.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/step_program.hpp"

namespace fsdp::exec::cal {

namespace {

std::string probe_model_yaml(const ProbeShape& p) {
  std::ostringstream y;
  y << "name: calibrate-probe\nfamily: decoder\nhidden_size: " << p.hidden << "\nnum_layers: " << p.layers
    << "\nnum_heads: " << p.heads << "\nnum_kv_heads: " << p.kv_heads << "\nhead_dim: " << p.head_dim
    << "\nffn_size: " << p.ffn << "\ngated_mlp: true\nactivation: silu\nvocab_size: " << p.vocab
    << "\ntied_embeddings: false\nnorm: rmsnorm\nnorm_eps: 1.0e-5\nposition_embedding: rope\n"
       "rope_theta: 10000\nmax_positions: "
    << p.tokens << "\nqkv_bias: false\nattn_out_bias: false\nmlp_bias: false\ndropout: false\n";
  return y.str();
}

}  // namespace

ModelSpec probe_model(const ProbeShape& p) {
  ConfigMap map = ConfigMap::load_string(probe_model_yaml(p), "calibrate probe");
  return parse_model_map(map);
}

std::array<double, 4> simulated_elementwise_bytes(const ModelSpec& spec, DType dt, int64_t tokens,
                                                  const RuntimeProfile& rt) {
  const ModuleGraph graph(spec);
  ProgramInput in;
  in.graph = &graph;
  in.runtime = &rt;
  in.strategy.kind = StrategyKind::Ddp;
  in.strategy.param_dtype = dt;
  in.strategy.micro_batch = 1;
  in.strategy.seq_len = tokens;
  in.strategy.attention = AttentionImpl::Eager;
  const StepProgram prog = emit_step_program(in);
  std::array<double, 4> bytes{0, 0, 0, 0};
  for (const Op& op : prog.ops) {
    if (op.kind == OpKind::Forward && op.layers > 0) bytes[0] += op.elementwise_bytes / op.layers;
    if (op.kind == OpKind::Backward && op.layers > 0) bytes[1] += op.elementwise_bytes / op.layers;
    if (op.kind == OpKind::Loss) bytes[2] += op.elementwise_bytes;
    if (op.kind == OpKind::LossBackward) bytes[3] += op.elementwise_bytes;
  }
  // The probe has one layer per unit: the sums above are of its `layers` identical layers.
  bytes[0] /= static_cast<double>(spec.num_layers);
  bytes[1] /= static_cast<double>(spec.num_layers);
  return bytes;
}

// The probe plan of collectives.in_step_factor: FSDP over the node's local ranks, computing in bf16 (or fp32), the
// second host-overhead probe's shape (96 tokens, hidden 160, ffn 432, vocab 768) with 2 layers wrapped one per unit and
// resharded after forward: a gather per unit each way, a reduce-scatter per unit, the gradient-norm and loss
// all-reduces. A step of a few tens of ms: collectives are a large part of it, as in small-model steps.
PlanFile step_probe_plan(int ranks, const std::string& device, DType compute) {
  const ProbeShape& shape = kProbeShapes[1];  // 2 layers
  PlanFile plan;
  plan.model = probe_model(shape);
  plan.model_name = plan.model.name;
  plan.cluster.hardware = "calibrating";
  plan.cluster.device = device;
  plan.cluster.nodes = 1;
  plan.cluster.gpus_per_node = ranks;
  plan.runtime = "fsdp-run";
  plan.strategy.kind = StrategyKind::Fsdp;
  plan.strategy.wrap.kind = WrapKind::Layer;
  plan.strategy.reshard_after_forward = true;
  plan.strategy.param_dtype = compute;
  plan.strategy.reduce_dtype = DType::Fp32;
  plan.strategy.micro_batch = 1;
  plan.strategy.seq_len = shape.tokens;
  plan.strategy.attention = AttentionImpl::Eager;
  return plan;
}

}  // namespace fsdp::exec::cal
