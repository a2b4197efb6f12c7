#!/usr/bin/env python3
"""Stages vLLM 0.26.0 on the GPU machine (device tool), which has no
network: resolve here which distributions it lacks, download them here,
pack them into carry directories of at most ~54 MiB, install them there.

  here:   python lab/tools/vllm_stage.py resolve            (writes the lock)
          python lab/tools/vllm_stage.py download [--trim] [DIR]
          python lab/tools/vllm_stage.py pack [--trim] [DIR] [OUT]  (prints the calls)
  device: python3 lab/tools/vllm_carry.py install .carry/vllm/K   (per call)
          then PYTHONPATH=/tmp/vllmlib python3 -m vllm.entrypoints.cli.main ...

resolve: walks vllm==0.26.0's requirements (markers evaluated for CPython
3.12.3, Linux x86_64; an extra only where a requirement names it) against
the device's `pip freeze` (lab/tools/vllm-data/device-freeze.txt). A distribution
the device has at a version satisfying every specifier seen is present; one
it has at another version is a conflict, reported and kept (the device's
version wins) unless --override names it (never the torch family, triton
or nvidia-*); every other one gets the newest version satisfying all the
specifiers seen that has a file the device can install (a wheel tagged
cp312 / abi3 / py3-none, manylinux up to glibc 2.39; an sdist only when no
such version has a wheel, and then the lock says so). The walk repeats
until no choice changes; when nothing fits a distribution, the versions
of the askers that conflict with the fixed ones (the command line, the
device's, single-version pins) are given up one by one (backtracking), and
an asker of another version of a device package moves to its newest
version the device's versions satisfy when there is one. Requirements are read from each chosen wheel's
own METADATA, fetched by HTTP range requests (the zip's directory and one
member, not the whole wheel): PyPI's /NAME/VERSION/json answers 404 on this
machine's index and its requires_dist is only the first uploaded file's.
Files, sizes and sha256 come from /pypi/NAME/json. The lock
(lab/tools/vllm-data/lock-0.26.0.txt) has one line per distribution to install:
name==version, file, size, sha256 and its set: `core` when the trimmed set
(--trim: vLLM without the packages it imports only lazily, for `vllm serve`
of a Llama/Qwen model; TRIM below says why each) needs it too, `full` when
only the full set does.

download: the lock's files with pip download --no-deps (wheels with
--only-binary and the device's tags), each checked against its sha256.

pack: the lock's files (the core set with --trim) from DIR into OUT/1,
OUT/2, ... each at most --max-mib, files larger than that split into byte
parts; each carry directory has a manifest.json (every file of the set:
parts, sizes, sha256, which carry).

install (on the device; Python and pip only): copies each carried
directory's files into /tmp/vllm-stage/SET (one carry per call while the
machine stays warm), and when every part is there checks the sha256s,
joins the split files and runs `pip install --no-deps --no-index --target
/tmp/vllmlib`: the device's own torch etc. stay as they are; use vLLM with
PYTHONPATH=/tmp/vllmlib. Running it again is harmless. A carry named but
not carried, a piece missing from its carry or a bad sha256 is an error
(status 2) naming it; with --complete (the last call), carries still
missing are (status 3)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import (Any, Deque, Dict, Iterable, List, Mapping, Optional,
                    Protocol, Sequence, Set, Tuple)

from packaging import tags
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# The package index (PyPI's JSON API, wheels' METADATA by HTTP ranges).
from vllm_index import (Choice, canonical, IndexFile, PyPI, Releases, _RemoteFile, choose, parse_requires, pins_exactly, python_ok, wheel_rank, CACHE, PYPI, PYTHON)  # noqa: F401

# Packing and installing carries (standard library only: the device runs it).
from vllm_carry import (MANIFEST_ROOM, MIB, STAGE, TARGET,  # noqa: F401
                        StageError, add_install_parser, install, pack,
                        plan_pack, read_manifest, sha256_of)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VLLM_VERSION = "0.26.0"
FREEZE = HERE / "vllm-data" / "device-freeze.txt"
LOCK = HERE / "vllm-data" / f"lock-{VLLM_VERSION}.txt"
WHEELS = ROOT / ".carry" / "vllm-wheels"
CARRIES = ROOT / ".carry" / "vllm"

# The device: Python 3.12.3 (CPython; vllm_index.PYTHON), Linux x86_64,
# glibc 2.39.
GLIBC_MINOR = 39
MACHINE = "x86_64"

# Never replaced on the device, whatever --override says: vLLM must run on
# the device's own torch build and CUDA libraries.
PROTECTED = ("torch", "torchvision", "torchaudio", "triton")
PROTECTED_PREFIX = "nvidia-"

# What the trimmed set leaves out (resolve --trim, download/pack --trim),
# with what vLLM uses it for. vLLM 0.26.0 imports none of them at module
# level on the way `vllm serve` of a Llama/Qwen model takes; they are
# imported inside functions of other features or behind a check that the
# package is installed. lab/tools/vllm_imports.py checks the first part and
# lists every import site; lab/README.md has its result. Each
# one's own dependencies go with it unless a kept package needs them.
TRIM: Dict[str, str] = {
    "pynvvideocodec": "video decoding of multimodal inputs",
    "torchcodec": "audio/video decoding of multimodal inputs",
    "tilelang": "mHC kernels (brings z3-solver)",
    "humming-kernels": "the humming quantization (brings nvcc and nvvm 13.5)",
    "tokenspeed-mla": "MLA attention backends (brings tokenspeed-triton)",
    "nvidia-cutlass-dsl": "CuTe DSL kernels: FlashAttention 4 (Blackwell), MLA, MoE",
    "quack-kernels": "CuTe DSL kernels (DSA, GDN, DeepSeek V4, SM100 FMHA)",
    "flashinfer-python": "the FlashInfer backends, sampler and FP4/MoE kernels",
    "nvidia-cudnn-frontend": "cuDNN frontend: FlashAttention 4's benchmarks",
    "fastsafetensors": "the fastsafetensors load format (opt-in)",
    "mistral-common": "Mistral tokenizers and models, the guidance backend's Mistral path",
    "anthropic": "nothing in vLLM imports it (its /v1/messages has its own types)",
    "mcp": "MCP tool servers of the responses API (--tool-server)",
    "opentelemetry-exporter-otlp": "exporting traces (--otlp-traces-endpoint)",
    "lm-format-enforcer": "an opt-in structured-output backend",
    "outlines-core": "an opt-in structured-output backend",
    "pycountry": "pydantic-extra-types' country/language types, unused",
    "fastapi-cli": "the `fastapi` command (fastapi[standard])",
    "fastapi-cloud-cli": "the `fastapi cloud` command (fastapi[standard])",
}


def protected(name: str) -> bool:
    n = canonical(name)
    return n in PROTECTED or n.startswith(PROTECTED_PREFIX)


# ---------------------------------------------------------------------------
# The device's environment: markers, tags, installed distributions.


def marker_env(extra: str = "") -> Dict[str, str]:
    """PEP 508 marker variables of the device's interpreter."""
    return {
        "implementation_name": "cpython",
        "implementation_version": PYTHON,
        "os_name": "posix",
        "platform_machine": MACHINE,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": PYTHON,
        "python_version": ".".join(PYTHON.split(".")[:2]),
        "sys_platform": "linux",
        "extra": extra,
    }


