"""The results table of lab/records/eval (docs/performance.md quotes it):
every stock program at budgets of 1/16, 1/8 and 1/4 of the context, next
to the dense, oracle and random rows.

    python3 lab/tools/eval_table.py MODEL OUT [--lengths 4096,8000] [-n 12]
        [--tasks all] [--min-dense 0.75] [--flows quest,block_topk,...]
        [--fractions 16,8,4] [--haystack noise] [--device cuda]

First it checks each task with dense attention at every length (the
issue's rule: a task judges selections only where dense attention solves
it) and keeps the tasks whose dense accuracy is at least --min-dense at
every length. Then, per length, one vflow.evaluate call gives the dense,
oracle and random rows at the 16-token budgets, and one per flow its rows
at budgets of the same fractions in the flow's own blocks (EPS and LServe
have larger blocks); the dense row is shared. Writes OUT/check.json,
OUT/table-L.json (all rows), OUT/table.md (the markdown table) and
OUT/pareto-L.{png,svg} (and -speed when timed)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

import vflow
from vflow import _eval, tasks as vtasks

# double_sparse is left out by default: its channels are calibrated
# offline for head_dim 128 (examples/double_sparse_channels.npy).
STOCK = ("quest", "block_topk", "h2o", "eps", "lserve", "running_avg",
         "value_gate", "centroid_topp", "quest_shrunk")


def flow_block_size(path: str) -> int:
    """The flow's block_size param (tokens per block), 16 by default."""
    defaults = vflow.compile_file(path).param_defaults()
    entry = defaults.get("block_size")
    return int(entry[1]) if entry else 16


def check_tasks(args: argparse.Namespace, names: List[str]) -> Dict[str, Any]:
    """Dense accuracy per task and length."""
    out: Dict[str, Any] = {}
    for length in args.lengths:
        [row] = vflow.evaluate(args.model, [], tasks=names, lengths=[length],
                               n=args.n, haystack=args.haystack,
                               device=args.device, baselines=False,
                               max_tokens=args.max_tokens, speed=False)
        if "error" in row:
            raise SystemExit(f"dense check at {length}: {row['error']}")
        out[str(length)] = row["per_task"]
        print(f"dense {length}: " + ", ".join(
            f"{t} {a:.2f}" for t, a in row["per_task"].items()), flush=True)
    return out


def fmt(x: Any, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def budgets_of(blocks: int, fractions: List[int]) -> Dict[int, str]:
    """Budget -> the fractions of the context it stands for (one budget
    when several fractions round to it)."""
    out: Dict[int, str] = {}
    for f in fractions:
        b = max(1, blocks // f)
        out[b] = (out[b] + ", " if b in out else "") + f"1/{f}"
    return out


def table_lines(length: int, rows: List[Dict[str, Any]],
                fractions: Dict[str, Dict[int, str]]) -> List[str]:
    lines = [f"### {length} tokens", "",
             "| flow | budget | of context | accuracy | kept | vs dense "
             "(paired) | share attended | decode tok/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        budget = r["params"].get("budget")
        frac = fractions.get(r["flow"], fractions["_"]).get(budget, "")
        if "error" in r:
            lines.append(f"| {r['flow']} | {budget} | {frac} | error: "
                         f"{r['error'][:80]} | | | | |")
            continue
        delta = ("" if r["kind"] == "dense" else
                 f"{r['delta']:+.3f} +- {r['delta_stderr']:.3f}")
        lines.append(
            f"| {r['flow']} | {'' if budget is None else budget} | {frac} | "
            f"{r['accuracy']:.3f} +- {r['stderr']:.3f} | {fmt(r.get('kept'))} "
            f"| {delta} | {fmt(r.get('attended_share'))} | "
            f"{fmt(r.get('decode_tok_s'), 0)} |")
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--lengths", default="4096,8000")
    ap.add_argument("-n", type=int, default=12)
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--min-dense", type=float, default=0.75)
    ap.add_argument("--flows", default=",".join(STOCK),
                    help="stock program names or .vflow files")
    ap.add_argument("--fractions", default="16,8,4")
    ap.add_argument("--haystack", default="noise")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--skip-check", action="store_true",
                    help="use --tasks as given, without the dense check")
    ap.add_argument("--check-only", action="store_true",
                    help="only the dense check of every task")
    args = ap.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",")]
    names = (list(vtasks.TASKS) if args.tasks == "all"
             else args.tasks.split(","))
    # Flows: stock program names or .vflow paths, checked before any run.
    paths: Dict[str, str] = {}
    for name in args.flows.split(","):
        if os.path.exists(name):
            paths[os.path.splitext(os.path.basename(name))[0]] = name
            continue
        try:
            paths[name] = _eval.stock_program(name)
        except FileNotFoundError as e:
            raise SystemExit(f"--flows: {name}: not a file, and {e}")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    if not args.skip_check:
        check = check_tasks(args, names)
        with open(os.path.join(args.out, "check.json"), "w") as f:
            json.dump(dict(model=args.model, n=args.n,
                           haystack=args.haystack, dense=check), f)
        names = [t for t in names
                 if all(check[str(L)].get(t, 0) >= args.min_dense
                        for L in args.lengths)]
        print(f"tasks dense solves (>= {args.min_dense}): {names}",
              flush=True)
        if args.check_only:
            return 0
        if not names:
            raise SystemExit("no task passes the dense check")
    fractions = [int(x) for x in args.fractions.split(",")]
    md = [f"Model {os.path.basename(args.model)}, tasks {', '.join(names)}, "
          f"{args.n} examples per task and length, {args.haystack} "
          "haystack.", ""]
    for length in args.lengths:
        frac_of: Dict[str, Dict[int, str]] = {
            "_": budgets_of(length // 16, fractions)}
        budgets16 = list(frac_of["_"])
        common = dict(tasks=names, lengths=[length], n=args.n,
                      haystack=args.haystack, device=args.device,
                      max_tokens=args.max_tokens)
        rows = vflow.evaluate(args.model, [], sweep={"budget": budgets16},
                              **common)
        print(f"{length}: dense {rows[0].get('accuracy')}", flush=True)
        for name, path in paths.items():
            bs = flow_block_size(path)
            frac_of[name] = budgets_of(length // bs, fractions)
            budgets = list(frac_of[name])
            got = vflow.evaluate(args.model, [path], sweep={"budget": budgets},
                                 baselines=False, dense_row=rows[0], **common)
            rows.extend(got[1:])
            print(f"{length}: {name} " + ", ".join(
                f"{r['params'].get('budget')}: {fmt(r.get('accuracy'))}"
                for r in got[1:]), flush=True)
        # Dense first, then the flows, then the oracle and random rows.
        order = {"dense": 0, "flow": 1, "oracle": 2, "random": 3}
        rows.sort(key=lambda r: order[r["kind"]])
        with open(os.path.join(args.out, f"table-{length}.json"), "w") as f:
            json.dump(rows, f)
        md += table_lines(length, rows, frac_of)
        try:
            _eval.pareto_plot(rows, os.path.join(args.out, f"pareto-{length}"))
        except ImportError:
            pass
    md.append(f"({time.time() - t0:.0f} s)")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
