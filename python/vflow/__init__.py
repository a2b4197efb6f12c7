"""vflow: write sparse-attention algorithms for a paged KV cache, compile
them, look at every stage, and run them on tensors you already have.

    import vflow
    prog = vflow.compile(open("quest.vflow").read(), params={"budget": 32})
    print(prog.ir("vt"))
    s = vflow.Session(prog, layers=1, kv_heads=8, group=4, head_dim=128,
                      max_pages=4096)

See docs/python.md.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._eval import evaluate, pareto_plot
from ._llm import LLM, EngineConfig, RequestOutput, SamplingParams
from ._program import CompileError, Program, compile, compile_file, load
from ._run import run
from ._session import Session
from ._tokenizer import Tokenizer

__all__ = [
    "CompileError",
    "EngineConfig",
    "LLM",
    "Program",
    "RequestOutput",
    "SamplingParams",
    "Session",
    "Tokenizer",
    "__version__",
    "compile",
    "compile_file",
    "evaluate",
    "load",
    "pareto_plot",
    "run",
]
