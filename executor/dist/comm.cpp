// c10d adapter: process groups, the Gloo fallbacks, rendezvous and failure diagnosis.
// All LibTorch-version and backend differences of the executor live in this file.
#include "dist/comm.hpp"

#include <ATen/ATen.h>
#include <sched.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/errors.hpp"
#include "train/mem_tracker.hpp"

#if defined(FSDP_EXEC_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace fsdp::exec {
namespace {

// In LibTorch 1.x the backends derive from c10d::ProcessGroup; from 2.0 on they
// derive from c10d::Backend (torch/csrc/distributed/c10d/Backend.hpp) and
// ProcessGroup became a dispatcher over backends.
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif
using BackendPtr = c10::intrusive_ptr<BackendBase>;

int env_int(const char* name, int fallback, bool& found) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    found = false;
    return fallback;
  }
  found = true;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0 || x > (1 << 24))
    throw InputError(std::string("environment variable ") + name + "='" + v + "' is not a non-negative integer");
  return static_cast<int>(x);
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? fallback : std::string(v);
}

// First host of a Slurm node list such as "node[003-005,007],gpu1" -> "node003".
std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (std::size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      std::size_t j = i + 1;
      while (j < list.size() && std::isdigit(static_cast<unsigned char>(list[j]))) host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

bool is_loopback(const std::string& addr) { return addr == "127.0.0.1" || addr == "localhost" || addr == "::1"; }

// The adapter's own buffers (fp32 staging of low-precision data, a wider gather output) are comm_buffers in
// the memory report while a collective holds them; Gloo's flat all-gather buffer, released inside the
// collective, is transient. Tagged before they are allocated, released with the handle's waiter (after the
// wait, or when it is dropped).
std::shared_ptr<MemTag> staging_tag(int64_t bytes, MemoryCategory category = MemoryCategory::CommBuffers) {
  return std::make_shared<MemTag>(MemTracker::instance(), category, bytes);
}

bool low_precision(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }

// What a Gloo all-gather of `shard` into `full` allocates besides them, tagged: the fp32 staging of a
// low-precision shard and an output in the wire dtype when it is not full's (held until the wait), and
// Gloo's own flat output (ProcessGroupGloo.cpp AsyncAllgatherWork::run: newLikeFlat(outputs)).
struct GatherTags {
  std::shared_ptr<MemTag> held, flat;
};
// The dtype a Gloo gather moves: fp32 for a low-precision shard (staged), else the shard's own.
at::ScalarType gloo_wire_dtype(const at::Tensor& shard) {
  return low_precision(shard) ? at::kFloat : shard.scalar_type();
}

GatherTags gloo_gather_tags(const at::Tensor& shard, const at::Tensor& full) {
  const bool up = low_precision(shard);
  const at::ScalarType wire = gloo_wire_dtype(shard);
  const int64_t wire_size = static_cast<int64_t>(c10::elementSize(wire));
  return {staging_tag((up ? shard.numel() * 4 : 0) + (wire != full.scalar_type() ? full.numel() * wire_size : 0)),
          staging_tag(full.numel() * wire_size, MemoryCategory::Transient)};
}

// ---------------------------------------------------------------------------
// Local group: rank 0 of `size` ranks with no peers. World size 1 is exact;
// size > 1 is the rehearsal mode, where the other ranks' contributions are
// absent (shard copies / no-ops) but every buffer is really allocated.
class LocalGroup final : public Group {
 public:
  // mimic_gloo: rehearsal of a Gloo run also allocates, and holds until wait(), the
  // staging buffers of the Gloo path (fp32 copies of bf16 data; ProcessGroupGloo.cpp
  // AsyncAllgatherWork's newLikeFlat output; our reduce-scatter fallback's full copy),
  // so that the rehearsed peak compares with a real run's.
  explicit LocalGroup(int size, bool mimic_gloo = false) : size_(size), mimic_(mimic_gloo && size > 1) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string name() const override { return size_ == 1 ? "local" : "emulated"; }
  bool is_local() const override { return true; }
  bool stages_low_precision() const override { return mimic_; }
  Handle all_reduce_impl(at::Tensor t) override {
    if (!mimic_) return {};
    auto tag = staging_tag(low_precision(t) ? t.numel() * 4 : 0);
    at::Tensor staged = low_precision(t) ? t.to(at::kFloat) : at::Tensor();
    return Handle([staged, tag]() mutable { staged = at::Tensor(); });
  }
  Handle all_gather_impl(at::Tensor shard, at::Tensor full) override {
    check_sizes(shard, full);
    at::Tensor in, out, flat;
    GatherTags tag;
    if (mimic_) {
      tag = gloo_gather_tags(shard, full);
      // As C10dGroup on Gloo: a low-precision shard is staged in fp32, the gather lands in a buffer of
      // the wire dtype when it differs from full's, and Gloo gathers into a flat buffer of its own.
      const at::ScalarType wire = gloo_wire_dtype(shard);
      in = wire != shard.scalar_type() ? shard.to(wire) : at::Tensor();
      out = wire != full.scalar_type() ? at::empty({full.numel()}, full.options().dtype(wire)) : at::Tensor();
      flat = at::empty({full.numel()}, full.options().dtype(wire));
    }
    // Rehearsal: the absent ranks' shards are stood in for by copies of ours, so the
    // numbers stay finite; only the allocations matter.
    full.view({size_, shard.numel()}).copy_(shard.reshape({1, -1}).expand({size_, shard.numel()}));
    if (!mimic_) return {};
    return Handle([in, out, flat, tag]() mutable { in = out = flat = at::Tensor(); });
  }
  Handle reduce_scatter_impl(at::Tensor full, at::Tensor shard) override {
    check_sizes(shard, full);
    if (!mimic_) {
      shard.reshape(-1).copy_(full.narrow(0, 0, shard.numel()));
      return {};
    }
    auto tag = staging_tag(low_precision(full) ? full.numel() * 4 : 0);
    at::Tensor buf = low_precision(full) ? full.to(at::kFloat) : full;
    return Handle([buf, shard, tag]() mutable {
      shard.reshape(-1).copy_(buf.narrow(0, 0, shard.numel()));
      buf = at::Tensor();
    });
  }
  // The maximum over one rank is the tensor itself; a rehearsal has no other ranks' values.
  Handle all_reduce_max_impl(at::Tensor) override { return {}; }
  // A local group has no peer: a pipeline of one stage never sends, and a rehearsal of a pipeline is refused
  // (check_mesh_supported).
  Handle send_impl(at::Tensor, int) override {
    FSDP_ASSERT(false, "send on a local group (no peer)");
    return {};
  }
  Handle recv_impl(at::Tensor, int) override {
    FSDP_ASSERT(false, "recv on a local group (no peer)");
    return {};
  }
  void broadcast(at::Tensor, int) override {}
  void barrier() override {}

 private:
  void check_sizes(const at::Tensor& shard, const at::Tensor& full) const {
    FSDP_ASSERT(full.numel() == shard.numel() * size_, "all_gather/reduce_scatter: full must be size x shard");
  }
  int size_;
  bool mimic_;
};

}  // namespace

