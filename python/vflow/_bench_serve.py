"""`vflow bench serve`: an open-loop load generator for any OpenAI-compatible
server (vflow serve, vLLM, ...), with the metric definitions of
`vllm bench serve` so that the numbers compare (docs/serving.md).

Requests arrive at --request-rate with gamma-distributed gaps (shape
--burstiness, mean 1/rate; 1 is a Poisson process; rate inf sends them all at
once), optionally capped at --max-concurrency in flight. Each one streams
(server-sent events) and is timed on the client: TTFT to the first chunk that
carries text, ITL between chunks that carry text, E2EL to the last chunk with
a choice, TPOT = (E2EL - TTFT) / (output tokens - 1). Output and input token
counts come from the usage chunk (`stream_options.include_usage`); a server
that sends none has its text chunks counted and the prompt's length as built.

HTTP client: httpx2's AsyncClient, not aiohttp (which vLLM's benchmark uses):
it is already installed with the `openai` package that the serving tests
use, so the benchmark adds no dependency; its connection pool is unbounded
(or sized to --max-concurrency) and its read timeout long, so the client
never queues or cuts requests that the open loop sends.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import math
import os
import sys
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

PROG = "vflow bench serve"
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
DATASETS = ("random", "random-ids", "essays", "tasks")
SLO_METRICS = ("ttft", "tpot", "e2el")
# A prefill at a long context under load can keep a stream silent for
# minutes; only a server that hangs for longer is cut.
READ_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0
# Common English words, one token each for most tokenizers (with the
# leading space), so `random` prompts are about --input-len tokens long.
WORDS = tuple("""
time year people way day man thing woman life child world school state
family student group country problem hand part place case week company
system program question work government number night point home water room
mother area money story fact month lot right study book eye job word business
issue side kind head house service friend father power hour game line end
member law car city community name president team minute idea kid body
information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air
teacher force education foot boy age policy process music market sense nation
plan college interest death experience effect use class control care field
development role effort rate heart drug show leader light voice wife police
mind price report decision son view relationship town road arm difference
value building action model season society tax director position player record
paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image
phone data picture practice piece land product doctor wall patient worker news
test movie north love support technology step baby computer type attention film
""".split())


class BenchError(Exception):
    """A user error (a bad option, a server that cannot be reached): one
    line `vflow bench serve: ...` on stderr, exit 2."""


@dataclasses.dataclass
class Prompt:
    """One request to send: `prompt` is text or token ids; `input_len` its
    length as built (words or ids) until the server's usage says better."""

    prompt: Union[str, List[int]]
    input_len: int
    output_len: int


@dataclasses.dataclass
class Outcome:
    """One request's result, times in seconds from its send."""

    success: bool = False
    error: str = ""
    ttft: float = 0.0
    itls: List[float] = dataclasses.field(default_factory=list)
    e2el: float = 0.0
    input_len: int = 0
    output_len: int = 0


