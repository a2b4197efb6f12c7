#!/usr/bin/env bash
# The main job: compile every stock program in examples/ to verified vt IR and
# print a summary per program (params, cache fields, states, the selection
# and the vt op counts). Extra arguments go to vflowc (e.g. --json).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/build.sh"
build="${VFLOW_BUILD_DIR:-$root/build}"
cd "$root"
exec "$build/bin/vflowc" --emit=summary examples/*.vflow "$@"
