// fsdp-run end to end: launch paths, refusals, a killed or hung rank, checkpoints.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dist/comm.hpp"
#include "dist/launcher.hpp"
#include "io/safetensors.hpp"
#include "model/transformer.hpp"
#include "report/plan_simulation.hpp"
#include "safetensors_edit.hpp"
#include "shard/sharded_model.hpp"
#include "test_common.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec::test {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Result = ShellResult;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() / ("exec_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

std::string write_plan(const TmpDir& d, const PlanFile& p, const std::string& name = "plan.yaml") {
  const std::string f = d / name;
  write_plan_file(p, f);
  return f;
}

const std::string kBin = FSDP_RUN_BIN;

// One rank started by hand with the torchrun variables; output to a file.
pid_t spawn_rank(int rank, int world, int port, const std::vector<std::string>& args, const std::string& log) {
  std::fflush(stdout);  // the child must not replay our buffered output
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives the test, however the test ends
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    ::dup2(::fileno(stdout), 2);
    std::vector<char*> av{const_cast<char*>(kBin.c_str())};
    for (auto& a : args) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    ::execv(kBin.c_str(), av.data());
    std::_Exit(127);
  }
  return pid;
}

// Waits for a child, at most `limit`; returns its exit code, or -1 on timeout.
int wait_for(pid_t pid, std::chrono::seconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

std::string slurp(const std::string& f) {
  std::ifstream in(f);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool wait_for_text(const std::string& file, const std::string& text, std::chrono::seconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (slurp(file).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The step directories of a checkpoint root, oldest first.
std::vector<fs::path> step_dirs(const std::string& root) {
  std::vector<fs::path> steps;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.path().extension().empty()) steps.push_back(e.path());
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t step_of(const fs::path& step_dir) { return std::stoll(step_dir.filename().string().substr(5)); }

std::vector<double> losses(const std::string& report) {
  json j = json::parse(slurp(report));
  std::vector<double> v;
  for (auto& s : j.at("steps")) v.push_back(s.at("loss").get<double>());
  return v;
}

}  // namespace

TEST_CASE("launch: --nproc-per-node self-launch and torchrun variables by hand give the same run") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 2));
  Result r = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 3 --log-every 1 --report " + (d / "a.json"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("step 3") != std::string::npos);
  json a = json::parse(slurp(d / "a.json"));
  CHECK(a.at("world_size") == 2);
  CHECK(a.at("steps").size() == 3);
  for (const auto& st : a.at("steps")) {  // exposed communication: part of the step, never more
    CHECK(st.at("comm_wait_s").get<double>() >= 0.0);
    CHECK(st.at("comm_wait_s").get<double>() <= st.at("time_s").get<double>());
  }
  auto per_rank = a.at("memory").at("peak_bytes_per_rank").get<std::vector<int64_t>>();
  REQUIRE(per_rank.size() == 2);
  CHECK(a.at("memory").at("peak_bytes").get<int64_t>() == std::max(per_rank[0], per_rank[1]));
  CHECK(a.at("memory").at("breakdown").contains("sharded_params"));
  CHECK(a.at("memory").at("breakdown").contains("activations"));
  CHECK(a.at("host_allocator") == "glibc malloc: mmap threshold 32 MiB, trim threshold 1 GiB");
  // The plan's attention (sdpa) as this build runs it: eager on a LibTorch without fused attention, said beside it.
  const std::string ran = to_string(executed_attention(AttentionImpl::Sdpa));
  CHECK(a.at("plan").at("attention") == ran);
  CHECK(a.at("plan").contains("attention_planned") == (ran != "sdpa"));
  CHECK((r.out.find("fsdp-run: the plan's attention sdpa ran as eager (this LibTorch has no fused attention)") !=
         std::string::npos) == (ran != "sdpa"));
  // Where the peak was reached, in the simulator's peak_phase words ("backward layers.1 (micro-batch 1)").
  const std::string phase = a.at("memory").at("peak_phase").get<std::string>();
  INFO("peak phase: " << phase);
  // Any word of that vocabulary: which one can change with the transport threads' timing (in 23 runs of this
  // test, one reported none of forward, backward, post-backward, gradient norm and optimizer step).
  bool known = phase == "optimizer step" || phase == "gradient norm";
  for (const char* p : {"forward ", "backward ", "post-backward ", "fwd all-gather ", "bwd all-gather ",
                        "head+loss forward ", "loss backward "})
    known = known || phase.rfind(p, 0) == 0;
  CHECK(known);

  const int port = pick_free_port();
  std::vector<std::string> args{plan, "--steps", "3", "--report", d / "b.json"};
  pid_t r0 = spawn_rank(0, 2, port, args, d / "r0.log"), r1 = spawn_rank(1, 2, port, args, d / "r1.log");
  CHECK(wait_for(r0, std::chrono::seconds(120)) == 0);
  CHECK(wait_for(r1, std::chrono::seconds(30)) == 0);
  auto la = losses(d / "a.json"), lb = losses(d / "b.json");
  REQUIRE(la.size() == lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) CHECK(la[i] == lb[i]);
}

