// The device mesh beyond data parallelism: tensor (+ sequence) parallelism and pipeline parallelism, composed with
// the data-parallel strategy (Strategy::kind) on one mesh of world = dp x tp x pp ranks, as torchtitan builds it
// (torchtitan/distributed/parallel_dims.py ParallelDims: dp_replicate x dp_shard x cp x tp x pp, pp outermost, tp
// innermost so that a tensor-parallel group is inside a node on NVLink). The data-parallel degree is what remains:
// dp = world / (tp x pp); an HSDP shard group (Strategy::hsdp_group) divides dp.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

// Pipeline schedules: GPipe (Huang et al. 2019, arXiv:1811.06965: all forwards, then all backwards), 1F1B
// (PipeDream-Flush, Narayanan et al. 2021, arXiv:2006.09503), interleaved 1F1B with virtual stages (Narayanan et
// al. 2021, arXiv:2104.04473 sec. 2.2; torch.distributed.pipelining ScheduleInterleaved1F1B).
enum class PipelineSchedule { GPipe, OneFOneB, Interleaved1F1B };

struct MeshSpec {
  int64_t tp =
      1;  // tensor-parallel degree (Megatron-LM column/row-parallel linears; PyTorch DTensor parallelize_module)
  // Sequence parallelism with tp > 1 (Korthikanti et al. 2022, arXiv:2205.05198 sec. 4.2.2): norms and dropout run
  // on 1/tp of the sequence; torchtitan always enables it with tensor parallelism (SequenceParallel on the norms).
  bool sequence_parallel = true;
  // Async TP: the tp collectives decomposed and overlapped with the GEMMs (torchtitan
  // parallelism.enable_async_tensor_parallel; Wang et al. 2022, "Overlap communication with dependent computation
  // via decomposition", ASPLOS'23).
  bool async_tp = false;
  int64_t pp = 1;  // pipeline stages (physical)
  PipelineSchedule pp_schedule = PipelineSchedule::OneFOneB;
  int64_t pp_virtual_stages = 1;  // model chunks per pipeline rank (interleaved 1F1B); 1 otherwise
  // Expert-parallel degree: a mixture-of-experts model's routed experts split over ep consecutive ranks of the
  // data-parallel shard group, the tokens dispatched to them all-to-all (torchtitan parallelism.expert_parallel_degree;
  // program/expert_parallel.hpp). It borrows ranks from data parallelism (dp is unchanged): not in model_parallel().
  int64_t ep = 1;

  int64_t model_parallel() const { return tp * pp; }
  bool is_data_parallel_only() const { return tp == 1 && pp == 1; }
  // The data-parallel degree of a world of `world` ranks (world must be divisible by tp x pp).
  int64_t dp(int64_t world) const { return world / model_parallel(); }
};

const char* to_string(PipelineSchedule);  // "gpipe", "1f1b", "interleaved-1f1b"
bool parse_pipeline_schedule(const std::string&, PipelineSchedule&);
inline constexpr const char* kPipelineScheduleNames = "gpipe, 1f1b, interleaved-1f1b";

}  // namespace fsdp
