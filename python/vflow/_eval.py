"""vflow.evaluate: how well flows keep a real model's answers on
long-context tasks, next to dense attention, an oracle selection and a
random one, with standard errors.

    rows = vflow.evaluate("SmolLM2.gguf", ["examples/quest.vflow"],
                          sweep={"budget": [8, 16, 32]},
                          tasks=["niah_single"], lengths=[2048], n=12)

Every (flow, params) row runs the same examples (tasks.suite) greedily in
the serving engine and scores them by exact match; rows are plain dicts
(JSON-ready), a failure is a row with "error" set.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from . import _check
from . import tasks as _tasks

Row = Dict[str, Any]


def stock_program(name: str) -> str:
    """The path of examples/NAME.vflow: shipped in the package, or in a
    source checkout (VFLOW_SOURCE_DIR, or the one this package is in)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.environ.get("VFLOW_SOURCE_DIR", ""), here,
                 os.path.join(here, "..", "..")):
        path = os.path.join(root, "examples", name + ".vflow")
        if root and os.path.exists(path):
            return os.path.abspath(path)
    raise FileNotFoundError(f"stock program {name!r} not found (set "
                            "VFLOW_SOURCE_DIR to a vflow checkout)")


def parse_sweep(specs: Sequence[str]) -> Dict[str, List[Any]]:
    """['budget=8,16', 'decay=0.9'] -> {'budget': [8, 16], 'decay': [0.9]}.
    Each spec is NAME=VALUE[,VALUE...] in the syntax vflowc -p reads
    (runtime/Params.h: blanks around the name and each value are ignored;
    a value is true, false, an integer or a finite decimal number).
    Repeated specs of one name add to its sweep (-p budget=8 -p budget=16
    is -p budget=8,16); a value given twice is refused. A malformed spec
    raises ValueError naming it."""
    from . import _vflow

    out: Dict[str, List[Any]] = {}
    for spec in specs:
        if not isinstance(spec, str):
            raise ValueError(f"-p {spec!r}: expected NAME=VALUE[,VALUE...]")
        try:
            name, values = _vflow.split_param_spec(spec)
        except ValueError as e:
            raise ValueError(f"-p {spec!r}: {e}") from None
        if not name or not values:
            raise ValueError(f"-p {spec!r}: expected NAME=VALUE[,VALUE...] "
                             f"(the {'name' if not name else 'value'} is "
                             "missing)")
        parsed = out.setdefault(name, [])
        for v in values.split(","):
            try:
                value = _vflow.parse_param_value(v)
            except ValueError as e:
                raise ValueError(f"-p {spec!r}: {e}") from None
            # 1 and true, 2 and 2.0 are the same value to the compiler.
            if any(value == p for p in parsed):
                raise ValueError(f"-p {spec!r}: {name}={v.strip()} is given "
                                 "twice")
            parsed.append(value)
    return out


