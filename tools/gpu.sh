#!/usr/bin/env bash
# Run on the GPU machine (device tool), from the repository root, after
# tools/gpu-prepare.sh here: builds the runtime, the GPU tests and the
# benchmarks with nvcc (no LLVM there), runs the GPU tests, then the
# benchmark, and prints the table. The table, the JSON rows and a tarball
# of every log (logs-<GPU_ONLY or all>.tar.gz, so that two modes in one
# call keep both) go to $OUT (or out/): the device tool returns at most
# eight files.
#   GPU_ONLY=tests|bench  runs one half (python: only the Python steps of
#   the tests; profile: per-kernel profiles of whole steps; compare: the
#   benchmarks of BASE=DIR/bin and of this tree side by side, below);
#   VFLOW_GPU_PREBUILT=DIR runs the binaries in DIR/bin (built here by
#   tools/gpu-build.sh for sm_90, carried) instead of building there;
#   BENCH_ARGS passes sweep options (e.g. "--batches 8 --lengths 32768") to
#   vflow-bench-step; PEERS_ARGS to bench/peers.py.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
final="${OUT:-$root/out}"
out=/tmp/vflow-gpu-out
rm -rf "$out"
mkdir -p "$out" "$final"
# Whatever happens below, the results and logs reach $OUT.
trap 'cp "$out"/table.md "$out"/vflow.jsonl "$out"/peers.jsonl "$final"/ \
  2>/dev/null; tar -czf "$final/logs-${GPU_ONLY:-all}.tar.gz" -C "$out" . 2>/dev/null' EXIT
carry="$root/.gpu-carry"
build=/tmp/vflow-gpu-build
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
  tee "$out/gpu.txt"
gpu=$(head -1 "$out/gpu.txt" | cut -d, -f1)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 |
  tr -d .)

status=0
if [ -n "${VFLOW_GPU_PREBUILT:-}" ]; then
  build="$VFLOW_GPU_PREBUILT"
elif [ "${GPU_ONLY:-}" != python ]; then
# FlashInfer's headers (tools/gpu-prepare.sh) add its decode as a peer row
# next to each attention row of the benchmark.
flashinfer=""
[ -d "$carry/flashinfer/include" ] && flashinfer="$carry/flashinfer/include"
cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DVFLOW_BUILD_COMPILER=OFF -DVFLOW_ENABLE_CUDA=ON -DVFLOW_GPU_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DVFLOW_FLASHINFER_INCLUDE="$flashinfer" \
  -DVFLOW_GTEST_SOURCE_DIR="$carry/googletest" \
  -DVFLOW_NLOHMANN_JSON_INCLUDE="$carry/nlohmann/include" \
  >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
# -k 0: build what builds; a target that fails is reported, and its
# tests or benchmark count as failed below.
ninja -C "$build" -k 0 >"$out/build.log" 2>&1 || {
  grep -E "error|FAILED" "$out/build.log" | head -20
  status=1
}
fi

