"""vflow serve: an OpenAI-compatible HTTP server on the serving engine.

FastAPI on uvicorn (as vLLM's server): the HTTP side is asyncio; each served
flow's engine runs on its own thread (EngineLoop) and is touched by nothing
else. Endpoints: GET /v1/models, POST /v1/completions and
/v1/chat/completions (streamed as server-sent events or not), GET /health,
GET /metrics (Prometheus text). docs/serving.md describes every field.

    app = build_app(ServeOptions(model="m/", flows=["quest.vflow"]))
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple

from ._engine_loop import EngineLoop, EngineRequest
from ._serve_protocol import (ApiError, ChatRequest, CompletionRequest,
                              Sampling, error_body)
from ._serve_metrics import Metrics

@dataclass
class ServeOptions:
    """What vflow serve was started with: the model, the flows (paths; none:
    dense), their params, vflow.LLM's options, the model name clients use,
    and the waiting-queue limit past which requests get 503."""

    model: str
    # (path or None for dense, that flow's own params); -p's params are
    # under every flow's own.
    flows: List[Tuple[Optional[str], Dict[str, Any]]] = field(
        default_factory=list)
    params: Dict[str, Any] = field(default_factory=dict)
    llm_options: Dict[str, Any] = field(default_factory=dict)
    served_model_name: Optional[str] = None
    max_waiting: int = 1024


class Choice:
    """One sample's text as it streams: token ids in, text deltas out; stop
    strings matched across token boundaries (left out of the text), stop
    token ids end it (left out too)."""

    def __init__(self, index: int, tokenizer: Any, stop: Sequence[str],
                 stop_ids: Sequence[int]) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.stop_ids = set(stop_ids)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: List[int] = []
        self.text = ""
        self.sent = 0
        # Incremental decoding: the text of ids[:read] is in self.text;
        # ids[prefix:read] is the context the next window decodes with.
        self.prefix = self.read = 0
        # The kept tokens' log-probabilities (when asked), and how many of
        # them a chunk has carried.
        self.logprobs: List[Any] = []
        self.logprobs_sent = 0
        # Blocks its decodes attended and the blocks available then.
        self.blocks = (0, 0)
        self.finish: Optional[str] = None

    def add(self, tokens: Sequence[int], final: bool = False,
            logprobs: Sequence[Any] = ()) -> str:
        """Takes new tokens (and their log-probabilities); returns the text
        that may be sent now."""
        if self.finish is None:
            for i, t in enumerate(tokens):
                if t in self.stop_ids:
                    self.finish = "stop"
                    break
                self.ids.append(int(t))
                if i < len(logprobs):
                    self.logprobs.append(logprobs[i])
            self._decode(final or self.finish is not None)
        done = final or self.finish is not None
        end = len(self.text)
        if not done:
            end -= self.hold
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1  # a character whose bytes are not all here yet
        delta = self.text[self.sent:max(self.sent, end)]
        self.sent += len(delta)
        return delta

    def take_logprobs(self) -> List[Tuple[int, Any]]:
        """(token id, its log-probabilities) of the tokens no chunk has
        carried yet."""
        start, self.logprobs_sent = self.logprobs_sent, len(self.logprobs)
        return list(zip(self.ids[start:], self.logprobs[start:]))

    def _decode(self, final: bool) -> None:
        """Appends the text of the new ids, as vLLM's detokenizer does: the
        window ids[prefix:] decoded, less the text of ids[prefix:read]
        (the context keeps spaces and merges right); a window that ends in
        an incomplete character waits for more ids. Each token is decoded
        a bounded number of times, not once per later token."""
        if self.tokenizer is None or self.read == len(self.ids):
            return
        window = self.tokenizer.decode(self.ids[self.prefix:])
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        if len(window) <= len(before) or (window.endswith("\ufffd")
                                          and not final):
            return
        start = max(0, len(self.text) - self.hold)
        self.text += window[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        cut = min((p for p in (self.text.find(s, start) for s in self.stop)
                   if p >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.finish = "stop"


def _same(value: Any, wanted: Any) -> bool:
    """A served param's value equals a requested one (numbers by value)."""
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return bool(value == wanted)


def _finish_reason(engine_reason: str) -> str:
    return "length" if engine_reason == "length" else "stop"


