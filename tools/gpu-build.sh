#!/usr/bin/env bash
# Run here (no GPU), after tools/gpu-prepare.sh: builds the runtime, the GPU
# tests and the benchmarks for sm_90 (H100/H200) with this machine's nvcc
# into build-gpu/ and copies the binaries to .gpu-carry/build/bin, so a
# device call runs them (VFLOW_GPU_PREBUILT=.gpu-carry/build bash
# tools/gpu.sh) instead of spending device time on the build. NVRTC and the
# driver are loaded with dlopen: the binaries need only the device's driver
# and CUDA 13 libraries.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${VFLOW_GPU_BUILD_DIR:-$root/build-gpu}"
carry="$root/.gpu-carry"
flashinfer=""
[ -d "$carry/flashinfer/include" ] && flashinfer="$carry/flashinfer/include"
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DVFLOW_BUILD_COMPILER=OFF -DVFLOW_ENABLE_CUDA=ON -DVFLOW_GPU_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${VFLOW_GPU_ARCH:-90}" \
    -DVFLOW_FLASHINFER_INCLUDE="$flashinfer" >/dev/null
fi
targets=(vflow-bench-step vflow-bench-attention vflow-bench-select
  vflow-bench-gather vflow-runtime-tests
  vflow-cuda-jit-tests vflow-gpu-attention-tests vflow-gpu-flow-tests)
ninja -C "$build" -j "${VFLOW_JOBS:-$(nproc)}" "${targets[@]}"
mkdir -p "$carry/build/bin"
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$carry/build/bin/$t"
  strip "$carry/build/bin/$t"
done
du -sh "$carry"
