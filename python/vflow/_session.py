"""Sessions: a compiled flow attached to a paged KV cache, on tensors.

Tensors are taken by DLPack, zero-copy: numpy arrays (float32, float16) or
torch tensors (float32, float16, bfloat16) on the CPU backend; torch or
CuPy CUDA tensors (bfloat16) on the CUDA backend, which queues its work on
the caller's current stream and does not wait for it on the decode path.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _check, _vflow
from ._program import Program

SeqIds = Union[int, Sequence[int]]


def _current_stream(x: Any) -> int:
    """The caller's current CUDA stream for a device tensor (0: default)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda:
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _capsule(x: Any, what: str, stream: int) -> Any:
    exporter = getattr(x, "__dlpack__", None)
    if exporter is None:
        raise ValueError(
            f"{what}: {type(x).__name__} is not a tensor (expected a numpy "
            "array, a torch tensor or another DLPack tensor)"
        )
    if stream:
        return exporter(stream=stream)
    return exporter()


def _empty_like(x: Any) -> Any:
    """An output tensor of x's library, shape, dtype and device."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return np.empty_like(x)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy.empty_like(x)
    raise ValueError(
        f"out: pass one (vflow cannot allocate a {type(x).__name__})"
    )


class Session:
    """One flow of a program over a paged KV cache of `layers` layers of
    `kv_heads` KV heads with `group` query heads each and `head_dim`;
    `max_pages` pages of the flow's block size per layer. On CUDA,
    `max_batch`, `max_sequences` and `max_blocks_per_seq` size the device
    buffers; `telemetry` keeps each decode's selection and counts the blocks
    attended (two small copies and a kernel per decode); `graph_safe` sizes
    launches so that a captured decode replays at any length. `kv_dtype`:
    "f32", "bf16", "f16", "int8", "fp8e4m3" or "fp8e5m2" (the 8-bit ones
    with a scale per token and KV head); the GPU stores "bf16", "f16",
    "int8" and "fp8e4m3", by the same rule as the CPU."""

    def __init__(
        self,
        program: Program,
        *,
        layers: int,
        kv_heads: int,
        group: int,
        head_dim: int,
        max_pages: int,
        kv_dtype: str = "bf16",
        device: str = "cpu",
        flow: Optional[str] = None,
        max_batch: int = 64,
        max_sequences: int = 64,
        max_blocks_per_seq: int = 0,
        scale: float = 0.0,
        quiet: bool = False,
        telemetry: bool = True,
        graph_safe: bool = False,
    ):
        if not isinstance(program, Program):
            raise ValueError("program: expected a vflow.Program")
        cfg = _vflow.SessionConfig()
        for name, kind in (("device", device), ("kv_dtype", kv_dtype)):
            if not isinstance(kind, str):
                raise TypeError(f"{name}: expected a str, got "
                                f"{type(kind).__name__}")
        cfg.device = device
        for name, value, high in (
            ("layers", layers, _check.INT32_MAX),
            ("kv_heads", kv_heads, _check.INT32_MAX),
            ("group", group, _check.INT32_MAX),
            ("head_dim", head_dim, _check.INT32_MAX),
            ("max_pages", max_pages, _check.INT32_MAX),
            ("max_batch", max_batch, _check.INT32_MAX),
            ("max_sequences", max_sequences, _check.INT32_MAX),
        ):
            setattr(cfg, name, _check.integer(name, value, low=1, high=high))
        cfg.max_blocks_per_seq = _check.integer(
            "max_blocks_per_seq", max_blocks_per_seq, high=_check.INT64_MAX)
        cfg.kv_dtype = kv_dtype
        cfg.scale = _check.finite("scale", scale, low=0.0)
        cfg.quiet = bool(quiet)
        cfg.telemetry = bool(telemetry)
        cfg.graph_safe = bool(graph_safe)
        self.program = program
        self.flow = flow or program.flows[0]
        self.device = device
        self.layers = layers
        self._s = _vflow.Session(program._artifact, self.flow, cfg)
        self._last_rows: Dict[int, List[int]] = {}

    def __repr__(self) -> str:
        return f"<vflow.Session flow={self.flow!r} device={self.device!r}>"

    def _layer(self, layer: Any) -> int:
        return _check.integer("layer", layer, high=self.layers - 1)

    def add_sequence(self) -> int:
        """A new, empty sequence; returns its id."""
        return int(self._s.add_sequence())

    def fork(self, seq_id: int) -> int:
        """A new sequence sharing `seq_id`'s tokens (pages shared, copy on
        write) with a copy of its states."""
        return int(self._s.fork(_seq(seq_id)))

    def share_prefix(self, seq_id: int, tokens: int) -> int:
        """A new sequence sharing `seq_id`'s first `tokens` tokens (whole
        blocks, or all of it) with fresh states: a prefix cache hit."""
        return int(self._s.share_prefix(
            _seq(seq_id), _check.integer("tokens", tokens,
                                         high=_check.INT64_MAX)))

    def release(self, seq_id: int) -> None:
        """Releases a sequence: its pages go back to the pool."""
        self._s.release(_seq(seq_id))

    def length(self, seq_id: int) -> int:
        return int(self._s.length(_seq(seq_id)))

    def evict(self, seq_id: int, blocks: Sequence[int]) -> None:
        """Evicts whole complete blocks of a sequence (logical ids, strictly
        increasing): their pages go back to the pool unless a fork or a
        prefix sharer still holds them, later blocks move down, and the
        flow's per-block states and attention mass lose their rows. K keeps
        its rotation: the next token goes at position(seq_id)."""
        self._s.evict(_seq(seq_id), _check.integers("blocks", blocks,
                                                     low=0,
                                                     high=_check.INT64_MAX))

    def evict_tokens(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Evicts single tokens (logical indices, strictly increasing, in
        complete blocks) and compacts the rest into the fewest pages: a page
        another sequence shares is copied, never rewritten; pages left empty
        return to the pool; rewritten blocks get their fields again and
        their per-block states and mass start over. Each token keeps its
        rotation and its original_position. Both devices (on CUDA the
        repack is a kernel of its own, then a wait)."""
        self._s.evict_tokens(_seq(seq_id), _check.integers(
            "tokens", tokens, low=0, high=_check.INT64_MAX))

    def free_pages(self) -> int:
        """Pages of the pool no sequence holds."""
        return int(self._s.free_pages())

    def original_position(self, seq_id: int, token: int) -> int:
        """The position the sequence's token `token` (a logical index now)
        had before anything was evicted."""
        return int(self._s.original_position(_seq(seq_id), int(token)))

    def original_block(self, seq_id: int, block: int) -> int:
        """The index the sequence's block `block` (as selections and
        evict() count them now) had before anything was evicted."""
        return int(self._s.original_block(_seq(seq_id), int(block)))

    @property
    def retained_blocks(self) -> int:
        """The complete blocks a sequence keeps at most once the flow's
        retain block evicts (its capacity, or the kept first and last
        blocks when they are more); -1 when nothing is evicted."""
        return int(self._s.retained_blocks)

    def position(self, seq_id: int) -> int:
        """The model's position of the sequence's next token: its length
        plus the tokens it evicted."""
        return int(self._s.position(_seq(seq_id)))

    def append(
        self,
        layer: int,
        seq_ids: SeqIds,
        k: Any,
        v: Any,
        lengths: Optional[Sequence[int]] = None,
    ) -> None:
        """Stores `layer`'s K/V: k and v [tokens, kv_heads, head_dim] for one
        sequence (seq_ids an int), or for several, ragged, with `lengths`
        (tokens of each, concatenated in order)."""
        layer = self._layer(layer)
        seqs = _seqs(seq_ids)
        if not _several(seq_ids):
            if lengths is not None:
                raise ValueError("lengths: only with a list of seq_ids")
            counts = [int(_extent(k, "k"))]
        else:
            if lengths is None:
                if len(seqs) != 1:
                    raise ValueError(
                        "lengths: needed with several seq_ids (tokens of each)"
                    )
                counts = [int(_extent(k, "k"))]
            else:
                counts = _check.integers("lengths", lengths,
                                         high=_check.INT64_MAX)
                if len(counts) != len(seqs):
                    raise ValueError(
                        f"lengths: {len(counts)} lengths for {len(seqs)} "
                        "sequences"
                    )
        stream = _current_stream(k)
        self._s.append(
            layer,
            seqs,
            counts,
            _capsule(k, "k", stream),
            _capsule(v, "v", stream),
            stream,
        )

    def decode(
        self, layer: int, seq_ids: SeqIds, q: Any, out: Any = None
    ) -> Any:
        """One decode step at `layer` for `seq_ids`: q [batch, kv_heads *
        group, head_dim] -> out of the same shape (allocated like q unless
        given)."""
        layer = self._layer(layer)
        seqs = _seqs(seq_ids)
        if out is None:
            out = _empty_like(q)
        stream = _current_stream(q)
        self._s.decode(
            layer,
            seqs,
            _capsule(q, "q", stream),
            _capsule(out, "out", stream),
            stream,
        )
        self._last_rows[layer] = seqs
        return out

    def selection(self, seq_id: int, layer: int) -> List[List[int]]:
        """The blocks `seq_id` attended at its last decode at `layer`: per KV
        head, logical block ids ascending."""
        seq_id, layer = _seq(seq_id), self._layer(layer)
        rows = self._last_rows.get(layer)
        if rows is None or seq_id not in rows:
            raise ValueError(
                f"seq_id: sequence {seq_id} was not in the last decode at "
                f"layer {layer}"
            )
        lists = self._s.selection(layer)
        return [list(h) for h in lists[rows.index(seq_id)]]

    def set_params(self, **params: Any) -> None:
        """Sets run-time params (budget, ...): no recompile. A param that is
        unknown or compile-time, or a value out of range, is a ValueError
        naming it; nothing is changed then."""
        old = {}
        try:
            for name, value in params.items():
                if isinstance(value, bool):
                    value = 1.0 if value else 0.0
                if not isinstance(value, (int, float)):
                    raise ValueError(f"param '{name}': {value!r} is not a number")
                try:
                    old[name] = self._s.param(name)
                    self._s.set_param(name, float(value))
                except RuntimeError as e:
                    raise ValueError(f"param '{name}': {e}") from None
        except ValueError:
            for name, value in old.items():
                self._s.set_param(name, value)
            raise

    def param(self, name: str) -> float:
        try:
            return float(self._s.param(name))
        except RuntimeError as e:
            raise ValueError(f"param '{name}': {e}") from None

    def budget(self, seq_id: int) -> int:
        """Blocks the flow selects for `seq_id` now (kept blocks aside)."""
        return int(self._s.budget(_seq(seq_id)))

    def stats(self) -> Dict[str, Any]:
        """Decodes, block lists and blocks attended, bytes read, times."""
        return dict(self._s.stats())


def _seq(seq_id: Any, name: str = "seq_id") -> int:
    return _check.integer(name, seq_id, high=_check.INT64_MAX)


def _several(seq_ids: Any) -> bool:
    return hasattr(seq_ids, "__len__") and not isinstance(seq_ids, str)


def _seqs(seq_ids: Any) -> List[int]:
    """One sequence id (an int) or a non-empty list of them."""
    if _several(seq_ids):
        seqs = [_seq(s, f"seq_ids[{i}]") for i, s in enumerate(seq_ids)]
        if not seqs:
            raise ValueError("seq_ids: no sequences given")
        return seqs
    return [_seq(seq_ids, "seq_ids")]


def _extent(x: Any, what: str) -> int:
    if getattr(x, "__dlpack__", None) is None:
        raise ValueError(
            f"{what}: {type(x).__name__} is not a tensor (expected a numpy "
            "array, a torch tensor or another DLPack tensor)"
        )
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(f"{what}: expected a [tokens, kv_heads, head_dim] tensor")
    return int(shape[0])