// ---------------------------------------------------------------------------
// Group: the trace entry of each collective, then the backend's implementation.

namespace {
WireType wire_type_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return WireType::Fp64;
    case at::kBFloat16:
      return WireType::Bf16;
    case at::kHalf:
      return WireType::Fp16;
    default:
      return WireType::Fp32;
  }
}
}  // namespace

void Group::record(CollectiveKind kind, const CollectiveTag* tag, const at::Tensor& wire_like, int64_t numel) {
  if (trace_ == nullptr || !trace_->recording()) return;
  // What travels: a staging backend sends bf16/fp16 as fp32 (and a mixed-precision gather the fp32 master
  // shard as it is); one rank moves nothing and keeps the dtype; a direct backend sends the buffer's dtype.
  at::ScalarType t = wire_like.scalar_type();
  if (stages_on_wire() && low_precision(wire_like)) t = at::kFloat;
  trace_->collective(kind, tag, size(), wire_type_of(t), numel * static_cast<int64_t>(c10::elementSize(t)));
}

Handle Group::all_reduce_sum(at::Tensor t, const CollectiveTag& tag) { return all_reduce_traced(std::move(t), &tag); }
Handle Group::all_reduce_sum(at::Tensor t) { return all_reduce_traced(std::move(t), nullptr); }
Handle Group::all_gather(at::Tensor shard, at::Tensor full, const CollectiveTag& tag) {
  return all_gather_traced(std::move(shard), std::move(full), &tag);
}
Handle Group::all_gather(at::Tensor shard, at::Tensor full) {
  return all_gather_traced(std::move(shard), std::move(full), nullptr);
}
Handle Group::reduce_scatter_sum(at::Tensor full, at::Tensor shard, const CollectiveTag& tag) {
  return reduce_scatter_traced(std::move(full), std::move(shard), &tag);
}
Handle Group::reduce_scatter_sum(at::Tensor full, at::Tensor shard) {
  return reduce_scatter_traced(std::move(full), std::move(shard), nullptr);
}

