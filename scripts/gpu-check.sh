#!/usr/bin/env bash
# The GPU check of fsdp-run (issue M9), one run for a whole device slot: build against the CUDA LibTorch 2.x
# (ProcessGroupNCCL), then, in order of priority, each check's result a line of $OUT/results.tsv and of the table
# printed at the end (also when a step fails):
#   1. build       fsdp-run and fsdp-plan; a failed build leaves the compiler's first errors in $OUT/first-errors.txt
#   2. twin-*      ddp, zero2, zero3, fsdp, fsdp-grad-op on one GPU (real NCCL, world 1), 5 AdamW steps of the tiny
#                  model in bf16: losses equal to the no-shard run's within bf16 tolerance (2e-2 relative, as
#                  tests/executor/test_equivalence.cpp's bf16 case)
#   3. rehearse-*  the same plans rehearsed as rank 0 of 8 (--emulate-world-size 8): they run, peak and step time
#   4. bench       the ../shared/calibration PyTorch FSDP2 row's measurement: Llama 3 8B shape, emulated world 8,
#                  seq 4096, micro-batch 1, full checkpointing, bf16 params, fp32 reduce, AdamW, synthetic data;
#                  median step time over steps 3-10 and the run's peak allocated, against FSDP2's 0.576 s and
#                  21.62 GiB, and fsdp-plan's prediction of the same plan (runtime fsdp-run, h200-141gb)
#   5. calibrate   `fsdp-run calibrate --quick` on the device (base h200-141gb): $OUT/calibrated.yaml, its log with
#                  the residuals, and the measured memory bandwidth and cross-entropy softmax_efficiency beside the
#                  shipped profile's (issue M9, item 6: what to fold into hwprofiles/h200-141gb.yaml)
#   6. measure     scripts/gpu-measure.py on the device's PyTorch (CUDA only): triad bandwidth, SDPA flash by head dim,
#                  PyTorch's and Megatron's (nanotron's) cross-entropy kernels as fractions of it, float8 GEMMs' efficiency
#                  over bf16's (device.float8_matmul_ratio); $OUT/gpu-measure.json
# Usage (on the GPU machine, after ../shared/device-kit's setup): OUT=dir scripts/gpu-check.sh [TORCH_CMAKE_PREFIX]
# (default prefix: python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
# GPU_CHECK_DEVICE=cpu rehearses the same steps here with Debian's CPU LibTorch (Gloo, the cpu profile, the tiny
# model for the benchmark too, no FSDP2 comparison), so that only what CUDA changes is left for the device.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
device="${GPU_CHECK_DEVICE:-cuda}"
mkdir -p "$out"
results="$out/results.tsv"
printf 'check\tresult\tdetail\n' >"$results"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"; }
print_table() {
  echo
  echo "gpu-check ($device): $out"
  python3 - "$results" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
w = [max(len(r[i]) for r in rows) for i in range(2)]
for r in rows:
    print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]}")
PY
}
trap print_table EXIT

# 1. Build.
if [ "$device" = cuda ]; then
  [ -f .device-kit/setup.sh ] && source .device-kit/setup.sh
  prefix="${1:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)}"
  build=build-gpu
  hw=h200-141gb
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    nvcc --version | tail -1 || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
    g++ --version | head -1
  } >"$out/env.txt" 2>&1
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_BUILD_BENCH=OFF -DFSDP_BUILD_TESTS=OFF \
    ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} >"$out/configure.log" 2>&1
else
  build="${GPU_CHECK_BUILD:-build-cpu-check}"
  hw=cpu
  g++ --version | head -1 >"$out/env.txt"
  cmake -S . -B "$build" -G Ninja -DFSDP_BUILD_EXECUTOR=ON -DFSDP_BUILD_BENCH=OFF -DFSDP_BUILD_TESTS=OFF \
    >"$out/configure.log" 2>&1
fi
if ! ninja -C "$build" -j"$(nproc)" fsdp-run fsdp-plan >"$out/build.log" 2>&1; then
  grep -m 30 -E "error|Error|undefined reference" "$out/configure.log" "$out/build.log" >"$out/first-errors.txt"
  cat "$out/first-errors.txt"
  record build FAIL "first errors in first-errors.txt (configure.log, build.log)"
  exit 1
fi
record build ok "$(grep -c 'Building CXX' "$out/build.log") units; env.txt"
run="$build/executor/fsdp-run"
plan_tool="$build/planner/fsdp-plan"

# A plan.yaml for the tiny model: `plan NAME STRATEGY` writes $out/NAME.yaml.
plan() {
  "$plan_tool" --model tiny --gpus 1 --hw "$hw" --strategy "$2" --micro-batch 2 --seq 128 --grad-accum 1 \
    --param-dtype bf16 --reduce-dtype fp32 --act-ckpt none --offload none --out "$out/$1.yaml" >"$out/$1.plan.log" 2>&1
}
# The largest relative difference of two reports' per-step losses (a line of text: the number, or why not).
loss_diff() {
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    a, b = (json.load(open(p))["steps"] for p in sys.argv[1:3])
    if len(a) != len(b) or not a:
        print("step counts differ"); sys.exit()
    print(max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b)))
except Exception as e:
    print(f"unreadable: {e}")
PY
}

