#!/usr/bin/env python3
"""Writes large (about 1 MiB) programs the front end must handle in linear
time:

    make_large.py KIND OUT

KIND: flows (20,000 small flows), const-chain (each const reads the one
before, twice), lets (5,000 lets in one index block), negs (one statement
with 4,000 unary minuses).
"""
import sys

LIMIT = 1 << 20


def fill(head, item, tail, count=None):
    out = [head]
    size = len(head) + len(tail)
    i = 0
    while count is None or i < count:
        text = item(i)
        if size + len(text) > LIMIT:
            break
        out.append(text)
        size += len(text)
        i += 1
    out.append(tail)
    return "".join(out)


KINDS = {
    "flows": lambda: fill(
        "", lambda i: "flow f%d { index { return topk(position, 4); } }\n" % i,
        "", 20000),
    "const-chain": lambda: fill(
        "flow f {\n const c0 = gaussian([token], seed = 1);\n",
        lambda i: " const c%d = c%d + c%d;\n" % (i + 1, i, i),
        " index { return topk(position, 4); }\n}\n"),
    "lets": lambda: fill(
        "flow f {\n index {\n", lambda i: "  let s%d = position * %d;\n" % (i, i),
        "  return topk(s4999, 4);\n }\n}\n", 5000),
    "negs": lambda: ("flow f {\n index {\n  let s = " + "-" * 4000 +
                     "position;\n  return topk(s, 4);\n }\n}\n"),
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in KINDS:
        sys.exit(__doc__)
    with open(sys.argv[2], "w") as f:
        f.write(KINDS[sys.argv[1]]())


if __name__ == "__main__":
    main()
