// The fms-fsdp runtimes (configs/runtimes/fms-fsdp.yaml, fms-fsdp-compile.yaml): FSDP1 over foundation-model-stack's
// LLaMA as fms-fsdp's get_policies builds it, refused otherwise by the capability table with the profile's reason (its
// repeated kv heads: test_kv_repeat.cpp).
#include <doctest/doctest.h>

#include <string>

#include "sim_fixtures.hpp"

using namespace fsdp;

TEST_CASE("fms-fsdp runtime: FSDP1 full, hybrid or no sharding, every block a unit, no offload, no tp or pp") {
  const ModelSpec m = test::zoo("llama2-7b");
  for (const char* runtime : {"fms-fsdp", "fms-fsdp-compile"}) {
    INFO(runtime);
    Strategy fsdp = test::fsdp_full_ckpt(2, 4096);
    CHECK(test::refusal(fsdp, m, runtime) == "");
    Strategy hsdp = fsdp;
    hsdp.kind = StrategyKind::Hsdp;
    hsdp.hsdp_group = 8;
    CHECK(test::refusal(hsdp, m, runtime) == "");
    // Its selective checkpointing: a fraction p of the blocks evenly spaced (1/N: every N-th).
    Strategy fraction = fsdp;
    fraction.ckpt_fraction = 0.4;
    CHECK(test::refusal(fraction, m, runtime) == "");
    auto refused = [&](const Strategy& s, const std::string& flag) { test::check_refused(s, m, runtime, flag); };
    Strategy zero3 = fsdp;
    zero3.kind = StrategyKind::Zero3;
    refused(zero3, "--strategy");
    Strategy offload = fsdp;
    offload.offload = Offload::Params;
    refused(offload, "--offload");
    Strategy tp = fsdp;
    tp.mesh.tp = 2;
    tp.mesh.sequence_parallel = false;
    refused(tp, "--tp");
    Strategy pp = fsdp;
    pp.mesh.pp = 2;
    refused(pp, "--pp");
  }
}
