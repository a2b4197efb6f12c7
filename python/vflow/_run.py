"""vflow.run: `vflowc run --json` in process, for agent loops."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Mapping, Optional, Union

from . import _check, _vflow
from ._program import Program, _compiler, _params

# Workload options -> how each is checked before the extension sees it (the
# C++ WorkloadSpec's types; WorkloadSpec::validate checks the ranges).
_OPTIONS: Dict[str, Callable[[str, Any], Any]] = {
    "seed": lambda n, v: _check.integer(n, v, high=_check.UINT64_MAX),
    "seeds": _check.integer,
    "distractors": _check.finite,
    "head_spread": _check.finite,
    "lengths": lambda n, v: _check.integers(n, v, high=_check.INT64_MAX),
    "kv_heads": _check.integer,
    "group": _check.integer,
    "head_dim": _check.integer,
    "steps": _check.integer,
    "needles": _check.integer,
    "outlier": _check.finite,
    "backend": lambda n, v: v,
    "max_memory": _check.finite,
    "max_work": _check.finite,
}


def run(
    program_or_path: Union[Program, str, "os.PathLike[str]"],
    *,
    params: Optional[Mapping[str, Any]] = None,
    baseline: Optional[str] = None,
    **workload: Any,
) -> Dict[str, Any]:
    """Runs every flow of a program on vflowc run's synthetic workload and
    returns its JSON report as Python objects: {"workload", "flows",
    "errors"}. `program_or_path` is a Program (compiled from source), a
    .vflow path, or program text. Workload options are vflowc run's:
    seed, seeds (workloads averaged, with standard errors), lengths (a
    list), kv_heads, group, head_dim, steps, needles, distractors, head_spread, outlier,
    backend ("cpu" or "cuda"), max_memory (GiB), max_work.
    A param given a list of values is swept, as `vflowc run -p
    budget=16,32`: every flow runs at each point of the lists' product.
    `baseline`: a flow of the program every row is compared with, seed by
    seed (each row's "vs_baseline", as `vflowc run --baseline`).
    A flow that cannot run is in "errors", never only raised."""
    compiler = _compiler("vflow.run")
    if isinstance(program_or_path, Program):
        prog = program_or_path
        source = prog._require_source("vflow.run")
        name, base, merged = prog.name, prog._base_dir, dict(prog.params)
    else:
        path = os.fspath(program_or_path)
        if "\n" not in path and path.endswith(".vflow"):
            with open(path, encoding="utf-8") as f:
                source = f.read()
            name, base = path, os.path.dirname(path) or "."
        else:
            source, name, base = path, "<string>", "."
        merged = {}
    merged.update(params or {})
    spec = _vflow.Workload()
    for key, value in workload.items():
        if key not in _OPTIONS:
            raise ValueError(
                f"{key}: not a workload option (expected one of "
                f"{', '.join(sorted(_OPTIONS))})"
            )
        try:
            setattr(spec, key, _OPTIONS[key](key, value))
        except TypeError as e:
            raise ValueError(str(e)) from None
    if baseline is not None and (not isinstance(baseline, str)
                                 or not baseline):
        raise ValueError("baseline: expected the name of a flow")
    fixed = {k: v for k, v in merged.items()
             if not isinstance(v, (list, tuple))}
    try:
        param_list = _params(fixed)
        # Each swept value as the text -p would take (the same checks).
        sweeps = [(key, [_params({key: v})[0][1] for v in value])
                  for key, value in merged.items()
                  if isinstance(value, (list, tuple))]
    except ValueError as e:
        return {
            "workload": {},
            "flows": [],
            "errors": [{"file": name, "flow": "", "message": str(e)}],
        }
    for key, values in sweeps:
        if not values:
            raise ValueError(f"params: {key}: an empty list of values")
    ok, text, _diag_text = compiler.run(source, name, param_list, base, spec,
                                        sweeps, baseline or "")
    return json.loads(text)
