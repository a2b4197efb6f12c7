#!/usr/bin/env bash
# Installs the vflow Python package into the virtual environment .venv
# (created on first use; Debian refuses system-wide pip installs), with the
# build tools and test dependencies (pytest; Jupyter's kernel and client and
# matplotlib for the quickstart notebook's test), tokenizers and jinja2
# for the serving engine's tokenizer (vflow/_tokenizer.py), and vflow
# serve's stack (fastapi, uvicorn, prometheus_client; the openai client for
# its tests), and mypy (the package's types are a test). The extension
# builds incrementally in build/python (and through ccache), so a second run
# only repackages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${VFLOW_VENV:-$root/.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
need=()
for mod in scikit_build_core pybind11 numpy pytest matplotlib nbclient \
  nbformat ipykernel tokenizers jinja2 fastapi uvicorn prometheus_client \
  openai mypy; do
  "$py" -c "import $mod" 2>/dev/null || need+=("$mod")
done
if ((${#need[@]})); then
  echo "python: installing ${need[*]} into $venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q scikit-build-core pybind11 numpy pytest \
    matplotlib nbclient nbformat ipykernel tokenizers jinja2 fastapi uvicorn \
    prometheus_client openai mypy
fi
CMAKE_BUILD_PARALLEL_LEVEL="${VFLOW_JOBS:-$(nproc)}" \
  "$py" -m pip install -q --no-build-isolation --no-deps "$root"