def platform_tags(glibc_minor: int = GLIBC_MINOR,
                  machine: str = MACHINE) -> List[str]:
    """manylinux_2_N for N from the device's glibc down to 5 (with the
    legacy aliases manylinux2014/2010/1), then linux_MACHINE: pip's order."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    out: List[str] = []
    for minor in range(glibc_minor, 4, -1):
        out.append(f"manylinux_2_{minor}_{machine}")
        if minor in legacy:
            out.append(f"{legacy[minor]}_{machine}")
    out.append(f"linux_{machine}")
    return out


def supported_tags() -> Dict[tags.Tag, int]:
    """The device's wheel tags, each with its rank (0 = most preferred):
    cp312-cp312, cp3x-abi3, cp312-none and py3x-none on its platforms,
    then the -any ones."""
    version = tuple(int(x) for x in PYTHON.split(".")[:2])
    plats = platform_tags()
    order = list(tags.cpython_tags(version, abis=[f"cp{version[0]}{version[1]}"],
                                   platforms=plats))
    order += list(tags.compatible_tags(
        version, interpreter=f"cp{version[0]}{version[1]}", platforms=plats))
    ranks: Dict[tags.Tag, int] = {}
    for t in order:
        ranks.setdefault(t, len(ranks))
    return ranks


def read_freeze(path: Path) -> Dict[str, Version]:
    """`pip freeze` lines name==version; anything else (comments, -e, URL
    installs) is an error naming the line."""
    out: Dict[str, Version] = {}
    for no, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, ver = line.partition("==")
        if not sep:
            raise ValueError(f"{path}:{no}: expected name==version, got {line!r}")
        try:
            out[canonical(name)] = Version(ver.strip())
        except InvalidVersion as e:
            raise ValueError(f"{path}:{no}: {e}") from None
    return out


# ---------------------------------------------------------------------------
# The resolver.


class ResolveError(Exception):
    pass


@dataclass(frozen=True)
class Need:
    """One requirement on a distribution: its specifier, who asked (a
    distribution name, or "" for the command line) and the text."""
    spec: SpecifierSet
    by: str
    text: str


@dataclass
class Conflict:
    name: str
    device: Version
    unmet: List[Need]
    overridden: bool


@dataclass
class Walk:
    needs: Dict[str, List[Need]] = field(default_factory=dict)
    used: Dict[str, Version] = field(default_factory=dict)
    choices: Dict[str, Choice] = field(default_factory=dict)
    extras: Dict[str, Set[str]] = field(default_factory=dict)
    edges: Dict[str, Set[str]] = field(default_factory=dict)


@dataclass
class Resolution:
    picks: Dict[str, Choice]
    present: Dict[str, Version]
    conflicts: List[Conflict]
    needs: Dict[str, List[Need]]
    edges: Dict[str, Set[str]]

    def core(self, roots: Sequence[str], trim: Iterable[str]) -> Set[str]:
        """The picks reachable from `roots` without passing through a
        trimmed name: what the trimmed set installs."""
        return self.reachable(roots, trim) & set(self.picks)

    def reachable(self, roots: Sequence[str], trim: Iterable[str]) -> Set[str]:
        skip = {canonical(t) for t in trim}
        seen: Set[str] = set()
        pending = [canonical(Requirement(r).name) for r in roots]
        while pending:
            n = pending.pop()
            if n in seen or n in skip:
                continue
            seen.add(n)
            pending.extend(self.edges.get(n, ()))
        return seen


class Index(Protocol):
    """What the resolver reads from a package index (vllm_index.PyPI; the
    tests give a fixed one)."""

    def releases(self, name: str) -> Releases: ...

    def requires(self, f: IndexFile) -> List[str]: ...


def combined(needs: Sequence[Need]) -> SpecifierSet:
    spec = SpecifierSet()
    for n in needs:
        spec &= n.spec
    return spec


def applicable(texts: Iterable[str], extras: Iterable[str], base: bool = True,
               where: str = "") -> List[Requirement]:
    """The requirements (Requires-Dist lines) that apply on the device: the
    base ones (markers true without an extra) if `base`, and those that
    only each of `extras` adds."""
    extras = list(extras)
    out = []
    for text in texts:
        try:
            r = Requirement(text)
        except InvalidRequirement as e:
            raise ResolveError(f"{where}: Requires-Dist {text!r}: {e}") from None
        plain = r.marker is None or r.marker.evaluate(marker_env(""))
        if (base and plain) or (not plain and r.marker is not None and any(
                r.marker.evaluate(marker_env(e)) for e in extras)):
            out.append(r)
    return out


def _expand(w: Walk, index: Any, name: str, choice: Choice, extras: Iterable[str],
            base: bool, queue: Deque[Tuple[Requirement, str]]) -> None:
    for r in applicable(index.requires(choice.file), extras, base, choice.file.filename):
        queue.append((r, name))


def _decide(w: Walk, name: str, device: Mapping[str, Version], index: Any,
            pins: Mapping[str, Version], overrides: Set[str],
            ranks: Mapping[tags.Tag, int], bans: Mapping[str, Set[Version]]) -> Optional[Choice]:
    """The version a walk uses for `name` (recorded in w.used) and, when
    it is installed from the index, its file (None for the device's own
    version, or when nothing fits yet: the round's check reports that)."""
    if name in device and name not in overrides:
        w.used[name] = device[name]
        return None
    releases = index.releases(name)
    if name in pins:
        spec = SpecifierSet(f"=={pins[name]}")
    else:
        spec = combined(w.needs[name]) & banned(bans, name)
    c = choose(spec, releases, ranks)
    if c is not None:
        w.used[name] = c.version
        w.choices[name] = c
    return c


def banned(bans: Mapping[str, Set[Version]], name: str) -> SpecifierSet:
    return SpecifierSet(",".join(f"!={v}" for v in sorted(bans.get(name, ()))))


def walk(roots: Sequence[str], device: Mapping[str, Version], index: Any,
         pins: Mapping[str, Version], overrides: Set[str],
         ranks: Mapping[tags.Tag, int],
         bans: Optional[Mapping[str, Set[Version]]] = None) -> Walk:
    """One pass over the requirement graph from `roots`. The device's
    distributions are not walked (their requirements are met there) except
    for an extra a requirement names; the others use `pins` where given,
    else the newest version the specifiers seen so far allow (minus
    `bans`)."""
    w = Walk()
    bans = bans or {}
    queue: Deque[Tuple[Requirement, str]] = deque((Requirement(r), "") for r in roots)
    while queue:
        req, parent = queue.popleft()
        name = canonical(req.name)
        w.needs.setdefault(name, []).append(Need(req.specifier, parent, str(req)))
        if parent:
            w.edges.setdefault(parent, set()).add(name)
        extras = {canonical(e) for e in req.extras}
        first = name not in w.used
        new = extras - w.extras.get(name, set())
        w.extras.setdefault(name, set()).update(extras)
        if first:
            c = _decide(w, name, device, index, pins, overrides, ranks, bans)
            if c is not None:
                _expand(w, index, name, c, extras, True, queue)
                continue
            if name not in w.used:
                continue  # nothing fits: reported after the walk
        if not new:
            continue
        c = w.choices.get(name)
        if c is None:  # the device's version: its file on the index
            c = choose(SpecifierSet(f"=={w.used[name]}"), index.releases(name), ranks)
            if c is None:
                raise ResolveError(f"{name} {w.used[name]} (on the device): not on the "
                                   f"index, but extras {sorted(new)} are asked for")
        _expand(w, index, name, c, new, False, queue)
    return w


def _describe(needs: Sequence[Need]) -> str:
    return "; ".join(f"{n.by or 'the command line'} wants {n.text}" for n in needs)


def _culprits(name: str, w: Walk, device: Mapping[str, Version], over: Set[str],
              index: Any, ranks: Mapping[tags.Tag, int],
              bans: Mapping[str, Set[Version]]) -> List[str]:
    """When no version of `name` fits its needs: the askers whose version
    to give up (backtracking). An asker is fixed when it is the command
    line, on the device, or allowed a single version; the others are
    movable. The movable askers whose need conflicts with the fixed needs
    are the culprits; when each fits them alone but not all together, the
    last asker is. Empty when the fixed needs conflict among themselves."""
    fixed = banned(bans, name)
    movable: List[Need] = []
    releases = index.releases(name)
    for n in w.needs[name]:
        if _fixed(n.by, w, device, over, index, bans):
            fixed &= n.spec
        else:
            movable.append(n)
    if not movable or choose(fixed, releases, ranks) is None:
        return []
    out = [n.by for n in movable if choose(fixed & n.spec, releases, ranks) is None]
    return sorted(set(out)) or [movable[-1].by]


def resolve(roots: Sequence[str], device: Mapping[str, Version], index: Any,
            overrides: Iterable[str] = (), rounds: int = 200) -> Resolution:
    """Walks until no choice changes: each round re-chooses every
    distribution not taken from the device against all the specifiers the
    previous walk saw; when nothing fits one, the versions of the askers
    that conflict (_culprits) are banned and the walk starts again. Raises
    ResolveError when nothing fits and no asker can move, or the choices
    do not settle."""
    over = {canonical(o) for o in overrides}
    bad = sorted(o for o in over if protected(o))
    if bad:
        raise ResolveError(f"--override {', '.join(bad)}: the torch family, triton and "
                           "nvidia-* are never replaced on the device")
    ranks = supported_tags()
    pins: Dict[str, Version] = {}
    bans: Dict[str, Set[Version]] = {}
    for _ in range(rounds):
        w = walk(roots, device, index, pins, over, ranks, bans)
        if not _settle(w, device, over, index, ranks, pins, bans):
            return _finish(w, device, over)
    raise ResolveError(f"the choices did not settle in {rounds} rounds: {pins}")


def _settle(w: Walk, device: Mapping[str, Version], over: Set[str], index: Any,
            ranks: Mapping[tags.Tag, int], pins: Dict[str, Version],
            bans: Dict[str, Set[Version]]) -> bool:
    """Re-chooses every distribution of the walk against all its needs;
    updates `pins` (and `bans` on a conflict). True if anything changed."""
    for name, needs in sorted(w.needs.items()):
        if name in device and name not in over:
            continue
        c = choose(combined(needs) & banned(bans, name), index.releases(name), ranks)
        if c is None:
            culprits = _culprits(name, w, device, over, index, ranks, bans)
            if not culprits:
                raise ResolveError(f"{name}: no version with a file the device can "
                                   f"install satisfies all of: {_describe(needs)}")
            for p in culprits:
                bans.setdefault(p, set()).add(w.used[p])
                pins.pop(p, None)
            return True
    if _fit_device(w, device, over, index, ranks, bans):
        return True
    changed = False
    for name, needs in sorted(w.needs.items()):
        if name in device and name not in over:
            continue
        c = choose(combined(needs) & banned(bans, name), index.releases(name), ranks)
        assert c is not None
        if w.used.get(name) != c.version:
            pins[name] = c.version
            changed = True
    return changed


def _fixed(name: str, w: Walk, device: Mapping[str, Version], over: Set[str],
           index: Any, bans: Mapping[str, Set[Version]]) -> bool:
    """The command line (""), a distribution kept from the device, or one
    its needs allow a single version of: its requirements cannot move."""
    if not name or (name in device and name not in over):
        return True
    spec = combined(w.needs[name]) & banned(bans, name)
    return len(list(spec.filter(index.releases(name).keys()))) == 1


def _fit_device(w: Walk, device: Mapping[str, Version], over: Set[str], index: Any,
                ranks: Mapping[tags.Tag, int], bans: Dict[str, Set[Version]],
                tries: int = 40) -> bool:
    """Where a movable distribution asks for another version of one the
    device keeps, moves it to its newest version (of at most `tries` older
    ones) whose requirements the device's versions meet, by banning the
    newer ones; when there is none the conflict stays (reported). True if
    anything was banned."""
    for name, needs in sorted(w.needs.items()):
        if name not in device or name in over:
            continue
        for n in needs:
            a = n.by
            if n.spec.contains(device[name], prereleases=True) or \
                    _fixed(a, w, device, over, index, bans):
                continue
            releases = index.releases(a)
            spec = combined(w.needs[a]) & banned(bans, a)
            newer: List[Version] = []
            for v in sorted(spec.filter(releases.keys()), reverse=True)[:tries]:
                c = choose(SpecifierSet(f"=={v}"), releases, ranks)
                if c is None:
                    continue
                reqs = applicable(index.requires(c.file), w.extras.get(a, ()),
                                  where=c.file.filename)
                if all(canonical(r.name) not in device or canonical(r.name) in over
                       or r.specifier.contains(device[canonical(r.name)],
                                               prereleases=True) for r in reqs):
                    if newer:
                        bans.setdefault(a, set()).update(newer)
                        return True
                    break
                newer.append(v)
    return False


def _finish(w: Walk, device: Mapping[str, Version], over: Set[str]) -> Resolution:
    present: Dict[str, Version] = {}
    conflicts: List[Conflict] = []
    for name, needs in sorted(w.needs.items()):
        if name not in device:
            continue
        v = device[name]
        unmet = [n for n in needs if not n.spec.contains(v, prereleases=True)]
        if unmet:
            conflicts.append(Conflict(name, v, unmet, name in over))
        if name not in over:
            present[name] = v
    return Resolution(dict(sorted(w.choices.items())), present, conflicts,
                      w.needs, w.edges)


# ---------------------------------------------------------------------------
# The lock file.


@dataclass(frozen=True)
class LockEntry:
    name: str
    version: str
    filename: str
    size: int
    sha256: str
    core: bool

    @property
    def sdist(self) -> bool:
        return not self.filename.endswith(".whl")


def lock_entries(res: Resolution, core: Set[str]) -> List[LockEntry]:
    return [LockEntry(n, str(c.version), c.file.filename, c.file.size,
                      c.file.sha256, n in core) for n, c in res.picks.items()]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def conflict_lines(res: Resolution, kept: Optional[Set[str]] = None) -> List[str]:
    """One line per conflict; with `kept` (the trimmed set's reachable
    names), those only the full set meets say so."""
    out = []
    for c in res.conflicts:
        fate = "replaced (--override)" if c.overridden else "the device's version kept"
        line = f"{c.name} {c.device} on the device: {_describe(c.unmet)}; {fate}"
        if kept is not None and not any(not n.by or n.by in kept for n in c.unmet):
            line += " (full set only)"
        out.append(line)
    return out


def write_lock(path: Path, entries: Sequence[LockEntry], res: Resolution,
               root: str, trim: Sequence[str], overrides: Sequence[str]) -> None:
    full = sum(e.size for e in entries)
    core = [e for e in entries if e.core]
    head = [
        f"# {root} for the GPU machine: written by `lab/tools/vllm_stage.py resolve`,",
        f"# do not edit. Target: CPython {PYTHON}, Linux {MACHINE}, manylinux up to "
        f"glibc 2.{GLIBC_MINOR};",
        f"# against {FREEZE.relative_to(ROOT)} ({len(res.present)} of its "
        "distributions are used as they are).",
        f"# Overrides: {', '.join(overrides) or 'none'}.",
        f"# Trimmed set (`core`) leaves out: {', '.join(trim) or 'nothing'}.",
        f"# full: {len(entries)} distributions, {_mb(full)}; core: {len(core)}, "
        f"{_mb(sum(e.size for e in core))}.",
    ]
    kept = res.reachable([root], trim)
    head += [f"# conflict: {line}" for line in conflict_lines(res, kept)]
    head += [f"# sdist (no installable wheel): {e.name}=={e.version}"
             for e in entries if e.sdist]
    head.append("# name==version  file  size  sha256  set (core: both sets; full: full only)")
    body = [f"{e.name}=={e.version} {e.filename} {e.size} {e.sha256} "
            f"{'core' if e.core else 'full'}" for e in entries]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head + body) + "\n")


