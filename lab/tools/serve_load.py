"""Serving latency under open-loop load, dense against flows: for each flow,
a `vflow serve` of the model, then `vflow bench serve` at each request rate
(random token-id prompts of --input-len, --output-len tokens each,
ignore_eos), its TTFT/TPOT/ITL/E2EL percentiles and throughputs kept.
Usage: python lab/tools/serve_load.py OUT_DIR [--shape qwen3-1.7b |
--model DIR] [--flows dense,quest,block_topk,h2o] [--rates 1,2,4]
[--input-len 4096] [--output-len 128] [--num-prompts 64] [--device cuda]
[--max-batch 64].
One JSON line per (flow, rate) in OUT_DIR/serve_load.jsonl, the bench's
own JSON per run (OUT_DIR/bench-FLOW-RATE.json), a table
(OUT_DIR/serve_load.md) and, with matplotlib, OUT_DIR/serve_load.png
(median TPOT and TTFT against output throughput, a line per flow).
The random model (--shape, made with torch as engine_shapes.py makes it)
needs a GPU; --model DIR runs any model (the CPU smoke test's tiny one)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KEYS = ("completed", "failed", "request_throughput", "output_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
        "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    sys.path.insert(0, HERE)
    from engine_shapes import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    ap.add_argument("--model", help="an existing model (a directory or a "
                    "GGUF file) instead of --shape")
    ap.add_argument("--dataset", choices=["random-ids", "random"],
                    default=None, help="vflow bench serve's dataset "
                    "(default: random-ids; random text for a GGUF model, "
                    "whose vocabulary size the client does not know)")
    ap.add_argument("--flows", default="dense,quest")
    ap.add_argument("--rates", default="1,2,4")
    ap.add_argument("--input-len", type=int, default=4096)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = ap.parse_args(argv)
    for name in ("input_len", "output_len", "num_prompts", "max_batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    try:
        a.rate_list = [float(r) for r in a.rates.split(",")]
    except ValueError:
        ap.error(f"--rates: {a.rates!r} is not a list of numbers")
    if any(not r > 0 for r in a.rate_list):
        ap.error("--rates: rates must be positive")
    for flow in a.flows.split(","):
        if flow != "dense" and not os.path.exists(flow_path(flow)):
            ap.error(f"--flows: no examples/{flow}.vflow")
    return a


def flow_path(flow: str) -> str:
    return os.path.join(ROOT, "examples", f"{flow}.vflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str, flow: str, a: argparse.Namespace,
                 port: int, log: Any) -> subprocess.Popen:
    # Random text: a word is one token or more (2 per word is ample).
    words = 2 if a.dataset == "random" else 1
    pool = a.max_batch * (words * a.input_len + a.output_len + 64) + 4096
    cmd = [sys.executable, "-m", "vflow.cli", "serve", model,
           "--device", a.device, "--port", str(port),
           "--max-batch", str(a.max_batch), "--kv-pool-tokens", str(pool),
           "--max-tokens-per-step", str(max(words * a.input_len, 2048)),
           "--log-level", "warning"]
    if flow != "dense":
        cmd += ["--flow", flow_path(flow)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(proc, port, f"vflow serve ({flow})")
    return proc


def wait_healthy(proc: subprocess.Popen, port: int, what: str,
                 timeout: float = 600) -> None:
    """Waits until the server `proc` answers GET /health on 127.0.0.1:port
    with 200; RuntimeError when it exits first or the time runs out (then
    it is killed)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: see "
                               "its log")
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{what} did not start in {timeout:g} s")


def bench(port: int, rate: float, vocab: Optional[int],
          a: argparse.Namespace, result: str) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "vflow._bench_serve",
           "--base-url", f"http://127.0.0.1:{port}",
           "--request-rate", str(rate), "--num-prompts", str(a.num_prompts),
           "--dataset", a.dataset,
           "--input-len", str(a.input_len),
           "--output-len", str(a.output_len), "--seed", "0",
           "--result-file", result, "--no-progress"]
    if a.dataset == "random-ids":
        cmd += ["--vocab-size", str(vocab)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"vflow bench serve failed: {proc.stderr}")
    with open(result) as f:
        return json.load(f)


def run_flow(model: str, vocab: Optional[int], flow: str,
             a: argparse.Namespace) -> List[Dict[str, Any]]:
    port = free_port()
    rows = []
    with open(os.path.join(a.out, f"serve-{flow}.log"), "w") as log:
        proc = start_server(model, flow, a, port, log)
        try:
            for rate in a.rate_list:
                result = os.path.join(a.out, f"bench-{flow}-{rate:g}.json")
                r = bench(port, rate, vocab, a, result)
                rows.append(dict(flow=flow, rate=rate, dataset=a.dataset,
                                 input_len=a.input_len,
                                 output_len=a.output_len,
                                 num_prompts=a.num_prompts,
                                 **{k: r.get(k) for k in KEYS}))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    return rows


def table(rows: List[Dict[str, Any]]) -> str:
    head = ("| flow | rate (req/s) | done | req/s | out tok/s | TTFT p50 | "
            "TTFT p99 | TPOT p50 | TPOT p99 |")
    lines = [head, "|" + " --- |" * 9]
    for r in rows:
        lines.append(
            f"| {r['flow']} | {r['rate']:g} | {r['completed']} | "
            f"{r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
            f"{r['median_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | "
            f"{r['median_tpot_ms']:.2f} | {r['p99_tpot_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: List[Dict[str, Any]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for flow in dict.fromkeys(r["flow"] for r in rows):
        mine = [r for r in rows if r["flow"] == flow]
        x = [r["output_throughput"] for r in mine]
        left.plot(x, [r["median_tpot_ms"] for r in mine], "o-", label=flow)
        right.plot(x, [r["median_ttft_ms"] for r in mine], "o-", label=flow)
    for ax, what in ((left, "median TPOT (ms)"), (right, "median TTFT (ms)")):
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(what)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    from engine_shapes import model_dir

    vocab: Optional[int] = None
    if a.model is not None and os.path.isfile(a.model):
        model = a.model  # a GGUF file: its own tokenizer
        a.dataset = a.dataset or "random"
    else:
        model, _, vocab = model_dir(a)
    a.dataset = a.dataset or "random-ids"
    if os.path.isdir(model) and not os.path.exists(
            os.path.join(model, "tokenizer.json")):
        # A server streams text: a random model gets the tests' word-level
        # tokenizer (id i <-> "wi"), which every id decodes through.
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        from tiny_model import write_tokenizer

        assert vocab is not None
        write_tokenizer(model, vocab)
    rows: List[Dict[str, Any]] = []
    with open(os.path.join(a.out, "serve_load.jsonl"), "a") as out:
        for flow in a.flows.split(","):
            for row in run_flow(model, vocab, flow, a):
                out.write(json.dumps(row) + "\n")
                rows.append(row)
    with open(os.path.join(a.out, "serve_load.md"), "w") as f:
        f.write(table(rows))
    plot(rows, os.path.join(a.out, "serve_load.png"))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
