#include "validate/published_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/config_map.hpp"
#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "report/prediction_view.hpp"
#include "simulate.hpp"

namespace fsdp {

namespace {

namespace fs = std::filesystem;

constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kBitsPerByte = 8.0;
constexpr double kGiga = 1e9;

// printf into a string, for the table's columns.
template <class... A>
std::string sfmt(const char* format, A... args) {
  const int n = std::snprintf(nullptr, 0, format, args...);
  std::string out(static_cast<size_t>(std::max(n, 0)), '\0');
  std::snprintf(out.data(), out.size() + 1, format, args...);
  return out;
}

// A key whose value the source may not state: null in the file.
bool is_null(const ConfigMap& m, const std::string& key) { return m.has(key) && m.node()[key].IsNull(); }

std::optional<double> nullable_double(ConfigMap& m, const std::string& key) {
  if (is_null(m, key)) {
    m.take_raw(key);
    return std::nullopt;
  }
  return m.get_double(key);
}

std::optional<int64_t> nullable_int(ConfigMap& m, const std::string& key) {
  if (is_null(m, key)) {
    m.take_raw(key);
    return std::nullopt;
  }
  return m.get_positive_int(key);
}

std::string nullable_string(ConfigMap& m, const std::string& key) {
  if (is_null(m, key)) {
    m.take_raw(key);
    return "";
  }
  return m.get_string(key);
}

PublishedRow parse_row(ConfigMap& r, const std::string& source_id, const std::string& file) {
  PublishedRow row;
  row.source_id = source_id;
  row.file = file;
  row.line = r.node().Mark().line + 1;
  row.id = r.get_string("id");
  row.model = r.get_string("model");
  if (r.has("model_shape")) {
    if (!is_null(r, "model_shape"))
      r.fail("model_shape", "give the shape as a model file in tests/accuracy/published/models/ and name it in model");
    r.take_raw("model_shape");
  }
  row.gpu = r.get_string("gpu");
  if (r.has("hw")) row.hw = r.get_string("hw");
  row.power_limit_w = nullable_double(r, "power_limit_w");
  // The GPU count, and how the source splits it into nodes where it says (null: not stated; the row's GPUs are
  // then placed on the profile's servers, and the table says so).
  row.nodes = nullable_int(r, "nodes").value_or(0);
  row.gpus_per_node = nullable_int(r, "gpus_per_node").value_or(0);
  if (r.has("gpus")) row.gpus = r.get_positive_int("gpus");
  if (row.nodes && row.gpus_per_node) {
    if (row.gpus && row.gpus != row.nodes * row.gpus_per_node) r.fail("gpus", "is not nodes x gpus_per_node");
    row.gpus = row.nodes * row.gpus_per_node;
  }
  if (!row.gpus) r.fail("gpus", "the row needs its GPU count: nodes and gpus_per_node, or gpus");
  row.intra_node = nullable_string(r, "intra_node");
  row.nics_per_node = nullable_int(r, "nics_per_node");
  row.nic_bandwidth_gbps = nullable_double(r, "nic_bandwidth_gbps");
  if (r.has("node_bandwidth_gbps")) row.node_bandwidth_gbps = nullable_double(r, "node_bandwidth_gbps");
  if (row.node_bandwidth_gbps && row.nic_bandwidth_gbps)
    r.fail("node_bandwidth_gbps", "give the bandwidth per NIC or per node, not both");
  row.fabric = nullable_string(r, "fabric");
  row.framework = r.get_string("framework");
  row.framework_version = nullable_string(r, "framework_version");
  row.torch_version = nullable_string(r, "torch_version");
  row.runtime = r.get_enum("runtime", {"fsdp2", "fsdp1", "deepspeed", "ddp"});
  row.strategy = nullable_string(r, "strategy");
  row.hsdp_shard_group = nullable_int(r, "hsdp_shard_group");
  if (is_null(r, "compile"))
    r.take_raw("compile");
  else
    row.compile = r.get_bool("compile");
  row.act_ckpt = nullable_string(r, "act_ckpt");
  if (r.has("act_ckpt_inferred")) {
    row.act_ckpt_inferred = r.get_string("act_ckpt_inferred");
    if (row.act_ckpt.empty()) r.fail("act_ckpt_inferred", "says how act_ckpt was inferred, but act_ckpt is null");
  }
  row.param_dtype = nullable_string(r, "param_dtype");
  row.reduce_dtype = nullable_string(r, "reduce_dtype");
  if (r.has("master_dtype")) row.master_dtype = nullable_string(r, "master_dtype");
  if (r.has("kernel_library")) row.kernel_library = nullable_string(r, "kernel_library");
  if (r.has("grad_sync")) row.grad_sync = r.get_enum("grad_sync", {"every-micro-batch", "last-micro-batch"});
  row.fp8 = r.get_bool("fp8");
  if (r.has("runtime_profile")) row.runtime_profile = r.get_string("runtime_profile");
  if (r.has("float8_recipe")) {
    if (is_null(r, "float8_recipe"))
      r.take_raw("float8_recipe");
    else
      row.float8_recipe = r.get_enum("float8_recipe", {"tensorwise", "rowwise"});
  }
  if (r.has("float8_all_gather")) {
    if (is_null(r, "float8_all_gather"))
      r.take_raw("float8_all_gather");
    else
      row.float8_all_gather = r.get_bool("float8_all_gather");
  }
  if (!row.fp8 && (!row.float8_recipe.empty() || row.float8_all_gather))
    r.fail("fp8", "is false, but the row gives float8_recipe or float8_all_gather");
  if (r.has("tp")) row.tp = r.get_positive_int("tp");
  if (r.has("sequence_parallel")) row.sequence_parallel = r.get_bool("sequence_parallel");
  if (r.has("async_tp")) row.async_tp = r.get_bool("async_tp");
  if (r.has("pp")) row.pp = r.get_positive_int("pp");
  if (r.has("pp_schedule")) row.pp_schedule = r.get_enum("pp_schedule", {"gpipe", "1f1b", "interleaved-1f1b"});
  if (r.has("pp_virtual_stages")) row.pp_virtual_stages = r.get_positive_int("pp_virtual_stages");
  if (row.pp > 1 && row.pp_schedule.empty()) r.fail("pp_schedule", "a row with pp > 1 needs its schedule");
  row.micro_batch = nullable_int(r, "micro_batch").value_or(0);
  row.seq = nullable_int(r, "seq").value_or(0);
  row.grad_accum = nullable_int(r, "grad_accum");
  if (r.has("micro_batch_inferred")) {
    row.micro_batch_inferred = r.get_string("micro_batch_inferred");
    if (!row.micro_batch || !row.grad_accum)
      r.fail("micro_batch_inferred", "says how micro_batch and grad_accum were inferred, but one of them is null");
  }
  if (r.has("global_batch_tokens")) nullable_double(r, "global_batch_tokens");
  row.attention = nullable_string(r, "attention");
  row.optimizer = nullable_string(r, "optimizer");
  row.offload = nullable_string(r, "offload");
  ConfigMap m = r.get_map("measured");
  row.measured.tokens_per_s_per_gpu = nullable_double(m, "tokens_per_s_per_gpu");
  row.measured.step_time_s = nullable_double(m, "step_time_s");
  row.measured.mfu = nullable_double(m, "mfu");
  row.measured.tflops_per_gpu = nullable_double(m, "tflops_per_gpu");
  row.measured.peak_memory_gib = nullable_double(m, "peak_memory_gib");
  row.measured.memory_kind = nullable_string(m, "memory_kind");
  if (m.has("step_peak_allocated_gib"))
    row.measured.step_peak_allocated_gib = nullable_double(m, "step_peak_allocated_gib");
  const bool memory_measured = row.measured.peak_memory_gib || row.measured.step_peak_allocated_gib;
  if (row.pp > 1 && memory_measured) {
    if (!m.has("memory_of"))
      m.fail("memory_of", "a pipeline row's memory is one rank's: say whose (first-stage or largest-stage)");
    row.measured.memory_of = m.get_enum("memory_of", {"first-stage", "largest-stage"});
  } else if (m.has("memory_of")) {
    m.fail("memory_of", "only for a row with pipeline stages (pp > 1) and a memory figure");
  }
  if (!row.measured.memory_kind.empty() && row.measured.memory_kind != "reserved" &&
      row.measured.memory_kind != "allocated" && row.measured.memory_kind != "nvidia-smi")
    m.fail("memory_kind", "expected reserved, allocated, nvidia-smi or null, got '" + row.measured.memory_kind + "'");
  m.finish();
  r.get_string("quote");
  if (r.has("notes")) nullable_string(r, "notes");
  if (r.has("cite")) row.cite = r.get_string("cite");
  r.finish();
  return row;
}

PublishedSource parse_source(const fs::path& path) {
  ConfigMap top = ConfigMap::load_file(path.string());
  PublishedSource s;
  s.file = path.string();
  ConfigMap src = top.get_map("source");
  s.id = src.get_string("id");
  if (s.id != path.stem().string()) src.fail("id", "must be the file's name, '" + path.stem().string() + "'");
  s.title = src.get_string("title");
  s.cite = src.get_string("cite");
  s.url = nullable_string(src, "url");
  s.independent_of = src.get_string_list("independent_of");
  src.finish();
  for (ConfigMap& r : top.get_list_of_maps("rows")) s.rows.push_back(parse_row(r, s.id, s.file));
  top.finish();
  return s;
}

// The shipped profile a published GPU is priced with (hwprofiles/); a GPU without one is not simulated.
std::optional<std::string> profile_of_gpu(const std::string& gpu) {
  static const std::map<std::string, std::string> kProfiles = {
      {"a100-40gb-sxm", "a100-40gb"}, {"a100-80gb-sxm", "a100-80gb"},   {"h100-80gb-sxm", "h100-80gb"},
      {"h200-141gb", "h200-141gb"},   {"h200-141gb-sxm", "h200-141gb"}, {"a800-80gb-sxm", "a800-80gb"},
      {"a800-80gb", "a800-80gb"},     {"a100-80gb", "a100-80gb"},       {"a100-40gb", "a100-40gb"},
      {"l40s-48gb", "l40s-48gb"}};
  auto it = kProfiles.find(gpu);
  if (it == kProfiles.end()) return std::nullopt;
  return it->second;
}

// A GPU named without its variant ("4xH100", "four A100 GPUs"): priced with the SXM part of the larger memory, the
// one those sources' servers carry most often (DGX/HGX), and the table says so.
std::optional<std::string> profile_of_unstated_variant(const std::string& gpu) {
  static const std::map<std::string, std::string> kAssumed = {{"a100", "a100-80gb"}, {"h100", "h100-80gb"}};
  auto it = kAssumed.find(gpu);
  if (it == kAssumed.end()) return std::nullopt;
  return it->second;
}

// fsdp-plan's strategy names for the published ones.
std::optional<StrategyKind> strategy_of(const std::string& s) {
  StrategyKind k;
  if (parse_strategy_kind(s, k)) return k;
  return std::nullopt;
}

std::string runtime_file(const std::string& config_root, const std::string& name) {
  return (fs::path(config_root) / "configs" / "runtimes" / (name + ".yaml")).string();
}

// Whether a file is there; a name the OS refuses (too long, say) is not (the non-throwing overload).
bool file_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

}  // namespace

std::vector<PublishedSource> load_published_runs(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
  if (ec) throw InputError(dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<PublishedSource> out;
  std::map<std::string, std::string> seen;  // row id -> file
  for (const auto& f : files) {
    out.push_back(parse_source(f));
    for (const PublishedRow& r : out.back().rows) {
      auto [it, fresh] = seen.emplace(r.id, r.file);
      if (!fresh)
        throw InputError(r.file + ":" + std::to_string(r.line) + ": row id '" + r.id + "' also in " + it->second);
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> load_fitted_rows(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string path = (fs::path(dir) / "fitted.txt").string();
  std::ifstream in(path);
  if (!in) return out;  // nothing fitted on published rows
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string id, constant;
    ls >> id;
    std::getline(ls, constant);
    const size_t start = constant.find_first_not_of(' ');
    if (id.empty() || start == std::string::npos)
      throw InputError(path + ":" + std::to_string(n) + ": expected '<row id> <constant>'");
    out.emplace_back(id, constant.substr(start));
  }
  return out;
}

RowResult evaluate_published_row(const PublishedRow& row, const std::string& config_root) {
  RowResult res;
  res.row = &row;
  auto skip = [&](const std::string& why) {
    res.not_simulated = why;
    return res;
  };
  // A row may name the profile of its cluster (`hw`: a shipped or derived profile, e.g. an AWS instance type);
  // otherwise its GPU's shipped profile.
  // A variant's bandwidths (HBM, NVLink or PCIe) set the step time but not the bytes a step allocates.
  bool variant_unstated = false;
  auto profile = row.hw.empty() ? profile_of_gpu(row.gpu) : std::optional<std::string>(row.hw);
  if (!profile && row.hw.empty()) {
    profile = profile_of_unstated_variant(row.gpu);
    if (profile) {
      res.approximations.push_back("GPU variant not stated: memory priced as " + *profile + ", time not compared");
      variant_unstated = true;
    }
  }
  if (!profile) return skip("no hardware profile for GPU '" + row.gpu + "'");
  if (row.strategy.empty()) return skip("strategy not stated");
  const auto kind = strategy_of(row.strategy);
  if (!kind) return skip("strategy '" + row.strategy + "' is not one of fsdp-plan's");
  Strategy ckpt;  // the row's checkpointing (act_ckpt, ckpt_every, ckpt_fraction)
  if (!row.act_ckpt.empty() && !parse_act_ckpt(row.act_ckpt, ckpt))
    return skip("activation checkpointing '" + row.act_ckpt + "' is not modelled");
  if (!row.offload.empty() && row.offload != "none")
    return skip("offload '" + row.offload + "' rows are not in the set yet");
  // Liger-Kernel's patches (Strategy::kernels, runtime/kernel_library.hpp); no other library is modelled.
  KernelLibrary kernels = KernelLibrary::None;
  if (!row.kernel_library.empty() && !parse_kernel_library(row.kernel_library, kernels))
    return skip("kernel library '" + row.kernel_library + "' is not modelled");
  if (!row.micro_batch) return skip("micro-batch not stated");
  if (!row.seq) return skip("sequence length not stated");
  if (!row.measured.tokens_per_s_per_gpu && !row.measured.step_time_s && !row.measured.peak_memory_gib &&
      !row.measured.step_peak_allocated_gib)
    return skip(row.measured.tflops_per_gpu || row.measured.mfu
                    ? "published as TFLOP/s or MFU only (the source's FLOP count is not ours)"
                    : "no measurement");

  // Hardware: the GPU's shipped profile with the row's network where the source states it.
  HardwareProfile hw = load_hardware(*profile, config_root);
  res.hardware = *profile;
  int64_t gpn = row.gpus_per_node, nodes = row.nodes;
  if (!gpn) {
    gpn = std::min<int64_t>(hw.gpus_per_node, row.gpus);
    nodes = row.gpus / gpn;
    if (nodes * gpn != row.gpus) return skip("GPU count does not fill the profile's servers");
    res.approximations.push_back("nodes not stated: " + std::to_string(gpn) + " GPUs a node");
  } else if (gpn != hw.gpus_per_node) {
    res.approximations.push_back(std::to_string(gpn) + " GPUs per node on a profile of " +
                                 std::to_string(hw.gpus_per_node));
  }
  if (row.nics_per_node) hw.nics_per_node = static_cast<int>(*row.nics_per_node);
  if (row.nic_bandwidth_gbps) hw.inter_node.bandwidth = BytesPerSecond(*row.nic_bandwidth_gbps * kGiga / kBitsPerByte);
  // A bandwidth stated per node: the collective model prices the node's NICs together (nics x bandwidth shared by
  // its GPUs, simulator/comm/collective_cost.cpp), so the profile's NIC count carries an equal share each.
  if (row.node_bandwidth_gbps)
    hw.inter_node.bandwidth =
        BytesPerSecond(*row.node_bandwidth_gbps * kGiga / kBitsPerByte / static_cast<double>(hw.nics_per_node));
  const bool network_stated = row.node_bandwidth_gbps || (row.nics_per_node && row.nic_bandwidth_gbps);
  if (nodes > 1 && !network_stated) res.approximations.push_back("network not stated: the profile's");
  // A stated power limit is priced when the profile describes the same limit with the clock the GPU holds under it
  // (device.power_limit and device.sustained_clock, docs/hardware.md "Clocks and power").
  constexpr double kWattTolerance = 0.5;
  if (row.power_limit_w &&
      !(std::fabs(hw.power_limit.value - *row.power_limit_w) <= kWattTolerance && hw.sustained_clock.value > 0))
    res.approximations.push_back("power limit not modelled");

  // Runtime: the framework's profile; one not shipped yet is priced by its nearest and said.
  std::string rt_name = row.runtime == "deepspeed" ? "deepspeed" : "pytorch";
  // DeepSpeed's engine under Transformers' Trainer (ms-swift's trainers derive from it; accelerate launches it):
  // configs/runtimes/transformers-deepspeed.yaml.
  const bool trainer = row.framework == "ms-swift" || row.framework == "transformers" || row.framework == "accelerate";
  if (row.runtime == "deepspeed" && trainer && file_exists(runtime_file(config_root, "transformers-deepspeed")))
    rt_name = "transformers-deepspeed";
  if (row.runtime == "fsdp1") {
    if (file_exists(runtime_file(config_root, "pytorch-fsdp1")))
      rt_name = "pytorch-fsdp1";
    else
      res.approximations.push_back("FSDP1 priced as FSDP2");
  }
  // PyTorch's FSDP and DDP under Transformers' Trainer (accelerate launches it): transformers-fsdp1.yaml and
  // transformers-fsdp.yaml, which drop the logits before the backward as the Trainer's loop does.
  if (trainer && row.runtime != "deepspeed" && !row.compile) {
    const std::string under_trainer = rt_name == "pytorch-fsdp1" ? "transformers-fsdp1" : "transformers-fsdp";
    if (file_exists(runtime_file(config_root, under_trainer))) rt_name = under_trainer;
  }
  // fms-fsdp's FSDP1 over foundation-model-stack's own LLaMA (configs/runtimes/fms-fsdp.yaml); compiled, below.
  if (row.framework == "fms-fsdp" && row.runtime == "fsdp1" && file_exists(runtime_file(config_root, "fms-fsdp")))
    rt_name = "fms-fsdp";
  // torchtune's recipes over FSDP2, which delete the logits before the backward (configs/runtimes/torchtune.yaml).
  if (row.framework == "torchtune" && row.runtime == "fsdp2" && !row.compile &&
      file_exists(runtime_file(config_root, "torchtune")))
    rt_name = "torchtune";
  // torchtitan's own Llama, loop and FSDP2 setup (configs/runtimes/torchtitan.yaml); with torch.compile,
  // torchtitan-compile.yaml below.
  if (row.framework == "torchtitan" && row.runtime == "fsdp2" && file_exists(runtime_file(config_root, "torchtitan")))
    rt_name = "torchtitan";
  // torch.compile: the runtime's compiled profile, NAME-compile (configs/runtimes/pytorch-compile.yaml,
  // pytorch-fsdp1-compile.yaml: the eager profile with the partitioner's saved set and Inductor's fused kernels);
  // one without (DeepSpeed's engine) is priced as eager and said.
  if (row.compile) {
    const std::string compiled = rt_name + "-compile";
    if (file_exists(runtime_file(config_root, compiled)))
      rt_name = compiled;
    else
      res.approximations.push_back("torch.compile priced as eager");
  }
  // nanotron (DDP and its own ZeRO-1) has its own profile: configs/runtimes/nanotron.yaml.
  if (row.framework == "nanotron") {
    if (file_exists(runtime_file(config_root, "nanotron")))
      rt_name = "nanotron";
    else
      res.approximations.push_back("nanotron's modules priced as PyTorch's");
  }
  if (!row.runtime_profile.empty()) {
    if (!file_exists(runtime_file(config_root, row.runtime_profile)))
      return skip("runtime profile '" + row.runtime_profile + "' is not shipped");
    rt_name = row.runtime_profile;
  }
  RuntimeProfile rt = load_runtime(rt_name, config_root);
  res.runtime = rt_name;

  // Model: a published-set model file (models/ beside the rows), else the zoo.
  const fs::path local = fs::path(row.file).parent_path() / "models" / (row.model + ".yaml");
  ModelSpec spec = load_model(file_exists(local.string()) ? local.string() : row.model, config_root);

  Strategy s;
  s.kind = *kind;
  if (s.kind == StrategyKind::Hsdp) {
    if (!row.hsdp_shard_group) return skip("hsdp without its shard group size");
    s.hsdp_group = *row.hsdp_shard_group;
  }
  s.act_ckpt = ckpt.act_ckpt;
  s.ckpt_every = ckpt.ckpt_every;
  s.ckpt_fraction = ckpt.ckpt_fraction;
  DType pd;
  if (row.param_dtype.empty()) return skip("compute dtype not stated");
  if (!parse_dtype(row.param_dtype, pd)) return skip("param dtype '" + row.param_dtype + "'");
  s.param_dtype = pd;
  if (!row.reduce_dtype.empty()) {
    DType rd;
    if (!parse_dtype(row.reduce_dtype, rd)) return skip("reduce dtype '" + row.reduce_dtype + "'");
    s.reduce_dtype = rd;
  } else if (rt.reduce_in_compute_dtype_by_default) {
    // A runtime whose unconfigured reduction runs in the compute dtype (DeepSpeed's engine): what it does when the
    // source does not say.
    s.reduce_dtype = pd;
    res.approximations.push_back(std::string("reduce dtype not stated: ") + to_string(pd) + ", the runtime's default");
  } else {
    // FSDP's MixedPrecision(param_dtype=bf16) without reduce_dtype reduces in param_dtype (torch FSDP docs);
    // a source that does not say is priced with fp32 reduction and the table says so.
    res.approximations.push_back("reduce dtype not stated: fp32");
  }
  if (!row.master_dtype.empty()) {
    DType md;
    if (!parse_dtype(row.master_dtype, md)) return skip("master dtype '" + row.master_dtype + "'");
    s.master_dtype = md;
  }
  // The row reader has checked the name (get_enum over the same names).
  if (!row.grad_sync.empty()) FSDP_ASSERT(parse_grad_sync(row.grad_sync, s.grad_sync), "grad_sync read strictly");
  s.mesh.tp = row.tp;
  s.mesh.sequence_parallel = row.sequence_parallel;
  s.mesh.async_tp = row.async_tp;
  s.mesh.pp = row.pp;
  if (!row.pp_schedule.empty())
    FSDP_ASSERT(parse_pipeline_schedule(row.pp_schedule, s.mesh.pp_schedule), "pp_schedule read strictly");
  s.mesh.pp_virtual_stages = row.pp_virtual_stages;
  s.micro_batch = row.micro_batch;
  s.seq_len = row.seq;
  s.grad_accum = row.grad_accum.value_or(1);
  if (!row.grad_accum) res.approximations.push_back("accumulation not stated: 1");
  // sdpa rows run PyTorch's dispatch (simulate.hpp resolve_sdpa) with the torch release the row states; the rows
  // state no cuDNN version.
  s.attention = row.attention == "eager" || row.attention == "math" ? AttentionImpl::Eager
                : row.attention == "sdpa"                           ? AttentionImpl::Sdpa
                : row.attention == "flash3"                         ? AttentionImpl::Flash3
                : row.attention == "flex"                           ? AttentionImpl::Flex
                                                                    : AttentionImpl::Flash;
  if (row.attention.empty()) res.approximations.push_back("attention not stated: flash");
  s.kernels = kernels;
  s.optimizer = row.optimizer == "sgd" ? Optimizer::Sgd : Optimizer::AdamW;
  // Float8 linears (torchao): the recipe torchao defaults to (Float8LinearConfig: tensorwise dynamic scaling) and the
  // all-gather torchtitan defaults to (--float8.enable_fsdp_float8_all_gather, store_true: off) where not stated.
  if (row.fp8) {
    if (row.float8_recipe.empty()) {
      s.float8 = Float8Recipe::Tensorwise;
      res.approximations.push_back("float8 recipe not stated: tensorwise, torchao's default");
    } else {
      FSDP_ASSERT(parse_float8(row.float8_recipe, s.float8), "float8_recipe read strictly");
    }
    if (row.float8_all_gather) {
      s.float8_all_gather = *row.float8_all_gather;
    } else {
      res.approximations.push_back("float8 all-gather not stated: off, torchtitan's default");
    }
  }
  s.reshard_after_forward = s.kind != StrategyKind::FsdpGradOp;
  if (row.act_ckpt.empty()) res.approximations.push_back("checkpointing not stated: none");
  if (!row.micro_batch_inferred.empty())
    res.approximations.push_back("micro-batch not stated: " + std::to_string(row.micro_batch) + " x " +
                                 std::to_string(*row.grad_accum) + ", inferred from " + row.micro_batch_inferred);
  if (!row.act_ckpt_inferred.empty())
    res.approximations.push_back("checkpointing not stated: " + row.act_ckpt + ", inferred from " +
                                 row.act_ckpt_inferred);
  if (row.offload.empty()) res.approximations.push_back("offload not stated: none");
  const Cluster cluster{nodes, gpn};
  // A knob combination the simulator refuses (the capability table: float8 under tensor parallelism, say) is a row
  // it does not price, listed with the refusal.
  try {
    validate_strategy(s, spec, cluster, rt.support);
  } catch (const InputError& e) {
    return skip(std::string("refused: ") + e.what());
  }
  ModuleGraph graph(std::move(spec));
  RuntimeProfile row_rt = rt;
  row_rt.cudnn_version.clear();
  row_rt.torch_version.clear();
  if (const std::optional<TorchVersion> tv = parse_torch_version_prefix(row.torch_version))
    row_rt.torch_version = to_string(*tv);
  SimulationInput in{&graph, &hw, &row_rt, cluster, s};
  const Prediction p = simulate(in);
  if (s.attention == AttentionImpl::Sdpa) {
    res.attention = p.attention;
    // What the dispatch assumed for a version the row does not state is a knob priced by a neighbour.
    for (const std::string& n : p.attention_notes) res.approximations.push_back(n);
  }
  res.simulated = true;
  res.fits = p.fits;
  res.breakdown = RowResult::Breakdown{p.time.step_s,
                                       p.time.compute_s,
                                       p.time.comm_s,
                                       p.time.exposed_comm_s,
                                       p.time.contention_s,
                                       p.time.optimizer_phase_s,
                                       p.time.tp_comm_s,
                                       p.time.pp_comm_s,
                                       p.time.pipeline_bubble_s,
                                       p.time.pipeline_reduction_chain_s,
                                       !s.mesh.is_data_parallel_only(),
                                       p.memory.device_total / kBytesPerGiB,
                                       p.usable_bytes / kBytesPerGiB,
                                       p.memory.peak_allocated / kBytesPerGiB,
                                       p.memory.reserved_peak / kBytesPerGiB,
                                       p.memory.peak_phase,
                                       p.memory.breakdown};
  res.plan = sfmt("%s ckpt=%s %s mb=%lldx%lld seq=%lld", to_string(s.kind), act_ckpt_name(s).c_str(),
                  to_string(s.param_dtype), static_cast<long long>(s.micro_batch), static_cast<long long>(s.grad_accum),
                  static_cast<long long>(s.seq_len));
  if (!s.mesh.is_data_parallel_only()) res.plan += " " + mesh_text(s.mesh);
  res.predicted_tokens_per_s = p.tokens_per_s_per_gpu;
  // A data-parallel replica's tokens, shared by its tp x pp GPUs.
  const double tokens_per_gpu_step =
      static_cast<double>(s.micro_batch * s.seq_len * s.grad_accum) / static_cast<double>(s.mesh.model_parallel());
  if (row.measured.tokens_per_s_per_gpu)
    res.measured_tokens_per_s = *row.measured.tokens_per_s_per_gpu;
  else if (row.measured.step_time_s)
    res.measured_tokens_per_s = tokens_per_gpu_step / *row.measured.step_time_s;
  if (res.measured_tokens_per_s && !variant_unstated)
    res.time_error = (*res.predicted_tokens_per_s - *res.measured_tokens_per_s) / *res.measured_tokens_per_s;
  // The stage the figures are of: the plan's memory is its largest stage's; a row logged by the first stage's rank
  // compares that stage's walk (Prediction::first_stage_memory).
  const MemoryResult& mem =
      row.measured.memory_of == "first-stage" && p.first_stage_memory ? *p.first_stage_memory : p.memory;
  if (row.measured.peak_memory_gib) {
    const std::string& k = row.measured.memory_kind;
    const double predicted = k == "allocated"    ? mem.peak_allocated
                             : k == "nvidia-smi" ? mem.device_total
                                                 : mem.reserved_peak;
    res.predicted_memory_gib = predicted / kBytesPerGiB;
    if (k.empty()) res.approximations.push_back("memory kind not stated: compared with reserved");
    res.measured_memory_gib = *row.measured.peak_memory_gib;
    res.memory_error = (*res.predicted_memory_gib - *res.measured_memory_gib) / *res.measured_memory_gib;
  }
  if (row.measured.step_peak_allocated_gib) {
    res.predicted_step_allocated_gib = mem.peak_allocated_after_backward / kBytesPerGiB;
    res.measured_step_allocated_gib = *row.measured.step_peak_allocated_gib;
    res.step_allocated_error =
        (*res.predicted_step_allocated_gib - *res.measured_step_allocated_gib) / *res.measured_step_allocated_gib;
  }
  return res;
}

ErrorSummary summarise(const std::vector<double>& errors) {
  ErrorSummary s;
  s.rows = static_cast<int>(errors.size());
  if (errors.empty()) return s;
  std::vector<double> a;
  for (double e : errors) {
    a.push_back(std::fabs(e));
    s.mean += e / static_cast<double>(errors.size());
  }
  std::sort(a.begin(), a.end());
  const size_t n = a.size();
  s.median_abs = n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
  s.max_abs = a.back();
  return s;
}

ValidationReport validate_published(const std::string& dir, const std::string& config_root) {
  ValidationReport rep;
  rep.sources = load_published_runs(dir);
  std::set<std::string> fitted_time, fitted_memory;
  for (const auto& [id, constant] : load_fitted_rows(dir)) {
    if (constant.rfind("memory:", 0) != 0) fitted_time.insert(id);
    if (constant.rfind("time:", 0) != 0) fitted_memory.insert(id);
  }
  for (const PublishedSource& src : rep.sources)
    for (const PublishedRow& row : src.rows) {
      RowResult r = evaluate_published_row(row, config_root);
      r.fitted_time = fitted_time.count(row.id) > 0;
      r.fitted_memory = fitted_memory.count(row.id) > 0;
      r.fitted = r.fitted_time || r.fitted_memory;
      rep.results.push_back(std::move(r));
    }
  return rep;
}

namespace {

std::string pct(const std::optional<double>& e) { return e ? sfmt("%+.1f%%", *e * 100.0) : "-"; }
std::string num(const std::optional<double>& v, const char* f) { return v ? sfmt(f, *v) : "-"; }

std::string summary_line(const char* what, const ErrorSummary& s) {
  if (s.rows == 0) return sfmt("  %-34s no rows\n", what);
  return sfmt("  %-34s %3d rows  median |error| %5.1f%%  max %5.1f%%  mean %+5.1f%%\n", what, s.rows,
              s.median_abs * 100.0, s.max_abs * 100.0, s.mean * 100.0);
}

}  // namespace

namespace {

// The goals for a row (issue M12): step time within 10%, peak memory within 8%.
constexpr double kTimeGoal = 0.10;
constexpr double kMemoryGoal = 0.08;

std::string within_line(const std::vector<double>& errors, double goal) {
  const auto n = std::count_if(errors.begin(), errors.end(), [&](double e) { return std::fabs(e) <= goal; });
  return sfmt("  %-34s %3lld of %d rows\n", sfmt("within %.0f%%", goal * 100.0).c_str(), static_cast<long long>(n),
              static_cast<int>(errors.size()));
}

}  // namespace

std::string format_validation_summary(const ValidationReport& r) {
  std::vector<double> time_all, time_held, time_exact, mem_all, mem_held, mem_exact, step_alloc;
  std::map<std::string, std::vector<double>> time_by_source, mem_by_source;
  for (const RowResult& x : r.results) {
    if (!x.simulated) continue;
    const std::string& src = x.row->source_id;
    if (x.time_error) {
      time_all.push_back(*x.time_error);
      time_by_source[src].push_back(*x.time_error);
      if (!x.fitted_time) time_held.push_back(*x.time_error);
      if (x.approximations.empty()) time_exact.push_back(*x.time_error);
    }
    if (x.memory_error) {
      mem_all.push_back(*x.memory_error);
      mem_by_source[src].push_back(*x.memory_error);
      if (!x.fitted_memory) mem_held.push_back(*x.memory_error);
      if (x.approximations.empty()) mem_exact.push_back(*x.memory_error);
    }
    if (x.step_allocated_error) step_alloc.push_back(*x.step_allocated_error);
  }
  std::ostringstream o;
  auto block = [&](const char* title, const std::vector<double>& all, const std::vector<double>& held,
                   const std::vector<double>& exact, double goal,
                   const std::map<std::string, std::vector<double>>& by_source) {
    o << title << "\n";
    o << summary_line("all rows", summarise(all));
    o << summary_line("held out (no constant fitted on)", summarise(held));
    o << summary_line("every knob stated and modelled", summarise(exact));
    o << within_line(all, goal);
    for (const auto& [src, e] : by_source) o << summary_line(("  " + src).c_str(), summarise(e));
  };
  block("step time (tokens/s per GPU, predicted vs measured)", time_all, time_held, time_exact, kTimeGoal,
        time_by_source);
  block("peak memory", mem_all, mem_held, mem_exact, kMemoryGoal, mem_by_source);
  // A second memory measurement of some rows, apart from the peak: the step window's allocated peak.
  if (!step_alloc.empty()) {
    o << "peak allocated after the backward (gradient sync, clipping, optimizer step, ZeRO's parameter gather)\n";
    o << summary_line("all rows", summarise(step_alloc));
  }
  return o.str();
}

std::string format_validation(const ValidationReport& r) {
  std::ostringstream o;
  o << sfmt("%-16s %-44s %5s %-40s %9s %9s %7s %8s %8s %7s\n", "source", "row", "GPUs", "priced as", "pred tok/s",
            "meas", "error", "pred GiB", "meas", "error");
  std::vector<const RowResult*> skipped;
  for (const RowResult& x : r.results) {
    const PublishedRow& row = *x.row;
    if (!x.simulated) {
      skipped.push_back(&x);
      continue;
    }
    o << sfmt("%-16s %-44s %5lld %-40s %9s %9s %7s %8s %8s %7s%s\n", row.source_id.c_str(), row.id.c_str(),
              static_cast<long long>(row.gpus), x.plan.c_str(), num(x.predicted_tokens_per_s, "%.0f").c_str(),
              num(x.measured_tokens_per_s, "%.0f").c_str(), pct(x.time_error).c_str(),
              num(x.predicted_memory_gib, "%.1f").c_str(), num(x.measured_memory_gib, "%.1f").c_str(),
              pct(x.memory_error).c_str(), x.fitted ? "  [fitted]" : "");
    if (!x.approximations.empty()) {
      o << "  " << std::string(16, ' ') << "priced with " << x.hardware << " / " << x.runtime << "; ";
      for (size_t i = 0; i < x.approximations.size(); ++i) o << (i ? "; " : "") << x.approximations[i];
      o << "\n";
    }
    if (!x.attention.empty()) o << "  " << std::string(16, ' ') << "attention " << x.attention << "\n";
    if (!x.fits) o << "  " << std::string(16, ' ') << "(predicted not to fit the GPU)\n";
  }
  // The rows with the step window's allocated peak measured too, one line each.
  std::ostringstream step_rows;
  for (const RowResult& x : r.results)
    if (x.step_allocated_error)
      step_rows << sfmt("  %-16s %-44s %8.2f %8.2f %7s\n", x.row->source_id.c_str(), x.row->id.c_str(),
                        *x.predicted_step_allocated_gib, *x.measured_step_allocated_gib,
                        pct(x.step_allocated_error).c_str());
  if (!step_rows.str().empty()) {
    o << "\npeak allocated after the backward (gradient sync, clipping, optimizer step, ZeRO's parameter gather)\n";
    o << sfmt("  %-16s %-44s %8s %8s %7s\n", "source", "row", "pred GiB", "meas", "error") << step_rows.str();
  }
  o << "\n" << format_validation_summary(r);
  if (!skipped.empty()) {
    o << sfmt("\nnot simulated (%zu rows: a knob they state is not modelled)\n", skipped.size());
    for (const RowResult* x : skipped)
      o << sfmt("  %-16s %-44s %s\n", x->row->source_id.c_str(), x->row->id.c_str(), x->not_simulated.c_str());
  }
  return o.str();
}

}  // namespace fsdp
