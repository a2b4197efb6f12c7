#!/usr/bin/env python3
"""Regenerates the golden vt IR checks of tests/lit/frontend/examples-*.test.

Each test compiles one stock program with vflowc and checks the whole printed
vt IR line by line (CHECK-LABEL on the flow, CHECK-NEXT after it). Run this
after an intended change to the lowering, then review the diff:

    tests/lit/frontend/update_goldens.py build/bin/vflowc
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def main():
    vflowc = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin", "vflowc")
    examples = sorted(f[:-6] for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".vflow"))
    for name in examples:
        out = subprocess.run([vflowc, os.path.join(ROOT, "examples", name + ".vflow")],
                             check=True, capture_output=True, text=True).stdout
        lines = [l for l in out.splitlines() if l.strip()]
        checks = []
        started = False
        for line in lines:
            text = line.strip()
            if text.startswith("vt.flow @"):
                checks.append("// CHECK-LABEL: " + text)
                started = True
            elif started:
                checks.append("// CHECK-NEXT: " + text.replace("[[", "{{\\[\\[}}"))
        body = [
            "// RUN: vflowc %examples/" + name + ".vflow | FileCheck %s",
            "// RUN: vflowc %examples/" + name + ".vflow | vflow-opt | FileCheck %s",
            "// Golden vt IR of examples/" + name + ".vflow; regenerate with update_goldens.py.",
            "",
        ] + checks
        with open(os.path.join(HERE, "examples-" + name + ".test"), "w") as f:
            f.write("\n".join(body) + "\n")
        print("wrote examples-%s.test (%d checks)" % (name, len(checks)))


if __name__ == "__main__":
    main()
