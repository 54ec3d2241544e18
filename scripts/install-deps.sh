#!/usr/bin/env bash
# Installs the Debian 12 packages fsdp-plan needs, only those missing. Root or sudo required for apt.
#   scripts/install-deps.sh            build + tests
#   FSDP_DEPS_MINIMAL=1 ...            only what `fsdp-plan` needs (no LibTorch)
set -euo pipefail
pkgs=(cmake ninja-build g++ libyaml-cpp-dev libboost-graph-dev nlohmann-json3-dev doctest-dev libbenchmark-dev)
if [[ "${FSDP_DEPS_MINIMAL:-0}" != 1 ]]; then
  pkgs+=(libtorch-dev libgloo-dev libeigen3-dev clang libclang-rt-14-dev chromium python3 fonts-dejavu-core)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=()
[[ $(id -u) -ne 0 ]] && sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
