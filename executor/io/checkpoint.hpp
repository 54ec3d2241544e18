// Sharded checkpoints (issue 6): DIR/step-NNNNNNNN/ holds one safetensors file per
// rank (its master shard or replica and optimizer states per unit) and a
// manifest.json (step, world size, layout, plan, data, loss scale, checksums),
// written atomically: files under a .partial directory (temporary name, fsync,
// rename), the manifest last, then the directory renamed. Resuming verifies the
// checksums, falls back to the previous good step, and reshards when the world
// size changed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "planfile/plan_file.hpp"

namespace fsdp::exec {

class Comm;
class ShardedModel;

struct CheckpointMeta {
  int64_t step = 0;
  double loss_scale = 1.0;
  int64_t good_steps = 0;
  uint64_t seed = 0;
  std::string data;
  std::string plan_path;
};

struct ResumeState {
  int64_t step = 0;
  double loss_scale = 0;
  int64_t good_steps = 0;
  std::string dir;  // the step directory used
};

void save_checkpoint(const std::string& root, int keep_last, const CheckpointMeta& meta, Comm& comm,
                     ShardedModel& model, const PlanFile& plan);

// `dir` is a checkpoint root (the newest good step is used) or one step directory.
ResumeState load_checkpoint(const std::string& dir, Comm& comm, ShardedModel& model, const PlanFile& plan);

// `fsdp-run export CKPT --out FILE`: one consolidated safetensors file with the
// original (Hugging Face Llama) parameter names. Returns the number of tensors.
int64_t export_checkpoint(const std::string& ckpt, const std::string& out);

// --init-from: a safetensors file, or a directory with model.safetensors.index.json
// (weight_map) or a single model.safetensors. Tensors alias memory maps kept alive
// by a process-lifetime cache.
std::map<std::string, at::Tensor> load_safetensors_weights(const std::string& path, const ShardedModel& model);

}  // namespace fsdp::exec
