"""vflow.evaluate and `vflow eval` on a tiny random model (CPU engine, no
downloads): the rows, their statistics, the baselines, failures reported
as rows or JSON, the gate and the plot. A random model answers nothing, so
these check the machinery; docs/eval.md has real-model numbers."""

from __future__ import annotations

import json
import os
import math
import pathlib
import re
import subprocess
import sys
from typing import Any, Dict, List

import pytest

pytest.importorskip("tokenizers")

import vflow  # noqa: E402
from vflow import _eval  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tiny_model import write_model, write_tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUEST = str(ROOT / "examples" / "quest.vflow")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("tiny")
    write_model(d, vocab=64, head_dim=16, seed=1)
    write_tokenizer(d, 64)
    return str(d)


def run(model: str, **kw: Any) -> List[Dict[str, Any]]:
    args: Dict[str, Any] = dict(tasks=["passkey"], lengths=[96], n=3,
                                device="cpu", max_tokens=3, dense_layers=1,
                                cache=False)
    args.update(kw)
    return vflow.evaluate(model, **args)


def test_baseline_rows_are_cached_across_calls(
        model: str, tmp_path: pathlib.Path) -> None:
    """The dense, oracle and random rows run once per (model, suite,
    options) and come from the cache after; flow rows always run; a
    different suite misses; progress lines say which is which."""
    lines: List[str] = []
    first = run(model, flows=[QUEST], sweep={"budget": [1]},
                cache=str(tmp_path), progress=lines.append)
    assert not any(r.get("cached") for r in first)
    assert len(list(tmp_path.iterdir())) == 3  # dense, oracle, random
    assert any("[1/4] dense: running 3 examples" in x for x in lines), lines
    assert any(x.startswith("[4/4] random[budget=1,seed=0]: done")
               for x in lines), lines
    lines.clear()
    again = run(model, flows=[QUEST], sweep={"budget": [1]},
                cache=str(tmp_path), progress=lines.append)
    assert [r["kind"] for r in again if r.get("cached")] == [
        "dense", "oracle", "random"]
    assert not again[1].get("cached")  # the flow's row ran
    for a, b in zip(first, again):
        assert a["scores"] == b["scores"]
    assert any(x.startswith("[1/4] dense: cached") for x in lines), lines
    other = run(model, flows=[], n=2, cache=str(tmp_path), baselines=False)
    assert not other[0].get("cached")


def test_rows_and_statistics(model: str) -> None:
    rows = run(model, flows=[QUEST], sweep={"budget": [1, 2]})
    kinds = [r["kind"] for r in rows]
    assert kinds == ["dense", "flow", "flow", "oracle", "random", "oracle",
                     "random"]
    assert [r["params"].get("budget") for r in rows[1:]] == [1, 2, 1, 1, 2, 2]
    dense = rows[0]
    assert dense["attended_share"] == pytest.approx(1.0)
    for r in rows:
        assert "error" not in r, r.get("error")
        assert len(r["scores"]) == 3
        assert 0.0 <= r["accuracy"] <= 1.0
        mean = sum(r["scores"]) / 3
        assert r["accuracy"] == pytest.approx(mean)
        var = sum((s - mean) ** 2 for s in r["scores"]) / 2
        assert r["stderr"] == pytest.approx(math.sqrt(var / 3))
        d = [a - b for a, b in zip(r["scores"], dense["scores"])]
        assert r["delta"] == pytest.approx(sum(d) / 3)
        assert r["model"] == model and r["seeds"] == [0, 2]
        assert r["vflow"] == vflow.__version__
        assert set(r["per_task"]) == {"passkey"}
        assert set(r["per_length"]) == {"96"}
        assert r["per_length"]["96"] == pytest.approx(r["accuracy"])
    # A sparse row attends fewer blocks than there are; more with a larger
    # budget; the oracle and random rows attend what the flow does.
    assert rows[1]["attended_share"] < rows[2]["attended_share"] < 1.0
    assert rows[3]["attended_blocks"] == pytest.approx(
        rows[1]["attended_blocks"])
    assert rows[4]["attended_blocks"] == pytest.approx(
        rows[1]["attended_blocks"])
    # The oracle's softmax scale is the model's.
    assert rows[3]["params"]["scale"] == pytest.approx(1 / math.sqrt(16))