Handle Group::all_reduce_max(at::Tensor t, const CollectiveTag& tag) {
  record(CollectiveKind::AllReduce, &tag, t, t.numel());
  return all_reduce_max_impl(std::move(t));
}
Handle Group::send(at::Tensor t, int peer, const CollectiveTag& tag) {
  FSDP_ASSERT(t.is_contiguous(), "send: the buffer must be contiguous");
  // Point to point moves the buffer's bytes as they are (no staging): its own dtype on every backend.
  if (trace_ != nullptr && trace_->recording())
    trace_->collective(CollectiveKind::SendRecv, &tag, size(), wire_type_of(t.scalar_type()),
                       t.numel() * static_cast<int64_t>(t.element_size()));
  return send_impl(std::move(t), peer);
}
Handle Group::recv(at::Tensor t, int peer, const CollectiveTag& tag) {
  FSDP_ASSERT(t.is_contiguous(), "recv: the buffer must be contiguous");
  // Each side records its half, as the step program has a stage's receive and its send (program/emit_mesh.cpp
  // push_pp): the same bytes, tagged with the receiving phase.
  if (trace_ != nullptr && trace_->recording())
    trace_->collective(CollectiveKind::SendRecv, &tag, size(), wire_type_of(t.scalar_type()),
                       t.numel() * static_cast<int64_t>(t.element_size()));
  return recv_impl(std::move(t), peer);
}

Handle Group::all_reduce_traced(at::Tensor t, const CollectiveTag* tag) {
  record(CollectiveKind::AllReduce, tag, t, t.numel());
  return all_reduce_impl(std::move(t));
}
Handle Group::all_gather_traced(at::Tensor shard, at::Tensor full, const CollectiveTag* tag) {
  // A staging backend gathers the shard's dtype (wider than full's for an fp32 master shard); a direct one
  // casts the shard to full's dtype first.
  record(CollectiveKind::AllGather, tag, stages_on_wire() ? shard : full, full.numel());
  return all_gather_impl(std::move(shard), std::move(full));
}
Handle Group::reduce_scatter_traced(at::Tensor full, at::Tensor shard, const CollectiveTag* tag) {
  record(CollectiveKind::ReduceScatter, tag, full, full.numel());
  return reduce_scatter_impl(std::move(full), std::move(shard));
}

