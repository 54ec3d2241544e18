#!/usr/bin/env bash
# Build the libFuzzer targets (fuzz/CMakeLists.txt, clang) and run each for a while with a seed
# corpus; exit 1 if any target finds a crash, a sanitizer report or an exception other than
# fsdp::InputError escaping a parser.
#
#   fuzz/run.sh [SECONDS_PER_TARGET]     default 20; all targets together get at most
#                                        FSDP_FUZZ_TOTAL seconds (default 60)
# Inputs in fuzz/regressions/<target>/ (past findings) are replayed before fuzzing.
# Environment: FSDP_FUZZ_BUILD (build dir, default build-fuzz), FSDP_FUZZ_TOTAL, FSDP_FUZZ_JOBS
# (ninja -j, default 2). Findings land in $FSDP_FUZZ_BUILD/findings/; reproduce one with
#   $FSDP_FUZZ_BUILD/fuzz_<target> $FSDP_FUZZ_BUILD/findings/<file>
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
per_target=${1:-20}
total=${FSDP_FUZZ_TOTAL:-60}
build=${FSDP_FUZZ_BUILD:-$root/build-fuzz}
jobs=${FSDP_FUZZ_JOBS:-2}

command -v clang++ >/dev/null || { echo "fuzz/run.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

cmake -S "$root/fuzz" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs"

# target -> dictionary, seed globs (relative to the repository root)
declare -A dict=([fuzz_model_yaml]=model.dict [fuzz_hf_config]=hf.dict [fuzz_hardware]=hardware.dict [fuzz_plan]=plan.dict)
# (fuzz/seeds/<target>/ holds hand-written seeds, e.g. complete plan files).
declare -A seeds=(
  [fuzz_model_yaml]="configs/models/*.yaml fuzz/seeds/fuzz_model_yaml/*"
  [fuzz_hf_config]="tests/data/hf/*.json fuzz/seeds/fuzz_hf_config/*"
  [fuzz_hardware]="hwprofiles/*.yaml fuzz/seeds/fuzz_hardware/*"
  [fuzz_plan]="fuzz/seeds/fuzz_plan/* tests/data/*plan*.yaml tests/data/*/*plan*.yaml configs/models/*.yaml"
  [fuzz_target_files]="fuzz/seeds/fuzz_target_files/*"
)

targets=()
for t in fuzz_model_yaml fuzz_hf_config fuzz_hardware fuzz_plan fuzz_target_files; do
  if [[ -x "$build/$t" ]]; then targets+=("$t"); else echo "fuzz/run.sh: $t not built (its parser has not landed); skipped"; fi
done
(( ${#targets[@]} > 0 )) || { echo "fuzz/run.sh: no fuzz targets built" >&2; exit 2; }

seconds=$per_target
(( seconds * ${#targets[@]} > total )) && seconds=$(( total / ${#targets[@]} ))
(( seconds >= 1 )) || seconds=1

mkdir -p "$build/findings"
failed=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  seed_dir="$build/seeds/$t"
  rm -rf "$seed_dir"
  mkdir -p "$corpus" "$seed_dir"
  shopt -s nullglob
  for pattern in ${seeds[$t]}; do
    for f in "$root"/$pattern; do cp "$f" "$seed_dir/"; done
  done
  shopt -u nullglob
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1
        -artifact_prefix="$build/findings/$t-")
  [[ -n "${dict[$t]:-}" ]] && args+=(-dict="$root/fuzz/${dict[$t]}")
  # Inputs that once broke a parser (fuzz/regressions/<target>/) are replayed first.
  regressions=("$root/fuzz/regressions/$t"/*)
  if [[ -e "${regressions[0]}" ]]; then
    if ! "$build/$t" "${regressions[@]}" >"$build/$t.regressions.log" 2>&1; then
      echo "!! $t fails a regression input (log: $build/$t.regressions.log):"
      grep -E "ERROR: |runtime error|what\(\)|SUMMARY|Running: " "$build/$t.regressions.log" | head -20
      failed+=("$t")
      continue
    fi
  fi
  echo "== $t: ${seconds}s, $(ls "$seed_dir" | wc -l) seeds"
  log="$build/$t.log"
  if "$build/$t" "${args[@]}" "$corpus" "$seed_dir" >"$log" 2>&1; then
    grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$log" | tr '\n' ' '; echo
  else
    echo "!! $t found a problem (log: $log):"
    grep -E "ERROR: |runtime error|terminate called|what\(\)|SUMMARY|Test unit written" "$log" | head -20
    failed+=("$t")
  fi
done

if (( ${#failed[@]} > 0 )); then
  echo "fuzz/run.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz/run.sh: no findings (${#targets[@]} targets, ${seconds}s each)"
