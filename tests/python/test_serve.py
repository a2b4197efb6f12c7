"""vflow serve as users meet it: a real `vflow serve` process on 127.0.0.1
(a tiny random Llama with a word tokenizer and a chat template, on the CPU,
or on CUDA with VFLOW_TEST_DEVICES=cuda),
driven by the official `openai` client and by raw HTTP: completions and
chat, streamed and not, n, stop strings and stop token ids, usage, greedy
text equal to vflow.LLM.generate's, 32 concurrent streams, a client that
disconnects, bad requests (4xx JSON, the server keeps serving), 503 past
--max-waiting, and a clean exit on SIGINT and SIGTERM."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from tiny_model import write_model, write_tokenizer

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
vflow = pytest.importorskip("vflow")

# The device the servers run on: the first of VFLOW_TEST_DEVICES (the GPU
# harness, tools/gpu.sh, sets cuda), else the CPU.
DEVICE = os.environ.get("VFLOW_TEST_DEVICES", "cpu").split(",")[0]
# A tiny Llama both devices run (head_dim 64: the GPU kernels' smallest).
SHAPE: Dict[str, Any] = dict(arch="llama", vocab=64, hidden=128, heads=2,
                             kv_heads=1, head_dim=64, layers=2)

# The chat template: each message's content, then "w9" to prompt an answer.
TEMPLATE = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}w9{% endif %}")
PROMPT = "w5 w17 w20 w33"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("serve-model")
    write_model(d, seed=3, **SHAPE)
    write_tokenizer(d, vocab=64)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A `vflow serve` process and its base URL."""

    def __init__(self, model: pathlib.Path, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vflow.cli", "serve", str(model),
             "--device", DEVICE, "--port", str(self.port),
             "--log-level", "warning", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vflow serve exited: {self.proc.stdout.read()}")
            try:
                if get(self.url + "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("vflow serve did not start in 60 s")

    def client(self) -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none",
                             max_retries=0, timeout=60)

    def stop(self, sig: int = signal.SIGINT) -> Tuple[int, str]:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=30)
        return self.proc.returncode, out


def get(url: str) -> Tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url: str, body: Any) -> Tuple[int, Dict[str, Any], Dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), _lower(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), _lower(e.headers)


def _lower(headers: Any) -> Dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def metric(url: str, name: str, flow: str = "dense") -> float:
    text = get(url + "/metrics")[1]
    m = re.search(rf'^{name}{{flow="{flow}"}} (\S+)$', text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def wait_idle(url: str) -> None:
    """Until the engine runs nothing and holds no page."""
    deadline = time.time() + 30
    while time.time() < deadline:
        if (metric(url, "vflow_requests_running") == 0
                and metric(url, "vflow_kv_pages_used") == 0):
            return
        time.sleep(0.1)
    raise AssertionError("requests or pages left after 30 s")


@pytest.fixture(scope="module")
def server(model_dir: pathlib.Path) -> Iterator[Served]:
    s = Served(model_dir, "--no-enable-prefix-caching", "--max-batch", "64")
    yield s
    code, out = s.stop()
    assert code == 0, out


@pytest.fixture(scope="module")
def greedy(model_dir: pathlib.Path) -> Any:
    """vflow.LLM.generate's greedy text of a prompt (the reference)."""
    llm = vflow.LLM(str(model_dir), device=DEVICE)

    def run(prompt: Any, n: int) -> str:
        out = llm.generate([prompt], vflow.SamplingParams(max_tokens=n))
        return out[0].text

    return run


def test_models(server: Served) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [pathlib.Path(
        server.proc.args[4]).name]


def test_completion_equals_generate(server: Served, greedy: Any) -> None:
    c = server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=12, temperature=0)
    assert c.choices[0].text == greedy(PROMPT, 12)
    assert c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens == 5  # BOS and four words
    assert c.usage.completion_tokens == 12
    assert c.usage.total_tokens == 17
    # vflow's usage: blocks the decodes attended (all of them: dense).
    extra = c.usage.model_extra or {}
    assert 0 < extra["blocks_attended"] == extra["blocks_available"]