TEST_CASE("host allocator: malloc settings in the environment win, and the report says so") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 2));
  Result r = sh("MALLOC_TRIM_THRESHOLD_=4194304 " + kBin + " --emulate-world-size 2 " + plan + " --steps 1 --report " +
                (d / "e.json"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(json::parse(slurp(d / "e.json")).at("host_allocator") == "glibc malloc: as the environment sets it");
}

TEST_CASE("refusals: world-size mismatch, bad plans, bad flags, all with exit code 2") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 2));
  Result r = sh(kBin + " " + plan + " --steps 1");
  CHECK(r.code == 2);
  CHECK(r.out.find("world size 2") != std::string::npos);
  CHECK(r.out.find("world size 1") != std::string::npos);
  r = sh(kBin + " --nproc-per-node 3 " + plan);
  CHECK(r.code == 2);
  CHECK(r.out.find("world size 2") != std::string::npos);
  CHECK(r.out.find("--nproc-per-node 3") != std::string::npos);

  std::string text = slurp(plan);
  {
    std::ofstream o(d / "unknown.yaml");
    o << text << "surprise: 1\n";
  }
  r = sh(kBin + " " + (d / "unknown.yaml"));
  CHECK(r.code == 2);
  CHECK(r.out.find("surprise") != std::string::npos);
  {
    std::string newer = text;
    const std::string current = "fsdp_plan_version: " + std::to_string(fsdp::kPlanSchemaVersion);
    REQUIRE(newer.find(current) != std::string::npos);
    newer.replace(newer.find(current), current.size(), "fsdp_plan_version: 99");
    std::ofstream o(d / "newer.yaml");
    o << newer;
  }
  r = sh(kBin + " " + (d / "newer.yaml"));
  CHECK(r.code == 2);
  CHECK(r.out.find("99") != std::string::npos);
  r = sh(kBin + " " + plan + " --no-such-flag");
  CHECK(r.code == 2);
  // Float8 linears are planned, not run: fsdp-run refuses the plan by its key (the capability table's
  // Float8Runtime rule with fsdp-run's support).
  PlanFile f8 = small_plan(StrategyKind::Fsdp, "layer", 2);
  f8.strategy.float8 = Float8Recipe::Tensorwise;
  r = sh(kBin + " --emulate-world-size 2 " + write_plan(d, f8, "float8.yaml") + " --steps 1");
  CHECK(r.code == 2);
  CHECK(r.out.find("strategy.float8: fsdp-run does not train float8 linears") != std::string::npos);
  r = sh(kBin + " " + (d / "missing.yaml"));
  CHECK(r.code == 2);
  // MoE runs (issue M13); DeepSeek-V3's routing with its score-correction bias does not, and is named.
  PlanFile moe = small_plan(StrategyKind::Fsdp, "layer", 1, 2, small_moe_model());
  moe.model.moe->router_bias = true;
  r = sh(kBin + " " + write_plan(d, moe, "moe.yaml"));
  CHECK(r.code == 2);
  CHECK(r.out.find("moe.router_bias") != std::string::npos);
  // A plan fsdp-run cannot run is refused once, by the launcher, before any rank starts.
  PlanFile offload = small_plan(StrategyKind::Zero1, "layer", 2);
  offload.strategy.offload = Offload::Optimizer;
  r = sh(kBin + " --nproc-per-node 2 " + write_plan(d, offload, "z1offload.yaml") + " --steps 1");
  CHECK(r.code == 2);
  const std::string msg = "offload is implemented for zero3";
  const auto first = r.out.find(msg);
  REQUIRE(first != std::string::npos);
  CHECK(r.out.find(msg, first + 1) == std::string::npos);
  CHECK(r.out.find("rank") == std::string::npos);  // no rank was started, none failed
  // torchtitan's per-op checkpointing policy is the simulator's only: refused by name, exit 2.
  PlanFile sac = small_plan(StrategyKind::Fsdp, "layer", 1);
  sac.strategy.act_ckpt = ActCkpt::SelectiveOp;
  r = sh(kBin + " " + write_plan(d, sac, "sac.yaml") + " --steps 1");
  CHECK(r.code == 2);
  CHECK(r.out.find("--act-ckpt selective-op is torchtitan's per-op policy; fsdp-run runs none, full, selective and "
                   "every:N") != std::string::npos);
  // LoRA targets that name no linear of the model: refused once, by the launcher, before any rank starts (a rank
  // refusing after the rendezvous could leave the others in it).
  for (const auto& [targets, msg] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"q_proj", "w9"}, "lora_targets: unknown module 'w9'"},
           {{"q_proj", "gate_proj"}, "lora_targets: model exec-test has no linear 'gate_proj'"}}) {
    PlanFile lora = small_plan(StrategyKind::Fsdp, "layer", 2);
    lora.strategy.method = Method::Lora;
    lora.strategy.lora.rank = 4;
    lora.strategy.lora.target_modules = targets;
    lora.model.gated_mlp = false;  // up_proj and down_proj only
    r = sh(kBin + " --nproc-per-node 2 " + write_plan(d, lora, "lora.yaml") + " --steps 1");
    CHECK(r.code == 2);
    const auto at = r.out.find(msg);
    REQUIRE(at != std::string::npos);
    CHECK(r.out.find(msg, at + 1) == std::string::npos);
    CHECK(r.out.find("rank") == std::string::npos);
  }
}

