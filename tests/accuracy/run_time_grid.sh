#!/usr/bin/env bash
# Step-time accuracy gate (issue M6 "Time"): `fsdp-run calibrate` measures this machine's CPU, then every
# plan of tests/accuracy/grid.txt is planned against that profile exactly as run_grid.sh plans it (but
# --hw <the calibrated profile>), run through fsdp-run, and its measured step time (median of steps 2..N of
# every pass: step 1 warms up) is compared with fsdp-plan's predicted step time (chosen.time.step_s of --json).
# Prints the table; fails when any |error| exceeds the tolerance. tests/accuracy/README.md, "Step time on CPU".
#   run_time_grid.sh FSDP_PLAN FSDP_RUN [TOLERANCE_PERCENT] [OUT_DIR] [BF16_TOLERANCE_PERCENT]
# TOLERANCE_PERCENT (default 15) applies to every plan, or to the fp32 ones when BF16_TOLERANCE_PERCENT is
# given for the plans that compute in bf16 (the README says why they need their own gate for now).
# Environment: FSDP_TIME_STEPS (steps per run, default 8), FSDP_TIME_PASSES (passes over the grid, default 3:
# a plan's measured time is the median of its steps 2..N over every pass, so that a disturbance of a few seconds
# on a shared machine, which slows every step it overlaps by up to 40%, meets one run of the plan and not all),
# FSDP_TIME_CALIBRATE (extra calibrate flags, default --quick), FSDP_TIME_PROFILE (a profile already calibrated
# on this machine: no calibration), FSDP_TIME_ROWS (space-separated grid rows to run, default all).
set -euo pipefail
plan_bin=$1 run_bin=$2 tol=${3:-15} out=${4:-$(mktemp -d)} tol_bf16=${5:-${3:-15}}
steps=${FSDP_TIME_STEPS:-8}
passes=${FSDP_TIME_PASSES:-3}
cal_flags=${FSDP_TIME_CALIBRATE---quick}
profile=${FSDP_TIME_PROFILE:-}
only=${FSDP_TIME_ROWS:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
model=$root/tests/data/models/acc-small.yaml
[[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 3 ]] || { echo "FSDP_TIME_STEPS must be an integer >= 3, got '$steps'"; exit 2; }
[[ "$passes" =~ ^[0-9]+$ && "$passes" -ge 1 ]] || { echo "FSDP_TIME_PASSES must be an integer >= 1, got '$passes'"; exit 2; }
[[ -z "$profile" || -f "$profile" ]] || { echo "FSDP_TIME_PROFILE: no such file '$profile'"; exit 2; }
mkdir -p "$out"
start=$SECONDS
# A timing check measures whatever else runs: wait (up to 5 minutes) until the CPUs are at least 90% idle over
# 3 consecutive seconds before calibrating, and say how idle they were.
idle_pct() {
  local a b
  a=($(awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat))
  sleep 1
  b=($(awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat))
  echo $((100 * (b[0] - a[0]) / (b[1] - a[1] + 1)))
}
quiet=0 idle=0
while ((quiet < 3 && SECONDS - start < 300)); do
  idle=$(idle_pct)
  if ((idle >= 90)); then quiet=$((quiet + 1)); else quiet=0; fi
done
((quiet >= 3)) || echo "warning: the CPUs were not idle (last second ${idle}% idle); timings will be disturbed"
# One calibration rank per CPU: each rank measures what it gets when the node is full (executor/dist/device.hpp
# gives every rank floor(CPUs / ranks) threads); the simulator scales to other rank counts (device.cores).
cpus=$(nproc)
if [[ -n "$profile" ]]; then
  hw=$profile
  echo "profile $hw (not calibrated now)"
else
  hw=$out/cpu-cal.yaml
  # shellcheck disable=SC2086
  "$run_bin" calibrate $cal_flags --nproc-per-node "$cpus" --out "$hw" >"$out/calibrate.log" 2>&1 ||
    { echo "fsdp-run calibrate failed:"; tail -20 "$out/calibrate.log"; exit 1; }
  echo "calibrated $hw on $cpus CPUs in $((SECONDS - start)) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
fi
# shellcheck source=grid_rows.sh
source "$root/tests/accuracy/grid_rows.sh"
top=$out
for ((p = 1; p <= passes; ++p)); do
  out=$top/pass$p
  mkdir -p "$out"
  run_grid_rows "$hw" "$steps" "$only" || exit 1
done
out=$top
exec python3 "$root/tests/accuracy/time_table.py" "$out" "$tol" "$tol_bf16" "$((SECONDS - start))" "$passes"
