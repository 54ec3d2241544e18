// Hardware profiles: every shipped profile loads, holds its datasheet numbers, and the loader
// refuses bad input with file:line:key.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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
  for (const char* required : {"a100-80gb", "a100-40gb", "a800-80gb", "h100-80gb", "h200-141gb", "l40s-48gb", "cpu"})
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
  // cpu.yaml without its measured in-step factors: the optional keys are added back below.
  std::string cpu;
  {
    std::istringstream in(read_text(kRoot + "/hwprofiles/cpu.yaml"));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("  in_step_factor", 0) != 0) cpu += line + "\n";
  }
  HardwareProfile plain = load_hardware(write_temp_profile(cpu, "cpu_plain"), kRoot);
  CHECK(plain.matmul_efficiency_bf16.empty());
  CHECK(&plain.matmul_curve(DType::Bf16) == &plain.matmul_efficiency);
  CHECK(&plain.attention_backward_curve(DType::Fp16) == &plain.attention_backward_efficiency);
  CHECK(plain.device_cores == 2);  // Eigen's rates on both cores
  HardwareProfile whole =
      load_hardware(write_temp_profile(replace_once(cpu, "  cores: 2\n", ""), "cpu_nocores"), kRoot);
  CHECK(whole.device_cores == 0);  // absent: the whole node (cpu_compute_slowdown)
  const std::string extra =
      "  matmul_efficiency_bf16:\n    - {gemm_flops: 1.0e6, efficiency: 0.2}\n    - {gemm_flops: 1.0e8, efficiency: "
      "0.9}\n"
      "  attention_forward_efficiency_fp16:\n    - {attention_flops: 1.0e6, efficiency: 0.3}\n";
  const std::string with =
      replace_once(replace_once(cpu, "  cores: 2\n", "  cores: 1\n"), "node:\n", extra + "node:\n");
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
  check_refused(calibrated, "in_step_factor: 1.25", "in_step_factor: 10.5", "cpu_in_step",
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
  check_refused(calibrated, "in_step_factor_shared_cores: 1.75", "in_step_factor_shared_cores: 11",
                "cpu_in_step_shared", {"collectives.in_step_factor_shared_cores", "[0, 10]"});
  check_refused(calibrated, "in_step_factor_fp32: 2.5", "in_step_factor_fp32: -1", "cpu_in_step_fp32",
                {"collectives.in_step_factor_fp32", "[0, 10]"});
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
