// Sharded checkpoints (issue 6): DIR/step-NNNNNNNN/ holds one safetensors file per
// rank (its master shard or replica and optimizer states per unit) and a
// manifest.json (step, world size, layout, plan, data, loss scale, checksums),
// written atomically: files under a .partial directory (temporary name, fsync,
// rename), the manifest last, then the directory renamed. Resuming verifies the
// checksums, falls back to the previous good step, and reshards when the world
// size changed.
// Issue M11: every rank reads its file back before the step is published (renamed to its final name); the
// manifest carries its own checksum and the run's identity (seed, plan_hash), and resuming another run's
// checkpoint is refused unless asked for. The directory's lock is io/checkpoint_lock.hpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iosfwd>
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

struct ResumeOptions {
  uint64_t seed = 0;     // this run's seed: the checkpoint's must be the same
  bool any_run = false;  // --resume-any: continue a checkpoint of another seed or plan (with a note)
};

// The part of a plan that decides a run's trajectory, as plan text: the model, the method, the optimizer and its
// hyperparameters, the dtypes, the sequence length and the rows of a step (micro-batch x accumulation x world).
// How the run is laid out (strategy, wrap, world size, offload, checkpointing, prefetch, buckets, hardware) is not
// part of it: a checkpoint resumes on another layout (resharded), and resumes identically.
std::string plan_identity(const PlanFile& plan);
// FNV-1a 64 of plan_identity, in hex: the manifest's run.plan_hash.
std::string plan_hash(const PlanFile& plan);

// The bytes one checkpoint of `model` takes on disk (every rank's file), for the free-space check at start.
int64_t checkpoint_bytes(ShardedModel& model, int world_size);
// InputError when the file system of `dir` has fewer than `bytes` available (statvfs(3), f_bavail).
void check_free_space(const std::string& dir, int64_t bytes);

// The rank files of a step being saved, row r = {checksum rank r wrote, checksum its file reads back with}: throws
// std::runtime_error naming the first file that reads back otherwise, so the step is not published. Every rank
// calls it with the same gathered rows, and all stop together.
void check_read_back(const at::Tensor& sums, const std::string& partial_dir, int64_t step);

void save_checkpoint(const std::string& root, int keep_last, const CheckpointMeta& meta, Comm& comm,
                     ShardedModel& model, const PlanFile& plan);

// `dir` is a checkpoint root (the newest good step is used) or one step directory. InputError when the checkpoint
// is of another run (seed or plan_hash) and `opts.any_run` is not set.
ResumeState load_checkpoint(const std::string& dir, Comm& comm, ShardedModel& model, const PlanFile& plan,
                            const ResumeOptions& opts);

// `fsdp-run export CKPT --out FILE`: one consolidated safetensors file with the
// original (Hugging Face Llama) parameter names. Returns the number of tensors.
int64_t export_checkpoint(const std::string& ckpt, const std::string& out);

// --init-from: a safetensors file, or a directory with model.safetensors.index.json
// (weight_map) or a single model.safetensors. Tensors alias memory maps kept alive
// by a process-lifetime cache. Every parameter of `model` must be there (LoRA adapters may be
// left out: they keep their initialisation) in a floating dtype with the model's shape; a tensor
// in two files, or not where the index says, is refused; each InputError names the file and the
// tensor. Tensors that are no parameter of the model are not loaded, and listed on `notes`.
std::map<std::string, at::Tensor> load_safetensors_weights(const std::string& path, const ShardedModel& model,
                                                           std::ostream* notes);

}  // namespace fsdp::exec
