
# Written by fsdp-plan for torchtitan main at b5bcd76 (Python config, torchrun -m torchtitan.train --module M --config F).
# Plan: fsdp wrap=layer no-reshard ckpt=selective-op offload=none bf16/fp32 mb=2x32 seq=4096
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.trainer import Trainer


def fsdp_plan() -> Trainer.Config:
    config = llama3_8b()
    config.model_spec = model_registry("8B", attn_backend="sdpa")
    config.training.num_tokens_per_microbatch_per_dp_rank = 8192
    config.training.num_tokens_per_train_step = 4194304
    config.training.max_context_length = 4096
    config.training.max_norm = 1.0
    config.training.enable_cpu_offload = False
    config.training.dtype = "float32"
    config.training.mixed_precision_param = "bfloat16"
    config.training.mixed_precision_reduce = "float32"
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 16
    config.parallelism.fsdp_reshard_after_forward = "never"
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.activation_checkpoint = SelectiveAC.Config()
    return config
