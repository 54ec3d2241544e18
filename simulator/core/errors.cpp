#include "core/errors.hpp"

#include <cstdio>
#include <cstdlib>

namespace fsdp {

void assertion_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "internal error (a bug in fsdp-plan): %s:%d: assertion '%s' failed: %s\n", file, line, expr,
               msg.c_str());
  std::abort();
}

}  // namespace fsdp
