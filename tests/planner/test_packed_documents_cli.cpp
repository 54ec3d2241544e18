// `--doc-len` (Strategy::doc_len, plan.yaml strategy.doc_len since schema 7): the search keeps it on every plan and
// its bounds hold with it, plan.yaml carries it and simulates back the same, the report says it, and each target
// expresses it or refuses it by knob: ms-swift's --packing attends the packed samples one by one (flash attention
// only, which its knob table now says), the others write no document boundaries.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "planfile/plan_file.hpp"
#include "search/plan_search.hpp"
#include "search_fixtures.hpp"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

std::string tmp_dir(const std::string& name) { return test::tmp_dir("fsdp_docs", name); }

}  // namespace

TEST_CASE("packed documents search: every plan keeps the documents, and the bounded search equals the exhaustive") {
  auto setup = test::search_setup("llama3-8b", "h100-80gb", 1, "pytorch", 8192);
  setup->req.base.doc_len = 512;
  setup->req.bound_pruning = true;
  const SearchResult bounded = search_plans(setup->req);  // asserts every plan >= its bound
  setup->req.bound_pruning = false;
  const SearchResult exhaustive = search_plans(setup->req);
  REQUIRE(!bounded.ranked.empty());
  for (const Candidate& c : exhaustive.evaluated_sample) CHECK(c.strategy.doc_len == 512);
  CHECK(bounded.ranked.front().prediction.tokens_per_s_per_gpu ==
        doctest::Approx(exhaustive.ranked.front().prediction.tokens_per_s_per_gpu));
  // Attention over 512-token documents, not the 8192-token sequence: the best plan is faster than without them.
  auto whole = test::search_setup("llama3-8b", "h100-80gb", 1, "pytorch", 8192);
  CHECK(bounded.ranked.front().prediction.tokens_per_s_per_gpu >
        search_plans(whole->req).ranked.front().prediction.tokens_per_s_per_gpu);
}

TEST_CASE("packed documents CLI: plan.yaml keeps doc_len, simulates back the same, and the report says it") {
  const std::string dir = tmp_dir("plan");
  auto r = test::run_cli("--model 8b --nodes 1 --hw h100-80gb --seq 8192 --runtime pytorch --doc-len 512 --out " + dir +
                         "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("packed documents of 512 tokens attended one by one (varlen)") != std::string::npos);
  const PlanFile plan = read_plan_file(dir + "/plan.yaml");
  CHECK(plan.strategy.doc_len == 512);
  CHECK(test::slurp(dir + "/plan.yaml").find("  doc_len: 512\n") != std::string::npos);
  auto again = test::run_cli("simulate --plan " + dir + "/plan.yaml --json");
  REQUIRE(again.code == 0);
  const auto j = nlohmann::json::parse(again.out);
  CHECK(j["config"]["doc_len"] == 512);
  // fsdp-run attends over the whole sequence: exporting the plan there is refused by knob, with the nearest plan.
  test::refusal("export " + dir + "/plan.yaml --to fsdp-run --out " + dir + "/run",
                {"doc_len 512: fsdp-run attends causally over the whole sequence"});
  fs::remove_all(dir);
  // On fsdp-run itself (the default runtime) the flag is refused before the search, naming it.
  const std::string fsdp_run =
      test::refusal("--model 8b --nodes 1 --seq 8192 --doc-len 512 --no-out",
                    {"--doc-len: fsdp-run does not attend packed documents one by one",
                     // The runtimes that do, read from the shipped profiles (Transformers' Trainer profiles and
                     // torchtitan-2606 among them), not a list written into the rule.
                     "transformers-fsdp1", "torchtitan-2606"});
  CHECK(fsdp_run.find(", torchtitan,") == std::string::npos);
  test::refusal("simulate --model 8b --doc-len 0", {"--doc-len: must be at least 1"});
}

TEST_CASE("packed documents export: ms-swift packs them with flash attention; the other targets refuse by knob") {
  const std::string dir = tmp_dir("swift");
  auto r =
      test::run_cli("--model qwen2-7b --nodes 1 --method lora --lora-rank 16 --target swift --doc-len 1024 --out " +
                    dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(read_plan_file(dir + "/plan.yaml").strategy.doc_len == 1024);
  const std::string script = test::slurp(dir + "/swift_sft.sh");
  CHECK(script.find("--packing true") != std::string::npos);
  CHECK(script.find("--attn_impl flash_attn") != std::string::npos);
  fs::remove_all(dir);
  // --packing raises ValueError without a flash attention implementation (sft_args.py _check_padding_free): a pinned
  // sdpa is refused by the target's knob, whatever the documents.
  test::refusal(
      "--model qwen2-7b --nodes 1 --method lora --lora-rank 16 --target swift --attention sdpa "
      "--no-out",
      {"--attention: swift v4.5 cannot express attention sdpa"});
  for (const char* t : {"torchtitan", "deepspeed", "accelerate", "torchtune", "fsdp-run"}) {
    CAPTURE(t);
    test::refusal(std::string("--model 8b --nodes 1 --hw h100-80gb --target ") + t + " --doc-len 1024 --no-out",
                  {"--doc-len: ", "cannot express doc_len 1024"});
  }
}
