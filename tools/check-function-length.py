#!/usr/bin/env python3
"""Fails when a function in runtime/, compiler/, python/src or python/csrc
is longer than 120 lines (docs/design/ARCHITECTURE.md, "Rules"): its body, from the line
that opens it to the line that closes it. Functions are found by brace
nesting: a brace opened directly inside a namespace, extern "C" block or
type body (outside any function) opens a function; lambdas and blocks
inside it count as its lines."""

import pathlib
import re
import subprocess
import sys
from typing import List, Optional, Tuple

LIMIT = 120
ROOTS = ("runtime", "compiler", "python/src", "python/csrc")
SCOPE = re.compile(r'^\s*(namespace\b|extern\s+"C")')
TYPE = re.compile(r"^\s*(typedef\s+)?(struct|class|enum|union)\b"
                  r"|^\s*template\s*<.*>\s*(struct|class)\b")


def code_of(line: str) -> str:
    """The line without comments and with empty string literals."""
    line = re.sub(r"//.*", "", line)
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    return re.sub(r"'(\\.|[^'\\])*'", "''", line)


def functions(text: str) -> List[Tuple[int, int]]:
    """(first line, length) of each function in `text`, 1-based."""
    lines = text.split("\n")
    stack: List[str] = []
    found: List[Tuple[int, int]] = []
    opened: Optional[Tuple[int, int]] = None  # (line, depth)
    for i, line in enumerate(lines):
        code = code_of(line)
        for ch in code:
            if ch == "{":
                in_scope = all(k in ("scope", "type") for k in stack)
                if in_scope and SCOPE.match(code):
                    stack.append("scope")
                elif in_scope and TYPE.match(code):
                    stack.append("type")
                elif in_scope and opened is None:
                    opened = (i, len(stack))
                    stack.append("function")
                else:
                    stack.append("block")
            elif ch == "}" and stack:
                kind = stack.pop()
                if kind == "function" and opened and len(stack) == opened[1]:
                    found.append((opened[0] + 1, i - opened[0] + 1))
                    opened = None
    return found


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    files = subprocess.run(
        ["git", "ls-files", *ROOTS], cwd=root, capture_output=True,
        text=True, check=True).stdout.split()
    long = 0
    for name in files:
        if not name.endswith((".cpp", ".h", ".cu", ".cuh")):
            continue
        text = (root / name).read_text(errors="replace")
        for line, length in functions(text):
            if length > LIMIT:
                print(f"{name}:{line}: a function of {length} lines "
                      f"(at most {LIMIT})")
                long += 1
    if long:
        return 1
    print(f"function length: every function in {', '.join(ROOTS)} is at "
          f"most {LIMIT} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
