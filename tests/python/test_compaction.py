"""Token-grain eviction with compaction on the CPU session (issue 32):
Session.evict_tokens drops single tokens and repacks the kept ones in order
into the fewest pages. What the session holds afterwards must equal a
session that appended only the kept tokens (attention, the selection, the
fields of rewritten blocks), a page shared with a fork is copied and never
rewritten under it, and bad input changes nothing."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import vflow
from conftest import EXAMPLES
# The float64 reference and the shapes it is written for.
from test_retain import D, G, H, P, dense

LAYERS = 2


def session(budget: int = 1000) -> vflow.Session:
    prog = vflow.compile_file(str(EXAMPLES / "quest.vflow"),
                              params={"block_size": P, "budget": budget})
    return vflow.Session(prog, layers=LAYERS, kv_heads=H, group=G,
                         head_dim=D, max_pages=64, kv_dtype="f32",
                         quiet=True)


def fill(s: vflow.Session, seq: int, ks: List[np.ndarray],
         vs: List[np.ndarray]) -> None:
    for layer in range(LAYERS):
        s.append(layer, seq, ks[layer], vs[layer])


def random_kv(rng: np.random.Generator, n: int) -> List[np.ndarray]:
    return [rng.standard_normal((n, H, D), dtype=np.float32)
            for _ in range(LAYERS)]


def step(s: vflow.Session, seq: int, q: np.ndarray, k: np.ndarray,
         v: np.ndarray) -> List[np.ndarray]:
    """One decode step: the token (k, v [LAYERS, 1, H, D]) then q."""
    outs = []
    for layer in range(LAYERS):
        s.append(layer, seq, k[layer], v[layer])
        outs.append(s.decode(layer, seq, q[layer])[0])
    return outs


def test_compaction_equals_appending_the_kept_tokens() -> None:
    """20 blocks and 5 tokens; every third token of blocks 3-12 evicted:
    the session then attends exactly the kept tokens (float64), and a
    session that appended only them selects the same blocks and writes the
    same outputs step after step (Quest's fields of the rewritten blocks
    were computed again); 10 pages come back."""
    rng = np.random.default_rng(1)
    n = 20 * P + 5
    ks, vs = random_kv(rng, n), random_kv(rng, n)
    drop = [t for t in range(3 * P, 13 * P) if t % 3 == 0]
    keep = np.array([t for t in range(n) if t not in set(drop)])
    s, fresh = session(budget=6), session(budget=6)
    a, b = s.add_sequence(), fresh.add_sequence()
    fill(s, a, ks, vs)
    fill(fresh, b, [k[keep] for k in ks], [v[keep] for v in vs])
    free = s.free_pages()
    s.evict_tokens(a, drop)
    # 21 pages before (325 tokens), 17 after (271).
    assert s.free_pages() == free + 4
    assert s.length(a) == fresh.length(b) == n - len(drop)
    assert s.position(a) == n
    assert s.original_position(a, 3 * P) == 3 * P + 1
    assert s.original_position(a, s.length(a) - 1) == n - 1
    assert s.original_block(a, 3) == 3
    for i in range(4):
        q = rng.standard_normal((LAYERS, 1, H * G, D), dtype=np.float32)
        k = rng.standard_normal((LAYERS, 1, H, D), dtype=np.float32)
        v = rng.standard_normal((LAYERS, 1, H, D), dtype=np.float32)
        got, want = step(s, a, q, k, v), step(fresh, b, q, k, v)
        for layer in range(LAYERS):
            np.testing.assert_array_equal(got[layer], want[layer])
            assert s.selection(a, layer) == fresh.selection(b, layer)
    # Every kept token attended: float64 over the kept tokens.
    s2 = session()
    c = s2.add_sequence()
    fill(s2, c, ks, vs)
    s2.evict_tokens(c, drop)
    q = rng.standard_normal((LAYERS, 1, H * G, D), dtype=np.float32)
    k = rng.standard_normal((LAYERS, 1, H, D), dtype=np.float32)
    outs = step(s2, c, q, k, k)
    for layer in range(LAYERS):
        kk = np.concatenate([ks[layer][keep], k[layer]])
        vv = np.concatenate([vs[layer][keep], k[layer]])
        np.testing.assert_allclose(outs[layer], dense(q[layer][0], kk, vv),
                                   rtol=2e-4, atol=2e-5)


def test_a_shared_page_is_copied_not_rewritten() -> None:
    """A fork shares every page; evicting tokens from the child copies the
    pages it rewrites, so the parent still attends all its tokens, and the
    pool pays only for the copies."""
    rng = np.random.default_rng(2)
    n = 8 * P
    ks, vs = random_kv(rng, n), random_kv(rng, n)
    s = session()
    parent = s.add_sequence()
    fill(s, parent, ks, vs)
    child = s.fork(parent)
    free = s.free_pages()
    s.evict_tokens(child, list(range(2 * P, 2 * P + 20)))
    # Blocks 2..6 of the child are rewritten (7 now: 108 tokens): 5 copies.
    assert s.length(child) == n - 20
    assert s.free_pages() == free - 5
    q = rng.standard_normal((LAYERS, 1, H * G, D), dtype=np.float32)
    k = rng.standard_normal((LAYERS, 1, H, D), dtype=np.float32)
    outs = step(s, parent, q, k, k)
    for layer in range(LAYERS):
        kk = np.concatenate([ks[layer], k[layer]])
        vv = np.concatenate([vs[layer], k[layer]])
        np.testing.assert_allclose(outs[layer], dense(q[layer][0], kk, vv),
                                   rtol=2e-4, atol=2e-5)
    s.release(parent)
    s.release(child)
    assert s.free_pages() == 64


def test_pages_come_back_and_bad_input_changes_nothing() -> None:
    rng = np.random.default_rng(3)
    n = 10 * P + 7
    ks, vs = random_kv(rng, n), random_kv(rng, n)
    s = session()
    a = s.add_sequence()
    fill(s, a, ks, vs)
    free = s.free_pages()
    for bad, why in (([5, 4], "strictly increasing"),
                     ([10 * P + 1], "not in a complete block"),
                     ([-1], r"tokens\[0\]: -1 is out of range")):
        with pytest.raises(Exception, match=why):
            s.evict_tokens(a, bad)
        assert s.length(a) == n and s.free_pages() == free
    with pytest.raises(Exception, match="sequence 7 does not exist"):
        s.evict_tokens(a + 7, [1])
    # Mid-step (layer 0 holds a token layer 1 does not): refused.
    one = rng.standard_normal((1, H, D), dtype=np.float32)
    s.append(0, a, one, one)
    with pytest.raises(Exception, match="mid-step"):
        s.evict_tokens(a, [1])
    s.append(1, a, one, one)
    # Half of every block: 5 pages (and a bit) come back.
    s.evict_tokens(a, [t for t in range(10 * P) if t % 2])
    assert s.length(a) == 5 * P + 8
    assert s.free_pages() == free + 5
    assert s.stats()["tokens_evicted"] == 80
    # Block eviction after a token-grain one keeps the origins straight.
    s.evict(a, [1])
    assert s.original_position(a, P) == 2 * (2 * P)
    assert s.position(a) == n + 1
    assert s.stats()["tokens_evicted"] == 80 + P


def test_first_token_is_where_each_block_began() -> None:
    """`first_token`: the original position of each block's first token.
    Until a sequence evicts it is block * block_size, and a flow scoring
    first_token - position * block_size ties everywhere (block 1, the first
    candidate, wins). evict_tokens drops tokens 81, 82 and 87 (block 5):
    block 5 still begins at token 80, block 6 at 99 (3 late), so block 6
    wins; evict then drops blocks 1 and 2 and that block, now block 4,
    begins 35 tokens after 4 * 16, the most."""
    source = ("flow moved { param budget = 1; index {\n"
              f"  return topk(first_token - position * {P}, budget); }} }}\n")
    prog = vflow.compile(source, params={"block_size": P})
    s = vflow.Session(prog, layers=LAYERS, kv_heads=H, group=G,
                      head_dim=D, max_pages=64, kv_dtype="f32", quiet=True)
    rng = np.random.default_rng(3)
    n = 10 * P + 4
    a = s.add_sequence()
    fill(s, a, random_kv(rng, n), random_kv(rng, n))
    q = rng.standard_normal((1, H * G, D), dtype=np.float32)

    def picked() -> List[int]:
        """The selection's blocks besides the kept first and last ones
        and the partial block."""
        s.decode(0, a, q)
        complete = s.length(a) // P
        return sorted(set(s.selection(a, 0)[0]) - {0, complete - 1, complete})

    assert picked() == [1]
    s.evict_tokens(a, [5 * P + 1, 5 * P + 2, 5 * P + 7])
    assert s.original_position(a, 6 * P) == 6 * P + 3
    assert picked() == [6]
    s.evict(a, [1, 2])
    assert picked() == [4]
