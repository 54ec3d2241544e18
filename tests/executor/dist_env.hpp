// The process group of a multi-rank test binary (set by dist_main.cpp).
#pragma once

namespace fsdp::exec {
class Comm;
namespace test {
extern Comm* g_comm;
}
}  // namespace fsdp::exec
