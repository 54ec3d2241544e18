// Every bad-input path of fsdp-plan gives one clear message naming the file, key or flag, exit 2,
// never a crash.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "cli_runner.hpp"

using fsdp::test::refusal;
using fsdp::test::run_cli;

namespace {

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = "/tmp/fsdp_cli_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("simulate: bad flags and names") {
  refusal("simulate --model nosuchmodel", {"unknown model 'nosuchmodel'"});
  refusal("simulate --model 8b --hw nosuchgpu", {"unknown hardware 'nosuchgpu'"});
  refusal("simulate --model 8b --strategy fsdb", {"--strategy"});
  refusal("simulate --model 8b --nodes 0", {"--nodes"});
  refusal("simulate --model 8b --nodes -3", {"--nodes"});
  refusal("simulate --model 8b --micro-batch 0", {"--micro-batch"});
  refusal("simulate --model 8b --micro-batch many", {"--micro-batch"});
  refusal("simulate --model 8b --grad-sync sometimes", {"--grad-sync"});
  refusal("simulate --model 8b --strategy zero3 --grad-accum 4 --grad-sync last-micro-batch --runtime pytorch",
          {"--grad-sync"});
  refusal("simulate --model 8b --grad-accum 4 --grad-sync last-micro-batch", {"fsdp-run reduces"});
  refusal("simulate --model 8b --strategy hsdp --hsdp-group 3 --nodes 1", {"--hsdp-group"});
  refusal("simulate --model 8b --strategy hsdp", {"--hsdp-group"});
  // A shard group, or a pipeline stage, whose ranks straddle nodes unevenly: refused naming the flag (before
  // 2026-12-04 the communicators' costs threw "a group of 12 consecutive ranks does not cover whole nodes of 8 ranks").
  refusal("simulate --model 8b --strategy hsdp --hsdp-group 12 --nodes 3",
          {"--hsdp-group: a shard group of 12 ranks would straddle nodes of 8 GPUs unevenly: not modelled"});
  refusal("simulate --model 8b --strategy hsdp --hsdp-group 6 --tp 2 --nodes 3",
          {"--hsdp-group: a shard group of 6 ranks tp 2 apart spans 12 ranks, which straddle nodes of 8 GPUs"});
  refusal("simulate --model 8b --strategy fsdp --pp 2 --nodes 3",
          {"--pp: pp 2 over 24 GPUs puts 12 ranks in a stage, which straddle nodes of 8 GPUs unevenly"});
  refusal("simulate --model 8b --wrap every:0", {"--wrap"});
  refusal("simulate --model 8b --wrap every:64", {"--wrap"});
  // size:N counts parameters as --tokens counts tokens (a number, or K, M, B): a whole, positive number of them.
  refusal("simulate --model 8b --wrap size:0.5", {"size:N (a unit of at least N parameters: 100000000 or 100M)"});
  refusal("simulate --model 8b --wrap size:abc", {"--wrap: 'size:abc'"});
  // --global-batch-tokens counts as --tokens does; one below a micro-batch on every replica is said, not dropped.
  refusal("--model 8b --nodes 8 --global-batch-tokens abc --no-out",
          {"--global-batch-tokens: expected a positive count of tokens"});
  {
    const auto small = run_cli("--model 8b --nodes 8 --global-batch-tokens 8K --no-out");
    CAPTURE(small.err);
    REQUIRE(small.code == 0);
    CHECK(small.err.find("note: --global-batch-tokens 8000 is less than one micro-batch on each data-parallel "
                         "replica: the chosen plan's step takes 262144 tokens") != std::string::npos);
    const auto suffixed = run_cli("--model 8b --nodes 8 --global-batch-tokens 1M --no-out");
    REQUIRE(suffixed.code == 0);
    CHECK(suffixed.err.find("note: --global-batch-tokens") == std::string::npos);
    // The same search (the report but for its own timing line).
    auto without_timing = [](std::string out) {
      const size_t at = out.find("searched ");
      REQUIRE(at != std::string::npos);
      return out.erase(at, out.find('\n', at) - at);
    };
    CHECK(without_timing(run_cli("--model 8b --nodes 8 --global-batch-tokens 1000000 --no-out").out) ==
          without_timing(suffixed.out));
  }
  {
    const auto suffixed = run_cli("simulate --model 8b --nodes 2 --wrap size:100M");
    CAPTURE(suffixed.err);
    REQUIRE(suffixed.code == 0);
    CHECK(suffixed.out.find("wrap=size:100000000") != std::string::npos);
    CHECK(run_cli("simulate --model 8b --nodes 2 --wrap size:100000000").out == suffixed.out);
  }
  refusal("simulate --model 8b --frobnicate 3", {"--frobnicate"});
  refusal("simulate --model 8b --reshard-after-forward maybe", {"--reshard-after-forward"});
  refusal("simulate --model gpt2 --seq 4096", {"--seq"});
  refusal("simulate --model 8b --runtime nosuchruntime", {"unknown runtime"});
  refusal("simulate", {"--model"});
  // A LoRA target that names no adaptable linear of the model would train no adapter there: refused, the model's
  // linears listed (the MoE router `gate`, Mixtral's Hugging Face `w1`, a GPT-2 name on a Llama).
  refusal("simulate --model tiny-moe --method lora --lora-rank 8 --lora-targets q_proj,gate",
          {"--lora-targets: 'gate' names no linear of tiny-moe that LoRA adapts (its linears: q_proj, k_proj, "
           "v_proj, o_proj, gate_proj, up_proj, down_proj)"});
  refusal("--model mixtral-8x7b --nodes 1 --method lora --lora-rank 8 --lora-targets w1", {"'w1' names no linear"});
  refusal("simulate --model 8b --method lora --lora-rank 8 --lora-targets c_fc", {"'c_fc' names no linear"});
}

