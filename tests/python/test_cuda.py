"""vflow.Session on CUDA tensors (torch, bfloat16, a non-default stream)
against the CPU backend on the same values. Skipped without torch or a
GPU. Also runs without pytest on the GPU machine (tools/gpu.sh):
`python tests/python/test_cuda.py ARTIFACT_DIR`."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List

import vflow

from gpu_common import stock_program, torch_with_gpu






def check_cuda_matches_cpu(artifacts: str) -> None:
    torch = torch_with_gpu()
    H, G, D, L = 2, 4, 128, 2
    for name in ("quest", "h2o", "eps"):
        prog = stock_program(name, artifacts)
        cfg: Dict[str, Any] = dict(layers=L, kv_heads=H, group=G, head_dim=D,
                                   max_pages=1024, quiet=True)
        cpu = vflow.Session(prog, device="cpu", **cfg)
        gpu = vflow.Session(prog, device="cuda", max_blocks_per_seq=256, **cfg)
        gen = torch.Generator().manual_seed(5)
        stream = torch.cuda.Stream()
        seqs_c = [cpu.add_sequence(), cpu.add_sequence()]
        seqs_g = [gpu.add_sequence(), gpu.add_sequence()]
        lengths = [1500, 777]
        with torch.cuda.stream(stream):
            for layer in range(L):
                k = torch.randn(sum(lengths), H, D, generator=gen).bfloat16()
                v = torch.randn(sum(lengths), H, D, generator=gen).bfloat16()
                cpu.append(layer, seqs_c, k, v, lengths=lengths)
                gpu.append(layer, seqs_g, k.cuda(), v.cuda(), lengths=lengths)
            for step in range(4):
                for layer in range(L):
                    k = torch.randn(2, H, D, generator=gen).bfloat16()
                    v = torch.randn(2, H, D, generator=gen).bfloat16()
                    q = torch.randn(2, H * G, D, generator=gen).bfloat16()
                    cpu.append(layer, seqs_c, k, v, lengths=[1, 1])
                    gpu.append(layer, seqs_g, k.cuda(), v.cuda(),
                               lengths=[1, 1])
                    want = cpu.decode(layer, seqs_c, q).float()
                    got = gpu.decode(layer, seqs_g, q.cuda())
                    assert got.is_cuda and got.dtype == torch.bfloat16
                    for r in range(2):
                        assert cpu.selection(seqs_c[r], layer) == \
                            gpu.selection(seqs_g[r], layer), (name, step, layer)
                    err = (got.float().cpu() - want).norm() / want.norm()
                    assert err < 0.02, (name, step, layer, float(err))
        assert cpu.stats()["blocks_attended"] == gpu.stats()["blocks_attended"]
        # Wrong device, wrong dtype: errors naming the argument.
        try:
            gpu.decode(0, seqs_g, torch.zeros(2, H * G, D).bfloat16())
            raise AssertionError("a CPU q reached the GPU session")
        except ValueError as e:
            assert "q is on the CPU" in str(e), e
        try:
            gpu.decode(0, seqs_g, torch.zeros(2, H * G, D, device="cuda"))
            raise AssertionError("a float32 q reached the GPU session")
        except ValueError as e:
            assert "q is float32, expected bfloat16" in str(e), e
        try:  # CuPy, by DLPack: it has no bfloat16, so a clear refusal
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            try:
                gpu.decode(0, seqs_g, cupy.zeros((2, H * G, D), cupy.float16))
                raise AssertionError("a float16 CuPy q reached the session")
            except ValueError as e:
                assert "q is float16, expected bfloat16" in str(e), e
        print(f"{name}: CUDA session on torch tensors matches the CPU backend")


def test_cuda_matches_cpu() -> None:
    if torch_with_gpu() is None:
        import pytest

        pytest.skip("no torch with a GPU")
    check_cuda_matches_cpu(os.environ.get("VFLOW_GPU_ARTIFACTS", ""))


if __name__ == "__main__":
    if torch_with_gpu() is None:
        print("no torch with a GPU")
        sys.exit(1)
    check_cuda_matches_cpu(sys.argv[1] if len(sys.argv) > 1 else "")
