#!/usr/bin/env python3
"""The CPU engine's prefill-heavy run, timed: PROMPTS random token-id
prompts of LENGTH tokens through vflow.LLM on the CPU (dense), OUTPUT
tokens each, greedy; prints the wall time, the engine's step time split
(gemm, attention, other, ms) and the tokens (equal tokens across builds
show a speed change kept the numbers).

Usage: python lab/tools/cpu_prefill.py MODEL.gguf [--prompts 4]
[--length 2048] [--output 8] [--json OUT.json]"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--output", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import vflow

    llm = vflow.LLM(a.model, device="cpu", max_batch=a.prompts)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(a.length)]
               for _ in range(a.prompts)]
    start = time.perf_counter()
    outs = llm.generate(prompts, vflow.SamplingParams(
        max_tokens=a.output, ignore_eos=True))
    row = dict(prompts=a.prompts, length=a.length, output=a.output,
               seconds=round(time.perf_counter() - start, 2),
               step_ms={k: round(v, 1) for k, v in
                        llm.stats()["step_ms"].items()},
               tokens=[list(o.token_ids) for o in outs])
    print(json.dumps(row))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
