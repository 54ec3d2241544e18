// Targets (planner/export/): every target and version loads strictly and cites its sources; the best plan of every
// strategy family a target can run, for several models and clusters, exports only keys of the target's key table and
// reads back into the same strategy; every knob a target cannot express is refused with its reason and the nearest
// plan; the CLI's --target and export.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "cli_runner.hpp"
#include "core/errors.hpp"
#include "export/export_plan.hpp"
#include "export/knob_table.hpp"
#include "export/target_search.hpp"
#include "export/target_table.hpp"
#include "report/identical_plans.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"
#include "search_fixtures.hpp"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

struct TargetRef {
  std::string target, version;
};

std::vector<TargetRef> all_targets() {
  std::vector<TargetRef> out;
  for (const auto& t : target_names(kRoot))
    for (const auto& v : target_versions(kRoot, t)) out.push_back({t, v});
  return out;
}

std::string tmp_dir(const std::string& name) { return test::tmp_dir("fsdp_export", name); }

struct Case {
  std::string model;
  std::string hw;
  int64_t nodes;
  bool lora;
};

}  // namespace

TEST_CASE("targets: every target and version loads strictly, cites commits and names a runtime that loads") {
  const auto targets = all_targets();
  std::set<std::string> names;
  for (const auto& t : targets) names.insert(t.target + " " + t.version);
  // The releases M14 asks for, each a file.
  for (const char* want : {"torchtitan v0.2.2", "torchtitan python-a9c5edc", "deepspeed v0.19", "accelerate v1.14",
                           "accelerate v1.14-fsdp1", "swift v4.5", "swift v3.12", "torchtune v0.6", "fsdp-run plan-v7"})
    CHECK_MESSAGE(names.count(want), want);
  for (const auto& t : target_names(kRoot)) {
    CAPTURE(t);
    CHECK(target_by_name(t).name() == t);
    int defaults = 0;
    for (const auto& v : target_versions(kRoot, t)) defaults += load_target_spec(kRoot, t, v).is_default ? 1 : 0;
    CHECK(defaults == 1);
    CHECK(load_target_spec(kRoot, t, "").is_default);
  }
  for (const auto& t : targets) {
    CAPTURE(t.target);
    CAPTURE(t.version);
    const TargetSpec spec = load_target_spec(kRoot, t.target, t.version);
    CHECK_NOTHROW(load_runtime(spec.runtime, kRoot));
    CHECK(spec.source.commit.size() == 40);
    CHECK(!spec.runtime_why.empty());
    auto check_rule = [](const KnobRule& r) {
      CHECK(find_knob(r.knob) != nullptr);
      CHECK(!r.why.empty());
      CHECK(r.source.commit.size() == 40);
      CHECK(!r.source.path.empty());
    };
    for (const KnobRule& r : spec.capabilities) check_rule(r);
    // A models-table entry's runtime loads, and names a model of the table; its rules are read as the target's.
    for (const auto& [zoo, over] : spec.model_overrides) {
      const std::string model = zoo;
      CAPTURE(model);
      CHECK(spec.model(model) != nullptr);
      if (!over.runtime.empty()) CHECK_NOTHROW(load_runtime(over.runtime, kRoot));
      for (const KnobRule& r : over.capabilities) check_rule(r);
    }
    for (const FileTable& f : spec.files)
      for (const auto& [key, rule] : f.keys) {
        const std::string key_name = key;  // a copy: clang 14 captures no structured binding
        CAPTURE(key_name);
        CHECK(rule.source.commit.size() == 40);
        CHECK(rule.source.repository.find('/') != std::string::npos);
      }
  }
}

TEST_CASE("targets: the README's knob tables are the data's (fsdp-plan --list-targets)") {
  const std::string readme = test::slurp(kRoot + "/README.md");
  const std::string begin = "<!-- targets:begin -->\n", end = "\n<!-- targets:end -->";
  const auto b = readme.find(begin), e = readme.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  std::string generated = targets_markdown(kRoot);
  while (!generated.empty() && generated.back() == '\n') generated.pop_back();
  CHECK(readme.substr(b + begin.size(), e - b - begin.size()) == generated);
}

TEST_CASE("targets: a key table or capability the program does not know is refused naming the file and key") {
  const std::string root = tmp_dir("badroot");
  for (const char* d : {"configs/models", "configs/runtimes", "configs/backends", "hwprofiles"}) {
    fs::create_directories(fs::path(root) / d);
    fs::remove(fs::path(root) / d);
    fs::create_directory_symlink(fs::path(kRoot) / d, fs::path(root) / d);
  }
  fs::create_directories(fs::path(root) / "configs/targets/torchtitan");
  std::ifstream in(fs::path(kRoot) / "configs/targets/torchtitan/v0.2.2.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string good = ss.str();
  auto write = [&](const std::string& text) {
    std::ofstream(fs::path(root) / "configs/targets/torchtitan/v0.2.2.yaml") << text;
  };
  auto refused = [&](const std::string& mention) {
    try {
      load_target_spec(root, "torchtitan", "v0.2.2");
      FAIL("loaded a broken target file");
    } catch (const InputError& e) {
      const std::string msg = e.what();
      CAPTURE(msg);
      CHECK(msg.find("v0.2.2.yaml") != std::string::npos);
      CHECK(msg.find(mention) != std::string::npos);
    }
  };
  write(good + "colour: blue\n");
  refused("colour");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string bad = good;
    REQUIRE(bad.find(from) != std::string::npos);
    bad.replace(bad.find(from), from.size(), to);
    write(bad);
  };
  with("training.seq_len: {type: int, min: 1}", "training.seq_len: {type: int, min: 1, units: tokens}");
  refused("units");
  with("  wrap:\n", "  warp:\n");
  refused("warp");
  // A model's own rules are read as strictly as the target's.
  with("    capabilities:\n      pp:\n", "    capabilities:\n      ppp:\n");
  refused("ppp");
  with("values: [none, params]", "values: [none, disk]");
  refused("disk");
  with("commit: 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce", "commit: v0.2.2");
  refused("commit");
  with("training.seq_len: {type: int", "training.seq_len: {type: integer");
  refused("integer");
  fs::remove_all(root);
}