@dataclasses.dataclass
class Options:
    """The checked arguments."""

    base_url: str
    model: Optional[str]
    endpoint: str
    request_rate: float
    burstiness: float
    max_concurrency: Optional[int]
    num_prompts: int
    dataset: str
    input_len: int
    output_len: int
    range_ratio: float
    vocab_size: Optional[int]
    seed: int
    slos: Dict[str, float]
    percentiles: List[float]
    result_file: Optional[str]
    progress: bool
    extra_body: Dict[str, Any] = dataclasses.field(default_factory=dict)
    tasks: List[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------- arguments

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `vflow bench serve` (values are checked in run)."""
    a = parser.add_argument
    a("--base-url", required=True,
      help="the server's root, e.g. http://127.0.0.1:8000 (without /v1)")
    a("--model", help="the model name to send (default: the first one "
      "GET /v1/models lists)")
    a("--endpoint", choices=ENDPOINTS, default=ENDPOINTS[0])
    a("--request-rate", default="inf",
      help="requests per second, or inf to send all at once (default inf)")
    a("--burstiness", default="1",
      help="gamma shape of the arrival gaps: 1 Poisson, <1 burstier, "
      ">1 more regular (default 1)")
    a("--max-concurrency", default=None,
      help="requests in flight at most (default: no limit)")
    a("--num-prompts", default="100")
    a("--dataset", choices=DATASETS, default="random")
    a("--input-len", default="1024", help="prompt length (tokens or words)")
    a("--output-len", default="128", help="max_tokens of each request")
    a("--range-ratio", default="0",
      help="lengths uniform in [len*(1-r), len*(1+r)] (0 <= r < 1)")
    a("--vocab-size", default=None,
      help="--dataset random-ids: ids are drawn in [10, vocab-size)")
    a("--seed", default="0")
    a("--goodput", nargs="+", default=[], metavar="METRIC:MS",
      help="latency objectives, e.g. ttft:500 tpot:50 e2el:10000")
    a("--percentiles", default="50,90,99")
    a("--result-file", help="write every metric and per-request arrays "
      "as JSON")
    a("--no-progress", action="store_true", help="no progress bar")
    a("--tasks", default="niah_single",
      help="--dataset tasks: the eval's tasks (vflow.tasks.TASKS), "
      "comma-separated, used in turn")
    a("--extra-body", default=None, metavar="JSON",
      help="a JSON object merged into every request, e.g. "
      '\'{"vflow": {"flow": "quest"}}\' to pick a flow of vflow serve')


def _int(name: str, text: Any, low: int, high: int = 2**31 - 1) -> int:
    try:
        value = int(str(text), 10)
    except ValueError:
        raise BenchError(f"{name}: {text!r} is not an integer") from None
    if not low <= value <= high:
        raise BenchError(f"{name}: {value} is out of range "
                         f"(must be between {low} and {high})")
    return value


def _float(name: str, text: Any, low: float, high: float = math.inf,
           allow_inf: bool = False, low_open: bool = False) -> float:
    try:
        value = float(str(text))
    except ValueError:
        raise BenchError(f"{name}: {text!r} is not a number") from None
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise BenchError(f"{name}: {text!r} is not a finite number")
    if value < low or (low_open and value == low) or value > high:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        if high != math.inf:
            bound += f" and <= {high:g}"
        raise BenchError(f"{name}: {value:g} is out of range "
                         f"(must be {bound})")
    return value


def _base_url(text: str) -> str:
    url = urllib.parse.urlsplit(text.strip())
    if url.scheme not in ("http", "https") or not url.hostname:
        raise BenchError(f"--base-url: {text!r} is not an http:// or "
                         "https:// URL with a host")
    try:
        url.port  # raises on a port that is not a number
    except ValueError as e:
        raise BenchError(f"--base-url: {text!r}: {e}") from None
    path = url.path.rstrip("/")
    if path.endswith("/v1"):
        raise BenchError(f"--base-url: give the server's root without /v1 "
                         f"(the endpoint {ENDPOINTS[0]} is added to it): "
                         f"{text!r}")
    return urllib.parse.urlunsplit((url.scheme, url.netloc, path, "", ""))


def _slos(items: Sequence[str]) -> Dict[str, float]:
    slos: Dict[str, float] = {}
    for item in items:
        name, sep, ms = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise BenchError(f"--goodput: {item!r} is not METRIC:MS with "
                             f"METRIC one of {', '.join(SLO_METRICS)}")
        slos[name] = _float(f"--goodput {name}", ms, 0.0, low_open=True)
    return slos


def _percentiles(text: str) -> List[float]:
    items = [p for p in text.split(",") if p.strip()]
    if not items:
        raise BenchError("--percentiles: give a list such as 50,90,99")
    return [_float("--percentiles", p, 0.0, 100.0) for p in items]


def _result_file(path: Optional[str]) -> Optional[str]:
    """Checked before the run, so that a long run is not lost at the end."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise BenchError(f"--result-file {path}: no folder {folder}")
    if not os.access(folder, os.W_OK) or os.path.isdir(path):
        raise BenchError(f"--result-file {path}: cannot be written")
    return path


def check_options(args: argparse.Namespace) -> Options:
    """The arguments as Options, or a BenchError naming the bad one."""
    opts = Options(
        base_url=_base_url(args.base_url), model=args.model,
        endpoint=args.endpoint,
        request_rate=_float("--request-rate", args.request_rate, 0.0,
                            allow_inf=True, low_open=True),
        burstiness=_float("--burstiness", args.burstiness, 0.0,
                          low_open=True),
        max_concurrency=None if args.max_concurrency is None else
        _int("--max-concurrency", args.max_concurrency, 1, 1 << 16),
        num_prompts=_int("--num-prompts", args.num_prompts, 1, 1 << 20),
        dataset=args.dataset,
        input_len=_int("--input-len", args.input_len, 1, 1 << 24),
        output_len=_int("--output-len", args.output_len, 1, 1 << 24),
        range_ratio=_float("--range-ratio", args.range_ratio, 0.0, 0.99),
        vocab_size=None if args.vocab_size is None else
        _int("--vocab-size", args.vocab_size, 11),
        seed=_int("--seed", args.seed, 0, 2**32 - 1),
        slos=_slos(args.goodput), percentiles=_percentiles(args.percentiles),
        result_file=_result_file(args.result_file),
        progress=not args.no_progress,
        extra_body=_extra_body(getattr(args, "extra_body", None)),
        tasks=_tasks(getattr(args, "tasks", "niah_single")))
    if opts.dataset == "random-ids":
        if opts.vocab_size is None:
            raise BenchError("--dataset random-ids needs --vocab-size")
        if opts.endpoint != ENDPOINTS[0]:
            raise BenchError("--dataset random-ids: token ids are a "
                             f"prompt of {ENDPOINTS[0]} only")
    return opts


def _tasks(text: str) -> List[str]:
    from .tasks import TASKS

    names = [t for t in str(text).split(",") if t]
    for t in names:
        if t not in TASKS:
            raise BenchError(f"--tasks: {t!r} is not a task "
                             f"({', '.join(TASKS)})")
    if not names:
        raise BenchError("--tasks: no task")
    return names


def _extra_body(text: Optional[str]) -> Dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise BenchError(f"--extra-body: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise BenchError("--extra-body: expected a JSON object")
    return value


# ----------------------------------------------------------------- datasets

def _lengths(length: int, ratio: float, n: int,
             rng: np.random.Generator) -> List[int]:
    """n lengths uniform in [length*(1-ratio), length*(1+ratio)], >= 1."""
    low = max(1, int(length * (1 - ratio)))
    high = max(low, int(length * (1 + ratio)))
    return [int(x) for x in rng.integers(low, high + 1, size=n)]


def _essay_words() -> List[str]:
    from .tasks import essay_text

    try:
        return essay_text().split()
    except RuntimeError as e:
        raise BenchError(f"--dataset essays: {e}") from None


def make_prompts(opts: Options) -> List[Prompt]:
    """The requests' prompts, a pure function of the options (seeded)."""
    rng = np.random.default_rng(opts.seed)
    ins = _lengths(opts.input_len, opts.range_ratio, opts.num_prompts, rng)
    outs = _lengths(opts.output_len, opts.range_ratio, opts.num_prompts, rng)
    if opts.dataset == "tasks":
        return _task_prompts(opts, ins, outs)
    words = _essay_words() if opts.dataset == "essays" else list(WORDS)
    prompts = []
    for n_in, n_out in zip(ins, outs):
        if opts.dataset == "random-ids":
            assert opts.vocab_size is not None
            ids = rng.integers(10, opts.vocab_size, size=n_in)
            prompts.append(Prompt([int(i) for i in ids], n_in, n_out))
            continue
        if opts.dataset == "essays":  # a passage from a random offset
            start = int(rng.integers(0, len(words)))
            chosen = [words[(start + i) % len(words)] for i in range(n_in)]
        else:
            chosen = [words[i] for i in rng.integers(0, len(words), n_in)]
        prompts.append(Prompt(" ".join(chosen), n_in, n_out))
    return prompts


def _task_prompts(opts: Options, ins: List[int],
                  outs: List[int]) -> List[Prompt]:
    """The eval's long-context tasks (vflow.tasks: needles in a haystack,
    variable tracking, ...), about `ins[i]` tokens by a rough count (the
    client has no tokenizer), seeds seed + i, the tasks in turn."""
    from .tasks import default_counter, generate

    count = default_counter()
    prompts = []
    for i, (n_in, n_out) in enumerate(zip(ins, outs)):
        if n_in < 64:
            raise BenchError(f"--dataset tasks: prompts of {n_in} tokens are "
                             "too short for the tasks (>= 64)")
        example = generate(opts.tasks[i % len(opts.tasks)], length=n_in,
                           count=count, seed=opts.seed + i)
        prompts.append(Prompt(example.prompt, n_in, n_out))
    return prompts


# ---------------------------------------------------------- arrival process

def arrival_gaps(n: int, rate: float, burstiness: float,
                 rng: np.random.Generator) -> np.ndarray:
    """n gaps between arrivals: gamma(shape=burstiness, mean=1/rate);
    zeros for rate inf."""
    if math.isinf(rate):
        return np.zeros(n)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness),
                     size=n)


