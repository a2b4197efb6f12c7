"""Hysteresis through `mass` (examples/sticky_quest.vflow): the previous
step's attended blocks are `max(mass, head) > 0`, so a bonus on them keeps
the selection where plain Quest moves (docs/design/language-round2.md)."""

from __future__ import annotations

from typing import List, Set

import numpy as np

import vflow
from conftest import EXAMPLES

H, G, D, P = 2, 2, 16, 16
TOKENS, STEPS, BUDGET = 16 * 24, 6, 4


def chosen(source: str, bonus: float) -> List[List[Set[int]]]:
    """Per step and KV head, the blocks a flow chose beyond the kept first
    and last blocks, on one sequence with fresh random queries each step."""
    params = {"block_size": P, "budget": BUDGET}
    if "bonus" in source:
        params["bonus"] = bonus
    prog = vflow.compile(source, params=params)
    s = vflow.Session(prog, layers=1, kv_heads=H, group=G, head_dim=D,
                      max_pages=64, kv_dtype="f32", quiet=True)
    rng = np.random.default_rng(11)
    seq = s.add_sequence()
    k = rng.standard_normal((TOKENS, H, D), dtype=np.float32)
    s.append(0, seq, k, k)
    steps = []
    for _ in range(STEPS):
        q = 3 * rng.standard_normal((1, H * G, D), dtype=np.float32)
        s.decode(0, seq, q)
        last = (s.length(seq) - 1) // P  # the kept last or partial block
        steps.append([set(b) - {0, last, last - 1}
                      for b in s.selection(seq, 0)])
        one = rng.standard_normal((1, H, D), dtype=np.float32)
        s.append(0, seq, one, one)
    return steps


def test_sticky_quest_keeps_the_previous_selection() -> None:
    sticky = (EXAMPLES / "sticky_quest.vflow").read_text()
    steps = chosen(sticky, bonus=1e4)
    for before, after in zip(steps, steps[1:]):
        for h in range(H):
            assert after[h] and after[h] <= before[h]
    # The first step has no mass: plain Quest's choice.
    plain = chosen((EXAMPLES / "quest.vflow").read_text(), bonus=0)
    assert steps[0] == plain[0]
    # The check can fail: plain Quest moves on these queries.
    assert any(a != b for x, y in zip(plain, plain[1:]) for a, b in zip(x, y))
    # Without the bonus it is Quest again.
    assert chosen(sticky, bonus=0) == plain
