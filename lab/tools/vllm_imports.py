#!/usr/bin/env python3
"""Which of vLLM's dependencies `vllm serve` imports at startup: the check
behind the trimmed set of lab/tools/vllm_stage.py (its TRIM).

  python lab/tools/vllm_imports.py [WHEELS]      (after vllm_stage.py download)

Unpacks the .py files of the lock's wheels (vLLM's and every dependency's)
and walks the module-level imports from the modules `vllm serve` of a
Llama/Qwen model on CUDA loads (SERVE_ROOTS), through vLLM and the
dependencies: an import inside a function (lazy), under `if TYPE_CHECKING`,
in a try block, or under an `if` that asks whether a package is installed
(`if has_flashinfer():`, `find_spec`) is not followed; any other `if` is
taken as true. Prints which of the lock's distributions that loads (each
must be in the trimmed set: status 1 if one is left out of it, with the
chain of imports that reaches it) and, for every distribution the trimmed
set leaves out, where vLLM imports it, with the kind of each site. A
static walk: what functions import when they run (lazy sites in modules
serve loads, marked *) is for the reader to judge, and the device run is
the final word."""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import os
import sys
import zipfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_stage import LOCK, WHEELS, read_lock  # noqa: E402

# The modules `vllm serve MODEL` of a Llama/Qwen model on CUDA loads: the
# CLI (main() imports every subcommand), the OpenAI server, the engine and
# its core process, the worker and both model runners, the models, the
# default loader, the attention backends vLLM picks on Hopper, the
# structured-output manager and `vllm.LLM`.
SERVE_ROOTS = (
    "vllm", "vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.cli.openai", "vllm.entrypoints.cli.launch",
    "vllm.entrypoints.cli.benchmark.main", "vllm.entrypoints.cli.collect_env",
    "vllm.entrypoints.cli.run_batch", "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.llm", "vllm.v1.engine.async_llm", "vllm.v1.engine.core",
    "vllm.v1.engine.core_client", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen2",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.triton_attn",
    "vllm.platforms.cuda", "vllm.v1.structured_output",
)


@dataclass(frozen=True)
class ImportSite:
    module: str   # the importing module
    line: int
    target: str   # the module imported (absolute)
    kind: str     # eager | guarded (try/except, if has_x()) | typing | lazy
    scope: str = ""  # the enclosing function of a lazy import


# An `if` whose test asks whether a package is installed.
_CHECKS_PACKAGE = re.compile(r"\bhas_\w+\(|\bfind_spec\(|_available\(|\bis_\w+_installed\(")