def read_lock(path: Path) -> List[LockEntry]:
    out = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split()
        name, sep, ver = cols[0].partition("==")
        if len(cols) != 5 or not sep or cols[4] not in ("core", "full"):
            raise ValueError(f"{path}:{no}: expected 'name==version file size sha256 "
                             f"core|full', got {line!r}")
        try:
            size = int(cols[2])
        except ValueError:
            raise ValueError(f"{path}:{no}: size {cols[2]!r} is not a number") from None
        out.append(LockEntry(name, ver, cols[1], size, cols[3], cols[4] == "core"))
    return out


# ---------------------------------------------------------------------------
# Download (here).


def pip_download_args(entries: Sequence[LockEntry], dest: Path) -> List[List[str]]:
    """pip download commands for the lock's wheels (the device's tags) and,
    apart, its sdists."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    wheels = [f"{e.name}=={e.version}" for e in entries if not e.sdist]
    sdists = [f"{e.name}=={e.version}" for e in entries if e.sdist]
    cmds = []
    if wheels:
        tag_args = ["--only-binary=:all:", "--implementation", "cp",
                    "--python-version", PYTHON.rsplit(".", 1)[0],
                    "--abi", "cp" + "".join(PYTHON.split(".")[:2]), "--abi", "abi3",
                    "--abi", "none"]
        for p in platform_tags():
            tag_args += ["--platform", p]
        cmds.append(base + tag_args + wheels)
    if sdists:
        cmds.append(base + ["--no-binary=:all:"] + sdists)
    return cmds


def download(lock: Path, dest: Path, trim: bool) -> int:
    entries = [e for e in read_lock(lock) if e.core or not trim]
    dest.mkdir(parents=True, exist_ok=True)
    pending = [e for e in entries if not (dest / e.filename).is_file()
            or sha256_of(dest / e.filename) != e.sha256]
    print(f"{len(entries)} files in the {'core' if trim else 'full'} set; "
          f"{len(entries) - len(pending)} already in {dest}, {len(pending)} to download")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        for cmd in pip_download_args(pending, Path(tmp)):
            if subprocess.run(cmd).returncode != 0:
                print("error: pip download failed (above)", file=sys.stderr)
                return 1
        got = sorted(os.listdir(tmp))
        for e in pending:
            p = Path(tmp) / e.filename
            if not p.is_file():
                print(f"error: pip did not fetch {e.filename} for {e.name}=={e.version} "
                      f"(it fetched: {', '.join(got) or 'nothing'})", file=sys.stderr)
                return 1
            digest = sha256_of(p)
            if digest != e.sha256:
                print(f"error: {e.filename}: sha256 {digest}, the lock says {e.sha256}",
                      file=sys.stderr)
                return 1
            shutil.move(str(p), dest / e.filename)
    size = sum(e.size for e in entries)
    print(f"{dest}: {len(entries)} files, {_mb(size)}, sha256 checked")
    return 0


# ---------------------------------------------------------------------------
# The command line.


def cmd_resolve(a: argparse.Namespace) -> int:
    root = f"vllm=={a.vllm}"
    trim = sorted(TRIM) if a.trim is None else [t for t in a.trim.split(",") if t]
    overrides = [o for o in a.override.split(",") if o]
    device = read_freeze(a.freeze)
    index = PyPI(a.cache, refresh=a.refresh)
    try:
        res = resolve([root], device, index, overrides)
    except ResolveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    core = res.core([root], trim)
    entries = lock_entries(res, core)
    write_lock(a.lock, entries, res, root, trim, overrides)
    full = sum(e.size for e in entries)
    kept = [e for e in entries if e.core]
    capacity = int(a.max_mib * MIB) - MANIFEST_ROOM
    calls = len(plan_pack({e.filename: e.size for e in entries}, capacity))
    calls_core = len(plan_pack({e.filename: e.size for e in kept}, capacity))
    print(f"{root}: {len(res.needs)} distributions in the closure; "
          f"{len(res.present)} on the device, {len(entries)} to install, {_mb(full)} "
          f"({calls} carries of {a.max_mib:g} MiB)")
    print(f"trimmed (without {len(trim)}: {', '.join(trim)}): {len(kept)} to install, "
          f"{_mb(sum(e.size for e in kept))} ({calls_core} carries)")
    for line in conflict_lines(res, res.reachable([root], trim)):
        print(f"conflict: {line}")
    for ent in entries:
        if ent.sdist:
            print(f"sdist (no installable wheel): {ent.name}=={ent.version} {ent.filename}")
    print(f"wrote {a.lock}")
    return 0


def cmd_download(a: argparse.Namespace) -> int:
    return download(a.lock, a.dir, a.trim)


def cmd_pack(a: argparse.Namespace) -> int:
    entries = [e for e in read_lock(a.lock) if e.core or not a.trim]
    try:
        carries = pack(a.dir, a.out, {e.filename: e.sha256 for e in entries}, a.max_mib)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    total = sum(e.size for e in entries)
    print(f"{len(carries)} carries of at most {a.max_mib:g} MiB in {a.out} "
          f"({len(entries)} files, {_mb(total)}); on the device, one call each:")
    for k, c in enumerate(carries, 1):
        rel = os.path.relpath(c, ROOT) if c.resolve().is_relative_to(ROOT) else str(c)
        flag = "--complete " if k == len(carries) else ""
        size = sum(p.stat().st_size for p in c.iterdir()) / MIB
        print(f"  run(command=\"python3 lab/tools/vllm_carry.py install {flag}{rel}\", "
              f"carry=[\"{rel}\"])  # {size:.1f} MiB")
    print(f"then: PYTHONPATH={TARGET} python3 -c \"import vllm; print(vllm.__version__)\"")
    return 0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Stage vLLM and its missing dependencies on the GPU machine "
        "(no network): resolve and download here, pack into carry dirs, install there.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resolve", help="write the lock of what the device lacks")
    r.add_argument("--vllm", default=VLLM_VERSION)
    r.add_argument("--freeze", type=Path, default=FREEZE, help="the device's pip freeze")
    r.add_argument("--lock", type=Path, default=LOCK)
    r.add_argument("--override", default="", help="comma list: replace the device's "
                   "version of these on a conflict (never torch*, triton, nvidia-*)")
    r.add_argument("--trim", default=None, help="comma list of what the trimmed set "
                   f"leaves out (default: {','.join(sorted(TRIM))})")
    r.add_argument("--max-mib", type=float, default=54.0)
    r.add_argument("--cache", type=Path, default=CACHE)
    r.add_argument("--refresh", action="store_true", help="fetch the index's JSON again")
    r.set_defaults(func=cmd_resolve)
    d = sub.add_parser("download", help="download the lock's files (sha256 checked)")
    d.add_argument("dir", nargs="?", type=Path, default=WHEELS)
    d.add_argument("--lock", type=Path, default=LOCK)
    d.add_argument("--trim", action="store_true", help="the core set only")
    d.set_defaults(func=cmd_download)
    p = sub.add_parser("pack", help="pack DIR's files of the lock into carry dirs")
    p.add_argument("dir", nargs="?", type=Path, default=WHEELS)
    p.add_argument("out", nargs="?", type=Path, default=CARRIES)
    p.add_argument("--lock", type=Path, default=LOCK)
    p.add_argument("--trim", action="store_true", help="the core set only")
    p.add_argument("--max-mib", type=float, default=54.0,
                   help="per carry (a call carries 64 MiB with the repository)")
    p.set_defaults(func=cmd_pack)
    add_install_parser(sub)  # vllm_carry.py's own
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    rc: int = a.func(a)
    return rc


if __name__ == "__main__":
    sys.exit(main())
