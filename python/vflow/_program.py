"""Programs: compile from a string or a file, look at every stage, save and
load artifacts."""

from __future__ import annotations

import json
import numbers
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import _check, _vflow

STAGES = ("ast", "vt", "kernels", "cpp", "cuda")


def _compiler(what: str) -> Any:
    """The compiler: inside the extension, or else the vflowc binary
    ($VFLOW_VFLOWC or on PATH) for a runtime-only build. VFLOW_COMPILER=vflowc
    picks the binary even when the extension has the compiler."""
    from . import _vflowc

    forced = os.environ.get("VFLOW_COMPILER", "")
    if forced not in ("", "vflowc", "extension"):
        raise ValueError(
            f"VFLOW_COMPILER={forced!r}: expected 'vflowc' or 'extension'"
        )
    if getattr(_vflow, "HAS_COMPILER", False) and forced != "vflowc":
        return _vflow

    if _vflowc.vflowc():
        return _vflowc
    raise RuntimeError(
        f"{what}: this build of vflow has no compiler (a runtime-only "
        "build, without LLVM/MLIR) and no vflowc was found (set VFLOW_VFLOWC);"
        " or load artifacts compiled elsewhere with vflow.load"
    )


class CompileError(Exception):
    """A program that does not compile.

    ``diagnostics`` lists every error and warning as a dict with "file",
    "line", "column", "end_line", "end_column", "severity", "code" (stable,
    e.g. "E600", docs/diagnostics.md), "message" and "notes" (each with
    "hint": True when it says what to write instead); ``str(err)`` is the
    text with carets that vflowc prints.
    """

    def __init__(self, text: str, diagnostics: List[Dict[str, Any]]):
        super().__init__(text.rstrip("\n"))
        self.text = text
        self.diagnostics = diagnostics


def _diagnostics(doc: str) -> List[Dict[str, Any]]:
    """The diagnostics of one file entry of vflowc's JSON document
    (docs/json.md), with the file named in each."""
    try:
        entry = json.loads(doc)
    except ValueError:
        return []
    out: List[Dict[str, Any]] = []
    for d in entry.get("diagnostics", []):
        out.append(
            {
                "file": entry.get("file"),
                "line": d.get("line"),
                "column": d.get("column"),
                "end_line": d.get("end_line", d.get("line")),
                "end_column": d.get("end_column", d.get("column")),
                "severity": d.get("severity", "error"),
                "code": d.get("code", "E999"),
                "message": d.get("message", ""),
                "notes": d.get("notes", []),
            }
        )
    return out