# 2. Twins at world 1 against the no-shard run.
if plan ref no-shard && timeout 300 "$run" "$out/ref.yaml" --steps 5 --report "$out/ref.json" >"$out/ref.log" 2>&1; then
  record twin-reference ok "no-shard, 5 steps"
  for s in ddp zero2 zero3 fsdp fsdp-grad-op; do
    if ! plan "twin-$s" "$s" || ! timeout 300 "$run" "$out/twin-$s.yaml" --steps 5 --report "$out/twin-$s.json" \
      >"$out/twin-$s.log" 2>&1; then
      record "twin-$s" FAIL "did not run: twin-$s.log"
      continue
    fi
    d=$(loss_diff "$out/twin-$s.json" "$out/ref.json")
    if python3 -c "import sys; sys.exit(0 if float('$d') <= 2e-2 else 1)" 2>/dev/null; then
      record "twin-$s" ok "largest relative loss difference $d"
    else
      record "twin-$s" FAIL "largest relative loss difference $d (bf16 tolerance 2e-2)"
    fi
  done
else
  record twin-reference FAIL "the no-shard run failed: ref.log"
fi

# 3. The same plans rehearsed as rank 0 of 8.
for s in ddp zero2 zero3 fsdp fsdp-grad-op; do
  [ -f "$out/twin-$s.yaml" ] || continue
  sed 's/gpus_per_node: 1$/gpus_per_node: 8/' "$out/twin-$s.yaml" >"$out/rehearse-$s.yaml"
  if timeout 300 "$run" --emulate-world-size 8 "$out/rehearse-$s.yaml" --steps 3 \
    --report "$out/rehearse-$s.json" >"$out/rehearse-$s.log" 2>&1; then
    record "rehearse-$s" ok "$(python3 -c "
import json, statistics
r = json.load(open('$out/rehearse-$s.json'))
print(f\"peak {r['memory']['peak_bytes'] / 2**20:.1f} MiB, median step {statistics.median(s['time_s'] for s in r['steps']):.4f} s\")")"
  else
    record "rehearse-$s" FAIL "rehearse-$s.log"
  fi
done

# 4. The benchmark: Llama 3 8B shape on CUDA (the tiny model on the CPU rehearsal).
if [ "$device" = cuda ]; then
  bench_args=(--model llama3-8b --gpus 8 --hw "$hw" --seq 4096)
else
  bench_args=(--model tiny --gpus 8 --hw "$hw" --seq 128)
fi
# Every knob of the FSDP2 row pinned: fully_shard on each layer resharded after forward, no tensor or pipeline
# parallelism (the search would otherwise pick no-reshard on the H200, tp 4 x pp 2 for the tiny model).
if "$plan_tool" "${bench_args[@]}" --runtime fsdp-run --strategy fsdp --wrap layer --reshard-after-forward true \
  --tp 1 --pp 1 --micro-batch 1 --grad-accum 1 --act-ckpt full --param-dtype bf16 --reduce-dtype fp32 \
  --offload none --optimizer adamw --out "$out/bench.yaml" \
  >"$out/bench.plan.log" 2>&1 &&
  timeout 420 "$run" --emulate-world-size 8 "$out/bench.yaml" --steps 10 --report "$out/bench.json" \
    >"$out/bench.log" 2>&1; then
  "$plan_tool" simulate --plan "$out/bench.yaml" --json >"$out/bench.prediction.json" 2>"$out/bench.prediction.log"
  record bench ok "$(python3 - "$out/bench.json" "$out/bench.prediction.json" "$device" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
steps = [s["time_s"] for s in r["steps"] if s["step"] >= 3]
t, peak = statistics.median(steps), r["memory"]["peak_bytes"] / 2**30
text = f"median step (3-10) {t:.3f} s, peak {peak:.2f} GiB"
try:
    p = json.load(open(sys.argv[2]))
    # The emulated run's collectives complete locally (as the FSDP2 row's fake process group): its step is the
    # predicted compute, the predicted step beside it.
    text += (f"; predicted compute {p['time']['compute_s']:.3f} s (step {p['time']['step_s']:.3f} s), "
             f"{p['memory']['peak_bytes'] / 2**30:.2f} GiB")
except Exception as e:
    text += f"; no prediction ({e})"
if sys.argv[3] == "cuda":
    text += f"; FSDP2 0.576 s, 21.62 GiB: throughput x{0.576 / t:.2f}, memory x{peak / 21.62:.2f}"
print(text)
PY
)"
else
  record bench FAIL "bench.plan.log, bench.log"
fi

# 5. Calibrate the device (quick) and set what it measured beside the shipped profile.
if timeout 300 "$run" calibrate --quick --base "$hw" --out "$out/calibrated.yaml" >"$out/calibrate.log" 2>&1; then
  record calibrate ok "$(python3 - "hwprofiles/$hw.yaml" "$out/calibrated.yaml" <<'PY'
import re, sys
def key(path, k):
    m = re.search(rf"^  {k}: *\"?([^\"\n#]+)", open(path).read(), re.M)
    return m.group(1).strip() if m else "-"
shipped, measured = sys.argv[1:3]
print(f"memory_bandwidth {key(measured, 'memory_bandwidth')} (shipped {key(shipped, 'memory_bandwidth')}), "
      f"softmax_efficiency {key(measured, 'softmax_efficiency')} (shipped {key(shipped, 'softmax_efficiency')}); "
      "residuals in calibrate.log")
PY
)"
else
  record calibrate FAIL "calibrate.log"
fi

# 6. Kernel series the GPU profiles need that calibrate does not take (the device's own PyTorch).
if [ "$device" = cuda ]; then
  if timeout 180 python3 scripts/gpu-measure.py "$out" >"$out/gpu-measure.log" 2>&1; then
    record measure ok "$(tr '\n' ';' <"$out/gpu-measure.log" | cut -c1-400)"
  else
    record measure FAIL "gpu-measure.log (each series's error in gpu-measure.json)"
  fi
fi
