	#!/bin/sh
# Written by fsdp-plan for ms-swift v4.5 (swift sft --tuner_type).
# NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and NPROC_PER_NODE come from launch.sh.
set -eu
swift sft \
    --model Qwen/Qwen2-7B \
    --tuner_type lora \
    --lora_rank 16 \
    --lora_alpha 32 \
    --target_modules q_proj k_proj v_proj o_proj \
    --torch_dtype bfloat16 \
    --attn_impl flash_attn \
    --max_length 4096 \
    --packing true \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 128 \
    --gradient_checkpointing false \
    --deepspeed zero1 \
    --optim adamw_torch \
    --learning_rate 0.0003 \
    --weight_decay 0.1 \
    --max_grad_norm 1.0 \
    --dataset ${DATASET}