def test_failures_are_rows(model: str, tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.vflow"
    bad.write_text("flow bad { index { return topk(q, 4); } }\n")
    rows = run(model, flows=[str(bad)], baselines=False)
    assert rows[0]["kind"] == "dense" and "error" not in rows[0]
    assert "topk" in rows[1]["error"], rows[1]["error"]
    rows = run(model, flows=[QUEST], sweep={"nope": [3]}, baselines=False)
    assert "nope" in rows[1]["error"]  # quest has no param 'nope'
    with pytest.raises(ValueError, match="unknown task"):
        run(model, tasks=["nope"])
    # A model without a tokenizer, and the GPU where there is none, are
    # refused before any row runs.
    bare = tmp_path / "bare"
    write_model(bare, vocab=64, head_dim=16, seed=1)
    with pytest.raises(ValueError, match="has no tokenizer"):
        run(str(bare))
    if vflow._vflow.cuda_devices() == 0:
        with pytest.raises(ValueError, match="no CUDA device"):
            run(model, device="cuda")


def test_parse_sweep() -> None:
    assert _eval.parse_sweep(["budget=8,16", "decay=0.5", "on=true"]) == {
        "budget": [8, 16], "decay": [0.5], "on": [True]}
    for spec in ("budget", "=3", "budget=", "budget=x"):
        with pytest.raises(ValueError, match="-p"):
            _eval.parse_sweep([spec])


def cli(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([sys.executable, "-m", "vflow.cli", "eval", *args],
                          capture_output=True, text=True, timeout=600)


def test_cli_json_gate_and_plot(model: str, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    common = ["--tasks", "passkey", "--lengths", "96", "-n", "2",
              "--device", "cpu", "--max-tokens", "2", "--dense-layers", "1",
              "-p", "budget=1"]
    p = cli(model, QUEST, *common, "--json", "--plot",
            str(tmp_path / "pareto"))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] and [r["kind"] for r in out["rows"]] == [
        "dense", "flow", "oracle", "random"]
    assert all((tmp_path / f"pareto.{e}").stat().st_size > 0
               for e in ("png", "svg"))
    # A gate no flow can pass (keep 200% of dense) fails the command; a
    # flow of accuracy 0 against a dense of 0 has no ratio and fails too.
    p = cli(model, QUEST, *common, "--json", "--no-baselines",
            "--gate", "2.0")
    assert p.returncode == 1
    assert json.loads(p.stdout)["gate_failed"] == ["quest"]
    # A bad -p is JSON, not only text.
    p = cli(model, QUEST, "-p", "budget=many", "--json")
    assert p.returncode == 2
    out = json.loads(p.stdout)
    assert out["ok"] is False and "budget=many" in out["error"]


def test_speed_column_and_plots(model: str, tmp_path: pathlib.Path) -> None:
    rows = run(model, flows=[QUEST], sweep={"budget": [1]}, baselines=False,
               speed=True, max_batch=2)
    for r in rows:
        assert r["decode_tok_s"] > 0
        assert r["speed"]["decode_steps"] > 0
        assert r["speed"]["ms_per_step"] > 0
    pytest.importorskip("matplotlib")
    paths = vflow.pareto_plot(rows, str(tmp_path / "p"))
    assert sorted(pathlib.Path(p).name for p in paths) == [
        "p-recall.png", "p-recall.svg", "p-speed.png", "p-speed.svg", "p.png",
        "p.svg"]


def test_lengths_over_the_models_context_are_refused(model: str) -> None:
    ctx = json.loads((pathlib.Path(model) / "config.json").read_text())[
        "max_position_embeddings"]
    with pytest.raises(ValueError, match="over the model's context"):
        run(model, lengths=[ctx + 100], n=1)


def test_flows_with_a_scale_get_the_models(model: str) -> None:
    # centroid_topp declares `scale` (written for head dim 128): the eval
    # sets the model's 1/sqrt(16) unless the sweep gives one.
    topp = str(ROOT / "examples" / "centroid_topp.vflow")
    rows = run(model, flows=[topp, QUEST], baselines=False,
               sweep={"budget": [2]})
    assert rows[1]["params"] == {"budget": 2, "scale": 0.25}
    assert rows[2]["params"] == {"budget": 2}  # quest has no scale
    rows = run(model, flows=[topp], baselines=False,
               sweep={"scale": [0.5]})
    assert rows[1]["params"] == {"scale": 0.5}
    for r in rows:
        assert "error" not in r, r.get("error")


def test_a_dense_row_is_reused(model: str) -> None:
    first = run(model, baselines=False)
    again = run(model, flows=[QUEST], sweep={"budget": [1]},
                baselines=False, dense_row=first[0])
    assert again[0]["scores"] == first[0]["scores"]
    assert again[0]["seconds"] == first[0]["seconds"]  # not run again
    with pytest.raises(ValueError, match="do not match"):
        run(model, n=2, dense_row=first[0])


def test_mass_recall_per_layer_and_worst_heads(model: str) -> None:
    rows = run(model, flows=[QUEST], sweep={"budget": [1]}, lengths=[160])
    dense, flow = rows[0], rows[1]
    assert "mass_recall" not in dense  # dense attends everything
    for r in rows[1:]:
        assert 0.0 < r["mass_recall"] <= 1.0 + 1e-6, r["flow"]
        layers = r["mass_recall_layers"]
        assert layers[0] is None  # dense_layers=1
        assert all(v is not None and 0.0 < v <= 1.0 + 1e-6
                   for v in layers[1:])
        worst = r["worst_heads"]
        assert 1 <= len(worst) <= 5
        assert [w["recall"] for w in worst] == sorted(
            w["recall"] for w in worst)
        assert worst[0]["recall"] <= r["mass_recall"]
        assert all(w["layer"] >= 1 for w in worst)
    # A budget of 1 block of ~10 keeps part of the mass; the oracle at the
    # same budget keeps at least as much as a random draw.
    oracle = next(r for r in rows if r["kind"] == "oracle")
    rand = next(r for r in rows if r["kind"] == "random")
    assert flow["mass_recall"] < 0.999
    assert oracle["mass_recall"] >= rand["mass_recall"]


def test_the_worked_agent_loop_runs(model: str) -> None:
    # lab/tools/agent_loop.py (docs/eval.md): repair from a diagnostic's code
    # and hint, screen on the synthetic workload, rank on the model. The
    # tiny random model answers nothing, so no flow passes the gate.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "lab" / "tools" / "agent_loop.py"), model,
         "--lengths", "96", "-n", "2", "--device", "cpu", "--budget", "1",
         "--workload-lengths", "300,200", "--tasks", "passkey",
         "--max-tokens", "3"],
        capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert "above_mean: ['E600']" in out, out + proc.stderr
    for name in ("above_mean", "shrunk", "centroid"):
        assert f"{name}: mass recall" in out, out
    rows = [json.loads(line) for line in out.splitlines()
            if line.startswith("{")]
    assert [r["flow"] for r in rows][0] == "dense"
    assert {"oracle", "random"} <= {r["flow"] for r in rows}
    assert proc.returncode == 1 and "no flow keeps" in out


def test_the_results_table_tool(model: str, tmp_path: pathlib.Path) -> None:
    # lab/tools/eval_table.py (docs/eval.md's table): budgets as fractions of
    # the context in each flow's own blocks, the dense row shared.
    out = tmp_path / "table"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "lab" / "tools" / "eval_table.py"), model,
         str(out), "--lengths", "160", "-n", "2", "--tasks", "passkey",
         "--skip-check", "--device", "cpu", "--max-tokens", "3",
         "--flows", "quest,eps", "--fractions", "8,4"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((out / "table-160.json").read_text())
    assert [r["kind"] for r in rows].count("dense") == 1
    quest = [r["params"]["budget"] for r in rows if r["flow"] == "quest"]
    assert quest == [1, 2]  # 10 blocks of 16: 1/8 and 1/4
    eps = [r["params"]["budget"] for r in rows if r["flow"] == "eps"]
    assert eps == [1]  # one block of 128: both fractions round to 1
    assert {r["flow"] for r in rows} >= {"oracle", "random"}
    md = (out / "table.md").read_text()
    assert "| quest | 1 | 1/8 |" in md and "| eps | 1 | 1/8, 1/4 |" in md


