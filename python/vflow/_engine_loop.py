"""The serving engine on a thread of its own, for vflow serve.

One EngineLoop per served flow owns a vflow.LLM: only its thread calls the
engine (add_request, step, generated_since, abort, stats). Other threads
(the HTTP server's event loop) hand it commands through a queue and get
each request's tokens back as events on their own asyncio loop, so the
HTTP side never blocks the engine and never touches it.

    loop = EngineLoop(llm, "quest")
    loop.start()
    req = loop.submit(prompt_ids, sampling_params)   # from the event loop
    async for kind, payload in req.events(): ...    # "tokens", then "done"
    loop.abort(req)                                  # a client that left
    loop.stop()
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple

Event = Tuple[str, Any]


class EngineRequest:
    """One engine request as the HTTP side sees it: its events arrive on
    the asyncio loop that submitted it ("tokens" with new ids, then "done"
    with (the last ids, finish_reason, error) or "error" with a message)."""

    def __init__(self, prompt: Sequence[int], params: Any) -> None:
        self.prompt = list(prompt)
        self.params = params
        self.loop = asyncio.get_running_loop()
        self.queue: "asyncio.Queue[Event]" = asyncio.Queue()
        self.request_id: Optional[int] = None  # set by the engine thread
        self.seen = 0  # tokens posted so far (engine thread)
        self.finished = False  # "done" or "error" posted (engine thread)
        self.arrival = time.monotonic()

    def post(self, kind: str, payload: Any) -> None:
        """From the engine thread: queue an event on the request's loop."""
        if kind != "tokens":
            self.finished = True
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait,
                                           (kind, payload))
        except RuntimeError:  # its event loop is closed: nobody listens
            pass

    async def events(self) -> AsyncIterator[Event]:
        """Events until the request ends."""
        while True:
            kind, payload = await self.queue.get()
            yield kind, payload
            if kind != "tokens":
                return


class EngineLoop(threading.Thread):
    """Runs `llm` step by step while it has work; `name` names the flow it
    serves. stats() is the engine's stats after the last step (a copy:
    safe from any thread)."""

    def __init__(self, llm: Any, name: str) -> None:
        super().__init__(name=f"vflow-engine-{name}", daemon=True)
        self.llm = llm
        self.flow = name
        self.commands: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        self.live: Dict[int, EngineRequest] = {}
        self.queued = 0  # submitted, not yet taken by the engine thread
        self._count = threading.Lock()  # guards `queued`
        self._stats: Dict[str, Any] = dict(llm.stats())
        self._stats_time = time.monotonic()
        self._stale = False  # steps ran since _stats was read
        self._stopping = threading.Event()
        self.failure: Optional[str] = None

    # -- from any thread ------------------------------------------------------

    def submit(self, prompt: Sequence[int], params: Any) -> EngineRequest:
        req = EngineRequest(prompt, params)
        with self._count:
            self.queued += 1
        self.commands.put(("add", req))
        return req

    def abort(self, req: EngineRequest) -> None:
        if not req.finished:
            self.commands.put(("abort", req))

    def stats(self) -> Dict[str, Any]:
        return dict(self._stats)

    def waiting(self) -> int:
        """Requests waiting for the engine (its queue and not yet taken)."""
        return int(self._stats.get("waiting", 0)) + self.queued

    def stop(self, timeout: float = 10.0) -> None:
        """Aborts every request and ends the thread."""
        self._stopping.set()
        self.commands.put(("stop", None))
        self.join(timeout)

    # -- the engine thread ----------------------------------------------------

    def run(self) -> None:
        while not self._stopping.is_set():
            busy = self.llm.has_unfinished_requests()
            if not busy:
                self._refresh(force=True)  # what the last steps left
            self._drain(block=not busy)
            if self._stopping.is_set():
                break
            if self.llm.has_unfinished_requests():
                self._step()
        self._abort_all("the server is shutting down")

    def _drain(self, block: bool) -> None:
        try:
            command = self.commands.get(timeout=0.1) if block else \
                self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*command)
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                break
        self._refresh(force=True)  # aborts freed pages

    def _apply(self, kind: str, req: Any) -> None:
        self._stale = True
        if kind == "add":
            with self._count:
                self.queued -= 1
            try:
                rid = self.llm.add_request(req.prompt, req.params)
            except (ValueError, TypeError, RuntimeError) as e:
                req.post("error", str(e))
                return
            req.request_id = rid
            self.live[rid] = req
        elif kind == "abort" and req.request_id in self.live:
            out = self.llm.abort(req.request_id)
            if out is not None:
                self._finish(out)
            self.live.pop(req.request_id, None)

    def _step(self) -> None:
        try:
            outs = self.llm.step()
        except Exception as e:  # the engine failed: every request ends
            self.failure = f"the engine failed: {e}"
            self._abort_all(self.failure)
            return
        for rid, req in list(self.live.items()):
            more = self.llm.generated_since(rid, req.seen)
            if more and more[0]:
                req.seen += len(more[0])
                req.post("tokens", more)
        for out in outs:
            self._finish(out)
        self._refresh()

    def _refresh(self, force: bool = False) -> None:
        """The stats /metrics reads: after each step at most every 50 ms
        (reading them waits for the device), and whenever the engine goes
        idle."""
        now = time.monotonic()
        if force and not self._stale:
            return
        self._stale = True
        if force or now - self._stats_time >= 0.05:
            self._stats = dict(self.llm.stats())
            self._stats_time, self._stale = now, False

    def _finish(self, out: Any) -> None:
        req = self.live.pop(out.request_id, None)
        if req is None or req.finished:
            return
        tail: List[int] = list(out.token_ids[req.seen:])
        logprobs = list((out.logprobs or [])[req.seen:])
        req.seen = len(out.token_ids)
        req.post("done", ((tail, logprobs), out.finish_reason, out.error,
                          (out.blocks_attended, out.blocks_available)))

    def _abort_all(self, why: str) -> None:
        for rid, req in list(self.live.items()):
            try:
                self.llm.abort(rid)
            except Exception:  # the engine is broken; the client hears why
                pass
            req.post("error", why)
        self.live.clear()
        while True:
            try:
                kind, req = self.commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                req.post("error", why)