// ---------------------------------------------------------------------------
// The failure path's store calls. LibTorch's TCPStore client has a connect timeout but none on its replies
// (torch/csrc/distributed/c10d/TCPStore.cpp: a client blocks in recv until the server answers), and the kernel of a
// SIGSTOPped rank 0 still accepts connections to its store: a diagnosis that asked it directly hung forever
// (issue M11). Every such call therefore runs on a thread of its own, waited for at most a deadline.
namespace {

// How long a live store host takes to answer the diagnosis' calls (2 x world_size counter reads, a check and a get
// per rank: well under a millisecond each over loopback or a LAN); past this, rank 0 is taken to be stopped.
constexpr std::chrono::milliseconds kStoreAnswer{2000};

c10::intrusive_ptr<c10d::Store> store_client(const DistEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(env.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
}

// Runs `f` on a thread of its own and waits at most `limit` for it: true when it finished (its exceptions are its
// own to catch). Otherwise the thread is left behind, detached, and false returned: `f` must own what it touches.
bool within_deadline(std::chrono::milliseconds limit, std::function<void()> f) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread t([f = std::move(f), done] {
    try {
      f();
    } catch (...) {
    }
    done->set_value();
  });
  if (finished.wait_for(limit) == std::future_status::ready) {
    t.join();
    return true;
  }
  t.detach();
  return false;
}

// What the store says of the other ranks: those whose heartbeat counter did not move over `watch` (with where
// each last was), and the errors they published. Text to append to a failure message.
std::string survey_ranks(const DistEnv& env, std::chrono::milliseconds watch) {
  std::ostringstream msg;
  c10::intrusive_ptr<c10d::Store> client;
  try {
    client = store_client(env, kStoreAnswer);
  } catch (const std::exception&) {
    msg << "; the rendezvous store on rank 0 (" << env.master_addr << ":" << env.master_port
        << ") is unreachable: rank 0 died or hung";
    return msg.str();
  }
  auto read_counters = [&] {
    std::vector<int64_t> c(static_cast<std::size_t>(env.world_size), 0);
    for (int r = 0; r < env.world_size; ++r) c[static_cast<std::size_t>(r)] = client->add("hb/" + std::to_string(r), 0);
    return c;
  };
  auto text = [&](const std::string& key) {
    const std::vector<uint8_t> v = client->get(key);
    return std::string(v.begin(), v.end());
  };
  try {
    const std::vector<int64_t> before = read_counters();
    std::this_thread::sleep_for(watch);
    const std::vector<int64_t> after = read_counters();
    std::vector<int> stalled;
    for (int r = 0; r < env.world_size; ++r)
      if (r != env.rank && after[static_cast<std::size_t>(r)] == before[static_cast<std::size_t>(r)])
        stalled.push_back(r);
    std::vector<std::string> errors;
    for (int r = 0; r < env.world_size; ++r) {
      const std::string key = "error/" + std::to_string(r);
      if (r != env.rank && client->check({key}))
        errors.push_back("rank " + std::to_string(r) + " reported: " + text(key));
    }
    if (!stalled.empty()) {
      msg << "; rank" << (stalled.size() > 1 ? "s " : " ");
      for (std::size_t i = 0; i < stalled.size(); ++i) {
        msg << (i ? ", " : "") << stalled[i];
        const std::string key = "progress/" + std::to_string(stalled[i]);
        if (client->check({key})) msg << " (last at " << text(key) << ")";
      }
      msg << " stopped responding (no heartbeat for " << watch.count() << " ms): dead or hung";
    }
    for (const auto& e : errors) msg << "; " << e;
    if (stalled.empty() && errors.empty()) msg << "; all ranks still alive (a peer closed its connection)";
  } catch (const std::exception& e) {
    msg << "; rank 0 (rendezvous store host) stopped responding during diagnosis: " << e.what();
  }
  return msg.str();
}

}  // namespace

struct Comm::Impl {
  DistEnv env;
  CommOptions opts;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<Group> world;
  bool emulated = false;
  int64_t groups_created = 0;
  bool mimic_gloo = false;
  StepTraceRecorder trace;

  // Every group records its collectives into this communicator's step trace.
  std::shared_ptr<Group> attach(std::shared_ptr<Group> g) {
    g->attach_trace(&trace);
    return g;
  }

  // Where this rank is ("step 12, backward"), published with every heartbeat for the other ranks' diagnosis.
  // Shared with the heartbeat thread, which may outlive this Impl (left behind in a store call to a stopped
  // rank 0: stop_heartbeat).
  struct Beat {
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::string progress = "starting";
    std::promise<void> done;
  };
  std::shared_ptr<Beat> beat = std::make_shared<Beat>();
  std::future<void> beat_done;
  std::thread heartbeat;