def test_the_results_table_tool_refuses_an_unknown_flow(
        model: str, tmp_path: pathlib.Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "lab" / "tools" / "eval_table.py"), model,
         str(tmp_path / "t"), "--skip-check", "--tasks", "passkey",
         "--flows", "quest,nosuch"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--flows: nosuch" in proc.stderr
    assert not (tmp_path / "t").exists()  # refused before any run


def test_decode_speed_when_chunked_prefills_would_not_overlap(
        model: str) -> None:
    # 3 prompts of 400 tokens at 64 prefill tokens a step: without the
    # prefix-cache warm-up the first request finishes its 9 tokens before
    # the last one's prefill ends, and no step would be pure decode.
    llm = vflow.LLM(model, device="cpu", max_batch=3, max_tokens_per_step=64,
                    kv_pool_tokens=4096)
    prompts = [[3 + (i * 7 + j) % 50 for j in range(400)] for i in range(3)]
    speed = _eval.decode_speed(llm, prompts, 8)
    assert speed["decode_steps"] == 8
    assert speed["batch"] == 3
    assert speed["decode_tok_s"] > 0
    assert speed["prefix_hit_tokens"] >= 3 * 384


def test_decode_speed_without_a_prefix_cache_prefills_once(
        model: str) -> None:
    # No cache to fill: the prompts are prefilled once, in the timed run.
    llm = vflow.LLM(model, device="cpu", max_batch=2, kv_pool_tokens=4096,
                    enable_prefix_caching=False)
    prompts = [[3 + (i * 5 + j) % 40 for j in range(64)] for i in range(2)]
    speed = _eval.decode_speed(llm, prompts, 4)
    assert speed["prefix_hit_tokens"] == 0
    assert speed["decode_steps"] == 4 and speed["batch"] == 2
    assert llm.stats()["tokens_computed"] == 2 * 64 + 2 * 4


