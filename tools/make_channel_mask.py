#!/usr/bin/env python3
"""Writes a [head_dim, channels] one-hot channel-selection matrix as .npy.

Double Sparsity keeps a few outlier channels per head; which ones is found
offline on a model (the channels with the largest mean |q_d * k_d|). This
script writes the selection matrix for a given list of channels, without
needing numpy:

    tools/make_channel_mask.py OUT.npy --head-dim 128 --channels 0,8,16,...
    tools/make_channel_mask.py OUT.npy --head-dim 128 --every 8
"""
import argparse
import struct
import sys


def write_npy(path, rows, cols, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, cols)
    # Pad so that the data starts at a multiple of 64 bytes (format 1.0).
    total = 10 + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00")
        f.write(struct.pack("<H", len(header)))
        f.write(header.encode("latin1"))
        f.write(struct.pack("<%df" % len(values), *values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--head-dim", type=int, default=128)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--channels", help="comma-separated channel ids")
    group.add_argument("--every", type=int, help="take every N-th channel")
    args = parser.parse_args()
    if args.channels:
        channels = [int(c) for c in args.channels.split(",")]
    else:
        channels = list(range(0, args.head_dim, args.every))
    for c in channels:
        if not 0 <= c < args.head_dim:
            sys.exit("channel %d is outside [0, %d)" % (c, args.head_dim))
    values = [0.0] * (args.head_dim * len(channels))
    for j, c in enumerate(channels):
        values[c * len(channels) + j] = 1.0
    write_npy(args.out, args.head_dim, len(channels), values)


if __name__ == "__main__":
    main()
