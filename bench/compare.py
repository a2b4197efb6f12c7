#!/usr/bin/env python3
"""Before/after table of two benchmark runs made in one GPU call.

    python3 bench/compare.py BASE.jsonl [...] -- NEW.jsonl [...]

Reads the JSON lines of vflow-bench-step and vflow-bench-attention (base
files before `--`, new ones after), matches rows by what they measure
(decode_step, dense/sparse attention and their FlashInfer peers) and shape,
keeping each row's fastest run of a side (the files of a side may be
several alternating runs), and prints a markdown table: base ms, new ms,
base / new, and each side's time over its byte floor (the row's bytes at
the copy ceiling its side's files measured). Standard library only.
"""

from __future__ import annotations

import json
import sys
from typing import Dict, Iterable, List, Optional, Tuple

Key = Tuple[str, str, int, int, str]
MEASURED = ("decode_step", "dense_attention", "sparse_attention",
            "flashinfer_dense", "flashinfer_sparse")


def read_rows(paths: Iterable[str]) -> Tuple[Dict[Key, dict], Optional[float]]:
    """Rows by (what, program, B, L, dtype), and the copy ceiling in GB/s."""
    rows: Dict[Key, dict] = {}
    ceiling: Optional[float] = None
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for text in f:
                text = text.strip()
                if not text.startswith("{"):
                    continue
                row = json.loads(text)
                what = row.get("what")
                if what == "copy":
                    ceiling = float(row["gbps"])
                if what not in MEASURED:
                    continue
                key = (what, str(row.get("program", "")), int(row["B"]),
                       int(row["L"]), str(row["dtype"]))
                if key not in rows or float(row["ms"]) < float(rows[key]["ms"]):
                    rows[key] = row
    return rows, ceiling


def floor_ratio(row: dict, ceiling: Optional[float]) -> str:
    if not ceiling or not row.get("bytes"):
        return "—"
    floor_ms = float(row["bytes"]) / (ceiling * 1e6)
    return f"{float(row['ms']) / floor_ms:.2f}x"


def table(base: Dict[Key, dict], base_ceiling: Optional[float],
          new: Dict[Key, dict], new_ceiling: Optional[float]) -> List[str]:
    lines = ["| what | program | B | L | dtype | base ms | new ms | base / new "
             "| x floor base | x floor new |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in sorted(set(base) & set(new)):
        b, n = base[key], new[key]
        what, program, batch, length, dtype = key
        ratio = float(b["ms"]) / float(n["ms"])
        lines.append(
            f"| {what} | {program or '—'} | {batch} | {length} | {dtype} "
            f"| {float(b['ms']):.4f} | {float(n['ms']):.4f} | {ratio:.2f}x "
            f"| {floor_ratio(b, base_ceiling)} | {floor_ratio(n, new_ceiling)} |")
    return lines


def main(argv: List[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    base, base_ceiling = read_rows(argv[:cut])
    new, new_ceiling = read_rows(argv[cut + 1:])
    print("\n".join(table(base, base_ceiling, new, new_ceiling)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
