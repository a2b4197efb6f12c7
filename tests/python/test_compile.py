"""The compile API: vflow.compile / compile_file / load and Program."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("compiler")

import vflow

from conftest import EXAMPLES, ROOT


def test_version_imports_from_any_directory(tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import vflow; print(vflow.__version__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == vflow.__version__
    assert vflow.__version__.count(".") == 2


def test_compile_gives_flows_summary_and_every_stage(quest_source: str) -> None:
    prog = vflow.compile(quest_source, name="quest.vflow")
    assert prog.flows == ["quest"]
    summary = prog.summary
    assert summary["flows"][0]["name"] == "quest"
    markers = {
        "ast": "Flow quest",
        "vt": "vt.flow @quest",
        "kernels": "vt.kernel",
        "cpp": "vflow_quest_",
        "cuda": "__global__",
    }
    for stage, marker in markers.items():
        text = prog.ir(stage)
        assert marker in text, stage
    with pytest.raises(ValueError, match="stage"):
        prog.ir("llvm")


def test_params_and_with_params(quest_source: str) -> None:
    prog = vflow.compile(quest_source, params={"budget": 16})
    again = prog.with_params(budget=32)
    assert prog.param_defaults()["budget"][1] == 16
    assert again.param_defaults()["budget"][1] == 32
    assert again.params == {"budget": 32}
    with pytest.raises(ValueError, match="nosuch"):
        vflow.compile(quest_source, params={"nosuch": 3})
    with pytest.raises(ValueError, match="budget"):
        vflow.compile(quest_source, params={"budget": "abc"})
    with pytest.raises(ValueError, match="budget"):
        vflow.compile(quest_source, params={"budget": [1]})


def test_compile_error_has_diagnostics_and_carets() -> None:
    with pytest.raises(vflow.CompileError) as info:
        vflow.compile("flow f {\n  index { return x; }\n}\n", name="bad.vflow")
    err = info.value
    assert "unknown name 'x'" in str(err)
    assert "^" in str(err)
    [d] = err.diagnostics
    assert d["file"] == "bad.vflow"
    assert (d["line"], d["column"]) == (2, 18)
    assert (d["end_line"], d["end_column"]) == (2, 19)
    assert d["message"] == "unknown name 'x'"
    assert d["code"] == "E200"
    assert d["notes"] == []


def test_compile_error_codes_and_fix_hints() -> None:
    # A budget only the device knows: a stable code, and a note that says
    # what to write instead.
    src = ("flow f {\n  index { return topk(position, max(position, block)); }"
           "\n}\n")
    with pytest.raises(vflow.CompileError) as info:
        vflow.compile(src)
    [d] = info.value.diagnostics
    assert d["code"] == "E600"
    hints = [n["message"] for n in d["notes"] if n["hint"]]
    assert any("threshold(score, t, max = k)" in h for h in hints)


def test_compile_file_and_missing_file(tmp_path: pathlib.Path) -> None:
    prog = vflow.compile_file(EXAMPLES / "h2o.vflow", params={"budget": 8})
    assert prog.flows == ["h2o"]
    with pytest.raises(vflow.CompileError) as info:
        vflow.compile_file(tmp_path / "none.vflow")
    assert "cannot read" in info.value.diagnostics[0]["message"]


def test_save_and_load(tmp_path: pathlib.Path, quest_source: str) -> None:
    prog = vflow.compile(quest_source)
    path = tmp_path / "quest.vfa"
    prog.save(path)
    loaded = vflow.load(path)
    assert loaded.flows == ["quest"]
    assert loaded.ir("cpp") == prog._artifact.source("quest", "cpp")
    assert "__global__" in loaded.ir("cuda")
    with pytest.raises(ValueError, match="loaded from an artifact"):
        loaded.ir("vt")
    (tmp_path / "junk.vfa").write_text("not an artifact")
    with pytest.raises(RuntimeError, match="junk.vfa"):
        vflow.load(tmp_path / "junk.vfa")


def test_ptx_without_a_gpu(quest_source: str) -> None:
    prog = vflow.compile(quest_source)
    try:
        ptx = prog.ptx("sm_90", group=4, head_dim=128)
    except RuntimeError as e:  # no NVRTC on this machine
        pytest.skip(str(e))
    assert ".entry" in ptx
    assert "sm_90" in ptx or "compute_90" in ptx