def json_text(value: Any) -> str:
    """`value` as JSON: NaN and infinities (a standard error of one
    example, a ratio against zero) become null, and nothing else that JSON
    cannot hold gets through (json.dumps refuses it)."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(value), allow_nan=False)


def _grid(sweep: Mapping[str, Sequence[Any]]) -> List[Dict[str, Any]]:
    keys = list(sweep)
    return [dict(zip(keys, combo))
            for combo in itertools.product(*(sweep[k] for k in keys))] or [{}]


def _mean_stderr(xs: Sequence[float]) -> Tuple[float, float]:
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    mean = sum(xs) / n
    if n < 2:
        return (mean, math.nan)
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return (mean, math.sqrt(var / n))


def decode_speed(llm: Any, prompts: Sequence[Any],
                 output_len: int) -> Dict[str, Any]:
    """Runs `prompts` (text or token ids) together to 1 + output_len tokens
    (ignore_eos) and times the pure decode steps (every running request
    one token, no prefill in the step) on the host around LLM.step().
    With prefix caching on in `llm`, each prompt is prefilled once first, so
    that in the timed run the prefills are prefix hits and the requests
    decode together (otherwise, at long contexts, the first requests can
    finish before the last one's chunked prefill ends, and no step is pure
    decode). When the KV pool holds fewer of the prompts than were given,
    the ones that fit decode together and the rest wait: `batch` says how
    many requests a timed step decoded on average. Returns
    decode_tok_s, ms_per_step, decode_steps, batch, prefill_s (to the
    first pure decode step), total_s, prefix_hit_tokens and the step_ms
    split over the run."""
    from ._llm import SamplingParams

    # Fills the prefix cache (when the engine has one).
    if llm.config.enable_prefix_caching:
        llm.generate(list(prompts), SamplingParams(max_tokens=1))
    sp = SamplingParams(max_tokens=1 + output_len, ignore_eos=True)
    for p in prompts:
        llm.add_request(p, sp)
    s0 = llm.stats()
    # One stats() per step (on the GPU it waits for the device): what a
    # step saw running is what the one before it left.
    before = s0
    t_start = time.time()
    prefill_end: Optional[float] = None
    decode_s, decode_tokens, decode_steps = 0.0, 0, 0
    while llm.has_unfinished_requests():
        t0 = time.time()
        llm.step()
        dt = time.time() - t0
        after = llm.stats()
        running = before["running"]
        if running and (after["tokens_computed"] - before["tokens_computed"]
                        == running):
            decode_s += dt
            decode_tokens += running
            decode_steps += 1
            if prefill_end is None:
                prefill_end = t0
        before = after
    total_s = time.time() - t_start
    s1 = before
    split = {k: round(s1["step_ms"][k] - s0["step_ms"][k], 1)
             for k in s1["step_ms"]}
    return dict(prefill_s=round((prefill_end or t_start) - t_start, 2),
                prefix_hit_tokens=s1["prefix_hit_tokens"]
                - s0["prefix_hit_tokens"],
                total_s=round(total_s, 2), decode_steps=decode_steps,
                batch=round(decode_tokens / decode_steps, 2)
                if decode_steps else None,
                decode_tok_s=round(decode_tokens / decode_s, 1)
                if decode_s else None,
                ms_per_step=round(decode_s * 1000 / decode_steps, 3)
                if decode_steps else None,
                step_ms=split)


@dataclass
class _Setup:
    model: str
    device: Optional[str]
    dense_layers: int
    max_tokens: int
    max_batch: int
    kv_pool_tokens: int
    examples: List[_tasks.Example]
    #: The KV cache's dtype (None: the engine's default, bf16).
    kv_dtype: Optional[str]
    speed: bool
    #: Sequential stopping: a flow row stops adding examples once its paired
    #: difference to dense is resolved (see _stopping); None: every example.
    resolve: Optional[float] = None


def _score(out: Any, ex: _tasks.Example) -> float:
    return (_tasks.score(out.text or "", ex) if out.finish_reason != "error"
            else 0.0)


def _interleaved(examples: Sequence[_tasks.Example]) -> List[int]:
    """Example indices taking each (task, length) in turn, so that a run
    stopped early has seen every kind of example about equally."""
    groups: Dict[Tuple[str, int], List[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault((ex.task, ex.length), []).append(i)
    order: List[int] = []
    for round_ in itertools.zip_longest(*groups.values()):
        order.extend(i for i in round_ if i is not None)
    return order


#: The KV cache dtypes (docs/engine.md: f32 and fp8e5m2 on the CPU only):
#: the bytes a K (or V) element takes, and the bytes of the f32 scale each
#: (token, KV head) row of an 8-bit dtype has beside it (docs/runtime.md).
KV_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "fp8e4m3": 1, "fp8e5m2": 1,
            "int8": 1}
KV_SCALE_BYTES = {"fp8e4m3": 4, "fp8e5m2": 4, "int8": 4}
KV_DTYPES = tuple(KV_BYTES)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int,
                       kv_dtype: str) -> int:
    """Bytes one token's K and V take in the cache, every layer and KV
    head, 8-bit rows with their scales."""
    return 2 * layers * kv_heads * (head_dim * KV_BYTES[kv_dtype]
                                    + KV_SCALE_BYTES.get(kv_dtype, 0))

#: Fewest examples before a row may stop, and the z of a 95% interval.
_MIN_EXAMPLES, _Z = 8, 1.96


def _stopping(diffs: Sequence[float], resolve: float) -> Optional[str]:
    """Whether a flow's paired differences to dense settle the question:
    "resolved" when the 95% interval of their mean excludes 0, "within"
    when it lies inside +-resolve (any difference is smaller than that);
    None to go on. The interval is taken over the differences plus two
    made-up ones, +1 and -1 (the extremes of a difference of scores in
    [0, 1]): without them, 8 examples where flow and dense agree have a
    standard error of 0 and would claim "within" any DIFF; with them,
    agreement on every example settles +-0.05 only after 54."""
    if len(diffs) < _MIN_EXAMPLES:
        return None
    low, high = _interval(diffs)
    if low > 0 or high < 0:
        return "resolved"
    if -resolve <= low and high <= resolve:
        return "within"
    return None


def _interval(diffs: Sequence[float]) -> Tuple[float, float]:
    """The 95% interval of the mean of paired differences (of scores in
    [0, 1]) that _stopping judges: mean +- 1.96 SE over the differences
    with two made-up ones, +1 and -1, added."""
    mean, se = _mean_stderr(list(diffs) + [1.0, -1.0])
    return mean - _Z * se, mean + _Z * se


def _generate(llm: Any, setup: _Setup, kind: str,
              dense: Optional[Sequence[Optional[float]]],
              row: Row) -> List[Any]:
    """The row's outputs, one per example (None for one not run): every
    example, or with sequential stopping (a flow row, setup.resolve and the
    dense scores) chunks of examples in interleaved order until
    _stopping says so (row["stopped"])."""
    from ._llm import SamplingParams

    prompts = [ex.prompt for ex in setup.examples]
    sampling = SamplingParams(max_tokens=setup.max_tokens)
    if setup.resolve is None or dense is None or kind != "flow":
        return list(llm.generate(prompts, sampling))
    outs: List[Any] = [None] * len(prompts)
    order = _interleaved(setup.examples)
    step = max(setup.max_batch, 4)
    for start in range(0, len(order), step):
        part = order[start:start + step]
        for i, o in zip(part, llm.generate([prompts[i] for i in part],
                                           sampling)):
            outs[i] = o
        diffs = [_score(outs[i], setup.examples[i]) - float(dense[i] or 0)
                 for i in order[:start + len(part)]]
        stop = _stopping(diffs, setup.resolve)
        if stop:
            row["stopped"] = stop
            break
    return outs


def _run_row(setup: _Setup, kind: str, file: Optional[str],
             params: Mapping[str, Any],
             dense: Optional[Sequence[Optional[float]]] = None) -> Row:
    """One row: the engine with `file` (None: dense) on every example (or,
    with sequential stopping, until the paired difference to `dense`, the
    dense row's scores, is settled)."""
    from ._llm import LLM

    row: Row = dict(kind=kind, file=file, params=dict(params),
                    flow=os.path.splitext(os.path.basename(file))[0]
                    if file else "dense")
    t0 = time.time()

    def engine(mass_recall: bool, prefix_caching: bool = False) -> Any:
        return LLM(setup.model, flow=file, params=dict(params) or None,
                   dense_layers=setup.dense_layers, device=setup.device,
                   max_batch=setup.max_batch,
                   kv_pool_tokens=setup.kv_pool_tokens,
                   kv_dtype=setup.kv_dtype,
                   enable_prefix_caching=prefix_caching,
                   mass_recall=mass_recall)

    try:
        # With a flow, the tasks run with the mass recall measured (a
        # second, dense attention per sparse layer); the speed is timed on
        # an engine without it.
        llm = engine(file is not None)
        prompts = [ex.prompt for ex in setup.examples]
        outs = _generate(llm, setup, kind, dense, row)
        stats = llm.stats()
        if setup.speed:  # decode speed on the longest prompts, batched
            del llm
            llm = engine(False, prefix_caching=True)
            longest = sorted(prompts, key=len)[-setup.max_batch:]
            row["speed"] = decode_speed(llm, longest, 64)
            row["decode_tok_s"] = row["speed"]["decode_tok_s"]
    except Exception as e:  # a bad flow, param, model or shape: the row
        row.update(error=f"{type(e).__name__}: {e}",
                   seconds=round(time.time() - t0, 2))
        return row
    errors = [o.error for o in outs
              if o is not None and o.finish_reason == "error"]
    scores: List[Optional[float]] = [
        None if o is None else _score(o, ex)
        for o, ex in zip(outs, setup.examples)]
    ran = [(s, ex) for s, ex in zip(scores, setup.examples) if s is not None]
    acc, se = _mean_stderr([s for s, _ in ran])
    per_task: Dict[str, float] = {}
    for name in dict.fromkeys(ex.task for ex in setup.examples):
        per_task[name] = _mean_stderr(
            [s for s, ex in ran if ex.task == name])[0]
    per_length: Dict[str, float] = {}
    for length in dict.fromkeys(ex.length for ex in setup.examples):
        per_length[str(length)] = _mean_stderr(
            [s for s, ex in ran if ex.length == length])[0]
    if "stopped" in row or len(ran) < len(scores):
        row["examples_run"] = len(ran)
    lists = stats.get("lists_attended", 0)
    attended = stats.get("blocks_attended", 0)
    available = stats.get("blocks_available", 0)
    row.update(
        scores=scores, accuracy=acc, stderr=se, per_task=per_task,
        per_length=per_length,
        attended_blocks=attended / lists if lists else None,
        attended_share=attended / available if available else None,
        seconds=round(time.time() - t0, 2))
    row.update(_recall_columns(stats.get("mass_recall")))
    if stats.get("blocks_evicted"):
        # A retain block: the shares and recall above are of what the
        # cache kept; accuracy is the model's own.
        row["blocks_evicted"] = int(stats["blocks_evicted"])
    if errors:
        row["request_errors"] = sorted(set(errors))
    return row


def _recall_columns(per_layer: Optional[Sequence[Any]]) -> Row:
    """mass_recall (the mean over sparse layers and query heads),
    mass_recall_se (the standard error of that mean over the (layer, head)
    pairs: how much the heads disagree, not a sampling error over examples),
    mass_recall_layers (per layer; None for dense layers),
    mass_recall_heads (per layer, per query head) and worst_heads (the 5
    (layer, head) pairs of lowest recall) from the engine's per-layer,
    per-head means."""
    if not per_layer:
        return {}
    heads = [(layer, head, value)
             for layer, values in enumerate(per_layer) if values
             for head, value in enumerate(values)]
    if not heads:
        return {}
    worst = sorted(heads, key=lambda t: t[2])[:5]
    mean, se = _mean_stderr([v for _, _, v in heads])
    return dict(
        mass_recall=mean,
        mass_recall_se=se,
        mass_recall_layers=[None if not values else sum(values) / len(values)
                            for values in per_layer],
        mass_recall_heads=[None if not values else list(values)
                           for values in per_layer],
        worst_heads=[dict(layer=layer, head=head, recall=value)
                     for layer, head, value in worst])


def _declares_scale(file: str) -> bool:
    """Whether the flow declares a param `scale` (a softmax scale that the
    eval sets to the model's; False when it does not compile: its rows
    report that)."""
    from ._program import compile_file

    try:
        return "scale" in compile_file(file).param_defaults()
    except Exception:
        return False


def model_config(model: Any) -> Dict[str, Any]:
    """The model's config (ModelConfig::toJson: maxPositions, numLayers,
    vocabSize, ...) without loading its weights: the files are opened and
    checked, memory mapped. FileNotFoundError when there is no such file;
    the loader's error (naming the file) as a ValueError."""
    from . import _vflow

    path = _check.path("model", model)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model: {path} does not exist")
    try:
        config, _ = _vflow.model_info(path)
    except _vflow.RuntimeError as e:
        raise ValueError(f"model: {e}") from None
    return dict(json.loads(config))


def check_options(model: Any, *, tasks: Sequence[str],
                  lengths: Sequence[int], n: int, seed: int, haystack: str,
                  device: Optional[str], dense_layers: int, max_tokens: int,
                  max_batch: int, kv_dtype: Optional[str] = None
                  ) -> Dict[str, Any]:
    """Every option of an evaluation checked before anything runs (what
    evaluate and `vflow eval` refuse): a ValueError or TypeError naming
    the option. Returns the model's config."""
    if isinstance(tasks, str) or not tasks:
        raise ValueError("tasks: expected a non-empty list of task names")
    for t in tasks:
        if t not in _tasks.TASKS:
            raise ValueError(f"tasks: unknown task {t!r} (one of "
                             f"{', '.join(_tasks.TASKS)})")
    n = _check.integer("n", n, low=1)
    _check.integer("seed", seed, high=_check.MAX_EXACT_INT - n)
    _check.integer("dense_layers", dense_layers)
    _check.integer("max_batch", max_batch, low=1, high=65536)
    max_tokens = _check.integer("max_tokens", max_tokens, low=1)
    if haystack not in ("noise", "essay"):
        raise ValueError(f"haystack: {haystack!r} is not 'noise' or 'essay'")
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"device: {device!r} is not 'cpu' or 'cuda'")
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype: {kv_dtype!r} is not one of "
                         f"{', '.join(KV_DTYPES)}")
    if isinstance(lengths, (str, bytes)) or not lengths:
        raise ValueError("lengths: expected a non-empty list of token counts")
    config = model_config(model)
    context = int(config.get("maxPositions") or 0)
    for i, length in enumerate(lengths):
        length = _check.integer(f"lengths[{i}]", length, low=64,
                                high=_check.INT64_MAX)
        if context and length + max_tokens > context:
            raise ValueError(
                f"lengths: {length} tokens and {max_tokens} answer tokens "
                f"are over the model's context of {context} tokens; use "
                "shorter --lengths")
    return config


