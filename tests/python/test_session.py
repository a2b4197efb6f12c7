"""vflow.Session on numpy arrays (the CPU backend)."""

from __future__ import annotations

import math
from typing import List

import numpy as np
import pytest

import vflow

H, G, D = 2, 3, 16


def make(source: str, **params: object) -> vflow.Program:
    return vflow.compile(source, params={"block_size": 16, **params})


def session(prog: vflow.Program, layers: int, max_pages: int,
            **options: object) -> vflow.Session:
    """A quiet session of `prog` over H KV heads of G query heads of D."""
    return vflow.Session(prog, layers=layers, kv_heads=H, group=G, head_dim=D,
                         max_pages=max_pages, quiet=True, **options)


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 reference: q [H*G, D] against k, v [T, H, D]."""
    out = np.empty((H * G, D))
    scale = 1.0 / math.sqrt(D)
    for h in range(H):
        for g in range(G):
            s = (k[:, h, :].astype(np.float64) @ q[h * G + g].astype(np.float64)) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            out[h * G + g] = p @ v[:, h, :].astype(np.float64)
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_every_block_selected_equals_dense_attention(
    quest_source: str, rng: np.random.Generator
) -> None:
    prog = make(quest_source, budget=1000)
    s = session(prog, layers=2, max_pages=64, kv_dtype="f32")
    a, b = s.add_sequence(), s.add_sequence()
    ks = {a: [], b: []}
    vs = {a: [], b: []}
    lengths = [70, 33]
    for layer in range(2):
        k = rng.standard_normal((sum(lengths), H, D), dtype=np.float32)
        v = rng.standard_normal((sum(lengths), H, D), dtype=np.float32)
        s.append(layer, [a, b], k, v, lengths=lengths)
        if layer == 0:
            ks[a], ks[b] = k[:70], k[70:]
            vs[a], vs[b] = v[:70], v[70:]
    q = rng.standard_normal((2, H * G, D), dtype=np.float32)
    out = s.decode(0, [a, b], q)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    for row, seq in enumerate([a, b]):
        want = dense(q[row], ks[seq], vs[seq])
        np.testing.assert_allclose(out[row], want, rtol=2e-4, atol=2e-5)
    sel = s.selection(a, 0)
    assert len(sel) == H and sel[0] == list(range(5))
    assert s.length(a) == 70 and s.length(b) == 33


def test_decode_steps_layer_by_layer_with_float16(
    quest_source: str, rng: np.random.Generator
) -> None:
    prog = make(quest_source, budget=2)
    s = session(prog, layers=2, max_pages=64)
    seq = s.add_sequence()
    for layer in range(2):
        k = rng.standard_normal((100, H, D)).astype(np.float16)
        s.append(layer, seq, k, k)
    for step in range(3):
        for layer in range(2):
            k = rng.standard_normal((1, H, D)).astype(np.float16)
            s.append(layer, seq, k, k)
            q = rng.standard_normal((1, H * G, D)).astype(np.float16)
            out = np.zeros_like(q)
            assert s.decode(layer, seq, q, out=out) is out
            assert np.isfinite(out).all() and np.abs(out).sum() > 0
            blocks = s.selection(seq, layer)[0]
            # kept first block, budget 2, kept last, the partial last block
            assert len(blocks) <= 1 + 2 + 1 + 1
    st = s.stats()
    assert st["decodes"] == 6 and st["blocks_attended"] > 0
    assert s.budget(seq) == 2


def test_fork_share_prefix_and_release(
    quest_source: str, rng: np.random.Generator
) -> None:
    prog = make(quest_source, budget=1000)
    s = session(prog, layers=1, max_pages=8, kv_dtype="f32")
    a = s.add_sequence()
    k = rng.standard_normal((40, H, D), dtype=np.float32)
    s.append(0, a, k, k)
    b = s.fork(a)
    c = s.share_prefix(a, 32)
    assert s.length(b) == 40 and s.length(c) == 32
    with pytest.raises(RuntimeError, match="whole number of blocks"):
        s.share_prefix(a, 20)
    q = rng.standard_normal((3, H * G, D), dtype=np.float32)
    out = s.decode(0, [a, b, c], q)
    np.testing.assert_allclose(out[2], dense(q[2], k[:32], k[:32]), rtol=2e-4,
                               atol=2e-5)
    for seq in (a, b, c):
        s.release(seq)
    # Every page is back: a sequence as long as the pool fits again.
    d = s.add_sequence()
    s.append(0, d, rng.standard_normal((128, H, D), dtype=np.float32),
             rng.standard_normal((128, H, D), dtype=np.float32))
    with pytest.raises(RuntimeError, match="exhausted"):
        s.append(0, d, k[:1], k[:1])
    assert s.length(d) == 128


def test_evict_returns_pages_and_attends_the_rest(
    quest_source: str, rng: np.random.Generator
) -> None:
    prog = make(quest_source, budget=1000)
    s = session(prog, layers=1, max_pages=8, kv_dtype="f32")
    a = s.add_sequence()
    k = rng.standard_normal((100, H, D), dtype=np.float32)
    v = rng.standard_normal((100, H, D), dtype=np.float32)
    s.append(0, a, k, v)  # 7 of the 8 pages
    s.evict(a, [1, 4])
    assert s.length(a) == 68 and s.position(a) == 100
    kept = np.r_[0:16, 32:64, 80:100]
    q = rng.standard_normal((1, H * G, D), dtype=np.float32)
    np.testing.assert_allclose(s.decode(0, a, q)[0],
                               dense(q[0], k[kept], v[kept]),
                               rtol=2e-4, atol=2e-5)
    # Two pages came back: 44 more tokens fit (112 tokens, 7 pages; 144
    # tokens would need 9 of the 8).
    more = rng.standard_normal((44, H, D), dtype=np.float32)
    s.append(0, a, more, more)
    assert s.position(a) == 144
    with pytest.raises(RuntimeError, match="strictly increasing"):
        s.evict(a, [3, 2])
    with pytest.raises(RuntimeError, match="not a complete block"):
        s.evict(a, [7])
    with pytest.raises(ValueError, match="blocks"):
        s.evict(a, [-1])
    assert s.length(a) == 112


def test_bad_tensors_are_value_errors_naming_the_argument(
    quest_source: str,
) -> None:
    prog = make(quest_source)
    s = session(prog, layers=1, max_pages=8)
    seq = s.add_sequence()
    good = np.zeros((4, H, D), np.float32)
    cases: List[tuple] = [
        (np.zeros((4, H, D + 1), np.float32), good, "k has shape"),
        (good, np.zeros((4, H), np.float32), "v has 2 dimensions"),
        (np.zeros((4, H, D), np.int32), good, "k is int32"),
        (np.zeros((4, H, D), np.float64), good, "k is float64"),
        (np.zeros((H, 4, D), np.float32).transpose(1, 0, 2), good,
         "k is not contiguous"),
        ([[0.0]], good, "k: list is not a tensor"),
    ]
    for k, v, message in cases:
        with pytest.raises(ValueError, match=message):
            s.append(0, seq, k, v)
    s.append(0, seq, good, good)
    with pytest.raises(ValueError, match="q has shape"):
        s.decode(0, seq, np.zeros((1, H, D), np.float32))
    with pytest.raises(ValueError, match="out is float16"):
        s.decode(0, seq, np.zeros((1, H * G, D), np.float32),
                 out=np.zeros((1, H * G, D), np.float16))
    with pytest.raises(ValueError, match="lengths"):
        s.append(0, [seq, seq], good, good)
    with pytest.raises(ValueError, match="max_pages"):
        vflow.Session(prog, layers=1, kv_heads=H, group=G, head_dim=D,
                      max_pages=0)
    with pytest.raises(ValueError, match="device"):
        vflow.Session(prog, layers=1, kv_heads=H, group=G, head_dim=D,
                      max_pages=8, device="tpu")


def test_set_params(quest_source: str) -> None:
    prog = make(quest_source, budget=4)
    s = session(prog, layers=1, max_pages=8)
    s.set_params(budget=2)
    assert s.param("budget") == 2
    with pytest.raises(ValueError, match="nosuch"):
        s.set_params(nosuch=1)
    with pytest.raises(ValueError, match="block_size"):
        s.set_params(budget=3, block_size=32)
    assert s.param("budget") == 2  # nothing changed
    with pytest.raises(ValueError, match="budget"):
        s.set_params(budget=-1)
