#!/usr/bin/env python3
"""Runs a command and fails unless it finishes within a time bound, with
exit status 0 (accepted) or 1 (rejected with errors) and no internal error:

    time_bound.py SECONDS COMMAND...

Prints "ok" on success, else why not (with the time it took).
"""
import subprocess
import sys
import time


def main():
    bound = float(sys.argv[1])
    start = time.monotonic()
    try:
        proc = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=bound * 3)
    except subprocess.TimeoutExpired:
        print("timed out after %.1f s (bound %.1f s)" % (bound * 3, bound))
        return 1
    took = time.monotonic() - start
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode not in (0, 1) or "internal error" in stderr:
        print("exit status %d: %s" % (proc.returncode, stderr[:2000]))
        return 1
    if took > bound:
        print("took %.2f s (bound %.1f s)" % (took, bound))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
