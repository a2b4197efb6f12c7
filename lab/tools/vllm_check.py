"""vflow's vLLM backend checked and timed on the GPU machine against vLLM's
own backend, one vLLM engine per child process (so each frees its memory):

  equal       greedy tokens of the vflow backend with a budget that takes
              every block against vLLM's --reference backend (FLASH_ATTN,
              its default on Hopper; dense equivalence), eager and with
              CUDA graphs, and --control (TRITON_ATTN) against it the same
              way: where two exact backends part at rounding ties
  close       the same with real budgets: agreement of the greedy tokens
  throughput  decode tokens/s at --context tokens and --batch sequences,
              vflow flows against TRITON_ATTN and FLASH_ATTN on the same
              model (decode time = time of N+1 tokens - time of 1)
  profile     kernel times by self CUDA time (torch profiler) of decode
              steps, vLLM's backends and the flows (OUT/profile-*.txt)
  serve       `vllm serve` with the vflow backend, a streamed chat
              completion through the openai client (when importable)
  bench       `vflow bench serve` against `vllm serve`, with vLLM's own
              backends and with the vflow backend (--prompts prompts of
              --context token ids at --request-rate)
  tp          greedy tokens of the vflow backend at --tp ranks against
              one rank (the same flow and budget; the 2-GPU machine)

Usage: python lab/tools/vllm_check.py OUT MODE --model DIR [--flows
quest,block_topk,h2o] [--budgets 16,64] [--context 32768] [--batch 16]
[--output-len 128] [--tp 1] [--prompts 4] [--tokens 48] [--eager |
--graphs] [--baselines FLASH_ATTN,TRITON_ATTN] [--kv-cache-dtype auto|fp8]
Rows go to OUT/vllm_check.jsonl, a line each, printed too. The model is an
HF directory (lab/tools/hf_model.py writes one from a GGUF or random
weights); vLLM comes from lab/tools/vllm_stage.py's install."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIG = 1 << 20  # a budget larger than any block count: every block


def flow_path(name: str) -> str:
    return os.path.join(ROOT, "examples", f"{name}.vflow")


def engine_kwargs(a: argparse.Namespace, backend: str,
                  flow: Optional[str], params: Dict[str, float],
                  eager: bool) -> Dict[str, Any]:
    kw: Dict[str, Any] = dict(
        model=a.model, attention_backend=backend, enforce_eager=eager,
        max_model_len=a.max_model_len, tensor_parallel_size=a.tp,
        gpu_memory_utilization=a.gpu_memory_utilization, seed=0,
        max_num_seqs=max(a.batch, a.prompts), skip_tokenizer_init=True,
        enable_prefix_caching=not a.no_prefix_caching,
        kv_cache_dtype=a.kv_cache_dtype)
    if flow is not None:
        kw["additional_config"] = {"vflow": {
            "flow": flow_path(flow), "params": params,
            "dense_layers": a.dense_layers}}
    return kw


def child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """In a child process: one engine, one job."""
    from vllm import LLM, SamplingParams

    llm = LLM(**spec["engine"])
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    if spec["job"] == "tokens":
        sp = SamplingParams(temperature=0, max_tokens=spec["tokens"],
                            ignore_eos=True, logprobs=2)
        outs = llm.generate(prompts, sp, use_tqdm=False)
        # Each step's margin: top-1 minus top-2 log-probability (a greedy
        # token that parts at a small margin is a rounding tie).
        margins = [[_margin(step) for step in (o.outputs[0].logprobs or [])]
                   for o in outs]
        return {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                "margins": margins}
    if spec["job"] == "profile":
        llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
        sp = SamplingParams(temperature=0, max_tokens=1 + spec["tokens"],
                            ignore_eos=True)
        llm.start_profile()
        start = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        elapsed = time.perf_counter() - start
        llm.stop_profile()
        return {"profiled_s": elapsed}
    times = {}
    # Warm: every prompt once, so that both timed runs find the prompts in
    # the prefix cache (neither prefills; their difference is decode).
    llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    for n in (1, 1 + spec["tokens"]):
        sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        times[n] = time.perf_counter() - start
    decode = times[1 + spec["tokens"]] - times[1]
    return {"prefill_s": times[1], "decode_s": decode,
            "decode_tok_s": len(prompts) * spec["tokens"] / decode}


def _margin(step: Any) -> Optional[float]:
    values = sorted((p.logprob for p in step.values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def run_child(spec: Dict[str, Any], out: str, label: str) -> Dict[str, Any]:
    path = os.path.join(out, f"spec-{label}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    log = os.path.join(out, f"log-{label}.txt")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, __file__, "--child", path],
                              stdout=f, stderr=subprocess.STDOUT,
                              timeout=1800)
    if proc.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        return {"error": f"exit {proc.returncode}", "log_tail": tail}
    with open(path + ".out") as f:
        return dict(json.load(f))


def prompts(a: argparse.Namespace, n: int, length: int,
            seed: int = 0) -> List[List[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, a.vocab) for _ in range(length)]
            for _ in range(n)]


def first_difference(x: List[int], y: List[int]) -> Optional[int]:
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def emit(a: argparse.Namespace, row: Dict[str, Any]) -> None:
    row = dict(row, model=os.path.basename(os.path.normpath(a.model)),
               tp=a.tp)
    print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "vllm_check.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def tokens_of(a: argparse.Namespace, backend: str, flow: Optional[str],
              params: Dict[str, float], eager: bool,
              ids: List[List[int]], label: str) -> Dict[str, Any]:
    spec = dict(job="tokens", tokens=a.tokens, prompts=ids,
                engine=engine_kwargs(a, backend, flow, params, eager))
    return run_child(spec, a.out, label)


def compare(a: argparse.Namespace, ref: Dict[str, Any],
            got: Dict[str, Any], row: Dict[str, Any]) -> Dict[str, Any]:
    """Where each prompt's greedy tokens part from the reference's, the
    share of equal tokens, and the reference's top-1 margin there (a part
    at a small margin is a rounding tie)."""
    if "error" in ref or "error" in got:
        row["error"] = ref.get("error") or got.get("error")
        row["log_tail"] = got.get("log_tail") or ref.get("log_tail")
        return row
    diffs = [first_difference(x, y)
             for x, y in zip(ref["tokens"], got["tokens"])]
    same = sum(p == q for x, y in zip(ref["tokens"], got["tokens"])
               for p, q in zip(x, y))
    return dict(row, first_difference=diffs,
                token_agreement=same / (a.prompts * a.tokens),
                margin_at_difference=[
                    None if d is None or d >= len(m) else m[d]
                    for d, m in zip(diffs, ref["margins"])])


def mode_equal(a: argparse.Namespace, budgets: List[Optional[int]]) -> None:
    """The flows against --reference; --control: another of vLLM's own
    backends against it the same way (how far two exact backends part)."""
    ids = prompts(a, a.prompts, a.prompt_len)
    modes = [True] if a.eager else [False] if a.graphs else [True, False]
    for eager in modes:
        tag = "eager" if eager else "graphs"
        common = dict(cuda_graphs=not eager, prompt_len=a.prompt_len,
                      tokens=a.tokens, reference=a.reference)
        ref = tokens_of(a, a.reference, None, {}, eager, ids,
                        f"{a.reference}-{tag}")
        for control in [c for c in a.control.split(",") if c]:
            got = tokens_of(a, control, None, {}, eager, ids,
                            f"{control}-{tag}")
            emit(a, compare(a, ref, got, dict(mode="control",
                                              backend=control, **common)))
        for flow in a.flows.split(","):
            for budget in budgets:
                params = {"budget": float(budget if budget else BIG)}
                got = tokens_of(a, "CUSTOM", flow, params, eager, ids,
                                f"{flow}-{budget}-{tag}")
                emit(a, compare(a, ref, got, dict(
                    mode="equal" if budget is None else "close", flow=flow,
                    budget=budget or "all", **common)))


def mode_tp(a: argparse.Namespace) -> None:
    """Greedy tokens at --tp ranks against one rank, for each flow and
    budget and, as the control, each of vLLM's --baselines backends (how
    far an exact backend parts from itself when the ranks split the
    model's reductions)."""
    ids = prompts(a, a.prompts, a.prompt_len)
    tp = a.tp
    runs: List[Tuple[str, Optional[str], Dict[str, Any]]] = [
        (b, None, {}) for b in a.baselines.split(",") if b]
    runs += [("CUSTOM", flow, {"budget": float(budget)})
             for flow in a.flows.split(",")
             for budget in [int(b) for b in a.budgets.split(",")]]
    for backend, flow, params in runs:
        label = f"{flow or backend}-{int(params.get('budget', 0))}"
        a.tp = 1
        one = tokens_of(a, backend, flow, params, a.eager, ids,
                        f"{label}-tp1")
        a.tp = tp
        many = tokens_of(a, backend, flow, params, a.eager, ids,
                         f"{label}-tp{tp}")
        emit(a, compare(a, one, many, dict(
            mode="tp", backend=backend, flow=flow,
            budget=params.get("budget"), cuda_graphs=not a.eager)))


