// The model as wrap units of flat, padded parameter buffers, and the strategy's
// lifecycle around them (issue 5): DDP / no-shard / ZeRO-1 / ZeRO-2 keep full
// replicas; ZeRO-3 / FSDP / FSDP-grad-op / HSDP keep one shard per rank and gather
// the unit around its forward and its backward. The pre-backward point is a custom
// autograd function on each unit's output, the post-backward point is the backward
// of the function that hands out the unit's parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model_spec.hpp"
#include "strategy/strategy.hpp"
#include "train/device_optimizer.hpp"

namespace fsdp::exec {

class Comm;
class MemTracker;

struct UnitInfo {
  std::string name;    // "root", "layers.0-1", ...
  int64_t numel = 0;   // real parameters
  int64_t padded = 0;  // numel rounded up to a multiple of the shard-group size
  int64_t shard = 0;   // padded / shard-group size
  std::vector<std::string> params;
  std::vector<int64_t> offsets;              // of each parameter in the flat buffer
  std::vector<std::vector<int64_t>> shapes;  // of each parameter, as this rank holds it (its tensor-parallel slice)
  // Tensor parallelism (model/tensor_parallel.hpp): each parameter's whole shape, and the slice held along tp_dim
  // (-1: all of it) from tp_start.
  std::vector<std::vector<int64_t>> full_shapes;
  std::vector<int> tp_dims;
  std::vector<int64_t> tp_starts;
};

// How this rank's persistent tensors relate to the flat buffers (for checkpoints).
struct ShardLayout {
  bool params_sharded = false;  // "unitI.master" is a shard (else the full padded replica)
  bool optim_sharded = false;   // optimizer states are shards
  int shard_group_size = 1;
  int shard_rank = 0;
  // The mesh (shard/mesh.hpp): this rank's coordinates; a checkpoint reshards when they differ.
  int tp = 1, pp = 1, dp = 1;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
};

struct Mesh;

class ShardedModel {
 public:
  // The root unit's parameters stay gathered from its forward to its backward, as FSDP2's fully_shard leaves
  // the root (configs/runtimes/fsdp-run.yaml root_reshard_after_forward: false, which the step program prices;
  // tests/executor/test_unit.cpp checks that the two agree). Every unit's placement: strategy/placement.hpp.
  static constexpr bool kReshardsRoot = false;

  // Builds the units from the wrap policy, initialises parameters deterministically
  // from `seed` (identical on every world size) and keeps this rank's part.
  // The buffers it owns are tagged by category in `tracker` (train/mem_tracker.hpp), each for as long as it lives.
  ShardedModel(const ModelSpec& spec, const Strategy& strategy, Comm& comm, MemTracker& tracker,
               const std::string& device, uint64_t seed);
  ~ShardedModel();
  // InputError for a model or strategy fsdp-run cannot run (checked before any rank starts too).
  static void check_supported(const ModelSpec& spec, const Strategy& strategy, int world);
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  // Forward of one micro-batch through this rank's pipeline stage: tokens/targets [B, T] int64; `input` the previous
  // stage's output (undefined on the first stage). Returns the mean loss (fp32) on the last stage, else the output
  // activation for the next stage (stage_input's shape).
  at::Tensor forward_stage(const at::Tensor& tokens, const at::Tensor& targets, const at::Tensor& input);
  // Backward of `out` (the loss, already divided by the accumulation count and multiplied by any loss scale, when
  // `grad` is undefined; else the stage's output and the next stage's gradient of it); communicates gradients only
  // when `sync` (the stage's last micro-batch).
  void backward_stage(const at::Tensor& out, const at::Tensor& grad, bool sync);
  // One stage's whole model (pp 1): forward_stage / backward_stage without a pipeline.
  at::Tensor forward_loss(const at::Tensor& tokens, const at::Tensor& targets);
  void backward(const at::Tensor& loss, bool sync);
  // An empty buffer for the activation between pipeline stages of a micro-batch of `rows` x `seq` tokens: [rows,
  // seq (/ tp under sequence parallelism), hidden] in the compute dtype, on the device.
  at::Tensor stage_input(int64_t rows, int64_t seq) const;
  // The micro-batch (0-based) the step trace files what is recorded next under: a pipeline transfer carries one
  // micro-batch's activations or gradients, whichever pass the stage is in when it posts it.
  void trace_micro_batch(int64_t k);
  // This rank's coordinates and process groups.
  const Mesh& mesh() const;
  at::Device device() const;
  // The parameters of the whole model (every stage's).
  int64_t model_param_count() const;
  // Global L2 norm of the reduced gradients (across shards); scales them down to
  // max_norm when max_norm > 0 and the norm exceeds it (torch.nn.utils.clip_grad_norm_).
  double clip_grad_norm(double max_norm);
  // Multiplies all reduced gradients by k (loss-scale removal).
  void scale_grads(double k);
  // True when any reduced gradient holds inf/NaN on any rank.
  bool grads_nonfinite();
  void optimizer_step(const OptimizerConfig& cfg, int64_t step /*1-based*/);
  void zero_grad();

  // Every parameter, full and fp32, under its original name (all ranks take part).
  std::map<std::string, at::Tensor> full_state_dict();
  // Overwrites parameters from full tensors by name (each rank keeps its part).
  void load_full_state(const std::map<std::string, at::Tensor>& params);

  // This rank's persistent state (master shards / replicas, optimizer states) for checkpoints.
  std::map<std::string, at::Tensor> local_state();
  void load_local_state(const std::map<std::string, at::Tensor>& state);

  const std::vector<UnitInfo>& units() const;
  // LoRA adapters (one replicated flat buffer, "adapters.params" in local_state); null without LoRA.
  const UnitInfo* adapters() const;
  ShardLayout layout() const;
  int64_t num_params() const;
  // True when a collective had to run in fp32 because the backend lacks the dtype.
  bool comm_upcast() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::exec
