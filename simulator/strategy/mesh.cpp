#include "strategy/mesh.hpp"

namespace fsdp {

const char* to_string(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::GPipe:
      return "gpipe";
    case PipelineSchedule::OneFOneB:
      return "1f1b";
    case PipelineSchedule::Interleaved1F1B:
      return "interleaved-1f1b";
  }
  return "?";
}

bool parse_pipeline_schedule(const std::string& text, PipelineSchedule& out) {
  for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved1F1B})
    if (text == to_string(s)) {
      out = s;
      return true;
    }
  return false;
}

}  // namespace fsdp
