"""What the model-family tests share (test_moe.py, test_deepseek.py):
prompts of random ids, the float64 reference's greedy tokens (its top-2
margins large enough that float32 rounding cannot flip one), and an
engine's greedy tokens, alone and batched, against them."""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

import vflow


def prompt(length: int, salt: int, base: int, vocab: int = 64) -> List[int]:
    """`length` random ids in [3, vocab) (a fixed draw per arguments)."""
    rng = np.random.default_rng(base + 7919 * salt + length)
    return [int(t) for t in rng.integers(3, vocab, length)]


def greedy_params(n: int) -> Any:
    return vflow.SamplingParams(max_tokens=n, temperature=0.0,
                                ignore_eos=True)


def reference_greedy(ref: Any, p: Sequence[int], n: int,
                     min_margin: float = 1e-3) -> List[int]:
    """The reference's n greedy tokens after `p`; a test setup whose top-2
    margin falls below `min_margin` somewhere is an error of its own."""
    tokens, margins = ref.greedy_with_margins(list(p), n)
    assert min(margins) > min_margin, (
        f"test setup: prompt {list(p)}: a top-2 margin of {min(margins):.2e}")
    return [int(t) for t in tokens]


def matches_reference(engine: Any, ref: Any, prompts: Sequence[List[int]],
                      n: int) -> None:
    """The engine's greedy tokens equal the reference's for each prompt
    alone, then for all of them batched (every step's rows together)."""
    want = [reference_greedy(ref, p, n) for p in prompts]
    for p, w in zip(prompts, want):
        (out,) = engine.generate([p], greedy_params(n))
        assert [int(t) for t in out.token_ids] == w, p
    outs = engine.generate(list(prompts), greedy_params(n))
    assert [[int(t) for t in o.token_ids] for o in outs] == want
