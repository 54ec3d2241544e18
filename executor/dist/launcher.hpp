// `fsdp-run --nproc-per-node N`: start N local ranks of this same program
// (fork + exec of /proc/self/exe) with the torchrun environment variables, wait
// for them, and forward the first failure's exit code. No LibTorch here.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace fsdp::exec {

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port
  // After the first rank fails, the others get this long to exit on their own (a rank that saw the failure
  // diagnoses it in at most 3 heartbeats and the store's answer, dist/comm.cpp: 3.7 s), then are killed; a rank
  // that is stopped (SIGSTOP, state T) cannot exit and is killed at once.
  std::chrono::milliseconds grace{5000};
  // The ranks' standard output goes to /dev/null (their errors still reach stderr).
  bool quiet = false;
};

// argv: the child's full command line (argv[0] ignored; /proc/self/exe is run). Safe to call from a
// multithreaded process: each rank's environment is built before fork, and the child only makes system
// calls (prctl, open, dup2, execve) before it runs the new program.
// Returns the exit code to use: 0 when all ranks succeed, else the first failing rank's code, 3 ("a rank failed",
// fsdp-run's code) for a rank killed by a signal.
int launch_local(const LaunchOptions& opts, const std::vector<std::string>& argv);

// A TCP port that was free a moment ago (bind to port 0 on 127.0.0.1).
int pick_free_port();

}  // namespace fsdp::exec
