"""vflow.torch_ops.load() on a package built without the torch ops (no
torch where it was built, as on the CPU machines): a clear error that says
how to get them, before torch is imported. The ops themselves are tested on
the GPU machine (test_torch_ops.py, test_flow_ops.py)."""

from __future__ import annotations

import pathlib

import pytest

from vflow import torch_ops


def test_load_without_the_library_says_how_to_build_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "libvflow_torch_ops.so")
    monkeypatch.setattr(torch_ops, "library_path", lambda: missing)
    monkeypatch.setattr(torch_ops, "_loaded", False)
    with pytest.raises(RuntimeError) as error:
        torch_ops.load()
    text = str(error.value)
    assert missing in text
    assert "built without its torch ops" in text
    assert "--no-build-isolation" in text
