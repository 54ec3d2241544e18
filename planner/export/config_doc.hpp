// The files a target writes, as flat documents (dotted key -> value) rendered to and read back from their formats:
// TOML (torchtitan's job config), Python assignments (torchtitan's Python config), JSON (DeepSpeed, Transformers'
// TrainingArguments), YAML (accelerate, torchtune) and a command line (ms-swift). The same key table (target_spec.hpp)
// checks what is written and types what is read.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "export/target_spec.hpp"

namespace fsdp {

using FlatDoc = std::vector<std::pair<std::string, nlohmann::json>>;

struct WrittenFile {
  std::string name;
  FlatDoc keys;                     // for a keyed format (the file's key table checks them)
  std::vector<std::string> header;  // comment lines (or, for python and args, the lines before the keys)
  std::string raw_text;             // for files without keys (hostfile, launch.sh): written as is
  bool executable = false;
};

// Every key of `doc` in the file's key table, of its type and among its allowed values; the first that is not is
// an InputError naming the key table, the file and the key.
void check_against_table(const FlatDoc& doc, const FileTable& table, const std::string& spec_path);

std::string render_file(const WrittenFile& f, const FileTable& table);
// Reads a rendered file back, typing each value by the key table; InputError naming the file and line.
FlatDoc parse_file(const std::string& text, const FileTable& table, const std::string& source);

// The value of `key` (InputError naming the file and key when absent).
const nlohmann::json& doc_get(const FlatDoc& doc, const std::string& key, const std::string& source);
bool doc_has(const FlatDoc& doc, const std::string& key);

}  // namespace fsdp
