// Calibrate's step probes: the probe plan run for real over the node's ranks, rehearsed with local
// collectives, and (CPU) over twice as many ranks as CPUs; their step times give the in-step factors.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "calibrate/calibrator.hpp"
#include "core/format.hpp"
#include "dist/device.hpp"
#include "dist/launcher.hpp"
#include "planfile/plan_file.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec::cal {

void Calibrator::step_probe(const DistEnv& env, int rounds) {
  // Collectives timed alone (above) run after a barrier on otherwise idle ranks; inside a step they meet ranks
  // that arrive apart and transport threads that wait for busy cores, and on this kind of machine cost more.
  // The probe plan runs for real over the node's ranks and then, on every rank at once, with its collectives
  // made local (the executor's rehearsal, --emulate-world-size): the difference is what its collectives cost
  // inside a step. write_profile divides it by what the fitted profile prices them at. The probe runs once per
  // compute dtype that keeps its own factors (s_.probes: bf16, fp32): on a CPU the fp32 probe computes ~10x
  // longer between the same collectives, and their transport threads take their cores from that compute.
  if (comm_.size() < 2 || comm_.size() != env.local_world_size) return;
  // Rounds of real and rehearsed runs alternate, and each side is the median of all its rounds' steps: a slow
  // phase of the machine (minutes on a shared VM) then weighs on every side alike instead of on one run of
  // 10 steps (one run a side before: the factor moved 0.82-1.5 between calibrations). On CPUs each round also
  // runs the probe with twice as many ranks as CPUs (rank 0 launches them; the node's calibration ranks sleep
  // meanwhile): plans whose ranks outnumber the cores wait differently (their ranks sleep, cpu_busy_poll) and
  // are priced by that run (collectives.in_step_factor_shared_cores).
  // run() calls this twice, before and after the collectives, so that its rounds meet more than one phase
  // of the machine. With one block of 3 rounds of 9 steps (2 s of the 4-rank probe), the factors of five
  // calibrations of one idle machine (tests/accuracy/README.md, runs I-M) were 0.87-1.27x (2 ranks) and
  // 0.76-1.26x (4 ranks) of the one factor that best fitted the grid measured after each; with two blocks
  // of 4 rounds of 11 steps, 0.93-1.20x and 0.77-1.05x (runs N-T).
  auto add_steps = [](const RunResult& r, std::vector<double>& to) {
    for (std::size_t i = 1; i < r.steps.size(); ++i) to.push_back(r.steps[i].time_s);  // step 1 warms up
  };
  const bool poll = cpu_busy_poll(env.local_world_size, s_.threads);
  // The median of the steps one run added to `v` (from index `from`), for the progress line.
  auto run_median = [](const std::vector<double>& v, std::size_t from) {
    return cal::median(std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end()));
  };
  std::array<PlanFile, std::tuple_size_v<decltype(s_.probes)>> plans;
  for (std::size_t i = 0; i < s_.probes.size(); ++i)
    plans[i] = step_probe_plan(comm_.size(), cuda_ ? "cuda" : "cpu", s_.probes[i].dtype);
  for (int round = 0; round < rounds; ++round) {
    ++s_.probe_rounds;
    for (std::size_t i = 0; i < s_.probes.size(); ++i) {
      ProbeSeries& pr = s_.probes[i];
      const PlanFile& plan = plans[i];
      RunConfig cfg;
      cfg.steps = opt_.quick ? pr.steps_quick : pr.steps_full;
      cfg.log_every = cfg.steps + 1;
      const std::size_t real0 = pr.real.size(), local0 = pr.local.size(), shared0 = pr.shared.size();
      comm_.world().barrier();
      {
        Trainer trainer(plan, cfg, comm_);
        add_steps(trainer.run(nullptr), pr.real);
      }
      comm_.world().barrier();
      {
        std::unique_ptr<Comm> local = Comm::emulate(comm_.size(), !cuda_);
        Trainer trainer(plan, cfg, *local);
        add_steps(trainer.run(nullptr), pr.local);
      }
      if (!cuda_) {
        comm_.set_busy_poll(false);
        comm_.world().barrier();
        if (comm_.rank() == 0 && !pr.shared_failed)
          pr.shared_failed = !oversubscribed_probe(2 * comm_.size(), pr.dtype, cfg.steps, pr.shared);
        comm_.world().barrier();
        comm_.set_busy_poll(poll);
      }
      progress(fmt("step probe round %.0f", s_.probe_rounds) + " (" + to_string(pr.dtype) +
               "): " + fmt("%.2f ms", run_median(pr.real, real0) * 1e3) +
               fmt(", %.2f ms local", run_median(pr.local, local0) * 1e3) +
               (pr.shared.size() > shared0 ? fmt(", %.2f ms", run_median(pr.shared, shared0) * 1e3) + " over " +
                                                 std::to_string(2 * comm_.size()) + " ranks"
                                           : std::string()));
    }
  }
  comm_.world().barrier();
}

void Calibrator::finish_step_probe() {
  for (ProbeSeries& pr : s_.probes) {
    if (pr.real.empty()) continue;
    pr.step_s = cal::median(pr.real);
    pr.alone_s = cal::median(pr.local);
    pr.shared_step_s = pr.shared.empty() ? 0.0 : cal::median(pr.shared);
    progress("step probe (fsdp, " + std::string(to_string(pr.dtype)) + ", " + std::to_string(comm_.size()) +
             " ranks, " + std::to_string(s_.probe_rounds) + " rounds): " + fmt("%.2f ms", pr.step_s * 1e3) +
             " a step, " + fmt("%.2f ms", pr.alone_s * 1e3) + " with local collectives" +
             (pr.shared_step_s > 0
                  ? fmt(", %.2f ms", pr.shared_step_s * 1e3) + " over " + std::to_string(2 * comm_.size()) + " ranks"
                  : std::string()));
  }
}

bool Calibrator::oversubscribed_probe(int ranks, DType dtype, int64_t steps, std::vector<double>& to) {
  // The probe plan over `ranks` local ranks, run by this same binary as `fsdp-run plan.yaml` under its own
  // launcher, in a scratch directory; its report's steps 2..N join `to`. A failed run leaves `to` as it was
  // (the profile then has no shared-cores factor when no round succeeded), says why and returns false.
  namespace fs = std::filesystem;
  fs::path dir;
  std::error_code ec;
  bool ok = true;
  try {
    dir = fs::temp_directory_path() / ("fsdp-calibrate-probe-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string plan_path = (dir / "probe.yaml").string(), report_path = (dir / "report.json").string();
    write_plan_file(step_probe_plan(ranks, "cpu", dtype), plan_path);
    LaunchOptions lo;
    lo.nproc = ranks;
    lo.quiet = true;
    const int rc = launch_local(lo, {"fsdp-run", plan_path, "--steps", std::to_string(steps), "--report", report_path,
                                     "--timeout", std::to_string(opt_.timeout_s)});
    if (rc != 0) throw std::runtime_error("its ranks exited with code " + std::to_string(rc));
    std::ifstream in(report_path);
    const nlohmann::json report = nlohmann::json::parse(in);
    const auto& st = report.at("steps");
    for (std::size_t i = 1; i < st.size(); ++i) to.push_back(st[i].at("time_s").get<double>());
  } catch (const std::exception& e) {
    progress(std::string("step probe (") + to_string(dtype) + ") over " + std::to_string(ranks) + " ranks failed (" +
             e.what() + "); not tried again");
    ok = false;
  }
  if (!dir.empty()) fs::remove_all(dir, ec);
  return ok;
}

}  // namespace fsdp::exec::cal