def test_streamed_completion_equals_whole(server: Served, greedy: Any) -> None:
    stream = server.client().completions.create(
        prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, model=None)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == greedy(PROMPT, 12)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        "length"
    assert chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_whole_and_streamed(server: Served, greedy: Any) -> None:
    messages = [{"role": "user", "content": "w5 w6"}]
    # The template renders "w5 w6 w9" (no BOS: the template writes its own).
    want = greedy([5, 6, 9], 8)
    c = server.client().chat.completions.create(
        model=None, messages=messages, max_tokens=8, temperature=0)
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == want
    assert c.usage.prompt_tokens == 3
    stream = server.client().chat.completions.create(
        model=None, messages=messages, max_tokens=8, temperature=0,
        stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_samples(server: Served) -> None:
    c = server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=6, temperature=0, n=2)
    assert [ch.index for ch in c.choices] == [0, 1]
    assert c.choices[0].text == c.choices[1].text
    assert c.usage.completion_tokens == 12
    # Sampled with a seed: reproducible, and the samples differ (their own
    # streams).
    runs = [server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=8, temperature=1.5, n=2,
        seed=11) for _ in range(2)]
    assert [x.text for x in runs[0].choices] == \
        [x.text for x in runs[1].choices]
    assert runs[0].choices[0].text != runs[0].choices[1].text


def test_several_prompts_run_together(server: Served, greedy: Any) -> None:
    """A list of prompts: choice p * n + i is sample i of prompt p, all run
    at once, streamed or not."""
    prompts = [PROMPT, "w7 w8", "w40 w41 w42"]
    want = [greedy(p, 5) for p in prompts]
    c = server.client().completions.create(
        model=None, prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [ch.index for ch in c.choices] == list(range(6))
    assert [ch.text for ch in c.choices] == [w for w in want for _ in "ab"]
    assert c.usage.completion_tokens == 30
    stream = server.client().completions.create(
        model=None, prompt=prompts, max_tokens=5, temperature=0, n=2,
        stream=True)
    texts: Dict[int, str] = {}
    for ch in stream:
        texts[ch.choices[0].index] = texts.get(ch.choices[0].index, "") + \
            ch.choices[0].text
    assert [texts[k] for k in range(6)] == [w for w in want for _ in "ab"]


def test_stop_strings_and_token_ids(server: Served, greedy: Any) -> None:
    full = greedy(PROMPT, 16)
    words = full.split(" ")
    # A stop string across a token boundary: the end of one word, a space,
    # the start of the next.
    stop = words[3][1:] + " " + words[4][:2]
    want = full[:full.find(stop)]
    for stream in (False, True):
        c = server.client().completions.create(
            model=None, prompt=PROMPT, max_tokens=16, temperature=0,
            stop=[stop, "never"], stream=stream)
        if stream:
            chunks = list(c)
            text = "".join(ch.choices[0].text for ch in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            text, reason = c.choices[0].text, c.choices[0].finish_reason
        assert (text, reason) == (want, "stop"), stream
    # Two samples, each stopped early: both end (and their usage counts).
    c = server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=16, temperature=0, n=2,
        stop=[stop], stream_options=None)
    assert [(x.text, x.finish_reason) for x in c.choices] == \
        [(want, "stop")] * 2
    assert (c.usage.model_extra or {})["blocks_attended"] > 0
    stop_id = int(words[2][1:])  # "w38" is id 38
    c = server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=16, temperature=0,
        extra_body={"stop_token_ids": [stop_id]})
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].text == " ".join(words[:words.index(words[2])])


def test_logprobs(server: Served, model_dir: pathlib.Path) -> None:
    """Completions' logprobs (token strings, their log-probabilities, the
    top ones, offsets) and chat's (content entries) carry what
    vflow.LLM.generate reports, streamed or not."""
    llm = vflow.LLM(str(model_dir), device=DEVICE)
    ref = llm.generate([PROMPT], vflow.SamplingParams(max_tokens=6,
                                                      logprobs=2))[0]
    assert len(ref.logprobs) == 6
    words = [llm.tokenizer.decode([t]) for t in ref.token_ids]
    c = server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert lp.tokens == words
    assert lp.token_logprobs == pytest.approx([x[0] for x in ref.logprobs],
                                              abs=1e-6)
    for top, (_, want) in zip(lp.top_logprobs, ref.logprobs):
        assert list(top) == [llm.tokenizer.decode([i]) for i, _ in want]
        assert list(top.values()) == pytest.approx([l for _, l in want],
                                                   abs=1e-6)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    stream = server.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2,
        stream=True)
    streamed = [t for ch in stream for t in ch.choices[0].logprobs.tokens]
    assert streamed == words
    chat = server.client().chat.completions.create(
        model=None, messages=[{"role": "user", "content": "w5 w6"}],
        max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in content)
    assert all(e.top_logprobs[0].token == e.token for e in content)  # greedy
    assert "".join(e.token for e in content).replace(" ", "") == \
        chat.choices[0].message.content.replace(" ", "")


