#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/strategy_flags.hpp"
#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "planfile/plan_file.hpp"
#include "report/memory_timeline.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"
#include "report/trace_writer.hpp"
#include "report/training_run.hpp"
#include "simulate.hpp"

namespace fsdp {

std::string config_root_from(const std::vector<std::string>& argv) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--config-root") return argv[i + 1];
  for (const auto& a : argv)
    if (a.rfind("--config-root=", 0) == 0) return a.substr(14);
  if (const char* env = std::getenv("FSDP_CONFIG_ROOT")) return env;
  return FSDP_SOURCE_ROOT;
}

void check_trained_length(const PlanFile& plan, const std::string& plan_path) {
  check_trained_length(plan.model, plan.strategy.seq_len, plan_path + ": strategy.seq_len");
}

namespace {

// The outputs of `simulate`: --trace, then JSON or the readable breakdown, with --tokens the training run.
void print_simulation(const Args& args, const SimulationContext& ctx, const StepProgram& program, const Prediction& p) {
  if (auto trace = args.get("--trace")) write_chrome_trace(*trace, program, p);
  if (args.has("--memory-timeline")) std::cout << format_memory_timeline(program, p.memory);
  const double tokens = training_tokens(args);
  const bool run = tokens > 0 && p.tokens_per_s_per_gpu > 0;
  if (args.has("--json")) {
    nlohmann::json j = simulation_to_json(ctx, p);
    if (run) j["training"] = training_run_json(tokens, training_run(tokens, ctx.cluster, p));
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << format_simulation(ctx, p, isatty(STDOUT_FILENO));
    if (run) std::cout << training_run_line(tokens, ctx.cluster, training_run(tokens, ctx.cluster, p)) << "\n";
  }
}

}  // namespace

std::set<std::string> simulate_value_flags() {
  std::set<std::string> values{"--model", "--hw",          "--nodes",        "--gpus-per-node", "--gpus",  "--runtime",
                               "--trace", "--config-root", "--image-tokens", "--plan",          "--tokens"};
  for (const auto& f : strategy_value_flags()) values.insert(f);
  return values;
}

std::set<std::string> simulate_switch_flags() { return {"--json", "--memory-timeline", "--help"}; }

int run_simulate(const std::vector<std::string>& argv) {
  const std::set<std::string> values = simulate_value_flags();
  Args args(argv, values, simulate_switch_flags());
  if (args.has("--help")) {
    std::cout << "usage: fsdp-plan simulate --model M [--hw H] [--nodes N --gpus-per-node G | --gpus N]\n"
                 "         [--strategy S] [--hsdp-group G] [--wrap W] [--reshard-after-forward true|false]\n"
                 "         [--act-ckpt A] [--offload O] [--param-dtype D] [--reduce-dtype D] [--micro-batch B]\n"
                 "         [--seq S] [--grad-accum K] [--runtime R] [--method M --lora-rank R] [--json] [--trace F]\n"
                 "         [--tokens N]          (a training run's tokens: its GPU-hours, days and optimizer steps)\n"
                 "         [--image-tokens N]    (a vision-language model's image tokens per sample)\n"
                 "         [--memory-timeline]   (the memory walk op by op, the peak marked *)\n"
                 "         [--config-root DIR] [--help]\n"
                 "       fsdp-plan simulate --plan plan.yaml [--json] [--trace F] [--memory-timeline] [--tokens N]\n"
                 "  mesh: --tp N [--sequence-parallel B] [--async-tp B], --pp N [--pp-schedule S] "
                 "[--pp-virtual-stages V]\n"
              << strategy_flags_help("  ", 110);
    return 0;
  }
  if (!args.positional().empty()) throw InputError("simulate: unexpected argument '" + args.positional()[0] + "'");
  const std::string root = config_root_from(argv);
  if (auto plan_path = args.get("--plan")) {
    // Re-simulate a plan file: everything comes from the file; only --json, --trace, --memory-timeline and --tokens
    // may be added.
    for (const auto& f : values)
      if (f != "--plan" && f != "--trace" && f != "--config-root" && f != "--tokens" && args.has(f))
        throw InputError(f + ": cannot be combined with --plan (the plan file fixes every knob)");
    PlanFile plan = read_plan_file(*plan_path);
    auto sim = simulate_plan(plan, root, *plan_path);
    check_trained_length(plan, *plan_path);
    print_simulation(args, SimulationContext{&plan.model, &sim->hardware, &sim->runtime, sim->cluster, plan.strategy},
                     sim->program, sim->prediction);
    return 0;
  }
  auto model_name = args.get("--model");
  if (!model_name) throw InputError("--model: required (a zoo name such as llama3-8b, or a config.json path)");
  ModelSpec model = load_model(*model_name, root);
  apply_image_tokens_flag(args, model);
  HardwareProfile hw = load_hardware(args.get_or("--hw", "a100-80gb"), root);
  RuntimeProfile rt = load_runtime(args.get_or("--runtime", "fsdp-run"), root);
  validate_profiles(hw, rt);
  Cluster cluster;
  if (args.has("--gpus")) {
    if (args.has("--nodes") || args.has("--gpus-per-node"))
      throw InputError("--gpus: give either --gpus or --nodes/--gpus-per-node, not both");
    int64_t gpus = args.get_int_or("--gpus", 1);
    if (gpus <= 0) throw InputError("--gpus: must be at least 1, got " + std::to_string(gpus));
    cluster.gpus_per_node = std::min<int64_t>(gpus, hw.gpus_per_node);
    if (gpus % cluster.gpus_per_node != 0)
      throw InputError("--gpus: " + std::to_string(gpus) + " is not a multiple of the " +
                       std::to_string(cluster.gpus_per_node) + " GPUs per node of " + hw.name);
    cluster.nodes = gpus / cluster.gpus_per_node;
  } else {
    cluster.nodes = args.get_int_or("--nodes", 1);
    cluster.gpus_per_node = args.get_int_or("--gpus-per-node", hw.gpus_per_node);
  }
  if (cluster.nodes <= 0) throw InputError("--nodes: must be at least 1, got " + std::to_string(cluster.nodes));
  if (cluster.gpus_per_node <= 0)
    throw InputError("--gpus-per-node: must be at least 1, got " + std::to_string(cluster.gpus_per_node));
  Strategy s;
  apply_default_seq(args, model, s);
  apply_strategy_flags(args, s);
  apply_runtime_defaults(args, rt, s);
  check_grad_sync_runtime(s, rt);
  validate_strategy(s, model, cluster, rt.support);
  check_trained_length(model, s.seq_len, args.has("--seq") ? "--seq" : "the default --seq");
  ModuleGraph graph(model);
  check_lora_targets(s, graph);
  SimulationInput in{&graph, &hw, &rt, cluster, s};
  StepProgram program;
  Prediction p = simulate(in, &program);
  print_simulation(args, SimulationContext{&model, &hw, &rt, cluster, s}, program, p);
  return 0;
}

int run_list_models(const std::vector<std::string>& argv) {
  for (const auto& z : list_zoo(config_root_from(argv))) {
    std::string aliases;
    for (const auto& a : z.aliases) aliases += (aliases.empty() ? " (alias " : ", ") + a;
    if (!aliases.empty()) aliases += ")";
    std::cout << z.name << aliases << "\n";
  }
  return 0;
}

int run_list_hardware(const std::vector<std::string>& argv) {
  for (const auto& h : list_hardware(config_root_from(argv))) std::cout << h << "\n";
  return 0;
}

}  // namespace fsdp
