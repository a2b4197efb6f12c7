#!/usr/bin/env python3
"""Writes .npy files that load() must refuse, each with a program that loads
it, into DIR (no NumPy needed):

    make_npy.py DIR

DIR/NAME.npy and DIR/NAME.vflow for NAME in: lax-shape, junk-shape, bool-2,
bool-255, truncated, too-long, too-many, extra-key, good. Each program loads
its file as [m] with m = 8 (too-many declares the shape the header claims).
"""
import os
import struct
import sys


def npy(header, data):
    # NumPy pads the header with spaces and a newline to a multiple of 64.
    text = header
    while (10 + len(text) + 1) % 64:
        text += " "
    text += "\n"
    return (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) +
            text.encode() + data)


def header(descr, shape):
    return ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" %
            (descr, shape))


F32x8 = struct.pack("<8f", *range(8))
CASES = {
    "lax-shape": npy(header("<f4", "(8, 'x')"), F32x8),
    "junk-shape": npy(header("<f4", "( 8abc , )"), F32x8),
    "bool-2": npy(header("|b1", "(8,)"), bytes([0, 1, 2, 0, 0, 0, 0, 0])),
    "bool-255": npy(header("|b1", "(8,)"), bytes([1, 1, 1, 255, 0, 0, 0, 0])),
    "truncated": npy(header("<f4", "(8,)"), F32x8[:28]),
    "too-long": npy(header("<f4", "(8,)"), F32x8 + b"\0"),
    "too-many": npy(header("<f4", "(65536, 65536)"), F32x8),
    "extra-key": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (8,),"
                     " 'x': 1}", F32x8),
    "good": npy(header("<f4", "(8,)"), F32x8),
}

PROGRAM = """flow f {
  axis m = 8;
  const C = load("%s.npy", [m]);
  index { return topk(position + sum(C, m), 4); }
}
"""

TOO_MANY = """flow f {
  axis m = 65536;
  axis n = 256;
  const C = load("too-many.npy", [m, n]);
  index { return topk(position + sum(C, m, n), 4); }
}
"""


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in CASES.items():
        with open(os.path.join(out, name + ".npy"), "wb") as f:
            f.write(data)
        with open(os.path.join(out, name + ".vflow"), "w") as f:
            f.write(TOO_MANY if name == "too-many" else PROGRAM % name)


if __name__ == "__main__":
    main()