TEST_CASE("robustness: a killed rank makes the others exit naming it, in bounded time") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 2));
  const int port = pick_free_port();
  std::vector<std::string> args{plan, "--steps", "100000", "--timeout", "20"};
  pid_t r0 = spawn_rank(0, 2, port, args, d / "r0.log"), r1 = spawn_rank(1, 2, port, args, d / "r1.log");
  REQUIRE(wait_for_text(d / "r0.log", "step 2", std::chrono::seconds(120)));
  ::kill(r1, SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  const int code = wait_for(r0, std::chrono::seconds(60));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  wait_for(r1, std::chrono::seconds(5));
  const std::string log = slurp(d / "r0.log");
  INFO(log);
  CHECK(code == 3);
  CHECK(secs < 60);
  MESSAGE("rank 0 exited " << secs << " s after rank 1 was killed");
  CHECK(log.find("rank 1") != std::string::npos);
  if (code == -1) ::kill(r0, SIGKILL);
}

TEST_CASE("robustness: a hung rank (SIGSTOP) is named after the collective timeout") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Ddp, "layer", 2));
  const int port = pick_free_port();
  std::vector<std::string> args{plan, "--steps", "100000", "--timeout", "5"};
  pid_t r0 = spawn_rank(0, 2, port, args, d / "r0.log"), r1 = spawn_rank(1, 2, port, args, d / "r1.log");
  REQUIRE(wait_for_text(d / "r0.log", "step 2", std::chrono::seconds(120)));
  ::kill(r1, SIGSTOP);
  const int code = wait_for(r0, std::chrono::seconds(60));
  ::kill(r1, SIGKILL);
  wait_for(r1, std::chrono::seconds(5));
  const std::string log = slurp(d / "r0.log");
  INFO(log);
  CHECK(code == 3);
  CHECK(log.find("rank 1") != std::string::npos);
  CHECK(log.find("stopped responding") != std::string::npos);
  if (code == -1) ::kill(r0, SIGKILL);
}

