// A key given twice is refused, in every input file (issue M11): yaml-cpp would keep the first value and
// nlohmann/json the last (core/duplicate_keys.hpp), so the message names the file, the line, the full key
// path and the line of the first occurrence.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/config_map.hpp"
#include "core/errors.hpp"
#include "input_fixtures.hpp"
#include "model/model_loader.hpp"

namespace {

using fsdp::test::input_error;

using fsdp::InputError;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path =
      (std::filesystem::temp_directory_path() / ("fsdp_dup_" + std::to_string(::getpid()) + "_" + name)).string();
  std::ofstream(path) << text;
  return path;
}

// The 1-based line of the first line of `text` that starts with `prefix`; fails the test when there is none.
int line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.rfind(prefix, 0) == 0) return n;
  FAIL("no line starts with '" << prefix << "'");
  return 0;
}

int line_count(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

std::string dup_message(const std::string& path, int line, const std::string& key, int first) {
  return path + ":" + std::to_string(line) + ": duplicate key '" + key + "' (first at line " + std::to_string(first) +
         ")";
}

std::string tiny_yaml() { return slurp(std::string(FSDP_SOURCE_ROOT) + "/configs/models/tiny.yaml"); }

}  // namespace

TEST_CASE("duplicate keys: a top-level key given twice in a model YAML") {
  const std::string base = tiny_yaml();
  const std::string path = write_tmp("top.yaml", base + "hidden_size: 512\n");
  std::string msg = input_error([&] { fsdp::load_model(path, FSDP_SOURCE_ROOT); });
  CHECK(msg == dup_message(path, line_count(base) + 1, "hidden_size", line_starting(base, "hidden_size:")));
}

TEST_CASE("duplicate keys: a nested key given twice carries its full path") {
  const std::string base = tiny_yaml() + "moe:\n  num_experts: 8\n  experts_per_token: 2\n";
  const std::string path = write_tmp("nested.yaml", base + "  num_experts: 4\n  shared_experts: 0\n");
  std::string msg = input_error([&] { fsdp::load_model(path, FSDP_SOURCE_ROOT); });
  CHECK(msg == dup_message(path, line_count(base) + 1, "moe.num_experts", line_count(base) - 1));

  // The same in a flow mapping, and a top-level key repeated after a nested block.
  msg = input_error([] { fsdp::ConfigMap::load_string("a:\n  b: {c: 1, d: 2, c: 3}\n", "flow.yaml"); });
  CHECK(msg == dup_message("flow.yaml", 2, "a.b.c", 2));
  msg = input_error([] { fsdp::ConfigMap::load_string("a:\n  b: 1\nc: 2\na: 3\n", "after.yaml"); });
  CHECK(msg == dup_message("after.yaml", 4, "a", 1));
}

TEST_CASE("duplicate keys: a key given twice in a map inside a sequence") {
  // Shaped like a hardware profile's efficiency curve (hwprofiles/*.yaml).
  const std::string text =
      "device:\n"
      "  matmul_efficiency:\n"
      "    - {gemm_flops: 1.0e9, efficiency: 0.5}\n"
      "    - gemm_flops: 1.0e11\n"
      "      efficiency: 0.8\n"
      "      gemm_flops: 2.0e11\n";
  const std::string path = write_tmp("curve.yaml", text);
  std::string msg = input_error([&] { fsdp::ConfigMap::load_file(path); });
  CHECK(msg == dup_message(path, 6, "device.matmul_efficiency[1].gemm_flops", 4));

  msg = input_error([] { fsdp::ConfigMap::load_string("a:\n  - [x, {k: 1}]\n  - [{k: 1, k: 2}]\n", "nested.yaml"); });
  CHECK(msg == dup_message("nested.yaml", 3, "a[1][0].k", 3));
}

TEST_CASE("duplicate keys: quoting does not make a key different; aliases are walked once") {
  std::string msg = input_error([] { fsdp::ConfigMap::load_string("a: 1\n'a': 2\n", "quoted.yaml"); });
  CHECK(msg == dup_message("quoted.yaml", 2, "a", 1));
  // A duplicate inside an anchored map is reported where it is written, not where it is aliased.
  msg = input_error([] { fsdp::ConfigMap::load_string("x: &m {k: 1, k: 2}\ny: [*m, *m]\n", "alias.yaml"); });
  CHECK(msg == dup_message("alias.yaml", 1, "x.k", 1));
  // A collection that contains an alias to itself (a cycle in yaml-cpp's node graph) ends the walk.
  CHECK_NOTHROW(fsdp::ConfigMap::load_string("x: &s [*s]\ny: &m {k: *m}\n", "cycle.yaml"));
  // The same key in two different maps is fine.
  CHECK_NOTHROW(fsdp::ConfigMap::load_string("a: {k: 1}\nb: {k: 1}\nc: [{k: 1}, {k: 2}]\n", "ok.yaml"));
}

TEST_CASE("duplicate keys: a config.json member given twice") {
  const std::string base = slurp(std::string(FSDP_TEST_DATA) + "/hf/llama3-8b.json");
  const int first = line_starting(base, "  \"hidden_size\"");
  // Repeat hidden_size right after the opening brace: line 2 of the new text; the original moves one down.
  std::string text = base;
  text.insert(text.find('{') + 1, "\n  \"hidden_size\": 2048,");
  const std::string path = write_tmp("config.json", text);
  std::string msg = input_error([&] { fsdp::load_model(path, FSDP_SOURCE_ROOT); });
  CHECK(msg == dup_message(path, first + 1, "hidden_size", 2));

  // Nested objects and objects inside arrays carry their path.
  msg = input_error(
      [] { fsdp::parse_hf_config("{\n  \"rope_scaling\": {\"factor\": 8.0,\n    \"factor\": 4.0}\n}", "rope.json"); });
  CHECK(msg == dup_message("rope.json", 3, "rope_scaling.factor", 2));
  msg = input_error([] { fsdp::parse_hf_config("{\"x\": [1, {\"k\": 1}, {\"k\": 1, \"k\": 2}]}", "list.json"); });
  CHECK(msg == dup_message("list.json", 1, "x[2].k", 1));
}

TEST_CASE("duplicate keys: no shipped YAML file has one") {
  const std::filesystem::path root(FSDP_SOURCE_ROOT);
  int files = 0;
  for (const char* dir : {"configs", "hwprofiles", "tests/data", "fuzz/seeds", "fuzz/regressions"}) {
    if (!std::filesystem::exists(root / dir)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root / dir)) {
      if (!e.is_regular_file() || e.path().extension() != ".yaml") continue;
      INFO(e.path().string());
      ++files;
      CHECK_NOTHROW(fsdp::ConfigMap::load_file(e.path().string()));
    }
  }
  CHECK(files > 20);
}