  void start_heartbeat() {
    beat_done = beat->done.get_future();
    heartbeat = std::thread([b = beat, e = env, o = opts] {
      try {
        const c10::intrusive_ptr<c10d::Store> client = store_client(e, o.timeout);
        const std::string hb_key = "hb/" + std::to_string(e.rank);
        const std::string pr_key = "progress/" + std::to_string(e.rank);
        while (!b->stop.load()) {
          try {
            client->add(hb_key, 1);
            std::string p;
            {
              std::lock_guard<std::mutex> lock(b->mu);
              p = b->progress;
            }
            client->set(pr_key, std::vector<uint8_t>(p.begin(), p.end()));
          } catch (...) {
            // The store host (rank 0) is gone; the main thread will find out in its next collective.
          }
          for (int waited = 0; waited < o.heartbeat_ms && !b->stop.load(); waited += 50)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      } catch (...) {
      }
      b->done.set_value();
    });
  }

  // Stops the heartbeat, waiting at most a heartbeat period and the store's answer for it to end: a thread
  // blocked in a store call to a stopped rank 0 is left behind (it owns its state) rather than hanging the exit.
  void stop_heartbeat() {
    if (!heartbeat.joinable()) return;
    beat->stop.store(true);
    if (beat_done.wait_for(std::chrono::milliseconds(opts.heartbeat_ms) + kStoreAnswer) == std::future_status::ready)
      heartbeat.join();
    else
      heartbeat.detach();
  }

  ~Impl() { stop_heartbeat(); }

  [[noreturn]] void diagnose(const std::string& what) {
    std::ostringstream msg;
    msg << "rank " << env.rank << ": collective failed (" << what << ")";
    if (emulated || env.world_size == 1) throw RankFailure(msg.str());
    // Three heartbeat periods between two readings of the counters: a live rank bumps its counter at least twice.
    const auto watch = std::chrono::milliseconds(3 * opts.heartbeat_ms + 200);
    auto findings = std::make_shared<std::string>();
    const bool answered =
        within_deadline(watch + kStoreAnswer, [findings, e = env, watch] { *findings = survey_ranks(e, watch); });
    if (answered)
      msg << *findings;
    else
      msg << "; the rendezvous store on rank 0 (" << env.master_addr << ":" << env.master_port
          << ") did not answer within " << (watch + kStoreAnswer).count() << " ms: rank 0 is stopped or hung";
    throw RankFailure(msg.str());
  }
};

namespace {

// ---------------------------------------------------------------------------
// A c10d backend. Gloo in LibTorch 1.13 lacks bf16/fp16 in several collectives,
// ReduceOp::AVG, _allgather_base and reduce_scatter (ProcessGroupGloo.cpp throws
// "not supported"); we use fp32 staging, SUM then scale, list all-gather and
// all-reduce + slice. NCCL has the direct tensor collectives.
class C10dGroup final : public Group {
 public:
  C10dGroup(BackendPtr pg, int rank, int size, std::string name, bool direct, Comm::Impl* comm)
      : pg_(std::move(pg)), rank_(rank), size_(size), name_(std::move(name)), direct_(direct), comm_(comm) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  bool is_local() const override { return false; }

  bool stages_low_precision() const override { return !direct_; }
  Handle all_reduce_impl(at::Tensor t) override {
    auto tag = staging_tag(!direct_ && low_precision(t) ? t.numel() * 4 : 0);
    at::Tensor buf = staged(t);
    std::vector<at::Tensor> v{buf};
    auto work = guard([&] { return pg_->allreduce(v); });
    return Handle([this, work, buf, t, tag]() mutable {
      wait(work);
      if (!buf.is_same(t)) t.copy_(buf);
    });
  }

  Handle all_gather_impl(at::Tensor shard, at::Tensor full) override {
    FSDP_ASSERT(full.numel() == shard.numel() * size_, "all_gather: full must be size x shard");
    if (direct_) {
      const bool cast = shard.scalar_type() != full.scalar_type();
      auto tag = staging_tag(cast ? shard.numel() * static_cast<int64_t>(full.element_size()) : 0);
      at::Tensor in = cast ? shard.to(full.scalar_type()) : shard;
      auto work = guard([&] { return pg_->_allgather_base(full, in); });
      return Handle([this, work, in, tag]() mutable { wait(work); });
    }
    GatherTags tag = gloo_gather_tags(shard, full);
    // Gloo: a low-precision shard is staged in fp32; a wider shard than `full` (an fp32 master shard
    // gathered into compute-dtype parameters) goes over the wire as it is and is cast once at the end.
    at::Tensor in = staged(shard.reshape(-1));
    if (in.scalar_type() != full.scalar_type()) upcast_happened_ = true;  // wider on the wire than with NCCL
    at::Tensor out = in.scalar_type() == full.scalar_type()
                         ? full
                         : at::empty({full.numel()}, full.options().dtype(in.scalar_type()));
    std::vector<at::Tensor> outs;
    for (int r = 0; r < size_; ++r) outs.push_back(out.narrow(0, r * shard.numel(), shard.numel()));
    std::vector<std::vector<at::Tensor>> outputs{outs};
    std::vector<at::Tensor> inputs{in.contiguous()};
    auto work = guard([&] { return pg_->allgather(outputs, inputs); });
    return Handle([this, work, out, full, outputs, inputs, tag]() mutable {
      wait(work);
      if (!out.is_same(full)) full.copy_(out);
    });
  }

