#!/usr/bin/env python3
"""Writes the bad-corpus inputs that are too big to commit.

    make_big_inputs.py too-large OUT   a file just over vflowc's 1 MiB limit
    make_big_inputs.py many-lets OUT   a valid-looking 600 KB flow: 20,000
                                       lets, then a return of a tensor
    make_big_inputs.py one-line OUT    a 700 KB program on one line with 20
                                       unknown names near its end

The output is deterministic, so the CHECK lines of the tests that use it can
name exact lines and columns.
"""
import sys


def too_large():
    # Comment lines (no program at all): only the size matters, and the size
    # check must come before lexing.
    line = "// " + "x" * 76 + "\n"  # 80 bytes
    return "flow f { index { return topk(position, 4); } }\n" + line * 13108


def many_lets():
    out = ["flow f {\n", "  index {\n"]
    for i in range(20000):
        out.append("    let s%d = position * %d;\n" % (i, i))
    # Line 20003: the error (a tensor is returned, not a selection).
    out.append("    return s19999;\n")
    out.append("  }\n}\n")
    return "".join(out)


def one_line():
    # All on line 1; the lets with unknown names start at byte 700,000, so the
    # first unknown name is at column 700010.
    head = "flow f { index { "
    lets = []
    size = len(head)
    i = 0
    while size < 700000 - 40:
        let = "let s%d = position * %d; " % (i, i)
        lets.append(let)
        size += len(let)
        i += 1
    pad = " " * (700000 - size)
    bad = "".join("let e%d = zz%d; " % (k, k) for k in range(20))
    return head + "".join(lets) + pad + bad + "return topk(position, 4); } }\n"


def main():
    modes = {"too-large": too_large, "many-lets": many_lets,
             "one-line": one_line}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    text = modes[sys.argv[1]]()
    with open(sys.argv[2], "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