_MODULE_STRING = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:\w+)?$")


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, package: str):
        self.module, self.package = module, package
        self.sites: List[ImportSite] = []
        self.kind = ["eager"]
        self.scope: List[str] = []

    def _add(self, node: ast.AST, target: str) -> None:
        self.sites.append(ImportSite(self.module, getattr(node, "lineno", 0), target,
                                     self.kind[-1], ".".join(self.scope)))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def _nested(self, kind: str, nodes: Iterable[ast.AST]) -> None:
        lazier = {"eager": 0, "guarded": 1, "typing": 2, "lazy": 3}
        self.kind.append(max(kind, self.kind[-1], key=lazier.__getitem__))
        for n in nodes:
            self.visit(n)
        self.kind.pop()

    def visit_FunctionDef(self, node: Any) -> None:
        self.scope.append(node.name)
        self._nested("lazy", node.body)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._nested("lazy", [node.body])

    def visit_Try(self, node: Any) -> None:
        self._nested("guarded", node.body)
        for n in node.handlers + node.orelse + node.finalbody:
            self.visit(n)

    visit_TryStar = visit_Try

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            kind = "typing"
        elif _CHECKS_PACKAGE.search(test):
            kind = "guarded"  # `if has_flashinfer():`, `if find_spec("x"):`
        else:
            kind = "eager"    # other conditions: assumed true
        self._nested(kind, node.body)
        for n in node.orelse:
            self.visit(n)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("x.y") with a literal name.
        name = ast.unparse(node.func)
        if name.endswith("import_module") and node.args and isinstance(
                node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self._add(node, node.args[0].value)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        # "pkg.mod" / "pkg.mod:attr": a lazy-import table's entry (kind
        # "string"; never followed).
        if isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            self.sites.append(ImportSite(self.module, node.lineno,
                                         node.value.split(":")[0], "string",
                                         ".".join(self.scope)))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        self._add(node, base)
        for alias in node.names:
            self._add(node, f"{base}.{alias.name}")


class SourceTree:
    """Python sources under one or more roots (an unpacked wheel each):
    module name -> file, and each module's import sites."""

    def __init__(self, roots: Sequence[Path]):
        self.tops: Dict[str, List[Path]] = {}
        for r in roots:
            for p in sorted(r.iterdir()):
                top = p.name[:-3] if p.name.endswith(".py") else p.name
                self.tops.setdefault(top, []).append(r)
        self.memo: Dict[str, List[ImportSite]] = {}
        self.files: Dict[str, Optional[Path]] = {}

    def file(self, module: str) -> Optional[Path]:
        if module not in self.files:
            rel = Path(*module.split("."))
            found = None
            for r in self.tops.get(module.split(".")[0], ()):
                for p in (r / rel / "__init__.py", (r / rel).with_suffix(".py")):
                    if found is None and p.is_file():
                        found = p
            self.files[module] = found
        return self.files[module]

    def files_of(self, package: str) -> List[str]:
        """Every module of `package` (its .py files)."""
        out = []
        for r in self.tops.get(package, ()):
            for f in (r / package).rglob("*.py"):
                parts = f.relative_to(r).with_suffix("").parts
                out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        return out

    def sites(self, module: str) -> List[ImportSite]:
        if module not in self.memo:
            f = self.file(module)
            self.memo[module] = []
            if f is not None:
                package = module if f.name == "__init__.py" else module.rpartition(".")[0]
                v = _Imports(module, package)
                v.visit(ast.parse(f.read_bytes(), str(f)))
                self.memo[module] = v.sites
        return self.memo[module]

    def eager_closure(self, roots: Iterable[str]) -> Dict[str, List[str]]:
        """Every module that importing `roots` loads through eager imports
        (parent packages included), with the chain that reached it. A
        module whose source is not here (torch, ...) appears as its
        top-level name, not followed; `from X import name` of a non-module
        name counts as importing X."""
        chains: Dict[str, List[str]] = {}
        pending: Deque[Tuple[str, List[str]]] = deque((r, [r]) for r in roots)
        while pending:
            mod, chain = pending.popleft()
            if mod in chains:
                continue
            parts = mod.split(".")
            if self.file(mod) is None:
                if self.file(parts[0]) is None:
                    chains.setdefault(parts[0], chain)
                continue
            chains[mod] = chain
            pending.extend((".".join(parts[:i]), chain) for i in range(1, len(parts)))
            pending.extend((s.target, chain + [f"{s.target} ({mod}:{s.line})"])
                        for s in self.sites(mod) if s.kind == "eager")
        return chains


def pth_dirs(wheels: Iterable[Path]) -> List[str]:
    """Directories the wheels' .pth files put on sys.path, relative to
    site-packages: a plain path line, or in an `import` line
    os.path.join(PKG.__path__[0], 'SUB') (nvidia-cutlass-dsl's form)."""
    out: List[str] = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            for n in z.namelist():
                if "/" in n or not n.endswith(".pth"):
                    continue
                for line in z.read(n).decode("utf-8", "replace").splitlines():
                    line = line.strip()
                    m = re.search(r"(\w+)\.__path__\[0\],\s*['\"]([\w./-]+)['\"]", line)
                    if m:
                        out.append(f"{m.group(1)}/{m.group(2)}")
                    elif line and not line.startswith(("#", "import")):
                        out.append(line.rstrip("/"))
    return out


def wheel_modules(path: Path, extra: Sequence[str] = ()) -> Set[str]:
    """The modules a wheel installs: top-level packages and modules, the
    packages inside a namespace package (a directory without __init__.py:
    nvidia/, opentelemetry/), and those in `extra` directories (pth_dirs)."""
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith((".py", ".so"))
                 and not n.split("/")[0].endswith((".dist-info", ".data"))]
    inits = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    out: Set[str] = set()
    for n in names:
        parts = n.split("/")
        if len(parts) == 1:
            out.add(parts[0].split(".")[0])
        elif parts[0] in inits:
            out.add(parts[0])
        else:
            out.add(f"{parts[0]}.{parts[1].split('.')[0]}")
        for d in extra:
            if n.startswith(d + "/"):
                out.add(n[len(d) + 1:].split("/")[0].split(".")[0])
    return out


