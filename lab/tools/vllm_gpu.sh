#!/usr/bin/env bash
# vflow's vLLM backend on the GPU machine (device tool; no network there).
# Here, once (about 330 MB of wheels, vLLM's trimmed set):
#   python3 lab/tools/vllm_stage.py download --trim
#   python3 lab/tools/vllm_stage.py pack --trim        # .carry/vllm/1..6
#   python3 -c "import lzma, shutil; ..."              # .carry/vx/vflowc.xz
#     (lab/tools/engine_gpu.sh's compressed vflowc; tools/gpu-prepare.sh
#     builds .gpu-carry/bin/vflowc and .gpu-carry/nlohmann)
# Device, one call per carry while the machine stays warm (30 s idle):
#   run("bash lab/tools/vllm_gpu.sh stage .carry/vllm/K",
#       carry=[".carry/vllm/K"])                       # K = 1..last
#   run("bash lab/tools/vllm_gpu.sh check MODE ARGS",
#       carry=[".gpu-carry/nlohmann", ".carry/vx"])
# A real model (SmolLM2-135M's GGUF, over one call's carry: the two parts
# of `lab/tools/engine_gpu.sh split`, and the gguf wheel in
# .carry/b/wheels from `lab/tools/engine_gpu.sh wheels`):
#   run("bash lab/tools/vllm_gpu.sh gguf-part .carry/a", carry=[".carry/a"])
#   run("bash lab/tools/vllm_gpu.sh gguf-part .carry/b && bash
#        lab/tools/vllm_gpu.sh gguf-convert smollm2", carry=[".carry/b"])
#   then `check MODE --hf smollm2 ARGS` (the HF directory
#   /tmp/vllm-models/smollm2 that lab/tools/hf_model.py from-gguf wrote).
# A larger GGUF (Qwen2.5-Coder-0.5B: 9 pieces) through
# lab/tools/file_carry.py (split here, `put` each piece there), then
#   run("bash lab/tools/vllm_gpu.sh gguf-convert qwen05
#        /tmp/models/qwen05.gguf", carry=[".carry/b/wheels"])
# `check` builds vflow's runtime-only package with its torch ops into
# /tmp/vflow-vllm (once per machine), declares its vLLM entry point there
# (a dist-info, as `pip install vflow` would), writes the model (--shape:
# random weights of a real shape, lab/tools/hf_model.py) and runs
# lab/tools/vllm_check.py OUT MODE --model DIR ARGS. `import` only checks
# that vLLM imports and registers the backend; `test` runs the backend's
# GPU test (tests/python/test_vllm_backend.py) without a vLLM engine.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
pkg=/tmp/vflow-vllm
# The trimmed set leaves FlashInfer out: vLLM samples with torch.
export VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONPATH="/tmp/vllmlib:$pkg" VFLOW_CACHE_DIR=/tmp/vc \
  VFLOW_SOURCE_DIR="$PWD" VFLOW_VFLOWC="$PWD/.gpu-carry/bin/vflowc"

vflowc() {
  if [ ! -x .gpu-carry/bin/vflowc ] && [ -f .carry/vx/vflowc.xz ]; then
    mkdir -p .gpu-carry/bin && python3 -c "import lzma, sys
open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" \
      .carry/vx/vflowc.xz .gpu-carry/bin/vflowc &&
      chmod +x .gpu-carry/bin/vflowc
  fi
}

