#include "dist/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace fsdp::exec {

int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("bind: ") + std::strerror(errno));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

namespace {

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = strsignal(WTERMSIG(status));
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + (name ? name : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

// fsdp-run's exit codes (cli/main.cpp usage): a rank's own, and 3 (a rank failed) for one a signal ended.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 3;
}

// The process is stopped (SIGSTOP, SIGTSTP or a tracer): state T or t in /proc/PID/stat (proc(5)).
bool is_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const std::size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'T' || line[close + 2] == 't');
}

// This process's environment with the torchrun variables of rank `r` in place of any it had.
std::vector<std::string> rank_environment(const LaunchOptions& opts, int port, int r) {
  const std::vector<std::pair<std::string, std::string>> vars{
      {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(opts.nproc)},
      {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(opts.nproc)},
      {"MASTER_ADDR", opts.master_addr}, {"MASTER_PORT", std::to_string(port)}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    bool replaced = false;
    for (const auto& [k, v] : vars) replaced = replaced || kv.compare(0, k.size() + 1, k + "=") == 0;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

}  // namespace

int launch_local(const LaunchOptions& opts, const std::vector<std::string>& argv) {
  const int port = opts.master_port > 0 ? opts.master_port : pick_free_port();
  std::vector<pid_t> pids(static_cast<std::size_t>(opts.nproc), -1);
  std::vector<std::string> args_text = argv;
  std::vector<char*> args = pointers(args_text);
  for (int r = 0; r < opts.nproc; ++r) {
    std::vector<std::string> env_text = rank_environment(opts, port, r);
    std::vector<char*> env = pointers(env_text);
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      // The child dies with the launcher (no orphaned ranks holding ports).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (opts.quiet) {
        const int null = ::open("/dev/null", O_WRONLY);
        if (null >= 0) ::dup2(null, STDOUT_FILENO);
      }
      ::execve("/proc/self/exe", args.data(), env.data());
      static const char kFailed[] = "fsdp-run: exec of a rank failed\n";
      [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, kFailed, sizeof kFailed - 1);
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  int result = 0;
  int remaining = opts.nproc;
  bool failed = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  std::vector<bool> killed(pids.size(), false);  // by this launcher, after the first failure
  while (remaining > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pid == 0) {
      if (failed) {
        const bool late = std::chrono::steady_clock::now() > deadline;
        for (std::size_t i = 0; i < pids.size(); ++i) {
          if (pids[i] <= 0 || killed[i]) continue;
          const bool stopped = is_stopped(pids[i]);
          if (!stopped && !late) continue;
          if (stopped)
            std::fprintf(stderr, "fsdp-run: rank %zu (pid %d) is stopped and cannot exit; killing it\n", i,
                         static_cast<int>(pids[i]));
          else
            std::fprintf(stderr,
                         "fsdp-run: rank %zu (pid %d) did not exit %.1f s after the first failure; killing it\n", i,
                         static_cast<int>(pids[i]), static_cast<double>(opts.grace.count()) / 1000.0);
          ::kill(pids[i], SIGKILL);
          killed[i] = true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    std::size_t rank = 0;
    for (; rank < pids.size() && pids[rank] != pid; ++rank) {
    }
    if (rank == pids.size()) continue;
    pids[rank] = -1;
    --remaining;
    const int code = exit_code_of(status);
    if (code != 0 && !killed[rank]) {
      std::fprintf(stderr, "fsdp-run: rank %zu (pid %d) %s\n", rank, static_cast<int>(pid), describe(status).c_str());
      if (!failed) {
        failed = true;
        result = code;
        deadline = std::chrono::steady_clock::now() + opts.grace;
      }
    }
  }
  return result;
}

}  // namespace fsdp::exec
