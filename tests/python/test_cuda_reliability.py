"""The GPU path under careless use (issue 27): vflow.Session on CUDA and the
torch ops given bad tensors, bad indices and threads. Each case runs in a
child process (a crash or a poisoned CUDA context stays there) and must end
in a clear Python error naming the problem, after which the same process
still computes correctly on the GPU; or, where the input is valid, in the
right result. Skipped without torch and a GPU (the GPU machine runs it:
tools/gpu.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import List, Tuple

import pytest

from gpu_common import torch_with_gpu

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(torch_with_gpu() is None,
                                reason="no torch with a GPU")

# What every child starts with: a CUDA session of quest (carried artifact or
# compiled), a sequence with 100 tokens at both layers, and `sane()`, which
# decodes a fresh session's sequence and compares it with the CPU backend:
# run after the error, it shows the context is still good.
PRELUDE = textwrap.dedent('''
    import sys, threading
    sys.path.insert(0, %(here)r)
    import torch, vflow
    from gpu_common import stock_program
    H, G, D, L = 2, 4, 128, 2
    prog = stock_program("quest", %(artifacts)r)
    cfg = dict(layers=L, kv_heads=H, group=G, head_dim=D, max_pages=256,
               quiet=True)
    s = vflow.Session(prog, device="cuda", max_blocks_per_seq=64,
                      max_batch=4, max_sequences=8, **cfg)
    gen = torch.Generator().manual_seed(1)
    def rand(*shape):
        return torch.randn(*shape, generator=gen).bfloat16()
    seq = s.add_sequence()
    for layer in range(L):
        s.append(layer, seq, rand(100, H, D).cuda(), rand(100, H, D).cuda())
    def sane():
        cpu = vflow.Session(prog, device="cpu", **cfg)
        gpu = vflow.Session(prog, device="cuda", max_blocks_per_seq=64, **cfg)
        a, b = cpu.add_sequence(), gpu.add_sequence()
        k, v, q = rand(70, H, D), rand(70, H, D), rand(1, H * G, D)
        for layer in range(L):
            cpu.append(layer, a, k, v)
            gpu.append(layer, b, k.cuda(), v.cuda())
        want = cpu.decode(1, [a], q).float()
        got = gpu.decode(1, [b], q.cuda()).float().cpu()
        err = float((got - want).norm() / want.norm())
        assert err < 0.02, err
        torch.cuda.synchronize()
        print("SANE")
    def expect(exc, text, fn):
        try:
            fn()
        except exc as e:
            assert text in str(e), (text, str(e))
            print("REFUSED:", type(e).__name__, str(e)[:200])
            return
        raise AssertionError("accepted: expected %%s with %%r" %% (
            exc, text))
''')


def child(body: str, then_sane: bool = True,
          timeout: int = 300) -> Tuple[int, str]:
    code = PRELUDE % dict(here=HERE,
                          artifacts=os.environ.get("VFLOW_GPU_ARTIFACTS", ""))
    code += textwrap.dedent(body) + ("\nsane()\n" if then_sane else "")
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def passes(body: str) -> str:
    rc, out = child(body)
    assert rc == 0 and "SANE" in out, out[-3000:]
    return out


SESSION_CASES: List[Tuple[str, str]] = [
    ("non_contiguous_k", '''
        k = rand(8, H, 2 * D).cuda()[:, :, ::2]
        expect(ValueError, "k is not contiguous",
               lambda: s.append(0, seq, k, k))'''),
    ("empty_q", '''
        expect(ValueError, "q is empty",
               lambda: s.decode(0, [seq], rand(0, H * G, D).cuda()))'''),
    ("wrong_shape_q", '''
        expect(ValueError, "q has shape",
               lambda: s.decode(0, [seq], rand(1, H * G, D + 1).cuda()))'''),
    ("int_tensor", '''
        k = torch.zeros(4, H, D, dtype=torch.int32, device="cuda")
        expect(ValueError, "k is int32", lambda: s.append(0, seq, k, k))'''),
    ("cpu_out", '''
        expect(ValueError, "out is on the CPU",
               lambda: s.decode(0, [seq], rand(1, H * G, D).cuda(),
                                rand(1, H * G, D)))'''),
    ("unknown_sequence", '''
        expect(RuntimeError, "12345",
               lambda: s.decode(0, [12345], rand(1, H * G, D).cuda()))'''),
    ("released_sequence", '''
        t = s.add_sequence()
        s.release(t)
        expect(RuntimeError, str(t),
               lambda: s.append(0, t, rand(1, H, D).cuda(),
                                rand(1, H, D).cuda()))'''),
    ("decode_before_append", '''
        t = s.add_sequence()
        expect(RuntimeError, "no tokens",
               lambda: s.decode(0, [t], rand(1, H * G, D).cuda()))'''),
    ("layer_not_written", '''
        s.append(0, seq, rand(1, H, D).cuda(), rand(1, H, D).cuda())
        expect(RuntimeError, "layer 1",
               lambda: s.decode(1, [seq], rand(1, H * G, D).cuda()))'''),
    ("bad_layer", '''
        expect(ValueError, "layer",
               lambda: s.decode(7, [seq], rand(1, H * G, D).cuda()))'''),
    ("more_rows_than_max_batch", '''
        seqs = [seq]
        for i in range(4):
            t = s.add_sequence()
            for layer in range(L):
                s.append(layer, t, rand(20, H, D).cuda(), rand(20, H, D).cuda())
            seqs.append(t)
        expect(RuntimeError, "maxBatch",
               lambda: s.decode(0, seqs, rand(5, H * G, D).cuda()))'''),
    ("too_many_sequences", '''
        def many():
            for i in range(20):
                s.add_sequence()
        expect(RuntimeError, "all 8 sequence slots are in use", many)'''),
    ("past_max_blocks_per_seq", '''
        expect(RuntimeError, "64",
               lambda: s.append(0, seq, rand(64 * 16, H, D).cuda(),
                                rand(64 * 16, H, D).cuda()))'''),
    ("pool_exhausted_then_works", '''
        big = []
        def fill():
            while True:
                t = s.add_sequence()
                big.append(t)
                s.append(0, t, rand(60 * 16, H, D).cuda(),
                         rand(60 * 16, H, D).cuda())
        expect(RuntimeError, "KV cache exhausted", fill)
        for t in big:
            s.release(t)
        s.append(1, seq, rand(1, H, D).cuda(), rand(1, H, D).cuda())'''),
    ("bad_param", '''
        expect(ValueError, "budget", lambda: s.set_params(budget=-3))
        expect(ValueError, "budget",
               lambda: s.set_params(budget=float("nan")))'''),
    ("nan_q_stays_in_its_row", '''
        t = s.add_sequence()
        for layer in range(L):
            s.append(layer, t, rand(50, H, D).cuda(), rand(50, H, D).cuda())
        q = rand(2, H * G, D).cuda()
        q[0] = float("nan")
        out = s.decode(0, [seq, t], q)
        assert torch.isfinite(out[1].float()).all()'''),
]


@pytest.mark.parametrize("name,body", SESSION_CASES,
                         ids=[c[0] for c in SESSION_CASES])
def test_cuda_session_bad_input(name: str, body: str) -> None:
    passes(body)


def test_cuda_session_threads() -> None:
    """Threads on their own sequences of one CUDA session equal each
    thread's work on a session of its own (the session's lock)."""
    passes('''
        import numpy as np
        def work(sess, i, out):
            g = torch.Generator().manual_seed(100 + i)
            t = sess.add_sequence()
            k = torch.randn(2, 300 + 16 * i + 20, H, D, generator=g).bfloat16()
            qs = torch.randn(20, 1, H * G, D, generator=g).bfloat16()
            for layer in range(L):
                sess.append(layer, t, k[0, :300 + 16 * i].cuda(),
                            k[1, :300 + 16 * i].cuda())
            res = []
            for step in range(10):
                at = 300 + 16 * i + step
                for layer in range(L):
                    sess.append(layer, t, k[0, at:at + 1].cuda(),
                                k[1, at:at + 1].cuda())
                    res.append(sess.decode(layer, [t],
                                           qs[2 * step + layer].cuda()).cpu())
            sess.release(t)
            out[i] = res
        alone = {}
        for i in range(4):
            work(vflow.Session(prog, device="cuda", max_blocks_per_seq=64,
                               **cfg), i, alone)
        shared = vflow.Session(prog, device="cuda", max_blocks_per_seq=64,
                               **cfg)
        got = {}
        ts = [threading.Thread(target=work, args=(shared, i, got))
              for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        for i in range(4):
            for a, b in zip(alone[i], got[i]):
                assert torch.equal(a, b), i
        print("threads equal")''')


OPS_PRELUDE = '''
    from vflow import torch_ops
    torch_ops.load()
    P = 16
    k_cache = rand(40, H, P, D).cuda()
    v_cache = rand(40, H, P, D).cuda()
    table = torch.arange(12, dtype=torch.int32, device="cuda").reshape(2, 6)
    seq_lens = torch.tensor([90, 40], dtype=torch.int32, device="cuda")
    q = rand(2, H * G, D).cuda()
    w = torch_ops.PagedDecodeWrapper()
'''

OPS_CASES: List[Tuple[str, str]] = [
    ("page_id_past_the_cache", '''
        bad = table.clone(); bad[0, 1] = 4000
        w.plan_dense(bad, seq_lens, kv_heads=H, group=G, head_dim=D,
                     page_size=P)
        expect(ValueError, "past the 40 pages of k_cache",
               lambda: w.run(q, k_cache, v_cache))'''),
    ("negative_page_id", '''
        bad = table.clone(); bad[1, 0] = -7
        expect(ValueError, "pages: holds -7", lambda: w.plan_dense(
            bad, seq_lens, kv_heads=H, group=G, head_dim=D, page_size=P))'''),
    ("seq_len_past_the_table", '''
        long = torch.tensor([90, 400], dtype=torch.int32, device="cuda")
        expect(ValueError, "seq_lens: 400 tokens", lambda: w.plan_dense(
            table, long, kv_heads=H, group=G, head_dim=D, page_size=P))'''),
    ("negative_seq_len", '''
        neg = torch.tensor([90, -5], dtype=torch.int32, device="cuda")
        expect(ValueError, "seq_lens: holds -5", lambda: w.plan_dense(
            table, neg, kv_heads=H, group=G, head_dim=D, page_size=P))'''),
    ("indptr_not_monotonic", '''
        indptr = torch.tensor([0, 6, 3], dtype=torch.int32, device="cuda")
        pages = table.flatten()[:6].contiguous()
        blocks = torch.arange(6, dtype=torch.int32, device="cuda")
        expect(ValueError, "indptr: decreases", lambda: w.plan(
            indptr, pages, blocks, seq_lens, kv_heads=H, group=G,
            head_dim=D, lists_per_sequence=True))'''),
    ("int64_table", '''
        expect(ValueError, "block_table: expected an int32", lambda:
               w.plan_dense(table.long(), seq_lens, kv_heads=H, group=G,
                            head_dim=D, page_size=P))'''),
    ("cpu_caches", '''
        w.plan_dense(table, seq_lens, kv_heads=H, group=G, head_dim=D,
                     page_size=P)
        expect(RuntimeError, "CUDA", lambda: w.run(q, k_cache.cpu(),
                                                   v_cache.cpu()))'''),
    ("cpu_index_tensor", '''
        k = rand(2, H, D).cuda()
        pg = torch.tensor([0, 1], dtype=torch.int32)
        pos = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
        expect(RuntimeError, "slot_pages must be a CUDA tensor", lambda:
               torch.ops.vflow.write_kv(k, k, pg, pos, k_cache, v_cache))'''),
    ("valid_input_still_right", '''
        w.plan_dense(table, seq_lens, kv_heads=H, group=G, head_dim=D,
                     page_size=P)
        out = w.run(q, k_cache, v_cache)
        assert torch.isfinite(out.float()).all()'''),
]

# Raw ops given indices outside their pools (no plan to catch them): the
# kernel stops with a message naming the op, the argument and the value
# (IndexCheck.cuh), where it read or wrote past the pool (an illegal
# address, or silently another tensor's memory).
DEVICE_CHECK_CASES: List[Tuple[str, str, str]] = [
    ("write_kv_page", '''
        k = rand(3, H, D).cuda()
        pg = torch.tensor([0, 1, 999], dtype=torch.int32, device="cuda")
        pos = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
        torch.ops.vflow.write_kv(k, k, pg, pos, k_cache, v_cache)''',
     "vflow: write_kv: slot_pages entry is 999, outside [0, 40)"),
    ("write_kv_position", '''
        k = rand(2, H, D).cuda()
        pg = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
        pos = torch.tensor([0, 16], dtype=torch.int32, device="cuda")
        torch.ops.vflow.write_kv(k, k, pg, pos, k_cache, v_cache)''',
     "vflow: write_kv: slot_positions entry is 16, outside [0, 16)"),
    ("paged_decode_page", '''
        w.plan_dense(table, seq_lens, kv_heads=H, group=G, head_dim=D,
                     page_size=P)
        w._plan["pages"][3] = 4000   # behind the plan's back
        w.run(q, k_cache, v_cache)''',
     "vflow: paged_decode: pages entry is 4000, outside [0, 40)"),
]


@pytest.mark.parametrize("name,body,says", DEVICE_CHECK_CASES,
                         ids=[c[0] for c in DEVICE_CHECK_CASES])
def test_torch_ops_device_checks(name: str, body: str, says: str) -> None:
    code = textwrap.dedent(OPS_PRELUDE) + textwrap.dedent(body) + \
        "\ntorch.cuda.synchronize()\nprint('NOT STOPPED')\n"
    rc, out = child(code, then_sane=False)
    assert "NOT STOPPED" not in out, out[-3000:]
    assert says in out, out[-3000:]
    assert "illegal memory access" not in out, out[-3000:]


@pytest.mark.parametrize("name,body", OPS_CASES, ids=[c[0] for c in OPS_CASES])
def test_torch_ops_bad_input(name: str, body: str) -> None:
    passes(textwrap.dedent(OPS_PRELUDE) + textwrap.dedent(body))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-rA", "-q"]))
