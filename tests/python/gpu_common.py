"""What the GPU tests share: torch with a GPU (or None), a stock program
from the carried artifacts (the GPU machine has no compiler) or compiled
from examples/, and a CUDA graph of a step."""

from __future__ import annotations

import os
from typing import Any, Callable

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


def capture_graph(torch: Any, step: Callable[[], Any],
                  reset: Callable[[], None] = lambda: None) -> Any:
    """A CUDA graph of `step()` by torch's recipe: one warm-up run on a side
    stream, then the capture. `reset()` runs after each, for a step that
    changes what the next one sees."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    reset()
    return graph
