#!/usr/bin/env python3
"""The compiler's calls between its source files, from its static library.

    call_graph.py libVFlowCompiler.a [--print]

A file A calls file B when an object of A uses a function B defines (a
strong symbol, `nm` type T). Fails, naming the files, when the calls between
files make a cycle: calls go one way (the compile API builds on the artifact
writer, which builds on the emitters, passes and interpreter; nothing below
calls back up). `--print` lists every call between files with the functions.
"""

import subprocess
import sys
from collections import defaultdict
from typing import Dict, List, Set, Tuple


def read_symbols(archive: str) -> Tuple[Dict[str, str], Dict[str, Set[str]]]:
    """Who defines each function, and the functions each object uses."""
    out = subprocess.run(["nm", "-C", archive], capture_output=True,
                         text=True, check=True).stdout
    owner: Dict[str, str] = {}
    uses: Dict[str, Set[str]] = defaultdict(set)
    member = ""
    for line in out.splitlines():
        if line.endswith(".o:"):
            member = line[:-len(".o:")]
            continue
        fields = line.split(None, 2)
        if len(fields) == 3 and fields[1] == "T":
            owner[fields[2]] = member
        elif fields and fields[0] == "U":
            uses[member].add(line.split(None, 1)[1])
    return owner, uses


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one file."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: List[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    owner, uses = read_symbols(argv[1])
    edges: Dict[str, Set[str]] = defaultdict(set)
    calls: Dict[Tuple[str, str], Set[str]] = defaultdict(set)
    for caller, symbols in uses.items():
        for symbol in symbols:
            callee = owner.get(symbol)
            if callee and callee != caller:
                edges[caller].add(callee)
                calls[(caller, callee)].add(symbol.split("(")[0])
    if "--print" in argv:
        for (caller, callee), names in sorted(calls.items()):
            print(f"{caller} -> {callee}: {', '.join(sorted(names))}")
    found = cycles(edges)
    for component in found:
        print("call cycle between " + ", ".join(component), file=sys.stderr)
        for a in component:
            for b in component:
                if (a, b) in calls:
                    print(f"  {a} -> {b}: {', '.join(sorted(calls[(a, b)]))}",
                          file=sys.stderr)
    if not found:
        print(f"no call cycle between the {len(uses)} objects of {argv[1]}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
