// Hardware profiles: every shipped profile loads, holds its datasheet numbers, and the loader
// refuses bad input with file:line:key.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/collective_cost.hpp"
#include "compute/compute_cost.hpp"
#include "core/errors.hpp"
#include "hardware/hardware_profile.hpp"

using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `text` to a fresh .yaml file in the temp directory and returns its path.
std::string write_temp_profile(const std::string& text, const std::string& stem) {
  auto dir = std::filesystem::temp_directory_path() / "fsdp_hw_test";
  std::filesystem::create_directories(dir);
  auto path = dir / (stem + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  REQUIRE_MESSAGE(pos != std::string::npos, "fixture text not found: " << from);
  return text.replace(pos, from.size(), to);
}

// Loads a variant of a100-80gb.yaml and returns the InputError message ("" if it loaded).
std::string load_error(const std::string& text, const std::string& stem) {
  std::string path = write_temp_profile(text, stem);
  try {
    load_hardware(path, kRoot);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("every shipped hardware profile loads and is consistent") {
  auto names = list_hardware(kRoot);
  for (const char* required : {"a100-80gb", "a100-40gb", "a800-80gb", "h100-80gb", "h200-141gb", "l40s-48gb", "cpu",
                               "p4d-a100-40gb", "p4de-a100-80gb", "p5-h100-80gb", "meta-roce-h100-80gb"})
    CHECK_MESSAGE(std::find(names.begin(), names.end(), required) != names.end(), required);
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const auto& n : names) {
    CAPTURE(n);
    HardwareProfile hw = load_hardware(n, kRoot);
    CHECK(hw.name == n);
    CHECK(hw.usable_device_memory.value > 0);
    CHECK(hw.usable_device_memory <= hw.device_memory);
    CHECK(hw.peak_flops(DType::Bf16).value > 0);
    CHECK(hw.memory_bandwidth.value > 0);
    CHECK(hw.intra_node.bandwidth.value > 0);
    CHECK(hw.inter_node.bandwidth.value > 0);
    CHECK(hw.gpus_per_node >= 1);
    CHECK(hw.nics_per_node >= 1);
    CHECK(hw.cpu_cores >= 1);
    CHECK(hw.host_memory.value > 0);
    if (hw.device_kind == "cpu") CHECK(hw.device_memory <= hw.host_memory);
    // Shipped profiles carry no power limit: none of them warns.
    CHECK(hardware_warnings(hw).empty());
    // A shipped derived profile is a few keys over a shipped base.
    if (!hw.base_source.empty()) {
      CHECK(std::filesystem::path(hw.base_source).parent_path() == std::filesystem::path(kRoot) / "hwprofiles");
      CHECK(read_text(hw.source).find("\nbase: ") != std::string::npos);
    }
  }
}

TEST_CASE("a100-80gb holds the DGX A100 datasheet numbers") {
  HardwareProfile hw = load_hardware("a100-80gb", kRoot);
  CHECK(hw.device_kind == "cuda");
  CHECK(hw.device_memory.value == doctest::Approx(80 * kGiB));
  CHECK(hw.peak_flops(DType::Bf16).value == doctest::Approx(312 * kTera));
  CHECK(hw.peak_flops(DType::Fp16).value == doctest::Approx(312 * kTera));
  CHECK(hw.peak_flops(DType::Fp32).value == doctest::Approx(19.5 * kTera));
  CHECK(hw.memory_bandwidth.value == doctest::Approx(2039 * kGB));
  CHECK(hw.gpus_per_node == 8);
  CHECK(hw.intra_node.bandwidth.value == doctest::Approx(300 * kGB));
  CHECK(hw.nics_per_node == 8);
  CHECK(hw.inter_node.bandwidth.value == doctest::Approx(200 * kGB / 8));  // 200 Gb/s
  CHECK(hw.intra_node.latency.value == doctest::Approx(3.4 * kMicro));
  CHECK(hw.source == kRoot + "/hwprofiles/a100-80gb.yaml");
}

TEST_CASE("h100 and a800 differ from a100 where their datasheets do") {
  HardwareProfile a100 = load_hardware("a100-80gb", kRoot);
  HardwareProfile a800 = load_hardware("a800-80gb", kRoot);
  HardwareProfile h100 = load_hardware("h100-80gb", kRoot);
  HardwareProfile l40s = load_hardware("l40s-48gb", kRoot);
  CHECK(a800.intra_node.bandwidth.value == doctest::Approx(200 * kGB));  // NVLink cut to 400 GB/s bidirectional
  CHECK(a800.peak_flops(DType::Bf16).value == doctest::Approx(a100.peak_flops(DType::Bf16).value));
  CHECK(h100.intra_node.bandwidth.value == doctest::Approx(450 * kGB));
  CHECK(h100.inter_node.bandwidth.value == doctest::Approx(400 * kGB / 8));  // NDR 400 Gb/s
  CHECK(h100.peak_flops(DType::Bf16).value == doctest::Approx(989.5 * kTera));
  CHECK(l40s.intra_node.bandwidth.value < a100.intra_node.bandwidth.value / 5);  // PCIe only, no NVLink
}

TEST_CASE("the A100 and H100 families price compute under communication at the measured 18.9%") {
  // Lee et al., arXiv:2507.03114 (2025), abstract: compute overlapped with communication runs "an average computational
  // slowdown of 18.9%" against the same compute alone (4x A100, 4x H100, MI250, MI210). Before: NCCL's CTAs' share of
  // the SMs, 16/108 = 0.15 (A100) and 16/132 = 0.12 (H100). Derived profiles inherit it through base:.
  for (const char* name : {"a100-40gb", "a100-80gb", "a800-80gb", "h100-80gb", "h200-141gb", "p4d-a100-40gb",
                           "p4de-a100-80gb", "p5-h100-80gb", "grand-teton-h100-96gb", "meta-roce-h100-80gb"}) {
    CAPTURE(name);
    CHECK(load_hardware(name, kRoot).compute_slowdown_during_comm == doctest::Approx(0.189));
  }
  // A PCIe card keeps its own figure (not covered by the measurement).
  CHECK(load_hardware("l40s-48gb", kRoot).compute_slowdown_during_comm == doctest::Approx(0.03));
}

TEST_CASE("a path ending in .yaml is read directly") {
  std::string text = read_text(kRoot + "/hwprofiles/h200-141gb.yaml");
  std::string path = write_temp_profile(replace_once(text, "name: h200-141gb", "name: my-h200"), "my-h200");
  // The config root still serves the profile's backend (configs/backends).
  HardwareProfile hw = load_hardware(path, kRoot);
  CHECK(hw.name == "my-h200");
  CHECK(hw.source == path);
}

TEST_CASE("optional per-dtype curves and a CPU device's cores load; absent, the shared curve serves") {
  // A copy of `text` with `from` replaced by `to` is refused with a message that names each of `keys`.
  auto check_refused = [](const std::string& text, const std::string& from, const std::string& to, const char* tag,
                          std::initializer_list<const char*> keys) {
    const std::string m = load_error(replace_once(text, from, to), tag);
    for (const char* k : keys) CHECK_MESSAGE(contains(m, k), m);
  };
  // cpu.yaml without its optional measured keys: the in-step factors, and the per-dtype curves, host overhead,
  // elementwise rates and forward-GEMM ratios that fsdp-run calibrate measured for it (each such key with the
  // lines indented under it). The optional keys are added back below.
  std::string cpu;
  {
    const std::vector<std::string> optional = {"  in_step_factor",
                                               "  matmul_efficiency_bf16:",
                                               "  attention_forward_efficiency_bf16:",
                                               "  attention_backward_efficiency_bf16:",
                                               "  host_overhead:",
                                               "  elementwise_bandwidth:",
                                               "  matmul_forward_ratio:"};
    std::istringstream in(read_text(kRoot + "/hwprofiles/cpu.yaml"));
    bool under_optional = false;  // inside an optional key's block (its lines are indented deeper)
    for (std::string line; std::getline(in, line);) {
      if (under_optional && line.rfind("   ", 0) == 0) continue;
      under_optional = false;
      for (const std::string& key : optional) under_optional = under_optional || line.rfind(key, 0) == 0;
      if (!under_optional) cpu += line + "\n";
    }
  }
  HardwareProfile plain = load_hardware(write_temp_profile(cpu, "cpu_plain"), kRoot);
  CHECK(plain.matmul_efficiency_bf16.empty());
  CHECK(&plain.matmul_curve(DType::Bf16) == &plain.matmul_efficiency);
  CHECK(&plain.attention_backward_curve(DType::Fp16) == &plain.attention_backward_efficiency);
  CHECK(plain.device_cores == 1);  // calibrate's rates: one core per rank, 2 ranks on the 2 cores
  HardwareProfile whole =
      load_hardware(write_temp_profile(replace_once(cpu, "  cores: 1\n", ""), "cpu_nocores"), kRoot);
  CHECK(whole.device_cores == 0);  // absent: the whole node (cpu_compute_slowdown)
  const std::string extra =
      "  matmul_efficiency_bf16:\n    - {gemm_flops: 1.0e6, efficiency: 0.2}\n    - {gemm_flops: 1.0e8, efficiency: "
      "0.9}\n"
      "  attention_forward_efficiency_fp16:\n    - {attention_flops: 1.0e6, efficiency: 0.3}\n";
  const std::string with = replace_once(cpu, "node:\n", extra + "node:\n");  // cpu.yaml's `cores: 1` kept
  HardwareProfile hw = load_hardware(write_temp_profile(with, "cpu_dtype"), kRoot);
  REQUIRE(hw.matmul_efficiency_bf16.x.size() == 2);
  CHECK(hw.matmul_curve(DType::Bf16).at(1e8) == doctest::Approx(0.9));
  CHECK(&hw.matmul_curve(DType::Fp16) == &hw.matmul_efficiency);
  CHECK(hw.attention_forward_curve(DType::Fp16).at(1) == doctest::Approx(0.3));
  CHECK(&hw.attention_forward_curve(DType::Bf16) == &hw.attention_efficiency);
  CHECK(hw.device_cores == 1);

  // The optional curves are read as strictly as the required ones.
  check_refused(with, "{gemm_flops: 1.0e8, efficiency: 0.9}", "{gemm_flops: 1.0e5, efficiency: 0.9}", "cpu_unsorted",
                {"device.matmul_efficiency_bf16[1].gemm_flops"});
  check_refused(with, "matmul_efficiency_bf16:", "matmul_efficiency_bf17:", "cpu_typo",
                {"unknown key 'device.matmul_efficiency_bf17'"});
  check_refused(with, "  cores: 1\n", "  cores: 3\n", "cpu_cores_high", {"device.cores", "exceeds node.cpu_cores"});
  check_refused(with, "  cores: 1\n", "  cores: 0\n", "cpu_cores_zero", {"device.cores"});
  // Host overhead per dtype (a dtype without an entry uses fp32's) and per-collective bus efficiency.
  const std::string more = replace_once(
      replace_once(with, "  cores: 1\n",
                   "  cores: 1\n  host_overhead:\n"
                   "    fp32: {layer_forward: \"200 us\", layer_backward: \"300 us\", head_forward: \"40 us\", "
                   "head_backward: \"90 us\"}\n"
                   "    bf16: {layer_forward: \"250 us\", layer_backward: \"350 us\", head_forward: \"50 us\", "
                   "head_backward: \"120 us\", unit: \"600 us\"}\n"),
      "      - {message: \"4 MiB\", efficiency: 1.0}\n  nics_per_node",
      "      - {message: \"4 MiB\", efficiency: 1.0}\n    bus_efficiency_all_reduce:\n"
      "      - {message: \"1 MiB\", efficiency: 0.25}\n  nics_per_node");
  HardwareProfile ho = load_hardware(write_temp_profile(more, "cpu_overhead"), kRoot);
  CHECK(ho.host_overhead(DType::Fp32).layer_backward.value == doctest::Approx(300e-6));
  CHECK(ho.host_overhead(DType::Bf16).head_backward.value == doctest::Approx(120e-6));
  CHECK(ho.host_overhead(DType::Bf16).unit.value == doctest::Approx(600e-6));
  CHECK(ho.host_overhead(DType::Fp32).unit.value == 0);                                 // optional: absent, none
  CHECK(ho.host_overhead(DType::Fp16).layer_forward.value == doctest::Approx(200e-6));  // fp32's entry
  REQUIRE(ho.intra_node.bus_efficiency_all_reduce.x.size() == 1);
  CHECK(ho.intra_node.bus_efficiency_all_reduce.efficiency[0] == doctest::Approx(0.25));
  CHECK(ho.intra_node.bus_efficiency_all_gather.empty());
  CHECK(plain.host_overhead(DType::Bf16).empty());  // absent: no overhead (GPUs hide it)
  check_refused(more, "    bf16: {", "    int8: {", "cpu_overhead_dtype", {"unknown key 'device.host_overhead.int8'"});
  check_refused(more, "head_forward: \"40 us\"", "head_forward: \"40\"", "cpu_overhead_unit",
                {"device.host_overhead.fp32.head_forward"});
  check_refused(more, "layer_forward: \"250 us\", ", "", "cpu_overhead_missing",
                {"device.host_overhead.bf16.layer_forward"});
  check_refused(more, "{message: \"1 MiB\", efficiency: 0.25}", "{message: \"1 MiB\", efficiency: 1.5}", "cpu_coll_eff",
                {"node.intra_node.bus_efficiency_all_reduce[0].efficiency"});

  // Elementwise rates and forward-GEMM ratios per dtype, and the collectives' in-step factor: optional, strict.
  const std::string calibrated = replace_once(
      replace_once(
          more, "  cores: 1\n",
          "  cores: 1\n  elementwise_bandwidth:\n    bf16: \"7.5 GB/s\"\n  matmul_forward_ratio:\n    fp32: 1.47\n"),
      "  compute_slowdown_during_comm:",
      "  in_step_factor: 1.25\n  in_step_factor_shared_cores: 1.75\n  in_step_factor_fp32: 2.5\n"
      "  in_step_factor_shared_cores_fp32: 3.5\n  compute_slowdown_during_comm:");
  HardwareProfile cal = load_hardware(write_temp_profile(calibrated, "cpu_calibrated"), kRoot);
  CHECK(cal.elementwise_bandwidth(DType::Bf16).value == doctest::Approx(7.5e9));
  CHECK(cal.elementwise_bandwidth(DType::Fp32).value == doctest::Approx(cal.memory_bandwidth.value));
  CHECK(cal.matmul_forward_ratio(DType::Fp32) == doctest::Approx(1.47));
  CHECK(cal.matmul_forward_ratio(DType::Bf16) == 1.0);
  // The shared-cores factor applies when a node's ranks outnumber its cores (fsdp-run's ranks then sleep).
  REQUIRE(cal.cpu_cores == 2);
  // The fp32 factors price fp32 plans; bf16 and fp16 plans take the probe's (bf16) ones.
  for (DType dt : {DType::Bf16, DType::Fp16}) {
    CHECK(cal.in_step_factor(2, dt) == doctest::Approx(1.25));
    CHECK(cal.in_step_factor(3, dt) == doctest::Approx(1.75));
  }
  CHECK(cal.in_step_factor(2, DType::Fp32) == doctest::Approx(2.5));
  CHECK(cal.in_step_factor(3, DType::Fp32) == doctest::Approx(3.5));
  for (DType dt : {DType::Fp32, DType::Bf16}) {
    CHECK(plain.in_step_factor(2, dt) == 1.0);
    CHECK(plain.in_step_factor(4, dt) == 1.0);
  }
  // Each absent factor falls back: fp32's shared-cores one to the probe's shared-cores one, then to the
  // dtype's own node factor, then to the probe's.
  HardwareProfile fallback = cal;
  fallback.collective_in_step_factor_shared_cores_fp32 = std::nullopt;
  CHECK(fallback.in_step_factor(4, DType::Fp32) == doctest::Approx(1.75));
  fallback.collective_in_step_factor_shared_cores = std::nullopt;
  CHECK(fallback.in_step_factor(4, DType::Fp32) == doctest::Approx(2.5));
  CHECK(fallback.in_step_factor(4, DType::Bf16) == doctest::Approx(1.25));
  fallback.collective_in_step_factor_fp32 = std::nullopt;
  CHECK(fallback.in_step_factor(4, DType::Fp32) == doctest::Approx(1.25));
  CHECK(fallback.in_step_factor(2, DType::Fp32) == doctest::Approx(1.25));
  check_refused(calibrated, "bf16: \"7.5 GB/s\"", "bf16: \"7.5 GB\"", "cpu_ew_unit",
                {"device.elementwise_bandwidth.bf16"});
  check_refused(calibrated, "fp32: 1.47", "fp32: 3.5", "cpu_fwd_ratio", {"device.matmul_forward_ratio.fp32"});
  check_refused(calibrated, "in_step_factor: 1.25", "in_step_factor: -0.5", "cpu_in_step",
                {"collectives.in_step_factor"});
  // A measured 0 (the probe's collectives hid entirely) is a value, not an absent key: it does not fall back.
  std::string zero_text = calibrated;
  const std::string measured_key = "in_step_factor_shared_cores_fp32: 3.5";
  REQUIRE(zero_text.find(measured_key) != std::string::npos);
  zero_text.replace(zero_text.find(measured_key), measured_key.size(), "in_step_factor_shared_cores_fp32: 0");
  const HardwareProfile hidden = load_hardware(write_temp_profile(zero_text, "cpu_in_step_zero"), kRoot);
  REQUIRE(hidden.collective_in_step_factor_shared_cores_fp32.has_value());
  CHECK(hidden.in_step_factor(4, DType::Fp32) == 0.0);
  CHECK(hidden.in_step_factor(4, DType::Bf16) == doctest::Approx(1.75));
  check_refused(calibrated, "in_step_factor_shared_cores: 1.75", "in_step_factor_shared_cores: -2",
                "cpu_in_step_shared", {"collectives.in_step_factor_shared_cores", "non-negative"});
  check_refused(calibrated, "in_step_factor_fp32: 2.5", "in_step_factor_fp32: -1", "cpu_in_step_fp32",
                {"collectives.in_step_factor_fp32", "non-negative"});
  check_refused(calibrated, "in_step_factor_shared_cores_fp32: 3.5", "in_step_factor_shared_cores_fp32: fast",
                "cpu_in_step_shared_fp32", {"collectives.in_step_factor_shared_cores_fp32"});

  // A GPU is not a number of cores.
  const std::string a100 = read_text(kRoot + "/hwprofiles/a100-80gb.yaml");
  check_refused(a100, "node:\n", "  cores: 1\nnode:\n", "gpu_cores", {"device.cores", "cpu device"});
}

TEST_CASE("EfficiencyCurve interpolates in log2(x) and clamps at both ends") {
  EfficiencyCurve c{{1e6, 4e6, 16e6}, {0.5, 0.7, 0.8}};
  CHECK(c.at(1e6) == doctest::Approx(0.5));
  CHECK(c.at(4e6) == doctest::Approx(0.7));
  CHECK(c.at(2e6) == doctest::Approx(0.6));   // halfway in log2 between 1e6 and 4e6
  CHECK(c.at(8e6) == doctest::Approx(0.75));  // halfway between 4e6 and 16e6
  CHECK(c.at(std::sqrt(2) * 1e6) == doctest::Approx(0.55));
  CHECK(c.at(10) == doctest::Approx(0.5));  // below the first point
  CHECK(c.at(0) == doctest::Approx(0.5));
  CHECK(c.at(1e12) == doctest::Approx(0.8));  // above the last point
  EfficiencyCurve one{{1e9}, {0.42}};
  CHECK(one.at(1) == doctest::Approx(0.42));
  CHECK(one.at(1e15) == doctest::Approx(0.42));
}

TEST_CASE("unknown hardware names list the known ones") {
  try {
    load_hardware("b900-1tb", kRoot);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    std::string m = e.what();
    CHECK(contains(m, "unknown hardware 'b900-1tb'"));
    CHECK(contains(m, "a100-80gb"));
    CHECK(contains(m, "h100-80gb"));
  }
  CHECK_THROWS_AS(load_hardware("/no/such/file.yaml", kRoot), InputError);
}

TEST_CASE("the loader refuses bad hardware files with file:line:key") {
  const std::string base = read_text(kRoot + "/hwprofiles/a100-80gb.yaml");
  REQUIRE(load_error(base, "ok") == "");

  SUBCASE("unknown top-level key") {
    std::string m = load_error(base + "turbo: true\n", "unknown_top");
    CHECK(contains(m, "unknown key 'turbo'"));
    CHECK(contains(m, "unknown_top.yaml:"));
  }
  SUBCASE("unknown nested key") {
    std::string m = load_error(replace_once(base, "    latency: \"3.4 us\"", "    latency: \"3.4 us\"\n    lanes: 12"),
                               "unknown_nested");
    CHECK(contains(m, "unknown key 'node.intra_node.lanes'"));
  }
  SUBCASE("missing key") {
    std::string m = load_error(replace_once(base, "  memory_bandwidth: \"2039 GB/s\"", "  # no bandwidth"), "missing");
    CHECK(contains(m, "device.memory_bandwidth"));
    CHECK(contains(m, "missing"));
  }
  SUBCASE("wrong unit") {
    std::string m = load_error(replace_once(base, "memory: \"80 GiB\"", "memory: \"80 GB/s\""), "wrong_unit");
    CHECK(contains(m, "device.memory"));
    CHECK(contains(m, "wrong_unit.yaml:8:"));  // the line of the key
  }
  SUBCASE("bare number without a unit") {
    std::string m = load_error(replace_once(base, "bandwidth: \"300 GB/s\"", "bandwidth: 300"), "bare");
    CHECK(contains(m, "node.intra_node.bandwidth"));
  }
  SUBCASE("zero bandwidth") {
    std::string m = load_error(replace_once(base, "bandwidth: \"200 Gb/s\"", "bandwidth: \"0 Gb/s\""), "zero_bw");
    CHECK(contains(m, "node.inter_node.bandwidth"));
    CHECK(contains(m, "positive"));
  }
  SUBCASE("zero memory") {
    std::string m = load_error(replace_once(base, "memory: \"80 GiB\"", "memory: \"0 GiB\""), "zero_mem");
    CHECK(contains(m, "device.memory"));
  }
  SUBCASE("usable above total") {
    std::string m =
        load_error(replace_once(base, "usable_memory: \"81920 MiB\"", "usable_memory: \"81 GiB\""), "usable");
    CHECK(contains(m, "device.usable_memory"));
  }
  SUBCASE("zero GPUs per node") {
    std::string m = load_error(replace_once(base, "gpus_per_node: 8", "gpus_per_node: 0"), "gpus0");
    CHECK(contains(m, "node.gpus_per_node"));
  }
  SUBCASE("device kind") {
    std::string m = load_error(replace_once(base, "device_kind: cuda", "device_kind: tpu"), "kind");
    CHECK(contains(m, "device_kind"));
  }
  SUBCASE("efficiency above one") {
    std::string m = load_error(
        replace_once(base, "{message: \"16 GiB\", efficiency: 0.800}", "{message: \"16 GiB\", efficiency: 1.2}"),
        "eff_high");
    CHECK(contains(m, "node.intra_node.bus_efficiency[10].efficiency"));
  }
  SUBCASE("efficiency zero") {
    std::string m = load_error(
        replace_once(base, "{gemm_flops: 1.07e11, efficiency: 0.869}", "{gemm_flops: 1.07e11, efficiency: 0}"),
        "eff_zero");
    CHECK(contains(m, "device.matmul_efficiency[0].efficiency"));
  }
  SUBCASE("curve not sorted") {
    std::string m = load_error(
        replace_once(base, "{message: \"32 MiB\", efficiency: 0.722}", "{message: \"8 MiB\", efficiency: 0.722}"),
        "unsorted");
    CHECK(contains(m, "bus_efficiency[1].message"));
    CHECK(contains(m, "sorted"));
  }
  SUBCASE("curve rising faster than its argument") {
    // 0.1 at 1e11 FLOP to 0.9 at 2e11 FLOP would make the bigger GEMM faster than the smaller one.
    std::string m = load_error(replace_once(base, "    - {gemm_flops: 1.07e11, efficiency: 0.869}",
                                            "    - {gemm_flops: 1.0e11, efficiency: 0.1}\n"
                                            "    - {gemm_flops: 2.0e11, efficiency: 0.9}"),
                               "too_steep");
    CHECK(contains(m, "matmul_efficiency[1].efficiency"));
    CHECK(contains(m, "more work would take less time"));
  }
  SUBCASE("empty curve") {
    std::string m =
        load_error(replace_once(base, "  matmul_efficiency:\n    - {gemm_flops: 1.07e11, efficiency: 0.869}",
                                "  matmul_efficiency: []"),
                   "empty_curve");
    CHECK(contains(m, "device.matmul_efficiency"));
  }
  SUBCASE("not YAML") {
    std::string m = load_error("name: [unclosed\n", "garbage");
    CHECK(contains(m, "garbage.yaml"));
  }
}

// ---- Derived profiles (`base:`), the network description, clocks and power (docs/hardware.md) ----

namespace {

// The InputError message of loading `path` ("" if it loaded).
std::string error_of(const std::string& path) {
  try {
    load_hardware(path, kRoot);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a derived profile overrides the keys it gives, key by key, and inherits the rest") {
  const HardwareProfile h100 = load_hardware("h100-80gb", kRoot);
  SUBCASE("one nested key") {
    const std::string path =
        write_temp_profile("base: h100-80gb\nname: four-nics\nnode:\n  nics_per_node: 4\n", "derived_nics");
    const HardwareProfile hw = load_hardware(path, kRoot);
    CHECK(hw.name == "four-nics");
    CHECK(hw.source == path);
    CHECK(hw.base_source == kRoot + "/hwprofiles/h100-80gb.yaml");
    CHECK(hw.nics_per_node == 4);
    // Everything else of node is the base's, and so are the other sections.
    CHECK(hw.gpus_per_node == h100.gpus_per_node);
    CHECK(hw.inter_node.bandwidth == h100.inter_node.bandwidth);
    CHECK(hw.inter_node.latency == h100.inter_node.latency);
    CHECK(hw.inter_node.bus_efficiency.x == h100.inter_node.bus_efficiency.x);
    CHECK(std::string(to_string(hw.fabric)) == "infiniband");
    CHECK(hw.host_memory == h100.host_memory);
    CHECK(hw.device_memory == h100.device_memory);
    CHECK(hw.peak_flops(DType::Bf16) == h100.peak_flops(DType::Bf16));
    CHECK(hw.collective_base_latency == h100.collective_base_latency);
    CHECK(hw.backend.name == h100.backend.name);
    CHECK(hw.device_kind == "cuda");
  }
  SUBCASE("a key of a tier two mappings down") {
    const HardwareProfile hw = load_hardware(
        write_temp_profile("base: h100-80gb\nname: slow-nics\nnode:\n  inter_node:\n    bandwidth: \"200 Gb/s\"\n",
                           "derived_tier"),
        kRoot);
    CHECK(hw.inter_node.bandwidth.value == doctest::Approx(200 * kGB / 8));
    CHECK(hw.inter_node.latency == h100.inter_node.latency);
    CHECK(hw.inter_node.bus_efficiency.efficiency == h100.inter_node.bus_efficiency.efficiency);
    CHECK(hw.intra_node.bandwidth == h100.intra_node.bandwidth);
    CHECK(hw.nics_per_node == h100.nics_per_node);
  }
  SUBCASE("a list (a curve) replaces the base's whole list") {
    REQUIRE(h100.intra_node.bus_efficiency.x.size() > 2);
    const HardwareProfile hw = load_hardware(
        write_temp_profile("base: h100-80gb\nname: flat-nvlink\nnode:\n  intra_node:\n    bus_efficiency:\n"
                           "      - {message: \"1 MiB\", efficiency: 0.5}\n"
                           "      - {message: \"1 GiB\", efficiency: 0.75}\n",
                           "derived_curve"),
        kRoot);
    REQUIRE(hw.intra_node.bus_efficiency.x.size() == 2);
    CHECK(hw.intra_node.bus_efficiency.at(1 * kGiB) == doctest::Approx(0.75));
    CHECK(hw.intra_node.bandwidth == h100.intra_node.bandwidth);
    CHECK(hw.attention_efficiency.x == h100.attention_efficiency.x);  // a curve not given stays
  }
  SUBCASE("a collective's own factor by node count is read, checked like any curve, and optional") {
    const HardwareProfile hw =
        load_hardware(write_temp_profile("base: p5-h100-80gb\nname: efa-gather\nnode:\n  inter_node:\n"
                                         "    bus_efficiency_by_nodes_all_gather:\n"
                                         "      - {nodes: 2, efficiency: 0.5}\n"
                                         "      - {nodes: 32, efficiency: 0.1}\n",
                                         "derived_by_nodes_ag"),
                      kRoot);
    REQUIRE(hw.inter_node.bus_efficiency_by_nodes_all_gather.x.size() == 2);
    CHECK(hw.inter_node.bus_efficiency_by_nodes_all_gather.at(32) == doctest::Approx(0.1));
    CHECK(hw.inter_node.bus_efficiency_by_nodes_reduce_scatter.empty());
    // The shared curve stays the base's.
    CHECK(hw.inter_node.bus_efficiency_by_nodes.x ==
          load_hardware("p5-h100-80gb", kRoot).inter_node.bus_efficiency_by_nodes.x);
    CHECK(contains(error_of(write_temp_profile("base: h100-80gb\nname: x\nnode:\n  inter_node:\n"
                                               "    bus_efficiency_by_nodes_reduce_scatter:\n"
                                               "      - {nodes: 2, efficiency: 1.5}\n",
                                               "derived_by_nodes_rs_bad")),
                   "bus_efficiency_by_nodes_reduce_scatter[0].efficiency"));
  }
  SUBCASE("a derived profile may be the base of another; a relative path is the file's own directory's") {
    write_temp_profile("base: h100-80gb\nname: mid\nnode:\n  nics_per_node: 4\n", "chain_mid");
    const HardwareProfile hw = load_hardware(
        write_temp_profile("base: chain_mid.yaml\nname: top\nnode:\n  inter_node:\n    fabric: roce\n", "chain_top"),
        kRoot);
    CHECK(hw.name == "top");
    CHECK(hw.nics_per_node == 4);
    CHECK(std::string(to_string(hw.fabric)) == "roce");
    CHECK(hw.base_source == (std::filesystem::temp_directory_path() / "fsdp_hw_test" / "chain_mid.yaml").string());
  }
  SUBCASE("a dtype entry the base lacks must be whole; one it has is overridden key by key") {
    const std::string whole = write_temp_profile(
        "base: cpu\nname: cpu-overhead\ndevice:\n  host_overhead:\n    fp32: {layer_forward: \"200 us\", "
        "layer_backward: \"300 us\", head_forward: \"40 us\", head_backward: \"90 us\"}\n",
        "overhead_whole");
    const HardwareProfile base = load_hardware(whole, kRoot);
    const HardwareProfile hw =
        load_hardware(write_temp_profile("base: overhead_whole.yaml\nname: cpu-unit\ndevice:\n  host_overhead:\n"
                                         "    fp32: {unit: \"1 ms\"}\n",
                                         "overhead_unit"),
                      kRoot);
    CHECK(hw.host_overhead_fp32.unit.value == doctest::Approx(1e-3));
    CHECK(hw.host_overhead_fp32.layer_forward.value == doctest::Approx(200e-6));
    CHECK(hw.host_overhead_fp32.head_backward.value == doctest::Approx(90e-6));
    if (base.host_overhead_fp16.empty()) {
      const std::string m = error_of(write_temp_profile(
          "base: overhead_whole.yaml\nname: cpu-fp16\ndevice:\n  host_overhead:\n    fp16: {unit: \"1 ms\"}\n",
          "overhead_new_entry"));
      CHECK_MESSAGE(contains(m, "device.host_overhead.fp16.layer_forward"), m);
      CHECK_MESSAGE(contains(m, "overhead_new_entry.yaml"), m);
    }
  }
}

TEST_CASE("a derived profile is read as strictly as a whole one, and errors name the file that holds the key") {
  const std::string dir = (std::filesystem::temp_directory_path() / "fsdp_hw_test").string();
  SUBCASE("an unknown key in the derived file") {
    const std::string path =
        write_temp_profile("base: h100-80gb\nname: typo\nnode:\n  inter_node:\n    lanes: 4\n", "derived_unknown");
    const std::string m = error_of(path);
    CHECK_MESSAGE(contains(m, path + ":5: unknown key 'node.inter_node.lanes'"), m);
  }
  SUBCASE("a bad value in the derived file names the derived file and line") {
    const std::string path =
        write_temp_profile("base: h100-80gb\nname: bad\ndevice:\n  memory: \"80 GB/s\"\n", "derived_bad_value");
    const std::string m = error_of(path);
    CHECK_MESSAGE(contains(m, path + ":4: key 'device.memory'"), m);
    CHECK_MESSAGE(!contains(m, "h100-80gb.yaml"), m);
  }
  SUBCASE("a bad value in the base names the base, and the file it is the base of") {
    const std::string base_path = write_temp_profile(
        replace_once(read_text(kRoot + "/hwprofiles/a100-80gb.yaml"), "memory: \"80 GiB\"", "memory: \"80 GB/s\""),
        "broken_base");
    const std::string path = write_temp_profile("base: broken_base.yaml\nname: on-broken\n", "derived_on_broken");
    const std::string m = error_of(path);
    CHECK_MESSAGE(contains(m, base_path + ":8: key 'device.memory'"), m);
    CHECK_MESSAGE(contains(m, "the base of " + path), m);
  }
  SUBCASE("a check between keys names the derived file's key") {
    // The base's usable memory (81559 MiB) is more than the 40 GiB the derived file gives.
    const std::string m =
        error_of(write_temp_profile("base: h100-80gb\nname: small\ndevice:\n  memory: \"40 GiB\"\n", "derived_usable"));
    CHECK_MESSAGE(contains(m, "derived_usable.yaml:4: key 'device.memory'"), m);
    CHECK_MESSAGE(contains(m, "exceeds device.memory"), m);
  }
  SUBCASE("name is the derived file's own") {
    const std::string m =
        error_of(write_temp_profile("base: h100-80gb\nnode:\n  nics_per_node: 4\n", "derived_noname"));
    CHECK_MESSAGE(contains(m, "derived_noname.yaml"), m);
    CHECK_MESSAGE(contains(m, "key 'name': missing"), m);
  }
  SUBCASE("an unknown base name lists the shipped ones") {
    const std::string path = write_temp_profile("base: h100\nname: x\n", "derived_bad_base");
    const std::string m = error_of(path);
    CHECK_MESSAGE(contains(m, path + ":1: key 'base': unknown hardware 'h100'"), m);
    CHECK_MESSAGE(contains(m, "h100-80gb"), m);
    CHECK_MESSAGE(contains(error_of(write_temp_profile("base: nowhere.yaml\nname: x\n", "derived_no_file")),
                           "no such file: " + dir + "/nowhere.yaml"),
                  "a missing base path");
  }
  SUBCASE("a cycle of bases is refused, naming the files") {
    const std::string a = write_temp_profile("base: cycle_b.yaml\nname: a\n", "cycle_a");
    const std::string b = write_temp_profile("base: cycle_a.yaml\nname: b\n", "cycle_b");
    const std::string m = error_of(a);
    CHECK_MESSAGE(contains(m, "the bases form a cycle"), m);
    CHECK_MESSAGE(contains(m, a), m);
    CHECK_MESSAGE(contains(m, b), m);
    const std::string self = write_temp_profile("base: cycle_self.yaml\nname: self\n", "cycle_self");
    CHECK_MESSAGE(contains(error_of(self), "cycle: " + self + " -> " + self), error_of(self));
  }
  SUBCASE("from text (the fuzzer), a base is a shipped name only") {
    const HardwareProfile hw = parse_hardware_text("base: p4d-a100-40gb\nname: t\n", "text.yaml", kRoot);
    CHECK(hw.nics_per_node == 4);
    CHECK(hw.device_memory.value == doctest::Approx(40 * kGiB));
    try {
      parse_hardware_text("base: /etc/hosts.yaml\nname: t\n", "text.yaml", kRoot);
      FAIL("a base path was followed");
    } catch (const InputError& e) {
      CHECK(contains(e.what(), "text.yaml:1: key 'base': only a shipped profile's name"));
    }
  }
}

TEST_CASE("the network: fabric, NICs per node and their bandwidth, as the collective model uses them") {
  const HardwareProfile dgx = load_hardware("h100-80gb", kRoot);
  const HardwareProfile p4d = load_hardware("p4d-a100-40gb", kRoot);
  const HardwareProfile p5 = load_hardware("p5-h100-80gb", kRoot);
  const HardwareProfile roce = load_hardware("meta-roce-h100-80gb", kRoot);
  CHECK(network_summary(dgx) == "8 x 400 Gb/s InfiniBand per node (400 Gb/s per GPU)");  // DGX H100
  CHECK(network_summary(p4d) == "4 x 100 Gb/s EFA per node (50 Gb/s per GPU)");          // AWS p4d.24xlarge
  CHECK(network_summary(p5) == "32 x 100 Gb/s EFA per node (400 Gb/s per GPU)");         // AWS p5.48xlarge
  CHECK(network_summary(roce) == "8 x 400 Gb/s RoCE per node (400 Gb/s per GPU)");
  CHECK(network_summary(load_hardware("l40s-48gb", kRoot)) ==
        "4 x 400 Gb/s per node (200 Gb/s per GPU), fabric not stated");
  // One 400 Gb/s NIC per node, shared by its 8 GPUs.
  const HardwareProfile shared = load_hardware(
      write_temp_profile("base: h100-80gb\nname: one-nic\nnode:\n  nics_per_node: 1\n  inter_node: {fabric: roce}\n",
                         "one_nic"),
      kRoot);
  CHECK(network_summary(shared) == "1 x 400 Gb/s RoCE per node (50 Gb/s per GPU)");
  // NCCL prices RoCE as InfiniBand: the RoCE cluster's collectives cost what the DGX's do.
  const CommGroup world = make_group(dgx, 32, 8);
  CHECK(collective_time(roce, CollectiveKind::AllGather, Bytes(kGiB), world) ==
        collective_time(dgx, CollectiveKind::AllGather, Bytes(kGiB), world));
  // EFA's hop is NCCL's 14 us plus twice the plugin's 75 us (hwprofiles/p4d-a100-40gb.yaml).
  CHECK(p4d.inter_node.latency.value == doctest::Approx(164 * kMicro));
  // p4de.24xlarge: p4d's host and network around the DGX A100 640GB's GPUs (hwprofiles/p4de-a100-80gb.yaml).
  const HardwareProfile p4de = load_hardware("p4de-a100-80gb", kRoot);
  const HardwareProfile dgx_a100_80 = load_hardware("a100-80gb", kRoot);
  CHECK(network_summary(p4de) == network_summary(p4d));
  CHECK(p4de.inter_node.latency == p4d.inter_node.latency);
  CHECK(p4de.usable_device_memory == dgx_a100_80.usable_device_memory);
  CHECK(p4de.memory_bandwidth == dgx_a100_80.memory_bandwidth);
  CHECK(p4de.host_memory == p4d.host_memory);
  CHECK(p4de.cpu_cores == p4d.cpu_cores);

  SUBCASE("halving the NICs doubles the inter-node transfer of a large all-gather") {
    const std::string half_path =
        write_temp_profile("base: p4d-a100-40gb\nname: p4d-half\nnode:\n  nics_per_node: 2\n", "p4d_half");
    const HardwareProfile half = load_hardware(half_path, kRoot);
    for (int nodes : {2, 4, 16}) {
      for (int per_node : {1, 8}) {
        CAPTURE(nodes);
        CAPTURE(per_node);
        const CommGroup g = make_group(p4d, nodes * per_node, per_node);
        const Bytes buffer(8 * kGiB);
        const CollectiveCost full = ring_cost(p4d, CollectiveKind::AllGather, buffer, g);
        const CollectiveCost halved = ring_cost(half, CollectiveKind::AllGather, buffer, g);
        CHECK(halved.transfer.value == doctest::Approx(2 * full.transfer.value));
        CHECK(halved.latency == full.latency);  // the NICs' count changes bandwidth, not the hops
      }
    }
    // 4 x 100 Gb/s EFA against a DGX A100's 8 x 200 Gb/s: a quarter of the bandwidth per GPU, 4x the transfer.
    const HardwareProfile dgx_a100 = load_hardware("a100-40gb", kRoot);
    const CommGroup g = make_group(p4d, 32, 8);
    CHECK(ring_cost(p4d, CollectiveKind::AllGather, Bytes(8 * kGiB), g).transfer.value ==
          doctest::Approx(4 * ring_cost(dgx_a100, CollectiveKind::AllGather, Bytes(8 * kGiB), g).transfer.value));
    // 32 x 100 Gb/s is a DGX H100's 8 x 400 Gb/s per node: the same transfer, a longer EFA hop (the p5 profile's
    // measured EFA factor by node count, bus_efficiency_by_nodes, set aside here).
    HardwareProfile p5_nics = p5;
    p5_nics.inter_node.bus_efficiency_by_nodes = EfficiencyCurve{};
    const CollectiveCost on_p5 = ring_cost(p5_nics, CollectiveKind::AllGather, Bytes(8 * kGiB), world);
    const CollectiveCost on_dgx = ring_cost(dgx, CollectiveKind::AllGather, Bytes(8 * kGiB), world);
    CHECK(on_p5.transfer.value == doctest::Approx(on_dgx.transfer.value));
    CHECK(on_p5.latency > on_dgx.latency);
    // With the factor the p5 transfer is slower beyond two nodes.
    if (world.nodes() > 2)
      CHECK(ring_cost(p5, CollectiveKind::AllGather, Bytes(8 * kGiB), world).transfer.value > on_p5.transfer.value);
  }
  SUBCASE("the fabric is one of three, and only between nodes") {
    CHECK(contains(error_of(write_temp_profile("base: h100-80gb\nname: x\nnode:\n  inter_node: {fabric: omnipath}\n",
                                               "fabric_bad")),
                   "'omnipath' is not one of: infiniband, roce, efa"));
    CHECK(contains(
        error_of(write_temp_profile("base: h100-80gb\nname: x\nnode:\n  intra_node: {fabric: roce}\n", "fabric_intra")),
        "unknown key 'node.intra_node.fabric'"));
    CHECK(std::string(to_string(load_hardware("l40s-48gb", kRoot).fabric)) == "not stated");
  }
}

TEST_CASE("clocks and power: a sustained clock scales the FLOP rates, a power limit alone warns") {
  const HardwareProfile h100 = load_hardware("h100-80gb", kRoot);
  const HardwareProfile a100 = load_hardware("a100-80gb", kRoot);
  // The datasheet peaks are quoted at these clocks (whitepapers; hwprofiles/*.yaml).
  CHECK(a100.boost_clock.value == doctest::Approx(1410e6));
  CHECK(h100.boost_clock.value == doctest::Approx(1830e6));
  CHECK(h100.boost_clock_of(DType::Fp32).value == doctest::Approx(1980e6));
  CHECK(h100.boost_clock_of(DType::Bf16).value == doctest::Approx(1830e6));
  CHECK(h100.clock_scale(DType::Bf16) == 1.0);
  CHECK(clock_summary(h100) == "");

  SUBCASE("a sustained clock below the boost lowers tensor-core and fp32 peaks, not memory bandwidth") {
    const HardwareProfile hw = load_hardware(
        write_temp_profile("base: h100-80gb\nname: capped\ndevice:\n  sustained_clock: \"1464 MHz\"\n", "clock_capped"),
        kRoot);
    CHECK(hw.clock_scale(DType::Bf16) == doctest::Approx(0.8));  // 1464 / 1830
    CHECK(hw.peak_flops(DType::Bf16).value == doctest::Approx(989.5 * kTera * 0.8));
    CHECK(hw.peak_flops(DType::Fp16).value == doctest::Approx(989.5 * kTera * 0.8));
    CHECK(hw.peak_flops(DType::Fp32).value == doctest::Approx(67 * kTera * 1464 / 1980));
    CHECK(hw.rated_peak_flops(DType::Bf16) == h100.rated_peak_flops(DType::Bf16));
    CHECK(hw.memory_bandwidth == h100.memory_bandwidth);
    CHECK(hardware_warnings(hw).empty());
    CHECK(clock_summary(hw) == "sustained 1464 MHz of 1830 MHz boost (0.8 x tensor-core peak)");
    // Every compute cost sees it: a large, compute-bound GEMM takes 1 / 0.8 as long.
    CHECK(matmul_time(hw, 8192, 8192, 8192, DType::Bf16).value ==
          doctest::Approx(matmul_time(h100, 8192, 8192, 8192, DType::Bf16).value / 0.8));
  }
  SUBCASE("a clock above the tensor-core boost is not credited") {
    const HardwareProfile hw = load_hardware(
        write_temp_profile("base: h100-80gb\nname: fast\ndevice:\n  sustained_clock: \"1.9 GHz\"\n", "clock_fast"),
        kRoot);
    CHECK(hw.clock_scale(DType::Bf16) == 1.0);
    CHECK(hw.clock_scale(DType::Fp32) == doctest::Approx(1900.0 / 1980));
  }
  SUBCASE("clocks are refused when they cannot hold") {
    CHECK(contains(error_of(write_temp_profile("base: h100-80gb\nname: x\ndevice:\n  sustained_clock: \"2100 MHz\"\n",
                                               "clock_above")),
                   "exceeds the boost clock (1980 MHz)"));
    // l40s-48gb states no boost clock: a sustained clock needs one given with it.
    const std::string m = error_of(
        write_temp_profile("base: l40s-48gb\nname: x\ndevice:\n  sustained_clock: \"2 GHz\"\n", "clock_no_boost"));
    CHECK_MESSAGE(contains(m, "clock_no_boost.yaml:4: key 'device.sustained_clock': needs device.boost_clock"), m);
    CHECK(load_hardware(write_temp_profile("base: l40s-48gb\nname: x\ndevice:\n  boost_clock: \"2520 MHz\"\n"
                                           "  sustained_clock: \"2016 MHz\"\n",
                                           "clock_given_boost"),
                        kRoot)
              .clock_scale(DType::Bf16) == doctest::Approx(0.8));
    CHECK(contains(error_of(write_temp_profile("base: h100-80gb\nname: x\ndevice:\n  sustained_clock: \"1464\"\n",
                                               "clock_no_unit")),
                   "key 'device.sustained_clock': expected a value with a unit such as '1830 MHz'"));
    CHECK(contains(
        error_of(write_temp_profile("base: h100-80gb\nname: x\ndevice:\n  boost_clock: \"0 MHz\"\n", "clock_zero")),
        "key 'device.boost_clock': must be positive"));
  }
  SUBCASE("a power limit below the TDP without a sustained clock warns; it is never silently ignored") {
    const std::string path =
        write_temp_profile("base: h100-80gb\nname: pl\ndevice:\n  power_limit: \"500 W\"\n", "power_limited");
    const HardwareProfile hw = load_hardware(path, kRoot);
    CHECK(hw.power_limit.value == doctest::Approx(500));
    CHECK(hw.tdp.value == doctest::Approx(700));
    CHECK(hw.peak_flops(DType::Bf16) == h100.peak_flops(DType::Bf16));  // not converted to a clock
    const auto warnings = hardware_warnings(hw);
    REQUIRE(warnings.size() == 1);
    CHECK(contains(warnings[0], path));
    CHECK(contains(warnings[0], "device.power_limit (500 W) is below device.tdp (700 W)"));
    CHECK(contains(warnings[0], "device.sustained_clock"));
    CHECK(contains(warnings[0], "nvidia-smi --query-gpu=clocks.sm"));
    CHECK(clock_summary(hw) == "power limit 500 W of 700 W");
    // With the clock measured under that limit, the limit is described and the clock prices it.
    const HardwareProfile measured = load_hardware(
        write_temp_profile("base: power_limited.yaml\nname: pl-measured\ndevice:\n  sustained_clock: \"1464 MHz\"\n",
                           "power_measured"),
        kRoot);
    CHECK(hardware_warnings(measured).empty());
    CHECK(measured.clock_scale(DType::Bf16) == doctest::Approx(0.8));
    CHECK(contains(
        error_of(write_temp_profile("base: h100-80gb\nname: x\ndevice:\n  power_limit: \"0.8 kW\"\n", "power_above")),
        "device.power_limit (800 W) exceeds device.tdp (700 W)"));
    CHECK(contains(
        error_of(write_temp_profile("base: cpu\nname: x\ndevice:\n  power_limit: \"100 W\"\n", "power_no_tdp")),
        "key 'device.power_limit': needs device.tdp"));
  }
}

TEST_CASE("SMs and GEMM tile shapes: optional, together, strict") {
  const HardwareProfile hw = load_hardware(write_temp_profile("base: h100-80gb\nname: tiles\ndevice:\n  sm_count: 132\n"
                                                              "  matmul_tiles: [[256, 128], [128, 128]]\n",
                                                              "tiles_ok"),
                                           kRoot);
  CHECK(hw.sm_count == 132);
  REQUIRE(hw.matmul_tiles.size() == 2);
  CHECK(hw.matmul_tiles[0] == std::pair<int64_t, int64_t>{256, 128});
  CHECK(hw.matmul_tiles[1] == std::pair<int64_t, int64_t>{128, 128});
  // A derived profile replaces the list whole.
  const HardwareProfile one = load_hardware(
      write_temp_profile("base: tiles_ok.yaml\nname: one-tile\ndevice:\n  matmul_tiles: [[64, 64]]\n", "tiles_one"),
      kRoot);
  CHECK(one.sm_count == 132);
  REQUIRE(one.matmul_tiles.size() == 1);
  CHECK(one.matmul_tiles[0].first == 64);
  CHECK(contains(error_of(write_temp_profile("base: cpu\nname: x\ndevice:\n  sm_count: 132\n", "tiles_alone")),
                 "key 'device.sm_count': device.sm_count and device.matmul_tiles go together"));
  CHECK(contains(error_of(write_temp_profile(
                     "base: h100-80gb\nname: x\ndevice:\n  sm_count: 132\n  matmul_tiles: [[256, 0]]\n", "tiles_zero")),
                 "key 'device.matmul_tiles': item 0: expected [rows, columns]"));
  CHECK(contains(error_of(write_temp_profile(
                     "base: h100-80gb\nname: x\ndevice:\n  sm_count: 132\n  matmul_tiles: [256, 128]\n", "tiles_flat")),
                 "key 'device.matmul_tiles': item 0"));
}

TEST_CASE("eager elementwise kernels: a fraction of the memory's bandwidth, kept by a derived profile's memory") {
  const HardwareProfile a100 = load_hardware("a100-80gb", kRoot);
  // hwprofiles/a100-80gb.yaml: 0.54 of 2039 GB/s in bf16 and fp16 (Liger-Kernel's eager norm and rotary); fp32
  // (the optimizer's master side) at the memory's bandwidth.
  CHECK(a100.elementwise_bandwidth(DType::Bf16).value == doctest::Approx(0.54 * 2039e9));
  CHECK(a100.elementwise_bandwidth(DType::Fp16).value == doctest::Approx(0.54 * 2039e9));
  CHECK(a100.elementwise_bandwidth(DType::Fp32).value == doctest::Approx(2039e9));
  // grand-teton-h100-96gb: the H100's fraction of its own 2.4 TB/s.
  CHECK(load_hardware("grand-teton-h100-96gb", kRoot).elementwise_bandwidth(DType::Bf16).value ==
        doctest::Approx(0.54 * 2400e9));
  SUBCASE("a derived profile's rate replaces its base's fraction for that dtype, and the other way round") {
    const HardwareProfile rate = load_hardware(
        write_temp_profile("base: a100-80gb\nname: r\ndevice:\n  elementwise_bandwidth: {bf16: \"1 TB/s\"}\n",
                           "ew_rate"),
        kRoot);
    CHECK(rate.elementwise_bandwidth(DType::Bf16).value == doctest::Approx(1e12));
    CHECK(rate.elementwise_bandwidth(DType::Fp16).value == doctest::Approx(0.54 * 2039e9));
    const HardwareProfile cpu_frac = load_hardware(
        write_temp_profile("base: cpu\nname: f\ndevice:\n  elementwise_efficiency: {fp32: 0.5}\n", "ew_frac"), kRoot);
    CHECK(cpu_frac.elementwise_bandwidth(DType::Fp32).value == doctest::Approx(0.5 * cpu_frac.memory_bandwidth.value));
  }
  SUBCASE("one of the two per dtype and file; a fraction within (0, 1]") {
    CHECK(contains(error_of(write_temp_profile("base: a100-80gb\nname: x\ndevice:\n  elementwise_bandwidth: {bf16: "
                                               "\"1 TB/s\"}\n  elementwise_efficiency: {bf16: 0.5}\n",
                                               "ew_both")),
                   "key 'device.elementwise_efficiency.bf16': is also given as device.elementwise_bandwidth"));
    CHECK(contains(error_of(write_temp_profile(
                       "base: a100-80gb\nname: x\ndevice:\n  elementwise_efficiency: {bf16: 1.5}\n", "ew_range")),
                   "key 'device.elementwise_efficiency.bf16': must be within (0, 1]"));
  }
}

// device.copy_efficiency: the fraction of memory_bandwidth a contiguous device-to-device copy reaches (read and write
// counted); absent, copies take the dtype's elementwise rate. The A100 and H100 profiles set it from cuda-samples'
// p2pBandwidthLatencyTest intra-GPU diagonal (docs/hardware.md "Elementwise kernels").
TEST_CASE("device.copy_efficiency: copies at a fraction of memory_bandwidth, else the elementwise rate") {
  const HardwareProfile h100 = load_hardware("h100-80gb", kRoot);
  CHECK(h100.copy_efficiency == doctest::Approx(0.75));
  CHECK(h100.copy_bandwidth(DType::Bf16).value == doctest::Approx(0.75 * 3350e9));
  CHECK(h100.copy_bandwidth(DType::Fp32).value == doctest::Approx(0.75 * 3350e9));
  CHECK(load_hardware("a100-80gb", kRoot).copy_efficiency == doctest::Approx(0.78));
  const HardwareProfile cpu = load_hardware("cpu", kRoot);
  CHECK(cpu.copy_efficiency == 0.0);
  CHECK(cpu.copy_bandwidth(DType::Bf16).value == doctest::Approx(cpu.elementwise_bandwidth(DType::Bf16).value));
  const HardwareProfile own =
      load_hardware(write_temp_profile("base: cpu\nname: c\ndevice:\n  copy_efficiency: 0.5\n", "copy_ok"), kRoot);
  CHECK(own.copy_bandwidth(DType::Bf16).value == doctest::Approx(0.5 * own.memory_bandwidth.value));
  CHECK(contains(
      error_of(write_temp_profile("base: h100-80gb\nname: x\ndevice:\n  copy_efficiency: 1.5\n", "copy_range")),
      "key 'device.copy_efficiency': must be within (0, 1]"));
}

TEST_CASE("the attention curves' reference call: shipped on the GPU profiles read from FlashAttention's benchmarks") {
  for (const char* name : {"a100-80gb", "a100-40gb", "a800-80gb", "h100-80gb", "h200-141gb", "l40s-48gb",
                           "p5-h100-80gb", "grand-teton-h100-96gb"}) {
    const HardwareProfile hw = load_hardware(name, kRoot);
    CAPTURE(name);
    CHECK(hw.attention_reference_tokens == 16384);
    CHECK(hw.attention_reference_heads == 16);
  }
  CHECK(load_hardware("cpu", kRoot).attention_reference_tokens == 0);  // curves by FLOPs per call as calibrated
  const HardwareProfile own = load_hardware(
      write_temp_profile(
          "base: h100-80gb\nname: ref\ndevice:\n  attention_reference: {tokens_per_call: 8192, heads: 32}\n", "ref_ok"),
      kRoot);
  CHECK(own.attention_reference_tokens == 8192);
  CHECK(own.attention_reference_heads == 32);
  CHECK(contains(
      error_of(write_temp_profile(
          "base: h100-80gb\nname: x\ndevice:\n  attention_reference: {tokens_per_call: 0, heads: 16}\n", "ref_zero")),
      "tokens_per_call"));
  CHECK(contains(error_of(write_temp_profile("base: h100-80gb\nname: x\ndevice:\n  attention_reference: "
                                             "{tokens_per_call: 16384, heads: 16, seq: 4096}\n",
                                             "ref_unknown")),
                 "seq"));
  CHECK(
      contains(error_of(write_temp_profile(
                   "base: h100-80gb\nname: x\ndevice:\n  attention_reference: {tokens_per_call: 16384}\n", "ref_half")),
               "heads"));
}

TEST_CASE("the FP8 peak and the float8 cast rate: optional, strict, inherited by derived profiles") {
  // Datasheet dense FP8 peaks (half the sparsity figures) and torchao's measured cast rate on Hopper.
  const HardwareProfile h100 = load_hardware("h100-80gb", kRoot), h200 = load_hardware("h200-141gb", kRoot);
  CHECK(h100.peak_flops_fp8.value == doctest::Approx(1979e12));
  CHECK(h200.peak_flops_fp8.value == doctest::Approx(1979e12));
  CHECK(h100.float8_cast_efficiency == doctest::Approx(0.92));
  // FP8 over bf16 GEMM efficiency: stas00's MAMF table (H100 70.9% / 80.3%, H200 73.4% / 80.3%); absent on the
  // L40S (no published FP8 MAMF): its FP8 GEMMs take the bf16 curve.
  CHECK(h100.float8_matmul_ratio == doctest::Approx(0.883));
  CHECK(h200.float8_matmul_ratio == doctest::Approx(0.915));
  CHECK(load_hardware("l40s-48gb", kRoot).float8_matmul_efficiency_ratio() == 1.0);
  CHECK(load_hardware("l40s-48gb", kRoot).peak_flops_fp8.value == doctest::Approx(733e12));
  // A derived profile keeps its base's (grand-teton-h100-96gb on h100-80gb), at its own clock.
  const HardwareProfile gt = load_hardware("grand-teton-h100-96gb", kRoot);
  CHECK(gt.peak_flops_fp8.value == doctest::Approx(1979e12));
  CHECK(gt.float8_peak_flops().value == doctest::Approx(1979e12 * gt.clock_scale(DType::Bf16)));
  // An A100 has none (no FP8 tensor cores).
  CHECK(load_hardware("a100-80gb", kRoot).peak_flops_fp8.value == 0);
  const std::string base = read_text(kRoot + "/hwprofiles/a100-80gb.yaml");
  CHECK(contains(load_error(replace_once(base, "  copy_efficiency: 0.78",
                                         "  copy_efficiency: 0.78\n  float8_cast_efficiency: 1.5"),
                            "f8_cast"),
                 "float8_cast_efficiency"));
  CHECK(contains(
      load_error(replace_once(base, "  copy_efficiency: 0.78", "  copy_efficiency: 0.78\n  float8_matmul_ratio: 0"),
                 "f8_ratio"),
      "key 'device.float8_matmul_ratio': must be within (0, 1.5]"));
  CHECK(contains(
      load_error(replace_once(base, "    fp16: \"312 TFLOP/s\"", "    fp16: \"312 TFLOP/s\"\n    fp8: \"fast\""),
                 "f8_peak"),
      "fp8"));
}
