// The lock of a checkpoint directory (issue M11): DIR/fsdp-run.lock names the run that writes checkpoints into
// DIR (host, pid, and what tells that pid's process from a later one: the host's boot id and the process's start
// time), so a second run on the same directory is refused before its first step instead of mixing its steps with
// the first run's. A lock whose owner is gone (same host, same boot, and no process with that pid and start time)
// is stale: a run killed without cleaning up leaves one, and the next run takes it over with a note. The owner of a
// lock from another host cannot be checked from here; such a lock is refused with its owner named.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace fsdp::exec {

struct LockOwner {
  std::string host;
  int64_t pid = 0;
  std::string boot_id;       // /proc/sys/kernel/random/boot_id (random(4)); empty where unknown
  uint64_t start_ticks = 0;  // field 22 of /proc/PID/stat (proc(5)): start time after boot; 0 where unknown
  std::string since;         // when the lock was taken, UTC, for the messages

  std::string describe() const;  // "pid 123 on host vm (since 2024-05-01T10:00:00Z)"
};

// This process, as a lock names it.
LockOwner this_process();

// Whether `owner` certainly no longer runs: it ran on this host, and this host rebooted since or has no process
// with its pid and start time. False for another host's owner (unknown).
bool owner_is_gone(const LockOwner& owner);

class CheckpointLock {
 public:
  static constexpr const char* kFileName = "fsdp-run.lock";

  // Creates `dir` if needed and takes its lock, or throws InputError: the directory cannot be created or written
  // (the lock is the first file written there), or another run holds it (the message names it). A stale lock is
  // taken over, with a note on `notes`.
  CheckpointLock(const std::string& dir, std::ostream* notes);
  ~CheckpointLock();  // removes the lock file if it still names this process
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  LockOwner me_;
};

}  // namespace fsdp::exec