def arrival_times(n: int, rate: float, burstiness: float,
                  seed: int) -> np.ndarray:
    """When each request is sent, in seconds from the start. As vLLM does,
    the times are scaled so the last one is n/rate: a run's offered load is
    the rate asked, whatever the seed."""
    times = np.cumsum(arrival_gaps(n, rate, burstiness,
                                   np.random.default_rng([seed, 1])))
    if times[-1] > 0:
        times *= (n / rate) / times[-1]
    return times


# ------------------------------------------------------------------ request

def _payload(opts: Options, model: str, prompt: Prompt) -> Dict[str, Any]:
    body: Dict[str, Any] = dict(
        model=model, max_tokens=prompt.output_len, temperature=0.0,
        ignore_eos=True, stream=True, stream_options={"include_usage": True})
    if opts.endpoint == ENDPOINTS[0]:
        body["prompt"] = prompt.prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt.prompt}]
    body.update(opts.extra_body)
    return body


def _chunk_text(choice: Any) -> str:
    """The text a completions or chat chunk's choice carries (ValueError
    for a choice of another shape)."""
    if not isinstance(choice, dict):
        raise ValueError(f"a choice that is not an object: {choice!r:.80}")
    delta = choice.get("delta")
    holder = delta if isinstance(delta, dict) else choice
    text = holder.get("content" if holder is delta else "text")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"a choice whose text is not a string: {text!r:.80}")
    return text or ""