# The runtime-only package with the torch ops (no LLVM there), as
# tools/gpu.sh builds it, plus vflow.vllm_backend and the entry point.
package() {
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader |
    head -1 | tr -d .)
  if ! ls "$pkg"/vflow/_vflow*.so >/dev/null 2>&1; then
    cmake -G Ninja -S "$PWD" -B "$pkg-build" -DCMAKE_BUILD_TYPE=Release \
      -DVFLOW_BUILD_COMPILER=OFF -DVFLOW_BUILD_TESTS=OFF \
      -DVFLOW_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DVFLOW_BUILD_PYTHON=ON -DVFLOW_TORCH_OPS=ON \
      -DVFLOW_NLOHMANN_JSON_INCLUDE="$PWD/.gpu-carry/nlohmann/include" \
      -DPython_EXECUTABLE="$(command -v python3)" \
      -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
      >"$pkg-build.log" 2>&1 &&
      ninja -C "$pkg-build" _vflow vflow_torch_ops >>"$pkg-build.log" 2>&1 ||
      { grep -E "error|FAILED" "$pkg-build.log" | head -20; exit 1; }
    mkdir -p "$pkg"/vflow
    cp "$pkg-build"/python/_vflow*.so "$pkg-build"/python/libvflow_torch_ops.so \
      "$pkg-build"/python/_torch_build.py "$pkg"/vflow/
  fi
  cp -r python/vflow/. "$pkg"/vflow/
  local info="$pkg/vflow-0+device.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: vflow\nVersion: 0+device\n' \
    >"$info/METADATA"
  printf '[vllm.general_plugins]\nvflow = vflow.vllm_backend:register\n' \
    >"$info/entry_points.txt"
}

case "${1:-}" in
stage)
  shift
  python3 lab/tools/vllm_carry.py install "$@"
  ;;
import)
  vflowc
  package
  python3 - <<'EOF'
import vllm
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
print("vllm", vllm.__version__, "CUSTOM ->",
      AttentionBackendEnum.CUSTOM.get_path())
EOF
  ;;
test)
  # The backend's own GPU test (no vLLM engine) and its config tests;
  # CUDA_LAUNCH_BLOCKING=1 names the launch that faults.
  shift
  vflowc
  package
  timeout "${CHECK_TIMEOUT:-560}" python3 -m pytest -q -rfE -p no:cacheprovider \
    tests/python/test_vllm_backend.py tests/python/test_vllm_validate.py \
    tests/python/test_vllm_config.py "$@"
  ;;
gguf-part)
  # A part of a GGUF appended to /tmp/m/model.gguf (the first part starts
  # it: its file begins with GGUF).
  mkdir -p /tmp/m
  if head -c 4 "$2/part" | grep -q GGUF; then
    cp "$2/part" /tmp/m/model.gguf
  else
    cat "$2/part" >>/tmp/m/model.gguf
  fi
  ls -l /tmp/m/model.gguf
  ;;
gguf-convert)
  # A GGUF (/tmp/m/model.gguf, or the one given: e.g. a model that
  # lab/tools/file_carry.py put in /tmp/models) as the HF directory
  # /tmp/vllm-models/NAME, with transformers' GGUF reader (the gguf wheel
  # carried in .carry/b/wheels, once per machine).
  if ! [ -d /tmp/site/gguf ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site \
      .carry/b/wheels/gguf-*.whl || exit 1
  fi
  PYTHONPATH="/tmp/site:$PYTHONPATH" python3 lab/tools/hf_model.py from-gguf \
    "${3:-/tmp/m/model.gguf}" "/tmp/vllm-models/$2"
  ;;
check)
  shift
  mode="$1"
  shift
  vflowc
  package
  model=""
  args=()
  while [ $# -gt 0 ]; do
    case "$1" in
    --hf)
      model="/tmp/vllm-models/$2"
      [ -f "$model/config.json" ] || { echo "check: no $model (gguf-convert)"; exit 2; }
      shift 2
      ;;
    --shape)
      model="/tmp/vllm-models/$2"
      [ -f "$model/config.json" ] ||
        python3 lab/tools/hf_model.py random --shape "$2" "$model" || exit 1
      shift 2
      ;;
    *)
      args+=("$1")
      shift
      ;;
    esac
  done
  [ -n "$model" ] || { echo "check: --shape NAME or --hf NAME is needed"; exit 2; }
  timeout "${CHECK_TIMEOUT:-560}" python3 lab/tools/vllm_check.py \
    "${OUT:-out}" "$mode" --model "$model" "${args[@]}"
  ;;
*)
  echo "usage: lab/tools/vllm_gpu.sh stage DIR | import | test | gguf-part DIR | gguf-convert NAME | check MODE (--shape NAME | --hf NAME) [args]"
  exit 2
  ;;
esac
