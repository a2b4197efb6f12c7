"""The largest batch a KV memory budget holds at a context length, and the
engine's decode throughput at that batch (issue 32's record): dense
attention and flows, with and without eviction, in bf16 or 8-bit KV, on a
random-weight model of real shapes (lab/tools/engine_shapes.py's --shape),
on the GPU machine.

Usage: python lab/tools/kv_capacity.py OUT_DIR [--shape qwen3-1.7b]
  [--context 32768] [--kv-budget-gib 64] [--output-len 128]
  --rows dense:bf16,dense:int8,quest:bf16,snapkv:int8:capacity=256
  [--model DIR] [--device cuda|cpu] (as engine_shapes.py)

A row is FLOW:KV_DTYPE[:param=value...] (FLOW: examples/FLOW.vflow, or
dense). For each row:
- bytes_per_token: K and V of every layer and KV head, 8-bit rows with
  their f32 scale (vflow's accounting, vflow._eval.kv_bytes_per_token);
- pool_tokens: the budget in tokens, the engine's kv_pool_tokens;
- held_tokens: what one running request holds: context + output for a row
  that keeps every token; for a flow with a retain block, its retained
  tokens (capacity blocks, or capacity tokens at token grain) plus the
  block being filled;
- batch: the largest number of requests the pool holds at once; for a
  retaining row one context-long prompt is counted as in flight beside
  them (a prompt is evicted at its first decode step, so it needs its
  whole length until then).
Then `batch` requests decode together in an engine with that pool and
max_batch (prefix caching off, every prompt distinct), timed by
vflow._eval.decode_speed. A row that keeps every token prefills prompts
of `context` tokens. A retaining row prefills prompts of held_tokens + half
a block (prompt_len in the row), which its first decode step evicts down to
what it keeps (so that `batch` of them fit the pool at once): its decode steps read and write what a context-long prompt
would leave, at a fraction of the prefill (`--full-prompts` prefills
context-long prompts instead, to check that the two step alike).
One JSON line per row, also appended to OUT_DIR/kv_capacity.jsonl."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_shapes import (ROOT, add_model_args,  # noqa: E402
                           check_model_args, model_dir)


def parse_row(spec: str) -> Tuple[str, str, Dict[str, Any]]:
    """'snapkv:int8:capacity=256' -> ('snapkv', 'int8', {'capacity': 256})."""
    parts = spec.split(":")
    if len(parts) < 2:
        raise ValueError(f"--rows: {spec!r} is not FLOW:KV_DTYPE[:k=v...]")
    params: Dict[str, Any] = {}
    for kv in parts[2:]:
        k, eq, v = kv.partition("=")
        if not eq:
            raise ValueError(f"--rows: {spec!r}: {kv!r} is not k=v")
        params[k] = float(v) if "." in v else int(v)
    return parts[0], parts[1], params


def retained_tokens(program: Any, block: int, head_dim: int) -> Optional[int]:
    """Tokens of complete blocks a request of this flow keeps (None: it
    keeps every token), as the runtime counts them (Session's
    retained_blocks)."""
    import vflow

    s = vflow.Session(program, layers=1, kv_heads=1, group=1,
                      head_dim=head_dim, max_pages=1, device="cpu")
    blocks = s.retained_blocks
    return None if blocks < 0 else blocks * block


def device_free(device: str) -> Optional[int]:
    """Free device memory in bytes (torch's view of the device), or None."""
    if device != "cuda":
        return None
    try:
        import torch
    except ImportError:
        return None
    return int(torch.cuda.mem_get_info()[0])


def run_row(a: argparse.Namespace, path: str, name: str, vocab: int,
            config: Dict[str, Any], spec: str) -> Dict[str, Any]:
    import vflow
    from vflow._eval import decode_speed, kv_bytes_per_token

    flow, kv_dtype, params = parse_row(spec)
    head_dim = int(config.get("head_dim") or config["hidden_size"]
                   // config["num_attention_heads"])
    prog = None
    if flow != "dense":
        prog = vflow.compile_file(os.path.join(ROOT, "examples",
                                               f"{flow}.vflow"),
                                  params=params)
    block = 16
    if prog is not None:
        block = next(p["value"] for p in prog.summary["flows"][0]["params"]
                     if p["name"] == "block_size")
    per_token = kv_bytes_per_token(int(config["num_hidden_layers"]),
                                   int(config["num_key_value_heads"]),
                                   head_dim, kv_dtype)
    pool = int(a.kv_budget_gib * (1 << 30)) // per_token
    kept = (retained_tokens(prog, block, head_dim) if prog is not None
            else None)
    if kept is None:
        held = a.context + a.output_len
        batch = pool // held
        prompt_len = a.context
    else:
        held = kept + block
        batch = (pool - a.context) // held
        prompt_len = a.context if a.full_prompts else held + block // 2
    row: Dict[str, Any] = dict(
        model=name, flow=flow, params=params or None, kv_dtype=kv_dtype,
        context=a.context, kv_budget_gib=a.kv_budget_gib,
        bytes_per_token=per_token, pool_tokens=pool, held_tokens=held,
        batch=batch, prompt_len=prompt_len, output_len=a.output_len)
    if batch < 1:
        row["error"] = "not one request fits the budget"
        return row
    t0 = time.time()
    free0 = device_free(a.device)
    # max_model_len: what a request gets to, so that the per-slot buffers
    # (block tables, states, mass) are sized for it, not the model's context.
    llm = vflow.LLM(path, flow=prog, kv_dtype=kv_dtype, device=a.device,
                    max_batch=batch, kv_pool_tokens=pool,
                    enable_prefix_caching=False,
                    max_model_len=a.context + a.output_len + block,
                    max_tokens_per_step=max(a.context, 32768))
    row["load_s"] = round(time.time() - t0, 1)
    if free0 is not None:
        # What the engine took on the device: weights, the pool, per-slot
        # buffers, workspaces.
        row["engine_gib"] = round((free0 - device_free(a.device)) / 2**30, 2)
    llm.generate([[5 % vocab] * 64], vflow.SamplingParams(max_tokens=4))
    rng = random.Random(a.context + batch)
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)]
               for _ in range(batch)]
    speed = dict(decode_speed(llm, prompts, a.output_len))
    speed["decode_batch"] = speed.pop("batch", None)
    stats = llm.stats()
    row.update(speed)
    row["blocks_evicted"] = stats.get("blocks_evicted")
    row["pages_reclaimed"] = stats.get("pages_reclaimed")
    del llm
    return row


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--kv-budget-gib", type=float, default=64.0)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--full-prompts", action="store_true",
                    help="retaining rows prefill context-long prompts too")
    a = ap.parse_args(argv)
    rows = a.rows.split(",")
    try:
        for spec in rows:
            name = parse_row(spec)[0]
            if name != "dense" and not os.path.isfile(
                    os.path.join(ROOT, "examples", f"{name}.vflow")):
                ap.error(f"--rows: {name}: no examples/{name}.vflow")
    except ValueError as e:
        ap.error(str(e))
    check_model_args(ap, a)
    os.makedirs(a.out, exist_ok=True)
    path, name, vocab = model_dir(a)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(a.out, "kv_capacity.jsonl"), "a") as out:
        for spec in rows:
            line = json.dumps(run_row(a, path, name, vocab, config, spec))
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