  Handle reduce_scatter_impl(at::Tensor full, at::Tensor shard) override {
    FSDP_ASSERT(full.numel() == shard.numel() * size_, "reduce_scatter: full must be size x shard");
    if (direct_) {
      auto work = guard([&] { return pg_->_reduce_scatter_base(shard, full); });
      return Handle([this, work]() mutable { wait(work); });
    }
    // Fallback: all-reduce the whole buffer in place (it is scratch), keep our slice (moves size x the
    // bytes); a low-precision buffer is staged in fp32.
    const bool wide = full.scalar_type() == at::kFloat || full.scalar_type() == at::kDouble;
    auto tag = staging_tag(wide ? 0 : full.numel() * 4);
    at::Tensor buf = wide ? full : full.to(at::kFloat);
    if (!wide) upcast_happened_ = true;
    std::vector<at::Tensor> v{buf};
    auto work = guard([&] { return pg_->allreduce(v); });
    return Handle([this, work, buf, shard, tag]() mutable {
      wait(work);
      shard.reshape(-1).copy_(buf.narrow(0, rank_ * shard.numel(), shard.numel()));
    });
  }

  Handle all_reduce_max_impl(at::Tensor t) override {
    auto tag = staging_tag(!direct_ && low_precision(t) ? t.numel() * 4 : 0);
    at::Tensor buf = staged(t);  // the maximum of bf16 values is exact in fp32
    std::vector<at::Tensor> v{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    auto work = guard([&] { return pg_->allreduce(v, o); });
    return Handle([this, work, buf, t, tag]() mutable {
      wait(work);
      if (!buf.is_same(t)) t.copy_(buf);
    });
  }

  // Gloo's and NCCL's send/recv move raw bytes (ProcessGroupGloo::send: the tensor's numel x element size), so
  // bf16 travels as it is. The tag orders a pair's transfers in one direction; both use 0.
  Handle send_impl(at::Tensor t, int peer) override {
    std::vector<at::Tensor> v{t};
    auto work = guard([&] { return pg_->send(v, peer, 0); });
    return Handle([this, work, t]() mutable { wait(work, /*p2p=*/true); });
  }
  Handle recv_impl(at::Tensor t, int peer) override {
    std::vector<at::Tensor> v{t};
    auto work = guard([&] { return pg_->recv(v, peer, 0); });
    return Handle([this, work, t]() mutable { wait(work, /*p2p=*/true); });
  }

  void broadcast(at::Tensor t, int root) override {
    at::Tensor buf = staged(t);
    std::vector<at::Tensor> v{buf};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    auto work = guard([&] { return pg_->broadcast(v, o); });
    wait(work);
    if (!buf.is_same(t)) t.copy_(buf);
  }

  void barrier() override {
    auto work = guard([&] { return pg_->barrier(); });
    wait(work);
  }

 private:
  // Gloo (no direct path) cannot reduce bf16/fp16: stage in fp32.
  at::Tensor staged(at::Tensor t) {
    if (direct_) return t;
    if (low_precision(t)) {
      upcast_happened_ = true;
      return t.to(at::kFloat);
    }
    return t;
  }
  template <typename F>
  c10::intrusive_ptr<c10d::Work> guard(F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      comm_->diagnose(e.what());
    }
  }
  // p2p: a send or recv. Gloo runs them on the caller's wait (ProcessGroupGloo SendWork / RecvWork: wait() waits on
  // the transport buffer and no worker thread completes them), so they are never polled: isCompleted() stays false
  // until wait() itself.
  void wait(c10::intrusive_ptr<c10d::Work>& work, bool p2p = false) {
    const bool poll = !direct_ && comm_->opts.busy_poll && !p2p;
    try {
      // Polling ends when the work completes or fails; wait() then returns or throws its error.
      if (poll)
        while (!work->isCompleted()) sched_yield();
      work->wait();
    } catch (const std::exception& e) {
      comm_->diagnose(e.what());
    }
    // Gloo's worker thread drops its reference to the finished work (and with it the
    // work's staging buffers and result tensors) just after signalling completion. Wait
    // for that, so that memory is released here, deterministically, and measured peaks
    // do not depend on thread timing. Bounded: 1 s. NCCL needs no such wait: ProcessGroupNCCL
    // keeps its tensors alive until the collective's stream has finished with them (recordStream,
    // or the tensors its work stashes until its watchdog sees completion), so the host would
    // only spin for nothing.
    if (direct_) {
      work.reset();
      return;
    }
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (work.use_count() > 1 && std::chrono::steady_clock::now() < limit) {
      if (poll)
        sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
    work.reset();
  }

  BackendPtr pg_;
  int rank_;
  int size_;
  std::string name_;
  bool direct_;
  Comm::Impl* comm_;
};

BackendPtr make_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const DistEnv& env,
                        const CommOptions& opts, bool& direct) {
  if (opts.device == "cuda") {
#if defined(FSDP_EXEC_NCCL)
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = opts.timeout;
    direct = true;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
#else
    throw InputError("the plan asks for device cuda, but this fsdp-run was built against a CPU-only LibTorch");
#endif
  }
  auto o = c10d::ProcessGroupGloo::Options::create(opts.timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0')
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (is_loopback(env.master_addr))
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  direct = false;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, o);
}

}  // namespace

DistEnv read_dist_env() {
  DistEnv e;
  bool f_rank = false, f_world = false, f = false;
  e.rank = env_int("RANK", 0, f_rank);
  e.world_size = env_int("WORLD_SIZE", 1, f_world);
  if (f_rank || f_world) {
    if (!(f_rank && f_world)) throw InputError("RANK and WORLD_SIZE must be set together (torchrun environment)");
    e.source = "torchrun";
    e.local_rank = env_int("LOCAL_RANK", e.rank, f);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size, f);
    e.master_addr = env_str("MASTER_ADDR", "127.0.0.1");
    e.master_port = env_int("MASTER_PORT", 29500, f);
  } else {
    bool f_proc = false, f_ntasks = false;
    e.rank = env_int("SLURM_PROCID", 0, f_proc);
    e.world_size = env_int("SLURM_NTASKS", 1, f_ntasks);
    if (f_proc && f_ntasks) {
      e.source = "slurm";
      e.local_rank = env_int("SLURM_LOCALID", 0, f);
      // SLURM_NTASKS_PER_NODE is set with --ntasks-per-node, possibly as "4(x2)"; else assume one node.
      const std::string per_node = env_str("SLURM_NTASKS_PER_NODE", "");
      e.local_world_size = per_node.empty() || !std::isdigit(static_cast<unsigned char>(per_node[0]))
                               ? e.world_size
                               : std::atoi(per_node.c_str());
      std::string nodes = env_str("SLURM_STEP_NODELIST", env_str("SLURM_JOB_NODELIST", "127.0.0.1"));
      e.master_addr = env_str("MASTER_ADDR", first_slurm_host(nodes));
      e.master_port = env_int("MASTER_PORT", 29500, f);
    } else {
      e.rank = 0;
      e.world_size = 1;
    }
  }
  if (e.world_size < 1) throw InputError("WORLD_SIZE must be >= 1");
  if (e.rank >= e.world_size)
    throw InputError("RANK " + std::to_string(e.rank) + " is not below WORLD_SIZE " + std::to_string(e.world_size));
  if (e.master_port <= 0 || e.master_port > 65535) throw InputError("MASTER_PORT out of range");
  return e;
}

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() = default;