def _check_sweep(sweep: Mapping[str, Sequence[Any]]) -> Dict[str, List[Any]]:
    if not isinstance(sweep, Mapping):
        raise ValueError("sweep: expected a dict of param name -> values")
    out: Dict[str, List[Any]] = {}
    for name, values in sweep.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"sweep: param name {name!r} is not a string")
        if isinstance(values, (str, bytes)) or not isinstance(
                values, Sequence) or not values:
            raise ValueError(f"sweep: {name}: expected a non-empty list of "
                             "values")
        for v in values:
            if not isinstance(v, (bool, int, float)):
                raise ValueError(f"sweep: {name}: {v!r} is not a number or "
                                 "a bool")
        out[name] = list(values)
    return out


def _default_cache() -> str:
    root = os.environ.get("VFLOW_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "vflow")
    return os.path.join(root, "eval")


class _RowCache:
    """Rows of the dense, oracle and random selections, kept across calls
    in `folder` (one JSON file each), keyed by everything they depend on:
    the model file(s) (path, size, mtime), the suite, the engine options,
    the program's text and params, and vflow's version. Flow rows are not
    kept (the program is what an agent changes)."""

    def __init__(self, folder: Optional[str], key: Mapping[str, Any]) -> None:
        self.folder, self.key = folder, dict(key)

    def _path(self, kind: str, file: Optional[str],
              params: Mapping[str, Any]) -> Optional[str]:
        if self.folder is None or kind not in ("dense", "oracle", "random"):
            return None
        import hashlib

        text = ""
        if file is not None:
            with open(file, "rb") as f:
                text = hashlib.sha256(f.read()).hexdigest()
        blob = json.dumps(dict(self.key, kind=kind, program=text,
                               params=dict(params)), sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:32]
        return os.path.join(self.folder, f"{kind}-{digest}.json")

    def get(self, kind: str, file: Optional[str],
            params: Mapping[str, Any]) -> Optional[Row]:
        path = self._path(kind, file, params)
        if path is None or not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                row = json.load(f)
        except (OSError, ValueError):
            return None  # a damaged entry is run again
        return dict(row, cached=True) if isinstance(row, dict) else None

    def put(self, row: Row, file: Optional[str]) -> None:
        path = self._path(row["kind"], file, row["params"])
        if path is None or row.get("error"):
            return
        try:
            os.makedirs(self.folder or ".", exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(row, f)
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written only costs time


def _digest(texts: Sequence[str]) -> str:
    import hashlib

    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()


#: The suites evaluate() made lately (tokenizing a long prompt's haystack
#: to length takes a second or more an example; an agent or eval_table
#: asks for the same suite call after call), by everything they depend on.
_SUITES: Dict[str, Tuple[List[_tasks.Example], int]] = {}


def _suite(model: str, tasks: Sequence[str], lengths: Sequence[int], n: int,
           seed: int, haystack: str) -> Tuple[List[_tasks.Example], int]:
    """The examples (tokenized to length by the model's tokenizer) and the
    longest prompt's tokens, made once per model files and options."""
    from ._tokenizer import NoTokenizer, Tokenizer

    key = json.dumps([_model_stamp(model), list(tasks), list(lengths), n,
                      seed, haystack])
    if key in _SUITES:
        examples, longest = _SUITES[key]
        return list(examples), longest
    try:
        tok = Tokenizer.from_model(model)
    except NoTokenizer:
        raise ValueError(f"model: {model} has no tokenizer (tokenizer.json "
                         "or a GGUF vocabulary): the tasks are text") from None
    examples = _tasks.suite(tasks, lengths, lambda s: len(tok.encode(s)),
                            n=n, seed=seed, haystack=haystack)
    longest = max(len(tok.encode(ex.prompt)) for ex in examples)
    while len(_SUITES) >= 4:
        del _SUITES[next(iter(_SUITES))]
    _SUITES[key] = (examples, longest)
    return list(examples), longest


def _model_stamp(model: str) -> List[Any]:
    """What identifies a model's files: each file's path, size and mtime."""
    paths = [model] if os.path.isfile(model) else sorted(
        os.path.join(model, f) for f in os.listdir(model))
    out: List[Any] = []
    for p in paths:
        st = os.stat(p)
        out.append([os.path.abspath(p), st.st_size, int(st.st_mtime)])
    return out


def evaluate(model: str, flows: Sequence[str] = (), *,
             sweep: Optional[Mapping[str, Sequence[Any]]] = None,
             tasks: Sequence[str] = ("niah_single",),
             lengths: Sequence[int] = (1024,), n: int = 8, seed: int = 0,
             haystack: str = "noise", device: Optional[str] = None,
             dense_layers: int = 2, max_tokens: int = 32,
             baselines: bool = True, max_batch: int = 8,
             kv_dtype: Optional[str] = None,
             speed: Optional[bool] = None,
             dense_row: Optional[Row] = None,
             cache: Union[str, bool, None] = True,
             progress: Optional[Callable[[str], None]] = None,
             resolve: Optional[float] = None,
             baseline: Optional[str] = None) -> List[Row]:
    """Rows for dense attention, every flow x every combination of `sweep`,
    and (with `baselines`) the oracle and random selections at each
    swept `budget` (the stock programs oracle.vflow and random.vflow). Each
    row: accuracy and its standard error over the examples, `delta` (minus
    dense, paired) and its standard error, the mean blocks a (layer, KV
    head) list attended and their share of the context, per-task accuracy,
    the params, file, seeds and versions. With `speed` (default: on the
    GPU) each row also times decoding: `decode_tok_s` over pure decode
    steps of `max_batch` of the longest prompts, 64 tokens each.
    `dense_row`: the dense row of an earlier call with the same model and
    suite, reused instead of run again. `cache` (True: VFLOW_CACHE_DIR/eval
    or ~/.cache/vflow/eval; a folder; False: none) keeps the dense, oracle
    and random rows across calls (rows read from it have `cached`: true).
    `progress` receives a line as each row starts and ends (elapsed time
    and an estimate of what is left). `resolve` (an accuracy difference,
    e.g. 0.05): sequential stopping; each flow row runs its examples in
    chunks, (task, length) in turn, and stops once the 95% interval of its
    paired difference to dense excludes 0 ("stopped": "resolved") or lies
    within +-resolve ("within"), after 8 examples at least; its "scores"
    are None for the examples it did not run. `baseline`: a row's name
    (`quest[budget=64]`, `dense`, or a flow's name when one row has it):
    every other row gets "vs_baseline", its paired difference to that
    row's scores (mean, standard error, examples paired); that row runs
    every example, with or without `resolve`."""
    from . import __version__, _vflow

    config = check_options(model, tasks=tasks, lengths=lengths, n=n,
                           seed=seed, haystack=haystack, device=device,
                           dense_layers=dense_layers, max_tokens=max_tokens,
                           max_batch=max_batch, kv_dtype=kv_dtype)
    lengths = [int(x) for x in lengths]
    if sweep is not None:
        sweep = _check_sweep(sweep)
    flows = [_check.path("flows", f) for f in flows]
    on_gpu = (device or ("cuda" if _vflow.cuda_devices() > 0 else "cpu")
              ) == "cuda"
    if on_gpu and _vflow.cuda_devices() == 0:
        raise ValueError("device: 'cuda', but this machine has no CUDA "
                         "device (or this vflow was built without CUDA)")
    examples, longest = _suite(model, tasks, lengths, n, seed, haystack)
    context = int(config.get("maxPositions") or 0)
    if context and longest + max_tokens > context:
        raise ValueError(
            f"lengths: the longest prompt is {longest} tokens, and with "
            f"{max_tokens} answer tokens it is over the model's context of "
            f"{context} tokens; use shorter --lengths")
    setup = _Setup(model=model, device=device, dense_layers=dense_layers,
                   max_tokens=max_tokens, max_batch=max_batch,
                   kv_pool_tokens=max_batch * (longest + max_tokens + 64)
                   + 1024 + max_batch * 64, examples=examples,
                   kv_dtype=kv_dtype,
                   speed=on_gpu if speed is None else speed,
                   resolve=None if resolve is None else _check.finite(
                       "resolve", resolve, low=0.0))
    grid = _grid(sweep or {})
    head_dim = int(config["headDim"])
    scale = 1.0 / math.sqrt(head_dim)
    if dense_row is not None and len(dense_row.get("scores") or []) != len(
            examples):
        raise ValueError("dense_row: its scores do not match this suite "
                         f"({len(examples)} examples)")
    # Every row to run, in order: dense, each flow x sweep point, baselines.
    plan: List[Tuple[str, Optional[str], Dict[str, Any]]] = []
    if dense_row is None:
        plan.append(("dense", None, {}))
    for file in flows:
        # A flow's default scale is written for some other head dimension:
        # the model's 1/sqrt(head_dim), unless the sweep sets it.
        model_scale = {"scale": scale} if _declares_scale(file) else {}
        for params in grid:
            plan.append(("flow", file, dict(params) if "scale" in params
                         else {**params, **model_scale}))
    if baselines:
        budgets = sorted({p["budget"] for p in grid if "budget" in p}) or [64]
        for b in budgets:
            plan.append(("oracle", stock_program("oracle"),
                         dict(budget=b, scale=scale)))
            plan.append(("random", stock_program("random"),
                         dict(budget=b, seed=seed)))
    names = (["dense"] if dense_row is not None else []) + [
        _row_name(kind, path, params) for kind, path, params in plan]
    base = None if baseline is None else _find_row(names, baseline)
    folder = (_default_cache() if cache is True else
              None if cache in (False, None) else str(cache))
    rows_cache = _RowCache(folder, dict(
        model=_model_stamp(model), tasks=list(tasks), lengths=lengths, n=n,
        # The prompts themselves: a change in how a suite is made runs the
        # rows again.
        examples=_digest([ex.prompt for ex in examples]),
        seed=seed, haystack=haystack, device="cuda" if on_gpu else "cpu",
        dense_layers=dense_layers, max_tokens=max_tokens,
        max_batch=max_batch, speed=setup.speed, vflow=__version__,
        # (bf16, the default, keeps the keys rows had before kv_dtype)
        **({"kv_dtype": kv_dtype} if kv_dtype not in (None, "bf16")
           else {})))
    rows = [dict(dense_row)] if dense_row is not None else []
    start = time.time()
    for i, (kind, path, params) in enumerate(plan):
        name = _row_name(kind, path, params)
        row = rows_cache.get(kind, path, params)
        if row is None:
            if progress:
                progress(f"[{i + 1}/{len(plan)}] {name}: running "
                         f"{len(examples)} examples")
            # The baseline row runs every example (no sequential
            # stopping): every other row pairs against it.
            stops = bool(rows) and base != len(rows)
            row = _run_row(setup, kind, path, params,
                           dense=rows[0].get("scores") if stops else None)
            rows_cache.put(row, path)
        if progress:
            done = time.time() - start
            left = done / (i + 1) * (len(plan) - i - 1)
            result = (row.get("error") or
                      f"accuracy {row.get('accuracy', float('nan')):.3f}")
            progress(f"[{i + 1}/{len(plan)}] {name}: "
                     f"{'cached' if row.get('cached') else 'done'} "
                     f"({result}); {done:.0f} s so far, about {left:.0f} s "
                     "left")
        rows.append(row)
    dense = rows[0].get("scores")
    for i, row in enumerate(rows):
        if dense and row.get("scores") is not None:
            row["delta"], row["delta_stderr"], _, mean = _paired(
                row["scores"], dense)
            row["delta_interval"] = _paired_interval(row["scores"], dense)
            row["kept"] = row["accuracy"] / mean if mean else None
        if base is not None and i != base:
            theirs = rows[base].get("scores")
            row["vs_baseline"] = None
            if theirs and row.get("scores") is not None:
                delta, se, count, _ = _paired(row["scores"], theirs)
                row["vs_baseline"] = dict(baseline=names[base], delta=delta,
                                          delta_stderr=se, examples=count)
        row.update(model=model, tasks=list(tasks), lengths=list(lengths),
                   n=n, seeds=[seed, seed + n - 1], haystack=haystack,
                   dense_layers=dense_layers, max_tokens=max_tokens,
                   device=device, kv_dtype=kv_dtype or "bf16",
                   vflow=__version__)
    return rows


def _paired(scores: Sequence[Optional[float]],
            base: Sequence[Optional[float]]
            ) -> Tuple[float, float, int, float]:
    """The paired difference of `scores` to `base` over the examples both
    ran (all but a stopped row's): its mean and standard error, how many
    examples, and the mean of `base` over them."""
    pairs = [(a, b) for a, b in zip(scores, base)
             if a is not None and b is not None]
    delta, se = _mean_stderr([a - b for a, b in pairs])
    return delta, se, len(pairs), _mean_stderr([b for _, b in pairs])[0]


def _paired_interval(scores: Sequence[Optional[float]],
                     base: Sequence[Optional[float]]) -> List[float]:
    """_interval of the paired differences of `scores` to `base`."""
    return list(_interval([a - b for a, b in zip(scores, base)
                           if a is not None and b is not None]))


def _find_row(names: Sequence[str], wanted: str) -> int:
    """The index of the row named `wanted` (exactly, or the one row whose
    flow has that name); ValueError listing the names otherwise."""
    if wanted in names:
        return list(names).index(wanted)
    matches = [i for i, n in enumerate(names) if n.split("[")[0] == wanted]
    if len(matches) == 1:
        return matches[0]
    why = ("names several rows" if matches else "is not a row of this call")
    raise ValueError(f"baseline: {wanted!r} {why}; the rows are "
                     f"{', '.join(names)}")


def _row_name(kind: str, file: Optional[str],
              params: Mapping[str, Any]) -> str:
    name = kind if kind != "flow" or file is None else os.path.splitext(
        os.path.basename(file))[0]
    shown = ",".join(f"{k}={v}" for k, v in params.items() if k != "scale")
    return f"{name}[{shown}]" if shown else name


_PLOT_FILES = ("{}.png", "{}.svg", "{}-speed.png", "{}-speed.svg",
               "{}-recall.png", "{}-recall.svg")


def check_plot_prefix(prefix: str) -> None:
    """Refuses a pareto_plot prefix whose files cannot be written (a folder
    that does not exist, a name that is a folder or too long, no
    permission: each file is opened for writing, and removed again unless
    it was there) or a missing matplotlib: ValueError naming it, so that a
    caller can check before anything runs."""
    prefix = _check.path("--plot", prefix)
    folder, name = os.path.split(prefix)
    if not name:
        raise ValueError(f"--plot {prefix}: PREFIX ends in '/'; write a file "
                         "name prefix, e.g. plots/pareto")
    if not os.path.isdir(folder or "."):
        raise ValueError(f"--plot {prefix}: the folder {folder} does not "
                         "exist")
    for pattern in _PLOT_FILES:
        path = pattern.format(prefix)
        existed = os.path.lexists(path)
        if existed and not os.path.isfile(path):
            raise ValueError(f"--plot {prefix}: {path} exists and is not a "
                             "file")
        try:
            with open(path, "ab"):
                pass
        except OSError as e:
            raise ValueError(f"--plot {prefix}: cannot write {path}: "
                             f"{e.strerror or e}") from None
        if not existed:
            os.remove(path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib)"
                         ) from None


def pareto_plot(rows: Sequence[Row], prefix: str) -> List[str]:
    """Accuracy (with standard errors) against the attended share as
    PREFIX.png and PREFIX.svg, against decode tok/s as PREFIX-speed.png/.svg
    when the rows were timed, and the attention-mass recall against the
    attended share as PREFIX-recall.png/.svg when the rows measured it;
    returns the paths. Each flow has its colour and a line through its
    points (a sweep), dense, oracle and random their own markers, a legend
    names them. Needs matplotlib."""
    check_plot_prefix(prefix)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: List[str] = []
    for key, label, value, err, ylabel, suffix in (
            ("attended_share", "share of the context attended", "accuracy",
             "stderr", "accuracy (exact match)", ""),
            ("decode_tok_s", "decode tokens/s (batched)", "accuracy",
             "stderr", "accuracy (exact match)", "-speed"),
            ("attended_share", "share of the context attended",
             "mass_recall", "mass_recall_se",
             "attention-mass recall (sparse layers)", "-recall")):
        points = [r for r in rows if r.get(value) is not None
                  and r.get(key)]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        _plot_series(ax, points, key, value, err)
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        for ext in ("png", "svg"):
            path = f"{prefix}{suffix}.{ext}"
            fig.savefig(path)
            paths.append(path)
        plt.close(fig)
    return paths


_BASELINE_STYLE = {"dense": ("black", "*", 11), "oracle": ("tab:green", "D", 6),
                   "random": ("tab:red", "X", 7)}


def _plot_series(ax: Any, points: Sequence[Row], key: str, value: str,
                 err: str) -> None:
    """One series per flow (its rows sorted along x, joined by a line), the
    baselines by their markers; each point labelled with its params."""
    import matplotlib

    series: Dict[Tuple[str, str], List[Row]] = {}
    for row in points:
        series.setdefault((row["kind"], row["flow"]), []).append(row)
    cycle = matplotlib.colormaps["tab10"]
    flows = 0
    for (kind, flow), group in series.items():
        group = sorted(group, key=lambda r: r[key])
        style = _BASELINE_STYLE.get(kind)
        # tab10 without its green and red (the oracle's, random's).
        color: Any = style[0] if style else cycle(
            (0, 1, 4, 5, 6, 8, 9, 7)[flows % 8])
        marker, size = (style[1], style[2]) if style else ("o", 5)
        flows += 0 if style else 1
        xs = [r[key] for r in group]
        ys = [r[value] for r in group]
        ax.errorbar(xs, ys, yerr=[r.get(err) or 0 for r in group],
                    fmt=marker + ("-" if len(group) > 1 else ""),
                    color=color, markersize=size, capsize=3, linewidth=1,
                    label=flow)
        for i, r in enumerate(group):
            text = ",".join(f"{k}={v}" for k, v in r["params"].items()
                            if k != "scale")
            if text:
                ax.annotate(text, (r[key], r[value]), fontsize=6,
                            color=color, xytext=(4, 4 if i % 2 else -9),
                            textcoords="offset points")
