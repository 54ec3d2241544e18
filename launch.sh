#!/bin/sh
# Written by fsdp-plan for DeepSpeed v0.19.x (ds_config.json, deepspeed --hostfile); keys read from deepspeedai/DeepSpeed@cf44300453eb.
set -eu
# hostfile: replace node-0 ... with your hosts' names (DeepSpeed reaches them over ssh).
# train.py: your script: it builds the model of script_args.json (from_pretrained with its torch_dtype and attn_implementation, gradient_checkpointing_enable() when set), trains max_seq_length-token sequences and calls deepspeed.initialize(config="ds_config.json").
deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 --master_addr "${MASTER_ADDR:-node-0}" --master_port "${MASTER_PORT:-29500}" train.py --deepspeed_config ds_config.json --script_args script_args.json
