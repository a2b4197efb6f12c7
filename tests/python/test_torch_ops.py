"""torch.ops.vflow on the GPU: write_kv and paged_decode against a float64
reference on fresh random data (bf16 and fp8 caches, dense and sparse
lists, the mass output), torch.library.opcheck, a CUDA graph replay and
torch.compile(fullgraph=True). Skipped without torch and a GPU; runs
without pytest on the GPU machine: `python tests/python/test_torch_ops.py`."""

from __future__ import annotations

import math
import sys
from typing import Any, List, Tuple

from gpu_common import capture_graph, torch_with_gpu




H, G, D, P = 2, 4, 128, 16


def _setup(torch: Any, lengths: List[int], cache_dtype: Any) -> Tuple:
    """Random K/V written into a shuffled paged cache with write_kv; the
    block table; the K/V as the cache holds them (float64, per sequence)."""
    from vflow import torch_ops

    torch_ops.load()
    gen = torch.Generator(device="cuda").manual_seed(11)
    blocks = [(n + P - 1) // P for n in lengths]
    pages = sum(blocks) + 3
    perm = torch.randperm(pages, generator=gen, device="cuda").int()
    k_cache = torch.zeros(pages, H, P, D, device="cuda").to(cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    table = torch.full((len(lengths), max(blocks)), -1, dtype=torch.int32,
                       device="cuda")
    kv = []
    used = 0
    for b, n in enumerate(lengths):
        table[b, :blocks[b]] = perm[used:used + blocks[b]]
        used += blocks[b]
        k = torch.randn(n, H, D, generator=gen, device="cuda").bfloat16()
        v = torch.randn(n, H, D, generator=gen, device="cuda").bfloat16()
        pos = torch.arange(n, device="cuda")
        torch.ops.vflow.write_kv(k, v, table[b, pos // P].contiguous(),
                                 (pos % P).int(), k_cache, v_cache)
        kv.append((k.to(cache_dtype).double(), v.to(cache_dtype).double()))
    return k_cache, v_cache, table, kv


def _reference(torch: Any, q: Any, kv: List, chosen: List) -> Any:
    """float64 attention of each query head over its KV head's chosen
    blocks (all when chosen[b][h] is None)."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, (k, v) in enumerate(kv):
        n = k.shape[0]
        for h in range(H):
            idx = torch.arange(n, device=q.device)
            if chosen[b][h] is not None:
                keep = torch.isin(idx // P, chosen[b][h])
                idx = idx[keep]
            for g in range(G):
                s = k[idx, h] @ q[b, h * G + g].double() / math.sqrt(D)
                p = torch.softmax(s, 0)
                out[b, h * G + g] = p @ v[idx, h]
    return out


def check_dense_and_sparse(torch: Any, cache_dtype: Any) -> None:
    from vflow import torch_ops

    lengths = [300, 1000, 77]
    k_cache, v_cache, table, kv = _setup(torch, lengths, cache_dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(len(lengths), H * G, D, generator=gen,
                    device="cuda").bfloat16()
    tol = 2e-2 if cache_dtype == torch.bfloat16 else 4e-2
    # Dense: one list per sequence, every block.
    w = torch_ops.PagedDecodeWrapper()
    w.plan_dense(table, seq_lens, kv_heads=H, group=G, head_dim=D,
                 page_size=P)
    out = w.run(q, k_cache, v_cache)
    want = _reference(torch, q, kv, [[None] * H for _ in lengths])
    dense_err = ((out.double() - want).norm() / want.norm()).item()
    assert dense_err < tol, ("dense", cache_dtype, dense_err)
    # Sparse: per (sequence, KV head) a random set of blocks, with the mass.
    chosen, pages, blocks, indptr = [], [], [], [0]
    for b, n in enumerate(lengths):
        nb = (n + P - 1) // P
        row = []
        for h in range(H):
            pick = torch.randperm(nb, generator=gen, device="cuda")[:max(1, nb // 3)]
            pick = pick.sort().values
            row.append(pick)
            pages.append(table[b, pick])
            blocks.append(pick.int())
            indptr.append(indptr[-1] + int(pick.numel()))
        chosen.append(row)
    w.plan(torch.tensor(indptr, dtype=torch.int32, device="cuda"),
           torch.cat(pages).int().contiguous(), torch.cat(blocks).contiguous(),
           seq_lens, kv_heads=H, group=G, head_dim=D)
    mass = torch.zeros(len(lengths), H, int(table.shape[1]), G, device="cuda")
    out = w.run(q, k_cache, v_cache, mass=mass)
    want = _reference(torch, q, kv, chosen)
    err = ((out.double() - want).norm() / want.norm()).item()
    assert err < tol, ("sparse", cache_dtype, err)
    sums = mass.sum(2)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-3), sums
    print(f"paged_decode {cache_dtype}: error against float64: dense "
          f"{dense_err:.4f}, sparse {err:.4f}; mass sums to 1")


def check_opcheck_graph_compile(torch: Any) -> None:
    from vflow import torch_ops

    lengths = [200, 513]
    k_cache, v_cache, table, kv = _setup(torch, lengths, torch.bfloat16)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    w = torch_ops.PagedDecodeWrapper()
    w.plan_dense(table, seq_lens, kv_heads=H, group=G, head_dim=D,
                 page_size=P)
    q = torch.randn(2, H * G, D, device="cuda").bfloat16()
    p = w._plan
    out = torch.empty_like(q)
    args = (q, k_cache, v_cache, p["indptr"], p["pages"], p["blocks"],
            p["seq_lens"], p["scale"], p["max_entries"],
            p["lists_per_sequence"], out, None, p["workspace"])
    torch.library.opcheck(torch.ops.vflow.paged_decode.default, args)
    k = torch.randn(3, H, D, device="cuda").bfloat16()
    torch.library.opcheck(
        torch.ops.vflow.write_kv.default,
        (k, k.clone(), table[0, :3].contiguous(),
         torch.tensor([5, 6, 7], dtype=torch.int32, device="cuda"),
         k_cache.clone(), v_cache.clone()))
    eager = w.run(q, k_cache, v_cache)
    # A CUDA graph of run(): replays equal the eager output.
    static_out = torch.empty_like(q)
    graph = capture_graph(torch,
                          lambda: w.run(q, k_cache, v_cache, out=static_out))
    static_out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, eager), "graph replay differs"
    # torch.compile(fullgraph=True) of a step made of the ops.
    def step(q: Any, k: Any, v: Any, pages: Any, slots: Any, kc: Any,
             vc: Any) -> Any:
        torch.ops.vflow.write_kv(k, v, pages, slots, kc, vc)
        return w.run(q * 1.0, kc, vc)

    compiled = torch.compile(step, fullgraph=True)
    kn = torch.randn(1, H, D, device="cuda").bfloat16()
    pg = table[0, 12:13].contiguous()
    sl = torch.tensor([8], dtype=torch.int32, device="cuda")
    kc1, vc1 = k_cache.clone(), v_cache.clone()
    kc2, vc2 = k_cache.clone(), v_cache.clone()
    a = step(q, kn, kn, pg, sl, kc1, vc1)
    b = compiled(q, kn, kn, pg, sl, kc2, vc2)
    assert torch.equal(a, b) and torch.equal(kc1, kc2), "compiled differs"
    print("opcheck, CUDA graph replay and torch.compile(fullgraph=True) ok")


def check_errors(torch: Any) -> None:
    from vflow import torch_ops

    torch_ops.load()
    k = torch.zeros(2, H, D, device="cuda")  # float32: wrong
    kc = torch.zeros(4, H, P, D, device="cuda").bfloat16()
    idx = torch.zeros(2, dtype=torch.int32, device="cuda")
    try:
        torch.ops.vflow.write_kv(k, k, idx, idx, kc, kc.clone())
        raise AssertionError("float32 k accepted")
    except RuntimeError as e:
        assert "k must be bfloat16" in str(e), e
    try:  # a message with numbers (c10::str of integers is avoided)
        torch.ops.vflow.write_kv(k[:, :1].bfloat16().contiguous(),
                                 k[:, :1].bfloat16().contiguous(), idx, idx,
                                 kc, kc.clone())
        raise AssertionError("k of the wrong shape accepted")
    except RuntimeError as e:
        assert f"k must be [tokens, {H}, {D}], got [2, 1, {D}]" in str(e), e
    print("bad tensors are errors naming the argument")


def run_all() -> None:
    torch = torch_with_gpu()
    check_dense_and_sparse(torch, torch.bfloat16)
    check_dense_and_sparse(torch, torch.float8_e4m3fn)
    check_opcheck_graph_compile(torch)
    check_errors(torch)


def test_torch_ops() -> None:
    if torch_with_gpu() is None:
        import pytest

        pytest.skip("no torch with a GPU")
    run_all()


if __name__ == "__main__":
    if torch_with_gpu() is None:
        print("no torch with a GPU")
        sys.exit(1)
    run_all()
