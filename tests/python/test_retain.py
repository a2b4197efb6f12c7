"""The retain block on the CPU session (issue 32): past its capacity a
sequence keeps the best complete blocks by the score summed over KV heads
and flow layers, the kept first and last blocks among them; the rest is
evicted, its pages return to the pool, and attention goes on over exactly
the kept tokens."""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest

import vflow
from conftest import EXAMPLES
from tiny_model import Reference, read_config, write_model

H, G, D, P = 2, 2, 16, 16
LAYERS, BLOCKS, CAPACITY = 2, 20, 5
N_NEW = 40


def prompt_ids(length: int, salt: int) -> List[int]:
    rng = np.random.default_rng(4000 + 7919 * salt + length)
    return [int(t) for t in rng.integers(3, 64, length)]

FLOW = """
flow keep_peaks {
  param budget = 1000;
  param capacity = %d;
  cache kmax = max(K, token);
  index {
    return topk(max(sum(q * kmax, dim), head), budget);
  }
  retain(capacity%s) {
    return sum(kmax, dim);
  }
}
"""


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 attention of q [H*G, D] over k, v [T, H, D]."""
    out = np.empty((H * G, D))
    for h in range(H):
        for g in range(G):
            s = k[:, h].astype(np.float64) @ q[h * G + g].astype(np.float64)
            p = np.exp((s - s.max()) / math.sqrt(D))
            out[h * G + g] = (p / p.sum()) @ v[:, h].astype(np.float64)
    return out


def expected_kept(ks: list, combine: str) -> list:
    """Block 0 and the last complete block, then the best of the rest by
    sum over dim of the block's max key, combined over heads and layers."""
    per = [k[:BLOCKS * P].reshape(BLOCKS, P, H, D).max(axis=1).sum(axis=2)
           for k in ks]  # [blocks, H] per layer
    stacked = np.stack(per)  # [layers, blocks, H]
    score = stacked.sum(axis=(0, 2)) if combine == "sum" else stacked.max(
        axis=(0, 2))
    middle = sorted(range(1, BLOCKS - 1), key=lambda b: (-score[b], b))
    return sorted([0, BLOCKS - 1] + middle[:CAPACITY - 2])


def filled(source: str, seed: int) -> Tuple[vflow.Session, int,
                                           List[np.ndarray], List[np.ndarray],
                                           np.random.Generator]:
    """A CPU session of `source` with one sequence of BLOCKS blocks of
    random K and V in every layer: (session, sequence, ks, vs, rng)."""
    prog = vflow.compile(source, params={"block_size": P})
    s = vflow.Session(prog, layers=LAYERS, kv_heads=H, group=G, head_dim=D,
                      max_pages=64, kv_dtype="f32", quiet=True)
    rng = np.random.default_rng(seed)
    seq = s.add_sequence()
    ks, vs = [], []
    for layer in range(LAYERS):
        k = rng.standard_normal((BLOCKS * P, H, D), dtype=np.float32)
        v = rng.standard_normal((BLOCKS * P, H, D), dtype=np.float32)
        s.append(layer, seq, k, v)
        ks.append(k)
        vs.append(v)
    return s, seq, ks, vs, rng


@pytest.mark.parametrize("combine", ["sum", "max"])
def test_retain_keeps_the_best_blocks_and_attends_them(combine: str) -> None:
    arg = "" if combine == "sum" else ", combine = max"
    s, seq, ks, vs, rng = filled(FLOW % (CAPACITY, arg), 5)
    for step in range(2):
        for layer in range(LAYERS):
            k = rng.standard_normal((1, H, D), dtype=np.float32)
            v = rng.standard_normal((1, H, D), dtype=np.float32)
            s.append(layer, seq, k, v)
            ks[layer] = np.concatenate([ks[layer], k])
            vs[layer] = np.concatenate([vs[layer], v])
            q = rng.standard_normal((1, H * G, D), dtype=np.float32)
            out = s.decode(layer, seq, q)[0]
            if step == 0:  # every token is still there
                want = dense(q[0], ks[layer], vs[layer])
            else:  # the kept blocks and the tokens after them
                keep = np.concatenate(
                    [np.arange(b * P, (b + 1) * P) for b in kept] +
                    [np.arange(BLOCKS * P, len(ks[layer]))])
                want = dense(q[0], ks[layer][keep], vs[layer][keep])
            np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)
        if step == 0:
            kept = expected_kept(ks, combine)
            assert s.length(seq) == CAPACITY * P + 1
            assert s.position(seq) == BLOCKS * P + 1
    st = s.stats()
    assert st["blocks_evicted"] == BLOCKS - CAPACITY
    assert st["pages_reclaimed"] == BLOCKS - CAPACITY


