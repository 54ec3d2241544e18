#!/usr/bin/env bash
# README command 2 (and .ci/run): install what is missing, build everything, run every test:
# the parser fuzzers for a minute, then the doctest suites, executor runs, accuracy grid and browser
# test through ctest (whose summary closes the output).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DFSDP_BUILD_EXECUTOR=ON -DFSDP_BUILD_TESTS=ON >/dev/null
cmake --build build -j2
FSDP_FUZZ_TOTAL=60 fuzz/run.sh 15
# The step-time check (label `timing`) needs an idle machine; run it apart: ctest --test-dir build -L timing
ctest --test-dir build --output-on-failure -j2 --timeout 900 -LE timing
