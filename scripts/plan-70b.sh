#!/usr/bin/env bash
# README command 1: install what is missing, build the planner, plan Llama 3 70B on 8 nodes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
FSDP_DEPS_MINIMAL=1 scripts/install-deps.sh
cmake -S . -B build-plan -G Ninja -DFSDP_BUILD_EXECUTOR=OFF -DFSDP_BUILD_TESTS=OFF -DFSDP_BUILD_BENCH=OFF >/dev/null
cmake --build build-plan -j2 --target fsdp-plan
./build-plan/planner/fsdp-plan --model 70b --nodes 8 "$@"
