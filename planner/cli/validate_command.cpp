// `fsdp-plan validate [DIR]`: every published run of DIR (default tests/accuracy/published) simulated and set
// beside its measurement (planner/validate/published_runs.hpp).
#include <filesystem>
#include <iostream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/errors.hpp"
#include "validate/published_runs.hpp"
#include "validate/row_breakdown.hpp"

namespace fsdp {

int run_validate(const std::vector<std::string>& argv) {
  Args args(argv, {"--config-root", "--breakdown"}, {"--help", "--summary"});
  if (args.has("--help")) {
    std::cout << "usage: fsdp-plan validate [DIR] [--summary | --breakdown TEXT]\n"
                 "  simulates every published run of DIR (default: tests/accuracy/published of the source tree;\n"
                 "  format: SCHEMA.md there) and prints predicted against measured tokens/s and peak memory,\n"
                 "  with the median and max |error| over all rows, the held-out rows and each source.\n"
                 "  --summary: those median and max lines only (README \"Accuracy on published runs\" holds them).\n"
                 "  --breakdown TEXT: instead, for each row whose id contains TEXT, where its predicted step goes\n"
                 "  (seconds: compute, collectives, exposed, compute slowed beside collectives, after the backward)\n"
                 "  and its predicted device memory against the GPU's usable memory; then a memory line: the\n"
                 "  allocated peak, its phase, the reserved peak and every category live at the peak.\n";
    return 0;
  }
  const std::string root = config_root_from(argv);
  if (args.positional().size() > 1)
    throw InputError("validate takes one directory, got " + std::to_string(args.positional().size()) + " arguments");
  const std::string dir = args.positional().empty()
                              ? (std::filesystem::path(root) / "tests" / "accuracy" / "published").string()
                              : args.positional()[0];
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw InputError(dir + ": not a directory of published runs");
  const ValidationReport report = validate_published(dir, root);
  if (auto match = args.get("--breakdown")) {
    if (args.has("--summary")) throw InputError("validate: --summary and --breakdown print different things; give one");
    std::cout << format_breakdown(report, *match);
  } else if (args.has("--summary")) {
    std::cout << format_validation_summary(report);
  } else
    std::cout << format_validation(report);
  return 0;
}

}  // namespace fsdp
