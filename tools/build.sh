#!/usr/bin/env bash
# Sets the machine up if needed and builds everything (incremental, ccache),
# the Python package included.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/setup.sh"
build="${VFLOW_BUILD_DIR:-$root/build}"
jobs="${VFLOW_JOBS:-$(nproc)}"
ninja -C "$build" -j "$jobs" --quiet
# The Python package (vflow), into .venv.
"$root/tools/python.sh"
