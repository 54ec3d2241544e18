// The README's "One complete example per target" is what fsdp-plan writes today: each example's command is run, its
// plan and files are read back, and the section between the README's examples markers must equal the section built
// from them (the command, the chosen plan, its memory and speed, every file in full). Run with FSDP_UPDATE_README=1 to
// rewrite the section after a change that moves a plan or a file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "planfile/plan_file.hpp"
#include "report/prediction_view.hpp"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

struct ShownFile {
  std::string name;
  std::string fence;  // the code block's language ("" for a plain block)
};

// One fsdp-plan command of an example and what the README shows of it.
struct ExampleRun {
  std::string args;  // after `fsdp-plan`
  // Text before the files. Empty: "`fsdp-plan ARGS` chooses PLAN: M GiB per GPU, T tokens/s/GPU on the R runtime."
  std::string lead;
  std::string note;  // after that sentence (ignored with a lead of its own)
  std::vector<ShownFile> files;
};

struct Example {
  std::string target;   // "torchtitan": the summary's code
  std::string summary;  // after it
  std::vector<ExampleRun> runs;
};

const std::vector<Example>& examples() {
  static const std::vector<Example> all = {
      {"torchtitan",
       "Llama 3 70B on 8 nodes of A100 (job.toml, launch.sh)",
       {{"--model 70b --nodes 8 --target torchtitan", "", "", {{"job.toml", "toml"}, {"launch.sh", "sh"}}},
        {"--model 8b --nodes 2 --act-ckpt selective-op --target torchtitan --target-version python-a9c5edc",
         "With `--target-version python-a9c5edc` (here `--model 8b --nodes 2 --act-ckpt selective-op`) the same knobs "
         "are a Python config function, run with `--module fsdp_plan_config --config fsdp_plan`:",
         "",
         {{"fsdp_plan_config.py", "python"}}}}},
      {"deepspeed",
       "Llama 3 8B on 2 nodes (ds_config.json, script_args.json, hostfile, launch.sh)",
       {{"--model 8b --nodes 2 --target deepspeed",
         "",
         "",
         {{"ds_config.json", "json"}, {"script_args.json", "json"}, {"hostfile", ""}, {"launch.sh", "sh"}}}}},
      {"accelerate",
       "Llama 3 8B on 2 nodes, FSDP2 (accelerate_config.yaml, training_args.json, script_args.json, launch.sh)",
       {{"--model 8b --nodes 2 --target accelerate",
         "",
         "`--target-version v1.14-fsdp1` writes `fsdp_version: 1` with FSDP1's sharding strategy names, "
         "`fsdp_backward_prefetch` and `fsdp_use_orig_params`.",
         {{"accelerate_config.yaml", "yaml"},
          {"training_args.json", "json"},
          {"script_args.json", "json"},
          {"launch.sh", "sh"}}}}},
      {"swift",
       "Qwen2 7B LoRA on one node (swift_sft.sh, launch.sh)",
       {{"--model qwen2-7b --nodes 1 --method lora --lora-rank 16 --target swift",
         "",
         "`--target-version v3.12` writes `--train_type` instead of `--tuner_type`.",
         {{"swift_sft.sh", "sh"}, {"launch.sh", "sh"}}}}},
      {"torchtune",
       "Qwen2 7B LoRA on one node (torchtune_config.yaml, launch.sh)",
       {{"--model qwen2-7b --nodes 1 --method lora --lora-rank 16 --lora-targets "
         "q_proj,v_proj,gate_proj,up_proj,down_proj --target torchtune",
         "",
         "The MLP is adapted whole (`apply_lora_to_mlp`), `o_proj` is torchtune's `output_proj`.",
         {{"torchtune_config.yaml", "yaml"}, {"launch.sh", "sh"}}}}},
      {"fsdp-run",
       "plan.yaml and launch.sh",
       {{"--model 8b --nodes 2 --target fsdp-run",
         "`fsdp-plan --model 8b --nodes 2 --target fsdp-run` searches what fsdp-run runs (no `selective-op`, no "
         "`--grad-sync last-micro-batch`) and writes plan.yaml (the plan file is fsdp-run's config) and:",
         "",
         {{"launch.sh", "sh"}}}}},
  };
  return all;
}

std::string with_thousands(double v) {
  std::string digits = std::to_string(std::llround(v));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return digits;
}

std::string one_decimal(double v) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  o << v;
  return o.str();
}

// The markdown of one run: its sentence and its files, each in full.
std::string run_markdown(const ExampleRun& run) {
  const std::string dir = "/tmp/fsdp_readme_example_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const test::CliResult r = test::run_cli(run.args + " --json --out " + dir + "/plan.yaml");
  INFO(run.args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto report = nlohmann::json::parse(r.out);
  const auto& chosen = report.at("chosen");
  std::ostringstream o;
  if (run.lead.empty()) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    o << "`fsdp-plan " << run.args << "` chooses `" << one_line_strategy(read_plan_file(dir + "/plan.yaml").strategy)
      << "`: " << one_decimal(chosen.at("memory").at("device_total_bytes").get<double>() / kGiB) << " GiB per GPU, "
      << with_thousands(chosen.at("throughput").at("tokens_per_s_per_gpu").get<double>()) << " tokens/s/GPU on the "
      << chosen.at("runtime").get<std::string>() << " runtime.";
    if (!run.note.empty()) o << " " << run.note;
    o << "\n";
  } else {
    o << run.lead << "\n";
  }
  for (const ShownFile& f : run.files) {
    std::string text = test::slurp(dir + "/" + f.name);
    REQUIRE_MESSAGE(!text.empty(), f.name);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    o << "\n```" << f.fence << "\n" << text << "\n```\n";
  }
  fs::remove_all(dir);
  return o.str();
}

std::string examples_markdown() {
  std::ostringstream o;
  for (const Example& e : examples()) {
    o << "\n<details><summary><code>--target " << e.target << "</code>: " << e.summary << "</summary>\n";
    for (const ExampleRun& run : e.runs) o << "\n" << run_markdown(run);
    o << "\n</details>\n";
  }
  return o.str();
}

}  // namespace

TEST_CASE("README: the per-target examples are what fsdp-plan writes (FSDP_UPDATE_README=1 rewrites them)") {
  const std::string path = kRoot + "/README.md";
  const std::string readme = test::slurp(path);
  const std::string begin = "<!-- examples:begin -->\n", end = "<!-- examples:end -->";
  const auto b = readme.find(begin), e = readme.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  const std::string generated = examples_markdown() + "\n";
  const std::string current = readme.substr(b + begin.size(), e - b - begin.size());
  const char* update = std::getenv("FSDP_UPDATE_README");
  if (update != nullptr && std::string(update) == "1" && current != generated) {
    std::ofstream(path) << readme.substr(0, b + begin.size()) << generated << readme.substr(e);
    MESSAGE("rewrote the README's per-target examples");
    return;
  }
  CHECK_MESSAGE(current == generated,
                "the README's examples differ from what fsdp-plan writes: rerun with FSDP_UPDATE_README=1");
}
