#include "planfile/plan_file.hpp"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/config_map.hpp"
#include "core/errors.hpp"
#include "memory/memory_category.hpp"
#include "model/model_loader.hpp"

namespace fsdp {

namespace {

template <typename E>
E enum_key(ConfigMap& m, const std::string& key, bool (*parse)(const std::string&, E&), const std::string& allowed) {
  std::string v = m.get_string(key);
  E out{};
  if (!parse(v, out)) m.fail(key, "'" + v + "' is not one of: " + allowed);
  return out;
}

Strategy parse_strategy_map(ConfigMap& m, int64_t version) {
  Strategy s;
  s.kind = enum_key(m, "kind", parse_strategy_kind, "no-shard, ddp, zero1, zero2, zero3, fsdp, fsdp-grad-op, hsdp");
  s.hsdp_group = m.get_int("hsdp_group");
  if (s.hsdp_group < 0) m.fail("hsdp_group", "must not be negative");
  std::string wrap = m.get_string("wrap");
  if (!parse_wrap(wrap, s.wrap))
    m.fail("wrap",
           "'" + wrap +
               "' is not one of: layer, every:K, size:N (a unit of at least N parameters: 100000000 or 100M), model");
  s.reshard_after_forward = m.get_bool("reshard_after_forward");
  {
    const std::string ck = m.get_string("act_ckpt");
    if (!parse_act_ckpt(ck, s)) m.fail("act_ckpt", "'" + ck + "' is not one of: " + kActCkptNames);
  }
  s.offload = enum_key(m, "offload", parse_offload, "none, optimizer, params");
  s.param_dtype = enum_key(m, "param_dtype", parse_dtype, "fp32, bf16, fp16");
  s.reduce_dtype = enum_key(m, "reduce_dtype", parse_dtype, "fp32, bf16, fp16");
  s.master_dtype = enum_key(m, "master_dtype", parse_dtype, "fp32, bf16, fp16");
  s.micro_batch = m.get_positive_int("micro_batch");
  s.seq_len = m.get_positive_int("seq_len");
  s.grad_accum = m.get_positive_int("grad_accum");
  s.attention = enum_key(m, "attention", parse_attention, "flash, flash3, flex, sdpa, eager");
  s.forward_prefetch = m.get_int("forward_prefetch");
  s.backward_prefetch = m.get_int("backward_prefetch");
  if (s.forward_prefetch < 0) m.fail("forward_prefetch", "must not be negative");
  if (s.backward_prefetch < 0) m.fail("backward_prefetch", "must not be negative");
  s.ddp_bucket_mb = m.get_positive_int("ddp_bucket_mb");
  s.method = enum_key(m, "method", parse_method, "full, lora, qlora");
  s.lora.rank = m.get_int("lora_rank");
  s.lora.target_modules = m.get_string_list("lora_targets");
  if (s.method != Method::Full && s.lora.rank <= 0) m.fail("lora_rank", "must be positive with method lora/qlora");
  if (version >= 2) s.grad_sync = enum_key(m, "grad_sync", parse_grad_sync, "every-micro-batch, last-micro-batch");
  if (version >= 3) {
    s.mesh.tp = m.get_positive_int("tp");
    s.mesh.sequence_parallel = m.get_bool("sequence_parallel");
    s.mesh.async_tp = m.get_bool("async_tp");
    s.mesh.pp = m.get_positive_int("pp");
    s.mesh.pp_schedule = enum_key(m, "pp_schedule", parse_pipeline_schedule, kPipelineScheduleNames);
    s.mesh.pp_virtual_stages = m.get_positive_int("pp_virtual_stages");
  }
  if (version >= 4) {
    s.float8 = enum_key(m, "float8", parse_float8, kFloat8Names);
    s.float8_all_gather = m.get_bool("float8_all_gather");
  }
  if (version >= 5) s.train_vision = enum_key(m, "train_vision", parse_vision_training, kVisionTrainingNames);
  if (version >= 6) s.mesh.ep = m.get_positive_int("ep");
  if (version >= 7) {
    s.doc_len = m.get_int("doc_len");
    if (s.doc_len < 0) m.fail("doc_len", "must not be negative (0: one document a sequence)");
  }
  // Optional in every version (absent: none): written only where the plan patches a kernel library in, so that a plan
  // without one reads as before.
  if (m.has("kernels")) s.kernels = enum_key(m, "kernels", parse_kernel_library, kKernelLibraryNames);
  m.finish();
  return s;
}

}  // namespace

PlanFile parse_plan_text(const std::string& text, const std::string& source) {
  ConfigMap root = ConfigMap::load_string(text, source);
  PlanFile p;
  const int64_t version = root.get_int("fsdp_plan_version");
  if (version > kPlanSchemaVersion)
    root.fail("fsdp_plan_version", "the file has schema version " + std::to_string(version) +
                                       " but this build reads up to version " + std::to_string(kPlanSchemaVersion) +
                                       "; upgrade fsdp-plan/fsdp-run");
  if (version < 1) root.fail("fsdp_plan_version", "must be at least 1");
  p.version = static_cast<int>(version);
  {
    ConfigMap model = root.get_map("model");
    p.model_name = model.get_string("name");
    if (model.has("path")) p.model_path = model.get_string("path");
    ConfigMap spec = model.get_map("spec");
    p.model = parse_model_map(spec);
    model.finish();
  }
  {
    ConfigMap c = root.get_map("cluster");
    p.cluster.hardware = c.get_string("hardware");
    p.cluster.device = c.get_enum("device", {"cuda", "cpu"});
    // At most 2^20 nodes and 2^20 ranks per node: beyond any cluster, and the world size stays exact.
    constexpr int64_t kMaxCount = int64_t{1} << 20;
    p.cluster.nodes = c.get_positive_int("nodes");
    if (p.cluster.nodes > kMaxCount) c.fail("nodes", "must be at most 2^20");
    p.cluster.gpus_per_node = c.get_positive_int("gpus_per_node");
    if (p.cluster.gpus_per_node > kMaxCount) c.fail("gpus_per_node", "must be at most 2^20");
    if (c.has("network")) p.cluster.network = c.get_string("network");
    if (c.has("clocks")) p.cluster.clocks = c.get_string("clocks");
    c.finish();
  }
  p.runtime = root.get_string("runtime");
  {
    ConfigMap s = root.get_map("strategy");
    p.strategy = parse_strategy_map(s, version);
  }
  {
    ConfigMap t = root.get_map("training");
    p.strategy.optimizer = enum_key(t, "optimizer", parse_optimizer, "adamw, sgd");
    p.training.lr = t.get_positive_double("lr");
    p.training.beta1 = t.get_double("beta1");
    p.training.beta2 = t.get_double("beta2");
    p.training.eps = t.get_positive_double("eps");
    p.training.weight_decay = t.get_double("weight_decay");
    p.training.grad_clip = t.get_double("grad_clip");
    p.training.momentum = t.get_double("momentum");
    if (p.training.beta1 < 0 || p.training.beta1 >= 1) t.fail("beta1", "must be within [0, 1)");
    if (p.training.beta2 < 0 || p.training.beta2 >= 1) t.fail("beta2", "must be within [0, 1)");
    if (p.training.weight_decay < 0) t.fail("weight_decay", "must not be negative");
    if (p.training.grad_clip < 0) t.fail("grad_clip", "must not be negative (0 disables clipping)");
    t.finish();
  }
  if (root.has("prediction")) {
    ConfigMap pr = root.get_map("prediction");
    PlanPrediction pp;
    pp.peak_bytes = pr.get_double("peak_bytes");
    pp.peak_bytes_floor = pr.has("peak_bytes_floor") ? pr.get_double("peak_bytes_floor") : pp.peak_bytes;
    if (pp.peak_bytes_floor > pp.peak_bytes) pr.fail("peak_bytes_floor", "must not exceed peak_bytes");
    pp.reserved_peak_bytes = pr.get_double("reserved_peak_bytes");
    ConfigMap bd = pr.get_map("memory_breakdown");
    for (const auto& k : bd.keys()) {
      if (!memory_category_from_string(k)) bd.fail(k, "unknown memory category");
      pp.memory_breakdown[k] = bd.get_double(k);
    }
    bd.finish();
    pp.step_s = pr.get_double("step_s");
    pp.compute_s = pr.get_double("compute_s");
    pp.exposed_comm_s = pr.get_double("exposed_comm_s");
    // Absent from plans written before the key (PlanPrediction::optimizer_phase_recorded).
    if (pr.has("optimizer_phase_s"))
      pp.optimizer_phase_s = pr.get_double("optimizer_phase_s");
    else
      pp.optimizer_phase_recorded = false;
    pp.tokens_per_s_per_gpu = pr.get_double("tokens_per_s_per_gpu");
    pr.finish();
    p.prediction = pp;
  }
  if (root.has("commands")) {
    ConfigMap c = root.get_map("commands");
    p.fsdp_run_command = c.get_string("fsdp_run");
    p.torchrun_command = c.get_string("torchrun");
    c.finish();
  }
  root.finish();
  const int64_t world = p.cluster.world_size();
  if (p.strategy.kind == StrategyKind::Hsdp && (p.strategy.hsdp_group <= 0 || world % p.strategy.hsdp_group != 0))
    throw InputError(source + ": key 'strategy.hsdp_group': " + std::to_string(p.strategy.hsdp_group) +
                     " must be positive and divide the world size " + std::to_string(world));
  return p;
}

PlanFile read_plan_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open plan file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_plan_text(ss.str(), path);
}

