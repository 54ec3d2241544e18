// Shared helpers of the input tests (config.json readers, strict parsing): the Hugging Face fixtures under
// tests/data/hf/ and the message of an expected InputError.
#pragma once

#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/errors.hpp"
#include "model/model_loader.hpp"

namespace fsdp::test {

inline std::string fixture_path(const std::string& stem) {
  return std::string(FSDP_TEST_DATA) + "/hf/" + stem + ".json";
}

inline std::string read_fixture(const std::string& stem) {
  std::ifstream in(fixture_path(stem));
  REQUIRE_MESSAGE(in.good(), "cannot open " << fixture_path(stem));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The message of the InputError that f throws; fails the test if it throws nothing or something else.
inline std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected an InputError, got another exception: " << e.what());
    return "";
  }
  FAIL("expected an InputError, nothing was thrown");
  return "";
}

// A fixture read as a config.json (model/model_loader.hpp read_hf_config), named after its file.
inline LoadedModel read_hf_fixture(const std::string& stem) {
  return read_hf_config(read_fixture(stem), stem + ".json");
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every warning of a loaded model, one a line.
inline std::string all_warnings(const LoadedModel& m) {
  std::string s;
  for (const auto& w : m.warnings) s += w + "\n";
  return s;
}

}  // namespace fsdp::test