TEST_CASE("launcher: a failing rank's exit code is forwarded and the failure is named") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 2));
  // The ranks get a token file whose ids are beyond the vocabulary: they refuse it at start (2), and the launcher
  // forwards that and names the rank.
  {
    std::ofstream bad(d / "bad-ids.bin", std::ios::binary);
    const uint16_t id = 65535;
    for (int i = 0; i < 4096; ++i) bad.write(reinterpret_cast<const char*>(&id), sizeof id);
  }
  Result r = sh("cd " + d.path.string() + " && " + kBin + " --nproc-per-node 2 " + plan +
                " --steps 2 --timeout 20 --data bad-ids.bin");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("bad-ids.bin") != std::string::npos);
  CHECK(r.out.find("exited with code 2") != std::string::npos);
  // A token file that does not exist is refused by the launcher before any rank starts: one line, no rank named.
  Result missing = sh("cd " + d.path.string() + " && " + kBin + " --nproc-per-node 2 " + plan +
                      " --steps 2 --timeout 20 --data no-such-file.bin");
  INFO(missing.out);
  CHECK(missing.code == 2);
  CHECK(missing.out.find("fsdp-run: error: no-such-file.bin: cannot open token file (--data)") != std::string::npos);
  CHECK(missing.out.find("exited with code") == std::string::npos);
}

TEST_CASE("checkpoints: SIGKILL mid-run, resume, same trajectory; a corrupt shard is named and skipped") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Zero3, "every:2", 2));
  Result full = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 8 --report " + (d / "full.json"));
  REQUIRE(full.code == 0);
  const auto lf = losses(d / "full.json");

  const std::string ck = d / "ck";
  const int port = pick_free_port();
  std::vector<std::string> args{
      plan, "--steps",   "100000", "--checkpoint-dir", ck, "--checkpoint-every", "2", "--keep-checkpoints",
      "3",  "--timeout", "20"};
  pid_t r0 = spawn_rank(0, 2, port, args, d / "r0.log"), r1 = spawn_rank(1, 2, port, args, d / "r1.log");
  REQUIRE(wait_for_text(d / "r0.log", "step 5", std::chrono::seconds(120)));
  ::kill(r0, SIGKILL);
  ::kill(r1, SIGKILL);
  wait_for(r0, std::chrono::seconds(10));
  wait_for(r1, std::chrono::seconds(10));
  const std::vector<fs::path> steps = step_dirs(ck);
  REQUIRE(steps.size() >= 2);
  const fs::path newest = steps.back(), previous = steps[steps.size() - 2];

  // Resume to the same total (--steps counts from the start): the remaining steps match.
  Result res = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 8 --resume " + ck + " --report " + (d / "res.json"));
  INFO(res.out);
  REQUIRE(res.code == 0);
  json jr = json::parse(slurp(d / "res.json"));
  const int64_t from = jr.at("resumed_from_step").get<int64_t>();
  CHECK(newest.filename().string() ==
        "step-" + std::string(8 - std::to_string(from).size(), '0') + std::to_string(from));
  auto lr = losses(d / "res.json");
  REQUIRE(static_cast<int64_t>(lr.size()) == 8 - from);
  for (std::size_t i = 0; i < lr.size(); ++i)
    CHECK(lr[i] == doctest::Approx(lf[static_cast<std::size_t>(from) + i]).epsilon(1e-6));

  // Flip a byte in the newest step's rank-1 shard: the resume names it and falls back.
  const std::string shard = (newest / "rank-00001.safetensors").string();
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  Result again =
      sh(kBin + " --nproc-per-node 2 " + plan + " --steps 8 --resume " + ck + " --report " + (d / "again.json"));
  INFO(again.out);
  CHECK(again.code == 0);
  CHECK(again.out.find("rank-00001.safetensors") != std::string::npos);
  CHECK(again.out.find("checksum") != std::string::npos);
  json ja = json::parse(slurp(d / "again.json"));
  CHECK(ja.at("resumed_from_step").get<int64_t>() == from - 2);
  auto la = losses(d / "again.json");
  REQUIRE(!la.empty());
  CHECK(la.back() == doctest::Approx(lf.back()).epsilon(1e-6));
  CHECK(fs::exists(previous / "manifest.json"));  // the previous checkpoint is intact

  // Asked for the corrupt step directly: refused, naming the file and offering the previous one.
  Result direct = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 8 --resume " + newest.string());
  CHECK(direct.code == 2);
  CHECK(direct.out.find("rank-00001.safetensors") != std::string::npos);
  CHECK(direct.out.find(previous.filename().string()) != std::string::npos);
  Result ex = sh(kBin + " export " + newest.string() + " --out " + (d / "m.safetensors"));
  CHECK(ex.code == 2);
  CHECK(ex.out.find("rank-00001.safetensors") != std::string::npos);
  Result ok = sh(kBin + " export " + previous.string() + " --out " + (d / "m.safetensors"));
  CHECK(ok.code == 0);
}

