"""One large file (a model) to the GPU machine in pieces of the device
tool's carry limit (64 MiB a call with the repository), checked by sha256
piece by piece and whole. Here, once:

    python3 lab/tools/file_carry.py split MODEL.gguf NAME   # .carry/m/NAME/1..N

then on the device, one call per piece while the machine stays warm:

    run("python3 lab/tools/file_carry.py put .carry/m/NAME/K",
        carry=[".carry/m/NAME/K"])

The last piece in place joins them into /tmp/models/NAME (the name kept,
e.g. qwen05.gguf) and checks the whole file's sha256; `put` says which
pieces are still missing. `status NAME` tells the same without a piece."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from typing import Any, Dict, List

MIB = 1 << 20
CARRIES = os.path.join(".carry", "m")
STORE = "/tmp/models"


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def split(path: str, name: str, max_mib: float) -> int:
    size = os.path.getsize(path)
    piece = int(max_mib * MIB)
    count = max(1, -(-size // piece))
    out = os.path.join(CARRIES, name)
    shutil.rmtree(out, ignore_errors=True)
    parts: List[Dict[str, Any]] = []
    with open(path, "rb") as f:
        for k in range(1, count + 1):
            os.makedirs(os.path.join(out, str(k)))
            part = os.path.join(out, str(k), "part")
            with open(part, "wb") as g:
                g.write(f.read(piece))
            parts.append(dict(index=k, size=os.path.getsize(part),
                              sha256=sha256(part)))
    manifest = dict(name=name, size=size, sha256=sha256(path), parts=parts)
    for k in range(1, count + 1):
        with open(os.path.join(out, str(k), "manifest.json"), "w") as g:
            json.dump(dict(manifest, index=k), g)
    print(f"{path}: {count} pieces of at most {max_mib:g} MiB in {out}/1.."
          f"{count}; on the device, one call each:")
    for k in range(1, count + 1):
        print(f'  run(command="python3 lab/tools/file_carry.py put '
              f'{out}/{k}", carry=["{out}/{k}"])')
    return 0


def missing(name: str, manifest: Dict[str, Any]) -> List[int]:
    have = os.path.join(STORE, name + ".parts")
    return [p["index"] for p in manifest["parts"]
            if not os.path.exists(os.path.join(have, str(p["index"])))]


def put(carry: str) -> int:
    with open(os.path.join(carry, "manifest.json")) as f:
        manifest = json.load(f)
    name, k = manifest["name"], manifest["index"]
    want = manifest["parts"][k - 1]
    got = sha256(os.path.join(carry, "part"))
    if got != want["sha256"]:
        print(f"piece {k} of {name}: sha256 {got}, expected "
              f"{want['sha256']}: carry it again")
        return 1
    parts = os.path.join(STORE, name + ".parts")
    os.makedirs(parts, exist_ok=True)
    shutil.copyfile(os.path.join(carry, "part"), os.path.join(parts, str(k)))
    with open(os.path.join(parts, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return join(name, manifest)


def join(name: str, manifest: Dict[str, Any]) -> int:
    left = missing(name, manifest)
    if left:
        print(f"{name}: {len(manifest['parts']) - len(left)} of "
              f"{len(manifest['parts'])} pieces in place; missing {left}")
        return 0
    target = os.path.join(STORE, name)
    parts = os.path.join(STORE, name + ".parts")
    with open(target + ".tmp", "wb") as out:
        for p in manifest["parts"]:
            with open(os.path.join(parts, str(p["index"])), "rb") as f:
                shutil.copyfileobj(f, out, 8 * MIB)
    if sha256(target + ".tmp") != manifest["sha256"]:
        print(f"{name}: the joined file's sha256 differs from the "
              "original's: pieces are stale; carry them again")
        return 1
    os.replace(target + ".tmp", target)
    shutil.rmtree(parts)
    print(f"{target}: {manifest['size']} bytes, sha256 checked")
    return 0


def status(name: str) -> int:
    target = os.path.join(STORE, name)
    if os.path.exists(target):
        print(f"{target}: in place")
        return 0
    path = os.path.join(STORE, name + ".parts", "manifest.json")
    if not os.path.exists(path):
        print(f"{name}: no piece on this machine yet")
        return 1
    with open(path) as f:
        return join(name, json.load(f))


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("file")
    s.add_argument("name")
    s.add_argument("--max-mib", type=float, default=54.0)
    p = sub.add_parser("put")
    p.add_argument("carry")
    t = sub.add_parser("status")
    t.add_argument("name")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        return split(a.file, a.name, a.max_mib)
    if a.cmd == "put":
        return put(a.carry)
    return status(a.name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
