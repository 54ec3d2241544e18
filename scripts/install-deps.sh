#!/usr/bin/env bash
# Installs the Debian 12 packages fsdp-plan needs, only those missing. Root or sudo required for apt.
#   scripts/install-deps.sh            build + tests
#   FSDP_DEPS_MINIMAL=1 ...            only what `fsdp-plan` needs (no LibTorch)
set -euo pipefail
pkgs=(cmake ninja-build g++ libyaml-cpp-dev libboost-graph-dev nlohmann-json3-dev doctest-dev libbenchmark-dev)
if [[ "${FSDP_DEPS_MINIMAL:-0}" != 1 ]]; then
  pkgs+=(libtorch-dev libgloo-dev libeigen3-dev clang libclang-rt-14-dev chromium python3 fonts-dejavu-core)
  # Debian's LibTorch runs its fp32 GEMMs in whatever provides libblas.so.3: libtorch-dev pulls in the reference
  # BLAS (netlib sgemm_, 2-5 GFLOP/s). libopenblas0-pthread registers OpenBLAS as that Debian alternative at
  # priority 100 (the reference has 10), so in auto mode it takes over libblas.so.3 on install, with no rebuild:
  # the same 2-rank fsdp-run DDP step ran 4x faster on the 2-vCPU build machine, same losses (docs/calibrate.md).
  pkgs+=(libopenblas0-pthread)
fi
# libblas.so.3 should be OpenBLAS once it is installed; an alternative set by hand (manual mode) keeps its choice.
check_blas() {
  [[ "${FSDP_DEPS_MINIMAL:-0}" == 1 ]] && return 0
  local blas
  blas=$(update-alternatives --get-selections 2>/dev/null | awk '$1 ~ /^libblas\.so\.3-/ {print $3}')
  [[ -z "$blas" || "$blas" == *openblas* ]] && return 0
  echo "install-deps: warning: libblas.so.3 is $blas, not OpenBLAS (fp32 GEMMs run in the reference BLAS);" \
    "'update-alternatives --auto libblas.so.3-$(gcc -print-multiarch)' selects OpenBLAS" >&2
}
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  check_blas
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=()
[[ $(id -u) -ne 0 ]] && sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
check_blas
