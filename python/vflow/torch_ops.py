"""torch.ops.vflow: vflow's GPU kernels as torch ops, for torch-based
serving engines, on the engine's own paged caches and the current stream.

    from vflow import torch_ops
    torch_ops.load()                    # builds against the installed torch
    torch.ops.vflow.write_kv(k, v, slot_pages, slot_positions, k_cache, v_cache)
    w = torch_ops.PagedDecodeWrapper()
    w.plan(indptr, pages, blocks, seq_lens, kv_heads=8, group=4, head_dim=128)
    out = w.run(q, k_cache, v_cache)    # per layer; capturable, compilable

Caches are [pages, kv_heads, page_size, head_dim] (bfloat16, float16 or
float8_e4m3fn); q and out [batch, kv_heads * group, head_dim] bfloat16;
index tensors int32 on the GPU. docs/python.md, "Torch ops".
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

_loaded = False


def _source_root() -> str:
    """Where the ops' C++/CUDA sources are: shipped in the package
    (vflow/_csrc), or a source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (
        os.environ.get("VFLOW_SOURCE_DIR", ""),
        os.path.join(here, "_csrc"),
        os.path.join(here, "..", ".."),
    ):
        if root and os.path.exists(os.path.join(root, "python", "csrc",
                                                "vflow_ops.cpp")):
            return os.path.abspath(root)
    raise RuntimeError(
        "vflow's torch op sources were not found (set VFLOW_SOURCE_DIR to a "
        "vflow checkout)"
    )


def load(verbose: bool = False) -> None:
    """Builds (once, cached by torch's extension cache) and loads the ops,
    then registers their fake kernels. Needs torch with CUDA and nvcc."""
    global _loaded
    if _loaded:
        return
    import torch
    from torch.utils import cpp_extension

    root = _source_root()
    rt = os.path.join(root, "runtime")
    cpp_extension.load(
        name="vflow_torch_ops",
        sources=[
            os.path.join(root, "python", "csrc", "vflow_ops.cpp"),
            os.path.join(rt, "cuda", "attention", "AttentionCommon.cpp"),
            os.path.join(rt, "cuda", "attention", "PagedDecode.cu"),
            os.path.join(rt, "cuda", "flow", "SessionKernels.cu"),
        ],
        extra_include_paths=[os.path.join(rt, "include"),
                             os.path.join(rt, "cuda", "attention")],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr"],
        is_python_module=False,
        verbose=verbose,
    )
    _register_fakes(torch)
    _loaded = True


def _register_fakes(torch: Any) -> None:
    @torch.library.register_fake("vflow::write_kv")
    def _write_kv(k, v, slot_pages, slot_positions, k_cache, v_cache):  # type: ignore[no-untyped-def]
        return None

    @torch.library.register_fake("vflow::paged_decode")
    def _paged_decode(q, k_cache, v_cache, indptr, pages, blocks, seq_lens,  # type: ignore[no-untyped-def]
                      scale, max_entries, lists_per_sequence, out, mass,
                      workspace):
        return None


class PagedDecodeWrapper:
    """FlashInfer-style decode attention over block lists: plan() once per
    batch composition (host side: shapes, workspace), run() per layer (one
    op, no host work: capturable in a CUDA graph, traceable by
    torch.compile).

    Lists: per (sequence, KV head) (r = b * kv_heads + h), or one per
    sequence with lists_per_sequence; entries [indptr[r], indptr[r+1]) of
    `pages` (physical page) and `blocks` (its logical block)."""

    def __init__(self) -> None:
        load()
        self._plan: Optional[dict] = None

    def plan(self, indptr: Any, pages: Any, blocks: Any, seq_lens: Any, *,
             kv_heads: int, group: int, head_dim: int,
             max_entries: Optional[int] = None,
             lists_per_sequence: bool = False,
             scale: Optional[float] = None) -> None:
        import torch

        for name, t in (("indptr", indptr), ("pages", pages),
                        ("blocks", blocks), ("seq_lens", seq_lens)):
            if not (isinstance(t, torch.Tensor) and t.is_cuda
                    and t.dtype == torch.int32):
                raise ValueError(f"{name}: expected an int32 CUDA tensor")
        batch = int(seq_lens.shape[0])
        if max_entries is None:
            counts = indptr[1:] - indptr[:-1]
            max_entries = int(counts.max().item()) if counts.numel() else 0
        nbytes = int(torch.ops.vflow.paged_decode_workspace_bytes(
            batch, kv_heads, group, head_dim, max_entries))
        self._plan = dict(
            indptr=indptr, pages=pages, blocks=blocks, seq_lens=seq_lens,
            max_entries=max_entries, lists_per_sequence=lists_per_sequence,
            scale=scale if scale is not None else 1.0 / math.sqrt(head_dim),
            workspace=torch.empty(max(nbytes, 1), dtype=torch.uint8,
                                  device=seq_lens.device),
        )

    def plan_dense(self, block_table: Any, seq_lens: Any, *, kv_heads: int,
                   group: int, head_dim: int, page_size: int,
                   scale: Optional[float] = None) -> None:
        """Dense attention: every block of each sequence ([batch,
        max_blocks] int32 block table, -1 or anything past the length
        ignored), one list per sequence."""
        import torch

        blocks_per_seq = (seq_lens.long() + page_size - 1) // page_size
        indptr = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32,
                             device=seq_lens.device)
        indptr[1:] = torch.cumsum(blocks_per_seq, 0).to(torch.int32)
        mask = (torch.arange(block_table.shape[1], device=seq_lens.device)
                [None, :] < blocks_per_seq[:, None])
        pages = block_table[mask].to(torch.int32).contiguous()
        blocks = (torch.arange(block_table.shape[1], device=seq_lens.device)
                  .expand_as(block_table)[mask].to(torch.int32).contiguous())
        self.plan(indptr, pages, blocks, seq_lens, kv_heads=kv_heads,
                  group=group, head_dim=head_dim,
                  max_entries=int(blocks_per_seq.max().item()),
                  lists_per_sequence=True, scale=scale)

    def run(self, q: Any, k_cache: Any, v_cache: Any, out: Any = None,
            mass: Any = None) -> Any:
        import torch

        if self._plan is None:
            raise RuntimeError("run() before plan()")
        p = self._plan
        if out is None:
            out = torch.empty_like(q)
        torch.ops.vflow.paged_decode(
            q, k_cache, v_cache, p["indptr"], p["pages"], p["blocks"],
            p["seq_lens"], p["scale"], p["max_entries"],
            p["lists_per_sequence"], out, mass, p["workspace"])
        return out
