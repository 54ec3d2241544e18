#include "planfile/plan_keys.hpp"

#include <map>

namespace fsdp {

std::string plan_key_of_flag(const std::string& flag) {
  // The strategy flags of planner/cli/strategy_flags.cpp and the keys plan_file.cpp writes them under.
  static const std::map<std::string, std::string> keys{
      {"--strategy", "strategy.kind"},
      {"--hsdp-group", "strategy.hsdp_group"},
      {"--wrap", "strategy.wrap"},
      {"--reshard-after-forward", "strategy.reshard_after_forward"},
      {"--act-ckpt", "strategy.act_ckpt"},
      {"--offload", "strategy.offload"},
      {"--param-dtype", "strategy.param_dtype"},
      {"--reduce-dtype", "strategy.reduce_dtype"},
      {"--master-dtype", "strategy.master_dtype"},
      {"--micro-batch", "strategy.micro_batch"},
      {"--seq", "strategy.seq_len"},
      {"--doc-len", "strategy.doc_len"},
      {"--grad-accum", "strategy.grad_accum"},
      {"--optimizer", "training.optimizer"},
      {"--method", "strategy.method"},
      {"--lora-rank", "strategy.lora_rank"},
      {"--lora-targets", "strategy.lora_targets"},
      {"--attention", "strategy.attention"},
      {"--kernels", "strategy.kernels"},
      {"--forward-prefetch", "strategy.forward_prefetch"},
      {"--backward-prefetch", "strategy.backward_prefetch"},
      {"--ddp-bucket-mb", "strategy.ddp_bucket_mb"},
      {"--grad-sync", "strategy.grad_sync"},
      {"--float8", "strategy.float8"},
      {"--float8-all-gather", "strategy.float8_all_gather"},
      {"--tp", "strategy.tp"},
      {"--sequence-parallel", "strategy.sequence_parallel"},
      {"--async-tp", "strategy.async_tp"},
      {"--pp", "strategy.pp"},
      {"--pp-schedule", "strategy.pp_schedule"},
      {"--pp-virtual-stages", "strategy.pp_virtual_stages"},
      {"--ep", "strategy.ep"},
      {"--train-vision", "strategy.train_vision"},
      {"--nodes", "cluster.nodes"},
      {"--gpus-per-node", "cluster.gpus_per_node"},
  };
  const auto it = keys.find(flag);
  return it == keys.end() ? flag : it->second;
}

}  // namespace fsdp
