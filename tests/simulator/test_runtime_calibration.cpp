// The pytorch runtime profile (configs/runtimes/pytorch.yaml) against real measurements of PyTorch
// DDP and FSDP2 on an H200 (../shared/calibration/pytorch-h200.jsonl, copied to
// tests/data/calibration/). Each row's steady-state peak (steps 2 and 3) and reserved peak are
// predicted from the mechanism (module graph + step program + runtime profile), never looked up.
// Peak allocated and the memory after wrapping have no fitted constant: these rows validate them (within 6%
// and 2% on every row).
//
// Reserved memory is different: allocator.fragmentation_fraction (configs/runtimes/pytorch.yaml; deepspeed.yaml
// copies it) was fitted by least squares to the peak_reserved_GiB / peak_alloc_GiB pairs of these same five
// rows, so they cannot validate it (the CPU accuracy grid has no caching allocator: fragmentation is 0 there; of the
// published rows priced with it, ms-swift's DeepSpeed ones state a per-GPU figure of an unstated kind, likely
// nvidia-smi's; torchtitan's runtime has its own, configs/runtimes/torchtitan.yaml). The reserved columns are
// therefore only a consistency check, marked "fitted row" in the output:
//  - the mechanism: predicted reserved - predicted allocated = fraction x the step's dynamic memory at the
//    peak (allocated - persistent model states), to rounding;
//  - the fit still describes its rows as it did when it was made: each row's reserved error within the
//    worst today (-22.1%, llama3-8b with checkpointing) rounded up to 23%, and their root mean square within
//    today's 10.1% rounded up to 11% (refitted when the FSDP rows' reduce stream pool was counted apart: 0.248). A
//    change to the walk that moves these fails here and needs a refit;
//  - the least-squares fraction over the rows is printed beside the shipped one (the refit to compare).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim_fixtures.hpp"

using namespace fsdp;
using namespace fsdp::test;

TEST_CASE("pytorch runtime vs measured DDP/FSDP2 peaks on an H200") {
  std::ifstream in(std::string(FSDP_TEST_DATA) + "/calibration/pytorch-h200.jsonl");
  REQUIRE(in.good());
  RuntimeProfile rt = runtime("pytorch");
  std::string line;
  int rows = 0;
  double worst_alloc = 0, worst_reserved = 0, sum_sq_reserved = 0;
  // Least squares of the measured gap (reserved - allocated) on the predicted dynamic memory: sum(d g) / sum(d^2).
  double fit_dg = 0, fit_dd = 0;
  std::printf("%-10s %-6s %5s %3s %5s %4s | %8s %8s %6s | %8s %8s %6s (fitted row: consistency only)\n", "model",
              "strat", "world", "mb", "seq", "ckpt", "alloc", "pred", "err", "reserved", "pred", "err");
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    std::string model = j["model"];
    ModelSpec spec =
        model == "llama-1b" ? load_model(std::string(FSDP_TEST_DATA) + "/models/llama-1b.yaml", root()) : zoo(model);
    ModuleGraph g(spec);
    REQUIRE(g.total_params() == j["params"].get<int64_t>());
    Strategy s;
    std::string strat = j["strategy"];
    REQUIRE(parse_strategy_kind(strat, s.kind));
    s.param_dtype = j["mp"] == "bf16" ? DType::Bf16 : DType::Fp32;
    s.reduce_dtype = DType::Fp32;
    s.micro_batch = j["micro_batch"];
    s.seq_len = j["seq"];
    s.act_ckpt = j["act_ckpt"].get<bool>() ? ActCkpt::Full : ActCkpt::None;
    s.reshard_after_forward = j["reshard_after_forward"];
    s.offload = j["cpu_offload"].get<bool>() ? Offload::Params : Offload::None;
    s.attention = AttentionImpl::Sdpa;
    const int64_t world = j["world"];
    StepProgram p = program(g, s, rt, 1, world);
    MemoryResult r = walk_memory(p, rt, world);
    const double measured_alloc = j["peak_alloc_GiB"].back().get<double>() * kGiB;
    const double measured_reserved = j["peak_reserved_GiB"].get<double>() * kGiB;
    double ea = (r.peak_allocated - measured_alloc) / measured_alloc;
    double er = (r.reserved_peak - measured_reserved) / measured_reserved;
    std::printf("%-10s %-6s %5lld %3lld %5lld %4s | %8.2f %8.2f %+5.1f%% | %8.2f %8.2f %+5.1f%%\n", model.c_str(),
                strat.c_str(), static_cast<long long>(world), static_cast<long long>(s.micro_batch),
                static_cast<long long>(s.seq_len), s.act_ckpt == ActCkpt::Full ? "full" : "none", measured_alloc / kGiB,
                r.peak_allocated / kGiB, ea * 100, measured_reserved / kGiB, r.reserved_peak / kGiB, er * 100);
    CAPTURE(line);
    // Per category where the measurement isolates one: memory right after the model is wrapped is the
    // parameters (FSDP2: the fp32 shard; DDP: the replica) and, for DDP, the gradient buckets it
    // allocates at construction (reducer.cpp initialize_buckets), plus small buffers (rotary tables).
    double params_pred = 0;
    for (const MemEvent& e : p.persistent)
      if (e.category == MemoryCategory::ShardedParams || e.category == MemoryCategory::UnshardedGrads ||
          e.category == MemoryCategory::CommBuffers)
        params_pred += e.bytes;
    const double params_meas = j["mem_after_init_GiB"].get<double>() * kGiB;
    std::printf(
        "%-10s %-6s after init (sharded_params, DDP buckets): measured %.3f GiB, predicted %.3f GiB (%+.1f%%)\n",
        model.c_str(), strat.c_str(), params_meas / kGiB, params_pred / kGiB,
        (params_pred - params_meas) / params_meas * 100);
    CHECK(params_pred == doctest::Approx(params_meas).epsilon(0.02));
    CHECK(std::fabs(ea) <= 0.06);
    // Reserved, on a row the fragmentation fraction was fitted to: consistency, not validation.
    double persistent = 0;
    for (const MemEvent& e : p.persistent) persistent += e.bytes;
    const double dynamic = r.peak_allocated - persistent;
    REQUIRE(dynamic > 0);
    // Besides the fraction, the reduce stream pool's cached gradient blocks (FSDP2 rows; 0 for DDP).
    CHECK(r.reserved_peak - r.peak_allocated ==
          doctest::Approx(rt.fragmentation_fraction * dynamic + r.reduce_pool_cached).epsilon(1e-6).scale(kGiB));
    CHECK(std::fabs(er) <= 0.23);
    fit_dg += dynamic * (measured_reserved - measured_alloc - r.reduce_pool_cached);
    fit_dd += dynamic * dynamic;
    sum_sq_reserved += er * er;
    worst_alloc = std::max(worst_alloc, std::fabs(ea));
    worst_reserved = std::max(worst_reserved, std::fabs(er));
    ++rows;
  }
  REQUIRE(rows == 5);  // every row of the file: a row lost from the data must not pass silently
  const double rms_reserved = std::sqrt(sum_sq_reserved / rows);
  std::printf(
      "worst |error|: peak allocated %.1f%% over %d rows (validation); reserved %.1f%%, rms %.1f%% (fitted rows: "
      "consistency only)\n",
      worst_alloc * 100, rows, worst_reserved * 100, rms_reserved * 100);
  std::printf("fragmentation_fraction: shipped %.3f, least squares over these rows with today's walk %.3f\n",
              rt.fragmentation_fraction, fit_dg / fit_dd);
  CHECK(rms_reserved <= 0.11);
}