std::string write_plan_text(const PlanFile& p) {
  YAML::Emitter out;
  out.SetDoublePrecision(10);
  out << YAML::BeginMap;
  out << YAML::Key << "fsdp_plan_version" << YAML::Value << kPlanSchemaVersion;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << p.model_name;
  if (!p.model_path.empty()) out << YAML::Key << "path" << YAML::Value << p.model_path;
  out << YAML::Key << "spec" << YAML::Value;
  emit_model_map(p.model, out);
  out << YAML::EndMap;
  out << YAML::Key << "cluster" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "hardware" << YAML::Value << p.cluster.hardware;
  out << YAML::Key << "device" << YAML::Value << p.cluster.device;
  out << YAML::Key << "nodes" << YAML::Value << p.cluster.nodes;
  out << YAML::Key << "gpus_per_node" << YAML::Value << p.cluster.gpus_per_node;
  if (!p.cluster.network.empty()) out << YAML::Key << "network" << YAML::Value << p.cluster.network;
  if (!p.cluster.clocks.empty()) out << YAML::Key << "clocks" << YAML::Value << p.cluster.clocks;
  out << YAML::EndMap;
  out << YAML::Key << "runtime" << YAML::Value << p.runtime;
  const Strategy& s = p.strategy;
  out << YAML::Key << "strategy" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "kind" << YAML::Value << to_string(s.kind);
  out << YAML::Key << "hsdp_group" << YAML::Value << s.hsdp_group;
  out << YAML::Key << "wrap" << YAML::Value << to_string(s.wrap);
  out << YAML::Key << "reshard_after_forward" << YAML::Value << s.reshard_after_forward;
  out << YAML::Key << "act_ckpt" << YAML::Value << act_ckpt_name(s);
  out << YAML::Key << "offload" << YAML::Value << to_string(s.offload);
  out << YAML::Key << "param_dtype" << YAML::Value << to_string(s.param_dtype);
  out << YAML::Key << "reduce_dtype" << YAML::Value << to_string(s.reduce_dtype);
  out << YAML::Key << "master_dtype" << YAML::Value << to_string(s.master_dtype);
  out << YAML::Key << "micro_batch" << YAML::Value << s.micro_batch;
  out << YAML::Key << "seq_len" << YAML::Value << s.seq_len;
  out << YAML::Key << "doc_len" << YAML::Value << s.doc_len;
  out << YAML::Key << "grad_accum" << YAML::Value << s.grad_accum;
  out << YAML::Key << "attention" << YAML::Value << to_string(s.attention);
  if (s.kernels != KernelLibrary::None) out << YAML::Key << "kernels" << YAML::Value << to_string(s.kernels);
  out << YAML::Key << "forward_prefetch" << YAML::Value << s.forward_prefetch;
  out << YAML::Key << "backward_prefetch" << YAML::Value << s.backward_prefetch;
  out << YAML::Key << "ddp_bucket_mb" << YAML::Value << s.ddp_bucket_mb;
  out << YAML::Key << "method" << YAML::Value << to_string(s.method);
  out << YAML::Key << "lora_rank" << YAML::Value << s.lora.rank;
  out << YAML::Key << "lora_targets" << YAML::Value << YAML::Flow << s.lora.target_modules;
  out << YAML::Key << "grad_sync" << YAML::Value << to_string(s.grad_sync);
  out << YAML::Key << "tp" << YAML::Value << s.mesh.tp;
  out << YAML::Key << "sequence_parallel" << YAML::Value << s.mesh.sequence_parallel;
  out << YAML::Key << "async_tp" << YAML::Value << s.mesh.async_tp;
  out << YAML::Key << "pp" << YAML::Value << s.mesh.pp;
  out << YAML::Key << "pp_schedule" << YAML::Value << to_string(s.mesh.pp_schedule);
  out << YAML::Key << "pp_virtual_stages" << YAML::Value << s.mesh.pp_virtual_stages;
  out << YAML::Key << "ep" << YAML::Value << s.mesh.ep;
  out << YAML::Key << "float8" << YAML::Value << to_string(s.float8);
  out << YAML::Key << "float8_all_gather" << YAML::Value << s.float8_all_gather;
  out << YAML::Key << "train_vision" << YAML::Value << to_string(s.train_vision);
  out << YAML::EndMap;
  out << YAML::Key << "training" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "optimizer" << YAML::Value << to_string(s.optimizer);
  out << YAML::Key << "lr" << YAML::Value << p.training.lr;
  out << YAML::Key << "beta1" << YAML::Value << p.training.beta1;
  out << YAML::Key << "beta2" << YAML::Value << p.training.beta2;
  out << YAML::Key << "eps" << YAML::Value << p.training.eps;
  out << YAML::Key << "weight_decay" << YAML::Value << p.training.weight_decay;
  out << YAML::Key << "grad_clip" << YAML::Value << p.training.grad_clip;
  out << YAML::Key << "momentum" << YAML::Value << p.training.momentum;
  out << YAML::EndMap;
  if (p.prediction) {
    const PlanPrediction& pp = *p.prediction;
    out << YAML::Key << "prediction" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "peak_bytes" << YAML::Value << pp.peak_bytes;
    if (pp.peak_is_range()) out << YAML::Key << "peak_bytes_floor" << YAML::Value << pp.peak_bytes_floor;
    out << YAML::Key << "reserved_peak_bytes" << YAML::Value << pp.reserved_peak_bytes;
    out << YAML::Key << "memory_breakdown" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, v] : pp.memory_breakdown) out << YAML::Key << k << YAML::Value << v;
    out << YAML::EndMap;
    out << YAML::Key << "step_s" << YAML::Value << pp.step_s;
    out << YAML::Key << "compute_s" << YAML::Value << pp.compute_s;
    out << YAML::Key << "exposed_comm_s" << YAML::Value << pp.exposed_comm_s;
    if (pp.optimizer_phase_recorded) out << YAML::Key << "optimizer_phase_s" << YAML::Value << pp.optimizer_phase_s;
    out << YAML::Key << "tokens_per_s_per_gpu" << YAML::Value << pp.tokens_per_s_per_gpu;
    out << YAML::EndMap;
  }
  if (!p.fsdp_run_command.empty()) {
    out << YAML::Key << "commands" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "fsdp_run" << YAML::Value << p.fsdp_run_command;
    out << YAML::Key << "torchrun" << YAML::Value << p.torchrun_command;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void write_plan_file(const PlanFile& plan, const std::string& path) {
  // The directory is created as export creates its --out (export/export_plan.cpp write_export).
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw InputError("--out: cannot create directory '" + parent.string() + "': " + ec.message());
  // Write to a temporary name, then rename: a crash never leaves a half-written plan.
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw InputError("--out: cannot write '" + path + "'");
    out << write_plan_text(plan);
    if (!out) throw InputError("--out: failed writing '" + path + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw InputError("--out: cannot rename into '" + path + "'");
}

}  // namespace fsdp
