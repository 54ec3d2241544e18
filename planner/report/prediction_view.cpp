#include "report/prediction_view.hpp"

#include <cstdio>
#include <sstream>

#include "program/tensor_parallel.hpp"

namespace fsdp {

std::string format_gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / kGiB);
  return buf;
}

std::string mesh_text(const MeshSpec& m) {
  std::ostringstream o;
  o << "tp=" << m.tp;
  if (m.tp > 1) o << (m.sequence_parallel ? "+sp" : "") << (m.async_tp ? "+async" : "");
  o << " pp=" << m.pp;
  if (m.pp > 1) {
    o << "(" << to_string(m.pp_schedule);
    if (m.pp_virtual_stages > 1) o << " v=" << m.pp_virtual_stages;
    o << ")";
  }
  if (m.ep > 1) o << " ep=" << m.ep;
  return o.str();
}

std::string one_line_strategy(const Strategy& s) {
  std::ostringstream o;
  o << to_string(s.kind);
  if (s.kind == StrategyKind::Hsdp) o << "(group " << s.hsdp_group << ")";
  if (shards_params(s.kind)) o << " wrap=" << to_string(s.wrap) << (s.reshard_after_forward ? "" : " no-reshard");
  o << " ckpt=" << act_ckpt_name(s) << " offload=" << to_string(s.offload) << " " << to_string(s.param_dtype) << "/"
    << to_string(s.reduce_dtype) << " mb=" << s.micro_batch << "x" << s.grad_accum << " seq=" << s.seq_len;
  if (s.doc_len > 0) o << " doc=" << s.doc_len;
  if (!s.mesh.is_data_parallel_only()) {
    o << " " << mesh_text(s.mesh);
  } else if (s.mesh.ep > 1) {
    o << " ep=" << s.mesh.ep;
  }
  if (s.float8 != Float8Recipe::None)
    o << " float8=" << to_string(s.float8) << (s.float8_all_gather ? "+all-gather" : "");
  if (s.train_vision != VisionTraining::All) o << " train-vision=" << to_string(s.train_vision);
  if (s.kernels != KernelLibrary::None) o << " kernels=" << to_string(s.kernels);
  return o.str();
}

nlohmann::json strategy_to_json(const Strategy& s) {
  nlohmann::json j;
  j["strategy"] = to_string(s.kind);
  j["hsdp_group"] = s.hsdp_group;
  j["wrap"] = to_string(s.wrap);
  j["reshard_after_forward"] = s.reshard_after_forward;
  j["act_ckpt"] = act_ckpt_name(s);
  j["offload"] = to_string(s.offload);
  j["param_dtype"] = to_string(s.param_dtype);
  j["reduce_dtype"] = to_string(s.reduce_dtype);
  j["master_dtype"] = to_string(s.master_dtype);
  j["micro_batch"] = s.micro_batch;
  j["seq_len"] = s.seq_len;
  j["grad_accum"] = s.grad_accum;
  j["optimizer"] = to_string(s.optimizer);
  j["method"] = to_string(s.method);
  j["lora_rank"] = s.lora.rank;
  j["attention"] = to_string(s.attention);
  j["forward_prefetch"] = s.forward_prefetch;
  j["backward_prefetch"] = s.backward_prefetch;
  j["tp"] = s.mesh.tp;
  j["sequence_parallel"] = s.mesh.sequence_parallel;
  j["async_tp"] = s.mesh.async_tp;
  j["pp"] = s.mesh.pp;
  j["pp_schedule"] = to_string(s.mesh.pp_schedule);
  j["pp_virtual_stages"] = s.mesh.pp_virtual_stages;
  j["ep"] = s.mesh.ep;
  j["doc_len"] = s.doc_len;
  j["float8"] = to_string(s.float8);
  j["float8_all_gather"] = s.float8_all_gather;
  j["train_vision"] = to_string(s.train_vision);
  j["kernels"] = to_string(s.kernels);
  return j;
}

