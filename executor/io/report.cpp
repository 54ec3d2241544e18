// The measured report of fsdp-run (issue 5): plan identity, world size, steps,
// measured memory by simulator category, and the plan's prediction next to it.
#include <nlohmann/json.hpp>

#include "dist/device.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec {

std::string report_json(const PlanFile& plan, const RunConfig& cfg, const RunResult& r) {
  using nlohmann::json;
  json j;
  j["tool"] = "fsdp-run";
  j["plan"] = {{"path", cfg.plan_path},
               {"version", plan.version},
               {"model", plan.model.name},
               {"hardware", plan.cluster.hardware},
               {"device", plan.cluster.device},
               {"strategy", to_string(plan.strategy.kind)},
               {"wrap", to_string(plan.strategy.wrap)},
               {"act_ckpt", act_ckpt_name(plan.strategy)},
               {"param_dtype", to_string(plan.strategy.param_dtype)},
               {"reduce_dtype", to_string(plan.strategy.reduce_dtype)},
               {"micro_batch", plan.strategy.micro_batch},
               {"seq_len", plan.strategy.seq_len},
               {"grad_accum", plan.strategy.grad_accum},
               {"tp", plan.strategy.mesh.tp},
               {"sequence_parallel", plan.strategy.mesh.tp > 1 && plan.strategy.mesh.sequence_parallel},
               {"pp", plan.strategy.mesh.pp},
               {"pp_schedule", to_string(plan.strategy.mesh.pp_schedule)},
               {"attention", to_string(r.attention_ran)}};
  // A plan priced with an attention this build does not have (model/transformer.hpp executed_attention): what it
  // asked for, beside what ran; `plan` and `prediction` here are those of what ran (cli/main.cpp).
  if (r.attention_planned != r.attention_ran) {
    j["plan"]["attention_planned"] = to_string(r.attention_planned);
    j["attention_note"] = std::string("the plan's attention ") + to_string(r.attention_planned) + " ran as " +
                          to_string(r.attention_ran) + ": this LibTorch has no fused attention";
  }
  j["world_size"] = r.world_size;
  j["emulated"] = r.emulated;
  j["num_params"] = r.num_params;
  j["seed"] = cfg.seed;
  j["data"] = cfg.data;
  if (r.resumed_from > 0) j["resumed_from_step"] = r.resumed_from;
  json steps = json::array();
  for (const auto& s : r.steps) {
    json e = {{"step", s.step},
              {"loss", s.loss},
              {"time_s", s.time_s},
              {"comm_wait_s", s.comm_wait_s},
              {"optimizer_phase_s", s.optimizer_phase_s},
              {"tokens_per_s", s.tokens_per_s},
              {"grad_norm", s.grad_norm}};
    if (s.skipped) e["skipped"] = true;
    steps.push_back(e);
  }
  j["steps"] = steps;
  json bd = json::object();
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (r.breakdown[i] != 0) bd[std::string(kMemoryCategoryNames[i])] = r.breakdown[i];
  j["memory"] = {{"peak_bytes", r.peak_bytes},
                 {"peak_bytes_per_rank", r.peak_bytes_per_rank},
                 {"peak_phase", r.peak_phase},
                 {"breakdown", bd},
                 {"measured_with", plan.cluster.device == "cuda" ? "CUDA caching allocator statistics (allocated)"
                                                                 : "counting wrapper of the c10 CPU allocator"},
                 {"breakdown_note",
                  "tagged executor buffers at the peak; the untagged rest is activations (during forward/backward) "
                  "or transient"}};
  j["comm"] = {
      {"backend", r.backend},
      {"communicated_in_fp32", r.comm_upcast},
      {"note", r.comm_upcast ? "the backend lacks the plan's dtype for some collectives; they ran in fp32" : ""}};
  // The last step as the simulator's step program describes one (program/step_trace.hpp), for
  // `fsdp-plan compare`'s collectives section.
  json entries = json::array();
  for (const TraceEntry& e : r.trace) entries.push_back(trace_entry_json(e));
  j["step_trace"] = {
      {"step", r.steps.empty() ? 0 : r.steps.back().step}, {"units", r.unit_names}, {"entries", entries}};
  // The CPU allocator's policy shapes CPU step times (configure_host_allocator, dist/device.hpp).
  if (plan.cluster.device == "cpu") j["host_allocator"] = host_allocator_policy();
  if (r.loss_scale > 0) j["loss_scale"] = r.loss_scale;
  if (plan.prediction) {
    const auto& p = *plan.prediction;
    json pj = {{"peak_bytes", p.peak_bytes}, {"step_s", p.step_s}, {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu}};
    pj["memory_breakdown"] = p.memory_breakdown;
    j["prediction"] = pj;
    if (p.peak_bytes > 0) j["measured_over_predicted_peak"] = static_cast<double>(r.peak_bytes) / p.peak_bytes;
  }
  return j.dump(2);
}

}  // namespace fsdp::exec
