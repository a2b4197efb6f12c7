"""vflow as a vLLM 0.26.0 attention backend (registered as CUSTOM by
vflow.vllm_backend.register; docs/vllm.md).

Per layer and step:
- do_kv_cache_update (vLLM calls it before attention, with the step's
  slot_mapping): the new tokens' K/V into vLLM's paged cache and the flow's
  cache stage on every block a token completes (vflow::flow_cache_update;
  fields indexed by physical block id, so prefix-shared blocks share them);
- forward: decode rows (first in the batch: reorder_batch_threshold = 1)
  through the flow's index stage and sparse paged decode
  (vflow::flow_decode_layer, the routine vflow's own engine runs), or in a
  dense layer through vflow's dense paged decode (vflow::paged_decode over
  the rows' block tables); the other rows (prefill, chunked prefill)
  through vLLM's FlashAttention (its Triton attention where it has none,
  or with VFLOW_VLLM_PREFILL=triton) over the same cache.

The cache is K/V first, [2, num_blocks, kv_heads, block_size, head_size]:
kv_cache[0] and kv_cache[1] are the pools vflow's kernels read, no copy;
vLLM's attention kernels read them through strided views (the layout
vLLM calls HND)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import torch
from vllm.config import VllmConfig
from vllm.config.cache import CacheDType
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport,
                                       AttentionImpl, AttentionType,
                                       AttentionMetadataBuilder,
                                       CommonAttentionMetadata)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.attention.ops.triton_unified_attention import unified_attention
from vllm.v1.kv_cache_interface import AttentionSpec

from .. import torch_ops
from .runtime import Runtime, get_runtime


@dataclass
class VflowMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    # Every row (vLLM's tensors): the dense path's inputs.
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    max_seq_len: int
    # The rows after the decodes (prefill), offsets from the first of them.
    prefill_query_start_loc: Optional[torch.Tensor]
    # The decode rows' plan (None: no decode row), over persistent buffers.
    decode: Optional[torch_ops.FlowDecodeWrapper]
    # Those buffers (the dense layers' decode reads them too).
    buffers: Optional["_DecodeBuffers"] = None


class _DecodeBuffers:
    """Persistent per-row inputs of the flow's decode (a CUDA graph reads
    the same addresses at every replay; build() refreshes them) and a plan
    per row count."""

    def __init__(self, rt: Runtime, rows: int, device: torch.device) -> None:
        self.rt = rt
        int32 = dict(dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, **int32)
        self.block_table = torch.zeros(rows, rt.max_blocks, **int32)
        self.slots = torch.full((rows,), rt.scratch_slot, **int32)
        self.steps = torch.zeros(rows, **int32)
        self.plans: Dict[int, torch_ops.FlowDecodeWrapper] = {}
        # The largest plan first: the others use its buffers.
        self.largest = self.plan(rows)
        # The dense layers' decode rows: one list per row over its block
        # table row (entries past the row's length not read: `count`).
        blocks = rt.max_blocks
        self.dense_count = torch.zeros(rows, **int32)
        self.dense_indptr = torch.arange(rows + 1, **int32) * blocks
        self.dense_blocks = torch.arange(blocks, **int32).repeat(rows)
        self.dense_workspace = torch.empty(
            max(rt.dense_workspace_bytes(rows), 1), dtype=torch.uint8,
            device=device)
        # The step's slot_mapping as pages, positions and completed pages:
        # derived by the step's first layer, read by the others.
        tokens = rt.shape.max_tokens
        self.step = 0  # metadata builds so far
        self.derived_for: Optional[Tuple[int, int, int]] = None
        self.slot_pages = torch.zeros(tokens, **int32)
        self.slot_positions = torch.zeros(tokens, **int32)
        self.completed = torch.zeros(tokens, **int32)

    def _plan(self, wrapper: torch_ops.FlowDecodeWrapper, rows: int,
              share: Optional[torch_ops.FlowDecodeWrapper]) -> None:
        wrapper.plan(self.seq_lens[:rows], self.block_table[:rows],
                     self.slots[:rows], self.steps[:rows],
                     kv_heads=self.rt.kv_heads,
                     max_length=self.rt.max_blocks * self.rt.block_size,
                     scale=self.rt.scale, share=share)

    def step_slots(self, slot_mapping: torch.Tensor, n: int,
                   first_layer: bool) -> Tuple[
            torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first n slots of this step's slot_mapping as (pages,
        positions, completed): derived by the forward's first layer (so a
        captured graph holds the derivation, however many forwards vLLM
        runs per metadata build) and read by the later layers of the step
        (derived again if their mapping is another)."""
        key = (self.step, slot_mapping.data_ptr(), n)
        if n > int(self.slot_pages.shape[0]):  # more than vLLM said
            out = tuple(torch.empty(n, dtype=torch.int32,
                                    device=slot_mapping.device)
                        for _ in range(3))
            _slots_to_pages(slot_mapping[:n], self.rt.block_size, *out)
            return out
        found = (self.slot_pages[:n], self.slot_positions[:n],
                 self.completed[:n])
        if first_layer or self.derived_for != key or self.step == 0:
            _slots_to_pages(slot_mapping[:n], self.rt.block_size, *found)
            self.derived_for = key
        return found

    def dense_decode(self, n: int, q: torch.Tensor, kv_cache: torch.Tensor,
                     out: torch.Tensor) -> None:
        """Dense attention of the first n rows (vflow's paged decode, the
        dense layers' kernel of its own engine)."""
        blocks = self.rt.max_blocks
        torch.ops.vflow.paged_decode(
            q, kv_cache[0], kv_cache[1], self.dense_indptr[:n + 1],
            self.block_table[:n].reshape(-1), self.dense_blocks[:n * blocks],
            self.seq_lens[:n], self.rt.scale, blocks, True, out, None,
            self.dense_workspace, self.dense_count[:n])

    def plan(self, rows: int) -> torch_ops.FlowDecodeWrapper:
        found = self.plans.get(rows)
        if found is None:
            found = torch_ops.FlowDecodeWrapper(self.rt.require_flow())
            # The longest length any step may reach: one plan serves every
            # step of this many rows (and the graph captured with it).
            largest = self.plans.get(int(self.seq_lens.shape[0]))
            try:
                self._plan(found, rows, largest)
            except ValueError:
                if largest is None:
                    raise
                # This many rows need a larger attention workspace than
                # the largest plan's (its split plan differs): its own.
                self._plan(found, rows, None)
            self.plans[rows] = found
        return found


