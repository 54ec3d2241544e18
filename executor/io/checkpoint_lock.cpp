#include "io/checkpoint_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>

#include "core/errors.hpp"

namespace fsdp::exec {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string boot_id() {
  std::string id = read_file("/proc/sys/kernel/random/boot_id").value_or("");
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

// Field 22 (starttime) of /proc/PID/stat. Field 2 (comm) is in parentheses and may hold spaces, so the fields are
// counted after its closing parenthesis (proc(5)). 0 when there is no such process.
uint64_t start_ticks_of(int64_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat").value_or("");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string owner_text(const LockOwner& o) {
  return json{{"host", o.host},
              {"pid", o.pid},
              {"boot_id", o.boot_id},
              {"start_ticks", o.start_ticks},
              {"since", o.since}}
             .dump(1) +
         "\n";
}

std::optional<LockOwner> parse_owner(const std::string& text) {
  try {
    const json j = json::parse(text);
    LockOwner o;
    o.host = j.at("host").get<std::string>();
    o.pid = j.at("pid").get<int64_t>();
    o.boot_id = j.at("boot_id").get<std::string>();
    o.start_ticks = j.at("start_ticks").get<uint64_t>();
    o.since = j.at("since").get<std::string>();
    return o;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

bool same_process(const LockOwner& a, const LockOwner& b) {
  return a.host == b.host && a.pid == b.pid && a.boot_id == b.boot_id && a.start_ticks == b.start_ticks;
}

void create_directory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir + ": cannot create the checkpoint directory: " + ec.message());
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": --checkpoint-dir is not a directory");
}

// This process's lock, complete under a name of its own before it takes the lock's name (link(2) fails if the
// lock exists, so a lock file is never seen half-written).
std::string write_candidate(const std::string& lock, const LockOwner& me) {
  const std::string path = lock + "." + me.host + "." + std::to_string(me.pid);
  const std::string text = owner_text(me);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const bool written =
      fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!written) {
    ::unlink(path.c_str());
    throw InputError(fs::path(lock).parent_path().string() +
                     ": the checkpoint directory is not writable: " + std::strerror(err));
  }
  return path;
}

[[noreturn]] void refuse_in_use(const std::string& lock, const LockOwner& held) {
  const bool here = held.host == host_name();
  throw InputError(lock + ": the checkpoint directory is in use by the fsdp-run " + held.describe() +
                   (here ? ", which is still running" : "; another host's process cannot be checked from here") +
                   " (one run per checkpoint directory; if that run is gone, delete the lock file)");
}

// Moves the stale lock `stale_text` aside. False when the lock changed meanwhile (removed, or taken by a run that
// got there first: that one is put back and refused).
bool remove_stale(const std::string& lock, const std::string& stale_text, const LockOwner& me) {
  const std::string aside = lock + ".stale." + me.host + "." + std::to_string(me.pid);
  if (::rename(lock.c_str(), aside.c_str()) != 0) return false;
  const std::string moved = read_file(aside).value_or("");
  if (moved != stale_text) {
    if (::link(aside.c_str(), lock.c_str()) == 0) ::unlink(aside.c_str());
    if (const std::optional<LockOwner> fresh = parse_owner(moved)) refuse_in_use(lock, *fresh);
    return false;
  }
  ::unlink(aside.c_str());
  return true;
}

void take(const std::string& lock, const std::string& candidate, const LockOwner& me, std::ostream* notes) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (::link(candidate.c_str(), lock.c_str()) == 0) return;
    if (errno != EEXIST) throw InputError(lock + ": cannot create the lock file: " + std::strerror(errno));
    const std::optional<std::string> text = read_file(lock);
    if (!text) continue;  // released meanwhile
    const std::optional<LockOwner> held = parse_owner(*text);
    if (!held)
      throw InputError(lock + ": not a lock file of fsdp-run; if no run uses the checkpoint directory, delete it");
    if (!owner_is_gone(*held)) refuse_in_use(lock, *held);
    if (remove_stale(lock, *text, me) && notes)
      *notes << "fsdp-run: note: " << lock << " was left by the fsdp-run " << held->describe()
             << ", which no longer runs; taking it over\n";
  }
  throw InputError(lock + ": could not take the lock: other runs are taking it at the same time");
}

}  // namespace

std::string LockOwner::describe() const {
  return "pid " + std::to_string(pid) + " on host " + host + (since.empty() ? "" : " (since " + since + ")");
}

LockOwner this_process() {
  LockOwner o;
  o.host = host_name();
  o.pid = static_cast<int64_t>(::getpid());
  o.boot_id = boot_id();
  o.start_ticks = start_ticks_of(o.pid);
  o.since = utc_now();
  return o;
}

bool owner_is_gone(const LockOwner& owner) {
  if (owner.host != host_name()) return false;
  const std::string boot = boot_id();
  if (!owner.boot_id.empty() && !boot.empty() && owner.boot_id != boot) return true;  // rebooted since
  if (owner.pid <= 0) return true;  // no process has that pid (and kill(0) would mean our group)
  if (::kill(static_cast<pid_t>(owner.pid), 0) != 0 && errno == ESRCH) return true;
  // The pid runs: the owner, or a later process that got the pid again.
  const uint64_t now = start_ticks_of(owner.pid);
  return owner.start_ticks != 0 && now != 0 && now != owner.start_ticks;
}

CheckpointLock::CheckpointLock(const std::string& dir, std::ostream* notes)
    : path_((fs::path(dir) / kFileName).string()), me_(this_process()) {
  create_directory(dir);
  const std::string candidate = write_candidate(path_, me_);
  try {
    take(path_, candidate, me_, notes);
  } catch (...) {
    ::unlink(candidate.c_str());
    throw;
  }
  ::unlink(candidate.c_str());
}

CheckpointLock::~CheckpointLock() {
  const std::optional<LockOwner> held = parse_owner(read_file(path_).value_or(""));
  if (held && same_process(*held, me_)) ::unlink(path_.c_str());
}

}  // namespace fsdp::exec