def _count(usage: Dict[str, Any], key: str) -> Optional[int]:
    value = usage.get(key)
    if value is not None and (isinstance(value, bool)
                              or not isinstance(value, int) or value < 0):
        raise ValueError(f"usage.{key} is not a count: {value!r:.40}")
    return value


class StreamTimer:
    """Reads a response's server-sent events (one JSON object per `data:`
    line, then `data: [DONE]`) and times the chunks that carry text."""

    def __init__(self, start: float, input_len: int) -> None:
        self.start = start
        self.outcome = Outcome(input_len=input_len)
        self.last_token = 0.0
        self.tokens = 0
        self.usage_tokens: Optional[int] = None
        self.done = False

    def feed(self, line: str, now: float) -> None:
        """One line of the stream; raises ValueError on a broken one."""
        if not line.startswith("data:"):
            return  # blank lines, comments (":"), event: and id: fields
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"a data: line that is not an object: {data:.80}")
        if chunk.get("error"):
            raise ValueError(f"the server sent an error: {chunk['error']}")
        self._chunk(chunk, now - self.start)

    def _chunk(self, chunk: Dict[str, Any], t: float) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if _count(usage, "completion_tokens") is not None:
                self.usage_tokens = usage["completion_tokens"]
            if _count(usage, "prompt_tokens") is not None:
                self.outcome.input_len = usage["prompt_tokens"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ValueError(f"choices is not a list: {choices!r:.80}")
        if not choices:
            return
        self.outcome.e2el = t
        if not _chunk_text(choices[0]):
            return  # a role or finish chunk: no token
        if self.tokens == 0:
            self.outcome.ttft = t
        else:
            self.outcome.itls.append(t - self.last_token)
        self.last_token = t
        self.tokens += 1

    def finish(self) -> Outcome:
        out = self.outcome
        if not self.done:
            out.error = "the stream ended before data: [DONE]"
        elif self.tokens == 0:
            out.error = "the response carried no text"
        out.success = not out.error
        out.output_len = (self.usage_tokens if self.usage_tokens is not None
                          else self.tokens)
        return out


def _http_error(status: int, body: bytes) -> str:
    """`HTTP 500: message` with the OpenAI error's message when there is
    one."""
    text = body.decode("utf-8", "replace").strip()
    try:
        error = json.loads(text).get("error")
        text = error.get("message", text) if isinstance(error, dict) else text
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}: {text[:200]}"