TEST_CASE("export: every family's best plan per target, model and cluster writes key-table keys and reads back") {
  const std::vector<Case> cases{
      {"llama3-8b", "a100-80gb", 2, false}, {"llama3-70b", "h100-80gb", 8, false}, {"qwen2-7b", "a100-80gb", 1, true}};
  int exported_total = 0;
  for (const Case& cs : cases) {
    for (const auto& t : all_targets()) {
      CAPTURE(cs.model);
      CAPTURE(t.target);
      CAPTURE(t.version);
      const TargetSpec spec = load_target_spec(kRoot, t.target, t.version);
      auto setup = test::search_setup(cs.model, cs.hw, cs.nodes, spec.runtime);
      const ModelSpec& model = setup->graph->spec();
      std::set<std::string> given;
      if (cs.lora) {
        setup->req.base.method = Method::Lora;
        setup->req.base.lora.rank = 16;
        setup->req.base.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
        given = {"--method", "--lora-rank", "--lora-targets"};
      }
      const bool names_model = spec.models.empty() || spec.model(cs.model) != nullptr;
      if (!names_model) {
        CHECK_THROWS_WITH_AS(target_model(spec, cs.model, ""), doctest::Contains(cs.model.c_str()), InputError);
        continue;
      }
      const KnobRule* method = spec.rule("method", StrategyKind::Fsdp);
      if (cs.lora && method && !rule_admits(*method, "lora")) {
        // The user asked for LoRA: a target without it refuses, naming the flag and the knob.
        CHECK_THROWS_WITH_AS(restrict_search(
                                 spec, [&](const std::string& f) { return given.count(f) > 0; }, setup->req),
                             doctest::Contains("--method"), InputError);
        continue;
      }
      restrict_search(
          spec, [&](const std::string& f) { return given.count(f) > 0; }, setup->req);
      const SearchResult r = search_plans(setup->req);
      REQUIRE(!r.ranked.empty());
      for (const Candidate& c : r.ranked) REQUIRE(inexpressible(spec, c.strategy, setup->req.cluster).empty());
      int exported = 0;
      for (const auto& [family, verdict] : r.families) {
        if (!verdict.feasible || !verdict.best) continue;
        const std::string family_name = family;
        CAPTURE(family_name);
        const PlanFile plan = plan_file_for(model, setup->hw, setup->req.cluster, spec.runtime, verdict.best->strategy);
        const ExportResult ex = export_plan(plan, spec, kRoot);
        // Every key of every written file is in the key table, of its type and value (export_plan checks; the
        // files are rendered, parsed back with the table, and checked again).
        for (const WrittenFile& f : ex.files)
          if (f.raw_text.empty()) CHECK_NOTHROW(check_against_table(f.keys, spec.file(f.name), spec.spec_path));
        const std::string dir = tmp_dir(t.target + "_" + family);
        write_export(ex, spec, dir);
        for (const FileTable& ft : spec.files) CHECK(fs::exists(fs::path(dir) / ft.name));
        CHECK(fs::exists(fs::path(dir) / "launch.sh"));
        const Strategy back = import_export(dir, spec, plan.cluster);
        CHECK(strategy_identity(back) == strategy_identity(plan.strategy));
        fs::remove_all(dir);
        ++exported;
      }
      CHECK(exported > 0);
      exported_total += exported;
    }
  }
  MESSAGE("family best plans exported and read back: ", exported_total);
  CHECK(exported_total >= 50);
}

TEST_CASE("export: every knob a target cannot express is refused with its reason and the nearest plan") {
  auto setup = test::search_setup("llama3-8b", "a100-80gb", 2);
  const ModelSpec& model = setup->graph->spec();
  const Cluster cluster = setup->req.cluster;
  int refusals = 0;
  for (const auto& t : all_targets()) {
    const TargetSpec spec = load_target_spec(kRoot, t.target, t.version);
    for (const KnobRule& rule : spec.capabilities) {
      CAPTURE(t.target);
      CAPTURE(t.version);
      CAPTURE(rule.knob);
      const Knob* k = find_knob(rule.knob);
      REQUIRE(k != nullptr);
      for (const std::string& value : knob_samples(rule.knob)) {
        if (rule_admits(rule, value)) continue;
        // A plan where the knob applies (the rule's kind, sharding for wrap and prefetch, an adapter for LoRA).
        Strategy s;
        if (!rule.kinds.empty()) s.kind = rule.kinds.front();
        if (s.kind == StrategyKind::Hsdp) s.hsdp_group = cluster.gpus_per_node;
        if (rule.knob == "ddp_bucket_mb") s.kind = StrategyKind::Ddp;
        if (rule.knob == "hsdp_group") s.kind = StrategyKind::Hsdp;
        if (rule.knob == "lora_targets" || value == "lora" || value == "qlora") {
          s.method = Method::Lora;
          s.lora.rank = 8;
          s.lora.target_modules = {"q_proj", "v_proj"};
        }
        REQUIRE(k->set(s, value, cluster));
        if (!k->applies(s)) continue;
        if (spec.rule(rule.knob, s.kind) != &rule) continue;  // a kind-specific rule decides for this kind
        const PlanFile plan = plan_file_for(model, setup->hw, cluster, "fsdp-run", s);
        CAPTURE(value);
        try {
          export_plan(plan, spec, kRoot);
          FAIL("exported a plan with " << rule.knob << " " << value);
        } catch (const InputError& e) {
          const std::string msg = e.what();
          CAPTURE(msg);
          CHECK(msg.find(rule.knob + " " + value + ": " + rule.why) != std::string::npos);
          CHECK(msg.find(rule.source.path) != std::string::npos);
          CHECK(msg.find("the nearest plan " + spec.target + " runs: ") != std::string::npos);
          CHECK(msg.find("tokens/s/GPU") != std::string::npos);
        }
        // The nearest plan is one the target expresses.
        CHECK(inexpressible(spec, nearest_expressible(spec, s, cluster), cluster).empty());
        ++refusals;
      }
    }
  }
  MESSAGE("refusals checked: ", refusals);
  CHECK(refusals >= 210);
}

