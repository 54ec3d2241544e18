#include "cli/plan_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/strategy_flags.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"
#include "core/unit_parse.hpp"
#include "export/export_plan.hpp"
#include "export/target_search.hpp"
#include "model/model_loader.hpp"
#include "planfile/plan_file.hpp"
#include "report/html_report.hpp"
#include "report/plan_report.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"
#include "report/sweep_report.hpp"
#include "report/trace_writer.hpp"
#include "search/plan_search.hpp"

namespace fsdp {

namespace {

// --nodes 2,4,8: each a node count of at least 1, ascending, each once.
std::vector<int64_t> node_list(const std::string& text) {
  std::vector<int64_t> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    int64_t n = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || n < 1)
      throw InputError("--nodes: '" + text + "': each size of a sweep must be a node count of at least 1, got '" +
                       item + "'");
    out.push_back(n);
    start = end + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Defaults of `fsdp-plan` (README "Planner defaults").
constexpr const char* kDefaultHardware = "a100-80gb";
constexpr const char* kDefaultRuntime = "fsdp-run";
constexpr int64_t kDefaultSeq = 4096;
constexpr double kDefaultGlobalBatchTokens = 4194304;  // 4M tokens: Llama 2 paper (arXiv 2307.09288) sec. 2.2
constexpr double kDefaultHeadroom = 0.05;
constexpr int64_t kMaxAutoNodes = 4096;

SearchPins pins_from(const Args& a, const Strategy& s) {
  SearchPins p;
  if (a.has("--strategy")) p.strategy = s.kind;
  if (a.has("--wrap")) p.wrap = s.wrap;
  if (a.has("--reshard-after-forward")) p.reshard_after_forward = s.reshard_after_forward;
  if (a.has("--act-ckpt")) {
    p.act_ckpt = s.act_ckpt;
    p.ckpt_every = s.ckpt_every;
    p.ckpt_fraction = s.ckpt_fraction;
  }
  if (a.has("--offload")) p.offload = s.offload;
  if (a.has("--param-dtype")) p.param_dtype = s.param_dtype;
  if (a.has("--reduce-dtype")) p.reduce_dtype = s.reduce_dtype;
  if (a.has("--micro-batch")) p.micro_batch = s.micro_batch;
  if (a.has("--grad-accum")) p.grad_accum = s.grad_accum;
  if (a.has("--hsdp-group")) p.hsdp_group = s.hsdp_group;
  if (a.has("--tp")) p.tp = s.mesh.tp;
  if (a.has("--pp")) p.pp = s.mesh.pp;
  if (a.has("--ep")) p.ep = s.mesh.ep;
  return p;
}

// A variant of the chosen plan the search does not try, simulated: nullopt where the capability table refuses it.
std::optional<std::pair<Strategy, Prediction>> what_if(const ModuleGraph& graph, const HardwareProfile& hw,
                                                       const RuntimeProfile& rt, const Cluster& cluster,
                                                       const Strategy& s) {
  try {
    validate_strategy(s, graph.spec(), cluster, rt.support);
    return std::pair{s, simulate(SimulationInput{&graph, &hw, &rt, cluster, s})};
  } catch (const InputError&) {
    return std::nullopt;
  }
}

// The chosen plan with float8 linears (torchao tensorwise, with FSDP2's float8 all-gather where the plan gathers
// parameters and the runtime does it), when the user left --float8 out, the runtime runs float8 and the GPU has FP8
// tensor cores: what the search does not try, since float8 changes the numerics (docs/hardware.md "Float8 linears").
// nullopt where any of that does not hold or the capability table refuses it.
std::optional<std::pair<Strategy, Prediction>> float8_what_if(const ModuleGraph& graph, const HardwareProfile& hw,
                                                              const RuntimeProfile& rt, const Cluster& cluster,
                                                              const Strategy& chosen) {
  if (chosen.float8 != Float8Recipe::None || !rt.support.float8_linears || float8_hardware_refusal(hw))
    return std::nullopt;
  Strategy s = chosen;
  s.float8 = Float8Recipe::Tensorwise;
  s.float8_all_gather = rt.support.float8_all_gather && fsdp_family(s.kind);
  return what_if(graph, hw, rt, cluster, s);
}

// The chosen plan with FlashAttention-3 in place of FlashAttention-2, when the user left --attention out, the runtime
// calls FA3 and the GPU is a Hopper its profile prices it on: a kernel the user installs (flash-attention's hopper/
// build), so not searched (docs/hardware.md "Attention kernels").
std::optional<std::pair<Strategy, Prediction>> flash3_what_if(const ModuleGraph& graph, const HardwareProfile& hw,
                                                              const RuntimeProfile& rt, const Cluster& cluster,
                                                              const Strategy& chosen) {
  if (chosen.attention != AttentionImpl::Flash || !rt.support.flash_attention_3 ||
      attention_hardware_refusal(hw, AttentionImpl::Flash3))
    return std::nullopt;
  Strategy s = chosen;
  s.attention = AttentionImpl::Flash3;
  return what_if(graph, hw, rt, cluster, s);
}

// The chosen plan with Liger-Kernel's patches (--kernels liger), when the user left --kernels out, the runtime applies
// them and Liger has a patch for the model: a library the user installs, so not searched (runtime/kernel_library.hpp).
std::optional<std::pair<Strategy, Prediction>> liger_what_if(const ModuleGraph& graph, const HardwareProfile& hw,
                                                             const RuntimeProfile& rt, const Cluster& cluster,
                                                             const Strategy& chosen) {
  if (chosen.kernels != KernelLibrary::None || !rt.support.liger_kernel || hw.device_is_host()) return std::nullopt;
  Strategy s = chosen;
  s.kernels = KernelLibrary::Liger;
  return what_if(graph, hw, rt, cluster, s);
}

// A what-if the plan report ends with: its JSON key, what it is and why it was not searched, the flags that ask for it,
// where it is documented, and the chosen plan so varied and simulated.
struct WhatIf {
  const char* json_key;
  std::string label, flags;
  const char* doc;
  std::pair<Strategy, Prediction> plan;
};

std::string shell_quote(const std::string& s) {
  if (s.find_first_of(" '\"$\\") == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A count of tokens given to `flag` (a number, or K, M, B, T: 4M, 2T), positive.
double token_count(const std::string& flag, const std::string& text) {
  const auto v = parse_count(text);
  if (!v || *v <= 0)
    throw InputError(flag + ": expected a positive count of tokens (a number, or K, M, B, T: 4M, 2T), got '" + text +
                     "'");
  return *v;
}

}  // namespace

double training_tokens(const Args& args) {
  const auto text = args.get("--tokens");
  return text ? token_count("--tokens", *text) : 0.0;
}

std::set<std::string> plan_value_flags() {
  std::set<std::string> values{"--model",
                               "--hw",
                               "--nodes",
                               "--gpus-per-node",
                               "--gpus",
                               "--runtime",
                               "--objective",
                               "--tokens",
                               "--memory-headroom",
                               "--top",
                               "--out",
                               "--trace",
                               "--config-root",
                               "--image-tokens",
                               "--global-batch-tokens",
                               "--max-micro-batch"};
  for (const auto& f : strategy_value_flags()) values.insert(f);
  values.insert("--html");
  values.insert("--target");
  values.insert("--target-version");
  return values;
}

std::set<std::string> plan_switch_flags() { return {"--json", "--help", "--no-out"}; }

int run_plan(const std::vector<std::string>& argv) {
  Args args(argv, plan_value_flags(), plan_switch_flags());
  if (args.has("--help")) {
    std::cout
        << "usage: fsdp-plan --model M [--nodes N|auto|N1,N2,.. | --gpus N] [--hw H] [--seq S] [--global-batch-tokens "
           "T]\n"
           "                 [--objective throughput|memory|cost] [--tokens N] [--memory-headroom F] [--top N]\n"
           "                 [--runtime R] [--out plan.yaml | --no-out] [--json] [--trace FILE] [--html FILE]\n"
           "                 [--target fsdp-run|torchtitan|deepspeed|accelerate|swift|torchtune [--target-version V]]\n"
           "                 [--image-tokens N]   (a vision-language model's image tokens per sample)\n"
           "                 [--gpus-per-node G] [--max-micro-batch B] [--config-root DIR]\n"
           "                 [pins: --strategy S --wrap W --act-ckpt A --offload O --param-dtype D --micro-batch "
           "B ...]\n"
        << strategy_flags_help("                 ", 110)
        << "       fsdp-plan simulate ...      one configuration (see fsdp-plan simulate --help)\n"
        << "       fsdp-plan show plan.yaml [--html FILE]    print a plan file (or draw it)\n"
           "       fsdp-plan export plan.yaml --to TARGET [--target-version V] [--out DIR]\n"
           "       fsdp-plan compare plan.yaml report.json [--json] [--html FILE]   prediction vs fsdp-run's "
           "measured run\n"
           "       fsdp-plan validate [DIR] [--summary | --breakdown TEXT]   the published runs, predicted vs "
           "measured\n"
           "       fsdp-plan --list-models | --list-hardware | --list-targets\n";
    return 0;
  }
  if (!args.positional().empty()) throw InputError("unexpected argument '" + args.positional()[0] + "'");
  const std::string root = config_root_from(argv);
  auto model_name = args.get("--model");
  if (!model_name) throw InputError("--model: required (e.g. --model 70b; fsdp-plan --list-models lists the zoo)");
  ModelSpec model = load_model(*model_name, root);
  const std::string model_path = hf_model_directory(*model_name);
  apply_image_tokens_flag(args, model);
  HardwareProfile hw = load_hardware(args.get_or("--hw", kDefaultHardware), root);
  // --target: the framework the plan is launched with; its runtime profile predicts it (configs/targets).
  std::optional<TargetSpec> target;
  if (auto t = args.get("--target")) {
    target = load_target_spec(root, *t, args.get_or("--target-version", "")).for_model(model.name);
    if (args.has("--runtime") && args.get_or("--runtime", "") != target->runtime)
      throw InputError("--runtime: " + target->target + " " + target->version + " is predicted with runtime " +
                       target->runtime + " (" + target->spec_path + "); drop --runtime or --target");
  } else if (args.has("--target-version")) {
    throw InputError("--target-version: needs --target");
  }
  RuntimeProfile rt = load_runtime(target ? target->runtime : args.get_or("--runtime", kDefaultRuntime), root);
  validate_profiles(hw, rt);
  Strategy base;
  base.seq_len = kDefaultSeq;
  apply_default_seq(args, model, base);
  apply_strategy_flags(args, base);
  apply_runtime_defaults(args, rt, base);
  check_grad_sync_runtime(base, rt);
  SearchRequest req;
  ModuleGraph graph(model);
  check_lora_targets(base, graph);
  req.graph = &graph;
  req.hardware = &hw;
  req.runtime = &rt;
  req.base = base;
  req.pins = pins_from(args, base);
  std::vector<std::string> target_notes;
  if (base.grad_sync == GradSync::LastMicroBatch)
    std::cerr << "note: --grad-sync last-micro-batch applies to the fsdp, fsdp-grad-op and hsdp plans without "
                 "offload; the others reduce as they do without it\n";
  // A key the program does not apply is said: replicated strategies compute and reduce per decoder layer
  // whatever the wrap (program/wrap_units.hpp strategy_units).
  if (req.pins.wrap && req.pins.wrap->kind != WrapKind::Layer) {
    if (req.pins.strategy && !shards_params(*req.pins.strategy))
      std::cerr << "note: --wrap " << to_string(*req.pins.wrap) << " does not apply to "
                << to_string(*req.pins.strategy)
                << ": replicated strategies compute and reduce one decoder layer at a time\n";
    else if (!req.pins.strategy)
      std::cerr
          << "note: --wrap " << to_string(*req.pins.wrap)
          << " applies to the sharded strategies; ddp, no-shard, zero1 and zero2 use one decoder layer per unit\n";
  }
  const auto batch_text = args.get("--global-batch-tokens");
  req.global_batch_tokens = batch_text ? token_count("--global-batch-tokens", *batch_text) : kDefaultGlobalBatchTokens;
  req.memory_headroom = args.get_double_or("--memory-headroom", kDefaultHeadroom);
  if (req.memory_headroom < 0 || req.memory_headroom >= 1)
    throw InputError("--memory-headroom: must be within [0, 1), got " + args.get_or("--memory-headroom", ""));
  req.max_micro_batch = args.get_int_or("--max-micro-batch", 64);
  if (req.max_micro_batch <= 0) throw InputError("--max-micro-batch: must be at least 1");
  std::string objective = args.get_or("--objective", "throughput");
  if (objective == "throughput") {
    req.objective = Objective::Throughput;
  } else if (objective == "memory") {
    req.objective = Objective::Memory;
  } else if (objective == "cost") {
    req.objective = Objective::Cost;
    if (!args.has("--tokens"))
      throw InputError("--tokens: --objective cost needs the number of training tokens (e.g. --tokens 2T)");
  } else {
    throw InputError("--objective: '" + objective + "' is not one of: throughput, memory, cost");
  }
  // The training run's tokens: the chosen plan's GPU-hours and days (every objective), the cost objective's score.
  req.train_tokens = training_tokens(args);
  int top = static_cast<int>(args.get_int_or("--top", 10));
  if (top <= 0) throw InputError("--top: must be at least 1");
  req.keep_top = top;

  // Cluster: --gpus N, or --nodes N|auto with --gpus-per-node.
  int64_t gpn = args.get_int_or("--gpus-per-node", hw.gpus_per_node);
  if (gpn <= 0) throw InputError("--gpus-per-node: must be at least 1, got " + std::to_string(gpn));
  std::string nodes_arg = args.get_or("--nodes", "1");
  bool auto_nodes = nodes_arg == "auto";
  // --nodes 2,4,8,16: the search at each size (report/sweep_report.hpp).
  const std::vector<int64_t> sweep =
      nodes_arg.find(',') != std::string::npos ? node_list(nodes_arg) : std::vector<int64_t>{};
  if (!sweep.empty()) {
    for (const char* flag : {"--out", "--target", "--target-version", "--html", "--trace"})
      if (args.has(flag))
        throw InputError(std::string(flag) + ": a --nodes sweep (" + nodes_arg +
                         ") writes no plan, report or trace file; give one --nodes for it");
  }
  Cluster cluster;
  cluster.gpus_per_node = gpn;
  if (args.has("--gpus")) {
    if (args.has("--nodes")) throw InputError("--gpus: give either --gpus or --nodes, not both");
    int64_t gpus = args.get_int_or("--gpus", 1);
    if (gpus <= 0) throw InputError("--gpus: must be at least 1, got " + std::to_string(gpus));
    if (gpus < gpn) {
      cluster.gpus_per_node = gpus;
      cluster.nodes = 1;
    } else {
      if (gpus % gpn != 0)
        throw InputError("--gpus: " + std::to_string(gpus) + " is not a multiple of " + std::to_string(gpn) +
                         " GPUs per node; pass --gpus-per-node to match your nodes");
      cluster.nodes = gpus / gpn;
    }
  } else if (!auto_nodes && sweep.empty()) {
    cluster.nodes = args.get_int_or("--nodes", 1);
    if (cluster.nodes <= 0) throw InputError("--nodes: must be at least 1 (or 'auto'), got " + nodes_arg);
  }
  // The knobs themselves on a cluster (the HSDP group is checked against each searched world size).
  auto check_pins = [&](const Cluster& on, bool world_known) {
    Strategy check = base;
    check.hsdp_group = 0;
    if (check.kind == StrategyKind::Hsdp) check.kind = StrategyKind::Fsdp;
    // The accumulation, unless pinned, is the search's (the global batch over the micro-batch and the data-parallel
    // ranks): a rule on it (interleaved 1F1B's micro-batches a multiple of pp) is checked per searched plan, not on
    // the default of 1 here.
    if (!req.pins.grad_accum) check.grad_accum = std::max<int64_t>(1, check.mesh.pp);
    // A strategy, offload mode or checkpointing the user left to the search is the search's to keep to what the
    // runtime runs (`check` holds the defaults there, not what a target may have pinned in req).
    RuntimeSupport support = rt.support;
    if (!args.has("--strategy")) support.strategies.clear();
    if (!args.has("--offload")) support.offloads.clear();
    if (!args.has("--act-ckpt")) support.ckpt_policies.clear();
    if (!args.has("--wrap")) support.wraps.clear();
    validate_strategy(check, model, on, support);
    if (world_known && req.pins.hsdp_group && on.world_size() % *req.pins.hsdp_group != 0)
      throw InputError("--hsdp-group: " + std::to_string(*req.pins.hsdp_group) + " does not divide the world size " +
                       std::to_string(on.world_size()));
  };
  // Under --target its knob table checks the pins first (restrict_search: the knob, its source and the nearest plan
  // the target runs), then the runtime's capability table as without one.
  if (target) {
    req.cluster = auto_nodes ? Cluster{1, gpn} : cluster;
    target_model(*target, model.name, model_path);  // a model the target cannot name is refused before the search
    target_notes = restrict_search(
        *target, [&](const std::string& f) { return args.has(f); }, req);
  }
  if (sweep.empty()) check_pins(auto_nodes ? Cluster{1, gpn} : cluster, !auto_nodes);
  check_trained_length(model, base.seq_len, args.has("--seq") ? "--seq" : "the default --seq");
  if (target) {
    std::cerr << "target: " << target->writes_for << ", predicted with runtime " << target->runtime << "\n";
    for (const auto& n : target_notes) std::cerr << "  " << n << "\n";
  }

  if (!sweep.empty()) {
    std::vector<SweepPoint> points;
    for (int64_t n : sweep) {
      SweepPoint pt;
      pt.cluster = Cluster{n, gpn};
      try {
        check_pins(pt.cluster, true);
      } catch (const InputError& e) {
        pt.refused = e.what();
      }
      if (pt.refused.empty()) {
        req.cluster = pt.cluster;
        pt.result = search_plans(req);
      }
      points.push_back(std::move(pt));
    }
    // Pins no size can run (a --tp that divides no node's GPUs, a --pp deeper than the model): bad input, said once.
    if (std::none_of(points.begin(), points.end(), [](const SweepPoint& pt) { return pt.result.has_value(); }))
      throw InputError(points.front().refused);
    PlanReportContext ctx{&model,
                          &hw,
                          &rt,
                          Cluster{sweep.front(), gpn},
                          top,
                          objective,
                          req.global_batch_tokens,
                          req.train_tokens,
                          graph.total_params()};
    if (args.has("--json"))
      std::cout << sweep_report_json(ctx, points).dump(2) << "\n";
    else
      std::cout << format_sweep_report(ctx, points, isatty(STDOUT_FILENO));
    const bool any = std::any_of(points.begin(), points.end(),
                                 [](const SweepPoint& pt) { return pt.result && !pt.result->ranked.empty(); });
    return any ? 0 : 1;
  }

  SearchResult result;
  if (auto_nodes) {
    // The smallest node count with a feasible plan: the model-state bound shrinks with more GPUs, so
    // double until feasible, then bisect between the last infeasible and the first feasible count.
    auto try_nodes = [&](int64_t n) {
      req.cluster = Cluster{n, gpn};
      return search_plans(req);
    };
    int64_t lo = 0, hi = 1;
    SearchResult r = try_nodes(hi);
    while (r.ranked.empty()) {
      lo = hi;
      hi *= 2;
      if (hi > kMaxAutoNodes)
        throw InputError("--nodes auto: no plan fits on up to " + std::to_string(kMaxAutoNodes) + " nodes");
      r = try_nodes(hi);
    }
    while (hi - lo > 1) {
      int64_t mid = (lo + hi) / 2;
      SearchResult rm = try_nodes(mid);
      if (!rm.ranked.empty()) {
        hi = mid;
        r = std::move(rm);
      } else {
        lo = mid;
      }
    }
    cluster = Cluster{hi, gpn};
    result = std::move(r);
    std::cerr << "--nodes auto: " << hi << " node(s) is the fewest with a feasible plan\n";
  } else {
    req.cluster = cluster;
    result = search_plans(req);
  }
  if (target) explain_excluded_families(*target, result);
  // A host device (fsdp-run on CPU) under the default global batch: a step of many micro-batches, each seconds long,
  // where a rehearsal wants a few. Said, with the flag that sets it.
  if (hw.device_is_host() && !args.has("--global-batch-tokens") && !result.ranked.empty()) {
    const Candidate& c = result.ranked.front();
    if (c.strategy.grad_accum > 1)
      std::cerr << "note: the default global batch (" << fmt("%.0f", req.global_batch_tokens)
                << " tokens, a large-scale pre-training step) takes " << c.strategy.grad_accum
                << " micro-batches a step on this host device, " << fmt("%.1f", c.prediction.time.step_s)
                << " s predicted; for a rehearsal give --global-batch-tokens (e.g. "
                << c.strategy.micro_batch * c.strategy.seq_len * c.strategy.mesh.dp(cluster.world_size())
                << ", one micro-batch a data-parallel replica)\n";
  }
  // A global batch smaller than one micro-batch on every data-parallel replica cannot be kept: the chosen plan's step
  // takes more (the search's own bound on overshooting, kGlobalBatchOvershoot, stops at micro-batch 1). Said.
  if (!result.ranked.empty() && !req.pins.grad_accum) {
    const Candidate& c = result.ranked.front();
    const double step_tokens = c.prediction.tokens_per_step;
    if (step_tokens > kGlobalBatchOvershoot * req.global_batch_tokens)
      std::cerr << "note: --global-batch-tokens " << fmt("%.0f", req.global_batch_tokens)
                << " is less than one micro-batch on each data-parallel replica: the chosen plan's step takes "
                << fmt("%.0f", step_tokens) << " tokens (micro-batch " << c.strategy.micro_batch << " x seq "
                << c.strategy.seq_len << " x " << c.strategy.mesh.dp(cluster.world_size())
                << " replicas); fewer replicas (fewer GPUs, or tp / pp) keep a smaller batch\n";
  }
  PlanReportContext ctx{
      &model, &hw, &rt, cluster, top, objective, req.global_batch_tokens, req.train_tokens, graph.total_params()};
  std::vector<WhatIf> what_ifs;
  if (!result.ranked.empty()) {
    const Strategy& best = result.ranked.front().strategy;
    if (!args.has("--float8"))
      if (auto f8 = float8_what_if(graph, hw, rt, cluster, best))
        what_ifs.push_back(
            {"float8_what_if", "float8 (not searched: it changes the numerics)",
             std::string("--float8 tensorwise") + (f8->first.float8_all_gather ? " --float8-all-gather true" : ""),
             "docs/hardware.md \"Float8 linears\"", std::move(*f8)});
    if (!args.has("--attention"))
      if (auto fa3 = flash3_what_if(graph, hw, rt, cluster, best))
        what_ifs.push_back({"flash3_what_if",
                            "FlashAttention-3 (not searched: flash-attention's hopper/ build, installed apart)",
                            "--attention flash3", "docs/hardware.md \"Attention kernels\"", std::move(*fa3)});
    if (!args.has("--kernels"))
      if (auto liger = liger_what_if(graph, hw, rt, cluster, best))
        what_ifs.push_back({"liger_what_if", "Liger-Kernel (not searched: a library installed apart)",
                            "--kernels liger", "docs/hardware.md \"Liger-Kernel\"", std::move(*liger)});
  }
  if (args.has("--json")) {
    nlohmann::json j = plan_report_json(ctx, result);
    for (const WhatIf& w : what_ifs)
      j[w.json_key] = simulation_to_json(SimulationContext{&model, &hw, &rt, cluster, w.plan.first}, w.plan.second);
    j["model"] = {{"name", model.name}, {"params", graph.total_params()}};
    j["cluster"] = {{"hardware", hw.name}, {"nodes", cluster.nodes}, {"gpus_per_node", cluster.gpus_per_node}};
    if (!hw.device_is_host()) j["cluster"]["network"] = network_summary(hw);
    if (target)
      j["target"] = {{"name", target->target},     {"version", target->version}, {"writes_for", target->writes_for},
                     {"runtime", target->runtime}, {"notes", target_notes},      {"filtered", result.filtered}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << format_plan_report(ctx, result, isatty(STDOUT_FILENO));
    for (const WhatIf& w : what_ifs) {
      const Prediction& best = result.ranked.front().prediction;
      const Prediction& p = w.plan.second;
      std::cout << "\n"
                << w.label << ": " << w.flags << " would run this plan at " << fmt("%.0f", p.tokens_per_s_per_gpu)
                << " tokens/s per GPU ("
                << fmt("%+.1f", (p.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu - 1.0) * 100.0) << "%), "
                << format_gib(p.memory.device_total) << " GiB per GPU" << (p.fits ? "" : " (does not fit)") << " ("
                << w.doc << ")\n";
    }
  }
  if (auto html = args.get("--html")) {
    // The chosen plan re-simulated with its program: the search drops per-op timings and memory samples.
    HtmlReportInput hin;
    hin.model = &model;
    hin.hardware = &hw;
    hin.runtime = &rt;
    hin.cluster = cluster;
    hin.objective = objective;
    hin.global_batch_tokens = req.global_batch_tokens;
    hin.top_n = std::min(top, 5);
    hin.search = &result;
    StepProgram prog;
    Prediction p;
    if (!result.ranked.empty()) {
      p = simulate(SimulationInput{&graph, &hw, &rt, cluster, result.ranked.front().strategy}, &prog);
      hin.chosen = &result.ranked.front().strategy;
      hin.prediction = &p;
      hin.program = &prog;
    }
    write_html_report(*html, hin);
    if (!args.has("--json")) std::cout << "\nwrote " << *html << "\n";
  }
  if (result.ranked.empty()) return 1;
  const Candidate& best = result.ranked.front();
  if (auto trace = args.get("--trace")) {
    SimulationInput in{&graph, &hw, &rt, cluster, best.strategy};
    StepProgram prog;
    Prediction p = simulate(in, &prog);
    write_chrome_trace(*trace, prog, p);
  }
  if (!args.has("--no-out")) {
    std::string out = args.get_or("--out", "plan.yaml");
    PlanFile plan = plan_file_for(model, hw, cluster, rt.name, best.strategy);
    plan.model_path = model_path;
    plan.prediction = plan_prediction(best.prediction);
    plan.fsdp_run_command =
        "fsdp-run --nproc-per-node " + std::to_string(cluster.gpus_per_node) + " " + shell_quote(out);
    plan.torchrun_command = "torchrun --nnodes " + std::to_string(cluster.nodes) + " --nproc-per-node " +
                            std::to_string(cluster.gpus_per_node) + " --no-python fsdp-run " + shell_quote(out);
    write_plan_file(plan, out);
    if (!args.has("--json") && !target)
      std::cout << "\nwrote " << out << "\n  run on one node:  " << plan.fsdp_run_command
                << "\n  run on the cluster: " << plan.torchrun_command << "\n";
    if (!args.has("--json") && target) std::cout << "\nwrote " << out << "\n";
    if (target) {
      // The target's files next to plan.yaml (the search kept only plans it expresses, so this never refuses).
      const std::string dir = std::filesystem::path(out).parent_path().string();
      const ExportResult ex = export_plan(plan, *target, root);
      const auto written = write_export(ex, *target, dir.empty() ? "." : dir);
      if (!args.has("--json")) {
        std::cout << "wrote " << target->target << " " << target->version << ":";
        for (const auto& w : written) std::cout << " " << w;
        std::cout << "\n  launch: " << ex.launch_command << "\n";
      }
    }
  }
  return 0;
}

int run_show(const std::vector<std::string>& argv) {
  Args args(argv, {"--config-root", "--html"}, {"--json", "--help"});
  if (args.has("--help")) {
    std::cout << "usage: fsdp-plan show plan.yaml [--html FILE]\n"
                 "  prints a plan file; with --html, draws it re-simulated on the hardware and runtime it names\n";
    return 0;
  }
  if (args.positional().size() != 1) throw InputError("show: usage: fsdp-plan show plan.yaml [--html FILE]");
  PlanFile plan = read_plan_file(args.positional()[0]);
  if (auto html = args.get("--html")) {
    // Re-simulate the plan on the hardware and runtime it names, and draw it.
    auto sim = simulate_plan(plan, config_root_from(argv));
    check_trained_length(plan, args.positional()[0]);
    HtmlReportInput hin;
    hin.model = &plan.model;
    hin.hardware = &sim->hardware;
    hin.runtime = &sim->runtime;
    hin.cluster = sim->cluster;
    hin.chosen = &plan.strategy;
    hin.prediction = &sim->prediction;
    hin.program = &sim->program;
    hin.notes.push_back("plan file " + args.positional()[0] + " (schema v" + std::to_string(plan.version) + ")");
    if (!plan.fsdp_run_command.empty()) hin.notes.push_back("run: " + plan.fsdp_run_command);
    if (plan.prediction) {
      hin.recorded_label = "recorded in " + args.positional()[0];
      for (const auto& [k, v] : plan.prediction->memory_breakdown) hin.recorded_breakdown.emplace_back(k, v);
    }
    write_html_report(*html, hin);
    std::cout << "wrote " << *html << "\n";
    return 0;
  }
  if (args.has("--json")) {
    nlohmann::json j;
    j["model"] = plan.model_name;
    j["cluster"] = {{"hardware", plan.cluster.hardware},
                    {"nodes", plan.cluster.nodes},
                    {"gpus_per_node", plan.cluster.gpus_per_node}};
    j["config"] = strategy_to_json(plan.strategy);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const Strategy& s = plan.strategy;
  std::cout << "plan " << args.positional()[0] << " (schema v" << plan.version << ")\n"
            << "  model    " << plan.model_name << " (" << plan.model.num_layers << " layers, hidden "
            << plan.model.hidden_size << ")\n"
            << "  cluster  " << plan.cluster.nodes << " x " << plan.cluster.gpus_per_node << " "
            << plan.cluster.hardware << " (" << plan.cluster.device << "), runtime " << plan.runtime << "\n"
            << "  plan     " << one_line_strategy(s) << "\n"
            << "  training " << to_string(s.optimizer) << " lr " << plan.training.lr << ", clip "
            << plan.training.grad_clip << "\n";
  if (plan.prediction) {
    const PlanPrediction& p = *plan.prediction;
    std::cout << "  predicted peak " << format_gib(p.peak_bytes) << " GiB allocated, "
              << format_gib(p.reserved_peak_bytes) << " GiB reserved; step " << p.step_s << " s, "
              << p.tokens_per_s_per_gpu << " tokens/s/GPU\n";
    for (const auto& [k, v] : p.memory_breakdown)
      if (v > 0) std::cout << "    " << k << " " << format_gib(v) << " GiB\n";
  }
  if (!plan.fsdp_run_command.empty())
    std::cout << "  run: " << plan.fsdp_run_command << "\n       " << plan.torchrun_command << "\n";
  return 0;
}

}  // namespace fsdp