export VFLOW_GPU_ARTIFACTS="$carry/artifacts" VFLOW_CACHE_DIR=/tmp/vflow-cache
if [ "${GPU_ONLY:-}" = compare ]; then
  # Before/after in one call: the whole-step and attention benchmarks of
  # the binaries in $BASE/bin (an earlier commit's, built by
  # tools/gpu-build.sh and carried, with its artifacts in $BASE/artifacts)
  # and of this tree's, alternating twice, then one table of both
  # (bench/compare.py: each row's faster run of each side).
  for run in base:1 new:1 base:2 new:2; do
    side=${run%:*} round=${run#*:}
    bin="$build/bin" artifacts="$carry/artifacts"
    if [ $side = base ]; then
      bin="$BASE/bin"
      # The base's own artifacts (generated code of its commit), if carried.
      [ -d "$BASE/artifacts" ] && artifacts="$BASE/artifacts"
    fi
    "$bin/vflow-bench-step" --artifacts "$artifacts" \
      --out "$out/step-$side-$round.jsonl" ${BENCH_ARGS:-} \
      >"$out/bench-step-$side-$round.log" 2>&1 || status=1
    "$bin/vflow-bench-attention" --out "$out/attention-$side-$round.jsonl" \
      ${ATTENTION_ARGS:-} >"$out/bench-attention-$side-$round.log" 2>&1 ||
      status=1
  done
  python3 "$root/bench/compare.py" "$out"/step-base-*.jsonl \
    "$out"/attention-base-*.jsonl -- "$out"/step-new-*.jsonl \
    "$out"/attention-new-*.jsonl | tee "$out/compare.md"
  cp "$out/compare.md" "$final/" 2>/dev/null
  exit $status
fi
if [ "${GPU_ONLY:-}" = profile ]; then
  # Per-kernel times of eager steps (VFLOW_PROFILE: events between the
  # step's launches) over BENCH_ARGS, then Nsight Compute on a few eager
  # steps of each of PROFILE_PROGRAMS at PROFILE_SHAPE (B L dtype): speed of
  # light, memory, occupancy, launch and warp-state sections per kernel.
  bench="$build/bin/vflow-bench-step --artifacts $carry/artifacts"
  VFLOW_PROFILE=1 $bench --out "$out/step.jsonl" ${BENCH_ARGS:-} \
    >"$out/bench-step.log" 2>&1 || status=1
  grep -E "^profile" "$out/bench-step.log" | tee "$out/profile.txt"
  read -r pb pl pd <<<"${PROFILE_SHAPE:-8 32768 bf16}"
  for prog in ${PROFILE_PROGRAMS:-quest}; do
    ncu --target-processes all \
      -k regex:"vflow_${prog}_(append|k[0-9]+)|pagedDecodeKernel|mergeKernel" \
      --launch-skip "${PROFILE_SKIP:-10}" --launch-count "${PROFILE_COUNT:-10}" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --clock-control none ${NCU_ARGS:-} \
      $bench --programs "$prog" --batches "$pb" --lengths "$pl" \
      --dtypes "$pd" >"$out/ncu-$prog.txt" 2>&1 || status=1
    cp "$out/ncu-$prog.txt" "$final/" 2>/dev/null
    grep -E "^  [a-zA-Z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Stall|One or More" \
      "$out/ncu-$prog.txt" | head -120
  done
  exit $status
fi
if [ "${GPU_ONLY:-}" != bench ]; then
  [ "${GPU_ONLY:-}" = python ] ||
  for t in vflow-runtime-tests vflow-cuda-jit-tests vflow-gpu-attention-tests \
    vflow-gpu-flow-tests; do
    [ -x "$build/bin/$t" ] || { echo "== $t: not built"; status=1; continue; }
    echo "== $t"
    "$build/bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED)|FAILED|differ|Failure" "$out/$t.log" | head -40
    [ $rc = 0 ] || status=1
  done
  # The Python package, runtime only (no LLVM here): sessions on torch CUDA
  # tensors against the CPU backend, on the carried artifacts.
  echo "== python (vflow.Session on torch CUDA tensors)"
  pybuild=/tmp/vflow-gpu-python pkg=/tmp/vflow-python/vflow
  rm -rf "$pkg" && mkdir -p "$pkg"
  cp "$root"/python/vflow/*.py "$pkg"/
  if cmake -G Ninja -S "$root" -B "$pybuild" -DCMAKE_BUILD_TYPE=Release \
    -DVFLOW_BUILD_COMPILER=OFF -DVFLOW_BUILD_TESTS=OFF -DVFLOW_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DVFLOW_BUILD_PYTHON=ON \
    -DVFLOW_NLOHMANN_JSON_INCLUDE="$carry/nlohmann/include" \
    -DPython_EXECUTABLE="$(command -v python3)" \
    -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" -DVFLOW_TORCH_OPS=ON \
    >"$out/python-build.log" 2>&1 &&
    ninja -C "$pybuild" _vflow vflow_torch_ops >>"$out/python-build.log" 2>&1
  then
    cp "$pybuild"/python/_vflow*.so "$pybuild"/python/libvflow_torch_ops.so \
      "$pybuild"/python/_torch_build.py "$pkg"/
    PYTHONPATH=/tmp/vflow-python python3 "$root/tests/python/test_cuda.py" \
      "$carry/artifacts" >"$out/python.log" 2>&1
    rc=$?
  else
    tail -20 "$out/python-build.log" >"$out/python.log"
    rc=1
  fi
  tail -5 "$out/python.log"
  [ $rc = 0 ] || status=1
  # The quickstart notebook, top to bottom on CUDA tensors (the runtime-only
  # package compiles through the carried vflowc).
  echo "== quickstart notebook on CUDA"
  PYTHONPATH=/tmp/vflow-python VFLOW_DEVICE=cuda \
    VFLOW_VFLOWC="$carry/bin/vflowc" python3 \
    "$root/tests/python/run_notebook.py" \
    "$root/examples/notebooks/quickstart.ipynb" >"$out/notebook.log" 2>&1
  rc=$?
  grep -E "needle blocks found|output error|budget  64|Error" "$out/notebook.log"
  [ $rc = 0 ] || status=1
  # The torch ops (built above by CMake): float64 references, opcheck,
  # CUDA graphs, torch.compile.
  echo "== torch ops"
  PYTHONPATH=/tmp/vflow-python python3 "$root/tests/python/test_torch_ops.py" \
    >"$out/torch-ops.log" 2>&1
  rc=$?
  tail -8 "$out/torch-ops.log"
  [ $rc = 0 ] || status=1
  # The flow's kernels as torch ops against vflow.Session on CUDA.
  echo "== flow torch ops"
  PYTHONPATH=/tmp/vflow-python python3 -X faulthandler \
    "$root/tests/python/test_flow_ops.py" "$carry/artifacts" \
    >"$out/flow-ops.log" 2>&1
  rc=$?
  tail -8 "$out/flow-ops.log"
  [ $rc = 0 ] || status=1
  # Careless and concurrent use of the GPU path: the engine on CUDA
  # (threads, Ctrl-C, NaN weights, bad options, a NaN budget) and the
  # session and torch ops given bad input, each case in a child process.
  echo "== reliability (engine, session and torch ops on CUDA)"
  PYTHONPATH=/tmp/vflow-python VFLOW_SOURCE_DIR="$root" \
    VFLOW_TEST_DEVICES=cuda VFLOW_VFLOWC="$carry/bin/vflowc" \
    python3 -m pytest -q -rfE -p no:cacheprovider \
    "$root/tests/python/test_llm_reliability.py" \
    "$root/tests/python/test_cuda_reliability.py" >"$out/reliability.log" 2>&1
  rc=$?
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/reliability.log" | tail -40
  [ $rc = 0 ] || status=1
  # vflow serve on CUDA (the official openai client against a real server),
  # when its stack was carried (.carry/serve: lab/tools/engine_gpu.sh
  # serve-wheels; the machine has no network).
  if [ -d "$root/.carry/serve" ]; then
    echo "== vflow serve on CUDA"
    python3 -m pip install -q --no-index --find-links "$root/.carry/serve" \
      --target /tmp/servelib fastapi uvicorn prometheus_client httpx2 openai \
      >"$out/serve-install.log" 2>&1
    PYTHONPATH=/tmp/vflow-python:/tmp/servelib VFLOW_SOURCE_DIR="$root" \
      VFLOW_TEST_DEVICES=cuda VFLOW_VFLOWC="$carry/bin/vflowc" \
      python3 -m pytest -q -rfE -p no:cacheprovider \
      "$root/tests/python/test_serve.py" >"$out/serve.log" 2>&1
    rc=$?
    grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$out/serve.log" | tail -20
    [ $rc = 0 ] || status=1
  fi
fi
if [ "${GPU_ONLY:-}" != tests ] && [ "${GPU_ONLY:-}" != python ]; then
  echo "== benchmark"
  start=$(date +%s.%N)
  "$carry/bin/vflowc" --emit=cuda examples/quest.vflow >/dev/null
  emit_ms=$(python3 -c "import time; print(round((time.time() - $start) * 1000, 1))")
  echo "{\"source\":\"vflow\",\"what\":\"emit_cuda\",\"program\":\"quest\",\"ms\":$emit_ms}" \
    >"$out/vflow.jsonl"
  "$build/bin/vflow-bench-attention" --out "$out/attention.jsonl" \
    >"$out/bench-attention.log" 2>&1 || status=1
  cat "$out/attention.jsonl" >>"$out/vflow.jsonl" 2>/dev/null
  "$build/bin/vflow-bench-step" --artifacts "$carry/artifacts" \
    --out "$out/step.jsonl" ${BENCH_ARGS:-} >"$out/bench-step.log" 2>&1 ||
    status=1
  cat "$out/step.jsonl" >>"$out/vflow.jsonl" 2>/dev/null
  PYTHONUNBUFFERED=1 python3 "$root/bench/peers.py" --out "$out/peers.jsonl" \
    ${PEERS_ARGS:-} >"$out/peers.log" 2>&1 || status=1
  python3 "$root/bench/table.py" "$out/vflow.jsonl" "$out/peers.jsonl" \
    --gpu "$gpu" --commit "${VFLOW_COMMIT:-unknown}" \
    --command "bash tools/gpu.sh ${BENCH_ARGS:-}" >"$out/table.md"
  cat "$out/table.md"
fi
exit $status