TEST_CASE("export: every value a target expresses round-trips, knob by knob (ddp, no-shard, hsdp, LoRA, ...)") {
  // The searches above export only the plans that fit; this writes every expressible value of every knob, fitting
  // or not, on llama3-8b over 2 x 8 GPUs, and reads it back.
  auto setup = test::search_setup("llama3-8b", "a100-80gb", 2);
  const ModelSpec& model = setup->graph->spec();
  const Cluster cluster = setup->req.cluster;
  int round_trips = 0;
  for (const auto& t : all_targets()) {
    const TargetSpec spec = load_target_spec(kRoot, t.target, t.version);
    const Strategy base = nearest_expressible(spec, Strategy{}, cluster);
    REQUIRE(inexpressible(spec, base, cluster).empty());
    // Each knob value on each strategy kind the target runs (DDP's buckets and checkpointing, HSDP's groups, ...).
    std::vector<Strategy> kinds;
    for (const std::string& kind : knob_samples("strategy")) {
      Strategy s = base;
      find_knob("strategy")->set(s, kind, cluster);
      if (inexpressible(spec, s, cluster).empty()) kinds.push_back(s);
    }
    REQUIRE(!kinds.empty());
    for (const Knob& k : knob_table()) {
      for (const std::string& value : knob_samples(k.name))
        for (const Strategy& kind_base : kinds) {
          Strategy s = kind_base;
          if (std::string(k.name) == "lora_targets") continue;  // below, with an adapter method
          REQUIRE(k.set(s, value, cluster));
          if (s.method != Method::Full) {
            s.lora.rank = 8;
            s.lora.target_modules = {"q_proj", "v_proj"};
          }
          // A knob that does not apply to the plan is not part of it (the search normalises it away), nor is a plan
          // the simulator would refuse (a mesh that does not divide the model or the world) or an HSDP group that
          // spans every data-parallel rank (FSDP by another name).
          if (!k.applies(s) || !inexpressible(spec, s, cluster).empty()) continue;
          if (s.kind == StrategyKind::Hsdp && s.hsdp_group >= s.mesh.dp(cluster.world_size())) continue;
          try {
            validate_strategy(s, model, cluster);
          } catch (const InputError&) {
            continue;
          }
          CAPTURE(t.target);
          CAPTURE(t.version);
          CAPTURE(k.name);
          CAPTURE(value);
          const PlanFile plan = plan_file_for(model, setup->hw, cluster, spec.runtime, s);
          const std::string dir = tmp_dir("knob");
          write_export(export_plan(plan, spec, kRoot), spec, dir);
          CHECK(strategy_identity(import_export(dir, spec, plan.cluster)) == strategy_identity(s));
          fs::remove_all(dir);
          ++round_trips;
        }
    }
    // LoRA with each admitted module list, where the target has LoRA.
    Strategy lora = base;
    lora.method = Method::Lora;
    lora.lora.rank = 32;
    for (const std::string& mods : knob_samples("lora_targets")) {
      find_knob("lora_targets")->set(lora, mods, cluster);
      if (!inexpressible(spec, lora, cluster).empty()) continue;
      CAPTURE(t.target);
      CAPTURE(mods);
      const std::string dir = tmp_dir("lora");
      write_export(export_plan(plan_file_for(model, setup->hw, cluster, spec.runtime, lora), spec, kRoot), spec, dir);
      CHECK(strategy_identity(import_export(dir, spec, ClusterShape{"a100-80gb", "cuda", 2, 8, "", ""})) ==
            strategy_identity(lora));
      fs::remove_all(dir);
      ++round_trips;
    }
  }
  MESSAGE("knob values round-tripped: ", round_trips);
  CHECK(round_trips >= 700);
}

