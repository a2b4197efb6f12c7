#!/usr/bin/env bash
# Runs every test: unit tests (GoogleTest), the lit suite (dialect, passes,
# front end to vt for every example, the bad-program corpus), the fuzz
# test of the whole front end, the Python package's tests, the benchmark
# table's and the lab tools' smoke test (pytest, in .venv). Sets the
# machine up and builds first.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/build.sh"
build="${VFLOW_BUILD_DIR:-$root/build}"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
"${VFLOW_VENV:-$root/.venv}/bin/python" -m pytest -q "$root/tests/python" \
  "$root/bench/tests" "$root/lab/tests"