def _param_text(name: str, value: Any) -> str:
    """A param value as the compiler reads it (runtime/Params.h): a bool, a
    number, or text in the syntax of -p (blanks around it ignored, as
    vflowc -p and vflow eval -p ignore them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    if isinstance(value, str):
        return str(_vflow.split_param_spec(f"{name}={value}")[1])
    raise ValueError(
        f"param '{name}': {value!r} is not a number or a bool"
    )


def _params(params: Optional[Mapping[str, Any]]) -> List[Tuple[str, str]]:
    if params is None:
        return []
    if not isinstance(params, Mapping):
        raise ValueError("params must be a dict of name -> value")
    out = []
    for name, value in params.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"param name {name!r} is not a string")
        out.append((name, _param_text(name, value)))
    return out


def _raise_compile_error(text: str, doc: str) -> None:
    diags = _diagnostics(doc)
    # A bad -p is the caller's argument, not the program: ValueError.
    for d in diags:
        if d["severity"] == "error" and d["message"].startswith("-p "):
            raise ValueError(d["message"][3:])
    raise CompileError(text, diags)


class Program:
    """A compiled program: its flows, summary, IR at every stage, PTX and
    artifact. Made by :func:`compile`, :func:`compile_file` or :func:`load`."""

    def __init__(
        self,
        artifact: Any,
        source: Optional[str],
        name: str,
        params: Dict[str, Any],
        base_dir: str,
    ):
        self._artifact = artifact
        self._source = source
        self.name = name
        self.params = dict(params)
        self._base_dir = base_dir

    def __repr__(self) -> str:
        return f"<vflow.Program {self.name!r} flows={self.flows}>"

    @property
    def flows(self) -> List[str]:
        """The flows' names, in program order."""
        return list(self._artifact.flows)

    def _require_source(self, what: str) -> str:
        if self._source is None:
            raise ValueError(
                f"{what} needs the program's source; this program was loaded "
                "from an artifact (compile it with vflow.compile)"
            )
        return self._source

    def _emit(self, stage: str) -> str:
        source = self._require_source(f"stage '{stage}'")
        ok, text, diag_text, diag_json = _compiler(f"stage '{stage}'").emit(
            source, self.name, stage, _params(self.params), self._base_dir
        )
        if not ok:
            _raise_compile_error(diag_text, diag_json)
        return str(text)

    @property
    def summary(self) -> Dict[str, Any]:
        """What `vflowc --emit=summary --json` says of this program."""
        return json.loads(self._emit("summary"))

    def ir(self, stage: str = "vt") -> str:
        """The program at one stage: "ast", "vt" (verified vt IR), "kernels"
        (after the pass pipeline), "cpp" (the CPU backend's C++) or "cuda"
        (the GPU backend's CUDA)."""
        if stage not in STAGES:
            raise ValueError(
                f"stage: {stage!r} is not one of {', '.join(STAGES)}"
            )
        if stage in ("cpp", "cuda") and self._source is None:
            return "".join(
                self._artifact.source(f, stage) for f in self.flows
            )
        return self._emit(stage)

    def ptx(
        self,
        arch: str = "sm_90",
        *,
        flow: Optional[str] = None,
        group: int = 4,
        head_dim: int = 128,
        kv_dtype: str = "bf16",
    ) -> str:
        """PTX of a flow's kernels for one GPU architecture and shape (NVRTC,
        cached on disk as the CLI's is); needs no GPU."""
        name = flow or self.flows[0]
        group = _check.integer("group", group, low=1)
        head_dim = _check.integer("head_dim", head_dim, low=1)
        return str(_vflow.ptx(self._artifact, name, arch, group, head_dim,
                              kv_dtype))

    def save(self, path: "os.PathLike[str] | str") -> None:
        """Writes the .vfa artifact (what `vflowc -o x.vfa` writes)."""
        _vflow.save_artifact(self._artifact, _check.path("path", path))

    def with_params(self, **params: Any) -> "Program":
        """The same program compiled with these params changed."""
        source = self._require_source("with_params")
        merged = dict(self.params)
        merged.update(params)
        return _compile(source, self.name, merged, self._base_dir)

    def param_defaults(self, flow: Optional[str] = None) -> Dict[str, Any]:
        """A flow's params: name -> (type, value, compile_time)."""
        return dict(self._artifact.params(flow or self.flows[0]))


def _compile(
    source: str, name: str, params: Mapping[str, Any], base_dir: str
) -> Program:
    if not isinstance(source, str):
        raise ValueError("source must be a str (the program's text)")
    ok, artifact, diag_text, diag_json = _compiler("compile").compile(
        source, name, _params(params), base_dir
    )
    if not ok:
        _raise_compile_error(diag_text, diag_json)
    return Program(artifact, source, name, dict(params), base_dir)


def compile(
    source: str,
    *,
    params: Optional[Mapping[str, Any]] = None,
    name: str = "<string>",
) -> Program:
    """Compiles program text; `params` overrides its params (as `-p`)."""
    return _compile(source, name, params or {}, ".")


def compile_file(
    path: "os.PathLike[str] | str", *, params: Optional[Mapping[str, Any]] = None
) -> Program:
    """Reads and compiles a .vflow file (load() paths relative to it)."""
    path = _check.path("path", path)
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError as e:
        raise CompileError(
            f"error: cannot read '{path}': {e.strerror}\n",
            [
                {
                    "file": path,
                    "line": None,
                    "column": None,
                    "end_line": None,
                    "end_column": None,
                    "severity": "error",
                    "message": f"cannot read '{path}': {e.strerror}",
                    "notes": [],
                }
            ],
        ) from None
    base = os.path.dirname(path) or "."
    return _compile(source, path, params or {}, base)


def load(path: "os.PathLike[str] | str") -> Program:
    """Reads a .vfa artifact (written by Program.save or vflowc -o)."""
    path = _check.path("path", path)
    artifact = _vflow.load_artifact(path)
    return Program(artifact, None, path, {}, ".")
