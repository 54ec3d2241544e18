// libFuzzer target: the readers of the files `--target` / `export` write (planner/export/config_doc.cpp: TOML,
// Python assignments, JSON, YAML, a command line) through parse_file with the real key tables of
// configs/targets. The first byte picks the key table, the rest is the file. Seeds: fuzz/seeds/fuzz_target_files/.
#include <vector>

#include "export/config_doc.hpp"
#include "export/target_spec.hpp"
#include "fuzz_common.hpp"

namespace {

const std::vector<fsdp::FileTable>& tables() {
  static const std::vector<fsdp::FileTable> all = [] {
    std::vector<fsdp::FileTable> out;
    for (const auto& t : fsdp::target_names(FSDP_SOURCE_ROOT))
      for (const auto& v : fsdp::target_versions(FSDP_SOURCE_ROOT, t))
        for (const auto& f : fsdp::load_target_spec(FSDP_SOURCE_ROOT, t, v).files) out.push_back(f);
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || tables().empty()) return 0;
  const fsdp::FileTable& table = tables()[data[0] % tables().size()];
  fsdp_fuzz::expect_only_input_errors([&] {
    fsdp::FlatDoc doc = fsdp::parse_file(fsdp_fuzz::as_text(data + 1, size - 1), table, "fuzz-" + table.name);
    (void)doc;
  });
  return 0;
}