TEST_CASE("data: a uint16 token file trains end to end on 2 ranks; the report names it") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Zero2, "layer", 2));
  const std::string tokens = d / "tokens.bin";
  {
    std::ofstream o(tokens, std::ios::binary);
    for (int i = 0; i < 5000; ++i) {
      const uint16_t id = static_cast<uint16_t>((i * 7919) % 251);
      o.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  Result r = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 3 --data " + tokens + " --report " + (d / "t.json"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  json j = json::parse(slurp(d / "t.json"));
  CHECK(j.at("data") == tokens);
  CHECK(j.at("steps").size() == 3);
  Result bad = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 1 --data " + tokens + " --data-dtype uint32");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("beyond the model's vocabulary") != std::string::npos);
}

TEST_CASE("rehearsal from the command line: --emulate-world-size runs rank 0 of a larger plan alone") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 8));
  Result r = sh(kBin + " --emulate-world-size 8 " + plan + " --steps 2 --report " + (d / "e.json"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  json j = json::parse(slurp(d / "e.json"));
  CHECK(j.at("emulated") == true);
  CHECK(j.at("world_size") == 8);
  Result bad = sh(kBin + " --emulate-world-size 4 " + plan);
  CHECK(bad.code == 2);
}

TEST_CASE("the step trace: LoRA plans run exactly their step program, collective by collective") {
  // LoRA in fsdp-run keeps the adapters outside the units (one replicated leaf, all-reduced once) and frees a
  // frozen unit's base at the next unit's pre-backward: the fsdp-run runtime profile's program says the same.
  // (The accuracy grid checks the other strategies and knobs on real multi-rank runs.)
  for (StrategyKind kind :
       {StrategyKind::Fsdp, StrategyKind::Zero3, StrategyKind::Hsdp, StrategyKind::Zero2, StrategyKind::Ddp}) {
    for (const char* wrap : {"layer", "model"}) {
      if (!shards_params(kind) && std::string(wrap) == "model") continue;
      TmpDir d;
      PlanFile p = small_plan(kind, wrap, 8);
      p.strategy.method = Method::Lora;
      p.strategy.lora.rank = 4;
      p.strategy.lora.target_modules = {"q_proj", "v_proj"};
      p.strategy.grad_accum = 2;
      const std::string plan = write_plan(d, p);
      Result r = sh(kBin + " --emulate-world-size 8 " + plan + " --steps 2 --report " + (d / "r.json"));
      INFO(to_string(kind) << " " << wrap << ": " << r.out);
      REQUIRE(r.code == 0);
      const json report = json::parse(slurp(d / "r.json"));
      const TraceComparison c =
          compare_traces(program_side(simulate_plan(p, FSDP_SOURCE_ROOT)->program),
                         measured_trace(report.at("step_trace"), "r.json"), p.strategy.grad_accum);
      for (const auto& e : c.collectives.predicted_only) INFO("only predicted: " << e);
      for (const auto& e : c.collectives.measured_only) INFO("only measured: " << e);
      CHECK(c.collectives.predicted > 0);
      CHECK(c.collectives.mismatches == 0);
      CHECK(c.unit_ops.mismatches == 0);
    }
  }
}

TEST_CASE("checkpoint directory: one run at a time; a killed run's lock is taken over; another run is refused") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Fsdp, "layer", 1));
  const std::string ck = d / "ck";
  const std::string lock = ck + "/fsdp-run.lock";
  pid_t a = spawn_rank(0, 1, pick_free_port(),
                       {plan, "--steps", "100000", "--checkpoint-dir", ck, "--checkpoint-every", "1"}, d / "a.log");
  REQUIRE(wait_for_text(d / "a.log", "step 2", std::chrono::seconds(120)));
  // A second run on the same directory is refused before its first step, naming the run that holds it.
  Result b = sh(kBin + " " + plan + " --steps 2 --checkpoint-dir " + ck + " --checkpoint-every 1");
  INFO(b.out);
  CHECK(b.code == 2);
  CHECK(b.out.find(lock + ": the checkpoint directory is in use by the fsdp-run pid " + std::to_string(a)) !=
        std::string::npos);
  CHECK(b.out.find("step 1") == std::string::npos);
  ::kill(a, SIGKILL);
  wait_for(a, std::chrono::seconds(10));
  REQUIRE(fs::exists(lock));  // a killed run leaves its lock behind

  // The killed run's lock is stale: the next run takes it over, continues the checkpoint, and releases the lock.
  const int64_t killed_at = step_of(step_dirs(ck).back());
  const std::string more = std::to_string(killed_at + 2);
  Result c = sh(kBin + " " + plan + " --steps " + more + " --resume " + ck + " --checkpoint-dir " + ck +
                " --checkpoint-every 1");
  INFO(c.out);
  CHECK(c.code == 0);
  CHECK(c.out.find("no longer runs; taking it over") != std::string::npos);
  CHECK(!fs::exists(lock));

  // Another run's checkpoint (another seed, another plan) is refused unless asked for.
  const std::string end = std::to_string(killed_at + 3);
  Result seed = sh(kBin + " " + plan + " --steps " + end + " --resume " + ck + " --seed 5");
  CHECK(seed.code == 2);
  CHECK(seed.out.find("the checkpoint is of another run (seed 0 in the checkpoint, 5 here); --resume-any") !=
        std::string::npos);
  PlanFile faster = small_plan(StrategyKind::Fsdp, "layer", 1);
  faster.training.lr = 2e-3;
  Result other = sh(kBin + " " + write_plan(d, faster, "faster.yaml") + " --steps " + end + " --resume " + ck);
  CHECK(other.code == 2);
  CHECK(other.out.find("(plan 'lr: 0.001' in the checkpoint, 'lr: 0.002' here)") != std::string::npos);
  Result any = sh(kBin + " " + plan + " --steps " + end + " --resume " + ck + " --seed 5 --resume-any");
  CHECK(any.code == 0);
  CHECK(any.out.find("continuing it as asked (--resume-any)") != std::string::npos);

  // An edited manifest (its step field) is found by the manifest's own checksum: skipped for the previous step,
  // refused when asked for by name.
  const std::vector<fs::path> steps = step_dirs(ck);
  REQUIRE(steps.size() >= 2);
  const fs::path newest = steps.back(), previous = steps[steps.size() - 2];
  const std::string manifest = (newest / "manifest.json").string();
  json m = json::parse(slurp(manifest));
  m["step"] = m["step"].get<int64_t>() - 1;
  std::ofstream(manifest) << m.dump(1);
  Result fallback =
      sh(kBin + " " + plan + " --steps " + end + " --resume " + ck + " --report " + (d / "fallback.json"));
  INFO(fallback.out);
  CHECK(fallback.code == 0);
  CHECK(fallback.out.find(manifest + ": manifest checksum mismatch") != std::string::npos);
  CHECK(json::parse(slurp(d / "fallback.json")).at("resumed_from_step").get<int64_t>() == step_of(previous));
  Result direct = sh(kBin + " " + plan + " --steps " + end + " --resume " + newest.string());
  CHECK(direct.code == 2);
  CHECK(direct.out.find(manifest + ": manifest checksum mismatch") != std::string::npos);
}