def test_kv_bytes_per_token() -> None:
    # Qwen3-1.7B: 28 layers, 8 KV heads of 128; int8 rows carry a scale.
    assert _eval.kv_bytes_per_token(28, 8, 128, "bf16") == 114688
    assert _eval.kv_bytes_per_token(28, 8, 128, "int8") == 2 * 28 * 8 * 132
    assert set(_eval.KV_DTYPES) == set(_eval.KV_BYTES)


def test_sequential_stopping_rule() -> None:
    """Stop once the paired differences' 95% interval excludes 0
    (resolved) or lies within +-resolve (within), never before 8."""
    assert _eval._stopping([0.0] * 7, 0.1) is None
    # Agreement on 8 examples is no evidence of a difference under 0.1
    # (a 0 standard error would say it is); on 60 it is, under 0.05.
    assert _eval._stopping([0.0] * 8, 0.1) is None
    assert _eval._stopping([0.0] * 8, 0.3) == "within"
    assert _eval._stopping([0.0] * 50, 0.05) is None
    assert _eval._stopping([0.0] * 60, 0.05) == "within"
    assert _eval._stopping([-1.0] * 8, 0.1) == "resolved"
    assert _eval._stopping([1.0, -1.0] * 4, 0.1) is None  # too noisy yet
    assert _eval._stopping([1.0, -1.0] * 4, 2.0) == "within"
    assert _eval._stopping([-1.0, 0.0] * 20, 0.1) == "resolved"


