"""vflow's vLLM backend (vflow.vllm_backend) on the GPU, without a vLLM
engine: its impl and metadata builder driven as vLLM's Model Runner V2
drives them (real CommonAttentionMetadata, slot_mapping, block tables of
scattered physical blocks, request slots), checked

- at a budget that takes every block: every row (prefill, chunked prefill,
  decode) against float64 causal attention over the request's history;
- at real budgets: each decode row against vflow's own torch ops run on a
  separate cache with the same blocks (same kernels: equal outputs).

Needs CUDA, vLLM 0.26.0 and vflow built with its torch ops (on the GPU
machine: lab/tools/vllm_gpu.sh test); skipped elsewhere."""

from __future__ import annotations

import pathlib
import random
from typing import Any, Dict, List, Tuple

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("vllm")

from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402

from vflow import torch_ops  # noqa: E402
from vflow.vllm_backend.backend import (VflowAttentionImpl,  # noqa: E402
                                        VflowMetadataBuilder)
from vflow.vllm_backend.config import parse  # noqa: E402
from vflow.vllm_backend.runtime import (ModelShape, Runtime,  # noqa: E402
                                        use_runtime)

ROOT = pathlib.Path(__file__).resolve().parents[2]
H, G, D, BLOCK = 2, 2, 64, 16
NUM_BLOCKS, MAX_LEN, LAYERS, DENSE = 128, 512, 3, 1
BIG = 1 << 20
DEV = torch.device("cuda")


class Layer:
    """What the backend reads of vLLM's Attention module: its name and its
    KV scales (1: uncalibrated)."""

    def __init__(self, index: int) -> None:
        self.layer_name = f"model.layers.{index}.self_attn.attn"
        self._k_scale_float = self._v_scale_float = 1.0


class Request:
    def __init__(self, slot: int, blocks: List[int]) -> None:
        self.slot, self.blocks, self.length, self.steps = slot, blocks, 0, 0
        self.k: List[List[Any]] = [[] for _ in range(LAYERS)]
        self.v: List[List[Any]] = [[] for _ in range(LAYERS)]


