"""The flow's kernels as torch ops (vflow::flow_cache_update, flow_index,
carry_mass; torch_ops.Flow and FlowDecodeWrapper) on an engine's own
tensors, against vflow.Session on CUDA driving the same flow over the same
tokens: every block list equal, outputs equal within bf16 rounding, for
stock flows with fields, states and the attention mass. Then opcheck, a
CUDA graph replay and torch.compile(fullgraph=True) of a decode step, and
bad arguments. Skipped without torch and a GPU; runs without pytest on the
GPU machine: `python tests/python/test_flow_ops.py ARTIFACT_DIR`."""

from __future__ import annotations

import sys
from typing import Any, Dict, List

import vflow

from gpu_common import capture_graph, stock_program, torch_with_gpu

H, G, D = 2, 4, 128
MAX_BLOCKS = 160






class Engine:
    """What a torch engine keeps for one layer: a shuffled paged cache,
    block tables, the flow's fields, states and mass, the step metadata."""

    def __init__(self, torch: Any, flow: Any, batch: int, pages: int) -> None:
        from vflow import torch_ops

        self.torch, self.flow, self.P = torch, flow, flow.block_size
        gen = torch.Generator(device="cuda").manual_seed(7)
        self.free = torch.randperm(pages, generator=gen,
                                   device="cuda").tolist()
        self.k_cache = torch.zeros(pages, H, self.P, D, device="cuda",
                                   dtype=torch.bfloat16)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.fields = flow.new_fields(pages, H)
        self.states = flow.new_states(batch, H, MAX_BLOCKS)
        self.mass = flow.new_mass(batch, H, MAX_BLOCKS)
        self.table = torch.zeros(batch, MAX_BLOCKS, dtype=torch.int32,
                                 device="cuda")
        self.lengths = [0] * batch
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device="cuda")
        self.slots = torch.arange(batch, dtype=torch.int32, device="cuda")
        self.steps = torch.zeros(batch, dtype=torch.int32, device="cuda")
        self.wrapper = torch_ops.FlowDecodeWrapper(flow)

    def grow(self, b: int, n: int) -> List[int]:
        """Room for n more tokens of row b; their positions."""
        first = self.lengths[b]
        for blk in range(-(-first // self.P), -(-(first + n) // self.P)):
            self.table[b, blk] = self.free.pop()
        self.lengths[b] += n
        return list(range(first, first + n))

    def prefill(self, b: int, k: Any, v: Any) -> None:
        torch = self.torch
        pos = self.grow(b, int(k.shape[0]))
        at = torch.tensor(pos, device="cuda")
        pages = self.table[b, at // self.P].contiguous()
        done = [blk for blk in range(pos[0] // self.P, (pos[-1] + 1) // self.P)]
        completed = self.table[b, done].contiguous()
        self.flow.cache_update(k, v, pages, (at % self.P).int(), completed,
                               self.k_cache, self.v_cache, self.fields)
        self.seq_lens[b] = self.lengths[b]

    def snapshot(self) -> Dict[str, Any]:
        names = ["k_cache", "v_cache", "seq_lens", "steps", "table"]
        snap = {n: getattr(self, n).clone() for n in names}
        snap["fields"] = [f.clone() for f in self.fields]
        snap["states"] = [[s.clone() for s in half] for half in self.states]
        snap["mass"] = None if self.mass is None else self.mass.clone()
        return snap

    def restore(self, snap: Dict[str, Any]) -> None:
        for n in ["k_cache", "v_cache", "seq_lens", "steps", "table"]:
            getattr(self, n).copy_(snap[n])
        for f, s in zip(self.fields, snap["fields"]):
            f.copy_(s)
        for half, shalf in zip(self.states, snap["states"]):
            for t, s in zip(half, shalf):
                t.copy_(s)
        if self.mass is not None:
            self.mass.copy_(snap["mass"])

    def step(self, q: Any, k: Any, v: Any, out: Any = None) -> Any:
        return self.wrapper.run(q, self.k_cache, self.v_cache, self.fields,
                                self.states, self.mass, k_new=k, v_new=v,
                                out=out)

    def lists(self, b: int) -> List[List[int]]:
        indptr, count, _, blocks = self.wrapper.selection()
        out = []
        for h in range(H):
            r = b * H + h
            start, n = int(indptr[r]), int(count[r])
            out.append(sorted(blocks[start:start + n].tolist()))
        return out


def check_against_session(torch: Any, name: str, artifacts: str) -> None:
    from vflow import torch_ops

    prog = stock_program(name, artifacts)
    flow = torch_ops.Flow(prog, group=G, head_dim=D)
    sess = vflow.Session(prog, layers=1, kv_heads=H, group=G, head_dim=D,
                         max_pages=1024, max_blocks_per_seq=MAX_BLOCKS,
                         device="cuda", quiet=True)
    lengths, steps = [1500, 777, 2000], 20
    eng = Engine(torch, flow, len(lengths), 1024)
    seqs = [sess.add_sequence() for _ in lengths]
    gen = torch.Generator(device="cuda").manual_seed(5)
    for b, n in enumerate(lengths):
        k = torch.randn(n, H, D, generator=gen, device="cuda").bfloat16()
        v = torch.randn(n, H, D, generator=gen, device="cuda").bfloat16()
        sess.append(0, seqs[b], k, v)
        eng.prefill(b, k, v)
    # One plan for the whole run, as a CUDA graph would need it.
    eng.wrapper.plan(eng.seq_lens, eng.table, eng.slots, eng.steps,
                     kv_heads=H, max_length=max(lengths) + steps)
    worst = 0.0
    for step in range(steps):
        k = torch.randn(3, H, D, generator=gen, device="cuda").bfloat16()
        v = torch.randn(3, H, D, generator=gen, device="cuda").bfloat16()
        q = torch.randn(3, H * G, D, generator=gen, device="cuda").bfloat16()
        sess.append(0, seqs, k, v, lengths=[1, 1, 1])
        want = sess.decode(0, seqs, q)
        for b in range(3):
            eng.grow(b, 1)
        eng.seq_lens.copy_(torch.tensor(eng.lengths, dtype=torch.int32))
        got = eng.step(q, k, v)
        eng.steps += 1
        for b in range(3):
            assert eng.lists(b) == sess.selection(seqs[b], 0), (
                name, step, b, eng.lists(b), sess.selection(seqs[b], 0))
        err = ((got.float() - want.float()).norm() /
               want.float().norm()).item()
        worst = max(worst, err)
        assert err < 5e-3, (name, step, err)
    print(f"{name}: {steps} steps, every block list equal to the session's, "
          f"output within {worst:.1e}")


def check_graph_opcheck_compile(torch: Any, artifacts: str) -> None:
    from vflow import torch_ops

    flow = torch_ops.Flow(stock_program("h2o", artifacts), group=G, head_dim=D)
    eng = Engine(torch, flow, 2, 512)
    gen = torch.Generator(device="cuda").manual_seed(9)
    for b, n in enumerate([900, 333]):
        eng.prefill(b, torch.randn(n, H, D, generator=gen,
                                   device="cuda").bfloat16(),
                    torch.randn(n, H, D, generator=gen,
                                device="cuda").bfloat16())
    for b in range(2):
        eng.grow(b, 1)
    eng.seq_lens.copy_(torch.tensor(eng.lengths, dtype=torch.int32))
    eng.wrapper.plan(eng.seq_lens, eng.table, eng.slots, eng.steps,
                     kv_heads=H, max_length=1024)
    q = torch.randn(2, H * G, D, generator=gen, device="cuda").bfloat16()
    k = torch.randn(2, H, D, generator=gen, device="cuda").bfloat16()
    v = torch.randn(2, H, D, generator=gen, device="cuda").bfloat16()
    snap = eng.snapshot()

    p = eng.wrapper._plan
    torch.library.opcheck(
        torch.ops.vflow.flow_index.default,
        (flow.handle, q, eng.k_cache.clone(), eng.v_cache.clone(),
         [f.clone() for f in eng.fields], [s.clone() for s in eng.states[0]],
         [s.clone() for s in eng.states[1]], eng.mass.clone(), eng.seq_lens,
         eng.table, eng.slots, eng.steps, p["indptr"], p["count"].clone(),
         p["pages"].clone(), p["blocks"].clone(), p["workspace"].clone(), k,
         v))
    torch.library.opcheck(
        torch.ops.vflow.carry_mass.default,
        (p["mass_rows"].clone(), eng.mass.clone(), eng.slots, eng.seq_lens,
         flow.block_size))
    pos = torch.tensor([5, 6], dtype=torch.int32, device="cuda")
    torch.library.opcheck(
        torch.ops.vflow.flow_cache_update.default,
        (flow.handle, k, v, eng.table[0, :2].contiguous(), pos,
         eng.table[0, :1].contiguous(), eng.k_cache.clone(),
         eng.v_cache.clone(), [f.clone() for f in eng.fields],
         torch.empty(flow.workspace_bytes(0, 1, 1), dtype=torch.uint8,
                     device="cuda")))

    def outcome(out: Any) -> List[Any]:
        _, count, _, blocks = eng.wrapper.selection()
        return [out.clone(), count.clone(), blocks.clone(),
                eng.states[0][0].clone(), eng.mass.clone(),
                eng.k_cache.clone()]

    eager = outcome(eng.step(q, k, v))
    eng.restore(snap)
    # A CUDA graph of the step: a replay does what the eager step did.
    static_out = torch.empty_like(q)
    graph = capture_graph(torch, lambda: eng.step(q, k, v, out=static_out),
                          lambda: eng.restore(snap))
    static_out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, outcome(static_out)):
        assert torch.equal(a, b), "graph replay differs from the eager step"
    # A new param value reaches the captured kernels (read at launch).
    eng.restore(snap)
    flow.set_param("budget", 4)
    graph.replay()
    small = eng.wrapper.selection()[1].clone()
    assert int(small.max()) < int(eager[1].max()), (small, eager[1])
    flow.set_param("budget", flow.param("budget"))
    # torch.compile(fullgraph=True) of the step.
    eng.restore(snap)
    flow.set_param("budget", 4)
    eager_small = outcome(eng.step(q, k, v))
    eng.restore(snap)
    compiled = torch.compile(lambda q, k, v: eng.step(q * 1.0, k, v),
                             fullgraph=True)
    got = outcome(compiled(q, k, v))
    for a, b in zip(eager_small, got):
        assert torch.equal(a, b), "compiled step differs from the eager step"
    print("flow ops: opcheck, CUDA graph replay (params live) and "
          "torch.compile(fullgraph=True) ok")


def check_errors(torch: Any, artifacts: str) -> None:
    from vflow import torch_ops

    flow = torch_ops.Flow(stock_program("h2o", artifacts), group=G, head_dim=D)
    eng = Engine(torch, flow, 1, 64)
    eng.grow(0, 40)
    eng.seq_lens.fill_(40)
    eng.wrapper.plan(eng.seq_lens, eng.table, eng.slots, eng.steps,
                     kv_heads=H)
    q = torch.zeros(1, H * G, D, device="cuda", dtype=torch.bfloat16)

    def expect(msg: str, fn: Any) -> None:
        try:
            fn()
        except (RuntimeError, ValueError) as e:
            assert msg in str(e), (msg, str(e))
            return
        raise AssertionError(f"accepted: expected an error with {msg!r}")

    expect("mass: the flow reads", lambda: eng.wrapper.run(
        q, eng.k_cache, eng.v_cache, eng.fields, eng.states, None))
    expect("fields: the flow has", lambda: eng.wrapper.run(
        q, eng.k_cache, eng.v_cache, eng.fields + [eng.seq_lens], eng.states,
        eng.mass))
    expect("q must be [batch, 8, 128]", lambda: eng.wrapper.run(
        q[:, :4], eng.k_cache, eng.v_cache, eng.fields, eng.states,
        eng.mass))
    expect("opened for kv_dtype bf16", lambda: eng.wrapper.run(
        q, eng.k_cache.half(), eng.v_cache.half(), eng.fields, eng.states,
        eng.mass))
    expect("not the handle of a live", lambda:
           torch.ops.vflow.flow_workspace_bytes(eng.table.data_ptr(), 1, 1,
                                                1))
    expect("kv_dtype: 'int8'", lambda: torch_ops.Flow(
        stock_program("quest", artifacts), group=G, head_dim=D, kv_dtype="int8"))
    print("flow ops: bad arguments are errors naming them")


def run_all(artifacts: str) -> None:
    torch = torch_with_gpu()
    for name in ("quest", "block_topk", "h2o", "eps"):
        check_against_session(torch, name, artifacts)
    check_graph_opcheck_compile(torch, artifacts)
    check_errors(torch, artifacts)


def test_flow_ops() -> None:
    if torch_with_gpu() is None:
        import pytest

        pytest.skip("no torch with a GPU")
    run_all("")


if __name__ == "__main__":
    if torch_with_gpu() is None:
        print("no torch with a GPU")
        sys.exit(1)
    run_all(sys.argv[1] if len(sys.argv) > 1 else "")
