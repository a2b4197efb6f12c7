"""Runs a notebook's code cells top to bottom in one namespace, without
Jupyter (the GPU machine has none): `python run_notebook.py NOTEBOOK`.
Exits non-zero at the first cell that raises. CI executes the notebook
with a real kernel instead (test_notebook.py)."""

from __future__ import annotations

import json
import sys


def run(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    scope: dict = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        print(f"--- cell {i}")
        exec(compile(source, f"{path}:cell-{i}", "exec"), scope)


if __name__ == "__main__":
    run(sys.argv[1])
