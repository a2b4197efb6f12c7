"""The torch ops build from sources the package ships (vflow/_csrc): every
translation unit torch_ops.load() compiles, and every file they include
with quotes, is there. Runs without torch or a GPU, so a source added to
the ops (or a header one of them starts to include) but not to the
package's install rules fails here, not on a user's machine."""

from __future__ import annotations

import os
import pathlib
import re
from typing import List, Set

import pytest

from vflow import torch_ops

_QUOTED = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _missing(root: str) -> List[str]:
    sources, includes = torch_ops._sources(root)
    missing: List[str] = []
    seen: Set[str] = set()
    pending = list(sources)
    while pending:
        path = os.path.normpath(pending.pop())
        if path in seen:
            continue
        seen.add(path)
        if not os.path.isfile(path):
            missing.append(os.path.relpath(path, root))
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for name in _QUOTED.findall(text):
            candidates = [os.path.join(os.path.dirname(path), name)] + [
                os.path.join(folder, name) for folder in includes]
            found = [c for c in candidates if os.path.isfile(c)]
            if found:
                pending.append(found[0])
            else:
                missing.append(f"{name} (included by "
                               f"{os.path.relpath(path, root)})")
    return missing


def test_the_shipped_sources_are_complete() -> None:
    shipped = os.path.join(os.path.dirname(torch_ops.__file__), "_csrc")
    if not os.path.isdir(shipped):
        pytest.skip("vflow runs from a checkout: no vflow/_csrc")
    assert _missing(shipped) == []


def test_the_source_root_is_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VFLOW_SOURCE_DIR", raising=False)
    root = torch_ops._source_root()
    assert _missing(root) == []


def test_a_missing_source_is_reported(tmp_path: pathlib.Path) -> None:
    # A root with only the ops' own file: everything else is missing.
    csrc = os.path.join(str(tmp_path), "python", "csrc")
    os.makedirs(csrc)
    with open(os.path.join(csrc, "vflow_ops.cpp"), "w") as f:
        f.write('#include "vflow/Runtime/Error.h"\n')
    missing = _missing(str(tmp_path))
    assert "vflow/Runtime/Error.h (included by python/csrc/vflow_ops.cpp)" \
        in missing
    assert os.path.join("runtime", "cuda", "Launch.cpp") in missing
