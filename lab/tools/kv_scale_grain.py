#!/usr/bin/env python3
"""Scaled 8-bit KV: one scale per (token, KV head), as the cache keeps it,
against one per (block, KV head), the alternative issue 32 asks to measure.

    python3 lab/tools/kv_scale_grain.py [--blocks 64] [--block-size 16]

For int8 (round half to even, +-127) it prints, per kind of key data, the
relative RMS error of the stored values and of the attention output against
float64, for both grains, and the bytes a 128-wide row takes. The data:
Gaussian keys; keys whose per-token norm varies (a log-normal factor, as
real keys' norms do); and keys with a few outlier channels (x10), the
pattern KIVI and KVQuant report for real models' keys. Needs numpy.
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict

import numpy as np


def int8_store(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x stored as int8 codes times `scale` (broadcast), float32 math."""
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(scale == 0, 0,
                     np.clip(np.rint(x / scale), -127, 127))
    return (q * scale).astype(np.float32)


def per_token(x: np.ndarray, block: int) -> np.ndarray:
    """x [tokens, D]: a scale per token."""
    return int8_store(x, np.abs(x).max(axis=1, keepdims=True) / 127)


def per_block(x: np.ndarray, block: int) -> np.ndarray:
    """x [tokens, D]: a scale per block of `block` tokens."""
    t, d = x.shape
    xb = x.reshape(t // block, block, d)
    scale = np.abs(xb).max(axis=(1, 2), keepdims=True) / 127
    return int8_store(xb, scale).reshape(t, d)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = (k.astype(np.float64) @ q.astype(np.float64)) / np.sqrt(len(q))
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v.astype(np.float64)


def data(kind: str, rng: np.random.Generator, t: int, d: int) -> np.ndarray:
    x = rng.standard_normal((t, d)).astype(np.float32)
    if kind == "norms":
        x *= np.exp(rng.normal(0, 0.5, (t, 1))).astype(np.float32)
    elif kind == "outliers":
        x[:, rng.choice(d, 4, replace=False)] *= 10
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=8)
    a = ap.parse_args()
    t, d = a.blocks * a.block_size, a.head_dim
    grains: Dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
        "token": per_token, "block": per_block}
    print(f"int8, {t} tokens, head dim {d}, block {a.block_size}, "
          f"{a.seeds} seeds: relative RMS error (values; attention output)")
    print(f"bytes a row: token {d + 4}, block {d + 4 / a.block_size:.2f}, "
          f"bf16 {2 * d}")
    for kind in ("gaussian", "norms", "outliers"):
        errs: Dict[str, list] = {g: [[], []] for g in grains}
        for seed in range(a.seeds):
            rng = np.random.default_rng(seed)
            k, v = data(kind, rng, t, d), data("gaussian", rng, t, d)
            # A query that picks out a few keys, as decode queries do.
            q = (k[rng.choice(t, 4)].sum(0) * 0.5).astype(np.float32)
            ref = attention(q, k, v)
            for g, store in grains.items():
                ks, vs = store(k, a.block_size), store(v, a.block_size)
                errs[g][0].append(np.sqrt(((ks - k) ** 2).mean()
                                          / (k ** 2).mean()))
                out = attention(q, ks, vs)
                errs[g][1].append(np.linalg.norm(out - ref)
                                  / np.linalg.norm(ref))
        row = "  ".join(f"{g}: {np.mean(e[0]):.2e}; {np.mean(e[1]):.2e}"
                        for g, e in errs.items())
        print(f"{kind:9s} {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
