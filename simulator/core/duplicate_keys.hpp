// Duplicate keys in input files are refused, not resolved (issue M11, "every bad input refused before training
// starts"). Both parsers we use accept them silently, and each keeps a different one:
//  - yaml-cpp 0.7 keeps every pair of a mapping (src/node_data.cpp insert_map_pair appends) and node[key] returns
//    the first match (node_data::get scans from the front): the first value wins, the later ones are ignored;
//  - nlohmann/json 3.11 assigns each member through object->operator[](key) (detail/input/json_sax.hpp,
//    json_sax_dom_parser::key): the last value wins.
// Either way a file that says two things gets one of them quietly, so both readers here throw InputError instead.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>

namespace fsdp {

// The dotted path of `key` under `parent` ("strategy" + "micro_batch" -> "strategy.micro_batch"; "" + "a" -> "a").
std::string join_key_path(const std::string& parent, const std::string& key);

// Walks `root` (maps, sequences and maps inside sequences) and throws InputError
// "<source>:<line>: duplicate key '<dotted.path>' (first at line <n>)" for the first mapping that names a key twice.
// Scalar keys compare by their text, as ConfigMap looks them up (a non-scalar key is left to the reader). A node
// reached again through a YAML alias is walked once.
void reject_duplicate_yaml_keys(const YAML::Node& root, const std::string& source);

// nlohmann::json::parse(text), but a member name repeated within one object is an InputError
// "<source>:<line>: duplicate key '<dotted.path>' (first at line <n>)". Syntax errors still throw
// nlohmann::json::parse_error for the caller to word.
nlohmann::json parse_json_unique_keys(const std::string& text, const std::string& source);

}  // namespace fsdp
