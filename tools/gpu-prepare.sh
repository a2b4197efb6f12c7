#!/usr/bin/env bash
# Run here (no GPU) before the device call: builds the self-contained
# compiler and fills .gpu-carry/ (ignored by git) with what the GPU machine
# cannot build or fetch:
#   .gpu-carry/bin/vflowc        statically linked compiler (libc/libm only)
#   .gpu-carry/artifacts/*.vfa   every stock program, bench/flow/dense and
#                                tests/gpu/flow/programs
#   .gpu-carry/artifacts/random/ random programs (VFLOW_GPU_RANDOM, 24)
#   .gpu-carry/googletest/       GoogleTest source (no package there)
#   .gpu-carry/nlohmann/include  nlohmann/json's headers (runtime/Json.cpp's
#                                reader; no package there)
#   .gpu-carry/flashinfer/include FlashInfer's headers (the flashinfer-python
#                                0.6.8 wheel from PyPI): the benchmark's
#                                FlashInfer peer (bench/attention)
# Then, with the device tool: run(command="bash tools/gpu.sh",
# carry=[".gpu-carry"]). docs/gpu.md describes both steps.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/build.sh"
build="${VFLOW_BUILD_DIR:-$root/build}"
carry="$root/.gpu-carry"
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/artifacts"
cp "$build/bin/vflowc" "$carry/bin/vflowc"
strip "$carry/bin/vflowc"
for f in "$root"/examples/*.vflow "$root/bench/flow/dense.vflow" \
  "$root"/tests/gpu/flow/programs/*.vflow; do
  name=$(basename "$f" .vflow)
  "$carry/bin/vflowc" -o "$carry/artifacts/$name.vfa" "$f"
done
# Random programs for the GPU's differential test (tests/gpu/flow): sources
# here, artifacts and the manifest there.
random="$carry/random-src"
"$build/bin/vflow-random-programs" --out "$random" --first 1 \
  --count "${VFLOW_GPU_RANDOM:-24}" --head-dim 64 --block-sizes 16,32
mkdir -p "$carry/artifacts/random"
while read -r name group dim; do
  "$carry/bin/vflowc" -o "$carry/artifacts/random/$name.vfa" \
    "$random/$name/$name.vflow"
done <"$random/manifest.txt"
cp "$random/manifest.txt" "$carry/artifacts/random/"
rm -rf "$random"
cp -r /usr/src/googletest "$carry/googletest"
mkdir -p "$carry/nlohmann/include"
cp -r /usr/include/nlohmann "$carry/nlohmann/include/nlohmann"
# 0.6.8: later wheels include <cuda/cmath> for cuda::fast_mod_div, which
# the CUDA 13.0 toolkit's CCCL (3.0) does not have.
wheel=$(mktemp -d)
if "${VFLOW_VENV:-$root/.venv}/bin/python" -m pip download -q --no-deps \
  -d "$wheel" flashinfer-python==0.6.8; then
  (cd "$wheel" && unzip -q ./*.whl 'flashinfer/data/include/*')
  mkdir -p "$carry/flashinfer"
  mv "$wheel/flashinfer/data/include" "$carry/flashinfer/include"
else
  echo "gpu-prepare: no FlashInfer headers (PyPI unreachable?): the" \
    "benchmark runs without its FlashInfer peer" >&2
fi
rm -rf "$wheel"
du -sh "$carry"
