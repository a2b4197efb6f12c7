#!/usr/bin/env bash
# The GPU flow tests' quick path on the GPU machine (device tool), after
# tools/gpu-prepare.sh here: builds only vflow-gpu-flow-tests with nvcc and
# runs it (FILTER: a --gtest_filter, default every test; FILTER=none skips
# it), with ATTN (a --gtest_filter) vflow-gpu-attention-tests too, with
# MODEL (a --gtest_filter) vflow-gpu-model-tests (the MoE kernels), then with
# PYTEST
# set (pytest -k expressions over tests/python/test_retain.py and the like:
# PYTEST_FILES) the Python tests on CUDA through the runtime-only extension
# (lab/tools/engine_gpu.sh ext). Logs go to $OUT.
#   run(command="FILTER='Retain.*' PYTEST=every_device \
#       bash lab/tools/flow_tests_gpu.sh", carry=[".gpu-carry"])
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
out="${OUT:-out}"
mkdir -p "$out"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 |
  tr -d .)
status=0
start=$(date +%s)
cmake -G Ninja -S . -B /tmp/gft -DCMAKE_BUILD_TYPE=Release \
  -DVFLOW_BUILD_COMPILER=OFF -DVFLOW_ENABLE_CUDA=ON -DVFLOW_GPU_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DVFLOW_GTEST_SOURCE_DIR="$PWD/.gpu-carry/googletest" \
  -DVFLOW_NLOHMANN_JSON_INCLUDE="$PWD/.gpu-carry/nlohmann/include" \
  >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
targets="vflow-gpu-flow-tests"
[ -n "${ATTN:-}" ] && targets="$targets vflow-gpu-attention-tests"
[ -n "${MODEL:-}" ] && targets="$targets vflow-gpu-model-tests"
timeout "${BUILD_TIMEOUT:-300}" ninja -C /tmp/gft $targets \
  >"$out/build.log" 2>&1 || {
  grep -E "error|FAILED" "$out/build.log" | head -20
  exit 1
}
echo "built in $(($(date +%s) - start)) s"
# run_tests BINARY FILTER LOG PATTERN LINES: the test binary under FILTER,
# its log in $out/LOG, the lines matching PATTERN (at most LINES) and its
# summary.
run_tests() {
  timeout "${TEST_TIMEOUT:-300}" "/tmp/gft/bin/$1" --gtest_filter="$2" \
    >"$out/$3" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |$4|Failure|Expected|Which is" \
    "$out/$3" | head -"$5"
  tail -3 "$out/$3"
}
[ -n "${ATTN:-}" ] &&
  run_tests vflow-gpu-attention-tests "$ATTN" attention-tests.log rel.err 80
[ -n "${MODEL:-}" ] &&
  run_tests vflow-gpu-model-tests "$MODEL" model-tests.log "max err" 60
if [ "${FILTER:-}" != none ]; then
  VFLOW_GPU_ARTIFACTS="$PWD/.gpu-carry/artifacts" run_tests \
    vflow-gpu-flow-tests "${FILTER:-*}" flow-tests.log "evicted|actual" 60
fi
if [ -n "${PYTEST:-}" ]; then
  bash lab/tools/engine_gpu.sh ext >"$out/ext.log" 2>&1 ||
    { tail -20 "$out/ext.log"; exit 1; }
  PYTHONPATH=/tmp/vp VFLOW_VFLOWC="$PWD/.gpu-carry/bin/vflowc" \
    VFLOW_CACHE_DIR=/tmp/vc VFLOW_SOURCE_DIR="$PWD" VFLOW_TEST_DEVICES=cuda \
    timeout "${PYTEST_TIMEOUT:-200}" python3 -m pytest -q -rfE \
    -p no:cacheprovider ${PYTEST_FILES:-tests/python/test_retain.py} \
    -k "$PYTEST" >"$out/pytest.log" 2>&1 || status=1
  tail -25 "$out/pytest.log"
fi
echo "done in $(($(date +%s) - start)) s, status $status"
exit $status