def test_sequential_stopping_runs_fewer_examples(model: str) -> None:
    rows = run(model, flows=[QUEST], sweep={"budget": [1]}, n=8,
               tasks=["passkey", "niah_single"], resolve=0.5,
               baselines=False, max_batch=4)
    dense, flow = rows
    assert "stopped" not in dense and None not in dense["scores"]
    assert flow["stopped"] in ("within", "resolved")
    ran = [i for i, s in enumerate(flow["scores"]) if s is not None]
    assert flow["examples_run"] == len(ran) < len(flow["scores"])
    # (task, length) in turn: both tasks are among the examples run.
    tasks = {rows[0]["tasks"][0], rows[0]["tasks"][1]}
    assert len(tasks) == 2 and len(ran) >= 8
    half = len(flow["scores"]) // 2  # passkey first, then niah_single
    assert any(i < half for i in ran) and any(i >= half for i in ran)
    assert flow["delta"] == pytest.approx(sum(
        flow["scores"][i] - dense["scores"][i] for i in ran) / len(ran))


def test_rows_carry_the_interval_the_stopping_rule_judges() -> None:
    """delta_interval: mean +- 1.96 SE with +1 and -1 added, so rows that
    agree with dense on every example still show how little that says."""
    low, high = _eval._interval([0.0] * 8)
    assert low == pytest.approx(-high) and high == pytest.approx(
        1.96 * math.sqrt(2 / 9 / 10))
    low, high = _eval._interval([-1.0] * 30)
    assert high < 0
    assert _eval._paired_interval([1.0, None, 0.0], [1.0, 1.0, 1.0]) == \
        pytest.approx(list(_eval._interval([0.0, -1.0])))


def test_baseline_row_runs_every_example_with_resolve(model: str) -> None:
    """Sequential stopping leaves the named baseline row whole, so the
    other rows pair with it over every example they ran."""
    rows = run(model, flows=[QUEST], sweep={"budget": [1, 2]}, n=8,
               tasks=["passkey", "niah_single"], resolve=0.5,
               baselines=False, max_batch=4, baseline="quest[budget=2]")
    _, flow, base = rows
    assert "stopped" not in base and None not in base["scores"]
    assert flow["stopped"] in ("within", "resolved")
    assert flow["vs_baseline"]["examples"] == flow["examples_run"]


def test_cli_progress_cache_and_resolve(model: str,
                                        tmp_path: pathlib.Path) -> None:
    """vflow eval as a person runs it: progress on stderr, the table's
    examples column (ran/total, why it stopped, cached), --no-cache,
    and a bad --resolve refused before anything runs."""
    env = dict(os.environ, VFLOW_CACHE_DIR=str(tmp_path))
    args = [sys.executable, "-m", "vflow.cli", "eval", model, QUEST,
            "--tasks", "passkey,niah_single", "--lengths", "96", "-n", "8",
            "--device", "cpu", "--max-tokens", "2", "--dense-layers", "1",
            "-p", "budget=1", "--no-baselines", "--max-batch", "4",
            "--resolve", "0.5"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=600,
                           env=env)
    assert first.returncode == 0, first.stderr
    assert "vflow eval: [1/2] dense: running 16 examples" in first.stderr
    assert "vflow eval: [2/2] quest[budget=1]: done" in first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].split()[-1] == "examples"
    assert lines[1].split()[-1] == "16/16"  # dense runs every example
    assert re.search(r" \d+/16 (within|resolved)$", lines[2]), lines[2]
    again = subprocess.run(args, capture_output=True, text=True, timeout=600,
                           env=env)
    assert "[1/2] dense: cached" in again.stderr
    assert again.stdout.splitlines()[1].endswith("16/16 (cached)")
    fresh = subprocess.run(args + ["--no-cache", "--quiet"],
                           capture_output=True, text=True, timeout=600,
                           env=env)
    assert fresh.stderr == "" and "(cached)" not in fresh.stdout
    bad = subprocess.run(args[:-1] + ["-1"], capture_output=True, text=True,
                         timeout=600, env=env)
    assert bad.returncode == 2 and "--resolve" in bad.stderr


