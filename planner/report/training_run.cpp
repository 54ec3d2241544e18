#include "report/training_run.hpp"

#include <array>
#include <cmath>
#include <utility>

#include "core/format.hpp"
#include "core/units.hpp"

namespace fsdp {

TrainingRun training_run(double train_tokens, const Cluster& cluster, const Prediction& p) {
  constexpr double kSecondsPerHour = 3600.0, kHoursPerDay = 24.0;
  TrainingRun t;
  const double gpus = static_cast<double>(cluster.world_size());
  const double seconds = train_tokens / (p.tokens_per_s_per_gpu * gpus);
  t.gpu_hours = seconds * gpus / kSecondsPerHour;
  t.days = seconds / kSecondsPerHour / kHoursPerDay;
  t.steps = std::ceil(train_tokens / p.tokens_per_step);
  return t;
}

std::string training_run_line(double train_tokens, const Cluster& cluster, const TrainingRun& t) {
  return "  training " + count_text(train_tokens) + " tokens: " + count_text(t.gpu_hours) + " GPU-hours, " +
         fmt("%.1f", t.days) + " days on these " + std::to_string(cluster.world_size()) + " GPUs (" +
         fmt("%.0f", t.steps) + " optimizer steps)";
}

nlohmann::json training_run_json(double train_tokens, const TrainingRun& t) {
  return {{"tokens", train_tokens}, {"gpu_hours", t.gpu_hours}, {"days", t.days}, {"optimizer_steps", t.steps}};
}

std::string count_text(double v) {
  constexpr std::array<std::pair<double, const char*>, 4> kSuffixes{{{kTera, "T"}, {kGB, "B"}, {kMB, "M"}, {kKB, "k"}}};
  for (const auto& [scale, suffix] : kSuffixes)
    if (v >= scale) return fmt("%.2f", v / scale) + suffix;
  return fmt("%.0f", v);
}

}  // namespace fsdp
