// The figures the README quotes in its prose from fsdp-plan commands (outside the generated examples and tables, which
// test_readme_examples.cpp and test_export.cpp keep): each claim's commands are run with --json, its values formatted
// as the README writes them, and the README (whitespace folded, as its prose wraps) must contain the sentence they
// render. A change that moves a quoted plan fails here, naming the claim, until the README says what fsdp-plan does.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "core/format.hpp"

using json = nlohmann::json;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fold_whitespace(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

// 4173.8 -> "4,174": the README's thousands separator.
std::string grouped(double v) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(v)));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return digits;
}

std::string gib(double bytes) { return fsdp::fmt("%.1f", bytes / kGiB); }

std::string pct(double fraction) { return fsdp::fmt("%.1f", 100.0 * fraction) + "%"; }

json run_json(const std::string& args) {
  const auto r = fsdp::test::run_cli(args + " --json");
  INFO(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  return json::parse(r.out);
}

// A plan's simulation as both `simulate --json` and the search's `chosen` give it.
struct Sim {
  double tokens_per_s;
  double device_total_bytes;
  double step_s;
  double ep_comm_s;
  double mfu;
  json config;
  double budget_bytes = 0;  // the search's memory budget (a search's chosen plan only)
};

Sim sim_of(const json& j) {
  return {j["throughput"]["tokens_per_s_per_gpu"].get<double>(),
          j["memory"]["device_total_bytes"].get<double>(),
          j["time"]["step_s"].get<double>(),
          j["time"]["ep_comm_s"].get<double>(),
          j["mfu"].get<double>(),
          j["config"]};
}

Sim simulate(const std::string& args) { return sim_of(run_json("simulate " + args)); }
Sim chosen(const std::string& args) {
  const json j = run_json(args + " --no-out");
  Sim s = sim_of(j["chosen"]);
  s.budget_bytes = j["search"]["budget_bytes"].get<double>();
  return s;
}

struct Claim {
  std::string name;
  std::function<std::vector<std::string>()> render;  // the README's sentences with today's figures
};

const std::vector<Claim>& claims() {
  static const std::vector<Claim> all = {
      {"DeepSeek-V3 on 32 H100 nodes under torchtitan (expert parallelism)",
       [] {
         const Sim s = chosen("--model deepseek-v3 --nodes 32 --hw h100-80gb --runtime torchtitan");
         return std::vector<std::string>{
             "now fsdp at ep " + std::to_string(s.config["ep"].get<int>()) + " with parameter offload, micro-batch " +
             std::to_string(s.config["micro_batch"].get<int>()) + ", " + gib(s.device_total_bytes) + " GiB a GPU, " +
             grouped(s.tokens_per_s) + " tokens/s/GPU"};
       }},
      {"Mixtral 8x7B on 2 H100 nodes from ep 1 to ep 8",
       [] {
         const std::string base =
             "--model mixtral-8x7b --nodes 2 --hw h100-80gb --strategy fsdp --act-ckpt full --micro-batch 2 --runtime "
             "torchtitan --ep ";
         const Sim one = simulate(base + "1"), eight = simulate(base + "8");
         return std::vector<std::string>{
             gib(one.device_total_bytes) + " -> " + gib(eight.device_total_bytes) + " GiB a GPU and " +
             grouped(one.tokens_per_s) + " -> " + grouped(eight.tokens_per_s) +
             " tokens/s/GPU from ep 1 to ep 8, the all-to-alls " + fsdp::fmt("%.3f", eight.ep_comm_s) + " s of a " +
             fsdp::fmt("%.2f", eight.step_s) + " s step"};
       }},
      {"Llama 4 Maverick on 16 H100 nodes under torchtitan",
       [] {
         const Sim s = chosen("--model maverick --nodes 16 --runtime torchtitan --hw h100-80gb");
         return std::vector<std::string>{"ep " + std::to_string(s.config["ep"].get<int>()) +
                                         " holds 16 of a layer's 128 experts and fsdp fits at " +
                                         gib(s.device_total_bytes) + " GiB, " + grouped(s.tokens_per_s) +
                                         " tokens/s/GPU"};
       }},
      {"Llama 3 70B on 8 nodes, tp 4 x pp 8 under --target torchtitan",
       [] {
         const Sim s = chosen("--model llama3-70b --nodes 8 --tp 4 --pp 8 --target torchtitan");
         return std::vector<std::string>{"now it plans tp 4 x pp 8 at " + gib(s.device_total_bytes) + " GiB per GPU"};
       }},
      {"Llama 3 8B at seq 8192 in 512-token documents (--doc-len)",
       [] {
         const std::string base =
             "--model llama3-8b --nodes 1 --hw h100-80gb --strategy fsdp --act-ckpt full "
             "--micro-batch 1 --seq 8192 --runtime pytorch";
         const Sim whole = simulate(base), docs = simulate(base + " --doc-len 512");
         return std::vector<std::string>{grouped(whole.tokens_per_s) + " -> " + grouped(docs.tokens_per_s) +
                                         " tokens/s/GPU with 512-token documents"};
       }},
      {"Llama 3 8B at seq 8192 with FlashAttention-3 (--attention flash3)",
       [] {
         const std::string base =
             "--model llama3-8b --nodes 1 --hw h100-80gb --strategy fsdp --act-ckpt full "
             "--micro-batch 1 --seq 8192 --runtime pytorch";
         const Sim fa2 = simulate(base), fa3 = simulate(base + " --attention flash3");
         return std::vector<std::string>{grouped(fa2.tokens_per_s) + " -> " + grouped(fa3.tokens_per_s) +
                                         " tokens/s/GPU with --attention flash3"};
       }},
      {"Llama 3 8B at seq 8192 with torch's flex_attention (--attention flex)",
       [] {
         const std::string base =
             "--model llama3-8b --nodes 1 --hw h100-80gb --strategy fsdp --act-ckpt full "
             "--micro-batch 1 --seq 8192 --runtime torchtitan-2606";
         const Sim fa2 = simulate(base), flex = simulate(base + " --attention flex"),
                   docs = simulate(base + " --attention flex --doc-len 1024");
         return std::vector<std::string>{grouped(fa2.tokens_per_s) + " -> " + grouped(flex.tokens_per_s) +
                                         " tokens/s/GPU with --attention flex, " + grouped(docs.tokens_per_s) +
                                         " over 1,024-token documents"};
       }},
      {"Qwen2.5-7B under ZeRO-3 on 4 A100s with Liger-Kernel (--kernels liger)",
       [] {
         const std::string base =
             "--model qwen2-7b --nodes 1 --gpus-per-node 4 --hw a100-80gb --strategy zero3 --act-ckpt full "
             "--micro-batch 1 --grad-accum 2 --seq 8192 --reduce-dtype bf16 --runtime transformers-deepspeed";
         const Sim plain = simulate(base), liger = simulate(base + " --kernels liger");
         return std::vector<std::string>{
             "peak " + gib(plain.device_total_bytes) + " -> " + gib(liger.device_total_bytes),
             grouped(plain.tokens_per_s) + " -> " + grouped(liger.tokens_per_s) + " tokens/s/GPU predicted"};
       }},
      {"Llama 3.1 405B on 16 H100 nodes at 8k tokens",
       [] {
         const Sim s = chosen("--model 405b --nodes 16 --hw h100-80gb --seq 8192");
         const int tp = s.config["tp"].get<int>();
         return std::vector<std::string>{
             "now returns FSDP + TP " + std::to_string(tp) + " with full checkpointing, micro-batch " +
                 std::to_string(s.config["micro_batch"].get<int>()) + " x " +
                 std::to_string(s.config["grad_accum"].get<int>()) + ": " + gib(s.device_total_bytes) + " GiB of " +
                 gib(s.budget_bytes),
             std::to_string(std::lround(s.tokens_per_s)) + " tokens/s per GPU (MFU " + pct(s.mfu) + ";"};
       }},
  };
  return all;
}

}  // namespace

TEST_CASE("README: the figures its prose quotes are what fsdp-plan answers today") {
  const std::string readme = fold_whitespace(fsdp::test::slurp(kRoot + "/README.md"));
  for (const Claim& c : claims()) {
    CAPTURE(c.name);
    for (const std::string& text : c.render()) {
      const std::string sentence = fold_whitespace(text);
      CAPTURE(sentence);
      CHECK(readme.find(sentence) != std::string::npos);
    }
  }
}
