#!/usr/bin/env bash
# GPU check of fsdp-run (issue 5 "GPU readiness", for M7): build against a CUDA LibTorch 2.x
# (NCCL), then run a one-GPU plan of configs/models/tiny.yaml with fsdp + bf16 for 5 steps and
# its rehearsal as rank 0 of 8, writing both reports under $OUT (or ./gpu-check-out).
# Usage: scripts/gpu-check.sh [TORCH_CMAKE_PREFIX]   (default: from `python3 -c 'import torch'`)
# Untested until a GPU machine runs it; keep it short enough to rerun within a device slot.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)}"
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_BUILD_BENCH=OFF -DFSDP_BUILD_TESTS=OFF \
  ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} 2>&1 | tee "$out/configure.log" | grep -E "fsdp-run|Torch" || true
ninja -C build-gpu -j"$(nproc)" fsdp-run fsdp-plan 2>&1 | tail -3 | tee "$out/build.log"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt" || true

plan="$out/plan.yaml"
{
  echo "fsdp_plan_version: 1"
  echo "model:"
  echo "  name: tiny"
  echo "  spec:"
  grep -v '^#' configs/models/tiny.yaml | sed 's/^/    /'
  cat <<'YAML'
cluster:
  hardware: h200-141gb
  device: cuda
  nodes: 1
  gpus_per_node: 1
runtime: fsdp-run
strategy:
  kind: fsdp
  hsdp_group: 0
  wrap: layer
  reshard_after_forward: true
  act_ckpt: none
  offload: none
  param_dtype: bf16
  reduce_dtype: fp32
  master_dtype: fp32
  micro_batch: 8
  seq_len: 512
  grad_accum: 1
  attention: sdpa
  forward_prefetch: 1
  backward_prefetch: 1
  ddp_bucket_mb: 25
  method: full
  lora_rank: 0
  lora_targets: []
training:
  optimizer: adamw
  lr: 3.0e-4
  beta1: 0.9
  beta2: 0.95
  eps: 1.0e-8
  weight_decay: 0.1
  grad_clip: 1.0
  momentum: 0.9
YAML
} > "$plan"
bin=build-gpu/executor/fsdp-run
timeout 300 "$bin" "$plan" --steps 5 --report "$out/run.json" | tee "$out/run.log"
sed 's/gpus_per_node: 1/gpus_per_node: 8/' "$plan" > "$out/plan8.yaml"
timeout 120 "$bin" --emulate-world-size 8 "$out/plan8.yaml" --steps 3 --report "$out/emulate8.json" | tee "$out/emulate8.log"
# The step program beside each run, collective by collective (NCCL: bf16 on the wire, no staging).
for r in run:plan emulate8:plan8; do
  build-gpu/planner/fsdp-plan compare "$out/${r#*:}.yaml" "$out/${r%%:*}.json" | tee "$out/${r%%:*}-compare.txt" |
    sed -n '/step program vs run/,$p' || true
done
echo "gpu-check: reports in $out"