std::unique_ptr<Comm> Comm::connect(const DistEnv& env, const CommOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->opts = opts;
  if (env.world_size == 1 && opts.device != "cuda") {
    impl->world = impl->attach(std::make_shared<LocalGroup>(1));
    return std::unique_ptr<Comm>(new Comm(std::move(impl)));
  }
  if (env.world_size == 1) {  // one CUDA rank: an in-process store, no port needed
    impl->store = c10::make_intrusive<c10d::HashStore>();
    bool direct = false;
    auto pg = make_backend(impl->store, 0, 1, env, opts, direct);
    impl->world = impl->attach(std::make_shared<C10dGroup>(pg, 0, 1, "world", direct, impl.get()));
    return std::unique_ptr<Comm>(new Comm(std::move(impl)));
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = static_cast<std::size_t>(env.world_size);
  so.waitWorkers = true;
  so.timeout = opts.timeout;
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw RankFailure("rank " + std::to_string(env.rank) + ": rendezvous at " + env.master_addr + ":" +
                      std::to_string(env.master_port) + " failed: " + e.what());
  }
  Impl* raw = impl.get();
  bool direct = false;
  auto pg = make_backend(c10::make_intrusive<c10d::PrefixStore>("world", impl->store), env.rank, env.world_size, env,
                         opts, direct);
  impl->world = impl->attach(std::make_shared<C10dGroup>(pg, env.rank, env.world_size, "world", direct, raw));
  impl->start_heartbeat();
  return std::unique_ptr<Comm>(new Comm(std::move(impl)));
}

