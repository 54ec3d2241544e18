// The one adapter between the executor and c10d. Every collective the executor
// issues goes through Group; the differences between backends (Gloo in LibTorch
// 1.13 lacks bf16, ReduceOp::AVG, _allgather_base and reduce_scatter; NCCL has
// them all) and between LibTorch versions (ProcessGroup vs Backend) stay in
// comm.cpp. A Group can also be "local": collectives become local copies, used
// for world size 1 and for --emulate-world-size rehearsal (issue 6).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/step_trace_recorder.hpp"

namespace fsdp::exec {

// Raised when a collective fails or times out; the message names the ranks that
// stopped responding (heartbeat diagnosis, see Heartbeat in comm.cpp).
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An in-flight collective. wait() blocks, then runs the adapter's completion
// step (copy out of a fallback buffer, cast back, divide).
class Handle {
 public:
  Handle() = default;
  Handle(std::function<void()> waiter) : waiter_(std::move(waiter)) {}
  void wait() {
    if (waiter_) {
      auto w = std::move(waiter_);
      waiter_ = nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      w();
      blocked_ns_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  bool pending() const { return static_cast<bool>(waiter_); }
  // Time this thread spent blocked in wait() (exposed communication), since the start; the difference
  // over a step is the step's exposed communication.
  static double blocked_seconds() {
    return std::chrono::duration<double>(std::chrono::nanoseconds(blocked_ns_)).count();
  }

 private:
  std::function<void()> waiter_;
  static inline thread_local int64_t blocked_ns_ = 0;
};

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  virtual bool is_local() const = 0;

  // Every collective a training step issues names itself with a tag (the step trace records it, with the
  // dtype it moves on the wire and its bytes); one issued without a tag outside a step (checkpoints,
  // calibration, the final report) is not recorded, inside one it is an assertion.
  // In-place sum over the group.
  Handle all_reduce_sum(at::Tensor t, const CollectiveTag& tag);
  Handle all_reduce_sum(at::Tensor t);
  // full.numel() == shard.numel() * size(); rank r's shard lands at [r*n, (r+1)*n). The shard may be
  // in a wider dtype than `full` (an fp32 master shard gathered into compute-dtype parameters): it is
  // cast before the collective where the backend has full's dtype, after it where it stages in fp32.
  Handle all_gather(at::Tensor shard, at::Tensor full, const CollectiveTag& tag);
  Handle all_gather(at::Tensor shard, at::Tensor full);
  // shard = sum over ranks of full[rank*n:(rank+1)*n]. `full` is scratch: its contents are undefined
  // afterwards (without a native reduce-scatter, fp32 buffers are all-reduced in place, no extra copy).
  Handle reduce_scatter_sum(at::Tensor full, at::Tensor shard, const CollectiveTag& tag);
  Handle reduce_scatter_sum(at::Tensor full, at::Tensor shard);
  // In-place element-wise maximum over the group (the vocabulary-parallel loss's row maxima).
  Handle all_reduce_max(at::Tensor t, const CollectiveTag& tag);
  // Point to point (pipeline stages): `t` (contiguous) to group rank `peer`, or into `t` from it. The pair's transfers
  // in one direction arrive in the order they were sent; a send's buffer must stay unchanged until its wait().
  Handle send(at::Tensor t, int peer, const CollectiveTag& tag);
  Handle recv(at::Tensor t, int peer, const CollectiveTag& tag);
  virtual void broadcast(at::Tensor t, int root) = 0;
  virtual void barrier() = 0;

  // True when a dtype had to be communicated as fp32 because the backend lacks it.
  bool upcast_happened() const { return upcast_happened_; }
  // The step trace this group records into (Comm attaches it when it creates the group).
  void attach_trace(StepTraceRecorder* trace) { trace_ = trace; }

 protected:
  virtual Handle all_reduce_impl(at::Tensor t) = 0;
  virtual Handle all_gather_impl(at::Tensor shard, at::Tensor full) = 0;
  virtual Handle reduce_scatter_impl(at::Tensor full, at::Tensor shard) = 0;
  virtual Handle all_reduce_max_impl(at::Tensor t) = 0;
  virtual Handle send_impl(at::Tensor t, int peer) = 0;
  virtual Handle recv_impl(at::Tensor t, int peer) = 0;
  // Whether bf16/fp16 travel as fp32 (Gloo, and a rehearsal of it); a group of one rank moves nothing.
  virtual bool stages_low_precision() const = 0;
  bool upcast_happened_ = false;

 private:
  void record(CollectiveKind kind, const CollectiveTag* tag, const at::Tensor& wire_like, int64_t numel);
  bool stages_on_wire() const { return stages_low_precision() && size() > 1; }
  Handle all_reduce_traced(at::Tensor t, const CollectiveTag* tag);
  Handle all_gather_traced(at::Tensor shard, at::Tensor full, const CollectiveTag* tag);
  Handle reduce_scatter_traced(at::Tensor full, at::Tensor shard, const CollectiveTag* tag);
  StepTraceRecorder* trace_ = nullptr;
};

// Where a rank sits in the job (from torchrun or Slurm environment variables).
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "none";  // "torchrun", "slurm" or "none"
};

// Reads RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT, else
// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NTASKS_PER_NODE; else a single
// process. Throws InputError on malformed values.
DistEnv read_dist_env();

struct CommOptions {
  std::string device = "cpu";                 // "cpu" (Gloo) or "cuda" (NCCL)
  std::chrono::milliseconds timeout{300000};  // collective and rendezvous timeout
  int heartbeat_ms = 500;                     // heartbeat period (failure diagnosis)
  // CPU (Gloo) only: wait for a collective by polling its completion and yielding the core, instead of
  // sleeping until Gloo's worker thread signals it (cpu_busy_poll, dist/device.hpp, says when).
  bool busy_poll = false;
};

// The process groups of one job: world, plus sub-groups on demand.
class Comm {
 public:
  // Rendezvous through TCPStore (world_size > 1) or a local group (world 1).
  static std::unique_ptr<Comm> connect(const DistEnv& env, const CommOptions& opts);
  // A local-only communicator pretending to be rank 0 of `world_size` (rehearsal);
  // mimic_gloo: allocate the staging buffers a Gloo (CPU) run would.
  static std::unique_ptr<Comm> emulate(int world_size, bool mimic_gloo = true);
  ~Comm();

  int rank() const;
  int size() const;
  int local_rank() const;
  Group& world();
  // The group of ranks {first, first+stride, ...} of `count` members containing this rank.
  // Every member must call it with the same arguments (creation is collective among members).
  std::shared_ptr<Group> subgroup(const std::string& tag, const std::vector<int>& members);
  // Records where this rank is (shown in failure diagnosis of other ranks).
  void set_progress(int64_t step, const char* phase);
  // CommOptions::busy_poll for the waits from now on (calibrate's ranks sleep while rank 0 runs its
  // over-subscribed step probe).
  void set_busy_poll(bool poll);
  // The step trace every group of this communicator records into.
  StepTraceRecorder& trace();
  // Best-effort: publish a local error so other ranks can name it.
  void publish_error(const std::string& message);
  // Turns a low-level collective failure into a RankFailure naming the stalled ranks.
  [[noreturn]] void diagnose_and_throw(const std::string& what);

  struct Impl;

 private:
  explicit Comm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::exec