class VflowMetadataBuilder(AttentionMetadataBuilder[VflowMetadata]):
    # Pure-decode batches are captured whole; mixed ones run the
    # attention outside the graphs (piecewise).
    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    reorder_batch_threshold: ClassVar[Optional[int]] = 1

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: List[str],
                 vllm_config: VllmConfig, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.rt = get_runtime()
        self.buffers = _DecodeBuffers(self.rt, self.rt.shape.max_rows,
                                      torch.device(device))
        self.rt.step_state = self.buffers

    def build_for_cudagraph_capture(
            self, common_attn_metadata: CommonAttentionMetadata
    ) -> VflowMetadata:
        return self._build(common_attn_metadata, capture=True)

    def build(self, common_prefix_len: int,
              common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> VflowMetadata:
        return self._build(common_attn_metadata, capture=False)

    def _build(self, cm: CommonAttentionMetadata,
               capture: bool) -> VflowMetadata:
        rt = self.rt
        num_decodes, _, num_decode_tokens, _ = split_decodes_and_prefills(
            cm, decode_threshold=1)
        prefill_qsl = None
        if num_decodes < cm.num_reqs:
            prefill_qsl = (cm.query_start_loc[num_decodes:cm.num_reqs + 1]
                           - num_decode_tokens)
        decode = None
        self.buffers.step += 1
        if num_decodes > 0:
            decode = self._decode_rows(cm, num_decodes, capture)
        return VflowMetadata(
            num_actual_tokens=cm.num_actual_tokens, num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            query_start_loc=cm.query_start_loc, seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            max_query_len=cm.max_query_len, max_seq_len=cm.max_seq_len,
            prefill_query_start_loc=prefill_qsl, decode=decode,
            buffers=self.buffers)

    def _decode_rows(self, cm: CommonAttentionMetadata, n: int,
                     capture: bool) -> torch_ops.FlowDecodeWrapper:
        rt, b = self.rt, self.buffers
        rt.apply_resets()
        b.seq_lens[:n].copy_(cm.seq_lens[:n])
        cols = min(int(cm.block_table_tensor.shape[1]), rt.max_blocks)
        b.block_table[:n, :cols].copy_(cm.block_table_tensor[:n, :cols])
        idx = rt.idx_mapping
        if capture or idx is None or rt.step_of_slot is None:
            # Graph capture, warm-up and profiling batches: the scratch slot.
            b.slots[:n].fill_(rt.scratch_slot)
            b.steps[:n].zero_()
        else:
            real = min(n, int(idx.shape[0]))
            b.slots[:real].copy_(idx[:real])
            b.slots[real:n].fill_(rt.scratch_slot)  # padding rows
            b.seq_lens[real:n].zero_()
            torch.index_select(rt.step_of_slot, 0, b.slots[:n], out=b.steps[:n])
            rt.count_step(b.slots[:real])
        torch.div(b.seq_lens[:n] + rt.block_size - 1, rt.block_size,
                  rounding_mode="floor", out=b.dense_count[:n])
        return b.plan(n)


class VflowAttentionImpl(AttentionImpl[VflowMetadata]):

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: Optional[int] = None,
                 alibi_slopes: Optional[List[float]] = None,
                 sliding_window: Optional[int] = None,
                 kv_cache_dtype: str = "auto",
                 logits_soft_cap: Optional[float] = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: Optional[str] = None,
                 **unsupported: Any) -> None:
        if kv_cache_dtype not in _KV_DTYPES:
            raise ValueError(
                f"the vflow attention backend: --kv-cache-dtype "
                f"{kv_cache_dtype} is not supported; use "
                + ", ".join(sorted(_KV_DTYPES)))
        refused = {k: v for k, v in unsupported.items()
                   if v not in (None, False, -1)}
        for name, value in (("alibi_slopes", alibi_slopes),
                            ("sliding_window", sliding_window),
                            ("logits_soft_cap", logits_soft_cap or None),
                            ("kv_sharing_target_layer_name",
                             kv_sharing_target_layer_name)):
            if value is not None:
                refused[name] = value
        if attn_type != AttentionType.DECODER:
            refused["attn_type"] = attn_type
        if refused:
            raise ValueError(
                "the vflow attention backend supports decoder self-attention "
                "without " + ", ".join(sorted(refused)) + " (this model uses "
                "them)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.fp8 = _KV_DTYPES[kv_cache_dtype] == "fp8e4m3"
        self.rt = get_runtime()
        self.rt.attach(num_heads, head_size, self.num_kv_heads, self.scale,
                       _KV_DTYPES[kv_cache_dtype])

    def _pools(self, layer: torch.nn.Module,
               kv_cache: torch.Tensor) -> torch.Tensor:
        """The layer's cache as the pools vflow's kernels read: an fp8 cache
        that vLLM allocated as bytes is viewed as float8_e4m3fn. vflow's fp8
        KV stores values unscaled, so a layer with calibrated KV scales
        (other than 1) is refused, once per layer, in an eager step."""
        if not self.fp8:
            return kv_cache
        if not getattr(layer, "_vflow_scales_checked", False):
            scales = (float(getattr(layer, "_k_scale_float", 1.0)),
                      float(getattr(layer, "_v_scale_float", 1.0)))
            if scales != (1.0, 1.0):
                raise ValueError(
                    f"vflow: {layer.layer_name} has fp8 KV scales k_scale "
                    f"{scales[0]:g}, v_scale {scales[1]:g}; vflow's fp8 KV "
                    "cache stores K and V unscaled: serve with "
                    "--kv-cache-dtype auto, or without the checkpoint's KV "
                    "scales")
            layer._vflow_scales_checked = True
        if kv_cache.dtype != torch.float8_e4m3fn:
            kv_cache = kv_cache.view(torch.float8_e4m3fn)
        return kv_cache

    def do_kv_cache_update(self, layer: torch.nn.Module, key: torch.Tensor,
                           value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        if kv_cache.numel() == 0:
            return  # profiling, before the cache exists
        rt = self.rt
        n = min(int(key.shape[0]), int(slot_mapping.shape[0]))
        block = rt.block_size
        kv_cache = self._pools(layer, kv_cache)
        if _CHECKED:
            _check_update(layer, key, slot_mapping[:n], kv_cache, block)
        index = _layer_index(layer)
        pages, positions, completed = rt.step_buffers().step_slots(
            slot_mapping, n, rt.is_first_layer(index))
        k, v = key[:n].contiguous(), value[:n].contiguous()
        if rt.is_dense(index):  # no fields: K/V only
            torch.ops.vflow.write_kv(k, v, pages, positions, kv_cache[0],
                                     kv_cache[1])
            return
        buf = rt.buffers(layer.layer_name, kv_cache)
        rt.require_flow().cache_update(k, v, pages, positions, completed,
                                       kv_cache[0], kv_cache[1], buf.fields,
                                       buf.workspace)

    def forward(self, layer: torch.nn.Module, query: torch.Tensor,
                key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: VflowMetadata,
                output: torch.Tensor,
                output_scale: Optional[torch.Tensor] = None,
                output_block_scale: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(
                "vflow: fused output quantization is not supported")
        if attn_metadata is None:
            return output.fill_(0)  # profiling run
        md = attn_metadata
        kv_cache = self._pools(layer, kv_cache)
        if _CHECKED:
            _check_forward(layer, query, kv_cache, md)
        if md.decode is None or md.buffers is None:  # no decode row
            self._dense(query, kv_cache, md, output, 0, 0)
            return output
        nd = md.num_decode_tokens
        q = query[:nd].contiguous()
        if self.rt.is_dense(_layer_index(layer)):
            md.buffers.dense_decode(nd, q, kv_cache, output[:nd])
        else:
            buf = self.rt.buffers(layer.layer_name, kv_cache)
            md.decode.run(q, kv_cache[0], kv_cache[1], buf.fields,
                          buf.states, buf.mass, out=output[:nd],
                          layer=_layer_index(layer),
                          kv_head_base=self.rt.first_kv_head)
        if md.num_actual_tokens > nd:
            self._dense(query, kv_cache, md, output, md.num_decodes, nd)
        return output

    def _dense(self, query: torch.Tensor, kv_cache: torch.Tensor,
               md: VflowMetadata, output: torch.Tensor, first_row: int,
               first_token: int) -> None:
        """Causal paged attention for rows first_row.. over the same cache:
        the prefill rows (every row of a step without decode rows), with
        vLLM's FlashAttention where it has it, else its Triton kernel."""
        k = kv_cache[0].transpose(1, 2)  # [blocks, block_size, heads, dim]
        v = kv_cache[1].transpose(1, 2)
        if first_row == 0:
            qsl, rows = md.query_start_loc, slice(None)
        else:
            qsl, rows = md.prefill_query_start_loc, slice(first_row, None)
        end = md.num_actual_tokens
        q, out = query[first_token:end], output[first_token:end]
        seq_lens, table = md.seq_lens[rows], md.block_table[rows]
        # fp8 K/V: vLLM's Triton kernel reads them beside bf16 queries (its
        # FlashAttention would want fp8 queries), descaled by 1.
        flash = None if self.fp8 else _flash_attention()
        descale = None
        if self.fp8:
            descale = _ones(query.device).expand(int(seq_lens.shape[0]),
                                                 int(k.shape[2]))
        if flash is not None:
            run, version = flash
            run(q=q, k=k, v=v, out=out, cu_seqlens_q=qsl,
                max_seqlen_q=md.max_query_len, seqused_k=seq_lens,
                max_seqlen_k=md.max_seq_len, softmax_scale=self.scale,
                causal=True, block_table=table, fa_version=version)
            return
        unified_attention(
            q=q, k=k, v=v, out=out, cu_seqlens_q=qsl,
            max_seqlen_q=md.max_query_len, seqused_k=seq_lens,
            max_seqlen_k=md.max_seq_len, softmax_scale=self.scale,
            causal=True, alibi_slopes=None, window_size=(-1, -1),
            block_table=table, softcap=0, q_descale=None, k_descale=descale,
            v_descale=descale)


# vLLM's --kv-cache-dtype values the backend takes, as the flow's KV dtype.
_KV_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8e4m3",
              "fp8_e4m3": "fp8e4m3"}
_ones_of: Dict[torch.device, torch.Tensor] = {}


def _ones(device: torch.device) -> torch.Tensor:
    """A 1-element float32 1.0 on `device` (the fp8 descale), made once."""
    found = _ones_of.get(device)
    if found is None:
        found = _ones_of[device] = torch.ones(1, dtype=torch.float32,
                                              device=device)
    return found


_PREFILL = os.environ.get("VFLOW_VLLM_PREFILL", "flash")
_flash: List[Optional[Tuple[Any, int]]] = []


def _flash_attention() -> Optional[Tuple[Any, int]]:
    """vLLM's FlashAttention (its varlen function and version) for the
    prefill rows, or None: VFLOW_VLLM_PREFILL=triton, or this vLLM build
    or GPU has none (vLLM's Triton kernel then)."""
    if not _flash:
        found: Optional[Tuple[Any, int]] = None
        if _PREFILL != "triton":
            from vllm.v1.attention.backends import fa_utils

            version = fa_utils.get_flash_attn_version()
            if (version is not None
                    and fa_utils.is_flash_attn_varlen_func_available()):
                found = (fa_utils.flash_attn_varlen_func, int(version))
        _log.info("vflow: prefill rows through %s",
                  f"FlashAttention {found[1]}" if found else
                  "vLLM's Triton attention")
        _flash.append(found)
    return _flash[0]


class VflowAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[List[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[List[CacheDType]] = [
        "auto", "bfloat16", "fp8", "fp8_e4m3"]
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type:
        return VflowAttentionImpl

    @staticmethod
    def get_builder_cls() -> type:
        return VflowMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int,
                           num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto"
                           ) -> Tuple[int, ...]:
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    @staticmethod
    def get_supported_kernel_block_sizes() -> List[Any]:
        # The flow's blocks are its kernels' pages: vLLM's block size must
        # be a multiple (its blocks are then split into pages of this size).
        return [_flow_block_size()]

    @classmethod
    def validate_configuration(cls, **kwargs: Any) -> List[str]:
        reasons = super().validate_configuration(**kwargs)
        block = _flow_block_size()
        return [f"block_size {kwargs.get('block_size')} is not a multiple of "
                f"the flow's {block}-token blocks (pass --block-size {block})"
                if r == "block_size not supported" else r for r in reasons]

    @classmethod
    def supports_kv_connector(cls) -> bool:
        return False  # a connector would load K/V without the fields

    @classmethod
    def get_supported_head_sizes(cls) -> List[int]:
        return [64, 128, 256]


# VFLOW_VLLM_CHECK=1: every call's inputs checked against the cache before
# the kernels run (a host sync per call; for finding a bad input, not for
# serving). A failed check names the layer, the tensor and the value.
_CHECKED = os.environ.get("VFLOW_VLLM_CHECK", "") not in ("", "0")
_log = logging.getLogger("vllm")
_logged = [0]  # calls described in the log (the first few)


def _describe(fmt: str, *args: Any) -> None:
    if _logged[0] < 8:
        _logged[0] += 1
        _log.info(fmt, *args)


def _check_update(layer: torch.nn.Module, key: torch.Tensor,
                  slots: torch.Tensor, kv_cache: torch.Tensor,
                  block: int) -> None:
    where = f"vflow check, {layer.layer_name} do_kv_cache_update"
    _describe("%s: key %s, slot_mapping %s %s, cache %s", where,
              tuple(key.shape), tuple(slots.shape), slots.dtype,
              tuple(kv_cache.shape))
    _expect(key.dim() == 3 and tuple(key.shape[1:]) == tuple(
        kv_cache.shape[2:3]) + tuple(kv_cache.shape[4:]), where,
        f"key {tuple(key.shape)} against cache {tuple(kv_cache.shape)}")
    if slots.numel():
        top = int(slots.max())
        _expect(top < int(kv_cache.shape[1]) * block, where,
                f"slot {top} past the cache's {kv_cache.shape[1]} blocks")
        _expect(int(slots.min()) >= -1, where, "a slot below -1")


def _check_forward(layer: torch.nn.Module, query: torch.Tensor,
                   kv_cache: torch.Tensor, md: "VflowMetadata") -> None:
    where = f"vflow check, {layer.layer_name} forward"
    rows = int(md.query_start_loc.shape[0]) - 1
    _describe("%s: query %s, rows %d, seq_lens %s, block_table %s, decodes "
              "%d (%d tokens), tokens %d", where, tuple(query.shape), rows,
              tuple(md.seq_lens.shape), tuple(md.block_table.shape),
              md.num_decodes, md.num_decode_tokens, md.num_actual_tokens)
    _expect(int(query.shape[0]) >= md.num_actual_tokens, where,
            f"{query.shape[0]} query rows for {md.num_actual_tokens} tokens")
    _expect(int(md.seq_lens.shape[0]) == rows, where,
            f"{md.seq_lens.shape[0]} seq_lens for {rows} rows")
    _expect(int(md.query_start_loc[-1]) == md.num_actual_tokens, where,
            f"query_start_loc ends at {int(md.query_start_loc[-1])}, "
            f"tokens {md.num_actual_tokens}")
    _expect(int(md.block_table.max()) < int(kv_cache.shape[1]), where,
            f"block id {int(md.block_table.max())} past the cache's "
            f"{kv_cache.shape[1]} blocks")
    _expect(int(md.seq_lens.max()) <= int(md.block_table.shape[1]) *
            int(kv_cache.shape[3]), where, "a sequence longer than its "
            "block table")


def _expect(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {what}")


def _slots_to_pages(slots: torch.Tensor, block: int, pages: torch.Tensor,
                    positions: torch.Tensor, completed: torch.Tensor) -> None:
    """vLLM's slots (block * block_size + position, -1 for padding) as
    int32 pages, positions and completed pages (the page a token fills,
    else 0). Padding rows go to block 0, vLLM's null block, which no
    request reads; so does a row that completes no block."""
    valid = slots >= 0
    torch.div(slots.clamp(min=0), block, rounding_mode="floor", out=pages)
    torch.remainder(slots, block, out=positions)
    torch.mul(pages, valid & (positions == block - 1), out=completed)


def _layer_index(layer: torch.nn.Module) -> int:
    """The layer's index in the model, from its name
    (model.layers.N.self_attn.attn), cached on the layer."""
    index = getattr(layer, "_vflow_index", None)
    if index is None:
        from vllm.model_executor.models.utils import extract_layer_index

        index = extract_layer_index(layer.layer_name)
        layer._vflow_index = index
    return int(index)


def _flow_block_size() -> int:
    """The flow's block size (a compile-time param): vLLM's block size must
    equal it, so that its blocks are the flow's."""
    rt = get_runtime()
    params = rt.program.param_defaults(rt.flow_name)
    return int(params["block_size"][1]) if "block_size" in params else 16
