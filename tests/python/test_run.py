"""vflow.run: vflowc run --json in process."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.usefixtures("compiler")

import vflow

from conftest import EXAMPLES, ROOT

SMALL = dict(lengths=[600, 900], kv_heads=2, group=2, head_dim=32, steps=2)


def test_run_matches_the_cli() -> None:
    path = EXAMPLES / "quest.vflow"
    report = vflow.run(str(path), params={"budget": 8}, **SMALL)
    assert [f["flow"] for f in report["flows"]] == ["quest"]
    assert report["errors"] == []
    cli = subprocess.run(
        [str(ROOT / "build" / "bin" / "vflowc"), "run", str(path), "--json",
         "-p", "budget=8", "--lengths", "600,900", "--kv-heads", "2",
         "--group", "2", "--head-dim", "32", "--steps", "2"],
        capture_output=True, text=True,
    )
    if cli.returncode != 0 and not cli.stdout:
        pytest.skip("vflowc is not built in build/")
    want = json.loads(cli.stdout)
    def strip(r: dict) -> list:  # timings differ from run to run
        return [{k: v for k, v in f.items() if "_ms" not in k}
                for f in r["flows"]]

    assert strip(report) == strip(want)


def test_run_a_program_object_and_report_failures() -> None:
    prog = vflow.compile_file(EXAMPLES / "double_sparse.vflow")
    report = vflow.run(prog, **SMALL)  # specialized to head_dim 128
    assert report["flows"] == []
    assert "head_dim" in report["errors"][0]["message"]
    bad = vflow.run(prog, params={"nosuch": 1}, **SMALL)
    assert bad["errors"]
    with pytest.raises(ValueError, match="seedz"):
        vflow.run(prog, seedz=3)
    with pytest.raises(ValueError, match="lengths"):
        vflow.run(prog, lengths="600")
    worse = vflow.run(prog, lengths=[0])
    assert "sequence lengths" in worse["errors"][0]["message"]


def test_seeds_distractors_and_the_oracle() -> None:
    report = vflow.run(EXAMPLES / "quest.vflow", params={"budget": 4},
                       seeds=2, distractors=0, **SMALL)
    assert report["workload"]["seeds"] == 2
    assert report["workload"]["distractors"] == 0
    row = report["flows"][0]
    assert row["seeds"] == 2
    # The oracle keeps at least the flow's mass; standard errors are there.
    assert row["oracle"]["mass_recall"] >= row["selection"]["mass_recall"] - 1e-9
    assert row["selection"]["mass_recall_se"] >= 0


def test_sweeps_and_baseline_match_the_cli(tmp_path) -> None:
    """A list of values sweeps, `baseline` pairs every row with that flow's
    row of the same params: the same report as vflowc run -p budget=4,8
    --baseline block_topk."""
    path = tmp_path / "two.vflow"
    path.write_text((EXAMPLES / "quest.vflow").read_text() + "\n" +
                    (EXAMPLES / "block_topk.vflow").read_text())
    report = vflow.run(str(path), params={"budget": [4, 8]},
                       baseline="block_topk", seeds=3, **SMALL)
    assert [(f["flow"], f["params"]["budget"]) for f in report["flows"]] == [
        ("quest", 4), ("block_topk", 4), ("quest", 8), ("block_topk", 8)]
    assert report["flows"][0]["vs_baseline"]["baseline"] == \
        "block_topk[budget=4]"
    cli = subprocess.run(
        [str(ROOT / "build" / "bin" / "vflowc"), "run", str(path), "--json",
         "-p", "budget=4,8", "--baseline", "block_topk", "--seeds", "3",
         "--lengths", "600,900", "--kv-heads", "2", "--group", "2",
         "--head-dim", "32", "--steps", "2"],
        capture_output=True, text=True,
    )
    if cli.returncode != 0 and not cli.stdout:
        pytest.skip("vflowc is not built in build/")
    want = json.loads(cli.stdout)
    for got, ref in zip(report["flows"], want["flows"]):
        assert got["vs_baseline"] == ref["vs_baseline"]
        assert got["selection"]["per_seed"] == ref["selection"]["per_seed"]
    missing = vflow.run(str(path), baseline="nosuch", **SMALL)
    assert missing["errors"][-1]["message"] == "baseline: no flow 'nosuch' ran"
    with pytest.raises(ValueError, match="an empty list of values"):
        vflow.run(str(path), params={"budget": []}, **SMALL)
