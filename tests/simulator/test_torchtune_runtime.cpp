// The torchtune runtime (configs/runtimes/torchtune.yaml): what its distributed recipes run, refused otherwise by the
// capability table with the profile's reason (its loss: test_chunked_loss.cpp).
#include <doctest/doctest.h>

#include <string>

#include "sim_fixtures.hpp"

using namespace fsdp;

TEST_CASE("torchtune runtime: FSDP2 over every decoder layer, full or no checkpointing, TP without sequence parallel") {
  const ModelSpec m = test::zoo("llama3-8b");
  const Strategy fsdp = test::fsdp_full_ckpt(1, 4096);
  CHECK(test::refusal(fsdp, m, "torchtune") == "");
  auto refused = [&](Strategy s, const std::string& flag) {
    const std::string why = test::refusal(s, m, "torchtune");
    CAPTURE(why);
    CHECK(why.find(flag) != std::string::npos);
    CHECK(why.find("torchtune") != std::string::npos);
  };
  Strategy ddp = fsdp;
  ddp.kind = StrategyKind::Ddp;
  refused(ddp, "--strategy");
  Strategy hsdp = fsdp;
  hsdp.kind = StrategyKind::Hsdp;
  hsdp.hsdp_group = 4;
  refused(hsdp, "--strategy");
  Strategy every = fsdp;
  every.act_ckpt = ActCkpt::Full;
  every.ckpt_every = 2;
  refused(every, "--act-ckpt");
  Strategy optimizer_offload = fsdp;
  optimizer_offload.offload = Offload::Optimizer;
  refused(optimizer_offload, "--offload");
  Strategy tp = fsdp;
  tp.mesh.tp = 2;
  tp.mesh.sequence_parallel = false;
  CHECK(test::refusal(tp, m, "torchtune") == "");
  tp.mesh.sequence_parallel = true;
  refused(tp, "--sequence-parallel");
  Strategy pp = fsdp;
  pp.mesh.pp = 2;
  refused(pp, "--pp");
}
