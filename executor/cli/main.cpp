// fsdp-run: train what a plan.yaml says (issue 5), or export a checkpoint (issue 6).
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibrate/calibrate.hpp"
#include "cli/commands.hpp"
#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "dist/device.hpp"
#include "dist/launcher.hpp"
#include "io/checkpoint.hpp"
#include "planfile/plan_file.hpp"
#include "report/compare.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"
#include "train/mem_tracker.hpp"
#include "train/trainer.hpp"

namespace {

constexpr const char* kUsage =
    "usage: fsdp-run [--nproc-per-node N] PLAN [options]\n"
    "       fsdp-run export CHECKPOINT --out FILE.safetensors\n"
    "       fsdp-run calibrate --out FILE.yaml [--nproc-per-node N] [--base PROFILE] [--quick]\n"
    "options:\n"
    "  --steps N               total steps to reach (default 10; counted from the start on --resume)\n"
    "  --seed S                initialisation and data seed (default 0)\n"
    "  --report FILE           write the measured report as JSON (rank 0)\n"
    "  --log-every K           progress line every K steps (default 1)\n"
    "  --timeout SEC           collective / rendezvous timeout (default 300)\n"
    "  --emulate-world-size W  rehearse rank 0 of a W-rank plan alone (collectives become local)\n"
    "  --data synthetic|FILE   token source (default synthetic); a file's ids are all checked at start\n"
    "  --data-dtype uint16|uint32  element type of a token file (default uint16)\n"
    "  --checkpoint-dir DIR    write sharded checkpoints under DIR (locked by this run: DIR/fsdp-run.lock)\n"
    "  --checkpoint-every N    every N steps (and at the last step); it and --checkpoint-dir go together\n"
    "  --keep-checkpoints K    keep the newest K (default 2)\n"
    "  --resume DIR            continue from a checkpoint root or step directory of the same run\n"
    "                          (same seed and plan; the layout and world size may differ)\n"
    "  --resume-any            with --resume: continue a checkpoint of another seed or plan too\n"
    "  --init-from PATH        initial weights: safetensors file or directory with an index json\n"
    "exit codes: 0 success, 2 bad input (plan, flags, world size), 3 a rank failed or hung, 1 other errors\n";

struct Args {
  int nproc = 0;
  std::string plan;
  std::string report;
  int timeout_s = 300;
  fsdp::exec::RunConfig cfg;
};

int64_t to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < 0)
    throw fsdp::InputError(flag + " expects a non-negative integer, got '" + v + "'");
  return x;
}

