"""The compiler through the vflowc binary (not the `vflow` CLI, which is
cli.py), for builds of the package
without the compiler inside (a GPU serving machine with no LLVM): the same
calls as the extension's compile/emit/run, answered by `vflowc` (found in
$VFLOW_VFLOWC or on PATH), whose text and JSON are the same by
construction (both print through the compile API)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _vflow


def vflowc() -> Optional[str]:
    path = os.environ.get("VFLOW_VFLOWC") or shutil.which("vflowc")
    return path if path and os.access(path, os.X_OK) else None


def _invoke(args: List[str], source: str, name: str,
            params: List[Tuple[str, str]], base_dir: str,
            json_diagnostics: bool) -> Tuple[subprocess.CompletedProcess, str]:
    """Runs vflowc on `source` saved under `name`'s base name in a private
    directory (load() paths resolved from `base_dir`), returning the result
    and the directory's prefix to strip from what vflowc says."""
    exe = vflowc()
    assert exe is not None
    tmp = tempfile.mkdtemp(prefix="vflow-")
    base = os.path.basename(name) or "program.vflow"
    path = os.path.join(tmp, base)
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    cmd = [exe, *args, path, "--base-dir", os.path.abspath(base_dir or ".")]
    for k, v in params:
        cmd += ["-p", f"{k}={v}"]
    if json_diagnostics:
        cmd.append("--diagnostics=json")
    cmd.append("--diagnostics-color=never")
    env = dict(os.environ)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          cwd=base_dir or ".", env=env)
    shutil.rmtree(tmp, ignore_errors=True)
    return proc, tmp + os.sep


def _names(text: str, prefix: str, name: str) -> str:
    return text.replace(prefix + os.path.basename(name), name).replace(
        prefix, "")


def _diagnostics(source: str, name: str, params: List[Tuple[str, str]],
                 base_dir: str, args: List[str],
                 failed: subprocess.CompletedProcess,
                 prefix: str) -> Tuple[str, str]:
    """The diagnostics of the failed run `failed`: its text with carets, and
    one file entry of the JSON document (vflowc run again for it)."""
    json_proc, prefix2 = _invoke(args, source, name, params, base_dir, True)
    text = _names(failed.stderr, prefix, name)
    try:
        doc = json.loads(json_proc.stderr.strip().splitlines()[-1])
        files: List[Dict[str, Any]] = doc.get("files", [])
        entry: Dict[str, Any] = next(
            (f for f in files if f.get("file")), {"diagnostics": []})
        entry["file"] = name
        diags: List[Any] = list(entry.get("diagnostics", []))
        for f in files:  # tool errors (a bad -p) belong here too
            if f.get("file") is None:
                diags.extend(f.get("diagnostics", []))
        entry["diagnostics"] = diags
        entry_text = _names(json.dumps(entry), prefix2, name)
    except (ValueError, IndexError):
        entry_text = json.dumps({"file": name, "diagnostics": [
            {"severity": "error", "code": "E999", "message": text.strip(),
             "notes": []}]})
    return text, entry_text


def compile(source: str, name: str, params: List[Tuple[str, str]],
            base_dir: str) -> Tuple[bool, Any, str, str]:
    tmp = tempfile.mkdtemp(prefix="vflow-out-")
    out = os.path.join(tmp, "program.vfa")
    try:
        proc, prefix = _invoke(["-o", out], source, name, params, base_dir,
                               False)
        if proc.returncode == 0:
            return True, _vflow.load_artifact(out), "", ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text, doc = _diagnostics(source, name, params, base_dir, ["--emit=none"],
                             proc, prefix)
    return False, None, text, doc


def emit(source: str, name: str, stage: str, params: List[Tuple[str, str]],
         base_dir: str) -> Tuple[bool, str, str, str]:
    args = [f"--emit={stage}"] + (["--json"] if stage == "summary" else [])
    proc, prefix = _invoke(args, source, name, params, base_dir, False)
    if proc.returncode != 0:
        text, doc = _diagnostics(source, name, params, base_dir, args, proc,
                                 prefix)
        return False, "", text, doc
    out = proc.stdout
    if stage == "summary":
        out = json.dumps(json.loads(out)["programs"][0])
    return True, _names(out, prefix, name), "", ""


def run(source: str, name: str, params: List[Tuple[str, str]], base_dir: str,
        workload: Any, sweeps: Sequence[Tuple[str, List[str]]] = (),
        baseline: str = "") -> Tuple[bool, str, str]:
    # Sweeps as vflowc run's -p lists; the baseline as --baseline.
    params = list(params) + [(k, ",".join(values)) for k, values in sweeps]
    args = ["run", "--json", "--seed", str(workload.seed),
            "--seeds", str(workload.seeds),
            "--distractors", str(workload.distractors),
            "--head-spread", str(workload.head_spread),
            "--lengths", ",".join(str(n) for n in workload.lengths),
            "--kv-heads", str(workload.kv_heads), "--group", str(workload.group),
            "--head-dim", str(workload.head_dim), "--steps", str(workload.steps),
            "--needles", str(workload.needles), "--outlier", str(workload.outlier),
            "--backend", workload.backend,
            "--max-memory", str(workload.max_memory),
            "--max-work", str(workload.max_work)]
    if baseline:
        args += ["--baseline", baseline]
    proc, prefix = _invoke(args, source, name, params, base_dir, False)
    out, err = _names(proc.stdout, prefix, name), _names(proc.stderr, prefix,
                                                         name)
    try:
        json.loads(out)
    except ValueError:  # refused before any flow ran: still a report
        message = err.strip().replace("vflowc: error: ", "", 1)
        out = json.dumps({"workload": {}, "flows": [], "errors": [
            {"file": name, "flow": "", "message": message}]})
    return proc.returncode == 0, out, err
