"""torch.ops.vflow: vflow's GPU kernels as torch ops, for torch-based
serving engines, on the engine's own paged caches and the current stream.

    from vflow import torch_ops
    torch_ops.load()                    # built by CMake with the package
    torch.ops.vflow.write_kv(k, v, slot_pages, slot_positions, k_cache, v_cache)
    w = torch_ops.PagedDecodeWrapper()
    w.plan(indptr, pages, blocks, seq_lens, kv_heads=8, group=4, head_dim=128)
    out = w.run(q, k_cache, v_cache)    # per layer; capturable, compilable

    flow = torch_ops.Flow(program, group=4, head_dim=128)   # a flow's kernels
    fw = torch_ops.FlowDecodeWrapper(flow)
    fw.plan(seq_lens, block_table, slots, steps, kv_heads=8)
    out = fw.run(q, k_cache, v_cache, fields, states, mass)  # index + attend

Caches are [pages, kv_heads, page_size, head_dim] (bfloat16, float16 or
float8_e4m3fn); q and out [batch, kv_heads * group, head_dim] bfloat16;
index tensors int32 on the GPU. docs/python.md, "Torch ops".
"""

from __future__ import annotations

import math
import os
from typing import Any, List, Optional, Tuple

from . import _check

_loaded = False


_LIBRARY = "libvflow_torch_ops.so"