def owner(module: str, owners: Mapping[str, str]) -> Optional[str]:
    """The distribution whose module is the longest prefix of `module`."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        d = owners.get(".".join(parts[:i]))
        if d is not None:
            return d
    return None


def unpack_sources(wheels: Sequence[Path], dest: Path) -> None:
    """The .py files of each wheel under dest/NAME/ (once)."""
    for w in wheels:
        d = dest / w.name
        if d.is_dir():
            continue
        tmp = dest / (w.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(w) as z:
            for n in z.namelist():
                if n.endswith(".py") and ".dist-info/" not in n:
                    z.extract(n, tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, d)


def cmd_imports(a: argparse.Namespace) -> int:
    entries = read_lock(a.lock)
    wheels = [a.dir / e.filename for e in entries if not e.sdist]
    missing = [w.name for w in wheels if not w.is_file()]
    if missing:
        print(f"error: {a.dir}: missing {', '.join(missing[:3])}... (run download)",
              file=sys.stderr)
        return 1
    a.src.mkdir(parents=True, exist_ok=True)
    unpack_sources(wheels, a.src)
    extra = pth_dirs(wheels)
    owners: Dict[str, str] = {}
    for e, w in zip([e for e in entries if not e.sdist], wheels):
        owners.update((m, e.name) for m in wheel_modules(w, extra))
    full_only = {e.name for e in entries if not e.core}
    tree = SourceTree([a.src / w.name for w in wheels]
                      + [p for w in wheels for d in extra
                         if (p := a.src / w.name / d).is_dir()])
    chains = tree.eager_closure(SERVE_ROOTS)
    loaded: Dict[str, List[str]] = {}
    unknown: Dict[str, List[str]] = {}
    for mod, chain in chains.items():
        d = owner(mod, owners)
        if d is not None:
            loaded.setdefault(d, chain)
        elif mod and mod not in sys.stdlib_module_names and "." not in mod:
            unknown.setdefault(mod, chain)
    print(f"`vllm serve` (SERVE_ROOTS) loads {len(chains)} modules; from the lock's "
          f"distributions: {', '.join(sorted(loaded))}")
    print("other third-party modules it reaches (the device's, or imports behind a "
          f"condition the static walk takes as true): {', '.join(sorted(unknown))}")
    bad = sorted(set(loaded) & full_only)
    for d in bad:
        print(f"error: {d} is left out of the trimmed set but loaded at startup: "
              f"{' > '.join(loaded[d])}", file=sys.stderr)
    sites: Dict[str, Dict[Tuple[str, int], ImportSite]] = {}
    for mod in sorted(tree.files_of("vllm")):
        for st in tree.sites(mod):
            d = owner(st.target, owners)
            if d in full_only:
                sites.setdefault(d, {})[(st.module, st.line)] = st
    print("where vLLM imports what the trimmed set leaves out (kind: lazy = in a "
          "function, guarded = try/except or `if has_x()`, string = a lazy-import "
          "table's entry; * = in a module serve loads):")
    print(f"  no site (pulled in by the ones below): "
          f"{', '.join(sorted(d for d in full_only if d not in sites))}")
    for d in sorted(sites):
        found: List[ImportSite] = list(sites[d].values())
        kinds = sorted({st.kind for st in found})
        shown = sorted({f"{st.module}:{st.line} {st.kind}{' *' if st.module in chains else ''}"
                        for st in found}, key=lambda t: ("*" not in t, t))[:a.show]
        print(f"  {d}: {len(found)} sites ({', '.join(kinds) or 'none'})"
              + "".join(f"\n      {t}" for t in shown))
    return 1 if bad else 0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Check that `vllm serve` imports nothing the trimmed set of "
        "vllm_stage.py leaves out at startup, and list where vLLM imports those.")
    ap.add_argument("dir", nargs="?", type=Path, default=WHEELS,
                    help="the downloaded files (vllm_stage.py download)")
    ap.add_argument("--lock", type=Path, default=LOCK)
    ap.add_argument("--src", type=Path, default=Path("/tmp/vllm-imports-src"),
                    help="where the wheels' .py files are unpacked")
    ap.add_argument("--show", type=int, default=4, help="sites shown per distribution")
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    return cmd_imports(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