TEST_CASE("model files: unknown key, missing key, wrong type, heads not dividing") {
  const std::string base =
      "name: t\nfamily: decoder\nhidden_size: 256\nnum_layers: 2\nnum_heads: 4\nnum_kv_heads: 2\nhead_dim: 64\n"
      "ffn_size: 512\ngated_mlp: true\nactivation: silu\nvocab_size: 1000\ntied_embeddings: false\nnorm: rmsnorm\n"
      "norm_eps: 1.0e-5\nposition_embedding: rope\nrope_theta: 10000\nmax_positions: 512\nqkv_bias: false\n"
      "attn_out_bias: false\nmlp_bias: false\ndropout: false\n";
  auto ok = run_cli("simulate --model " + write_tmp("ok.yaml", base) + " --gpus 1 --json");
  CHECK(ok.code == 0);
  refusal("simulate --model " + write_tmp("unknown.yaml", base + "colour: blue\n"), {"unknown key 'colour'"});
  std::string missing = base.substr(0, base.find("vocab_size")) + base.substr(base.find("tied_embeddings"));
  refusal("simulate --model " + write_tmp("missing.yaml", missing), {"'vocab_size': missing"});
  std::string wrong = base;
  wrong.replace(wrong.find("num_layers: 2"), 13, "num_layers: two");
  refusal("simulate --model " + write_tmp("wrong.yaml", wrong), {"num_layers"});
  std::string heads = base;
  heads.replace(heads.find("num_kv_heads: 2"), 15, "num_kv_heads: 3");
  refusal("simulate --model " + write_tmp("heads.yaml", heads), {"does not divide"});
  std::string zero = base;
  zero.replace(zero.find("hidden_size: 256"), 16, "hidden_size: 0");
  refusal("simulate --model " + write_tmp("zero.yaml", zero), {"hidden_size"});
  refusal("simulate --model " + write_tmp("broken.yaml", "name: [unclosed\n"), {"not valid YAML"});
  refusal("simulate --model /nonexistent/model.yaml", {"cannot open"});
}

TEST_CASE("hardware files: wrong unit names the file and key") {
  auto a100 = fsdp::test::slurp(std::string(FSDP_SOURCE_ROOT) + "/hwprofiles/a100-80gb.yaml");
  REQUIRE(!a100.empty());
  auto pos = a100.find("\"2039 GB/s\"");
  if (pos == std::string::npos) pos = a100.find("2039 GB/s");
  REQUIRE(pos != std::string::npos);
  std::string bad = a100;
  bad.replace(pos, a100[pos] == '"' ? 11 : 9, "\"2039\"");
  auto path = write_tmp("hw_bad.yaml", bad);
  refusal("simulate --model 8b --hw " + path, {path, "bandwidth"});
}