def library_path() -> str:
    """Where the built ops are: next to this module (CMake builds and
    installs them with the package when its Python imports torch)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY)


def load() -> None:
    """Loads the ops (built by CMake with the package) into torch, then
    registers their fake kernels. Needs torch, the version they were built
    against, with CUDA."""
    global _loaded
    if _loaded:
        return
    path = library_path()
    if not os.path.isfile(path):
        raise RuntimeError(
            f"vflow was built without its torch ops ({path} does not "
            "exist): they are built when the Python that builds vflow "
            "imports torch with CUDA; install torch, then reinstall vflow "
            "with `pip install --no-build-isolation .` (docs/python.md, "
            "\"Torch ops\")")
    import torch

    try:
        from . import _torch_build  # type: ignore[attr-defined]
        built = _torch_build.TORCH_VERSION
    except ImportError:
        built = None
    if built is not None and built != torch.__version__:
        raise RuntimeError(
            f"vflow's torch ops were built against torch {built}, but this "
            f"process imported torch {torch.__version__}: reinstall vflow "
            "with this torch (`pip install --no-build-isolation .`)")
    torch.ops.load_library(path)
    _register_fakes(torch)
    _loaded = True


def _register_fakes(torch: Any) -> None:
    @torch.library.register_fake("vflow::write_kv")
    def _write_kv(k, v, slot_pages, slot_positions, k_cache, v_cache):  # type: ignore[no-untyped-def]
        return None

    @torch.library.register_fake("vflow::paged_decode")
    def _paged_decode(q, k_cache, v_cache, indptr, pages, blocks, seq_lens,  # type: ignore[no-untyped-def]
                      scale, max_entries, lists_per_sequence, out, mass,
                      workspace, count=None):
        return None

    @torch.library.register_fake("vflow::carry_mass")
    def _carry_mass(mass_rows, mass, slots, seq_lens, page_size):  # type: ignore[no-untyped-def]
        return None

    @torch.library.register_fake("vflow::flow_cache_update")
    def _flow_cache_update(flow, k, v, slot_pages, slot_positions,  # type: ignore[no-untyped-def]
                           completed_pages, k_cache, v_cache, fields,
                           workspace):
        return None

    @torch.library.register_fake("vflow::flow_index")
    def _flow_index(flow, q, k_cache, v_cache, fields, states_old,  # type: ignore[no-untyped-def]
                    states_new, mass, seq_lens, block_table, slots, steps,
                    indptr, count, pages, blocks, workspace, k_new=None,
                    v_new=None, layer=0, kv_head_base=0):
        return None

    @torch.library.register_fake("vflow::flow_decode_layer")
    def _flow_decode_layer(flow, q, k_cache, v_cache, fields, states_old,  # type: ignore[no-untyped-def]
                           states_new, mass, seq_lens, block_table, slots,
                           steps, indptr, count, pages, blocks, workspace,
                           scale, max_entries, out, mass_rows, attn_workspace,
                           k_new=None, v_new=None, layer=0, kv_head_base=0):
        return None


def _int32_cuda(torch: Any, **tensors: Any) -> None:
    """Raises ValueError naming the first of `tensors` that is not an int32
    CUDA tensor."""
    for name, t in tensors.items():
        if not (isinstance(t, torch.Tensor) and t.is_cuda
                and t.dtype == torch.int32):
            raise ValueError(f"{name}: expected an int32 CUDA tensor")


def _extremes(torch: Any, **tensors: Any) -> dict:
    """Each tensor's (min, max), None for an empty one, in one read from
    the device (the plan's only host wait)."""
    parts, names = [], []
    for name, t in tensors.items():
        if t.numel():
            parts += [t.min().long(), t.max().long()]
            names.append(name)
    values = torch.stack(parts).tolist() if parts else []
    out: dict = {name: None for name in tensors}
    for i, name in enumerate(names):
        out[name] = (values[2 * i], values[2 * i + 1])
    return out


def _check_lists(torch: Any, indptr: Any, pages: Any, blocks: Any,
                 seq_lens: Any) -> Tuple[int, int]:
    """What the kernels read as indices, checked once per plan (the kernels
    stop on an index outside its pool, IndexCheck.cuh, but a plan's error
    says more and leaves the CUDA context usable): returns the longest list
    and the largest page id."""
    if indptr.numel() < 1:
        raise ValueError("indptr: needs at least one entry")
    counts = indptr[1:] - indptr[:-1]
    x = _extremes(torch, first=indptr[:1], last=indptr[-1:], counts=counts,
                  pages=pages, blocks=blocks, seq_lens=seq_lens)
    if x["first"][0] != 0:
        raise ValueError(f"indptr: starts at {x['first'][0]}, not 0")
    if x["counts"] is not None and x["counts"][0] < 0:
        raise ValueError("indptr: decreases (a list would have "
                         f"{x['counts'][0]} entries)")
    if x["last"][0] > pages.numel():
        raise ValueError(f"indptr: ends at {x['last'][0]}, past the "
                         f"{pages.numel()} entries of pages")
    for name in ("pages", "blocks", "seq_lens"):
        if x[name] is not None and x[name][0] < 0:
            raise ValueError(f"{name}: holds {x[name][0]}; entries must be "
                             ">= 0")
    longest = x["counts"][1] if x["counts"] is not None else 0
    return longest, x["pages"][1] if x["pages"] is not None else -1


def _dims(**sizes: Any) -> Tuple[int, ...]:
    """Sizes (>= 1) as the ops take them, checked before torch sees them: a
    ValueError or TypeError naming the argument."""
    return tuple(_check.integer(name, value, low=1,
                                high=_check.INT32_MAX)
                 for name, value in sizes.items())


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
        kv_heads, group, head_dim = _dims(kv_heads=kv_heads, group=group,
                                          head_dim=head_dim)
        if max_entries is not None:
            max_entries = _check.integer("max_entries", max_entries,
                                         high=_check.INT64_MAX)
        if scale is not None:
            scale = _check.finite("scale", scale)
        import torch

        _int32_cuda(torch, indptr=indptr, pages=pages, blocks=blocks,
                    seq_lens=seq_lens)
        batch = int(seq_lens.shape[0])
        longest, max_page = _check_lists(torch, indptr, pages, blocks,
                                         seq_lens)
        if max_entries is None:
            max_entries = longest
        elif longest > max_entries:
            raise ValueError(f"max_entries: {max_entries}, but a list holds "
                             f"{longest} entries")
        nbytes = int(torch.ops.vflow.paged_decode_workspace_bytes(
            batch, kv_heads, group, head_dim, max_entries))
        self._plan = dict(
            indptr=indptr, pages=pages, blocks=blocks, seq_lens=seq_lens,
            max_entries=max_entries, lists_per_sequence=lists_per_sequence,
            max_page=max_page,
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
        (page_size,) = _dims(page_size=page_size)
        import torch

        for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
            if not (isinstance(t, torch.Tensor) and t.is_cuda
                    and t.dtype == torch.int32):
                raise ValueError(f"{name}: expected an int32 CUDA tensor")
        if block_table.dim() != 2 or seq_lens.dim() != 1 or (
                block_table.shape[0] != seq_lens.shape[0]):
            raise ValueError("block_table: expected [batch, max_blocks] with "
                             "a row per seq_lens entry")
        x = _extremes(torch, seq_lens=seq_lens)["seq_lens"]
        if x is not None and x[0] < 0:
            raise ValueError(f"seq_lens: holds {x[0]}; lengths must be >= 0")
        if x is not None and x[1] > block_table.shape[1] * page_size:
            raise ValueError(
                f"seq_lens: {x[1]} tokens need more than the "
                f"{block_table.shape[1]} blocks of block_table")
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
                  lists_per_sequence=True, scale=scale)

    def run(self, q: Any, k_cache: Any, v_cache: Any, out: Any = None,
            mass: Any = None, count: Any = None) -> Any:
        import torch

        if self._plan is None:
            raise RuntimeError("run() before plan()")
        p = self._plan
        if isinstance(k_cache, torch.Tensor) and k_cache.dim() >= 1 and (
                p["max_page"] >= k_cache.shape[0]):
            raise ValueError(f"pages: holds page {p['max_page']}, past the "
                             f"{k_cache.shape[0]} pages of k_cache")
        if out is None:
            out = torch.empty_like(q)
        torch.ops.vflow.paged_decode(
            q, k_cache, v_cache, p["indptr"], p["pages"], p["blocks"],
            p["seq_lens"], p["scale"], p["max_entries"],
            p["lists_per_sequence"], out, mass, p["workspace"], count)
        return out


_TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16",
                 "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}


class Flow:
    """One flow of a vflow.Program with its generated kernels on the
    current CUDA device, specialized to (group, head_dim, kv_dtype), for
    the flow ops. The engine owns every tensor; new_fields, new_states and
    new_mass allocate them as the ops expect (fields per page of a layer's
    cache, states and mass per state slot, for block tables of `max_blocks`
    columns)."""

    def __init__(self, program: Any, flow: Optional[str] = None, *,
                 group: int, head_dim: int, kv_dtype: str = "bf16",
                 quiet: bool = True) -> None:
        from ._program import Program
        from . import _vflow

        if not isinstance(program, Program):
            raise ValueError("program: expected a vflow.Program")
        group, head_dim = _dims(group=group, head_dim=head_dim)
        if not hasattr(_vflow, "CudaFlow"):
            raise RuntimeError("this vflow was built without CUDA")
        load()
        self.name = flow or program.flows[0]
        self._flow = _vflow.CudaFlow(program._artifact, self.name, group,
                                     head_dim, kv_dtype, quiet)
        self.group, self.head_dim, self.kv_dtype = group, head_dim, kv_dtype
        self.handle: int = self._flow.handle
        import torch

        torch.ops.vflow._register_flow(self.handle, True)
        self.block_size: int = self._flow.block_size
        self.reads_mass: bool = self._flow.reads_mass
        self.reads_layer: bool = self._flow.reads_layer
        self.reads_kv_head: bool = self._flow.reads_kv_head
        self.fields: list = self._flow.fields
        self.states: list = self._flow.states

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                import torch

                torch.ops.vflow._register_flow(handle, False)
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self) -> str:
        return (f"<vflow.torch_ops.Flow {self.name!r} group={self.group} "
                f"head_dim={self.head_dim} kv_dtype={self.kv_dtype!r}>")

    def set_param(self, name: str, value: float) -> None:
        """Sets a run-time param (read by the kernels at their next
        launch, so also by CUDA graphs captured before)."""
        self._flow.set_param(name, _check.finite(name, value))

    def param(self, name: str) -> float:
        return float(self._flow.param(name))

    def set_budget_scope(self, first_layer: int, num_layers: int,
                         first_kv_head: int = 0,
                         num_kv_heads: int = 1) -> None:
        """The model's layers [first_layer, first_layer + num_layers) and KV
        heads [first_kv_head, first_kv_head + num_kv_heads) this flow runs
        for (a tensor-parallel rank's slice). A budget that reads `layer` or
        `kv_head` is checked at each and bounded by the largest
        (max_entries); a run outside them is refused. Until set: layer 0,
        KV head 0."""
        first_layer, first_kv_head = (
            _check.integer(n, v, low=0, high=_check.INT32_MAX)
            for n, v in (("first_layer", first_layer),
                         ("first_kv_head", first_kv_head)))
        num_layers, num_kv_heads = _dims(num_layers=num_layers,
                                         num_kv_heads=num_kv_heads)
        self._flow.set_budget_scope(first_layer, num_layers, first_kv_head,
                                    num_kv_heads)

    def max_entries(self, length: int) -> int:
        """The most blocks a step's list holds at `length` tokens (the
        budget, kept blocks and the partial last block)."""
        return int(self._flow.max_entries(
            _check.integer("length", length, high=_check.INT64_MAX)))

    def workspace_bytes(self, batch: int, kv_heads: int,
                        max_blocks: int) -> int:
        batch = _check.integer("batch", batch, high=_check.INT64_MAX)
        kv_heads, max_blocks = _dims(kv_heads=kv_heads, max_blocks=max_blocks)
        import torch

        return int(torch.ops.vflow.flow_workspace_bytes(
            self.handle, batch, kv_heads, max_blocks))

    def new_fields(self, num_pages: int, kv_heads: int,
                   device: Any = "cuda") -> List[Any]:
        """One layer's fields: [num_pages, kv_heads, elements] each."""
        num_pages, kv_heads = _dims(num_pages=num_pages, kv_heads=kv_heads)
        import torch

        return [torch.zeros(num_pages, kv_heads, f["elements"],
                            dtype=getattr(torch, _TORCH_DTYPES[f["dtype"]]),
                            device=device) for f in self.fields]

    def new_states(self, num_slots: int, kv_heads: int, max_blocks: int,
                   device: Any = "cuda") -> Tuple[List[Any], List[Any]]:
        """One layer's states (old, new): f32 [num_slots, kv_heads, n] at
        their initial values."""
        num_slots, kv_heads, max_blocks = _dims(
            num_slots=num_slots, kv_heads=kv_heads, max_blocks=max_blocks)
        import torch

        old: List[Any] = []
        new: List[Any] = []
        for s in self.states:
            n = s["elements"] * (max_blocks if s["per_block"] else 1)
            for out in (old, new):
                out.append(torch.full((num_slots, kv_heads, n), s["init"],
                                      dtype=torch.float32, device=device))
        return old, new

    def new_mass(self, num_slots: int, kv_heads: int, max_blocks: int,
                 device: Any = "cuda") -> Any:
        """One layer's attention mass per slot, or None when the flow does
        not read it."""
        num_slots, kv_heads, max_blocks = _dims(
            num_slots=num_slots, kv_heads=kv_heads, max_blocks=max_blocks)
        import torch

        if not self.reads_mass:
            return None
        return torch.zeros(num_slots, kv_heads, max_blocks, self.group,
                           dtype=torch.float32, device=device)

    def reset(self, states: Tuple[List[Any], List[Any]], mass: Any,
              slots: Any) -> None:
        """A new sequence in each of `slots`: its states at their initial
        values, no attention mass yet."""
        for i, s in enumerate(self.states):
            for t in (states[0][i], states[1][i]):
                t[slots] = s["init"]
        if mass is not None:
            mass[slots] = 0.0

    def cache_update(self, k: Any, v: Any, slot_pages: Any,
                     slot_positions: Any, completed_pages: Any, k_cache: Any,
                     v_cache: Any, fields: List[Any],
                     workspace: Any = None) -> None:
        """Writes tokens (k, v bf16 [tokens, kv_heads, head_dim]) at (page,
        position), then the flow's fields of the pages in
        `completed_pages` (int32: pages whose every token is written)."""
        import torch

        if workspace is None:
            workspace = torch.empty(self.workspace_bytes(0, 1, 1),
                                    dtype=torch.uint8, device=k.device)
        torch.ops.vflow.flow_cache_update(
            self.handle, k, v, slot_pages, slot_positions, completed_pages,
            k_cache, v_cache, fields, workspace)


