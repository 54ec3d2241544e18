#!/bin/sh
# Written by fsdp-plan for ms-swift v3.12 (swift sft --train_type).
# NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and NPROC_PER_NODE come from launch.sh.
set -eu
swift sft \
    --model Qwen/Qwen2-7B \
    --train_type full \
    --torch_dtype bfloat16 \
    --attn_impl flash_attn \
    --max_length 4096 \
    --packing true \
    --per_device_train_batch_size 4 \
    --gradient_accumulation_steps 32 \
    --gradient_checkpointing true \
    --deepspeed zero3_offload \
    --optim adamw_torch \
    --learning_rate 0.0003 \
    --weight_decay 0.1 \
    --max_grad_norm 1.0 \
    --dataset ${DATASET}
