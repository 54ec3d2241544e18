// Duration of one step-program op on its stream: compute ops by the roofline cost model
// (compute/compute_cost.hpp) over the op's GEMM and attention shapes, collectives by the alpha-beta
// model (comm/collective_cost.hpp) on the op's process group, offload by PCIe and host bandwidth.
#include <algorithm>
#include <cmath>

#include "comm/collective_cost.hpp"
#include "compute/compute_cost.hpp"
#include "compute/unfused_attention.hpp"
#include "program/tensor_parallel.hpp"
#include "timeline/async_tp_overlap.hpp"
#include "timeline/timeline.hpp"
#include "timeline/tp_linear_overlap.hpp"

namespace fsdp {

namespace {

// The communicator of a group kind on the mesh (StepLayout): ranks numbered node-major with tp innermost and pp
// outermost (torchtitan ParallelDims), so a data-parallel group's members are tp ranks apart, a tp group is tp
// consecutive ranks of a node, and a pipeline transfer joins two ranks tp x dp apart (on another node as soon as a
// stage fills a node).
CommGroup group_of(const HardwareProfile& hw, GroupKind k, const StepProgram& p, const Cluster& c) {
  const int gpn = static_cast<int>(c.gpus_per_node);
  const StepLayout& l = p.layout;
  const int tp = static_cast<int>(l.tp);
  switch (k) {
    case GroupKind::Shard:
      if (tp > 1) return strided_group(hw, gpn, tp, static_cast<int>(l.shard_size));
      return contiguous_group(hw, gpn, static_cast<int>(l.shard_size));
    case GroupKind::Replica:
      return strided_group(hw, gpn, static_cast<int>(l.shard_size) * tp, static_cast<int>(l.replicas));
    case GroupKind::World:
      if (tp > 1) return strided_group(hw, gpn, tp, static_cast<int>(l.world));
      return contiguous_group(hw, gpn, static_cast<int>(l.world));
    case GroupKind::Tensor:
      return contiguous_group(hw, gpn, tp);
    case GroupKind::Pipeline: {
      constexpr int kPair = 2;
      return make_group(hw, kPair, l.tp * l.world >= c.gpus_per_node ? 1 : kPair);
    }
    case GroupKind::Mesh:
      return contiguous_group(hw, gpn, static_cast<int>(l.ranks()));
    case GroupKind::Expert:
      // ep consecutive ranks of the shard group (torchtitan's sparse mesh: ep innermost; tp is 1 under ep here).
      return contiguous_group(hw, gpn, static_cast<int>(l.ep));
  }
  return CommGroup{};
}

// The GEMMs a tensor-parallel op's collectives overlap (tp_linear_overlap.hpp). A dense decoder layer's GEMMs, in
// module order, are the attention's column-parallel projections, its output projection (row-parallel), the MLP's
// column-parallel ones and its down projection (row-parallel, last). Read from the end: the down projection; before
// it the MLP's (reading the hidden stream, k the hidden size, and not writing 1/tp of its width); then the output
// projection (which tensor_parallel.cpp splits by its output when its input is as wide as the hidden stream: k the
// hidden size, n = hidden / tp; else by its input, k not the hidden size); the rest the attention's. A layer that does
// not read so (no MLP or attention columns), or one whose forward backward reruns, leaves the set empty: its
// collectives are priced whole.
TpOverlapGemms tp_overlap_gemms(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Strategy& s,
                                bool head) {
  const DType dt = s.param_dtype;
  const int64_t hidden = p.head_gemm.k, tp = s.mesh.tp;
  auto add = [&](double& forward_s, double& backward_s, const GemmShape& gs) {
    const GemmPassTimes t = gemm_pass_times(hw, gs, dt);
    forward_s += t.forward;
    backward_s += t.gradient;
  };
  TpOverlapGemms g;
  for (int64_t l = op.first_layer; l >= 0 && l <= op.last_layer; ++l) {
    if (recomputes_layer_forward(layer_ckpt(s, l))) return TpOverlapGemms{};
    const std::vector<GemmShape>& gm =
        p.layer_shapes[static_cast<size_t>(p.layer_shape_of[static_cast<size_t>(l)])].gemms;
    if (gm.size() < 4) return TpOverlapGemms{};
    TpBlockGemms attention, mlp;
    size_t j = gm.size() - 1;
    add(mlp.row_forward_s, mlp.row_backward_s, gm[j]);
    while (j > 0 && gm[j - 1].k == hidden && gm[j - 1].n * tp != hidden) {
      --j;
      add(mlp.column_forward_s, mlp.column_backward_s, gm[j]);
    }
    if (j == gm.size() - 1 || j < 2) return TpOverlapGemms{};
    add(attention.row_forward_s, attention.row_backward_s, gm[j - 1]);
    for (size_t i = 0; i + 1 < j; ++i) add(attention.column_forward_s, attention.column_backward_s, gm[i]);
    g.layers.push_back({attention, mlp});
  }
  g.head = head;
  if (head) add(g.head_forward_s, g.head_backward_s, p.head_gemm);
  return g;
}

}  // namespace

GemmPassTimes gemm_pass_times(const HardwareProfile& hw, const GemmShape& g, DType dt) {
  const int64_t m = std::max<int64_t>(1, std::llround(static_cast<double>(g.m) * g.weight));
  if (g.float8) {
    const LinearGemmTimes t = float8_linear_gemm_times(hw, m, g.n, g.k, dt);
    return GemmPassTimes{t.forward.value, t.gradient.value};
  }
  const double mean = matmul_time(hw, m, g.n, g.k, dt).value, fwd_ratio = hw.matmul_forward_ratio(dt);
  return GemmPassTimes{fwd_ratio * mean, (3.0 - fwd_ratio) / 2.0 * mean};
}

OpPrices price_layers(const StepProgram& p, const HardwareProfile& hw, const Strategy& s) {
  const DType dt = s.param_dtype;
  OpPrices prices;
  prices.layers.reserve(p.layer_shapes.size());
  for (const LayerShape& ls : p.layer_shapes) {
    LayerPrices t;
    for (const GemmShape& g : ls.gemms) {
      const GemmPassTimes one = gemm_pass_times(hw, g, dt);
      t.gemm_forward += one.forward;
      t.gemm_gradient += one.gradient;
      if (g.op_sac_recomputed) t.op_sac_recomputed += one.forward;
    }
    AttentionShape a;
    // A vision block attends within each image (or window), both ways (LayerShape::attn_seq).
    const bool own = ls.attn_seq > 0;
    a.batch = own ? ls.attn_batch : p.attn_batch;
    a.seq_len = own ? ls.attn_seq : p.attn_seq;
    a.heads = ls.heads;
    a.kv_heads = ls.kv_heads;
    a.head_dim = ls.head_dim;
    a.causal = !own;
    a.window = ls.window;
    a.chunked = ls.chunked;
    // attention sdpa: the kernel PyTorch's dispatch chose for this kind of layer (StepProgram::sdpa_*). The
    // memory-efficient and cuDNN kernels run at their ratio to the flash curves (device.sdpa_kernel_ratio);
    // math is unfused attention as eager is (compute/unfused_attention.hpp), with its own recipe, and flash is
    // flash. A layer handed a mask (a sliding window, with no is_causal) has every query attend every key: the
    // full s x s square, not the causal band. On a CPU device the calibrated attention curves price every
    // implementation (fsdp-run calibrate times the executor's own attention).
    const UnfusedAttentionRecipe* unfused = nullptr;
    if (s.attention == AttentionImpl::Eager && !hw.device_is_host()) unfused = &p.eager_attention;
    double fwd_ratio_k = 1.0, bwd_ratio_k = 1.0;
    // FlashAttention-3 runs at its ratio to the flash curves (device.flash_attention_3_ratio), over the same band a
    // causal or windowed layer visits (flash_attn_interface's window_size).
    if (s.attention == AttentionImpl::Flash3 && !hw.device_is_host()) {
      FSDP_ASSERT(hw.flash3_ratio.given(), "attention_hardware_refusal checked the profile's ratio");
      fwd_ratio_k = hw.flash3_ratio.forward;
      bwd_ratio_k = hw.flash3_ratio.backward;
    }
    // flex_attention at its ratio (device.flex_attention_ratio), slower over packed documents by its block mask's
    // partial blocks (compute_cost.hpp flex_document_block_factor); a layer of documents is one chunked by doc_len.
    if (s.attention == AttentionImpl::Flex && !hw.device_is_host()) {
      FSDP_ASSERT(hw.flex_ratio.given(), "attention_hardware_refusal checked the profile's ratio");
      const bool documents = s.doc_len > 0 && ls.chunked && ls.window == s.doc_len && !own;
      const double blocks = documents ? flex_document_block_factor(s.doc_len) : 1.0;
      fwd_ratio_k = hw.flex_ratio.forward / blocks;
      bwd_ratio_k = hw.flex_ratio.backward / blocks;
    }
    if (s.attention == AttentionImpl::Sdpa && !hw.device_is_host()) {
      const bool masked = ls.window > 0 && p.attn_seq >= ls.window;
      const SdpaKernel k = masked ? p.sdpa_windowed : p.sdpa_global;
      if (k == SdpaKernel::Math) unfused = &p.sdpa_math_attention;
      const HardwareProfile::KernelRatio* r = k == SdpaKernel::MemoryEfficient ? &hw.sdpa_memory_efficient_ratio
                                              : k == SdpaKernel::Cudnn         ? &hw.sdpa_cudnn_ratio
                                                                               : nullptr;
      if (r != nullptr) {
        FSDP_ASSERT(r->given(), "resolve_sdpa checked the profile's kernel ratio");
        fwd_ratio_k = r->forward;
        bwd_ratio_k = r->backward;
      }
      if (masked) {
        a.causal = false;
        a.window = 0;
      }
    }
    if (unfused != nullptr) {
      t.attention_forward = unfused_attention_forward_time(hw, a, *unfused).value;
      t.attention_backward = unfused_attention_backward_time(hw, a, *unfused).value;
    } else {
      t.attention_forward = attention_forward_time(hw, a, dt, fwd_ratio_k).value;
      t.attention_backward = attention_backward_time(hw, a, dt, bwd_ratio_k).value;
    }
    prices.layers.push_back(t);
  }
  prices.head = gemm_pass_times(hw, p.head_gemm, dt);
  if (p.fused_linear_loss)
    prices.head_fused_loss = fused_linear_cross_entropy_time(hw, p.head_gemm.m, p.head_gemm.n, p.head_gemm.k, dt).value;
  return prices;
}

double op_duration(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s) {
  return op_duration(op, p, hw, c, s, price_layers(p, hw, s));
}

double host_issue_seconds(const Op& op, const StepProgram& p, const Strategy& s) {
  const HostIssue& hi = p.host_issue;
  if (hi.empty()) return 0;
  switch (op.kind) {
    case OpKind::Forward:
    case OpKind::Backward: {
      if (op.first_layer < 0) return 0;
      double t = 0;
      for (int64_t l = op.first_layer; l <= op.last_layer; ++l) {
        if (op.kind == OpKind::Forward) {
          t += hi.layer_forward.value;
        } else {
          t += hi.layer_backward.value + (recomputes_layer_forward(layer_ckpt(s, l)) ? hi.layer_forward.value : 0.0);
        }
      }
      return t;
    }
    case OpKind::Loss:
      return hi.head_forward.value;
    case OpKind::LossBackward:
      return hi.head_backward.value;
    default:
      return 0;
  }
}

double op_duration(const Op& op, const StepProgram& p, const HardwareProfile& hw, const Cluster& c, const Strategy& s,
                   const OpPrices& prices) {
  const DType dt = s.param_dtype;  // the compute dtype: parameters are cast to it for forward and backward
  double compute = 0;
  // Each GEMM by pass (gemm_pass_times): a forward op's passes run the forward GEMMs, a backward op's the gradient
  // GEMMs (two, one for a frozen base); what its layers recompute is a forward pass of their GEMMs.
  const bool gradient_passes = op.kind == OpKind::Backward || op.kind == OpKind::LossBackward;
  auto pass_time = [&](double passes, double forward, double gradient) {
    return passes * (gradient_passes ? gradient : forward);
  };
  const bool backward = op.kind == OpKind::Backward;
  // Each decoder layer the op computes is priced with its own shapes (program/layer_costs.hpp) and, in backward,
  // its own checkpointing mode (layer_ckpt): under full checkpointing all its GEMMs and the attention forward run
  // again, under the per-op policy the GEMMs it did not cache (GemmShape::op_sac_recomputed), under ours the
  // attention forward. Consecutive layers of one class and mode cost the same and are priced once.
  int32_t priced_class = -1;
  ActCkpt priced_mode = ActCkpt::None;
  double layer_time = 0;
  const HostOverhead& ho = hw.host_overhead(dt);
  for (int64_t l = op.first_layer; l >= 0 && l <= op.last_layer; ++l) {
    const int32_t cls = p.layer_shape_of[static_cast<size_t>(l)];
    const ActCkpt mode = backward ? layer_ckpt(s, l) : ActCkpt::None;
    if (cls != priced_class || mode != priced_mode) {
      layer_time = 0;
      const LayerPrices& lp = prices.layers[static_cast<size_t>(cls)];
      if (op.gemm_passes > 0) {
        const double recomputed = mode == ActCkpt::Full          ? lp.gemm_forward
                                  : mode == ActCkpt::SelectiveOp ? lp.op_sac_recomputed
                                                                 : 0;
        layer_time += pass_time(op.gemm_passes, lp.gemm_forward, lp.gemm_gradient) + recomputed;
      }
      const double attn_fwd = op.attn_fwd_passes + (recomputes_attention(mode) ? 1.0 : 0.0);
      layer_time += attn_fwd * lp.attention_forward + op.attn_bwd_passes * lp.attention_backward;
      // The eager runtime's host overhead (HostOverhead; CPU profiles measured by fsdp-run calibrate): a decoder
      // layer's forward, its backward, plus the forward again where the layer's mode reruns it.
      if (op.kind == OpKind::Forward) layer_time += ho.layer_forward.value;
      if (backward)
        layer_time += ho.layer_backward.value + (recomputes_layer_forward(mode) ? ho.layer_forward.value : 0.0);
      priced_class = cls;
      priced_mode = mode;
    }
    compute += layer_time;
  }
  if (op.head_passes > 0) compute += pass_time(op.head_passes, prices.head.forward, prices.head.gradient);
  if (op.head_fused_loss) compute += prices.head_fused_loss;
  // The optimizer and the gradient passes before it compute in the master dtype (fp32 masters, states and
  // the gradients they read); everything else in the compute dtype.
  const bool master_side =
      op.kind == OpKind::OptimizerStep || op.kind == OpKind::GradNorm || op.elementwise_in_master_dtype;
  if (op.elementwise_softmax) {
    // The eager cross-entropy's log_softmax and nll_loss kernels at their own rate
    // (HardwareProfile::softmax_bandwidth).
    compute += op.elementwise_bytes / hw.softmax_bandwidth(dt).value;
  } else if (op.elementwise_bytes > 0) {
    constexpr size_t kMemoLimit = 64;
    const OpPrices::TrafficMemo* hit = nullptr;
    for (const OpPrices::TrafficMemo& m : prices.traffic)
      if (m.bytes == op.elementwise_bytes && m.master == master_side) {
        hit = &m;
        break;
      }
    if (hit != nullptr) {
      compute += hit->seconds;
    } else {
      const double seconds =
          memory_bound_time(hw, Bytes(op.elementwise_bytes), master_side ? s.master_dtype : dt).value;
      if (prices.traffic.size() < kMemoLimit) prices.traffic.push_back({op.elementwise_bytes, master_side, seconds});
      compute += seconds;
    }
  }
  // Contiguous device-to-device copies stream nearer the memory's peak than the eager elementwise kernels.
  if (op.device_copy_bytes > 0) compute += op.device_copy_bytes / hw.copy_bandwidth(dt).value;
  // Float8 linears' casts: compiled Triton kernels at their own rate (HardwareProfile::float8_cast_bandwidth).
  if (op.float8_cast_bytes > 0) compute += op.float8_cast_bytes / hw.float8_cast_bandwidth().value;
  // The eager runtime's per-pass host overhead of the embedding + head + loss around the Loss ops (the decoder
  // layers' is priced with each layer above).
  if (op.kind == OpKind::Loss) compute += ho.head_forward.value;
  if (op.kind == OpKind::LossBackward) compute += ho.head_backward.value;
  // The runtime's per-unit machinery, charged once per unit and micro-batch, with the unit's backward.
  if (op.kind == OpKind::Backward) compute += ho.unit.value;
  // On a CPU device the rank's kernels, and its Gloo transport thread, run on its share of the node's cores
  // (hardware_profile.hpp): both were measured with device.cores per rank.
  const double share = cpu_compute_slowdown(hw, static_cast<int>(c.gpus_per_node));
  double t = compute * share;
  // A collective's transfer is CPU work (copies through the transport's thread), slowed like compute when
  // ranks share cores; its latency is the ranks handing off to each other, which waits on no busy core: in a
  // collective every rank of the node is in it, waiting (measured: scalar all-reduces over 4 ranks on 2 cores
  // took 1.5 ms, not the 2x of 2.6 ms).
  if (op.collective != CollectiveKind::None && op.comm_bytes > 0) {
    constexpr size_t kMemoLimit = 64;
    double latency = 0, transfer = 0;
    const OpPrices::CollectiveMemo* hit = nullptr;
    for (const OpPrices::CollectiveMemo& m : prices.collectives)
      if (m.kind == op.collective && m.group == op.group && m.bytes == op.comm_bytes) {
        hit = &m;
        break;
      }
    if (hit != nullptr) {
      latency = hit->latency;
      transfer = hit->transfer;
    } else {
      const CollectiveCost cc = collective_cost(hw, op.collective, Bytes(op.comm_bytes), group_of(hw, op.group, p, c));
      latency = cc.latency.value;
      transfer = cc.transfer.value;
      if (prices.collectives.size() < kMemoLimit)
        prices.collectives.push_back({op.collective, op.group, op.comm_bytes, latency, transfer});
    }
    double one = hw.in_step_factor(static_cast<int>(c.gpus_per_node), dt) * (latency + share * transfer);
    if (op.stream == Stream::TensorParallel && p.tp_async_linears) {
      // nanotron's asynchronous linears hide part of each collective under their own GEMMs (tp_linear_overlap.hpp).
      const bool backward_op = op.phase == Phase::TpBackwardCollectives;
      const TpOverlapGemms g = tp_overlap_gemms(op, p, hw, s, op.tp_head);
      const double whole = one * static_cast<double>(op.comm_calls);
      const double exposed =
          g.layers.empty() && op.first_layer >= 0
              ? whole
              : tp_async_linear_exposed_s(op.collective, backward_op, one, op.comm_calls, g, s.mesh.tp);
      // The GEMMs that run under the hidden part share the SMs with NCCL's kernels: slower by the profile's
      // compute_slowdown_during_comm, as the timeline charges compute overlapped with any collective.
      t += exposed + hw.compute_slowdown_during_comm * (whole - exposed);
    } else if (op.stream == Stream::TensorParallel) {
      // Async TP: a fused call leaves exposed what its decomposition adds to its GEMM (async_tp_overlap.hpp), the
      // chunks' pulls at the tier's bandwidth, the staging copy and the partials' reduction at the memory-bound
      // rate; the calls it does not fuse stay whole (tensor_parallel.hpp).
      const int fused = s.mesh.async_tp ? op.async_tp_fused_calls : 0;
      double fused_s = 0;
      if (fused > 0) {
        const double in_step = hw.in_step_factor(static_cast<int>(c.gpus_per_node), dt);
        const double tp = static_cast<double>(s.mesh.tp);
        AsyncTpMoves moves;
        moves.latency_s = in_step * latency;
        moves.copy_s = in_step * share * transfer / (tp - 1.0);
        moves.stage_s = memory_bound_time(hw, Bytes(2.0 * op.comm_bytes / tp), dt).value;
        moves.reduce_s = memory_bound_time(hw, Bytes(op.comm_bytes * (1.0 + 1.0 / tp)), dt).value;
        if (!async_tp_fused_exposed_s(op, p, hw, s, moves, fused_s))
          fused_s = one * static_cast<double>(fused) * tp_exposed_fraction(s.mesh);
      }
      t += one * static_cast<double>(op.comm_calls - fused) + fused_s;
    } else {
      t += one * static_cast<double>(op.comm_calls);
    }
  }
  if (op.copy_bytes > 0) t += host_device_copy_time(hw, Bytes(op.copy_bytes)).value;
  if (op.host_optimizer_params > 0)
    t += host_optimizer_step_time(hw, static_cast<int64_t>(op.host_optimizer_params), s.optimizer, s.master_dtype,
                                  s.reduce_dtype, static_cast<int>(c.gpus_per_node))
             .value;
  return t;
}

}  // namespace fsdp