async def send(client: Any, url: str, body: Dict[str, Any],
               input_len: int) -> Outcome:
    """Sends one streaming request and times it; failures are in the
    Outcome, never raised."""
    import httpx2

    start = time.perf_counter()
    timer = StreamTimer(start, input_len)
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                return Outcome(error=_http_error(response.status_code,
                                                 await response.aread()),
                               input_len=input_len)
            async for line in response.aiter_lines():
                timer.feed(line, time.perf_counter())
                if timer.done:
                    break
    except (httpx2.HTTPError, ValueError, UnicodeError) as e:
        return Outcome(error=f"{type(e).__name__}: {e}", input_len=input_len)
    return timer.finish()


# ------------------------------------------------------------------ running

class Progress:
    """tqdm on stderr when installed, else a counter; nothing when off."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.bar = total, 0, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, file=sys.stderr)
            except ImportError:
                pass

    def update(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            print(f"\r{self.done}/{self.total} requests", end="",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            print(file=sys.stderr)


def _client(opts: Options) -> Any:
    import httpx2

    limit = opts.max_concurrency
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        limits=httpx2.Limits(max_connections=limit,
                             max_keepalive_connections=limit))


async def _model(client: Any, opts: Options) -> str:
    """Checks that the server answers GET /v1/models; the model to ask for
    (--model, else the first one listed)."""
    import httpx2

    url = opts.base_url + "/v1/models"
    try:
        response = await client.get(url, timeout=CONNECT_TIMEOUT_S)
    except httpx2.HTTPError as e:
        raise BenchError(f"cannot reach {url}: {type(e).__name__}: "
                         f"{e}") from None
    if response.status_code != 200:
        error = _http_error(response.status_code, response.content)
        raise BenchError(f"{url}: {error}")
    if opts.model:
        return opts.model
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"{url} lists no model; give --model") from None


async def benchmark(opts: Options, prompts: Sequence[Prompt]
                    ) -> Tuple[List[Outcome], float, str]:
    """Checks the server with one request, then sends every prompt on the
    open-loop schedule; the outcomes in prompt order, the duration and the
    model asked for."""
    url = opts.base_url + opts.endpoint
    async with _client(opts) as client:
        model = await _model(client, opts)
        first = await send(client, url, _payload(opts, model, prompts[0]),
                           prompts[0].input_len)
        if not first.success:
            raise BenchError(f"a first request to {url} failed: {first.error}")
        print(f"Traffic request rate: {opts.request_rate:g}, burstiness "
              f"{opts.burstiness:g}, maximum request concurrency: "
              f"{opts.max_concurrency}", flush=True)
        outcomes, duration = await _open_loop(client, url, opts, model,
                                              prompts)
        return outcomes, duration, model


async def _open_loop(client: Any, url: str, opts: Options, model: str,
                     prompts: Sequence[Prompt]) -> Tuple[List[Outcome], float]:
    times = arrival_times(len(prompts), opts.request_rate, opts.burstiness,
                          opts.seed)
    limit = (asyncio.Semaphore(opts.max_concurrency)
             if opts.max_concurrency else None)
    progress = Progress(len(prompts), opts.progress)

    async def one(prompt: Prompt) -> Outcome:
        body = _payload(opts, model, prompt)
        if limit is None:
            out = await send(client, url, body, prompt.input_len)
        else:
            async with limit:
                out = await send(client, url, body, prompt.input_len)
        progress.update()
        return out

    start = time.perf_counter()
    tasks = []
    for prompt, at in zip(prompts, times):
        delay = start + float(at) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(prompt)))
    try:
        outcomes = list(await asyncio.gather(*tasks))
    finally:
        progress.close()
    return outcomes, time.perf_counter() - start


# ------------------------------------------------------------------ metrics

def _p_name(p: float) -> str:
    return str(int(p)) if p == int(p) else str(p)


def _stats(name: str, values_s: Sequence[float],
           percentiles: Sequence[float]) -> Dict[str, float]:
    """mean/median/std/pXX of `values_s` in ms (0 when there are none, as
    vLLM reports)."""
    ms = np.asarray(values_s if len(values_s) else [0.0]) * 1000.0
    out = {f"mean_{name}_ms": float(np.mean(ms)),
           f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(np.std(ms))}
    for p in percentiles:
        out[f"p{_p_name(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def _tpot(o: Outcome) -> float:
    """(E2EL - TTFT) / (output tokens - 1); 0 for one token (goodput counts
    it as meeting any TPOT objective, as vLLM does)."""
    return (o.e2el - o.ttft) / (o.output_len - 1) if o.output_len > 1 else 0.0


def _good(o: Outcome, slos: Dict[str, float]) -> bool:
    values = {"ttft": o.ttft, "tpot": _tpot(o), "e2el": o.e2el}
    return all(values[k] * 1000.0 <= ms for k, ms in slos.items())


def summarize(outcomes: Sequence[Outcome], duration: float,
              percentiles: Sequence[float],
              slos: Dict[str, float]) -> Dict[str, Any]:
    """Every metric of `vllm bench serve`, with its keys and definitions:
    sums and latencies over the requests that succeeded, rates over the
    run's duration, goodput = requests meeting every objective / duration."""
    ok = [o for o in outcomes if o.success]
    total_in = sum(o.input_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    result: Dict[str, Any] = {
        "duration": duration, "completed": len(ok),
        "failed": len(outcomes) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": (sum(_good(o, slos) for o in ok) / duration
                            if slos else None),
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    result.update(_stats("ttft", [o.ttft for o in ok], percentiles))
    result.update(_stats("tpot", [_tpot(o) for o in ok if o.output_len > 1],
                         percentiles))
    result.update(_stats("itl", [t for o in ok for t in o.itls], percentiles))
    result.update(_stats("e2el", [o.e2el for o in ok], percentiles))
    result.update(
        input_lens=[o.input_len if o.success else 0 for o in outcomes],
        output_lens=[o.output_len if o.success else 0 for o in outcomes],
        ttfts=[o.ttft for o in outcomes], itls=[o.itls for o in outcomes],
        e2els=[o.e2el for o in outcomes], errors=[o.error for o in outcomes])
    return result


_SECTIONS = (("ttft", "TTFT", "Time to First Token"),
             ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"),
             ("e2el", "E2EL", "End-to-end Latency"))


def format_table(result: Dict[str, Any], opts: Options) -> str:
    """The summary, laid out as vLLM's."""
    lines = ["{:=^50}".format(" Serving Benchmark Result ")]

    def row(label: str, value: Any) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<40} {text:<10}")

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    if opts.max_concurrency is not None:
        row("Maximum request concurrency:", opts.max_concurrency)
    if not math.isinf(opts.request_rate):
        row("Request rate configured (RPS):", opts.request_rate)
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", result["request_throughput"])
    if opts.slos:
        row("Request goodput (req/s):", result["request_goodput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Total token throughput (tok/s):", result["total_token_throughput"])
    for key, name, header in _SECTIONS:
        lines.append("{:-^50}".format(header))
        row(f"Mean {name} (ms):", result[f"mean_{key}_ms"])
        row(f"Median {name} (ms):", result[f"median_{key}_ms"])
        for p in opts.percentiles:
            row(f"P{_p_name(p)} {name} (ms):",
                result[f"p{_p_name(p)}_{key}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


def _settings(opts: Options, model: str) -> Dict[str, Any]:
    rate = opts.request_rate
    return dict(base_url=opts.base_url, endpoint=opts.endpoint, model_id=model,
                dataset=opts.dataset, num_prompts=opts.num_prompts,
                input_len=opts.input_len, output_len=opts.output_len,
                range_ratio=opts.range_ratio, seed=opts.seed,
                request_rate="inf" if math.isinf(rate) else rate,
                burstiness=opts.burstiness,
                max_concurrency=opts.max_concurrency, goodput=opts.slos,
                percentiles=opts.percentiles)


def _write_result(path: str, result: Dict[str, Any]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, allow_nan=False)
            f.write("\n")
    except OSError as e:
        raise BenchError(f"--result-file {path}: {e.strerror or e}") from None


def _report_errors(outcomes: Sequence[Outcome]) -> None:
    counts = collections.Counter(o.error for o in outcomes if not o.success)
    for error, n in counts.most_common(3):
        print(f"{PROG}: {n} request(s) failed: {error}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark: 0 when at least one request succeeded, 1 when
    none did, 2 for a user error (one line on stderr), 130 on Ctrl-C."""
    try:
        opts = check_options(args)
        prompts = make_prompts(opts)
        outcomes, duration, model = asyncio.run(benchmark(opts, prompts))
    except BenchError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    result = summarize(outcomes, duration, opts.percentiles, opts.slos)
    print(format_table(result, opts))
    _report_errors(outcomes)
    if opts.result_file:
        try:
            _write_result(opts.result_file,
                          dict(_settings(opts, model), **result))
        except BenchError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2
    return 0 if result["completed"] else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
