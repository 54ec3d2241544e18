#include "runtime/backend_profile.hpp"

#include <filesystem>

#include "core/config_map.hpp"
#include "core/config_path.hpp"
#include "core/errors.hpp"

namespace fsdp {

BackendProfile load_backend(const std::string& name_or_path, const std::string& config_root) {
  const std::string path = resolve_config(name_or_path, std::filesystem::path(config_root) / "configs" / "backends",
                                          "backend", "communication backend");
  ConfigMap map = ConfigMap::load_file(path);
  BackendProfile b;
  b.source = path;
  b.name = map.get_string("name");
  ConfigMap c = map.get_map("collectives");
  b.low_precision_collectives = c.get_bool("low_precision");
  b.native_reduce_scatter = c.get_bool("native_reduce_scatter");
  b.gather_flat_buffer = c.get_bool("gather_flat_buffer");
  c.finish();
  b.overlaps_compute = map.get_bool("overlaps_compute");
  map.finish();
  return b;
}

}  // namespace fsdp