TEST_CASE("export: the written values are the plan's (torchtitan TOML, DeepSpeed JSON, torchtune LoRA)") {
  auto setup = test::search_setup("llama3-8b", "a100-80gb", 2);
  const Cluster c = setup->req.cluster;
  Strategy s;
  s.kind = StrategyKind::Hsdp;
  s.hsdp_group = 8;
  s.act_ckpt = ActCkpt::Full;
  s.ckpt_every = 2;
  s.micro_batch = 2;
  s.grad_accum = 4;
  s.attention = AttentionImpl::Sdpa;
  const TargetSpec tt = load_target_spec(kRoot, "torchtitan", "v0.2.2");
  ExportResult ex = export_plan(plan_file_for(setup->graph->spec(), setup->hw, c, tt.runtime, s), tt, kRoot);
  const FlatDoc& d = ex.files.front().keys;
  CHECK(doc_get(d, "parallelism.data_parallel_replicate_degree", "t") == 2);
  CHECK(doc_get(d, "parallelism.data_parallel_shard_degree", "t") == 8);
  CHECK(doc_get(d, "training.global_batch_size", "t") == 2 * 16 * 4);
  CHECK(doc_get(d, "activation_checkpoint.mode", "t") == "selective");
  CHECK(doc_get(d, "activation_checkpoint.selective_ac_option", "t") == "2");
  CHECK(doc_get(d, "model.flavor", "t") == "8B");
  CHECK(render_file(ex.files.front(), tt.file("job.toml")).find("[parallelism]\n") != std::string::npos);

  Strategy z;
  z.kind = StrategyKind::Zero3;
  z.offload = Offload::Params;
  z.reduce_dtype = DType::Bf16;
  z.micro_batch = 4;
  z.grad_accum = 8;
  const TargetSpec ds = load_target_spec(kRoot, "deepspeed", "");
  ex = export_plan(plan_file_for(setup->graph->spec(), setup->hw, c, ds.runtime, z), ds, kRoot);
  const FlatDoc& j = ex.files.front().keys;
  CHECK(doc_get(j, "zero_optimization.stage", "d") == 3);
  CHECK(doc_get(j, "zero_optimization.offload_param.device", "d") == "cpu");
  CHECK(doc_get(j, "communication_data_type", "d") == "bf16");
  CHECK(doc_get(j, "train_batch_size", "d") == 4 * 16 * 8);
  CHECK(std::any_of(ex.files.begin(), ex.files.end(), [](const WrittenFile& f) {
    return f.name == "hostfile" && f.raw_text == "node-0 slots=8\nnode-1 slots=8\n";
  }));

  Strategy l;
  l.kind = StrategyKind::Fsdp;
  l.method = Method::Lora;
  l.lora.rank = 16;
  l.lora.target_modules = {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  l.param_dtype = l.reduce_dtype = l.master_dtype = DType::Bf16;
  l.attention = AttentionImpl::Sdpa;
  auto qwen = test::search_setup("qwen2-7b", "a100-80gb", 1);
  const TargetSpec tune = load_target_spec(kRoot, "torchtune", "v0.6");
  ex = export_plan(plan_file_for(qwen->graph->spec(), qwen->hw, qwen->req.cluster, tune.runtime, l), tune, kRoot);
  const FlatDoc& y = ex.files.front().keys;
  CHECK(doc_get(y, "model._component_", "y") == "torchtune.models.qwen2.lora_qwen2_7b");
  CHECK(doc_get(y, "model.lora_attn_modules", "y") == nlohmann::json({"q_proj", "output_proj"}));
  CHECK(doc_get(y, "model.apply_lora_to_mlp", "y") == true);
  CHECK(doc_get(y, "dtype", "y") == "bf16");
  CHECK(ex.launch_command.find("lora_finetune_distributed") != std::string::npos);
}

TEST_CASE("export: the mesh (tp, pp, schedule) in torchtitan's configs, refused where a target has none") {
  // llama3-70b on 8 nodes x 8: tp 8 (in the node) x pp 4 x dp 2, 16 micro-batches of 1 through interleaved 1F1B.
  auto setup = test::search_setup("llama3-70b", "h100-80gb", 8);
  const Cluster c = setup->req.cluster;
  Strategy s = test::fsdp_full_ckpt_plan(16, 8, 4);
  s.mesh.pp_schedule = PipelineSchedule::Interleaved1F1B;
  s.mesh.pp_virtual_stages = 2;
  const TargetSpec toml = load_target_spec(kRoot, "torchtitan", "v0.2.2");
  const PlanFile plan = plan_file_for(setup->graph->spec(), setup->hw, c, toml.runtime, s);
  ExportResult ex = export_plan(plan, toml, kRoot);
  const FlatDoc& d = ex.files.front().keys;
  CHECK(doc_get(d, "parallelism.tensor_parallel_degree", "t") == 8);
  CHECK(doc_get(d, "parallelism.pipeline_parallel_degree", "t") == 4);
  CHECK(doc_get(d, "parallelism.pipeline_parallel_schedule", "t") == "Interleaved1F1B");
  CHECK(doc_get(d, "parallelism.data_parallel_shard_degree", "t") == 2);
  CHECK(doc_get(d, "parallelism.pipeline_parallel_microbatch_size", "t") == 1);
  CHECK(doc_get(d, "training.local_batch_size", "t") == 16);
  CHECK(doc_get(d, "training.global_batch_size", "t") == 32);
  // The stages split as priced: torchtitan's embedding and output weights 0 (1 each by default would move a layer
  // off the first and the last stage).
  CHECK(doc_get(d, "parallelism.pipeline_parallel_first_stage_less_layers", "t") == 0);
  CHECK(doc_get(d, "parallelism.pipeline_parallel_last_stage_less_layers", "t") == 0);
  std::string dir = tmp_dir("mesh");
  write_export(ex, toml, dir);
  CHECK(strategy_identity(import_export(dir, toml, plan.cluster)) == strategy_identity(s));
  {
    // A job config that weights them otherwise is not the plan: refused, naming the file and the key.
    const std::string path = dir + "/job.toml";
    std::string text = test::slurp(path);
    const std::string from = "pipeline_parallel_first_stage_less_layers = 0";
    REQUIRE(text.find(from) != std::string::npos);
    text.replace(text.find(from), from.size(), "pipeline_parallel_first_stage_less_layers = 1");
    std::ofstream(path) << text;
    CHECK_THROWS_WITH_AS(import_export(dir, toml, plan.cluster),
                         doctest::Contains("job.toml: parallelism.pipeline_parallel_first_stage_less_layers = 1"),
                         InputError);
  }
  fs::remove_all(dir);

  const TargetSpec py = load_target_spec(kRoot, "torchtitan", "python-a9c5edc");
  ex = export_plan(plan_file_for(setup->graph->spec(), setup->hw, c, py.runtime, s), py, kRoot);
  CHECK(doc_get(ex.files.front().keys, "training.local_batch_size", "p") == 16);
  CHECK(doc_get(ex.files.front().keys, "parallelism.pipeline_parallel_microbatch_size", "p") == 1);
  CHECK(doc_get(ex.files.front().keys, "training.global_batch_size", "p") == 32);
  CHECK(doc_get(ex.files.front().keys, "parallelism.pipeline_parallel_first_stage_less_layers", "p") == 0);
  CHECK(doc_get(ex.files.front().keys, "parallelism.pipeline_parallel_last_stage_less_layers", "p") == 0);
  dir = tmp_dir("mesh");
  write_export(ex, py, dir);
  CHECK(strategy_identity(import_export(dir, py, plan.cluster)) == strategy_identity(s));
  fs::remove_all(dir);

  // Virtual stages other than torchtitan's default of 2 per rank are refused by name.
  Strategy v3 = s;
  v3.mesh.pp_virtual_stages = 3;
  CHECK_THROWS_WITH_AS(export_plan(plan_file_for(setup->graph->spec(), setup->hw, c, toml.runtime, v3), toml, kRoot),
                       doctest::Contains("--pp-virtual-stages"), InputError);
  // A target that writes data parallelism only refuses the mesh, naming the knob.
  for (const char* t : {"deepspeed", "accelerate", "swift", "torchtune"}) {
    const TargetSpec spec = load_target_spec(kRoot, t, "");
    CAPTURE(t);
    const auto v = inexpressible(spec, s, c);
    CHECK(std::any_of(v.begin(), v.end(), [](const KnobViolation& x) { return x.message().rfind("tp 8: ", 0) == 0; }));
    CHECK(std::any_of(v.begin(), v.end(), [](const KnobViolation& x) { return x.message().rfind("pp 4: ", 0) == 0; }));
  }
  // fsdp-run runs the mesh, but not the interleaved schedule (executor/shard/mesh.cpp).
  const TargetSpec fsdp_run = load_target_spec(kRoot, "fsdp-run", "");
  const auto run = inexpressible(fsdp_run, s, c);
  REQUIRE(run.size() == 1);
  CHECK(run.front().message().rfind("pp_schedule interleaved-1f1b: ", 0) == 0);
}

TEST_CASE("cli: --target writes the target's files next to plan.yaml; bad targets, versions and pins are refused") {
  const std::string dir = tmp_dir("cli_target");
  auto r = test::run_cli("--model llama3-8b --nodes 2 --target torchtitan --out " + dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(fs::exists(dir + "/plan.yaml"));
  CHECK(fs::exists(dir + "/job.toml"));
  const std::string launch = test::slurp(dir + "/launch.sh");
  CHECK(launch.find("torchrun --nnodes 2 --nproc_per_node 8") != std::string::npos);
  CHECK(launch.find("--job.config_file job.toml") != std::string::npos);
  CHECK(r.err.find("target: torchtitan v0.2.2") != std::string::npos);
  CHECK(r.err.find("pinned attention sdpa") != std::string::npos);
  CHECK(r.out.find("runtime torchtitan-2510") != std::string::npos);
  // The plan file carries the runtime that predicted it: the release's trainer (configs/runtimes/torchtitan-2510.yaml).
  CHECK(read_plan_file(dir + "/plan.yaml").runtime == "torchtitan-2510");

  r = test::run_cli("--model llama3-8b --nodes 2 --target swift --target-version v3.12 --json --out " + dir +
                    "/plan.yaml");
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["target"]["version"] == "v3.12");
  CHECK(j["target"]["runtime"] == "transformers-deepspeed");
  CHECK(test::slurp(dir + "/swift_sft.sh").find("--train_type full") != std::string::npos);

  test::refusal("--model llama3-8b --target torchtitn", {"unknown target 'torchtitn'", "torchtitan"});
  test::refusal("--model llama3-8b --target swift --target-version v9", {"no version 'v9'", "v3.12, v4.5"});
  test::refusal("--model llama3-8b --target-version v4.5", {"--target-version", "needs --target"});
  test::refusal("--model llama3-8b --target torchtitan --runtime pytorch", {"--runtime", "runtime torchtitan"});
  test::refusal("--model llama3-8b --nodes 2 --target torchtitan --act-ckpt selective --no-out",
                {"--act-ckpt", "act_ckpt selective", "selective-op"});
  test::refusal("--model llama3-8b --target accelerate --method lora --lora-rank 8 --no-out",
                {"--method", "method lora"});
  test::refusal("--model qwen2-7b --target torchtitan --no-out", {"qwen2-7b", "torchtitan"});
  fs::remove_all(dir);
}

TEST_CASE("cli: --target torchtitan prices its release's pipeline, which keeps no micro-batch's logits") {
  // Llama 3 70B on 8 A100 nodes, tp 4 x pp 8: 512 micro-batches of one sequence a step. torchtitan's end-2024 trainer
  // (runtime torchtitan) kept every micro-batch's output to the step's end, the last stage's logits 512 x 4096 x
  // 128256 / 4 in bf16 (125 GiB): no plan fits. The releases --target writes for (v0.2.2, configs/runtimes/
  // torchtitan-2510.yaml: pp_schedule.step(..., return_outputs=False)) keep none, and the plan fits.
  const std::string dir = tmp_dir("cli_target_pp");
  const std::string args = "--model llama3-70b --nodes 8 --tp 4 --pp 8 --out " + dir + "/plan.yaml";
  auto old = test::run_cli(args + " --runtime torchtitan");
  CAPTURE(old.out);
  CHECK(old.code == 1);
  CHECK(old.out.find("No plan fits") != std::string::npos);
  auto r = test::run_cli(args + " --target torchtitan");
  CAPTURE(r.out);
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const PlanFile plan = read_plan_file(dir + "/plan.yaml");
  CHECK(plan.runtime == "torchtitan-2510");
  CHECK(plan.strategy.mesh.pp == 8);
  const auto files = read_export(dir, load_target_spec(kRoot, "torchtitan", "v0.2.2"));
  REQUIRE(files.count("job.toml") == 1);
  CHECK(doc_get(files.at("job.toml"), "parallelism.pipeline_parallel_degree", "job.toml") == 8);
}

TEST_CASE("cli: a local Hugging Face model directory is the model a path-loading target launches, via plan.yaml") {
  // A snapshot's config.json records no _name_or_path: the model is named after its directory, which no target's table
  // names; swift and DeepSpeed's script load a local path, so they are given the directory (absolute: the launch may
  // run elsewhere), through plan.yaml's model.path for a later export.
  const std::string dir = tmp_dir("hf_dir");
  const std::string model_dir = dir + "/Qwen2-7B-local";
  fs::create_directories(model_dir);
  fs::copy_file(std::string(FSDP_TEST_DATA) + "/hf/qwen2-7b.json", model_dir + "/config.json");
  REQUIRE(test::slurp(model_dir + "/config.json").find("_name_or_path") == std::string::npos);
  const std::string abs_dir = fs::weakly_canonical(model_dir).string();
  auto r = test::run_cli("--model " + model_dir + " --nodes 1 --target swift --out " + dir + "/plan.yaml");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(test::slurp(dir + "/swift_sft.sh").find("--model " + abs_dir + " ") != std::string::npos);
  const PlanFile plan = read_plan_file(dir + "/plan.yaml");
  CHECK(plan.model_name == "Qwen2-7B-local");
  CHECK(plan.model_path == abs_dir);
  r = test::run_cli("export " + dir + "/plan.yaml --to deepspeed --out " + dir + "/ds");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  bool named = false;
  for (const auto& e : fs::directory_iterator(dir + "/ds"))
    named = named || test::slurp(e.path().string()).find(abs_dir) != std::string::npos;
  CHECK(named);
  // The config.json given by path: the same directory.
  r = test::run_cli("--model " + model_dir + "/config.json --nodes 1 --target swift --no-out");
  CAPTURE(r.err);
  CHECK(r.code == 0);
  // A zoo model has no directory: a target whose table lacks it still refuses it, naming the ways to give one.
  test::refusal("--model qwen2-7b --target torchtitan --no-out", {"qwen2-7b", "torchtitan"});
  const TargetSpec swift = load_target_spec(kRoot, "swift", "v4.5");
  CHECK(target_model(swift, "Qwen2-7B-local", "/data/Qwen2-7B-local").at("hf_id") == "/data/Qwen2-7B-local");
  CHECK_THROWS_WITH_AS(target_model(swift, "Qwen2-7B-local", ""), doctest::Contains("Hugging Face directory"),
                       InputError);
  fs::remove_all(dir);
}

TEST_CASE("cli: export writes an expressible plan's files and refuses the rest, naming the knob") {
  const std::string dir = tmp_dir("cli_export");
  auto r = test::run_cli(
      "--model llama3-8b --nodes 2 --strategy zero3 --wrap layer --reshard-after-forward true --act-ckpt full --out " +
      dir + "/plan.yaml");
  REQUIRE(r.code == 0);
  r = test::run_cli("export " + dir + "/plan.yaml --to deepspeed --out " + dir + "/ds");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(fs::exists(dir + "/ds/ds_config.json"));
  CHECK(fs::exists(dir + "/ds/hostfile"));
  CHECK(r.out.find("predicted with runtime deepspeed") != std::string::npos);
  CHECK(r.out.find("launch: deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8") != std::string::npos);
  // Same plan, torchtitan: zero3 is not a torchtitan strategy.
  test::refusal("export " + dir + "/plan.yaml --to torchtitan --out " + dir + "/tt",
                {"strategy zero3", "the nearest plan torchtitan runs: fsdp"});
  CHECK(!fs::exists(dir + "/tt/job.toml"));
  test::refusal("export " + dir + "/plan.yaml --to nemo", {"unknown target 'nemo'"});
  test::refusal("export " + dir + "/plan.yaml", {"--to"});
  test::refusal("export " + dir + "/plan.yaml --to torchtitan --target-version v0.1", {"no version 'v0.1'"});
  test::refusal("export " + dir + "/missing.yaml --to torchtitan", {"missing.yaml"});
  fs::remove_all(dir);
}

TEST_CASE("export readers: a malformed or foreign file is an InputError naming it, never a crash") {
  const TargetSpec acc = load_target_spec(kRoot, "accelerate", "v1.14");
  const TargetSpec tt = load_target_spec(kRoot, "torchtitan", "v0.2.2");
  const TargetSpec ds = load_target_spec(kRoot, "deepspeed", "v0.19");
  const TargetSpec sw = load_target_spec(kRoot, "swift", "v4.5");
  const TargetSpec tune = load_target_spec(kRoot, "torchtune", "v0.6");
  const std::vector<std::tuple<const FileTable*, std::string, std::string>> cases{
      {&acc.file("accelerate_config.yaml"), "? [a]\n: 1\n", "a key must be a plain name"},  // fuzz_target_files
      {&acc.file("accelerate_config.yaml"), "fsdp_config: {fsdp_version: [{b: 1}]}\n", "list of names"},
      {&acc.file("accelerate_config.yaml"), "mixed_precision: fp4\n", "mixed_precision"},
      {&acc.file("accelerate_config.yaml"), "colour: blue\n", "colour"},
      {&tune.file("torchtune_config.yaml"), "model: {lora_attn_modules: [{b: 1}]}\n", "list of names"},
      {&tune.file("torchtune_config.yaml"), "batch_size: ~\n", "batch_size"},
      {&tt.file("job.toml"), "[training]\nseq_len\n", "key = value"},
      {&tt.file("job.toml"), "[training]\nseq_len = 4k\n", "seq_len"},
      {&tt.file("job.toml"), "[training]\nseq_len = 1\nseq_len = 2\n", "given twice"},
      {&ds.file("ds_config.json"), "[1, 2]", "not a JSON object"},
      {&ds.file("ds_config.json"), "{\"train_batch_size\": \"8\"}", "train_batch_size"},
      {&sw.file("swift_sft.sh"), "swift sft \\\n    --max_length 1 2\n", "takes one value"},
      {&sw.file("swift_sft.sh"), "swift sft \\\n    --train_type lora\n", "train_type"},
  };
  for (const auto& [table, text, mention] : cases) {
    const std::string input = text;
    CAPTURE(input);
    try {
      parse_file(text, *table, "in/" + table->name);
      FAIL("parsed");
    } catch (const InputError& e) {
      const std::string msg = e.what();
      CAPTURE(msg);
      CHECK(msg.find("in/" + table->name) != std::string::npos);
      CHECK(msg.find(mention) != std::string::npos);
    }
  }
}

TEST_CASE("export: ms-swift is told what of a vision-language model trains, and its whole sequence") {
  // ms-swift freezes the vision tower and the aligner unless told (TunerArguments freeze_vit, freeze_aligner): the
  // export writes both for every vision-language model, as the plan has them, and max_length counts the image tokens.
  ModelSpec m = load_model("qwen2.5-vl-7b", kRoot);
  m.vision->image_tokens = 1024;
  const HardwareProfile hw = load_hardware("a100-80gb", kRoot);
  const Cluster cluster{1, 8};
  for (const char* version : {"v4.5", "v3.12"}) {
    const TargetSpec spec = load_target_spec(kRoot, "swift", version);
    for (VisionTraining t : {VisionTraining::All, VisionTraining::Projector, VisionTraining::None}) {
      CAPTURE(version);
      CAPTURE(to_string(t));
      Strategy s;
      s.kind = StrategyKind::Zero3;
      s.param_dtype = s.reduce_dtype = DType::Bf16;
      s.seq_len = 4096;
      s.train_vision = t;
      const PlanFile plan = plan_file_for(m, hw, cluster, spec.runtime, s);
      const ExportResult ex = export_plan(plan, spec, kRoot);
      const FlatDoc& args = ex.files.front().keys;
      CHECK(doc_get(args, "freeze_vit", "swift_sft.sh").get<bool>() == (t != VisionTraining::All));
      CHECK(doc_get(args, "freeze_aligner", "swift_sft.sh").get<bool>() == (t == VisionTraining::None));
      CHECK(doc_get(args, "max_length", "swift_sft.sh").get<int64_t>() == 4096 + 1024);
      CHECK(doc_get(args, "model", "swift_sft.sh").get<std::string>() == "Qwen/Qwen2.5-VL-7B-Instruct");
      const std::string dir = tmp_dir(std::string("swift_vlm_") + version);
      write_export(ex, spec, dir);
      CHECK(import_export(dir, spec, plan.cluster).train_vision == t);
      fs::remove_all(dir);
    }
  }
  // A language model's export names no vision part; a target whose files name no frozen module refuses a frozen one.
  const TargetSpec swift = load_target_spec(kRoot, "swift", "v4.5");
  Strategy s;
  s.kind = StrategyKind::Zero3;
  s.param_dtype = s.reduce_dtype = DType::Bf16;
  const PlanFile text_only = plan_file_for(load_model("qwen2-7b", kRoot), hw, cluster, swift.runtime, s);
  CHECK_FALSE(doc_has(export_plan(text_only, swift, kRoot).files.front().keys, "freeze_vit"));
  const TargetSpec deepspeed = load_target_spec(kRoot, "deepspeed", "v0.19");
  s.train_vision = VisionTraining::None;
  const std::vector<KnobViolation> refused = inexpressible(deepspeed, s, cluster);
  REQUIRE(refused.size() == 1);
  CHECK(refused.front().knob == "train_vision");
  CHECK(refused.front().message().find("names no frozen module") != std::string::npos);
}

TEST_CASE(
    "export: ms-swift's LoRA on a vision-language model with its vision side frozen adapts the language model only") {
  // PEFT matches --target_modules' names in every module, the tower's too (Qwen2.5-VL's vision MLP is gate_proj,
  // up_proj, down_proj), where the plan prices the frozen tower without adapters: the export writes --target_regex
  // over every module outside the tower and the aligner, which a shell reads as one word and the import reads back.
  const HardwareProfile hw = load_hardware("a100-80gb", kRoot);
  const Cluster cluster{1, 8};
  struct Case {
    const char* model;
    std::vector<std::string> adapted, frozen;  // module names under Transformers' layouts
  };
  const std::vector<Case> cases = {
      {"qwen2.5-vl-7b",
       {"model.language_model.layers.0.mlp.gate_proj", "model.layers.27.self_attn.q_proj"},
       {"model.visual.blocks.0.mlp.gate_proj", "visual.blocks.31.mlp.down_proj", "model.visual.merger.mlp.0"}},
      {"internvl2.5-8b",
       {"language_model.model.layers.0.self_attn.q_proj"},
       {"vision_model.encoder.layers.0.attn.q_proj", "mlp1.gate_proj"}},
      {"llava-1.5-7b",
       {"model.language_model.layers.3.mlp.gate_proj"},
       {"model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj", "multi_modal_projector.gate_proj"}},
  };
  for (const char* version : {"v4.5", "v3.12"}) {
    const TargetSpec spec = load_target_spec(kRoot, "swift", version);
    for (const Case& c : cases) {
      CAPTURE(version);
      CAPTURE(c.model);
      ModelSpec m = load_model(c.model, kRoot);
      if (m.vision->image_tokens == 0) m.vision->image_tokens = 1024;
      Strategy s;
      s.kind = StrategyKind::Zero2;
      s.param_dtype = s.reduce_dtype = DType::Bf16;
      s.method = Method::Lora;
      s.lora.rank = 8;
      s.lora.target_modules = {"q_proj", "v_proj", "gate_proj"};
      s.train_vision = VisionTraining::None;
      const PlanFile plan = plan_file_for(m, hw, cluster, spec.runtime, s);
      const ExportResult ex = export_plan(plan, spec, kRoot);
      const FlatDoc& args = ex.files.front().keys;
      CHECK_FALSE(doc_has(args, "target_modules"));
      const std::regex targets(doc_get(args, "target_regex", "swift_sft.sh").get<std::string>());
      for (const std::string& name : c.adapted) CHECK_MESSAGE(std::regex_match(name, targets), name);
      for (const std::string& name : c.frozen) CHECK_MESSAGE(!std::regex_match(name, targets), name);
      CHECK_FALSE(std::regex_match("model.language_model.layers.0.self_attn.k_proj", targets));
      const std::string dir = tmp_dir(std::string("swift_vlm_lora_") + version);
      write_export(ex, spec, dir);
      CHECK(test::slurp(dir + "/swift_sft.sh").find("--target_regex '^(?!") != std::string::npos);
      const Strategy back = import_export(dir, spec, plan.cluster);
      CHECK(back.lora.target_modules == s.lora.target_modules);
      CHECK(back.train_vision == VisionTraining::None);
      fs::remove_all(dir);
      // With the tower trained the names go to --target_modules, as PEFT applies them everywhere.
      s.train_vision = VisionTraining::All;
      const ExportResult all = export_plan(plan_file_for(m, hw, cluster, spec.runtime, s), spec, kRoot);
      CHECK(doc_get(all.files.front().keys, "target_modules", "swift_sft.sh").size() == 3);
      CHECK_FALSE(doc_has(all.files.front().keys, "target_regex"));
    }
  }
  // A vision-language model the table does not name (a config.json) has no module names to exclude: refused.
  const TargetSpec spec = load_target_spec(kRoot, "swift", "v4.5");
  ModelSpec m = load_model("qwen2.5-vl-7b", kRoot);
  m.vision->image_tokens = 1024;
  Strategy s;
  s.kind = StrategyKind::Zero2;
  s.param_dtype = s.reduce_dtype = DType::Bf16;
  s.method = Method::Lora;
  s.lora.rank = 8;
  s.lora.target_modules = {"q_proj"};
  s.train_vision = VisionTraining::None;
  PlanFile plan = plan_file_for(m, hw, cluster, spec.runtime, s);
  plan.model_name = "/data/my-vlm";
  CHECK_THROWS_WITH_AS(export_plan(plan, spec, kRoot), doctest::Contains("has no vision_modules"), InputError);
}

TEST_CASE("export: every model ms-swift names plans and exports under its runtime, by its hub id") {
  const HardwareProfile hw = load_hardware("a100-80gb", kRoot);
  const Cluster cluster{2, 8};
  const TargetSpec spec = load_target_spec(kRoot, "swift", "v4.5");
  REQUIRE(spec.models.size() >= 20);
  for (const auto& [name, ids] : spec.models) {
    CAPTURE(name);
    ModelSpec m = load_model(name, kRoot);
    if (m.vision && m.vision->image_tokens == 0) m.vision->image_tokens = 1024;  // dynamic resolution
    Strategy s;
    s.kind = StrategyKind::Zero3;
    s.param_dtype = s.reduce_dtype = DType::Bf16;
    s.act_ckpt = ActCkpt::Full;
    s.seq_len = 2048;
    const PlanFile plan = plan_file_for(m, hw, cluster, spec.runtime, s);
    CHECK_NOTHROW(simulate_plan(plan, kRoot));
    const ExportResult ex = export_plan(plan, spec, kRoot);
    CHECK(doc_get(ex.files.front().keys, "model", "swift_sft.sh").get<std::string>() == ids.at("hf_id"));
  }
}

TEST_CASE("export: --target swift plans a vision-language model as ms-swift trains it unless told") {
  // restrict_search sets the base strategy's train_vision to the target's default (its rule's first value) for a
  // vision-language model when --train-vision is not given: ms-swift's none; a pinned value stays; a language model
  // and a target without frozen modules keep all.
  ModelSpec m = load_model("qwen2.5-vl-7b", kRoot);
  m.vision->image_tokens = 1024;
  const ModuleGraph vlm(m);
  const ModuleGraph llm(load_model("qwen2-7b", kRoot));
  auto planned = [&](const ModuleGraph& g, const std::string& target, const std::string& version, bool given) {
    SearchRequest req;
    req.graph = &g;
    req.cluster = Cluster{1, 8};
    req.base.train_vision = VisionTraining::All;
    restrict_search(
        load_target_spec(kRoot, target, version), [&](const std::string& f) { return given && f == "--train-vision"; },
        req);
    return req.base.train_vision;
  };
  CHECK(planned(vlm, "swift", "v4.5", false) == VisionTraining::None);
  CHECK(planned(vlm, "swift", "v3.12", false) == VisionTraining::None);
  CHECK(planned(vlm, "swift", "v4.5", true) == VisionTraining::All);
  CHECK(planned(llm, "swift", "v4.5", false) == VisionTraining::All);
  CHECK(planned(vlm, "deepspeed", "v0.19", false) == VisionTraining::All);
}
