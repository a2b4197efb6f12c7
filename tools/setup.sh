#!/usr/bin/env bash
# Installs what vflow needs on a fresh Debian 12 machine (root or sudo), then
# configures the build directory. Quick when everything is already there.
set -euo pipefail

packages=(
  cmake ninja-build ccache g++ python3 python3-venv python3-dev clang-format git
  llvm-16-dev llvm-16-tools libmlir-16-dev mlir-16-tools
  antlr4 libantlr4-runtime-dev
  libgtest-dev libopenblas-dev nlohmann-json3-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${VFLOW_BUILD_DIR:-$root/build}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