def backends(a: argparse.Namespace, budgets: List[str]
             ) -> List[Tuple[str, Optional[str], int]]:
    """What a timing mode runs: each of vLLM's --baselines backends (budget
    0), then the vflow backend for each flow at each of `budgets`."""
    return [(b, None, 0) for b in a.baselines.split(",") if b] + [
        ("CUSTOM", flow, int(b)) for flow in a.flows.split(",")
        for b in budgets]


def mode_throughput(a: argparse.Namespace) -> None:
    ids = prompts(a, a.batch, a.context)
    for backend, flow, budget in backends(a, a.budgets.split(",")):
        params = {"budget": float(budget)} if flow else {}
        spec = dict(job="time", tokens=a.output_len, prompts=ids,
                    engine=engine_kwargs(a, backend, flow, params, a.eager))
        label = f"time-{backend}-{flow}-{budget}"
        r = run_child(spec, a.out, label)
        emit(a, dict(mode="throughput", backend=backend, flow=flow,
                     budget=budget or None, context=a.context,
                     batch=a.batch, output_len=a.output_len,
                     cuda_graphs=not a.eager, **r))


def mode_profile(a: argparse.Namespace) -> None:
    """Kernel times (torch profiler, by self CUDA time) of --output-len
    decode steps after a prefix-cached prompt, for each --baselines
    backend and each flow at its first --budgets: OUT/profile-LABEL.txt."""
    ids = prompts(a, a.batch, a.context)
    for backend, flow, budget in backends(a, a.budgets.split(",")[:1]):
        label = f"{backend}-{flow}" if flow else backend
        trace_dir = os.path.join("/tmp", f"vllm-profile-{label}")
        params = {"budget": float(budget)} if flow else {}
        engine = engine_kwargs(a, backend, flow, params, a.eager)
        engine["profiler_config"] = {
            "profiler": "torch", "torch_profiler_dir": trace_dir,
            "torch_profiler_with_stack": False}
        spec = dict(job="profile", tokens=a.output_len, prompts=ids,
                    engine=engine)
        r = run_child(spec, a.out, f"profile-{label}")
        table = os.path.join(trace_dir, "profiler_out_0.txt")
        if os.path.exists(table):
            with open(table) as src, open(os.path.join(
                    a.out, f"profile-{label}.txt"), "w") as dst:
                dst.write(src.read())
        emit(a, dict(mode="profile", backend=backend, flow=flow,
                     budget=budget if flow else None, context=a.context,
                     batch=a.batch, steps=a.output_len,
                     cuda_graphs=not a.eager, **r))


