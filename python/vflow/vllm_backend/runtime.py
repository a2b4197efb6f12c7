"""The vflow side of the backend in one vLLM worker process: the compiled
flow on this GPU, each layer's fields (per physical block), states and
attention mass (per request slot), the per-slot decode-step counters, and
the request lifecycle vLLM reports (lifecycle.py).

Slots: vLLM's Model Runner V2 gives each running request a stable index
(`req_idx`, 0 .. max_num_seqs-1) from its add to its finish or preemption;
that index is the request's vflow state slot. Slot `max_num_seqs` is the
scratch slot of padding rows and of graph-capture batches."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import torch_ops
from .config import ConfigError, VflowConfig


@dataclass
class LayerBuffers:
    fields: List[torch.Tensor]
    states: Tuple[List[torch.Tensor], List[torch.Tensor]]
    mass: Optional[torch.Tensor]
    workspace: torch.Tensor


@dataclass(frozen=True)
class ModelShape:
    """What the backend needs to know of the model and vLLM's limits, in
    this worker (one tensor-parallel rank)."""

    num_layers: int
    kv_heads: int  # this rank's
    total_kv_heads: int
    tensor_parallel: int
    max_model_len: int
    max_seqs: int  # request slots (vLLM's max_num_seqs)
    max_rows: int  # decode rows a step may have (padded for graphs)
    max_tokens: int = 8192  # tokens a step may have (max_num_batched_tokens)
    v2_runner: bool = True
    tp_rank: int = 0  # this worker's tensor-parallel rank

    @classmethod
    def of(cls, vllm_config: Any) -> "ModelShape":
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        seqs = int(vllm_config.scheduler_config.max_num_seqs)
        sizes = vllm_config.compilation_config.cudagraph_capture_sizes or []
        return cls(num_layers=model.get_num_layers(parallel),
                   kv_heads=model.get_num_kv_heads(parallel),
                   total_kv_heads=model.get_total_num_kv_heads(),
                   tensor_parallel=parallel.tensor_parallel_size,
                   max_model_len=int(model.max_model_len), max_seqs=seqs,
                   max_rows=max([seqs] + [int(n) for n in sizes]),
                   max_tokens=int(
                       vllm_config.scheduler_config.max_num_batched_tokens),
                   v2_runner=bool(vllm_config.use_v2_model_runner),
                   tp_rank=_tp_rank(parallel.tensor_parallel_size))


class Runtime:
    """One per worker process (each tensor-parallel rank has its own)."""

    def __init__(self, cfg: VflowConfig, shape: ModelShape) -> None:
        self.cfg = cfg
        self.shape = shape
        self.program = cfg.program()
        self.flow_name = cfg.flow_name or self.program.flows[0]
        self.num_layers = shape.num_layers
        self.dense_layers = (cfg.dense_layers if cfg.dense_layers is not None
                             else _default_dense_layers())
        tp, total_kv = shape.tensor_parallel, shape.total_kv_heads
        if tp > total_kv:
            raise ConfigError(
                f"additional_config.vflow: tensor_parallel_size {tp} is "
                f"larger than the model's {total_kv} KV heads: each KV head "
                "would be split over ranks holding parts of its query group, "
                "and a flow that reduces over the group would select "
                f"differently on each; use tensor_parallel_size <= {total_kv}")
        if not shape.v2_runner:
            raise ConfigError(
                "the vflow attention backend keeps per-request state in "
                "slots that vLLM's Model Runner V2 assigns; this model runs "
                "on the V1 runner: set VLLM_USE_V2_MODEL_RUNNER=1")
        self.kv_heads = shape.kv_heads
        # The model's index of this rank's first KV head (the flow's
        # `kv_head` is the model's index): tp <= KV heads, so each rank
        # holds kv_heads of them in order.
        self.first_kv_head = shape.tp_rank * shape.kv_heads
        self.max_model_len = shape.max_model_len
        self.max_seqs = shape.max_seqs
        self.scratch_slot = self.max_seqs
        self.flow: Optional[torch_ops.Flow] = None
        self.scale: Optional[float] = None
        self.layers: Dict[str, LayerBuffers] = {}
        self.step_of_slot: Optional[torch.Tensor] = None
        # The metadata builder's per-step buffers (backend._DecodeBuffers).
        self.step_state: Any = None
        self.first_layer: Optional[int] = None
        self._lock = threading.Lock()
        self._resets: List[int] = []
        # The batch's rows -> request slots of the step being prepared
        # (Model Runner V2's idx_mapping), and a serial per prepared step.
        self.idx_mapping: Optional[torch.Tensor] = None
        self.serial = 0
        self._counted = -1

    # -------------------------------------------------------------- layers

    def attach(self, num_heads: int, head_size: int, num_kv_heads: int,
               scale: float, kv_dtype: str = "bf16") -> None:
        """An attention layer of this worker (AttentionImpl.__init__): the
        flow is built for its shape and KV dtype ("bf16" or "fp8e4m3") once;
        every layer must share them."""
        if num_kv_heads != self.kv_heads:
            raise ConfigError(f"vflow: a layer has {num_kv_heads} KV heads, "
                              f"the model {self.kv_heads}")
        group = num_heads // num_kv_heads
        if self.flow is None:
            self.flow = torch_ops.Flow(self.program, self.flow_name,
                                       group=group, head_dim=head_size,
                                       kv_dtype=kv_dtype)
            # Budgets that read `layer` or `kv_head` are checked at, and
            # lists sized for, the layers the flow runs at and this rank's
            # KV heads (a refused budget stops the engine at startup).
            first = min(self.dense_layers, self.num_layers)
            try:
                self.flow.set_budget_scope(
                    first, max(1, self.num_layers - first),
                    self.first_kv_head, self.kv_heads)
            except RuntimeError as e:
                raise ConfigError(f"additional_config.vflow: {e}") from e
            self.scale = float(scale)
        elif self.flow.kv_dtype != kv_dtype:
            raise ConfigError("vflow: layers with different KV cache dtypes "
                              f"({self.flow.kv_dtype} vs {kv_dtype}) are not "
                              "supported")
        elif (self.flow.group, self.flow.head_dim) != (group, head_size):
            raise ConfigError(
                "vflow: layers of different shapes (query group "
                f"{self.flow.group} vs {group}, head size "
                f"{self.flow.head_dim} vs {head_size}) are not supported")
        elif float(scale) != self.scale:
            raise ConfigError("vflow: layers with different attention "
                              f"scales ({self.scale} vs {scale}) are not "
                              "supported")

    @property
    def block_size(self) -> int:
        return int(self.require_flow().block_size)

    @property
    def max_blocks(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def step_buffers(self) -> Any:
        """The metadata builder's per-step buffers (backend._DecodeBuffers):
        the step's derived slots, the decode rows' inputs."""
        if self.step_state is None:
            raise RuntimeError("vflow: a layer ran before vLLM made the "
                               "backend's metadata builder")
        return self.step_state

    def dense_workspace_bytes(self, rows: int) -> int:
        """The dense layers' decode workspace for any step of at most `rows`
        rows (one list per row of up to max_blocks blocks; the split plan,
        so the bytes, is not monotonic in the rows: the largest of all)."""
        flow = self.require_flow()
        return max(int(torch.ops.vflow.paged_decode_workspace_bytes(
            n, self.kv_heads, flow.group, flow.head_dim, self.max_blocks))
            for n in range(1, rows + 1))

    def require_flow(self) -> torch_ops.Flow:
        if self.flow is None:
            raise RuntimeError("vflow: no attention layer was created")
        return self.flow

    def is_first_layer(self, layer_index: int) -> bool:
        """Whether this is the first attention layer of the model on this
        rank (the lowest index seen: forwards run the layers in order)."""
        if self.first_layer is None or layer_index < self.first_layer:
            self.first_layer = layer_index
        return layer_index == self.first_layer

    def is_dense(self, layer_index: int) -> bool:
        return layer_index < self.dense_layers

    def field_bytes_per_block(self) -> int:
        """Bytes of one layer's fields per KV block (all local KV heads)."""
        flow = self.require_flow()
        return sum(f["elements"] * getattr(
                       torch, torch_ops._TORCH_DTYPES[f["dtype"]]).itemsize
                   for f in flow.fields) * self.kv_heads

    def buffers(self, layer_name: str, kv_cache: torch.Tensor) -> LayerBuffers:
        """The layer's fields (one row per physical block of its cache),
        states and mass (one row per slot), made on first use, which is
        an eager step (profiling and warm-up run before any capture)."""
        found = self.layers.get(layer_name)
        if found is not None:
            return found
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"vflow: layer {layer_name} first seen inside a CUDA graph "
                "capture; its buffers must be made in an eager step")
        flow = self.require_flow()
        device = kv_cache.device
        num_blocks = int(kv_cache.shape[1])
        slots = self.max_seqs + 1
        buf = LayerBuffers(
            fields=flow.new_fields(num_blocks, self.kv_heads, device=device),
            states=flow.new_states(slots, self.kv_heads, self.max_blocks,
                                   device=device),
            mass=flow.new_mass(slots, self.kv_heads, self.max_blocks,
                               device=device),
            workspace=torch.empty(max(flow.workspace_bytes(0, 1, 1), 1),
                                  dtype=torch.uint8, device=device))
        self.layers[layer_name] = buf
        if self.step_of_slot is None:
            self.step_of_slot = torch.zeros(slots, dtype=torch.int32,
                                            device=device)
        return buf

    def kv_budget(self, available: int) -> int:
        """vLLM's bytes for the KV cache after vflow's share: the states and
        mass of every slot and the decode plans (fixed), then the fields,
        which grow with the blocks (a block of a flow layer costs its K/V
        plus its fields)."""
        flow = self.require_flow()
        layers = self.num_layers
        flow_layers = max(0, layers - self.dense_layers)
        slots, blocks = self.max_seqs + 1, self.max_blocks
        per_slot = sum(s["elements"] * (blocks if s["per_block"] else 1)
                       for s in flow.states) * 4 * 2  # old and new
        if flow.reads_mass:
            per_slot += blocks * flow.group * 4
        rows = self.shape.max_rows  # the largest decode plan
        plan = rows * self.kv_heads * blocks * (2 * 4 + (
            flow.group * 4 if flow.reads_mass else 0))
        # Dense decode lists and workspace, the step's derived slots.
        plan += rows * blocks * 4 + self.dense_workspace_bytes(rows)
        plan += 3 * 4 * self.shape.max_tokens
        fixed = flow_layers * per_slot * slots * self.kv_heads + plan
        kv = 2 * self.block_size * self.kv_heads * flow.head_dim * (
            1 if flow.kv_dtype.startswith("fp8") else 2)
        fields = self.field_bytes_per_block()
        budget = (available - fixed) * (layers * kv) // (
            layers * kv + flow_layers * fields)
        if budget <= 0:
            raise ConfigError(
                f"vflow: its states, mass and plans need {fixed} bytes, more "
                f"than the {available} vLLM found for the KV cache; lower "
                "max_num_seqs or max_model_len")
        import logging

        logging.getLogger("vllm").info(
            "vflow: %d of %d KV-cache bytes left to vLLM's blocks (%d fixed "
            "for states, mass and plans; fields %d bytes per block of %d "
            "flow layers)", budget, available, fixed, fields, flow_layers)
        return int(budget)

    # ------------------------------------------------------------ requests

    def request_added(self, slot: int) -> None:
        """A request (new, resumed after preemption, or with a prefix-cache
        hit) took `slot`: its states, mass and step restart."""
        with self._lock:
            self._resets.append(int(slot))

    def step_prepared(self, idx_mapping: Optional[torch.Tensor]) -> None:
        with self._lock:
            self.idx_mapping = idx_mapping
            self.serial += 1

    def count_step(self, slots: torch.Tensor) -> None:
        """The decode rows' requests took one more step (once per prepared
        step, however many builders see it)."""
        if self._counted == self.serial or self.step_of_slot is None:
            return
        self._counted = self.serial
        self.step_of_slot.index_add_(
            0, slots.long(), torch.ones(int(slots.shape[0]),
                                        dtype=torch.int32,
                                        device=self.step_of_slot.device))

    def apply_resets(self) -> None:
        """Resets the slots of requests added since the last step, in every
        layer (eager, before the step's layers run)."""
        with self._lock:
            slots, self._resets = self._resets, []
        if not slots or self.step_of_slot is None:
            return  # no buffers yet: they start at their initial values
        flow = self.require_flow()
        index = torch.tensor(sorted(set(slots)), dtype=torch.long,
                             device=self.step_of_slot.device)
        for buf in self.layers.values():
            flow.reset(buf.states, buf.mass, index)
        self.step_of_slot[index] = 0