def test_retain_below_capacity_keeps_everything() -> None:
    prog = vflow.compile(FLOW % (64, ""), params={"block_size": P})
    s = vflow.Session(prog, layers=1, kv_heads=H, group=G, head_dim=D,
                      max_pages=64, kv_dtype="f32", quiet=True)
    rng = np.random.default_rng(6)
    seq = s.add_sequence()
    k = rng.standard_normal((BLOCKS * P + 3, H, D), dtype=np.float32)
    s.append(0, seq, k, k)
    s.decode(0, seq, rng.standard_normal((1, H * G, D), dtype=np.float32))
    assert s.length(seq) == BLOCKS * P + 3
    assert s.stats()["blocks_evicted"] == 0
    assert s.retained_blocks == 64
    quest = vflow.compile_file(os.path.join(EXAMPLES, "quest.vflow"))
    assert vflow.Session(quest, layers=1, kv_heads=H, group=G, head_dim=D,
                         max_pages=4, quiet=True).retained_blocks == -1


def test_streaming_llm_in_the_engine_matches_its_reference(
        tmp_path: pathlib.Path) -> None:
    """StreamingLLM (examples/streaming_llm.vflow) in the CPU engine: every
    decode row sees the first block (the sinks) and the last keep_last
    blocks and the partial one, as the float64 reference with that mask
    does, while evicted blocks return their pages and positions go on from
    the tokens the sequence had (RoPE)."""
    window = 2  # keep_last
    ref = Reference(write_model(tmp_path / "m", arch="llama", seed=41,
                                layers=2),
                    read_config(tmp_path / "m"))
    prompts = [prompt_ids(n, salt) for n, salt in ((70, 1), (23, 2))]

    def masked_for(start: int) -> Callable[[int], np.ndarray]:
        def masked(n: int) -> np.ndarray:
            m = np.zeros((n, n), dtype=bool)
            for r in range(start, n):  # decode rows; the prompt is causal
                first = max(P, P * ((r + 1) // P - window))
                m[r, P:first] = True
            return m
        return masked

    want = []
    for p in prompts:
        tokens, margins = ref.greedy_with_margins(p, N_NEW, masked_for(len(p)))
        assert min(margins) > 1e-3, "test setup: a rounding tie"
        want.append(tokens)
    # The eviction matters: with every token the reference parts.
    assert ref.greedy(prompts[0], N_NEW) != want[0]
    llm = vflow.LLM(str(tmp_path / "m"), kv_dtype="f32", device="cpu",
                    flow=str(EXAMPLES / "streaming_llm.vflow"),
                    params={"keep_last": window}, dense_layers=0,
                    enable_prefix_caching=False)
    params = vflow.SamplingParams(max_tokens=N_NEW, temperature=0.0,
                                  ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert [[int(t) for t in o.token_ids] for o in outs] == want
    st = llm.stats()
    assert st["blocks_evicted"] > 0 and st["pages_used"] == 0


def test_a_retain_block_admits_what_the_pool_could_not_hold(
        tmp_path: pathlib.Path) -> None:
    """A request whose tokens need more pages than the pool has is refused
    with dense attention; with StreamingLLM it holds at most its sinks, its
    window and the partial block, so it runs to max_tokens in that pool."""
    write_model(tmp_path / "m", arch="llama", seed=42, layers=2)
    params = vflow.SamplingParams(max_tokens=300, temperature=0.0,
                                  ignore_eos=True)
    p = prompt_ids(40, 3)
    dense = vflow.LLM(str(tmp_path / "m"), kv_dtype="f32", device="cpu",
                      kv_pool_tokens=8 * P)
    (out,) = dense.generate([p], params)
    assert out.finish_reason == "error" and "pages of the KV pool" in out.error
    stream = vflow.LLM(str(tmp_path / "m"), kv_dtype="f32", device="cpu",
                       kv_pool_tokens=8 * P, dense_layers=0,
                       flow=str(EXAMPLES / "streaming_llm.vflow"),
                       params={"keep_last": 2})
    (out,) = stream.generate([p], params)
    assert out.finish_reason == "length" and len(out.token_ids) == 300
    assert stream.stats()["blocks_evicted"] >= (340 // P) - 3
    assert out.blocks_evicted == stream.stats()["blocks_evicted"]
    assert out.tokens_evicted == P * out.blocks_evicted


def test_snapkv_compresses_the_prompt_once_and_keeps_what_it_generates(
        tmp_path: pathlib.Path) -> None:
    """examples/snapkv.vflow at capacity 4 after a 200-token prompt (12
    complete blocks): the first decode step evicts 8 prompt blocks (the
    window's vote ranks them); the block completed at token 208 holds
    generated tokens and never voted, so it is kept and one more prompt
    block goes: 9 evicted after 10 tokens."""
    write_model(tmp_path / "m", arch="llama", seed=43, layers=2)
    llm = vflow.LLM(str(tmp_path / "m"), kv_dtype="f32", device="cpu",
                    flow=str(EXAMPLES / "snapkv.vflow"), dense_layers=0,
                    params={"capacity": 4, "budget": 2},
                    enable_prefix_caching=False)
    (out,) = llm.generate([prompt_ids(200, 4)],
                          vflow.SamplingParams(max_tokens=10, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 10
    st = llm.stats()
    assert st["blocks_evicted"] == 9 and st["pages_reclaimed"] == 9
    assert st["tokens_evicted"] == 9 * P


def test_run_scores_an_evicting_flow_against_every_token() -> None:
    """vflowc run's workload with StreamingLLM: its lists are the kept
    blocks only, which are exactly what the random and oracle baselines
    pick too (no candidate is chosen), so all three rows agree once the
    session's block ids are mapped back to the reference's (they did not
    before: recall was scored on the wrong blocks)."""
    report = vflow.run(str(EXAMPLES / "streaming_llm.vflow"),
                       params={"keep_last": 4}, lengths=[1024, 2048],
                       steps=3, seeds=1)
    row = report["flows"][0]
    assert row["evicts"] is True
    for key in ("mass_recall", "output_rel_error"):
        assert row["selection"][key] == row["oracle"][key] == \
            row["random"][key]
    assert 0 < row["selection"]["mass_recall"] < 1


def test_a_capacity_below_the_kept_blocks_keeps_them() -> None:
    """The kept first and last blocks count in the capacity and are never
    evicted: at capacity 1 with keep_last 3 a sequence keeps 4 complete
    blocks (and its partial one), step after step."""
    prog = vflow.compile(FLOW % (1, ""), params={"block_size": P,
                                                 "keep_last": 3})
    s = vflow.Session(prog, layers=1, kv_heads=H, group=G, head_dim=D,
                      max_pages=64, kv_dtype="f32", quiet=True)
    rng = np.random.default_rng(8)
    seq = s.add_sequence()
    k = rng.standard_normal((BLOCKS * P, H, D), dtype=np.float32)
    s.append(0, seq, k, k)
    for _ in range(2 * P):
        one = rng.standard_normal((1, H, D), dtype=np.float32)
        s.append(0, seq, one, one)
        s.decode(0, seq, rng.standard_normal((1, H * G, D), dtype=np.float32))
        assert s.length(seq) // P == 4
    assert s.retained_blocks == 4
    assert s.position(seq) == BLOCKS * P + 2 * P
    assert s.stats()["blocks_evicted"] == BLOCKS + 2 - 4


#: Devices besides the CPU to check the engine's eviction on
#: (VFLOW_TEST_DEVICES, as tools/gpu.sh sets it on the GPU machine).
OTHER_DEVICES = [d for d in os.environ.get("VFLOW_TEST_DEVICES", "cpu")
                 .split(",") if d != "cpu"]


def evicts_alike(model: pathlib.Path, flow: str, params: Any,
                 prompts: List[List[int]], pool_pages: int, counter: str
                 ) -> None:
    """The engine with `flow` on the CPU and on every other device runs
    `prompts` past a pool of `pool_pages` pages to 200 tokens each and
    evicts the same (`counter`: "blocks_evicted" or "tokens_evicted", in
    all and per request) and reclaims the same pages; a token-grain flow
    evicts no whole block; nothing is left in the pool."""
    sampling = vflow.SamplingParams(max_tokens=200, temperature=0.0,
                                    ignore_eos=True)
    stats = {}
    for device in ["cpu"] + OTHER_DEVICES:
        llm = vflow.LLM(str(model), device=device, dense_layers=0,
                        kv_dtype="f32" if device == "cpu" else "bf16",
                        flow=flow, params=params,
                        kv_pool_tokens=pool_pages * P,
                        enable_prefix_caching=False)
        outs = llm.generate(prompts, sampling)
        assert [o.finish_reason for o in outs] == ["length"] * len(prompts), \
            [o.error for o in outs]
        st = llm.stats()
        stats[device] = (st[counter], st["pages_reclaimed"],
                         tuple(getattr(o, counter) for o in outs))
        assert sum(getattr(o, counter) for o in outs) == st[counter]
        assert st[counter] > 0 and st["pages_used"] == 0
        if counter == "tokens_evicted":
            assert st["blocks_evicted"] == 0
    assert len(set(stats.values())) == 1, stats


@pytest.mark.skipif(not OTHER_DEVICES,
                    reason="no device but the CPU in VFLOW_TEST_DEVICES")
@pytest.mark.parametrize("flow,params", [
    ("streaming_llm", {"keep_last": 2}),
    ("h2o_evict", {"capacity": 5, "keep_last": 2, "budget": 2}),
    ("snapkv", {"capacity": 4, "budget": 2})])
def test_the_engine_evicts_alike_on_every_device(
        tmp_path: pathlib.Path, flow: str, params: dict) -> None:
    """The engine on another device (the GPU: eviction at the end of each
    step, which CUDA graphs replay) evicts as many blocks as on the CPU for
    the same requests (the capacity rule counts blocks, whatever the scores
    chose) and runs a request past its pool to max_tokens."""
    write_model(tmp_path / "m", arch="llama", seed=44, layers=2, hidden=128,
                heads=4, kv_heads=2, head_dim=64)
    prompts = [prompt_ids(40, 5), prompt_ids(150, 6), prompt_ids(9, 7)]
    evicts_alike(tmp_path / "m", str(EXAMPLES / (flow + ".vflow")), params,
                 prompts, 40, "blocks_evicted")


def test_rkv_evicts_a_repeated_run_first() -> None:
    """examples/rkv_evict.vflow (R-KV at block grain): blocks 5-9 repeat
    block 4's keys, so their mean key points exactly where their
    predecessor's does (cosine 1) while random blocks' barely do; with
    redundancy weighted 0.9 the run's last five blocks are the ones a
    capacity of 15 of 20 evicts, and its first block stays."""
    prog = vflow.compile_file(str(EXAMPLES / "rkv_evict.vflow"),
                              params={"capacity": 15, "keep_last": 1,
                                      "budget": 4})
    s = vflow.Session(prog, layers=2, kv_heads=H, group=G, head_dim=D,
                      max_pages=64, kv_dtype="f32", quiet=True)
    rng = np.random.default_rng(9)
    seq = s.add_sequence()
    for layer in range(2):
        k = rng.standard_normal((BLOCKS * P, H, D), dtype=np.float32)
        for b in range(5, 10):
            k[b * P:(b + 1) * P] = k[4 * P:5 * P]
        s.append(layer, seq, k, rng.standard_normal(k.shape, dtype=np.float32))
    for layer in range(2):
        one = rng.standard_normal((1, H, D), dtype=np.float32)
        s.append(layer, seq, one, one)
        s.decode(layer, seq, rng.standard_normal((1, H * G, D),
                                                 dtype=np.float32))
    kept = [s.original_block(seq, b) for b in range(15)]
    assert kept == [b for b in range(BLOCKS) if not 5 <= b <= 9]
    assert s.stats()["blocks_evicted"] == 5
    with pytest.raises(Exception, match="has no block 16"):
        s.original_block(seq, 16)


TOKEN_FLOW = """
flow keep_loud {
  param budget = 1000;
  param capacity = %d;
  index {
    return topk(position, budget);
  }
  retain(capacity%s) {
    return sum(K * K, dim);
  }
}
"""


@pytest.mark.parametrize("combine", ["sum", "max"])
def test_a_token_score_keeps_the_best_tokens_and_compacts(
        combine: str) -> None:
    """A [block, token] score: past a capacity of 100 tokens the session
    keeps the kept first and last blocks' 32 tokens and the 68 others with
    the largest squared key norm (summed or maxed over KV heads and
    layers), repacks them into 7 pages and attends exactly them
    (float64)."""
    capacity = 100
    arg = "" if combine == "sum" else ", combine = max"
    s, seq, ks, vs, rng = filled(TOKEN_FLOW % (capacity, arg), 12)
    free = s.free_pages()
    norms = np.stack([(k.astype(np.float64) ** 2).sum(axis=2) for k in ks])
    score = norms.sum(axis=(0, 2)) if combine == "sum" else \
        norms.max(axis=(0, 2))  # [tokens]
    middle = sorted(range(P, (BLOCKS - 1) * P), key=lambda t: (-score[t], t))
    keep = sorted(list(range(P)) + list(range((BLOCKS - 1) * P, BLOCKS * P))
                  + middle[:capacity - 2 * P])
    for step in range(2):
        for layer in range(LAYERS):
            k = rng.standard_normal((1, H, D), dtype=np.float32)
            v = rng.standard_normal((1, H, D), dtype=np.float32)
            s.append(layer, seq, k, v)
            ks[layer] = np.concatenate([ks[layer], k])
            vs[layer] = np.concatenate([vs[layer], v])
            q = rng.standard_normal((1, H * G, D), dtype=np.float32)
            out = s.decode(layer, seq, q)[0]
            rows = np.arange(len(ks[layer])) if step == 0 else np.array(
                keep + list(range(BLOCKS * P, len(ks[layer]))))
            want = dense(q[0], ks[layer][rows], vs[layer][rows])
            np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)
        if step == 0:
            assert s.length(seq) == capacity + 1
            assert s.position(seq) == BLOCKS * P + 1
            assert [s.original_position(seq, t) for t in range(capacity)] \
                == keep
    st = s.stats()
    assert st["tokens_evicted"] == BLOCKS * P - capacity
    assert st["blocks_evicted"] == 0
    assert s.free_pages() == free + BLOCKS - 7


def test_a_token_score_runs_a_request_past_its_pool(
        tmp_path: pathlib.Path) -> None:
    """In the CPU engine a token-grain flow (capacity 40 tokens) holds at
    most its kept tokens and the partial block, so a request of 340 tokens
    runs to max_tokens in a pool of 8 pages that dense attention refuses."""
    write_model(tmp_path / "m", arch="llama", seed=45, layers=2)
    path = tmp_path / "keep_loud.vflow"
    path.write_text(TOKEN_FLOW % (40, ""))
    llm = vflow.LLM(str(tmp_path / "m"), kv_dtype="f32", device="cpu",
                    kv_pool_tokens=8 * P, dense_layers=0, flow=str(path),
                    enable_prefix_caching=False)
    (out,) = llm.generate([prompt_ids(40, 8)],
                          vflow.SamplingParams(max_tokens=300,
                                               temperature=0.0,
                                               ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 300, \
        out.error
    st = llm.stats()
    assert st["tokens_evicted"] >= 340 - 40 - 2 * P
    assert st["blocks_evicted"] == 0 and st["pages_used"] == 0
    assert out.tokens_evicted == st["tokens_evicted"]


@pytest.mark.skipif(not OTHER_DEVICES,
                    reason="no device but the CPU in VFLOW_TEST_DEVICES")
def test_the_engine_compacts_alike_on_every_device(
        tmp_path: pathlib.Path) -> None:
    """A token-grain flow in the engine on another device (the GPU's
    compaction kernel between steps, CUDA graphs replaying the steps)
    evicts as many tokens and returns as many pages as on the CPU (the
    capacity rule counts tokens, whatever the scores chose), and runs
    requests past their pool to max_tokens."""
    write_model(tmp_path / "m", arch="llama", seed=46, layers=2, hidden=128,
                heads=4, kv_heads=2, head_dim=64)
    path = tmp_path / "keep_loud.vflow"
    path.write_text(TOKEN_FLOW % (40, ""))
    prompts = [prompt_ids(40, 8), prompt_ids(170, 9), prompt_ids(9, 10)]
    evicts_alike(tmp_path / "m", str(path), None, prompts, 24,
                 "tokens_evicted")


def test_run_refuses_a_token_score_with_the_reason(
        tmp_path: pathlib.Path) -> None:
    """vflowc run's reference numbers blocks, which compaction rewrites: a
    token-grain flow is reported as an error of its own, not scored."""
    path = tmp_path / "keep_loud.vflow"
    path.write_text(TOKEN_FLOW % (40, ""))
    report = vflow.run(str(path), lengths=[1024], steps=2, seeds=1)
    assert report["flows"] == []
    (err,) = report["errors"]
    assert "scores tokens" in err["message"]
