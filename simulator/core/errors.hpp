// The error channels of the project (DESIGN.md "Units and errors"):
//  - a bug is an assertion (FSDP_ASSERT), never a user-facing message;
//  - bad user input is an InputError, caught at the CLI boundary, printed with
//    the file, line and key it concerns, exit code 2;
//  - an infeasible plan is a value (Infeasible in strategy/verdict.hpp), not an error.
#pragma once

#include <stdexcept>
#include <string>

namespace fsdp {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void assertion_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace fsdp

#define FSDP_ASSERT(cond, msg)                                               \
  do {                                                                       \
    if (!(cond)) ::fsdp::assertion_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
