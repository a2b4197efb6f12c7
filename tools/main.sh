#!/usr/bin/env bash
# The main job: compile every stock program in examples/ to verified vt IR,
# print a summary per program (params, cache fields, states, the selection and
# the vt op counts), then run every one on the synthetic long-context
# workload (docs/workload.md) and print how well its selection approximates
# dense attention next to a random and an oracle selection of the same size
# (means and standard errors over 3 seeds). Extra
# arguments go to `vflowc run` (e.g. --json, --seed 2, --lengths 16389).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/build.sh"
build="${VFLOW_BUILD_DIR:-$root/build}"
cd "$root"
"$build/bin/vflowc" --emit=summary examples/*.vflow
echo
exec "$build/bin/vflowc" run examples/*.vflow "$@"