class FlowDecodeWrapper:
    """A flow's index stage and sparse paged attention, FlashInfer-style:
    plan() once per batch composition (host side: list capacities,
    workspaces, the attention's split plan), run() per layer (one op,
    vflow::flow_decode_layer, the decode layer vflow's own session runs;
    no host work: capturable in a CUDA graph, traceable by torch.compile).

    seq_lens (this step's token included), block_table [batch, max_blocks],
    slots (each row's state slot) and steps (decode steps each row has
    taken) are int32 CUDA tensors the engine owns and updates in place
    between steps; `max_length` bounds the lengths the plan serves
    (default: the longest now). `share`: another plan of the same flow with
    at least as many rows, whose list and workspace buffers this one uses
    (plans for several batch sizes, run one at a time, in one allocation)."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self._plan: Optional[dict] = None

    def plan(self, seq_lens: Any, block_table: Any, slots: Any, steps: Any,
             *, kv_heads: int, max_length: Optional[int] = None,
             scale: Optional[float] = None,
             share: Optional["FlowDecodeWrapper"] = None) -> None:
        (kv_heads,) = _dims(kv_heads=kv_heads)
        if max_length is not None:
            max_length = _check.integer("max_length", max_length,
                                        high=_check.INT64_MAX)
        if scale is not None:
            scale = _check.finite("scale", scale)
        import torch

        _int32_cuda(torch, seq_lens=seq_lens, block_table=block_table,
                    slots=slots, steps=steps)
        if block_table.dim() != 2:
            raise ValueError("block_table: expected [batch, max_blocks]")
        batch, max_blocks = int(block_table.shape[0]), int(block_table.shape[1])
        if max_length is None:
            max_length = int(seq_lens.max().item()) if batch else 0
        if max_length > max_blocks * self.flow.block_size:
            raise ValueError(
                f"max_length: {max_length} tokens need more than the "
                f"{max_blocks} blocks of block_table")
        lists, dev = batch * kv_heads, seq_lens.device
        max_entries = self.flow.max_entries(max_length)
        attn = int(torch.ops.vflow.paged_decode_workspace_bytes(
            batch, kv_heads, self.flow.group, self.flow.head_dim,
            max_entries))
        work = self.flow.workspace_bytes(batch, kv_heads, max_blocks)
        mass_shape = (batch, kv_heads, max_blocks, self.flow.group)
        # Every list may hold every block: a selection never overflows.
        sizes = dict(count=lists, pages=lists * max_blocks,
                     blocks=lists * max_blocks, workspace=work,
                     attn_workspace=max(attn, 1))
        given = share._plan if share is not None else None
        if share is not None and (
                given is None or share.flow is not self.flow
                or given["block_table"].shape[1] != max_blocks
                or any(given[k].numel() < n for k, n in sizes.items())):
            raise ValueError("share: expected a plan of the same flow with "
                             "as many block-table columns and at least as "
                             "many rows and list entries")

        def buffer(name: str, dtype: Any) -> Any:
            if given is not None:
                return given[name][:sizes[name]]
            return torch.zeros(sizes[name], dtype=dtype, device=dev)

        mass_rows = None
        if self.flow.reads_mass:
            mass_rows = (given["mass_rows"][:batch] if given is not None
                         else torch.zeros(mass_shape, dtype=torch.float32,
                                          device=dev))
        self._plan = dict(
            seq_lens=seq_lens, block_table=block_table, slots=slots,
            steps=steps, max_entries=max_entries,
            scale=(scale if scale is not None
                   else 1.0 / math.sqrt(self.flow.head_dim)),
            indptr=torch.arange(lists + 1, dtype=torch.int32,
                                device=dev) * max_blocks,
            count=buffer("count", torch.int32),
            pages=buffer("pages", torch.int32),
            blocks=buffer("blocks", torch.int32),
            workspace=buffer("workspace", torch.uint8),
            attn_workspace=buffer("attn_workspace", torch.uint8),
            mass_rows=mass_rows,
        )

    def run(self, q: Any, k_cache: Any, v_cache: Any, fields: List[Any],
            states: Tuple[List[Any], List[Any]], mass: Any = None,
            k_new: Any = None, v_new: Any = None, out: Any = None, *,
            layer: Optional[int] = None, kv_head_base: int = 0) -> Any:
        """One layer: the flow selects each (row, KV head)'s blocks (with
        k_new/v_new [batch, kv_heads, head_dim]: this step's token is
        written first, completing blocks' fields included), attention over
        them writes `out`, and for a flow that reads it, the mass moves to
        the rows' slots. `layer` (the model's index; required when the flow
        reads `layer`) and `kv_head_base` (the model's index of k_cache's
        first KV head) are the flow's inputs `layer` and `kv_head`."""
        import torch

        if self._plan is None:
            raise RuntimeError("run() before plan()")
        if layer is None:
            if self.flow.reads_layer:
                raise ValueError(
                    f"layer: flow {self.flow.name!r} reads 'layer'; pass the "
                    "model's index of the layer this run is for")
            layer = 0
        layer = _check.integer("layer", layer, low=0, high=_check.INT32_MAX)
        kv_head_base = _check.integer("kv_head_base", kv_head_base, low=0,
                                      high=_check.INT32_MAX)
        p = self._plan
        if out is None:
            out = torch.empty_like(q)
        torch.ops.vflow.flow_decode_layer(
            self.flow.handle, q, k_cache, v_cache, fields, states[0],
            states[1], mass, p["seq_lens"], p["block_table"], p["slots"],
            p["steps"], p["indptr"], p["count"], p["pages"], p["blocks"],
            p["workspace"], p["scale"], p["max_entries"], out,
            p["mass_rows"], p["attn_workspace"], k_new, v_new, layer,
            kv_head_base)
        return out

    def selection(self) -> Tuple[Any, Any, Any, Any]:
        """The last run's block lists: (indptr, count, pages, blocks); list
        r = row * kv_heads + head holds count[r] entries from indptr[r]."""
        if self._plan is None:
            raise RuntimeError("selection() before plan()")
        p = self._plan
        return p["indptr"], p["count"], p["pages"], p["blocks"]
