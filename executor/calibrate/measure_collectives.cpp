// Calibrate's collective measurements: all-gather, reduce-scatter and all-reduce over the node's ranks and
// over one rank per node, at message sizes from 16 KiB up, in rounds (the ring fit: fit.hpp).
#include <ATen/ATen.h>

#include <algorithm>

#include "calibrate/calibrator.hpp"
#include "core/errors.hpp"
#include "core/format.hpp"

namespace fsdp::exec::cal {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

void Calibrator::measure_group(Group& g, std::vector<CollSample>& out, const std::string& what) {
  std::vector<double> sizes;
  const double top = opt_.quick ? 4 * kMiB : (cuda_ ? 256 * kMiB : 64 * kMiB);
  for (double s = opt_.quick ? 64 * 1024 : 16 * 1024; s <= top; s *= 2) sizes.push_back(s);
  // The statistic is the mean: a training step pays the sum of its collectives, and on a loaded or virtual
  // machine single collectives are bimodal (a fast mode, and one that waits a scheduler quantum for a thread
  // to run), so a median flips between modes. The slowest timing of each is left out (a one-off stall).
  // The calls are made in rounds over every (size, collective), not size after size: a slow phase of the
  // machine lasting seconds then spreads over all of them instead of inflating a few neighbouring sizes,
  // which bent the line fit (quick calibrations of one machine gave 0.74-1.58 GB/s before).
  const int rounds = 8, per_round = opt_.quick ? 4 : 5;
  const int n = g.size();
  constexpr std::array<CollKind, 3> kinds{CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce};
  struct Buffers {
    at::Tensor full, shard;
  };
  std::vector<Buffers> bufs;
  for (double bytes : sizes) {
    const int64_t shard = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4) / n);
    bufs.push_back({at::rand({shard * n}, f32_), at::rand({shard}, f32_)});
  }
  auto run = [&](CollKind k, Buffers& b) {
    Handle h = k == CollKind::AllGather       ? g.all_gather(b.shard, b.full)
               : k == CollKind::ReduceScatter ? g.reduce_scatter_sum(b.full, b.shard)
                                              : g.all_reduce_sum(b.full);
    h.wait();
    sync();
  };
  std::vector<std::vector<double>> ts(sizes.size() * kinds.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (CollKind k : kinds) run(k, bufs[i]);  // warm-up: connections, buffers
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < kinds.size(); ++j)
        for (int c = 0; c < per_round; ++c) {
          g.barrier();
          const auto t0 = Clock::now();
          run(kinds[j], bufs[i]);
          ts[i * kinds.size() + j].push_back(seconds_since(t0));
        }
    progress(what + fmt(" collectives: round %.0f", r + 1) + fmt(" of %.0f", rounds));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::size_t j = 0; j < kinds.size(); ++j) {
      std::vector<double>& v = ts[i * kinds.size() + j];
      std::sort(v.begin(), v.end());
      v.pop_back();
      double mean = 0;
      for (double t : v) mean += t / double(v.size());
      CollSample s{kinds[j], n, 4.0 * double(bufs[i].full.numel()), mean};
      out.push_back(s);
      progress(what + " " + cal::coll_name(kinds[j]) + " " + fmt("%.0f KiB", s.bytes / 1024) + " over " +
               std::to_string(n) + ": " + fmt("%.3f ms", s.seconds * 1e3) + " (busbw " +
               fmt("%.3f GB/s", cal::busbw_factor(kinds[j], n) * s.bytes / s.seconds / 1e9) + ")");
    }
}

void Calibrator::collectives(const DistEnv& env) {
  const int lws = env.local_world_size, nodes = comm_.size() / std::max(1, lws);
  if (nodes * lws != comm_.size()) throw InputError("calibrate: world size is not nodes x local world size");
  const int node = comm_.rank() / lws;
  if (lws > 1) {
    std::vector<int> members;
    for (int i = 0; i < lws; ++i) members.push_back(node * lws + i);
    auto g = comm_.subgroup("cal-intra", members);
    s_.intra_size = lws;
    measure_group(*g, s_.intra, "intra-node");
  }
  if (nodes > 1) {
    std::vector<int> members;
    for (int i = 0; i < nodes; ++i) members.push_back(i * lws + comm_.local_rank());
    auto g = comm_.subgroup("cal-inter", members);
    s_.inter_size = nodes;
    measure_group(*g, s_.inter, "inter-node");
  }
}

}  // namespace fsdp::exec::cal
