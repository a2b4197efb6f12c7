"""Tests for bench/compare.py (before/after tables of one GPU call).

Run: python3 -m pytest bench/tests -q   (no GPU needed)
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

import compare  # noqa: E402


def step(ms, program="quest", B=8, dtype="bf16", bytes_=3.0e7):
    return {"source": "vflow", "what": "decode_step", "program": program,
            "B": B, "L": 32768, "dtype": dtype, "ms": ms, "bytes": bytes_}


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("not json: a log line\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def test_matches_rows_keeps_the_faster_run_and_ratios(tmp_path):
    copy = {"source": "vflow", "what": "copy", "gbps": 3000.0}
    base1 = write(tmp_path / "b1.jsonl", [copy, step(0.09), step(0.05, B=1)])
    base2 = write(tmp_path / "b2.jsonl", [step(0.08)])
    new1 = write(tmp_path / "n1.jsonl", [copy, step(0.04),
                                         step(0.2, program="h2o")])
    out = subprocess.run(
        [sys.executable, os.path.join(BENCH, "compare.py"), base1, base2,
         "--", new1], check=True, capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if l.startswith("| decode_step")]
    # Only shapes both sides measured; the base's faster run (0.08).
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[5:8] == ["0.0800", "0.0400", "2.00x"]
    # 3e7 bytes at 3000 GB/s: a floor of 0.01 ms.
    assert cells[8:10] == ["8.00x", "4.00x"]


def test_needs_the_separator():
    assert compare.main(["a.jsonl"]) == 2
