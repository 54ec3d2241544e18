// Where a named configuration lives: configs/<kind>/NAME.yaml under the config root, or a path given as is.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace fsdp {

// The stems of the .yaml files in `dir`, sorted (empty when it does not exist).
std::vector<std::string> config_names(const std::filesystem::path& dir);

// `name_or_path` as a path when it has a '/' or ends in .yaml, else dir/NAME.yaml; an unknown name is an
// InputError "<flag>: unknown <what> 'NAME' (known: a, b, ...)".
std::string resolve_config(const std::string& name_or_path, const std::filesystem::path& dir, const std::string& flag,
                           const std::string& what);

}  // namespace fsdp