def is_vflow_cache(kv: Any) -> bool:
    """A layer cache of this backend: [2, blocks, kv_heads, block, dim]."""
    return (isinstance(kv, torch.Tensor) and kv.dim() == 5
            and kv.shape[0] == 2 and current_runtime() is not None)


def copy_blocks(kv: torch.Tensor, num_blocks: int, copies: Any) -> None:
    """Copies blocks (src, dst) of vLLM's ids, `num_blocks` of them, in a
    K/V-first cache whose pages may be smaller than vLLM's blocks (each
    block is kv.shape[1] // num_blocks pages)."""
    pairs = [(int(s), int(d)) for s, d in copies]
    if not pairs:
        return
    if kv.element_size() == 1:  # fp8: copied as bytes (no fp8 index_put)
        kv = kv.view(torch.uint8)
    ratio = int(kv.shape[1]) // int(num_blocks)
    index = torch.tensor(pairs, dtype=torch.long, device=kv.device)
    part = torch.arange(ratio, dtype=torch.long, device=kv.device)
    src = (index[:, 0:1] * ratio + part).flatten()
    dst = (index[:, 1:2] * ratio + part).flatten()
    kv[:, dst] = kv[:, src]


_runtime: Optional[Runtime] = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """This process's Runtime, made from the current vLLM config on first
    use (in a worker, while vLLM builds the model)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            from vllm.config import get_current_vllm_config

            from .config import parse

            vllm_config = get_current_vllm_config()
            cfg = parse(vllm_config.additional_config)
            if cfg is None:
                raise ConfigError(
                    "the vflow attention backend needs its program: "
                    "--additional-config '{\"vflow\": {\"flow\": "
                    "\"PATH.vflow\"}}'")
            _runtime = Runtime(cfg, ModelShape.of(vllm_config))
        return _runtime


def current_runtime() -> Optional[Runtime]:
    return _runtime


def use_runtime(rt: Optional[Runtime]) -> None:
    """Makes `rt` this process's Runtime (the backend's layers and builders
    made afterwards use it): for running the backend's pieces without a
    vLLM engine, as its GPU test does. None forgets it."""
    global _runtime
    with _runtime_lock:
        _runtime = rt


def _tp_rank(tensor_parallel: int) -> int:
    """This worker's tensor-parallel rank (0 without tensor parallelism)."""
    if tensor_parallel <= 1:
        return 0
    from vllm.distributed import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def _default_dense_layers() -> int:
    from .. import _vflow

    return int(_vflow.EngineConfig().dense_layers)
