// One number printed into a string with a printf format ("%.2f ms"): the reports' and profile notes' numbers.
#pragma once

#include <cstdio>
#include <string>

namespace fsdp {

inline std::string fmt(const char* format, double v) {
  char buf[128];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace fsdp