TEST_CASE("planner: bad input") {
  refusal("--model nosuchmodel --nodes 8", {"unknown model"});
  refusal("--model 70b --nodes 0", {"--nodes"});
  refusal("--model 70b --nodes 8 --strategy nope", {"--strategy"});
  refusal("--model 70b --nodes 8 --objective speed", {"--objective"});
  refusal("--model 70b --nodes 8 --objective cost", {"--tokens"});
  // --tokens: a positive count, with the suffixes token counts are quoted with (2T), under any objective.
  refusal("--model 70b --nodes 8 --tokens -5", {"--tokens: expected a positive count of tokens"});
  refusal("--model 70b --nodes 8 --tokens 0", {"--tokens: expected a positive count of tokens"});
  refusal("--model 70b --nodes 8 --objective cost --tokens 2X", {"got '2X'"});
  refusal("--model 70b --nodes 8 --memory-headroom 1.5", {"--memory-headroom"});
  refusal("--model 70b --gpus 12", {"--gpus"});
  refusal("show /nonexistent/plan.yaml", {"cannot open"});
  // plan.yaml's directory is created (as export's --out); one that cannot be is named.
  refusal("--model 8b --nodes 1 --out /dev/null/plans/plan.yaml", {"--out: cannot create directory '/dev/null/plans'"});
  // A mesh degree the target cannot write is refused before the search, naming the flag (not "No plan fits").
  refusal("--model 8b --nodes 2 --target deepspeed --pp 2", {"--pp: deepspeed v0.19 cannot express pp 2"});
  refusal("--model 8b --nodes 2 --target accelerate --tp 2", {"--tp: accelerate v1.14 cannot express tp 2"});
  // One dtype pinned that no triple the target writes has: refused naming the flag given, not searched to nothing.
  refusal("--model 8b --nodes 1 --hw h100-80gb --param-dtype fp16 --target torchtitan",
          {"--param-dtype: torchtitan v0.2.2 cannot express dtypes fp16/*/*"});
  refusal("--model 8b --nodes 1 --hw h100-80gb --reduce-dtype bf16 --target torchtitan",
          {"--reduce-dtype: torchtitan v0.2.2 cannot express dtypes */bf16/*"});
  // A strategy or offload mode the runtime does not run (its profile's runs section), pinned: refused by name.
  refusal("--model 8b --nodes 1 --runtime nanotron --strategy fsdp",
          {"--strategy: nanotron runs ddp, zero1, not fsdp (its runtime profile's runs.strategies)"});
  refusal("--model 8b --nodes 1 --runtime pytorch --offload optimizer",
          {"--offload: pytorch offloads none, params, not optimizer"});
  // A runtime without sequence parallelism (DeepSpeed's AutoTP): --tp alone plans tp without it, not an error.
  const auto autotp = run_cli("--model 8b --nodes 1 --runtime deepspeed --tp 2 --no-out");
  CHECK(autotp.code == 0);
  CHECK(autotp.out.find("tp=2 pp=1") != std::string::npos);
  refusal("--model 8b --nodes 1 --runtime deepspeed --tp 2 --sequence-parallel true",
          {"--sequence-parallel: deepspeed does not run sequence parallelism"});
  refusal("--model 8b --nodes 1 --runtime nanotron --act-ckpt selective",
          {"--act-ckpt: nanotron checkpoints none, full, not selective"});
  // An impossible pin: DDP of a 70B model on 8 GPUs cannot fit: no plan, exit 1 with the reason.
  auto r = run_cli("--model 70b --nodes 1 --strategy ddp --no-out");
  CHECK(r.code == 1);
  CHECK(r.out.find("No plan fits") != std::string::npos);
  CHECK(r.out.find("ddp: does not fit") != std::string::npos);
  // Why, in the memory table's category names, largest first: a full replica's optimizer states lead.
  CHECK(r.out.find("GiB per GPU > 80 GiB: optimizer_states ") != std::string::npos);
  CHECK(r.out.find(", sharded_params ") != std::string::npos);
  // A family whose smallest plan fits the GPU but not the host's RAM (offloaded states of 70B on one node of
  // 48 GB GPUs) says so, not "39 GiB per GPU > 45 GiB".
  auto host = run_cli("--model 70b --nodes 1 --hw l40s-48gb --strategy fsdp --no-out");
  CHECK(host.code == 1);
  CHECK(host.out.find("fsdp: does not fit; the smallest (") != std::string::npos);
  CHECK(host.out.find(") fits the GPU at ") != std::string::npos);
  CHECK(host.out.find(" GiB of host RAM per node > 1024 GiB") != std::string::npos);
}

