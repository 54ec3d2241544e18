// Strict YAML reading (Calculon style): every key is required unless read with
// an explicit optional accessor, every key present must be consumed
// (finish() rejects unknown keys), and every error names file:line and the
// dotted key path. Values with units go through unit_parse.hpp. A key given twice in
// one mapping is refused when the text is loaded (duplicate_keys.hpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/units.hpp"

namespace fsdp {

class ConfigMap {
 public:
  // Parse errors in the text itself are reported as InputError with the line.
  static ConfigMap load_file(const std::string& path);
  static ConfigMap load_string(const std::string& text, const std::string& source_name);
  ConfigMap(YAML::Node node, std::string source, std::string key_path);

  bool has(const std::string& key) const;
  std::string get_string(const std::string& key);
  int64_t get_int(const std::string& key);
  int64_t get_positive_int(const std::string& key);
  double get_double(const std::string& key);
  double get_positive_double(const std::string& key);
  bool get_bool(const std::string& key);
  Bytes get_bytes(const std::string& key);
  BytesPerSecond get_bandwidth(const std::string& key);
  Seconds get_duration(const std::string& key);
  FlopsPerSecond get_flops_rate(const std::string& key);
  std::string get_enum(const std::string& key, const std::vector<std::string>& allowed);
  ConfigMap get_map(const std::string& key);
  std::vector<ConfigMap> get_list_of_maps(const std::string& key);
  std::vector<double> get_double_list(const std::string& key);
  std::vector<std::string> get_string_list(const std::string& key);
  // Keys of this map in file order (for maps keyed by name).
  std::vector<std::string> keys() const;
  // The raw node, marked consumed; for callers that parse a sub-tree themselves.
  YAML::Node take_raw(const std::string& key);

  // Throws InputError if the map holds a key nobody read.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  [[noreturn]] void fail_here(const std::string& message) const;
  const std::string& source() const { return source_; }
  std::string key_path(const std::string& key) const;
  const YAML::Node& node() const { return node_; }

 private:
  YAML::Node require(const std::string& key);
  std::string scalar(const std::string& key);
  int line_of(const std::string& key) const;

  YAML::Node node_;
  std::string source_;
  std::string path_;
  std::set<std::string> consumed_;
};

}  // namespace fsdp
