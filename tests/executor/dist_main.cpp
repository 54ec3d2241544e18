// Main of the multi-rank executor tests: `test_exec_dist --nproc N [doctest args]`
// starts N ranks of itself (the executor's own launcher); every rank runs the same
// doctest cases in the same order, so their collectives match.
#include "test_common.hpp"
// clang-format off
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
// clang-format on

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "dist/comm.hpp"
#include "dist/launcher.hpp"
#include "dist_env.hpp"
#include "train/mem_tracker.hpp"

namespace fsdp::exec::test {
Comm* g_comm = nullptr;
}

int main(int argc, char** argv) {
  using namespace fsdp::exec;
  std::vector<std::string> args(argv, argv + argc);
  int nproc = 0;
  std::vector<std::string> child{args[0]};
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--nproc" && i + 1 < args.size())
      nproc = std::atoi(args[++i].c_str());
    else
      child.push_back(args[i]);
  }
  if (nproc > 0 && std::getenv("RANK") == nullptr) {
    LaunchOptions lo;
    lo.nproc = nproc;
    lo.grace = std::chrono::milliseconds(60000);
    return launch_local(lo, child);
  }
  MemTracker::instance().install_cpu();
  CommOptions co;
  co.timeout = std::chrono::milliseconds(120000);
  auto comm = Comm::connect(read_dist_env(), co);
  test::g_comm = comm.get();
  doctest::Context ctx;
  std::vector<const char*> dargs;
  for (auto& s : child) dargs.push_back(s.c_str());
  ctx.applyCommandLine(static_cast<int>(dargs.size()), dargs.data());
  // Rank 0 reports on stdout; the others into a file shown only when they fail.
  const std::string other_out = "/tmp/test_exec_dist." + std::to_string(::getpid()) + ".txt";
  if (comm->rank() != 0) ctx.setOption("out", other_out.c_str());
  const int rc = ctx.run();
  if (comm->rank() != 0) {
    if (rc != 0) {
      std::ifstream in(other_out);
      std::cerr << "---- rank " << comm->rank() << " ----\n" << in.rdbuf();
    }
    std::remove(other_out.c_str());
  }
  // Every rank's verdict counts: sum of failures over ranks.
  at::Tensor f = at::full({1}, rc != 0 ? 1.0 : 0.0, at::kDouble);
  comm->world().all_reduce_sum(f).wait();
  comm->world().barrier();
  if (comm->rank() == 0 && f.item<double>() > 0 && rc == 0)
    std::cerr << f.item<double>() << " rank(s) other than 0 failed\n";
  std::cout << std::flush;
  std::_Exit(f.item<double>() > 0 ? 1 : 0);
}