TEST_CASE("planner: a pinned interleaved schedule leaves the accumulation to the search unless it is pinned too") {
  // Interleaved 1F1B needs the micro-batches a multiple of pp: checked on each searched plan (refused ones counted),
  // not on the default accumulation of 1 before the search.
  auto r = run_cli(
      "--model 70b --nodes 8 --runtime torchtitan --pp 4 --pp-schedule interleaved-1f1b "
      "--pp-virtual-stages 2 --global-batch-tokens 262144 --no-out");
  CHECK(r.code == 0);
  CHECK(r.out.find("pp=4(interleaved-1f1b v=2)") != std::string::npos);
  CHECK(r.out.find("x interleaved 1F1B with micro-batches not a multiple of pp") != std::string::npos);
  refusal(
      "--model 70b --nodes 8 --runtime torchtitan --pp 4 --pp-schedule interleaved-1f1b "
      "--pp-virtual-stages 2 --grad-accum 3",
      {"--grad-accum: interleaved-1f1b needs the micro-batches per step (3) to be a multiple of pp 4"});
}

TEST_CASE("simulate --plan / compare: a plan file whose knobs cannot run is refused naming the file and its key") {
  // The plan fsdp-plan writes for `args`, with `from` replaced by `to`, in the temporary file `name`.
  auto edited_plan = [](const std::string& args, const std::string& from, const std::string& to,
                        const std::string& name) {
    const std::string plan = "/tmp/fsdp_cli_" + std::to_string(::getpid()) + "_written_plan.yaml";
    auto r = run_cli(args + " --out " + plan);
    REQUIRE(r.code == 0);
    std::ifstream in(plan);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::remove(plan.c_str());
    REQUIRE(text.find(from) != std::string::npos);
    text.replace(text.find(from), from.size(), to);
    return write_tmp(name, text);
  };
  const std::string bad =
      edited_plan("--model 8b --gpus 8 --strategy fsdp --tp 2", "\n  tp: 2\n", "\n  tp: 3\n", "tp3_plan.yaml");
  refusal("simulate --plan " + bad, {bad + ": strategy.tp: tp 3 x pp 1 = 3 does not divide the 8 GPUs"});
  refusal("compare " + bad + " /nonexistent.json", {bad + ": strategy.tp: "});
  // A LoRA plan whose target modules name no linear of its model.
  const std::string bad_lora = edited_plan(
      "--model tiny-moe --hw cpu --gpus 2 --runtime fsdp-run --strategy fsdp --method lora --lora-rank 8 "
      "--micro-batch 2 --seq 64 --grad-accum 1",
      "lora_targets: [q_proj, k_proj, v_proj, o_proj]", "lora_targets: [q_proj, w9]", "lora_plan.yaml");
  refusal("simulate --plan " + bad_lora, {bad_lora + ": strategy.lora_targets: 'w9' names no linear of tiny-moe"});
}

TEST_CASE("validate --breakdown: the matching rows' lines; a text no row's id contains is an error") {
  auto r = run_cli("validate --breakdown titan-a100-llama2-70b-64gpu-mb1-sel-op");
  CHECK(r.code == 0);
  CHECK(r.out.rfind("row ", 0) == 0);  // the header first
  CHECK(r.out.find("\ntitan-a100-llama2-70b-64gpu-mb1-sel-op ") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 3);
  CHECK(r.out.find("\n  memory: allocated ") != std::string::npos);
  refusal("validate --breakdown no-such-row", {"no simulated row's id contains 'no-such-row'"});
}
