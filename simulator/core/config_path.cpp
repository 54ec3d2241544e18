#include "core/config_path.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace fsdp {

std::vector<std::string> config_names(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string resolve_config(const std::string& name_or_path, const std::filesystem::path& dir, const std::string& flag,
                           const std::string& what) {
  if (name_or_path.find('/') != std::string::npos || name_or_path.find(".yaml") != std::string::npos)
    return name_or_path;
  const std::string path = (dir / (name_or_path + ".yaml")).string();
  // The non-throwing overload: a name the OS refuses (too long, say) is an unknown name, not a crash (found by
  // fuzz_hardware: a 300-byte `backend:` value).
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return path;
  std::string known;
  for (const auto& n : config_names(dir)) known += (known.empty() ? "" : ", ") + n;
  throw InputError(flag + ": unknown " + what + " '" + name_or_path + "' (known: " + known + ")");
}

}  // namespace fsdp