class Harness:
    """The backend for one flow, and vflow's own ops beside it as the
    reference of real budgets."""

    def __init__(self, flow: str, budget: int, kv: str = "bf16") -> None:
        cfg = parse({"vflow": {"flow": str(ROOT / "examples" /
                                           f"{flow}.vflow"),
                               "params": {"budget": budget},
                               "dense_layers": DENSE}})
        assert cfg is not None
        self.rt = Runtime(cfg, ModelShape(
            num_layers=LAYERS, kv_heads=H, total_kv_heads=H,
            tensor_parallel=1, max_model_len=MAX_LEN, max_seqs=4,
            max_rows=4))
        use_runtime(self.rt)
        self.layers = [Layer(i) for i in range(LAYERS)]
        self.kv_dtype = (torch.float8_e4m3fn if kv == "fp8"
                         else torch.bfloat16)
        self.impls = [VflowAttentionImpl(H * G, D, D ** -0.5, H,
                                         kv_cache_dtype=("fp8" if kv == "fp8"
                                                         else "auto"))
                      for _ in range(LAYERS)]
        self.builder = VflowMetadataBuilder(
            None, [l.layer_name for l in self.layers], None, DEV)
        # An fp8 cache comes as bytes, as vLLM allocates it.
        self.caches = [torch.zeros(2, NUM_BLOCKS, H, BLOCK, D,
                                   dtype=torch.uint8 if kv == "fp8"
                                   else torch.bfloat16, device=DEV)
                       for _ in range(LAYERS)]
        free = list(range(1, NUM_BLOCKS))  # 0: vLLM's null block
        random.Random(7).shuffle(free)
        self.free = free
        self.requests: Dict[str, Request] = {}
        # vflow's own path: its cache, fields, states, mass.
        prog = self.rt.program
        self.ref_flow = torch_ops.Flow(prog, group=G, head_dim=D,
                                       kv_dtype="fp8e4m3" if kv == "fp8"
                                       else "bf16")
        self.ref_caches = [torch.zeros(c.shape, dtype=self.kv_dtype,
                                       device=DEV) for c in self.caches]
        self.ref_fields = [self.ref_flow.new_fields(NUM_BLOCKS, H)
                           for _ in range(LAYERS)]
        self.ref_states = [self.ref_flow.new_states(8, H, MAX_LEN // BLOCK)
                           for _ in range(LAYERS)]
        self.ref_mass = [self.ref_flow.new_mass(8, H, MAX_LEN // BLOCK)
                         for _ in range(LAYERS)]

    def add(self, name: str, slot: int) -> None:
        blocks = [self.free.pop() for _ in range(MAX_LEN // BLOCK)]
        self.requests[name] = Request(slot, blocks)
        self.rt.request_added(slot)

    def step(self, rows: List[Tuple[str, int]],
             dense_reference: bool) -> float:
        """One step: rows (request, new tokens), decodes first. Returns the
        largest error against the reference."""
        reqs = [self.requests[n] for n, _ in rows]
        qlens = [q for _, q in rows]
        starts = [r.length for r in reqs]
        seq = [s + q for s, q in zip(starts, qlens)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        slots = [r.blocks[p // BLOCK] * BLOCK + p % BLOCK
                 for r, s, q in zip(reqs, starts, qlens)
                 for p in range(s, s + q)]
        table = torch.tensor([r.blocks for r in reqs], dtype=torch.int32,
                             device=DEV)
        cm = CommonAttentionMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=DEV),
            query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq, dtype=torch.int32, device=DEV),
            num_reqs=len(rows), num_actual_tokens=qsl[-1],
            max_query_len=max(qlens), max_seq_len=max(seq),
            block_table_tensor=table,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEV))
        self.rt.step_prepared(torch.tensor([r.slot for r in reqs],
                                           dtype=torch.int32, device=DEV))
        md = self.builder.build(0, cm)
        worst = 0.0
        decodes = sum(1 for (_, q), s in zip(rows, starts) if q == 1 and s)
        for i, (layer, impl) in enumerate(zip(self.layers, self.impls)):
            T = qsl[-1]
            q = torch.randn(T, H * G, D, device=DEV).to(torch.bfloat16)
            k = torch.randn(T, H, D, device=DEV).to(torch.bfloat16)
            v = torch.randn(T, H, D, device=DEV).to(torch.bfloat16)
            out = torch.empty_like(q)
            impl.do_kv_cache_update(layer, k, v, self.caches[i],
                                    cm.slot_mapping)
            impl.forward(layer, q, k, v, self.caches[i], md, out)
            for r, a, b in zip(reqs, qsl[:-1], qsl[1:]):
                # As stored (fp8 rounds them).
                r.k[i].append(k[a:b].to(self.kv_dtype).double())
                r.v[i].append(v[a:b].to(self.kv_dtype).double())
            if dense_reference or i < DENSE:
                worst = max(worst, self._dense_error(i, reqs, starts, qsl, q,
                                                     out))
                continue
            self._ref_update(i, k, v, cm)
            if decodes:
                worst = max(worst, self._flow_error(i, reqs[:decodes], q,
                                                    out, cm, md.decode))
        for r, s in zip(reqs, seq):
            if r.length and s == r.length + 1:
                r.steps += 1
            r.length = s
        return worst

    def _dense_error(self, i: int, reqs: List[Request], starts: List[int],
                     qsl: List[int], q: Any, out: Any) -> float:
        worst = 0.0
        for r, s, a, b in zip(reqs, starts, qsl[:-1], qsl[1:]):
            keys = torch.cat(r.k[i])  # [length, H, D]
            vals = torch.cat(r.v[i])
            for t in range(b - a):
                pos = s + t
                qt = q[a + t].double().view(H, G, D)
                logits = torch.einsum("hgd,lhd->hgl", qt,
                                      keys[:pos + 1]) * D ** -0.5
                want = torch.einsum("hgl,lhd->hgd", logits.softmax(-1),
                                    vals[:pos + 1]).reshape(H * G, D)
                worst = max(worst, float((out[a + t].double() - want)
                                         .abs().max()))
        return worst

    def _ref_update(self, i: int, k: Any, v: Any, cm: Any) -> None:
        """The step's tokens into the reference cache and the fields of the
        blocks they complete (vflow's own op, pages from the slots)."""
        pages = (cm.slot_mapping // BLOCK).to(torch.int32)
        positions = (cm.slot_mapping % BLOCK).to(torch.int32)
        self.ref_flow.cache_update(
            k.contiguous(), v.contiguous(), pages, positions,
            pages[positions == BLOCK - 1].contiguous(),
            self.ref_caches[i][0], self.ref_caches[i][1], self.ref_fields[i])

    def _flow_error(self, i: int, reqs: List[Request], q: Any, out: Any,
                    cm: Any, got: Any) -> float:
        """The decode rows through vflow's own ops on the reference cache
        (the same blocks; the steps kept here): the same blocks selected
        for every (row, KV head), or AssertionError; returns the largest
        output difference."""
        n = len(reqs)
        f = self.ref_flow
        wrapper = torch_ops.FlowDecodeWrapper(f)
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.int32,
                             device=DEV)
        steps = torch.tensor([r.steps for r in reqs], dtype=torch.int32,
                             device=DEV)
        wrapper.plan(cm.seq_lens[:n].clone(),
                     cm.block_table_tensor[:n].contiguous(), slots, steps,
                     kv_heads=H, max_length=MAX_LEN)
        want = wrapper.run(q[:n].contiguous(), self.ref_caches[i][0],
                           self.ref_caches[i][1], self.ref_fields[i],
                           self.ref_states[i], self.ref_mass[i])
        assert _selected(got) == _selected(wrapper), (
            f"layer {i}, lengths {[r.length + 1 for r in reqs]}: the backend "
            "selected other blocks than vflow's own ops")
        return float((out[:n].float() - want.float()).abs().max())


def _selected(wrapper: Any) -> List[List[int]]:
    """Each (row, KV head) list's selected pages, sorted."""
    indptr, count, pages, _ = (t.tolist() for t in wrapper.selection())
    return [sorted(pages[indptr[r]:indptr[r] + count[r]])
            for r in range(len(count))]


def _run(h: Harness, dense_reference: bool) -> float:
    worst = 0.0
    h.add("a", 0)
    h.add("b", 2)
    # Prefill both (b in two chunks), then decode while c arrives.
    worst = max(worst, h.step([("a", 37), ("b", 20)], dense_reference))
    worst = max(worst, h.step([("b", 61)], dense_reference))
    for _ in range(6):
        worst = max(worst, h.step([("a", 1), ("b", 1)], dense_reference))
    h.add("c", 1)
    worst = max(worst, h.step([("a", 1), ("b", 1), ("c", 50)],
                              dense_reference))
    for _ in range(20):
        worst = max(worst, h.step([("a", 1), ("b", 1), ("c", 1)],
                                  dense_reference))
    return worst


@pytest.mark.parametrize("flow", ["quest", "block_topk", "h2o"])
@pytest.mark.parametrize("prefill", ["flash", "triton"])
def test_every_block_equals_dense_attention(flow: str, prefill: str,
                                            monkeypatch: Any) -> None:
    """Every row against float64, the prefill rows through vLLM's
    FlashAttention (where this vLLM has it) and through its Triton
    kernel."""
    from vflow.vllm_backend import backend

    if prefill == "triton":
        monkeypatch.setattr(backend, "_flash", [None])
    elif backend._flash_attention() is None:
        pytest.skip("this vLLM has no FlashAttention here")
    worst = _run(Harness(flow, BIG), dense_reference=True)
    assert worst < 2e-2, f"{flow}, {prefill} prefill: largest error {worst}"


@pytest.mark.parametrize("flow, budget", [("quest", 2), ("block_topk", 3),
                                          ("h2o", 2)])
def test_real_budgets_equal_vflows_own_ops(flow: str, budget: int) -> None:
    """The same blocks selected as vflow's own ops (checked per step), and
    outputs within bf16 rounding of theirs (the two plans may split the
    attention differently: a last-bit difference at |x| < 2 is 1/128)."""
    worst = _run(Harness(flow, budget), dense_reference=False)
    assert worst <= 2 ** -6, f"{flow} budget {budget}: largest difference {worst}"


@pytest.mark.parametrize("flow", ["quest", "h2o"])
def test_fp8_kv(flow: str) -> None:
    """--kv-cache-dtype fp8: every row against float64 attention over the
    fp8-rounded K/V (prefill through vLLM's Triton kernel with descale 1),
    and real budgets selecting exactly the blocks of vflow's own fp8 ops."""
    worst = _run(Harness(flow, BIG, kv="fp8"), dense_reference=True)
    assert worst < 2e-2, f"{flow}, fp8 KV: largest error {worst}"
    worst = _run(Harness(flow, 2, kv="fp8"), dense_reference=False)
    assert worst <= 2 ** -6, f"{flow}, fp8 KV budget 2: {worst}"


def test_fp8_kv_refuses_calibrated_scales() -> None:
    """vflow's fp8 KV stores values unscaled: a layer with KV scales other
    than 1 is refused with the layer's name."""
    h = Harness("quest", BIG, kv="fp8")
    h.layers[0]._k_scale_float = 0.5
    h.add("a", 0)
    with pytest.raises(ValueError, match="layers.0.*k_scale 0.5"):
        h.step([("a", 17)], dense_reference=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_block_copies_follow_the_kv_first_layout(dtype: str) -> None:
    """vLLM's copy-on-write of a partial prefix hit copies block-major
    bytes; the plugin copies vflow's K/V-first blocks itself (lifecycle.py),
    pages of each vLLM block included; fp8 caches as bytes."""
    from vflow.vllm_backend.runtime import copy_blocks

    kv = torch.randn(2, 12, H, BLOCK, D, device=DEV).to(getattr(torch, dtype))
    before = kv.clone()
    copy_blocks(kv, 6, [(1, 4), (2, 0)])  # 6 blocks of 2 pages each
    got, was = kv.view(torch.uint8), before.view(torch.uint8)
    for src, dst in ((1, 4), (2, 0)):
        assert torch.equal(got[:, 2 * dst:2 * dst + 2],
                           was[:, 2 * src:2 * src + 2])
    untouched = [p for p in range(12) if p // 2 not in (4, 0)]
    assert torch.equal(got[:, untouched], was[:, untouched])
