// Runs the real fsdp-plan binary and captures exit code, stdout and stderr.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp::test {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An empty scratch directory for one test, named by the test file's `prefix`, this process and `name`.
inline std::string tmp_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

inline CliResult run_cli(const std::string& args) {
  static int counter = 0;
  std::string base = "/tmp/fsdp_cli_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  std::string cmd = std::string(FSDP_PLAN_BIN) + " " + args + " >" + base + ".out 2>" + base + ".err";
  int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

// `fsdp-plan ARGS` must be refused as bad input: exit code 2, and one message on stderr, fsdp-plan's "error:" line
// (planner/cli/main.cpp), that names each of `mentions` and is no "internal error". Returns the stderr for further
// checks.
inline std::string refusal(const std::string& args, const std::vector<std::string>& mentions = {}) {
  const CliResult r = run_cli(args);
  CAPTURE(args);
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("fsdp-plan: error: ") != std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
  for (const auto& m : mentions) {
    CAPTURE(m);
    CHECK(r.err.find(m) != std::string::npos);
  }
  return r.err;
}

}  // namespace fsdp::test