TEST_CASE("bad input is refused before the first step: flags, checkpoint directory, token ids, weights") {
  TmpDir d;
  const std::string plan = write_plan(d, small_plan(StrategyKind::Zero2, "layer", 2));
  const std::string run = kBin + " --nproc-per-node 2 " + plan + " --steps 2 --timeout 20 ";
  auto refused_at_start = [](const Result& r, const std::string& message) {
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(message) != std::string::npos);
    CHECK(r.out.find("step 1") == std::string::npos);
    CHECK(r.out.find("died or hung") == std::string::npos);
  };
  // Flags that contradict each other: refused once, by the launcher, before any rank starts.
  Result r = sh(run + "--checkpoint-every 1");
  refused_at_start(r, "--checkpoint-every 1 needs --checkpoint-dir DIR");
  CHECK(r.out.find("rank") == std::string::npos);
  refused_at_start(sh(run + "--resume-any"), "--resume-any needs --resume DIR");

  // A checkpoint directory nobody can write (/proc), and one below a file.
  refused_at_start(sh(run + "--checkpoint-dir /proc --checkpoint-every 1"),
                   "/proc: the checkpoint directory is not writable");
  std::ofstream(d / "plain") << "x";
  refused_at_start(sh(run + "--checkpoint-dir " + (d / "plain") + "/ck --checkpoint-every 1"),
                   "cannot create the checkpoint directory");
  if (::geteuid() != 0) {  // root writes into a read-only directory anyway
    fs::create_directories(d / "ro");
    fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    refused_at_start(sh(run + "--checkpoint-dir " + (d / "ro") + " --checkpoint-every 1"), "not writable");
  }

  // One id beyond the vocabulary, at the file's very end (in rank 1's share of the scan).
  const std::string tokens = d / "tokens.bin";
  {
    std::ofstream o(tokens, std::ios::binary);
    for (int i = 0; i < 5000; ++i) {
      const uint16_t id = static_cast<uint16_t>(i == 4999 ? 300 : (i * 7919) % 251);
      o.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  refused_at_start(sh(run + "--data " + tokens),
                   tokens + ": token id 300 at position 4999 (byte 9998) is beyond the model's vocabulary (251 ids)");

  // Weights whose float tensor is labelled I32, and a header that is a JSON array.
  std::map<std::string, at::Tensor> params;
  {
    auto solo = Comm::emulate(1);
    RunConfig none;
    none.steps = 0;
    Trainer t(small_plan(StrategyKind::Zero2, "layer", 1), none, *solo);
    params = t.model().full_state_dict();
  }
  const std::string weights = d / "w.safetensors";
  write_safetensors(weights, params);
  edit_safetensors_header(weights, [](json& h) { h["model.layers.0.mlp.up_proj.weight"]["dtype"] = "I32"; });
  refused_at_start(sh(run + "--init-from " + weights),
                   weights + ": tensor model.layers.0.mlp.up_proj.weight has dtype I32");
  write_raw_safetensors(weights, "[1, 2, 3]", "");
  refused_at_start(sh(run + "--init-from " + weights),
                   weights + ": the safetensors header is a JSON array, not an object of tensors");
}

TEST_CASE("a plan beyond a RoPE model's max_positions is refused before any rank starts, naming the lengths") {
  TmpDir d;
  PlanFile p = small_plan(StrategyKind::Fsdp, "layer", 2);
  p.strategy.seq_len = p.model.max_positions + 32;
  const std::string plan = write_plan(d, p);
  Result r = sh(kBin + " --nproc-per-node 2 " + plan + " --steps 1 --timeout 20");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("plan strategy.seq_len " + std::to_string(p.strategy.seq_len) + " exceeds " + p.model.name +
                   "'s max_positions (max_position_embeddings) of " + std::to_string(p.model.max_positions)) !=
        std::string::npos);
  CHECK(r.out.find("step 1") == std::string::npos);
  CHECK(r.out.find("died or hung") == std::string::npos);
  // rope_scaling's extension (rope_scaled_positions) lets the same length run.
  p.model.rope_scaled_positions = p.strategy.seq_len;
  r = sh(kBin + " --nproc-per-node 2 " + write_plan(d, p, "scaled.yaml") + " --steps 1 --timeout 20");
  INFO(r.out);
  CHECK(r.code == 0);
  p.model.rope_scaled_positions = 0;
  p.strategy.seq_len = p.model.max_positions;
  r = sh(kBin + " --nproc-per-node 2 " + write_plan(d, p, "fits.yaml") + " --steps 1 --timeout 20");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("exceeds") == std::string::npos);
}

}  // namespace fsdp::exec::test

