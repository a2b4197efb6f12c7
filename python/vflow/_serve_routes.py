"""vflow serve's HTTP routes (FastAPI): OpenAI's response and chunk shapes,
errors as OpenAI-style JSON with their status."""

from __future__ import annotations

import contextlib
import time
from typing import Any, AsyncIterator, Dict, List, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ._serve import (Choice, Server, _id, _sse, _usage)
from ._serve_protocol import (ApiError, ChatRequest, CompletionRequest,
                              Sampling, error_body)


def _json_error(status: int, message: str, param: Optional[str] = None,
                code: Optional[str] = None) -> Any:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(status, message, param, code),
                        status_code=status, headers=headers)


def _field(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def make_app(server: Server) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        server.start()
        yield
        server.stop()

    app = FastAPI(title="vflow serve", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Any:
        return _json_error(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def bad_fields(request: Request, e: RequestValidationError) -> Any:
        first = e.errors()[0] if e.errors() else {}
        name = _field(first.get("loc", ()))
        return _json_error(400, f"{name}: {first.get('msg', 'invalid')}",
                           name)

    @app.get("/health")
    async def health() -> Any:
        broken = [l.failure for l in server.loops.values() if l.failure]
        if broken:
            return _json_error(500, broken[0])
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{
            "id": server.model_name, "object": "model",
            "created": server.created, "owned_by": "vflow",
            "max_model_len": server.context,
            "vflow_flows": list(server.loops)}]}

    @app.get("/metrics")
    async def metrics() -> Any:
        return Response(server.metrics.text(),
                        media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await _complete(server, body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        return await _complete(server, body, request, chat=True)

    return app


async def _complete(server: Server, body: Any, http: Any, chat: bool) -> Any:
    body.check_unsupported()
    loop = server.engine_for(body)
    max_tokens = (body.max_completion_tokens or body.max_tokens) if chat \
        else body.max_tokens
    if chat:
        prompts = [server.chat_prompt(body)]
    else:
        prompts = [server.prompt_ids(p, "prompt") for p in body.prompts()]
    if max_tokens is None:  # as much as the context leaves (OpenAI's chat)
        max_tokens = max(1, server.context - max(len(p) for p in prompts)) \
            if chat else 16
    for ids in prompts:
        server.check_length(ids, max_tokens)
    sampling = Sampling(body, max_tokens)
    for ids in prompts:
        server.metrics.on_admit(loop.flow, len(ids) * body.n)
    shape = _Shape(server, body, chat)
    if body.stream:
        return StreamingResponse(
            _stream(server, loop, prompts, sampling, body, shape, http),
            media_type="text/event-stream")
    return await _whole(server, loop, prompts, sampling, body, shape, http)


class _Shape:
    """The response objects of one endpoint."""

    def __init__(self, server: Server, body: Any, chat: bool) -> None:
        self.chat = chat
        self.id = _id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.model = server.model_name
        self.n = body.n
        self.tokenizer = server.tokenizer
        self.logprobs_asked = body.top_logprobs_asked() is not None

    def envelope(self, chunk: bool) -> Dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion")
        if chunk and self.chat:
            kind = "chat.completion.chunk"
        return {"id": self.id, "object": kind, "created": self.created,
                "model": self.model}

    def _token(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def logprobs(self, entries: List[Any], offset: int) -> Any:
        """OpenAI's logprobs object of (token id, (log-probability, top
        [(id, log-probability)])) entries: chat's `content` list, or the
        completions' parallel lists (text offsets from `offset`)."""
        if not self.logprobs_asked:
            return None
        if self.chat:
            def item(t: int, lp: float) -> Dict[str, Any]:
                s = self._token(t)
                return {"token": s, "logprob": lp,
                        "bytes": list(s.encode("utf-8"))}
            return {"content": [dict(item(t, lp), top_logprobs=[
                item(i, l) for i, l in top]) for t, (lp, top) in entries]}
        tokens = [self._token(t) for t, _ in entries]
        offsets = []
        for s in tokens:
            offsets.append(offset)
            offset += len(s)
        return {"tokens": tokens,
                "token_logprobs": [lp for _, (lp, _) in entries],
                "top_logprobs": [{self._token(i): l for i, l in top}
                                 for _, (_, top) in entries],
                "text_offset": offsets}

    def choice(self, index: int, text: str, finish: Optional[str],
               chunk: bool, first: bool = False,
               logprobs: Any = None) -> Dict[str, Any]:
        c: Dict[str, Any] = {"index": index}
        if not self.chat:
            c["text"] = text
        elif chunk:
            c["delta"] = ({"role": "assistant", "content": text} if first
                          else ({"content": text} if text else {}))
        else:
            c["message"] = {"role": "assistant", "content": text}
        c["logprobs"] = logprobs
        c["finish_reason"] = finish
        return c


async def _whole(server: Server, loop: Any, prompts: List[List[int]],
                 sampling: Sampling, body: Any, shape: _Shape,
                 http: Any) -> Any:
    texts: Dict[int, List[str]] = {}
    done: Dict[int, Choice] = {}
    async for c, delta in server.run_choices(loop, prompts, sampling, body.n,
                                             http):
        texts.setdefault(c.index, []).append(delta)
        if c.finish is not None:
            done[c.index] = c
    if len(done) < len(prompts) * body.n:  # the client went away
        return _json_error(499, "the client closed the connection")
    choices = [shape.choice(k, "".join(texts[k]), done[k].finish, chunk=False,
                            logprobs=shape.logprobs(done[k].take_logprobs(),
                                                    0))
               for k in sorted(done)]
    completion = sum(len(c.ids) for c in done.values())
    prompt_tokens = sum(len(ids) for ids in prompts) * body.n
    return dict(shape.envelope(chunk=False), choices=choices,
                usage=_usage(prompt_tokens, completion, list(done.values())))


async def _stream(server: Server, loop: Any, prompts: List[List[int]],
                  sampling: Sampling, body: Any, shape: _Shape,
                  http: Any) -> AsyncIterator[str]:
    include_usage = bool(body.stream_options and
                         body.stream_options.include_usage)
    started = set()
    done: Dict[int, Choice] = {}
    try:
        async for c, delta in server.run_choices(loop, prompts, sampling,
                                                 body.n, http):
            first = shape.chat and c.index not in started
            started.add(c.index)
            if not delta and c.finish is None and not first:
                continue
            logprobs = shape.logprobs(c.take_logprobs(), c.sent - len(delta))
            chunk = dict(shape.envelope(chunk=True), choices=[
                shape.choice(c.index, delta, c.finish, True, first,
                             logprobs)])
            if include_usage:
                chunk["usage"] = None
            yield _sse(chunk)
            if c.finish is not None:
                done[c.index] = c
    except ApiError as e:
        yield _sse(error_body(e.status, e.message, e.param, e.code))
        yield "data: [DONE]\n\n"
        return
    if include_usage:
        prompt_tokens = sum(len(ids) for ids in prompts) * body.n
        completion = sum(len(c.ids) for c in done.values())
        yield _sse(dict(shape.envelope(chunk=True), choices=[],
                        usage=_usage(prompt_tokens, completion,
                                     list(done.values()))))
    yield "data: [DONE]\n\n"
