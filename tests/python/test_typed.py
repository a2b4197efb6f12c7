"""The package is typed: mypy finds no error in python/vflow (its
annotations, and the extension's type declarations in _vflow.pyi against
their use)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_finds_no_error() -> None:
    pytest.importorskip("mypy")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports",
         "--cache-dir", str(ROOT / "build" / "mypy-cache"),
         str(ROOT / "python" / "vflow")],
        capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
