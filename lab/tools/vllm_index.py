"""The package index for lab/tools/vllm_stage.py's resolver: releases and
files from PyPI's JSON API (cached), each chosen wheel's requirements read
from its METADATA by HTTP range requests, and the choice of a version and
file the device can install.

    python lab/tools/vllm_index.py NAME [--version V]

lists NAME's releases on the index (files, sizes), and with --version that
release's files and the requirements its first wheel declares."""

from __future__ import annotations

import argparse
import email.parser
import io
import json
import os
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from packaging import tags
from packaging.specifiers import SpecifierSet
from packaging.utils import (InvalidWheelFilename, canonicalize_name,
                             parse_wheel_filename)
from packaging.version import InvalidVersion, Version

PYPI = "https://pypi.org/pypi"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "vflow-vllm-stage"
# The device's Python (CPython 3.12.3).
PYTHON = "3.12.3"


def canonical(name: str) -> str:
    return canonicalize_name(name)


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




def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="A distribution's releases on the index, and a "
        "release's requirements (as vllm_stage.py resolve reads them).")
    ap.add_argument("name")
    ap.add_argument("--version", help="one release: its files and "
                    "requirements")
    a = ap.parse_args(argv)
    index = PyPI()
    releases = index.releases(a.name)
    if a.version is None:
        for v in sorted(releases):
            files = releases[v]
            print(f"{v}: {len(files)} files, "
                  f"{sum(f.size for f in files) / (1 << 20):.1f} MiB")
        return 0
    chosen = releases.get(Version(a.version))
    if not chosen:
        print(f"{a.name} {a.version}: no such release on the index")
        return 1
    for f in chosen:
        print(f"{f.filename} {f.size} {f.sha256}")
    wheel = next((f for f in chosen if f.is_wheel), None)
    if wheel is not None:
        for r in index.requires(wheel):
            print(f"requires {r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
