"""What the GPU tests share: torch with a GPU (or None) and a stock program
from the carried artifacts (the GPU machine has no compiler) or compiled
from examples/."""

from __future__ import annotations

import os
from typing import Any

import vflow


def torch_with_gpu() -> Any:
    """torch when it is installed and sees a GPU, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def stock_program(name: str, artifacts: str) -> vflow.Program:
    """examples/NAME.vflow: ARTIFACTS/NAME.vfa when it exists, else
    compiled."""
    path = os.path.join(artifacts, name + ".vfa")
    if os.path.exists(path):
        return vflow.load(path)
    here = os.path.dirname(os.path.abspath(__file__))
    return vflow.compile_file(os.path.join(here, "..", "..", "examples",
                                           name + ".vflow"))
