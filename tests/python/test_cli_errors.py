"""`vflow bench` and `vflow eval` on bad input: one `vflow CMD: ...` line
and exit 2 (with --json also {"ok": false, "error": ...}), checked before
the model is loaded or the evaluation runs; JSON that is always JSON (null
for an undefined standard error); results that are printed even when the
plot cannot be written; -p specs in vflowc's syntax."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import time
from typing import Any, List, Tuple

import pytest

pytest.importorskip("tokenizers")

from vflow import _eval, cli  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tiny_model import write_model, write_tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUEST = str(ROOT / "examples" / "quest.vflow")
EVAL = ["--tasks", "passkey", "--lengths", "96", "-n", "1", "--device",
        "cpu", "--max-tokens", "2", "--dense-layers", "1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("tiny")
    write_model(d, vocab=64, head_dim=16, seed=1)  # a context of 4096
    write_tokenizer(d, 64)
    return str(d)


def vflow(*args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([sys.executable, "-m", "vflow.cli", *args],
                          capture_output=True, text=True, timeout=600)


def user_error(p: subprocess.CompletedProcess,  # type: ignore[type-arg]
               command: str, *fragments: str) -> None:
    """Exit 2, one line on stderr naming the command, no traceback."""
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines and lines[-1].startswith(f"vflow {command}: "), p.stderr
    for f in fragments:
        assert f in p.stderr, (f, p.stderr)


def refused_quickly(command: str, args: List[str], *fragments: str) -> None:
    """A user error within a minute: refused before anything ran."""
    t0 = time.time()
    user_error(vflow(command, *args), command, *fragments)
    assert time.time() - t0 < 60, args


def out_of_range(option: str, value: str) -> Tuple[List[str], str]:
    """`option` given `value`, and the words that refuse it."""
    return [option, value], f"{option}: {value} is out of range"


def test_bench_user_errors(model: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty").mkdir()
    refused_quickly("bench", [str(tmp_path / "nope")], "does not exist")
    refused_quickly("bench", [str(tmp_path / "empty")], "no config.json")
    # The options after the model's path; what the message says.
    cases: List[Any] = [
        (["--flow", str(tmp_path / "nope.vflow")], "vflow bench: cannot read"),
        (["--flow", QUEST, "-p", "budget=x"],
         "'x' is not a number, true or false"),
        (["--flow", QUEST, "-p", "budget=2", "-p", "budget=3"],
         "one value per param here, not 2"),
        (["-p", "budget=2"], "params need a --flow"),
        (["--kv-dtype", "junk"], "invalid choice: 'junk'"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
        out_of_range("--batch", "0"),
        out_of_range("--batch", "99999999999999999999"),
        out_of_range("--num-prompts", "-3"),
        (["--input-len", "x"], "invalid int value: 'x'"),
        out_of_range("--seed", "-1"),
        (["--dense-layers", "99"], "the model has 3 layers"),
        # The context is checked before the KV pool is sized (it asked for
        # tens of GB).
        (["--output-len", "100000000"],
         "over the model's context of 4096 tokens"),
        (["--batch", "65536", "--input-len", "3000"],
         "needs", "GiB, more than this machine's"),
    ]
    from vflow import _vflow
    if _vflow.cuda_devices() == 0:
        cases.append((["--device", "cuda"], "no CUDA device"))
    for args, *fragments in cases:
        refused_quickly("bench", [model, *args], *fragments)
    p = vflow("bench", model, "--batch", "0", "--json")
    user_error(p, "bench", "--batch")
    assert json.loads(p.stdout) == {
        "ok": False, "error": "--batch: 0 is out of range (must be between 1 "
        "and 65536)"}


def test_bench_runs(model: str) -> None:
    p = vflow("bench", model, "--input-len", "64", "--output-len", "4",
              "--batch", "2", "--flow", QUEST, "-p", " budget = 2", "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)
    assert row["ok"] and row["output_tokens"] == 8
    assert row["params"] == {"budget": 2}


def test_eval_user_errors(model: str, tmp_path: pathlib.Path) -> None:
    cases: List[Any] = [
        (["--gate", "nan"], "--gate: nan is not a finite number"),
        (["--gate", "inf"], "--gate: inf is not a finite number"),
        out_of_range("--gate", "-0.5"),
        (["--plot", str(tmp_path / "missing" / "x.png")],
         "the folder", "missing does not exist"),
        (["--plot", str(tmp_path) + "/"], "PREFIX ends in '/'"),
        (["--plot", str(tmp_path / ("x" * 250))], "File name too long"),
        (["--lengths", "96,abc"], "--lengths: 'abc' is not a token count"),
        (["--lengths", "5000"], "over the model's context of 4096"),
        (["--lengths", "10"], "lengths[0]: 10 is out of range"),
        (["-n", "0"], "n: 0 is out of range"),
        (["--max-batch", "0"], "max_batch: 0 is out of range"),
        (["--seed", "-4"], "seed: -4 is out of range"),
        (["--tasks", "nope"], "unknown task 'nope'"),
        (["-p", "budget=2", "-p", "budget=2.0"], "budget=2.0 is given twice"),
        (["-p", "budget=0x10"], "'0x10' is not a number"),
    ]
    for args, *fragments in cases:
        # After the defaults: argparse keeps the last value of an option.
        refused_quickly("eval", [model, QUEST, *EVAL, *args], *fragments)
    user_error(vflow("eval", str(tmp_path / "nope"), *EVAL), "eval",
               "does not exist")
    p = vflow("eval", model, QUEST, *EVAL, "--gate", "nan", "--json")
    user_error(p, "eval")
    assert json.loads(p.stdout)["ok"] is False


def test_eval_json_is_json_with_one_example(model: str) -> None:
    # -n 1: a standard error of one example is undefined: null, not NaN.
    p = vflow("eval", model, QUEST, *EVAL, "-p", "budget=1", "--json",
              "--no-baselines")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout, parse_constant=lambda c: pytest.fail(c))
    assert [r["stderr"] for r in out["rows"]] == [None, None]
    assert "NaN" not in p.stdout


def test_json_text_refuses_what_json_cannot_hold() -> None:
    assert _eval.json_text({"a": [math.nan, 1.5, math.inf], "b": -math.inf}
                           ) == '{"a": [null, 1.5, null], "b": null}'
    with pytest.raises(TypeError):
        _eval.json_text({"a": object()})


def test_repeated_params_merge_into_one_sweep_and_blanks_are_ignored(
        model: str) -> None:
    assert _eval.parse_sweep(["budget=8", "budget = 16, 32", "on=true",
                              " decay=\t0.5 "]) == {
        "budget": [8, 16, 32], "on": [True], "decay": [0.5]}
    # "budget= 2" and "budget=2 " mean the same (vflowc reads them alike:
    # tests/lit/frontend/params-blanks.test).
    assert _eval.parse_sweep(["budget= 2"]) == _eval.parse_sweep(
        ["budget=2 "]) == {"budget": [2]}
    for spec, message in [("budget", "expected NAME=VALUE"),
                          ("=3", "name is missing"),
                          ("budget=", "value is missing"),
                          ("budget=1_000", "not a number"),
                          ("budget=True", "not a number"),
                          ("budget=nan", "not a number"),
                          ("budget=1e999", "out of range"),
                          ("budget=8,8", "given twice")]:
        with pytest.raises(ValueError, match=message):
            _eval.parse_sweep([spec])
    # Python's params take text in the same syntax.
    import vflow
    prog = vflow.compile_file(QUEST, params={"budget": " 3 "})
    assert prog.param_defaults()["budget"][1] == 3


def test_results_are_printed_when_the_plot_cannot_be_written(
        model: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The folder passes the check before the run; writing fails at the end
    # (here: the disk refuses it, injected; in life: a folder removed or a
    # disk filled during the run).
    def full_disk(rows: Any, prefix: str) -> List[str]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_eval, "pareto_plot", full_disk)
    args = [model, QUEST, *EVAL, "-p", "budget=1", "--no-baselines",
            "--plot", str(tmp_path / "p")]
    assert cli.evaluate_cmd(args) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("flow") and "quest" in out
    assert "vflow eval: --plot" in err and "No space left" in err
    assert cli.evaluate_cmd(args + ["--json"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["ok"] is False and len(doc["rows"]) == 2
    assert "No space left" in doc["error"]