def test_concurrent_streams_then_no_pages(server: Served,
                                          greedy: Any) -> None:
    want = greedy(PROMPT, 10)

    def one(i: int) -> str:
        stream = server.client().completions.create(
            model=None, prompt=PROMPT, max_tokens=10, temperature=0,
            stream=True)
        return "".join(c.choices[0].text for c in stream)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(one, range(32)))
    assert texts == [want] * 32
    wait_idle(server.url)


def test_disconnect_frees_pages(server: Served) -> None:
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3000,
                       "temperature": 0, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data: " not in received:  # the headers, then a chunk
            more = s.recv(4096)
            assert more, received
            received += more
        # /metrics reads the engine's stats at most every 50 ms while it
        # steps: the request shows up within that.
        deadline = time.time() + 5
        while metric(server.url, "vflow_requests_running") != 1:
            assert time.time() < deadline, "the request never ran"
            time.sleep(0.02)
    wait_idle(server.url)


def test_bad_requests_are_4xx_json(server: Served) -> None:
    url = server.url + "/v1/completions"
    cases = [
        ({"max_tokens": 4}, 400, "prompt"),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
        ({"prompt": PROMPT, "top_p": 2}, 400, "top_p"),
        ({"prompt": PROMPT, "n": 0}, 400, "n"),
        ({"prompt": [5, 99999]}, 400, "prompt"),
        ({"prompt": PROMPT, "max_tokens": 5000}, 400, "max_tokens"),
        ({"prompt": PROMPT, "presence_penalty": 1}, 400, "presence_penalty"),
        ({"prompt": PROMPT, "logprobs": 21}, 400, "logprobs"),
        ({"prompt": PROMPT, "model": "gpt-4"}, 404, "model"),
        ({"prompt": PROMPT, "vflow": {"flow": "quest"}}, 404, "vflow"),
    ]
    for body, status, param in cases:
        code, reply, _ = post(url, body)
        assert code == status, (body, reply)
        assert reply["error"]["param"] == param, (body, reply)
        assert reply["error"]["message"], body
    code, reply, _ = post(url, b"{not json")
    assert code == 400 and reply["error"]["type"] == "invalid_request_error"
    code, reply, _ = post(server.url + "/v1/chat/completions",
                          {"messages": []})
    assert code == 400 and reply["error"]["param"] == "messages"
    # Still serving.
    code, reply, _ = post(url, {"prompt": PROMPT, "max_tokens": 2})
    assert code == 200 and reply["usage"]["completion_tokens"] == 2


def test_overload_is_503_with_retry_after(model_dir: pathlib.Path) -> None:
    s = Served(model_dir, "--max-batch", "1", "--max-waiting", "1")
    try:
        def one(i: int) -> Tuple[int, Dict[str, str]]:
            code, _, headers = post(s.url + "/v1/completions", {
                "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True})
            return code, headers

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(8)))
        codes = [c for c, _ in results]
        assert 200 in codes and 503 in codes, codes
        assert set(codes) <= {200, 503}
        assert all(h.get("retry-after") for c, h in results if c == 503)
    finally:
        code, out = s.stop(signal.SIGTERM)
    assert code == 0, out


def test_samples_share_the_prompts_blocks(model_dir: pathlib.Path) -> None:
    """n samples: the others start once the first's prompt is computed and
    share its full blocks (the prefix cache's hits say so)."""
    s = Served(model_dir, "--block-size", "16")
    try:
        prompt = " ".join(f"w{3 + i % 60}" for i in range(40))
        c = s.client().completions.create(
            model=None, prompt=prompt, max_tokens=6, temperature=0, n=3)
        assert [ch.text for ch in c.choices] == [c.choices[0].text] * 3
        assert metric(s.url, "vflow_prefix_cache_hit_rate") == \
            pytest.approx(2 / 3)
    finally:
        code, out = s.stop()
    assert code == 0, out


