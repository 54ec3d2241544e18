// Shared helpers of the input tests (config.json readers, strict parsing): the Hugging Face fixtures under
// tests/data/hf/, the message of an expected InputError, a zoo file's refusal after an edit, a graph's top modules.
#pragma once

#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"

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

// The InputError of configs/models/<zoo>.yaml with the first `from` replaced by `to`, read as a model map.
inline std::string zoo_edit_error(const std::string& zoo, const std::string& from, const std::string& to) {
  std::ifstream in(std::string(FSDP_SOURCE_ROOT) + "/configs/models/" + zoo + ".yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  REQUIRE(text.find(from) != std::string::npos);
  text.replace(text.find(from), from.size(), to);
  return input_error([&] {
    ConfigMap map = ConfigMap::load_string(text, "m.yaml");
    parse_model_map(map);
  });
}

// The root's child module of this name (embed_tokens, layers, vision_tower.layers, multi_modal_projector, ...).
inline ModuleId root_child(const ModuleGraph& g, const std::string& name) {
  for (auto c : g.children(g.root()))
    if (g.node(c).name == name) return c;
  FAIL("no " << name);
  return g.root();
}

}  // namespace fsdp::test
