"""A worked agent loop (docs/eval.md): generate a flow, compile it (fix it
from the diagnostics' codes and hints), screen it on the synthetic
workload, then rank the survivors on a model with dense, oracle and random
rows and keep the best that passes the gate.

    python3 lab/tools/agent_loop.py MODEL [--lengths 2048,4096] [-n 8]
        [--device cuda] [--gate 0.95] [--workload-lengths 2053,4105]

An agent would write the candidates; here they are a fixed list with one
deliberate mistake, so that the repair step has something to do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional

import vflow

# Candidates as an agent might write them. The first has a mistake: its
# budget (the blocks above the mean) is only known on the device, and the
# diagnostic (E600) hints at the threshold form.
CANDIDATES = {
    "above_mean": """
flow above_mean {
  param budget = 64;
  cache c = mean(K, token);
  index {
    let s = max(sum(q * c, dim), head);
    return topk(s, sum(s > mean(s, block), block));
  }
}""",
    "shrunk": """
flow shrunk {
  param budget = 64;
  param alpha = 0.25;
  cache kmax = max(K, token);
  cache kmin = min(K, token);
  index {
    let s = sum(q * (kmax + kmin) * 0.5
                + alpha * abs(q) * (kmax - kmin) * 0.5, dim);
    return topk(max(s, head), budget);
  }
}""",
    "centroid": """
flow centroid {
  param budget = 64;
  cache c = mean(K, token);
  index { return topk(max(sum(q * c, dim), head), budget); }
}""",
}


def repair(source: str, diagnostics: List[Dict[str, Any]]) -> Optional[str]:
    """One repair an agent can make from a diagnostic's code and hints:
    E600 (a budget only the device knows) with the hint naming the
    threshold form: the device-dependent cut becomes threshold's t, and
    the budget its max."""
    for d in diagnostics:
        hints = [n["message"] for n in d["notes"] if n.get("hint")]
        if d["code"] == "E600" and any("threshold(" in h for h in hints):
            return source.replace(
                "topk(s, sum(s > mean(s, block), block))",
                "threshold(s, mean(s, block), max = budget)")
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--lengths", default="2048,4096")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--device", default=None)
    ap.add_argument("--gate", type=float, default=0.95)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--workload-lengths", default="2053,4105")
    ap.add_argument("--tasks", default="niah_single")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vflow-agent-")

    # 1. Compile; repair from the diagnostics when the code says how.
    files: Dict[str, str] = {}
    for name, source in CANDIDATES.items():
        for attempt in range(2):
            try:
                vflow.compile(source, name=f"{name}.vflow")
                break
            except vflow.CompileError as e:
                codes = [d["code"] for d in e.diagnostics]
                print(f"{name}: {codes}: {e.diagnostics[0]['message']}")
                fixed = repair(source, e.diagnostics)
                if fixed is None or attempt == 1:
                    source = ""
                    break
                source = fixed
        if source:
            path = os.path.join(work, f"{name}.vflow")
            with open(path, "w") as f:
                f.write(source)
            files[name] = path

    # 2. Screen on the synthetic workload: keep flows whose mass recall is
    #    within two standard errors of the best one's.
    lengths = [int(x) for x in args.workload_lengths.split(",")]
    screened: Dict[str, float] = {}
    for name, path in files.items():
        report = vflow.run(path, params={"budget": args.budget},
                           lengths=lengths, steps=2)
        if report["errors"]:
            print(f"{name}: cannot run: {report['errors'][0]['message']}")
            continue
        sel = report["flows"][0]["selection"]
        screened[name] = sel["mass_recall"] - 2 * sel["mass_recall_se"]
        print(f"{name}: mass recall {sel['mass_recall']:.3f} "
              f"+- {sel['mass_recall_se']:.3f}")
    best = max(screened.values())
    keep = [n for n, low in screened.items() if low + 0.05 >= best]

    # 3. Rank the survivors on the model, against dense, oracle and random.
    rows = vflow.evaluate(
        args.model, [files[n] for n in keep],
        sweep={"budget": [args.budget]}, tasks=args.tasks.split(","),
        lengths=[int(x) for x in args.lengths.split(",")], n=args.n,
        device=args.device, max_tokens=args.max_tokens)
    for r in rows:
        print(json.dumps({k: r.get(k) for k in (
            "flow", "params", "accuracy", "stderr", "kept",
            "attended_share", "mass_recall", "decode_tok_s", "error")}))
    flows = [r for r in rows if r["kind"] == "flow" and "error" not in r]
    passed = [r for r in flows if (r.get("kept") or 0) >= args.gate]
    if not passed:
        print(f"no flow keeps {args.gate:.0%} of dense accuracy")
        return 1
    winner = min(passed, key=lambda r: (r["attended_share"], -r["accuracy"]))
    print(f"best: {winner['flow']} (kept {winner['kept']:.2f} at "
          f"{winner['attended_share']:.1%} of the context)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
