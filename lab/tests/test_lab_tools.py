"""Smoke test of the lab's tools (lab/README.md) on the CPU: each tool that
can run without a GPU runs with its smallest arguments on a tiny random
model (tests/python/tiny_model.py) in a child process with a timeout, and
must exit 0 and write the rows it says it writes; every tool's --help
works without torch or a GPU; the records parse and the docs' relative
links resolve. eval_table.py and agent_loop.py run in
tests/python/test_eval.py."""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import subprocess
import sys
from typing import Any, Dict, List

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_TOOLS = ROOT / "lab" / "tools"
sys.path.insert(0, str(ROOT / "tests" / "python"))
from tiny_model import write_model  # noqa: E402

TIMEOUT = 120


def run(args: List[str], timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, str(LAB_TOOLS / name), *args])


def rows(path: pathlib.Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("tiny")
    write_model(d, vocab=64, head_dim=16, seed=1)
    return str(d)


PY_TOOLS = sorted(p.name for p in LAB_TOOLS.glob("*.py"))


def test_every_lab_tool_is_described() -> None:
    readme = (ROOT / "lab" / "README.md").read_text()
    for p in sorted(LAB_TOOLS.iterdir()):
        if p.suffix not in (".py", ".sh"):
            continue  # __pycache__
        assert f"`lab/tools/{p.name}`" in readme, f"lab/README.md: {p.name}"


@pytest.mark.parametrize("name", PY_TOOLS)
def test_help_without_torch_or_a_gpu(name: str) -> None:
    # torch, transformers and the GPU are imported only after the
    # arguments are parsed (none of them is in CI's environment).
    proc = tool(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:"), proc.stdout


@pytest.mark.parametrize("name", PY_TOOLS)
def test_compiles(name: str) -> None:
    proc = run([sys.executable, "-m", "py_compile", str(LAB_TOOLS / name)])
    assert proc.returncode == 0, proc.stderr


def test_engine_gpu_recipe_parses_and_prints_its_usage() -> None:
    script = str(LAB_TOOLS / "engine_gpu.sh")
    assert run(["bash", "-n", script]).returncode == 0
    # From another directory: it works in the repository root.
    proc = subprocess.run(["bash", script], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd="/")
    assert proc.returncode == 2
    assert "usage: lab/tools/engine_gpu.sh split GGUF" in proc.stdout
    for called in re.findall(r"python3 (lab/tools/\w+\.py)",
                             pathlib.Path(script).read_text()):
        assert (ROOT / called).is_file(), called


def test_serve_load_on_the_cpu(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx2")
    from tiny_model import write_tokenizer

    model = tmp_path / "model"  # a server streams text: a tokenizer too
    write_model(model, vocab=64, head_dim=16, seed=1)
    write_tokenizer(model, vocab=64)
    out = tmp_path / "out"
    proc = tool("serve_load.py", str(out), "--model", str(model), "--device",
                "cpu", "--flows", "dense,quest", "--rates", "20",
                "--input-len", "24", "--output-len", "3", "--num-prompts",
                "4", "--max-batch", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(out / "serve_load.jsonl")
    assert [(r["flow"], r["rate"]) for r in got] == [("dense", 20.0),
                                                    ("quest", 20.0)]
    for r in got:
        assert (r["completed"], r["failed"]) == (4, 0), r
        assert r["median_ttft_ms"] > 0 and r["output_throughput"] > 0
    assert "| dense | 20 | 4 |" in (out / "serve_load.md").read_text()


def test_engine_shapes_on_the_cpu(model: str,
                                  tmp_path: pathlib.Path) -> None:
    # At c617774 its first row failed: decode_speed's rows gained a
    # `batch` (the requests a timed step decoded), which the script passed
    # next to its own (the requests run together).
    out = tmp_path / "out"
    proc = tool("engine_shapes.py", str(out), "--model", model,
                "--device", "cpu", "--contexts", "40", "--batches", "1,2",
                "--output-len", "3", "--flows", "dense,quest:budget=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(out / "engine_shapes.jsonl")
    assert [(r["flow"], r["batch"]) for r in got] == [
        ("dense", 1), ("dense", 2), ("quest", 1), ("quest", 2)]
    assert [json.loads(line) for line in proc.stdout.splitlines()] == got
    for r in got:
        assert r["context"] == 40 and r["output_len"] == 3
        assert r["decode_steps"] >= 1 and r["decode_tok_s"] > 0
        assert r["decode_batch"] == r["batch"]  # every request decoded
        assert r["ms_per_step"] > 0 and isinstance(r["step_ms"], dict)
    assert got[2]["params"] == {"budget": 1} and got[0]["params"] is None


def test_engine_shapes_refuses_bad_arguments_before_running(
        model: str, tmp_path: pathlib.Path) -> None:
    for args, words in (
            (["--flows", "dense,nosuch"], "--flows: nosuch"),
            (["--flows", "hf"], "runs on cuda only"),
            (["--batches", "1,x"], "comma-separated ints"),
            (["--contexts", "0"], "must be >= 1")):
        out = tmp_path / "t"
        proc = tool("engine_shapes.py", str(out), "--model", model,
                    "--device", "cpu", *args)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert not out.exists()
    proc = tool("engine_shapes.py", str(tmp_path / "t"), "--model",
                str(tmp_path), "--device", "cpu")
    assert proc.returncode == 2 and "has no config.json" in proc.stderr


def test_kv_capacity_on_the_cpu(model: str, tmp_path: pathlib.Path) -> None:
    """The largest batch a budget holds, per row, and its decode speed:
    dense rows hold context + output tokens a request, a retaining flow its
    kept blocks and the one it fills beside one prompt in flight."""
    from vflow._eval import kv_bytes_per_token

    cfg = json.loads((pathlib.Path(model) / "config.json").read_text())
    layers, kv = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"]
                                       // cfg["num_attention_heads"])
    out = tmp_path / "out"
    proc = tool("kv_capacity.py", str(out), "--model", model, "--device",
                "cpu", "--context", "256", "--output-len", "4",
                "--kv-budget-gib", "0.0005",
                "--rows", "dense:bf16,streaming_llm:int8:keep_last=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dense, stream = rows(out / "kv_capacity.jsonl")
    budget = int(0.0005 * (1 << 30))
    for r, dtype in ((dense, "bf16"), (stream, "int8")):
        per = kv_bytes_per_token(layers, kv, head_dim, dtype)
        assert r["bytes_per_token"] == per
        assert r["pool_tokens"] == budget // per
        assert r["decode_tok_s"] > 0 and 0 < r["decode_batch"] <= r["batch"]
    assert dense["held_tokens"] == 260 and dense["prompt_len"] == 256
    assert dense["batch"] == dense["pool_tokens"] // 260
    # keep_first 1 + keep_last 2 blocks of 16, and the block it fills.
    assert stream["held_tokens"] == 64 and stream["prompt_len"] == 72
    assert stream["batch"] == (stream["pool_tokens"] - 256) // 64
    assert stream["blocks_evicted"] > 0
    proc = tool("kv_capacity.py", str(tmp_path / "t"), "--model", model,
                "--device", "cpu", "--rows", "dense")
    assert proc.returncode == 2 and "FLOW:KV_DTYPE" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_engine_profile_times_steps_on_the_cpu(
        model: str, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    proc = tool("engine_profile.py", str(out), "--model", model,
                "--device", "cpu", "--no-torch-profile", "--context", "40",
                "--batch", "2", "--steps", "2", "--flows", "dense,quest",
                "--budget", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(out / "engine_profile.jsonl")
    assert [r["flow"] for r in got] == ["dense", "quest"]
    assert all(r["batch"] == 2 and r["wall_ms_per_step"] > 0 for r in got)
    proc = tool("engine_profile.py", str(tmp_path / "p"), "--model", model,
                "--device", "cpu")
    assert proc.returncode == 2
    assert "needs --no-torch-profile" in proc.stderr


def test_train_longctx_data_pipeline() -> None:
    # The training itself needs torch and a GPU; its examples are made
    # from vflow.tasks' wording (loaded from python/vflow/tasks.py by path,
    # standard library only), which must still be there.
    sys.path.insert(0, str(LAB_TOOLS))
    try:
        import train_longctx
    finally:
        sys.path.remove(str(LAB_TOOLS))
    tasks = train_longctx.load_tasks()
    eos = 2
    ids, labels = train_longctx.drill(tasks, random.Random(0), 400, "noise",
                                      lambda s: list(s.encode()), eos)
    assert len(ids) == len(labels) > 400
    answer = [t for t in labels if t != -100]
    assert answer and answer[-1] == eos and labels[0] == -100
    assert ids[-len(answer):] == answer


def test_records_parse() -> None:
    records = ROOT / "lab" / "records"
    jsonl = sorted(records.rglob("*.jsonl"))
    assert len(jsonl) >= 20
    for path in jsonl:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                assert isinstance(json.loads(line), dict), f"{path}:{i}"
    for path in records.rglob("*.json"):
        json.loads(path.read_text())


def markdown_files() -> List[pathlib.Path]:
    proc = run(["git", "ls-files", "--cached", "--others",
                "--exclude-standard", "*.md"])
    if proc.returncode == 0 and proc.stdout.strip():
        return [ROOT / p for p in proc.stdout.split()]
    return [p for d in ("docs", "lab", "bench") for p in
            (ROOT / d).rglob("*.md")] + [ROOT / "README.md"]


def test_relative_links_resolve() -> None:
    broken = []
    for path in markdown_files():
        if not path.is_file():
            continue  # deleted in the working tree
        text = path.read_text()
        text = re.sub(r"(?ms)^```.*?^```", "", text)  # code blocks
        text = re.sub(r"`[^`\n]*`", "", text)  # inline code
        for target in re.findall(r"\[[^\]\n]*\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)
