"""Per-kernel profile of the engine's decode steps on the GPU machine
(device tool), with torch's profiler (CUPTI: kernels replayed from CUDA
graphs are listed one by one). Random-weight model with real shapes
(lab/tools/engine_shapes.py makes it).
Usage: python lab/tools/engine_profile.py OUT_DIR [--shape qwen3-1.7b]
[--context 16384] [--batch 4] [--flows dense,quest] [--steps 8]
[--model DIR] [--device cuda|cpu] [--no-graphs] [--no-torch-profile].
Writes OUT_DIR/profile-<flow>.txt (kernels by total time) and a summary
line per flow (wall ms per step and the kernels' sum per step), printed
and appended to OUT_DIR/engine_profile.jsonl.
With --no-torch-profile it only times the steps (one JSON line per flow,
no torch needed on the CPU: --model DIR --device cpu is the smoke test's
run)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_shapes import (ROOT, add_model_args,  # noqa: E402
                           check_model_args, model_dir)


def main() -> int:
    ap = argparse.ArgumentParser(
        description="Per-kernel profile of the engine's decode steps.")
    add_model_args(ap)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--flows", default="dense,quest")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--no-graphs", action="store_true",
                    help="eager steps (e.g. under ncu)")
    ap.add_argument("--no-torch-profile", action="store_true",
                    help="time the steps only (e.g. under ncu)")
    a = ap.parse_args()
    if a.device == "cpu" and not a.no_torch_profile:
        ap.error("--device cpu needs --no-torch-profile (the profiler "
                 "lists CUDA kernels)")
    if min(a.context, a.batch, a.steps) < 1:
        ap.error("--context, --batch and --steps must be >= 1")
    check_model_args(ap, a)
    import vflow

    os.makedirs(a.out, exist_ok=True)
    path, shape, vocab = model_dir(a)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(a.context)]
               for _ in range(a.batch)]
    for flow in a.flows.split(","):
        prog = None if flow == "dense" else os.path.join(
            ROOT, "examples", f"{flow}.vflow")
        params = None if flow == "dense" else {"budget": a.budget}
        llm = vflow.LLM(path, flow=prog, params=params, device=a.device,
                        max_batch=a.batch,
                        kv_pool_tokens=a.batch * (
                            a.context + 2 * a.steps + 4 * a.batch + 64)
                        + 4096,
                        enable_prefix_caching=False,
                        cuda_graphs=not a.no_graphs,
                        max_tokens_per_step=a.context)
        sp = vflow.SamplingParams(max_tokens=2 * a.steps + 4 * a.batch + 16,
                                  ignore_eos=True)
        for p in prompts:
            llm.add_request(p, sp)
        t0 = time.time()
        # Until every request decodes (steps of exactly `batch` tokens);
        # the first two such steps run eagerly and capture the graph.
        pure = 0
        while pure < 3:
            if not llm.has_unfinished_requests():
                raise SystemExit(f"{flow}: the requests finished before "
                                 "three steps decoded every one of them")
            before = llm.stats()["tokens_computed"]
            llm.step()
            done = llm.stats()["tokens_computed"] - before
            pure = pure + 1 if done == a.batch else 0
        prefill_s = time.time() - t0
        if a.device == "cuda":
            import torch

            torch.cuda.synchronize()
        t0 = time.time()
        for _ in range(a.steps):
            llm.step()
        plain = time.time() - t0
        if a.no_torch_profile:
            emit(a, dict(flow=flow, shape=shape, batch=a.batch,
                         context=a.context, steps=a.steps,
                         prefill_s=round(prefill_s, 2),
                         wall_ms_per_step=round(plain * 1000 / a.steps, 3)))
        else:
            profile_steps(llm, a, flow, shape, prefill_s, plain)
        while llm.has_unfinished_requests():
            llm.step()
        del llm
    return 0


def emit(a: argparse.Namespace, row: Dict[str, Any]) -> None:
    """Prints the row and appends it to OUT_DIR/engine_profile.jsonl."""
    line = json.dumps(row)
    print(line, flush=True)
    with open(os.path.join(a.out, "engine_profile.jsonl"), "a") as f:
        f.write(line + "\n")


def profile_steps(llm: Any, a: argparse.Namespace, flow: str, shape: str,
                  prefill_s: float, plain: float) -> None:
    """a.steps steps under torch's profiler: the kernels by total time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.time()
        for _ in range(a.steps):
            llm.step()
        torch.cuda.synchronize()
        wall = time.time() - t0
    events = prof.key_averages()
    key = ("self_device_time_total"
           if hasattr(events[0], "self_device_time_total")
           else "self_cuda_time_total")
    table = events.table(sort_by=key, row_limit=40, max_name_column_width=90)
    kernel_us = sum(getattr(e, key) for e in events)
    with open(os.path.join(a.out, f"profile-{flow}.txt"), "w") as f:
        f.write(table)
    row = dict(flow=flow, shape=shape, batch=a.batch, context=a.context,
               steps=a.steps, prefill_s=round(prefill_s, 2),
               wall_ms_per_step=round(plain * 1000 / a.steps, 3),
               profiled_ms_per_step=round(wall * 1000 / a.steps, 3),
               kernel_ms_per_step=round(kernel_us / 1000 / a.steps, 3))
    emit(a, row)
    print(table[:6000], flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