std::unique_ptr<Comm> Comm::emulate(int world_size, bool mimic_gloo) {
  auto impl = std::make_unique<Impl>();
  impl->env.world_size = 1;
  impl->emulated = true;
  impl->mimic_gloo = mimic_gloo;
  impl->world = impl->attach(std::make_shared<LocalGroup>(world_size, mimic_gloo));
  return std::unique_ptr<Comm>(new Comm(std::move(impl)));
}

int Comm::rank() const { return impl_->world->rank(); }
int Comm::size() const { return impl_->world->size(); }
int Comm::local_rank() const { return impl_->env.local_rank; }
Group& Comm::world() { return *impl_->world; }

std::shared_ptr<Group> Comm::subgroup(const std::string& tag, const std::vector<int>& members) {
  auto it = std::find(members.begin(), members.end(), rank());
  FSDP_ASSERT(it != members.end(), "subgroup: this rank is not a member");
  const int my = static_cast<int>(it - members.begin());
  const int n = static_cast<int>(members.size());
  if (impl_->world->is_local()) return impl_->attach(std::make_shared<LocalGroup>(n, impl_->mimic_gloo));
  if (n == 1) return impl_->attach(std::make_shared<LocalGroup>(1));
  bool whole = n == size();
  for (int i = 0; whole && i < n; ++i) whole = members[static_cast<std::size_t>(i)] == i;
  if (whole) return impl_->world;
  // Store keys of a group are under a prefix that is never reused: every rank creates its
  // groups in the same order, so the counter agrees among the members.
  const std::string prefix = tag + "#" + std::to_string(impl_->groups_created++);
  bool direct = false;
  auto pg = make_backend(c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store), my, n, impl_->env, impl_->opts,
                         direct);
  return impl_->attach(std::make_shared<C10dGroup>(pg, my, n, tag, direct, impl_.get()));
}

StepTraceRecorder& Comm::trace() { return impl_->trace; }

void Comm::set_busy_poll(bool poll) { impl_->opts.busy_poll = poll; }

void Comm::set_progress(int64_t step, const char* phase) {
  std::lock_guard<std::mutex> lock(impl_->beat->mu);
  impl_->beat->progress = "step " + std::to_string(step) + ", " + phase;
}

void Comm::publish_error(const std::string& message) {
  if (!impl_->store || impl_->env.world_size == 1) return;
  // Best effort, and never a hang: a stopped rank 0 would not answer the set.
  within_deadline(kStoreAnswer, [e = impl_->env, key = "error/" + std::to_string(impl_->env.rank), message] {
    store_client(e, kStoreAnswer)->set(key, std::vector<uint8_t>(message.begin(), message.end()));
  });
}

void Comm::diagnose_and_throw(const std::string& what) { impl_->diagnose(what); }

}  // namespace fsdp::exec
