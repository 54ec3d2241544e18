// `fsdp-plan simulate --memory-timeline`: the memory walk op by op (what each op allocates when issued,
// its transient working memory, what it releases, and the allocated total while it runs), so that the
// predicted peak can be traced to the op that reaches it and compared with fsdp-run's peak phase.
#pragma once

#include <string>

#include "memory/memory_walk.hpp"
#include "program/step_program.hpp"

namespace fsdp {

std::string format_memory_timeline(const StepProgram& program, const MemoryResult& memory);

}  // namespace fsdp
