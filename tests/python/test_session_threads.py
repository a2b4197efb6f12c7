"""vflow.Session shared by threads (issue 27 #3): each thread appends to and
decodes its own sequences while the others do the same; every output equals
the one of the same work done on a session of its own, in one thread. The
bindings release the GIL, so the threads really overlap; the session takes
its lock per call (it failed spuriously even on disjoint sequences)."""

from __future__ import annotations

import pathlib
import threading
from typing import Dict, List, Tuple

import numpy as np
import pytest

import vflow

H, G, D, LAYERS = 2, 4, 64, 2
THREADS, STEPS = 6, 24


def work(seed: int) -> Tuple[np.ndarray, np.ndarray, List[np.ndarray]]:
    """A prompt's K/V [LAYERS, T, H, D] and a query per step and layer."""
    rng = np.random.default_rng(seed)
    t = 300 + 37 * seed
    # Layer-major, so that a layer's rows are contiguous.
    kv = rng.standard_normal((2, LAYERS, t + STEPS, H, D)).astype(np.float32)
    qs = [rng.standard_normal((1, H * G, D)).astype(np.float32)
          for _ in range(STEPS * LAYERS)]
    return kv[0], kv[1], qs


def run(session: vflow.Session, seed: int, prompt: int) -> List[np.ndarray]:
    """Appends the prompt, then STEPS decode steps of one token each."""
    k, v, qs = work(seed)
    seq = session.add_sequence()
    outs = []
    for layer in range(LAYERS):
        session.append(layer, seq, k[layer, :prompt], v[layer, :prompt])
    for step in range(STEPS):
        at = prompt + step
        for layer in range(LAYERS):
            session.append(layer, seq, k[layer, at:at + 1],
                           v[layer, at:at + 1])
            outs.append(session.decode(layer, [seq], qs[step * LAYERS + layer]))
        session.budget(seq)
        session.stats()
    session.release(seq)
    return outs


@pytest.mark.parametrize("program", ["quest", "h2o"])
def test_threads_share_one_session(program: str) -> None:
    prog = vflow.compile_file(_example(program),
                              params={"budget": 2, "block_size": 16})
    def make() -> vflow.Session:
        return vflow.Session(prog, layers=LAYERS, kv_heads=H, group=G,
                             head_dim=D, max_pages=2048, kv_dtype="f32",
                             quiet=True)

    prompts = {s: 300 + 37 * s for s in range(THREADS)}
    alone = {s: run(make(), s, prompts[s]) for s in range(THREADS)}
    shared = make()
    got: Dict[int, List[np.ndarray]] = {}
    errors: List[BaseException] = []

    def thread(s: int) -> None:
        try:
            for _ in range(3):
                got[s] = run(shared, s, prompts[s])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=thread, args=(s,))
               for s in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors, errors
    for s in range(THREADS):
        for a, b in zip(alone[s], got[s]):
            np.testing.assert_array_equal(a, b)


def _example(name: str) -> str:
    root = pathlib.Path(__file__).resolve().parents[2]
    return str(root / "examples" / f"{name}.vflow")
