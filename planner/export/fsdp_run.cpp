// fsdp-run, this project's executor: the plan file itself is its config.
#include <filesystem>

#include "export/target.hpp"

namespace fsdp {

namespace {

class FsdpRunTarget final : public Target {
 public:
  std::string name() const override { return "fsdp-run"; }

  ExportResult write(const PlanFile& plan, const TargetSpec& spec) const override {
    PlanFile p = plan;
    p.runtime = spec.runtime;
    ExportResult r;
    r.files.push_back(WrittenFile{"plan.yaml", {}, {}, write_plan_text(p), false});
    r.launch_command = "torchrun --nnodes " + std::to_string(p.cluster.nodes) + " --nproc-per-node " +
                       std::to_string(p.cluster.gpus_per_node) +
                       " --node-rank \"${NODE_RANK:-0}\" --rdzv-backend c10d --rdzv-endpoint "
                       "\"${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}\" --no-python fsdp-run plan.yaml";
    return r;
  }

 private:
  Strategy read_files(const std::string& dir, const TargetSpec&, const ClusterShape&) const override {
    return read_plan_file((std::filesystem::path(dir) / "plan.yaml").string()).strategy;
  }
};

}  // namespace

const Target& fsdp_run_target() {
  static const FsdpRunTarget t;
  return t;
}

}  // namespace fsdp