PlanPrediction plan_prediction(const Prediction& p) {
  PlanPrediction pp;
  pp.peak_bytes = p.memory.peak_allocated;
  pp.peak_bytes_floor = p.memory.peak_allocated_floor;
  pp.reserved_peak_bytes = p.memory.reserved_peak;
  for (size_t i = 0; i < kNumMemoryCategories; ++i)
    pp.memory_breakdown[std::string(kMemoryCategoryNames[i])] = p.memory.breakdown[i];
  pp.step_s = p.time.step_s;
  pp.compute_s = p.time.compute_s;
  pp.exposed_comm_s = p.time.exposed_comm_s;
  pp.optimizer_phase_s = p.time.optimizer_phase_s;
  pp.tokens_per_s_per_gpu = p.tokens_per_s_per_gpu;
  return pp;
}

nlohmann::json prediction_to_json(const Prediction& p) {
  nlohmann::json j;
  j["fits"] = p.fits;
  nlohmann::json mem;
  mem["peak_bytes"] = p.memory.peak_allocated;
  mem["peak_bytes_floor"] = p.memory.peak_allocated_floor;
  mem["reserved_peak_bytes"] = p.memory.reserved_peak;
  mem["device_total_bytes"] = p.memory.device_total;
  mem["usable_bytes"] = p.usable_bytes;
  mem["peak_phase"] = p.memory.peak_phase;
  mem["host_bytes_per_node"] = p.memory.host_bytes_per_node;
  mem["host_fits"] = p.host_fits;
  nlohmann::json bd = nlohmann::json::object();
  for (size_t i = 0; i < kNumMemoryCategories; ++i) bd[std::string(kMemoryCategoryNames[i])] = p.memory.breakdown[i];
  mem["breakdown"] = bd;
  j["memory"] = mem;
  nlohmann::json t;
  t["step_s"] = p.time.step_s;
  t["compute_s"] = p.time.compute_s;
  t["comm_s"] = p.time.comm_s;
  t["exposed_comm_s"] = p.time.exposed_comm_s;
  t["offload_s"] = p.time.offload_s;
  t["exposed_offload_s"] = p.time.exposed_offload_s;
  t["optimizer_s"] = p.time.optimizer_s;
  t["optimizer_phase_s"] = p.time.optimizer_phase_s;
  t["tp_comm_s"] = p.time.tp_comm_s;
  t["pp_comm_s"] = p.time.pp_comm_s;
  t["ep_comm_s"] = p.time.ep_comm_s;
  t["pipeline_bubble_s"] = p.time.pipeline_bubble_s;
  t["pipeline_reduction_chain_s"] = p.time.pipeline_reduction_chain_s;
  j["time"] = t;
  j["throughput"] = {{"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu}, {"tokens_per_step", p.tokens_per_step}};
  j["mfu"] = p.mfu;
  j["attention"] = {{"kernel", p.attention}, {"notes", p.attention_notes}};
  return j;
}

namespace {

// How tensor parallelism splits the attention heads (program/tensor_parallel.hpp): the query heads a rank computes,
// and where the kv heads are fewer than tp each held by tp / kv ranks (Megatron-LM's num_query_groups <
// tensor_model_parallel_size), their k and v projections computed on every rank that holds them.
struct TpHeads {
  int64_t query_per_rank = 0, kv_per_rank = 0, kv_replicas = 1;
};
TpHeads tp_heads(const ModelSpec& m, int64_t tp) {
  TpHeads h;
  h.query_per_rank = m.num_heads / tp;
  h.kv_per_rank = tp_kv_heads_per_rank(m, tp);
  if (m.num_kv_heads > 0 && m.num_kv_heads < tp) h.kv_replicas = tp / m.num_kv_heads;
  return h;
}

}  // namespace

nlohmann::json simulation_to_json(const SimulationContext& ctx, const Prediction& p) {
  nlohmann::json j = prediction_to_json(p);
  if (ctx.strategy.mesh.tp > 1) {
    const TpHeads h = tp_heads(*ctx.model, ctx.strategy.mesh.tp);
    j["tensor_parallel"] = {{"query_heads_per_rank", h.query_per_rank},
                            {"kv_heads_per_rank", h.kv_per_rank},
                            {"kv_head_replicas", h.kv_replicas}};
  }
  j["model"] = {{"name", ctx.model->name}, {"params", p.params}};
  j["hardware"] = {{"name", ctx.hardware->name},
                   {"nodes", ctx.cluster.nodes},
                   {"gpus_per_node", ctx.cluster.gpus_per_node},
                   {"world_size", ctx.cluster.world_size()}};
  j["runtime"] = ctx.runtime->name;
  j["config"] = strategy_to_json(ctx.strategy);
  return j;
}

std::string format_simulation(const SimulationContext& ctx, const Prediction& p, bool color) {
  const char* bold = color ? "\033[1m" : "";
  const char* green = color ? "\033[32m" : "";
  const char* red = color ? "\033[31m" : "";
  const char* reset = color ? "\033[0m" : "";
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%.2fB", static_cast<double>(p.params) / kGB);
  o << bold << "model    " << reset << ctx.model->name << " (" << line << " params, " << ctx.model->num_layers
    << " layers, hidden " << ctx.model->hidden_size << ")\n";
  o << bold << "cluster  " << reset << ctx.cluster.nodes << " x " << ctx.cluster.gpus_per_node << " "
    << ctx.hardware->name << " (" << ctx.cluster.world_size() << " GPUs, "
    << format_gib(ctx.hardware->usable_device_memory.value) << " GiB usable each), runtime " << ctx.runtime->name
    << "\n";
  if (!ctx.hardware->device_is_host() && ctx.cluster.nodes > 1)
    o << bold << "network  " << reset << network_summary(*ctx.hardware) << "\n";
  if (const std::string clocks = clock_summary(*ctx.hardware); !clocks.empty())
    o << bold << "clocks   " << reset << clocks << "\n";
  o << bold << "plan     " << reset << one_line_strategy(ctx.strategy) << "\n";
  if (const int64_t tp = ctx.strategy.mesh.tp; tp > 1) {
    const TpHeads h = tp_heads(*ctx.model, tp);
    o << bold << "heads    " << reset << ctx.model->num_heads << " query heads over tp " << tp << ": "
      << h.query_per_rank << " a rank; " << ctx.model->num_kv_heads << " kv heads: ";
    if (h.kv_replicas > 1)
      o << "fewer than tp, each held by " << h.kv_replicas
        << " ranks (its k and v projections computed on each, Megatron-LM's num_query_groups < tp)\n";
    else
      o << h.kv_per_rank << " a rank\n";
  }
  // What of a vision-language model's vision side trains (Strategy::train_vision), said either way: frameworks differ.
  if (ctx.model->vision) {
    static constexpr const char* kTrained[] = {"tower and projector trained", "projector trained, tower frozen",
                                               "tower and projector frozen"};
    o << bold << "vision   " << reset << kTrained[static_cast<int>(ctx.strategy.train_vision)] << " (--train-vision "
      << to_string(ctx.strategy.train_vision)
      << "; ms-swift's default freezes both: none, LLaVA's fine-tuning trains the projector: projector)\n";
  }
  // The attention kernel the step is priced with (sdpa: the one PyTorch's dispatch chooses, simulate.hpp).
  o << bold << "attention " << reset << (p.attention.empty() ? to_string(ctx.strategy.attention) : p.attention);
  // Packed documents (Strategy::doc_len): each attended on its own, flash attention's varlen kernel.
  if (ctx.strategy.doc_len > 0)
    o << ", packed documents of " << ctx.strategy.doc_len << " tokens attended one by one (varlen)";
  o << "\n";
  for (const std::string& n : p.attention_notes) o << "          " << n << "\n";
  o << "\n";
  o << bold << "memory per GPU at the peak" << reset << " (" << p.memory.peak_phase << ")\n";
  // MiB for the small models of CPU runs, whose peaks would read 0.00 GiB.
  const bool mib = p.memory.device_total < kGiB;
  const double unit = mib ? kMiB : kGiB;
  const char* uname = mib ? "MiB" : "GiB";
  auto amount = [&](double bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", bytes / unit);
    return std::string(b);
  };
  for (size_t i = 0; i < kNumMemoryCategories; ++i) {
    double v = p.memory.breakdown[i];
    if (v <= 0) continue;
    std::snprintf(line, sizeof line, "  %-18s %9s %s\n", std::string(kMemoryCategoryNames[i]).c_str(),
                  amount(v).c_str(), uname);
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-18s %9s %s   (torch max_memory_allocated)\n", "peak allocated",
                amount(p.memory.peak_allocated).c_str(), uname);
  o << line;
  if (p.memory.peak_allocated_floor < p.memory.peak_allocated) {
    std::snprintf(line, sizeof line, "  %-18s %9s %s   (if the backend's gathers end before the compute peaks)\n", "or",
                  amount(p.memory.peak_allocated_floor).c_str(), uname);
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-18s %9s %s   (max_memory_reserved)\n", "peak reserved",
                amount(p.memory.reserved_peak).c_str(), uname);
  o << line;
  std::snprintf(line, sizeof line, "  %-18s %9s %s of %s GiB usable -> ", "device total",
                amount(p.memory.device_total).c_str(), uname, format_gib(p.usable_bytes).c_str());
  o << line << (p.fits ? green : red) << (p.fits ? "fits" : "does NOT fit") << reset << "\n";
  if (p.memory.host_bytes_per_node > 0)
    o << "  host RAM per node " << format_gib(p.memory.host_bytes_per_node) << " GiB"
      << (p.host_fits ? "" : " (exceeds the node's host memory)") << "\n";
  o << "\n" << bold << "step time" << reset << "\n";
  if (ctx.strategy.mesh.pp > 1) {
    // A pipeline's step also idles in the schedule's fill and drain, and waits for the other stages' reductions.
    std::snprintf(line, sizeof line,
                  "  step %.3f s = compute %.3f s + exposed comm %.3f s + exposed offload %.3f s + pipeline bubble "
                  "%.3f s + reduction chain %.3f s  (comm total %.3f s)\n",
                  p.time.step_s, p.time.compute_s, p.time.exposed_comm_s, p.time.exposed_offload_s,
                  p.time.pipeline_bubble_s, p.time.pipeline_reduction_chain_s, p.time.comm_s);
  } else {
    std::snprintf(
        line, sizeof line,
        "  step %.3f s = compute %.3f s + exposed comm %.3f s + exposed offload %.3f s  (comm total %.3f s)\n",
        p.time.step_s, p.time.compute_s, p.time.exposed_comm_s, p.time.exposed_offload_s, p.time.comm_s);
  }
  o << line;
  if (p.time.host_wait_s > 0) {
    // The runtime's host issue time (RuntimeProfile::host_issue): the device idles for the host, counted in compute.
    std::snprintf(line, sizeof line,
                  "  host-bound: compute includes %.3f s of the device waiting for the host to issue\n",
                  p.time.host_wait_s);
    o << line;
  }
  if (const int64_t ep = ctx.strategy.mesh.ep; ep > 1 && ctx.model->moe) {
    // Expert parallelism (program/expert_parallel.hpp): the token all-to-alls wait on the compute stream (in exposed
    // comm).
    std::snprintf(line, sizeof line,
                  "  experts: ep %lld, %lld of the %lld routed experts a layer on each rank; token all-to-alls "
                  "%.3f s\n",
                  static_cast<long long>(ep), static_cast<long long>(ctx.model->moe->num_experts / ep),
                  static_cast<long long>(ctx.model->moe->num_experts), p.time.ep_comm_s);
    o << line;
  }
  if (!ctx.strategy.mesh.is_data_parallel_only()) {
    // The mesh's own time: tp collectives and pipeline transfers wait on the compute stream (in exposed comm); the
    // bubble is the schedule's idle fill and drain.
    const MeshSpec& m = ctx.strategy.mesh;
    std::snprintf(line, sizeof line,
                  "  mesh dp=%lld x tp=%lld x pp=%lld: tp collectives %.3f s, pipeline send-recv %.3f s, pipeline "
                  "bubble %.3f s\n",
                  static_cast<long long>(m.dp(ctx.cluster.world_size())), static_cast<long long>(m.tp),
                  static_cast<long long>(m.pp), p.time.tp_comm_s, p.time.pp_comm_s, p.time.pipeline_bubble_s);
    o << line;
    if (p.time.pipeline_reduction_chain_s > 0) {
      // The other stages' gradient reductions, each after its stage's whole backward, on the drain's path in turn.
      std::snprintf(line, sizeof line,
                    "  pipeline reduction chain %.3f s: the other %lld stages reduce their gradients after their "
                    "backward, each before it sends the last gradient on\n",
                    p.time.pipeline_reduction_chain_s, static_cast<long long>(m.pp - 1));
      o << line;
    }
  }
  std::snprintf(line, sizeof line, "  %.0f tokens/s per GPU, MFU %.1f%%, %.2fM tokens per step\n",
                p.tokens_per_s_per_gpu, p.mfu * 100.0, p.tokens_per_step / kMB);
  o << line;
  return o.str();
}

}  // namespace fsdp