@contextlib.contextmanager
def vllm_server(a: argparse.Namespace, backend: str, flow: Optional[str],
                budget: int, label: str) -> Iterator[int]:
    """A `vllm serve` of --model on a free port of 127.0.0.1 (served as
    "m"), with the vflow backend when `flow` is given (at `budget`);
    yields the port once it answers /health. Its log: OUT/log-LABEL.txt."""
    sys.path.insert(0, HERE)
    from serve_load import free_port, wait_healthy

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve",
           a.model, "--attention-backend", backend, "--port", str(port),
           "--max-model-len", str(a.max_model_len),
           "--gpu-memory-utilization", str(a.gpu_memory_utilization),
           "--max-num-seqs", str(max(a.batch, a.prompts)),
           "--kv-cache-dtype", a.kv_cache_dtype,
           "--served-model-name", "m"]
    if flow is not None:
        cmd += ["--additional-config", json.dumps({"vflow": {
            "flow": flow_path(flow), "params": {"budget": float(budget)},
            "dense_layers": a.dense_layers}})]
    with open(os.path.join(a.out, f"log-{label}.txt"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(proc, port, "vllm serve")
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def mode_serve(a: argparse.Namespace) -> None:
    """A streamed chat completion through the official openai client."""
    flow = a.flows.split(",")[0]
    row: Dict[str, Any] = dict(mode="serve", flow=flow)
    try:
        budget = int(a.budgets.split(",")[0])
        with vllm_server(a, "CUSTOM", flow, budget, "serve") as port:
            from openai import OpenAI

            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                            api_key="none")
            pieces = []
            for chunk in client.chat.completions.create(
                    model="m", messages=[{"role": "user",
                                          "content": "Name three colors."}],
                    max_tokens=24, temperature=0, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
            row.update(chunks=len(pieces), text="".join(pieces))
    except RuntimeError as e:
        row["error"] = str(e)
    emit(a, row)


def mode_bench(a: argparse.Namespace) -> None:
    """`vflow bench serve` against `vllm serve` with each --baselines
    backend and with the vflow backend per flow: random token-id prompts
    of --context tokens, --output-len each, --prompts of them at
    --request-rate (OUT/bench-LABEL.json: the bench's own JSON)."""
    for backend, flow, budget in backends(a, a.budgets.split(",")[:1]):
        label = f"bench-{backend}-{flow}" if flow else f"bench-{backend}"
        result = os.path.join(a.out, f"{label}.json")
        row: Dict[str, Any] = dict(
            mode="bench", backend=backend, flow=flow,
            budget=budget or None,
            input_len=a.context, output_len=a.output_len,
            num_prompts=a.prompts, request_rate=a.request_rate)
        try:
            with vllm_server(a, backend, flow, budget, label) as port:
                cmd = [sys.executable, "-m", "vflow._bench_serve",
                       "--base-url", f"http://127.0.0.1:{port}",
                       "--model", "m", "--dataset", "random-ids",
                       "--vocab-size", str(a.vocab),
                       "--input-len", str(a.context),
                       "--output-len", str(a.output_len),
                       "--num-prompts", str(a.prompts),
                       "--request-rate", a.request_rate,
                       "--result-file", result, "--no-progress"]
                log = os.path.join(a.out, f"{label}.txt")
                with open(log, "w") as f:
                    done = subprocess.run(cmd, stdout=f,
                                          stderr=subprocess.STDOUT,
                                          timeout=1800)
            if done.returncode != 0 or not os.path.exists(result):
                with open(log) as f:  # the bench's own message
                    tail = f.read().strip().splitlines()[-3:]
                raise RuntimeError(f"vflow bench serve exited with "
                                   f"{done.returncode}: " + " / ".join(tail))
            with open(result) as f:
                got = json.load(f)
            row.update({k: got.get(k) for k in BENCH_KEYS})
        except (RuntimeError, OSError, ValueError) as e:
            row["error"] = str(e)
        emit(a, row)


BENCH_KEYS = ("completed", "failed", "request_throughput",
              "output_throughput", "median_ttft_ms", "p99_ttft_ms",
              "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
              "p99_itl_ms")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        with open(argv[1]) as f:
            spec = json.load(f)
        result = child(spec)
        with open(argv[1] + ".out", "w") as f:
            json.dump(result, f)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("mode", choices=["equal", "close", "throughput",
                                     "profile", "serve", "bench", "tp"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--flows", default="quest,block_topk,h2o")
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--dense-layers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--kv-cache-dtype", default="auto",
                    help="vLLM's KV cache dtype (auto, fp8, ...) for every "
                    "run, the references included")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--eager", action="store_true",
                    help="without CUDA graphs only")
    ap.add_argument("--graphs", action="store_true",
                    help="equal/close: with CUDA graphs only")
    ap.add_argument("--reference", default="FLASH_ATTN",
                    help="equal/close: the backend compared with "
                    "(vLLM's default on Hopper)")
    ap.add_argument("--control", default="TRITON_ATTN",
                    help="equal/close: vLLM's own backends compared with "
                    "the reference the same way ('' for none)")
    ap.add_argument("--request-rate", default="inf",
                    help="bench: requests per second (inf: all at once)")
    ap.add_argument("--baselines", default="FLASH_ATTN,TRITON_ATTN",
                    help="throughput: vLLM's own backends timed beside")
    a = ap.parse_args(argv)
    with open(os.path.join(a.model, "config.json")) as f:
        a.vocab = int(json.load(f)["vocab_size"])
    os.makedirs(a.out, exist_ok=True)
    if a.mode == "equal":
        mode_equal(a, [None])
    elif a.mode == "close":
        mode_equal(a, [int(b) for b in a.budgets.split(",")])
    elif a.mode == "throughput":
        mode_throughput(a)
    elif a.mode == "tp":
        mode_tp(a)
    elif a.mode == "profile":
        mode_profile(a)
    elif a.mode == "bench":
        mode_bench(a)
    else:
        mode_serve(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
