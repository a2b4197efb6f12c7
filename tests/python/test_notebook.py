"""examples/notebooks/quickstart.ipynb runs top to bottom (on the CPU),
executed by a Jupyter kernel as a user would."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES


def test_quickstart_notebook_executes() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = EXAMPLES / "notebooks" / "quickstart.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    assert "needle blocks found" in outputs
    assert "budget  64: mass recall" in outputs
    images = [o for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the recall plot was not drawn"
