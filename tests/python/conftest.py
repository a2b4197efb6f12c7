"""Shared fixtures: the repository's example programs."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def quest_source() -> str:
    return (EXAMPLES / "quest.vflow").read_text()


@pytest.fixture(params=["extension", "vflowc"])
def compiler(request: pytest.FixtureRequest,
             monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the compiler in the extension and again through the
    vflowc binary (what a runtime-only build uses)."""
    if request.param == "vflowc":
        exe = ROOT / "build" / "bin" / "vflowc"
        if not exe.exists():
            pytest.skip("vflowc is not built in build/")
        monkeypatch.setenv("VFLOW_COMPILER", "vflowc")
        monkeypatch.setenv("VFLOW_VFLOWC", str(exe))
    return str(request.param)