def test_rows_pair_against_a_named_baseline(model: str) -> None:
    rows = run(model, flows=[QUEST], sweep={"budget": [1, 2]},
               baseline="quest[budget=2]", baselines=False)
    assert [r["kind"] for r in rows] == ["dense", "flow", "flow"]
    base = rows[2]
    assert "vs_baseline" not in base
    for r in (rows[0], rows[1]):
        vs = r["vs_baseline"]
        d = [a - b for a, b in zip(r["scores"], base["scores"])]
        mean = sum(d) / 3
        se = math.sqrt(sum((x - mean) ** 2 for x in d) / 2 / 3)
        assert vs["baseline"] == "quest[budget=2]" and vs["examples"] == 3
        assert vs["delta"] == pytest.approx(mean)
        assert vs["delta_stderr"] == pytest.approx(se)
    # dense as the baseline is the delta column; a name that fits several
    # rows, or none, is refused naming the rows.
    rows = run(model, flows=[QUEST], sweep={"budget": [1]},
               baseline="dense", baselines=False)
    assert rows[1]["vs_baseline"]["delta"] == pytest.approx(rows[1]["delta"])
    for bad in ("quest", "h2o"):
        with pytest.raises(ValueError, match="quest\\[budget=1\\]"):
            run(model, flows=[QUEST], sweep={"budget": [1, 2]},
                baseline=bad, baselines=False)


def test_cli_baseline_column(model: str) -> None:
    p = cli(model, QUEST, "--tasks", "passkey", "--lengths", "96", "-n", "2",
            "--device", "cpu", "--max-tokens", "2", "--dense-layers", "1",
            "-p", "budget=1", "--no-baselines", "--quiet", "--no-cache",
            "--baseline", "quest")
    assert p.returncode == 0, p.stderr
    header = p.stdout.splitlines()[0]
    assert "vs quest[budget=1]" in header


def test_an_evicting_flow_reports_what_it_evicted(model: str) -> None:
    """A flow with a retain block: its row says how many blocks it evicted
    (its attended share and recall are then of what the cache kept)."""
    stream = str(ROOT / "examples" / "streaming_llm.vflow")
    rows = run(model, flows=[stream], sweep={"keep_last": [1]}, lengths=[160],
               dense_layers=0, baselines=False)
    flow = rows[-1]
    assert flow.get("blocks_evicted", 0) > 0, flow
    assert "blocks_evicted" not in rows[0]  # dense keeps everything


def test_kv_dtype_runs_every_row_with_it(model: str) -> None:
    """kv_dtype reaches every row's engine (int8: scaled per token on the
    CPU), rows say which, and an unknown one is refused before anything
    runs."""
    rows = run(model, flows=[QUEST], sweep={"budget": [1]}, baselines=False,
               kv_dtype="int8")
    assert [r["kind"] for r in rows] == ["dense", "flow"]
    for r in rows:
        assert r["kv_dtype"] == "int8" and "error" not in r, r
        assert None not in r["scores"]
    low, high = rows[1]["delta_interval"]
    assert -1 <= low < high <= 1
    assert run(model, baselines=False)[0]["kv_dtype"] == "bf16"
    with pytest.raises(ValueError, match="kv_dtype: 'int4' is not one of"):
        run(model, kv_dtype="int4")


def test_a_suite_is_made_once_per_model_and_options(
        model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # evaluate() tokenizes each long prompt to length (seconds at 32K), so
    # calls with the same model files and suite reuse theirs; a model
    # whose files changed gets its own.
    made: List[int] = []
    real = _eval._tasks.suite

    def counting(*a: Any, **kw: Any) -> Any:
        made.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(_eval._tasks, "suite", counting)
    monkeypatch.setattr(_eval, "_SUITES", {})
    first = _eval._suite(model, ["passkey"], [96], 2, 5, "noise")
    again = _eval._suite(model, ["passkey"], [96], 2, 5, "noise")
    assert len(made) == 1 and first == again
    _eval._suite(model, ["passkey"], [96], 2, 6, "noise")
    assert len(made) == 2
    cfg = pathlib.Path(model) / "config.json"
    st = cfg.stat()
    os.utime(cfg, (st.st_atime, st.st_mtime + 5))
    _eval._suite(model, ["passkey"], [96], 2, 5, "noise")
    assert len(made) == 3
    os.utime(cfg, (st.st_atime, st.st_mtime))