namespace fsdp::exec::test {

// Issue M15 end to end: mesh plans written with the plan-file API run through the self-launcher; tp 2 and pp 2 on
// the same 2 rows a step give the same losses; their step traces name the tensor group and the pipeline's
// send-recv; a mesh the model cannot take is refused before any rank starts, naming the key.
TEST_CASE("mesh plans through fsdp-run: tp 2 and pp 2 on 2 ranks, a refused tp") {
  TmpDir d;
  ModelSpec model = small_model();
  model.hidden_size = 64;
  model.num_heads = 4;
  model.num_kv_heads = 2;
  model.head_dim = 16;
  PlanFile tp = small_plan(StrategyKind::Fsdp, "layer", 2, 2, model);
  tp.strategy.mesh.tp = 2;
  PlanFile pp = small_plan(StrategyKind::Zero2, "layer", 2, 1, model);
  pp.strategy.mesh.pp = 2;
  pp.strategy.grad_accum = 2;
  std::vector<json> reports;
  for (const auto& [name, plan] : {std::make_pair("tp", tp), std::make_pair("pp", pp)}) {
    const std::string report = d / (std::string(name) + ".json");
    const Result r = sh(kBin + " --nproc-per-node 2 " + write_plan(d, plan, std::string(name) + ".yaml") +
                        " --steps 3 --report " + report);
    INFO(r.out);
    REQUIRE(r.code == 0);
    reports.push_back(json::parse(slurp(report)));
  }
  for (int i = 0; i < 3; ++i)
    CHECK(reports[0]["steps"][i]["loss"].get<double>() ==
          doctest::Approx(reports[1]["steps"][i]["loss"].get<double>()).epsilon(1e-5));
  CHECK(reports[0]["plan"]["tp"] == 2);
  CHECK(reports[1]["plan"]["pp"] == 2);
  auto has = [](const json& report, const char* key, const char* value) {
    for (const auto& e : report["step_trace"]["entries"])
      if (e.contains(key) && e[key] == value) return true;
    return false;
  };
  CHECK(has(reports[0], "group", "tensor"));
  CHECK(has(reports[1], "collective", "send-recv"));

  PlanFile bad = tp;
  bad.strategy.mesh.tp = 3;
  bad.cluster.gpus_per_node = 3;
  const Result r = sh(kBin + " --nproc-per-node 3 " + write_plan(d, bad, "bad.yaml") + " --steps 1");
  CHECK(r.code == 2);
  CHECK(r.out.find("strategy.tp: tp 3 does not divide the 4 attention heads") != std::string::npos);
}

}  // namespace fsdp::exec::test