int run_export(const std::vector<std::string>& a) {
  std::string ckpt, out;
  for (std::size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--out" && i + 1 < a.size())
      out = a[++i];
    else if (ckpt.empty() && a[i].rfind("--", 0) != 0)
      ckpt = a[i];
    else
      throw fsdp::InputError("export: unexpected argument '" + a[i] + "'");
  }
  if (ckpt.empty() || out.empty()) throw fsdp::InputError("export needs CHECKPOINT and --out FILE");
  const int64_t n = fsdp::exec::export_checkpoint(ckpt, out);
  std::cout << "fsdp-run: exported " << n << " tensors to " << out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fsdp::exec;
  std::vector<std::string> a(argv + 1, argv + argc);
  std::unique_ptr<Comm> comm;
  try {
    if (!a.empty() && a[0] == "export") return run_export(a);
    if (!a.empty() && a[0] == "calibrate") return run_calibrate(a, argv[0]);
    Args args;
    std::vector<std::string> child{argv[0]};
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string& f = a[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= a.size()) throw fsdp::InputError(f + " needs a value");
        return a[++i];
      };
      if (f == "--help" || f == "-h") {
        std::cout << kUsage;
        return 0;
      }
      if (f == "--nproc-per-node") {
        args.nproc = static_cast<int>(to_int(f, value()));
        if (args.nproc < 1) throw fsdp::InputError("--nproc-per-node must be >= 1");
        continue;  // not passed to the children
      }
      child.push_back(f);
      // A count no run can use (0 steps, a rehearsal of 0 ranks) is refused here, before any rank starts.
      auto at_least_one = [&](int64_t v) {
        if (v < 1) throw fsdp::InputError(f + " must be at least 1, got " + std::to_string(v));
        return v;
      };
      if (f == "--steps")
        args.cfg.steps = at_least_one(to_int(f, child.emplace_back(value())));
      else if (f == "--seed")
        args.cfg.seed = static_cast<uint64_t>(to_int(f, child.emplace_back(value())));
      else if (f == "--report")
        args.report = child.emplace_back(value());
      else if (f == "--log-every")
        args.cfg.log_every = at_least_one(to_int(f, child.emplace_back(value())));
      else if (f == "--timeout")
        args.timeout_s = static_cast<int>(to_int(f, child.emplace_back(value())));
      else if (f == "--emulate-world-size")
        args.cfg.emulate_world_size = static_cast<int>(at_least_one(to_int(f, child.emplace_back(value()))));
      else if (f == "--data")
        args.cfg.data = child.emplace_back(value());
      else if (f == "--data-dtype")
        args.cfg.data_dtype = child.emplace_back(value());
      else if (f == "--checkpoint-dir")
        args.cfg.checkpoint_dir = child.emplace_back(value());
      else if (f == "--checkpoint-every")
        args.cfg.checkpoint_every = to_int(f, child.emplace_back(value()));
      else if (f == "--keep-checkpoints")
        args.cfg.keep_checkpoints = static_cast<int>(to_int(f, child.emplace_back(value())));
      else if (f == "--resume")
        args.cfg.resume_dir = child.emplace_back(value());
      else if (f == "--resume-any")
        args.cfg.resume_any = true;
      else if (f == "--init-from")
        args.cfg.init_from = child.emplace_back(value());
      else if (f.rfind("--", 0) == 0)
        throw fsdp::InputError("unknown option " + f + "\n" + kUsage);
      else if (args.plan.empty())
        args.plan = f;
      else
        throw fsdp::InputError("unexpected argument '" + f + "' (one plan file only)");
    }
    if (args.plan.empty()) throw fsdp::InputError(std::string("no plan file given\n") + kUsage);
    args.cfg.plan_path = args.plan;
    const fsdp::PlanFile plan = fsdp::read_plan_file(args.plan);
    check_plan_runnable(plan);
    check_run_config(args.cfg);

    if (args.nproc > 0 && std::getenv("RANK") == nullptr) {
      if (args.cfg.emulate_world_size > 0)
        throw fsdp::InputError("--emulate-world-size runs one process; drop --nproc-per-node");
      if (plan.cluster.world_size() != args.nproc)
        throw fsdp::InputError("the plan is for world size " + std::to_string(plan.cluster.world_size()) +
                               " but --nproc-per-node " + std::to_string(args.nproc) + " starts " +
                               std::to_string(args.nproc) + " ranks");
      LaunchOptions lo;
      lo.nproc = args.nproc;
      return launch_local(lo, child);
    }

    CommOptions co;
    co.device = plan.cluster.device;
    co.timeout = std::chrono::milliseconds(1000LL * args.timeout_s);
    if (args.cfg.emulate_world_size > 0) {
      if (args.cfg.emulate_world_size != plan.cluster.world_size())
        throw fsdp::InputError("--emulate-world-size " + std::to_string(args.cfg.emulate_world_size) +
                               " does not match the plan's world size " + std::to_string(plan.cluster.world_size()));
      configure_cpu_threads(1);  // one process
      comm = Comm::emulate(args.cfg.emulate_world_size, plan.cluster.device == "cpu");
    } else {
      DistEnv env = read_dist_env();
      if (env.world_size != plan.cluster.world_size())
        throw fsdp::InputError("the plan is for world size " + std::to_string(plan.cluster.world_size()) +
                               " but this launch has world size " + std::to_string(env.world_size) +
                               (env.source == "none"
                                    ? " (no RANK/WORLD_SIZE or Slurm environment; use --nproc-per-node)"
                                    : " (from the " + env.source + " environment)"));
      co.busy_poll = cpu_busy_poll(env.local_world_size, configure_cpu_threads(env.local_world_size));
      comm = Comm::connect(env, co);
    }
    Trainer trainer(plan, args.cfg, *comm);
    MemTracker::instance().reset_peak();
    RunResult r = trainer.run(&std::cout);
    // What ran, for the comparison and the report: a plan priced with an attention this build does not have
    // (LibTorch 1.13: no fused attention, model/transformer.hpp executed_attention) is compared with its prediction
    // re-simulated with the attention that ran, and says so.
    fsdp::PlanFile ran = plan;
    std::string ran_note;
    std::unique_ptr<fsdp::PlanSimulation> ran_sim;  // `ran` simulated, where the attention re-simulation made it
    if (comm->rank() == 0 && r.attention_ran != r.attention_planned) {
      ran.strategy.attention = r.attention_ran;
      ran_note = std::string("fsdp-run: the plan's attention ") + fsdp::to_string(r.attention_planned) + " ran as " +
                 fsdp::to_string(r.attention_ran) + " (this LibTorch has no fused attention)";
      if (plan.prediction) {
        try {
          ran_sim = fsdp::simulate_plan(ran, fsdp::config_root_from({}));
          ran.prediction = fsdp::plan_prediction(ran_sim->prediction);
          ran_note += ": compared with the plan re-simulated with " + std::string(fsdp::to_string(r.attention_ran)) +
                      " attention";
        } catch (const fsdp::InputError& e) {
          ran_note += std::string(": compared with the plan's own prediction, which does not price what ran (") +
                      e.what() + ")";
        }
      }
    }
    if (comm->rank() == 0) {
      if (!ran_note.empty()) std::printf("%s\n", ran_note.c_str());
      constexpr double kMiB = 1024.0 * 1024.0;
      std::printf("fsdp-run: %s%d ranks, measured peak %.1f MiB (max over ranks)",
                  r.emulated ? "rehearsal of rank 0 of " : "", r.world_size, static_cast<double>(r.peak_bytes) / kMiB);
      if (ran.prediction && ran.prediction->peak_bytes > 0) {
        const fsdp::PlanPrediction& p = *ran.prediction;
        // A CPU plan whose Gloo gathers race the compute predicts a range (plan-format.md peak_bytes_floor).
        const double ratio = static_cast<double>(r.peak_bytes) / p.peak_bytes;
        if (p.peak_is_range())
          std::printf(", predicted %.1f to %.1f MiB (measured/bound %.3f)", p.peak_bytes_floor / kMiB,
                      p.peak_bytes / kMiB, ratio);
        else
          std::printf(", predicted %.1f MiB (measured/predicted %.3f)", p.peak_bytes / kMiB, ratio);
      }
      std::printf("\n");
      if (ran.prediction && !r.steps.empty()) {
        // The same side-by-side table as `fsdp-plan compare plan.yaml report.json` (issue M6).
        auto measured = nlohmann::json::parse(report_json(ran, args.cfg, r));
        // The step program for the collective comparison; a plan whose profiles this machine lacks is compared
        // without it (said, not silent).
        fsdp::TraceSide program;
        try {
          if (!ran_sim) ran_sim = fsdp::simulate_plan(ran, fsdp::config_root_from({}));
          program = fsdp::program_side(ran_sim->rank0_program);
        } catch (const fsdp::InputError& e) {
          std::printf("fsdp-run: no collective comparison: the plan cannot be re-simulated here (%s)\n", e.what());
          measured.erase("step_trace");
        }
        fsdp::Comparison c = fsdp::compare_plan_report(*ran.prediction, ran.strategy, program, measured, "this run");
        std::printf("\npredicted (plan) vs measured (this run):\n%s", fsdp::format_comparison(c).c_str());
      }
      std::fflush(stdout);
    }
    if (comm->rank() == 0 && !args.report.empty()) {
      std::ofstream out(args.report);
      if (!out) throw fsdp::InputError(args.report + ": cannot write the report");
      out << report_json(ran, args.cfg, r) << "\n";
    }
    comm->world().barrier();
    std::cout << std::flush;
    return 0;
  } catch (const fsdp::InputError& e) {
    // One write a line: ranks failing together print whole lines, not interleaved pieces.
    std::cerr << std::string("fsdp-run: error: ") + e.what() + "\n";
    if (comm) comm->publish_error(e.what());
    std::cerr << std::flush;
    std::_Exit(2);
  } catch (const RankFailure& e) {
    std::cerr << std::string("fsdp-run: ") + e.what() + "\n" << std::flush;
    std::_Exit(3);
  } catch (const std::exception& e) {
    std::cerr << std::string("fsdp-run: error: ") + e.what() + "\n";
    if (comm) comm->publish_error(e.what());
    std::cerr << std::flush;
    std::_Exit(1);
  }
}
