// A calibrated hardware profile says what its fitted numbers belong to (`calibrated:` runtime, build and the
// cost-model version, written by fsdp-run calibrate); fsdp-plan refuses it for another runtime or cost model.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

std::string cpu_profile_with(const std::string& section, const std::string& stem) {
  std::ifstream in(root() + "/hwprofiles/cpu.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string anchor = "device_kind: cpu\n";
  const auto pos = yaml.find(anchor);
  REQUIRE(pos != std::string::npos);
  yaml.insert(pos + anchor.size(), section);
  const auto dir = std::filesystem::temp_directory_path() / "fsdp_provenance_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / (stem + ".yaml");
  std::ofstream(path) << yaml;
  return path.string();
}

std::string refusal(const HardwareProfile& hw, const RuntimeProfile& rt) {
  try {
    validate_profiles(hw, rt);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a calibrated profile prices only the runtime and cost model it was fitted against") {
  const std::string section =
      "calibrated:\n  runtime: \"fsdp-run\"\n  runtime_build: \"LibTorch 1.13.1, Gloo\"\n"
      "  cost_model_version: " +
      std::to_string(kCostModelVersion) + "\n";
  const HardwareProfile hw = load_hardware(cpu_profile_with(section, "current"), root());
  REQUIRE(hw.calibrated);
  CHECK(hw.calibrated->runtime == "fsdp-run");
  CHECK(hw.calibrated->runtime_build == "LibTorch 1.13.1, Gloo");
  CHECK(hw.calibrated->cost_model_version == kCostModelVersion);
  CHECK(refusal(hw, runtime("fsdp-run")).empty());
  // Another runtime: refused, naming the file, the key, both runtimes and what to do.
  const std::string other = refusal(hw, runtime("pytorch"));
  CHECK(other.find(hw.source) != std::string::npos);
  CHECK(other.find("calibrated.runtime") != std::string::npos);
  CHECK(other.find("'fsdp-run'") != std::string::npos);
  CHECK(other.find("'pytorch'") != std::string::npos);
  // Another cost-model version: refused, naming both versions.
  const std::string old_section =
      "calibrated:\n  runtime: \"fsdp-run\"\n  runtime_build: \"LibTorch 1.13.1, Gloo\"\n"
      "  cost_model_version: " +
      std::to_string(kCostModelVersion + 1) + "\n";
  const HardwareProfile old = load_hardware(cpu_profile_with(old_section, "other_version"), root());
  const std::string stale = refusal(old, runtime("fsdp-run"));
  CHECK(stale.find("calibrated.cost_model_version") != std::string::npos);
  CHECK(stale.find("version " + std::to_string(kCostModelVersion + 1)) != std::string::npos);
  CHECK(stale.find("fsdp-run calibrate again") != std::string::npos);
  // A hand-written profile (no `calibrated`) prices any runtime.
  const HardwareProfile plain = hardware("cpu");
  CHECK_FALSE(plain.calibrated);
  CHECK(refusal(plain, runtime("pytorch")).empty());
}

TEST_CASE("the calibrated section is strict") {
  auto refused = [](const std::string& section, const std::string& stem, const std::string& key) {
    try {
      load_hardware(cpu_profile_with(section, stem), root());
    } catch (const InputError& e) {
      const std::string msg = e.what();
      CHECK_MESSAGE(msg.find(key) != std::string::npos, msg);
      return true;
    }
    return false;
  };
  CHECK(refused("calibrated:\n  runtime: \"fsdp-run\"\n  runtime_build: \"x\"\n", "missing", "cost_model_version"));
  CHECK(refused("calibrated:\n  runtime: \"fsdp-run\"\n  runtime_build: \"x\"\n  cost_model_version: 1\n  extra: 2\n",
                "unknown", "extra"));
  CHECK(refused("calibrated:\n  runtime: \"fsdp-run\"\n  runtime_build: \"x\"\n  cost_model_version: 0\n", "zero",
                "cost_model_version"));
}

TEST_CASE("backend facts come from the backend profile the hardware profile names, not from the device kind") {
  const std::string cpu_text = [] {
    std::ifstream in(root() + "/hwprofiles/cpu.yaml");
    std::stringstream t;
    t << in.rdbuf();
    return t.str();
  }();
  const HardwareProfile gloo = hardware("cpu");
  CHECK(gloo.backend.name == "gloo");
  CHECK_FALSE(gloo.backend.low_precision_collectives);
  // The CPU device with NCCL's facts: bf16 gathers move bf16, no fp32 staging, no backend gather buffer, and
  // collectives overlap compute; the device is still the host (no CUDA context in the walk).
  HardwareProfile nccl = gloo;
  nccl.backend = load_backend("nccl", root());
  const ModelSpec m = load_model(std::string(FSDP_TEST_DATA) + "/models/acc-small.yaml", root());
  const ModuleGraph g(m);
  const RuntimeProfile rt = runtime("fsdp-run");
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.param_dtype = DType::Bf16;
  s.reduce_dtype = DType::Bf16;
  s.micro_batch = 2;
  s.seq_len = 64;
  s.attention = AttentionImpl::Eager;
  const Cluster c{1, 2};
  StepProgram pg, pn;
  const Prediction on_gloo = simulate(SimulationInput{&g, &gloo, &rt, c, s}, &pg);
  const Prediction on_nccl = simulate(SimulationInput{&g, &nccl, &rt, c, s}, &pn);
  int gathers = 0;
  for (size_t i = 0; i < pg.ops.size(); ++i) {
    if (pg.ops[i].kind != OpKind::Gather) continue;
    ++gathers;
    CHECK(pg.ops[i].comm_dtype == WireType::Fp32);
    CHECK(pn.ops[i].comm_dtype == WireType::Bf16);
    CHECK(pn.ops[i].comm_bytes == doctest::Approx(pg.ops[i].comm_bytes / 2));
    CHECK(pg.ops[i].backend_buffer_bytes > 0);
    CHECK(pn.ops[i].backend_buffer_bytes == 0);
  }
  CHECK(gathers > 0);
  CHECK(on_nccl.memory.peak_allocated < on_gloo.memory.peak_allocated);
  CHECK(on_nccl.memory.breakdown[static_cast<size_t>(MemoryCategory::Workspace)] == 0);
  CHECK(on_nccl.time.exposed_comm_s < on_nccl.time.comm_s);                    // overlapped
  CHECK(on_gloo.time.exposed_comm_s == doctest::Approx(on_gloo.time.comm_s));  // one in-order resource
  // A hardware profile naming an unknown backend is refused, naming the file and key.
  const auto dir = std::filesystem::temp_directory_path() / "fsdp_provenance_test";
  std::filesystem::create_directories(dir);
  std::string bad = cpu_text;
  bad.replace(bad.find("backend: gloo"), 13, "backend: mpi");
  std::ofstream(dir / "bad_backend.yaml") << bad;
  try {
    load_hardware((dir / "bad_backend.yaml").string(), root());
    FAIL("an unknown backend loaded");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("bad_backend.yaml") != std::string::npos);
    CHECK(msg.find("backend") != std::string::npos);
    CHECK(msg.find("known: gloo, nccl") != std::string::npos);
  }
}