class Server:
    """The engines (one EngineLoop per flow), the tokenizer, the metrics."""

    def __init__(self, options: ServeOptions) -> None:
        import vflow

        self.options = options
        self.model_name = options.served_model_name or os.path.basename(
            os.path.normpath(options.model))
        self.loops: Dict[str, EngineLoop] = {}
        # Each engine: its flow's name and param values, and its label (the
        # name, or name[k=v,...] with its own params).
        self.engines: Dict[str, Tuple[str, Dict[str, Any]]] = {}
        for path, own in options.flows or [(None, {})]:
            params = dict(options.params, **own) if path else None
            llm = vflow.LLM(options.model, flow=path, params=params,
                            **options.llm_options)
            name = llm.program.flows[0] if llm.program else "dense"
            label = name + ("[" + ",".join(f"{k}={v}" for k, v in
                                           own.items()) + "]" if own else "")
            if label in self.loops:
                raise ValueError(f"--flow {path}: {label} is served already")
            values = {k: v[1] for k, v in
                      llm.program.param_defaults().items()} if llm.program \
                else {}
            self.engines[label] = (name, values)
            self.loops[label] = EngineLoop(llm, label)
        first = next(iter(self.loops.values()))
        self.default_flow = first.flow
        self.tokenizer = first.llm.tokenizer
        if self.tokenizer is None:
            raise ValueError(
                f"model: {options.model} has no tokenizer (tokenizer.json, or "
                "a GGUF's vocabulary): the OpenAI API answers in text")
        config = json.loads(first.llm._engine.model_config())
        self.context = int(config.get("maxPositions") or 0)
        self.vocab = int(config.get("vocabSize") or 0)
        self.metrics = Metrics(self)
        self.created = int(time.time())

    def start(self) -> None:
        for loop in self.loops.values():
            loop.start()

    def stop(self) -> None:
        for loop in self.loops.values():
            loop.stop()

    # -- requests -------------------------------------------------------------

    def engine_for(self, req: Any) -> EngineLoop:
        if req.model is not None and req.model != self.model_name:
            raise ApiError(404, f"the model {req.model!r} does not exist "
                           f"(this server serves {self.model_name!r})",
                           "model", "model_not_found")
        loop = self._engine_named(req.vflow)
        if loop.waiting() >= self.options.max_waiting:
            raise ApiError(503, f"{loop.waiting()} requests are waiting "
                           f"(--max-waiting {self.options.max_waiting}); "
                           "retry later", None, "overloaded")
        return loop

    def _engine_named(self, vflow: Any) -> EngineLoop:
        """The engine a request's "vflow" field names: its label, or a flow
        name whose engine's params hold every given value (the first such;
        none given: the first engine)."""
        if vflow is None or (vflow.flow is None and not vflow.params):
            return self.loops[self.default_flow]
        flow = vflow.flow
        wanted = dict(vflow.params or {})
        for label, (name, values) in self.engines.items():
            if flow not in (None, label, name):
                continue
            if all(k in values and _same(values[k], v)
                   for k, v in wanted.items()):
                return self.loops[label]
        what = f"the flow {flow!r}" if flow else "a flow"
        if wanted:
            what += " with " + ", ".join(f"{k}={v}" for k, v in wanted.items())
        raise ApiError(404, f"{what} is not served (served: "
                       f"{', '.join(self.loops)}); start the server with "
                       "--flow PATH:NAME=VALUE for it", "vflow",
                       "flow_not_found")

    def prompt_ids(self, prompt: Any, what: str,
                   special: bool = True) -> List[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt,
                                              add_special_tokens=special))
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ApiError(400, f"{what}: token id {bad[0]} is outside the "
                           f"vocabulary ({self.vocab} ids)", what)
        return ids

    def check_length(self, ids: Sequence[int], max_tokens: int) -> None:
        if not ids:
            raise ApiError(400, "prompt: empty", "prompt")
        if self.context and len(ids) + max_tokens > self.context:
            raise ApiError(400, f"this model's context is {self.context} "
                           f"tokens; the prompt has {len(ids)} and "
                           f"max_tokens asks for {max_tokens} more",
                           "max_tokens" if len(ids) < self.context
                           else "prompt", "context_length_exceeded")

    def chat_prompt(self, req: ChatRequest) -> List[int]:
        if self.tokenizer.chat_template is None:
            raise ApiError(400, "messages: this model has no chat template; "
                           "use /v1/completions", "messages")
        messages = [m.rendered() for m in req.messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True)
        except ValueError as e:
            raise ApiError(400, f"messages: {e}", "messages") from None
        return self.prompt_ids(text, "messages", special=False)

    # -- generation -----------------------------------------------------------

    async def run_choices(self, loop: EngineLoop, prompts: List[List[int]],
                          sampling: Sampling, n: int,
                          http: Any) -> AsyncIterator[Tuple[Choice, str]]:
        """Runs n samples of every prompt, all at once; yields (choice,
        text delta) as tokens arrive (choice.index = prompt * n + sample),
        a choice's last delta with choice.finish set. A prompt's other
        samples start once its first has the prompt computed (its first
        event), so that they share its blocks through the engine's prefix
        cache. Aborts what still runs when the client goes away or the
        caller stops."""
        choices = [Choice(k, self.tokenizer, sampling.stop,
                          sampling.stop_token_ids)
                   for k in range(len(prompts) * n)]
        merged: "asyncio.Queue[Tuple[int, str, Any]]" = asyncio.Queue()
        reqs: Dict[int, EngineRequest] = {}
        tasks: List["asyncio.Task[None]"] = []

        async def pump(k: int, req: EngineRequest) -> None:
            async for kind, payload in req.events():
                await merged.put((k, kind, payload))

        def start(k: int) -> None:
            reqs[k] = loop.submit(prompts[k // n], sampling.params(k % n))
            tasks.append(asyncio.create_task(pump(k, reqs[k])))

        def first_event(k: int) -> None:
            if k % n == 0 and k + 1 not in reqs:
                for other in range(k + 1, k + n):
                    start(other)

        for p in range(len(prompts)):
            start(p * n)
        try:
            async for item in self._merge(merged, choices, reqs, loop, http,
                                          first_event):
                yield item
        finally:
            for t in tasks:
                t.cancel()
            for r in reqs.values():
                loop.abort(r)

    async def _merge(self, merged: "asyncio.Queue[Tuple[int, str, Any]]",
                     choices: List[Choice], reqs: Dict[int, EngineRequest],
                     loop: EngineLoop, http: Any,
                     first_event: Any) -> AsyncIterator[Tuple[Choice, str]]:
        # Each choice's engine request ends with one "done" (or "error"):
        # the loop runs until all have, so that usage counts every one;
        # a choice whose text ended earlier (a stop) is yielded then.
        pending = set(range(len(choices)))
        closed = set()
        while pending:
            try:
                i, kind, payload = await asyncio.wait_for(merged.get(), 1.0)
            except asyncio.TimeoutError:
                if http is not None and await http.is_disconnected():
                    return
                continue
            first_event(i)  # the prompt is in: its other samples share it
            c = choices[i]
            if kind == "error":
                raise ApiError(_error_status(payload), payload, None,
                               "engine_error")
            self.metrics.on_tokens(reqs[i], payload, kind, loop.flow)
            if kind == "tokens":
                if i in closed:
                    continue
                delta = c.add(payload[0], logprobs=payload[1])
                if c.finish is not None:
                    loop.abort(reqs[i])
            else:
                pending.discard(i)
                (tail, logprobs), reason, error, c.blocks = payload
                if reason == "error":
                    raise ApiError(_error_status(error), error, None,
                                   "engine_error")
                if i in closed:
                    continue
                delta = c.add(tail, final=True, logprobs=logprobs)
                if c.finish is None:
                    c.finish = _finish_reason(reason)
            if c.finish is not None:
                closed.add(i)
            yield c, delta


def _error_status(message: str) -> int:
    """An engine error a request caused (too long for the pool, a bad
    budget at its length) is the client's; the rest are the server's."""
    client = ("can never run", "context", "budget", "out of the vocabulary",
              "outside the vocabulary")
    return 400 if any(w in message for w in client) else 500


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _usage(prompt: int, completion: int,
           choices: Sequence[Choice]) -> Dict[str, int]:
    """OpenAI's usage, with vflow's blocks attended and available (summed
    over the choices' decodes, layers and KV heads)."""
    return dict(prompt_tokens=prompt, completion_tokens=completion,
                total_tokens=prompt + completion,
                blocks_attended=sum(c.blocks[0] for c in choices),
                blocks_available=sum(c.blocks[1] for c in choices))


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def build_app(options: ServeOptions, server: Optional[Server] = None) -> Any:
    """The FastAPI application (the engines start with it and stop when it
    shuts down)."""
    from ._serve_routes import make_app

    return make_app(server or Server(options))