def test_max_model_len_is_the_served_context(model_dir: pathlib.Path) -> None:
    """--max-model-len caps the context below the model's: /v1/models says
    it, and a request past it is a 400 naming the limit."""
    s = Served(model_dir, "--max-model-len", "24")
    try:
        models = json.loads(get(s.url + "/v1/models")[1])
        assert models["data"][0]["max_model_len"] == 24
        url = s.url + "/v1/completions"
        code, reply, _ = post(url, {"prompt": PROMPT, "max_tokens": 19})
        assert code == 200, reply  # 5 prompt tokens + 19 = 24
        code, reply, _ = post(url, {"prompt": PROMPT, "max_tokens": 20})
        assert code == 400 and "context is 24" in reply["error"]["message"]
    finally:
        code, out = s.stop()
    assert code == 0, out


def test_requests_pick_flows_and_params(model_dir: pathlib.Path) -> None:
    """Several engines on one server (A/B on live traffic): a request's
    "vflow" field names a flow and the params its engine must run with;
    none: the first engine; a setting not served is a 404."""
    quest = str(pathlib.Path(__file__).resolve().parents[2] / "examples" /
                "quest.vflow")
    s = Served(model_dir, "--flow", quest + ":budget=2", "--flow",
               quest + ":budget=4", "--flow", "dense")
    try:
        models = json.loads(get(s.url + "/v1/models")[1])
        assert models["data"][0]["vflow_flows"] == [
            "quest[budget=2]", "quest[budget=4]", "dense"]
        url = s.url + "/v1/completions"
        for vflow_field, engine in [
                (None, "quest[budget=2]"),
                ({"flow": "quest", "params": {"budget": 4}}, "quest[budget=4]"),
                ({"params": {"budget": 2}}, "quest[budget=2]"),
                ({"flow": "quest[budget=4]"}, "quest[budget=4]"),
                ({"flow": "dense"}, "dense")]:
            body: Dict[str, Any] = {"prompt": PROMPT, "max_tokens": 2}
            if vflow_field is not None:
                body["vflow"] = vflow_field
            before = _finished(s.url, engine)
            code, reply, _ = post(url, body)
            assert code == 200, reply
            assert _finished(s.url, engine) == before + 1, vflow_field
        code, reply, _ = post(url, {"prompt": PROMPT, "vflow": {
            "flow": "quest", "params": {"budget": 8}}})
        assert code == 404 and "budget=8" in reply["error"]["message"]
    finally:
        code, out = s.stop()
    assert code == 0, out


def _finished(url: str, flow: str) -> float:
    text = get(url + "/metrics")[1]
    return sum(float(m.group(1)) for m in re.finditer(
        rf'^vflow_requests_total{{finish_reason="\w+",flow="{re.escape(flow)}"}} (\S+)$',
        text, re.M))


def test_a_model_without_tokenizer_is_refused(tmp_path: pathlib.Path) -> None:
    write_model(tmp_path, seed=3, **SHAPE)
    proc = subprocess.run(
        [sys.executable, "-m", "vflow.cli", "serve", str(tmp_path),
         "--device", DEVICE, "--port", str(_free_port())],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "has no tokenizer" in proc.stderr


def test_a_port_in_use_is_refused_before_loading(
        model_dir: pathlib.Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "vflow.cli", "serve", str(model_dir),
             "--device", DEVICE, "--port", str(port)],
            capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--port {port}: cannot listen there" in proc.stderr
    assert "vflow serve: " in proc.stderr.splitlines()[-1]


def test_shutdown_ends_running_streams(model_dir: pathlib.Path) -> None:
    s = Served(model_dir)
    stream = s.client().completions.create(
        model=None, prompt=PROMPT, max_tokens=100000 // 30, temperature=0,
        stream=True)
    next(iter(stream))
    code, out = s.stop(signal.SIGINT)
    assert code == 0, out
