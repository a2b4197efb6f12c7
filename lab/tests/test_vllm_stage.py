"""lab/tools/vllm_stage.py without the network: marker evaluation for the
GPU machine, the version choice, the lock file, the carry packing and the
device-side install (split, join, sha256 checks, pip --target, errors that
name the missing part); lab/tools/hf_model.py's check of what vLLM's
loaders read and the files it adds to a random model (its GGUF conversion
needs torch and transformers: lab/README.md records its check).

The version choice is tested on releases given as data (`releases()`
below): that is the pure function `choose`, whose input is what the
index's JSON says about a project. The resolver's walk over a real index
is checked by the committed lock (lab/tools/vllm-data/lock-0.26.0.txt), not
here. The install runs the real pip on small wheels built here."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab" / "tools"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
import hf_model  # noqa: E402
import vllm_stage as vs  # noqa: E402
from tiny_model import write_model, write_safetensors  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

RANKS = vs.supported_tags()


# ---------------------------------------------------------------------------
# Markers and tags of the device (CPython 3.12.3, Linux x86_64, glibc 2.39).


def names(reqs: Sequence[object]) -> List[str]:
    return [getattr(r, "name") for r in reqs]


def test_markers_are_evaluated_for_the_device_not_this_machine() -> None:
    texts = ['a; python_version >= "3.12"', 'b; python_version < "3.12"',
             'c; sys_platform == "win32"', 'd; platform_machine == "x86_64"',
             'e; platform_system == "Linux" and implementation_name == "cpython"',
             'f; python_full_version == "3.12.3"', 'g; extra == "video"',
             'h; extra == "video" and sys_platform == "linux"', "i"]
    # This machine runs Python 3.11: a, f would be false here.
    assert names(vs.applicable(texts, [])) == ["a", "d", "e", "f", "i"]
    # An extra adds only its own requirements.
    assert names(vs.applicable(texts, ["video"], base=False)) == ["g", "h"]
    assert names(vs.applicable(texts, ["audio"], base=False)) == []


def test_a_bad_requirement_names_the_file() -> None:
    with pytest.raises(vs.ResolveError, match=r"x-1\.whl: Requires-Dist 'a b c'"):
        vs.applicable(["a b c"], [], where="x-1.whl")


def test_platform_tags_run_from_glibc_2_39_down_with_legacy_aliases() -> None:
    tags = vs.platform_tags()
    assert tags[0] == "manylinux_2_39_x86_64"
    assert "manylinux_2_40_x86_64" not in tags
    assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
    assert tags[-1] == "linux_x86_64"


# ---------------------------------------------------------------------------
# The version choice, on releases given as data.


def f(name: str, yanked: bool = False, requires_python: Optional[str] = None) -> vs.IndexFile:
    return vs.IndexFile(name, "https://example.invalid/" + name, 100,
                        hashlib.sha256(name.encode()).hexdigest(), requires_python, yanked)


def releases(table: Dict[str, List[vs.IndexFile]]) -> vs.Releases:
    return {Version(v): files for v, files in table.items()}


def pick(spec: str, table: Dict[str, List[vs.IndexFile]]) -> Tuple[str, str, bool]:
    c = vs.choose(SpecifierSet(spec), releases(table), RANKS)
    assert c is not None
    return str(c.version), c.file.filename, c.sdist


def test_choose_takes_the_newest_version_with_a_wheel_the_device_can_install() -> None:
    table = {
        "1.0": [f("p-1.0-py3-none-any.whl")],
        "1.1": [f("p-1.1-cp312-cp312-manylinux_2_17_x86_64.whl")],
        # Newer, but no wheel the device takes: Windows, Python 3.11,
        # aarch64, a glibc newer than 2.39, and an sdist.
        "1.2": [f("p-1.2-cp312-cp312-win_amd64.whl"),
                f("p-1.2-cp311-cp311-manylinux_2_17_x86_64.whl"),
                f("p-1.2-cp312-cp312-manylinux_2_17_aarch64.whl"),
                f("p-1.2-cp312-cp312-manylinux_2_40_x86_64.whl"),
                f("p-1.2.tar.gz")],
    }
    assert pick("", table) == ("1.1", "p-1.1-cp312-cp312-manylinux_2_17_x86_64.whl", False)
    assert pick("<1.1", table) == ("1.0", "p-1.0-py3-none-any.whl", False)


def test_choose_prefers_the_most_specific_wheel_of_a_version() -> None:
    table = {"2.0": [f("p-2.0-py3-none-any.whl"),
                     f("p-2.0-cp38-abi3-manylinux_2_28_x86_64.whl"),
                     f("p-2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")]}
    assert pick("", table)[1] == \
        "p-2.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    del table["2.0"][2]
    assert pick("", table)[1] == "p-2.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def test_choose_skips_yanked_files_unless_pinned_and_honours_requires_python() -> None:
    table = {"1.0": [f("p-1.0-py3-none-any.whl")],
             "1.1": [f("p-1.1-py3-none-any.whl", yanked=True)],
             "1.2": [f("p-1.2-py3-none-any.whl", requires_python=">=3.13")],
             "1.3": [f("p-1.3-py3-none-any.whl", requires_python="<3.12")]}
    assert pick("", table)[0] == "1.0"
    assert pick("==1.1", table)[0] == "1.1"          # PEP 592: == names it
    assert vs.choose(SpecifierSet("==1.2"), releases(table), RANKS) is None


def test_choose_falls_back_to_an_sdist_only_when_no_allowed_version_has_a_wheel() -> None:
    table = {"0.9": [f("p-0.9-py3-none-any.whl")],
             "1.0": [f("p-1.0.tar.gz")]}
    assert pick("", table) == ("0.9", "p-0.9-py3-none-any.whl", False)
    assert pick(">=1.0", table) == ("1.0", "p-1.0.tar.gz", True)
    assert vs.choose(SpecifierSet(">=2"), releases(table), RANKS) is None


def test_choose_takes_prereleases_only_when_asked_or_alone() -> None:
    table = {"1.0": [f("p-1.0-py3-none-any.whl")],
             "2.0rc1": [f("p-2.0rc1-py3-none-any.whl")]}
    assert pick("", table)[0] == "1.0"
    assert pick(">=2.0rc1", table)[0] == "2.0rc1"
    assert pick(">1.0", table)[0] == "2.0rc1"        # no final release fits


def test_resolution_core_drops_trimmed_names_and_what_only_they_need() -> None:
    choice = vs.Choice(Version("1"), f("x-1-py3-none-any.whl"))
    res = vs.Resolution(
        picks={n: choice for n in ("vllm", "a", "big", "big-dep", "shared")},
        present={}, conflicts=[], needs={},
        edges={"vllm": {"a", "big"}, "big": {"big-dep", "shared"}, "a": {"shared"}})
    assert res.core(["vllm==0.26.0"], []) == {"vllm", "a", "big", "big-dep", "shared"}
    assert res.core(["vllm==0.26.0"], ["Big"]) == {"vllm", "a", "shared"}


# ---------------------------------------------------------------------------
# Files: the freeze and the lock.


def test_read_freeze_names_the_bad_line(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "freeze.txt"
    p.write_text("Jinja2==3.1.6\ntorch==2.11.0\n-e git+https://x/y\n")
    with pytest.raises(ValueError, match=r"freeze\.txt:3: expected name==version"):
        vs.read_freeze(p)
    p.write_text("Jinja2==3.1.6\n")
    assert vs.read_freeze(p) == {"jinja2": Version("3.1.6")}


def test_the_committed_freeze_and_lock_parse_and_agree() -> None:
    device = vs.read_freeze(vs.FREEZE)
    assert device["torch"] == Version("2.11.0")
    entries = vs.read_lock(vs.LOCK)
    by_name = {e.name: e for e in entries}
    assert by_name["vllm"].version == "0.26.0"
    assert by_name["vllm"].size == 303698761 and by_name["vllm"].core
    # Nothing the device has is installed again (no override in the lock),
    # the torch family and nvidia-* the device has are never replaced.
    assert not set(by_name) & set(device)
    assert all(not e.sdist for e in entries)


def test_read_lock_names_the_bad_line(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "lock.txt"
    p.write_text("# header\na==1 a-1-py3-none-any.whl 10 abc core\nb==1 b.whl ten abc full\n")
    with pytest.raises(ValueError, match=r"lock\.txt:3: size 'ten'"):
        vs.read_lock(p)


def test_protected_packages_cannot_be_overridden() -> None:
    with pytest.raises(vs.ResolveError, match="nvidia-nccl-cu13, torch"):
        vs.resolve(["vllm==0.26.0"], {}, None, overrides=["torch", "nvidia_nccl_cu13"])


# ---------------------------------------------------------------------------
# Pack and install.


def plan(sizes: Dict[str, int], cap: int) -> List[List[Tuple[str, int, int]]]:
    return [sorted((p.file, p.offset, p.length) for p in b) for b in vs.plan_pack(sizes, cap)]


def test_plan_pack_splits_large_files_and_fills_carries() -> None:
    bins = plan({"big.whl": 250, "a.whl": 60, "b.whl": 30, "c.whl": 10}, 100)
    # Largest first, each into the first carry with room.
    assert bins == [[("big.whl.part1", 0, 100)], [("big.whl.part2", 100, 100)],
                    [("a.whl", 0, 60), ("b.whl", 0, 30), ("c.whl", 0, 10)],
                    [("big.whl.part3", 200, 50)]]
    assert all(sum(n for _, _, n in b) <= 100 for b in bins)


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def make_wheel(directory: pathlib.Path, name: str, files: Dict[str, bytes]) -> pathlib.Path:
    """A real pure-Python wheel (METADATA, WHEEL, RECORD) that pip installs."""
    dist = f"{name}-1.0.dist-info"
    meta = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
            f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                             b"Tag: py3-none-any\n"}
    every = dict(files, **meta)
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in every.items())
    record += f"{dist}/RECORD,,\n"
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in every.items():
            z.writestr(n, d)
        z.writestr(f"{dist}/RECORD", record)
    return path


@pytest.fixture()
def packed(tmp_path: pathlib.Path) -> Tuple[pathlib.Path, Dict[str, str], List[pathlib.Path]]:
    """Three wheels packed at 0.3 MiB a carry: `big` (600 KB of random
    bytes, stored) is split in parts, the small ones share a carry."""
    src = tmp_path / "wheels"
    src.mkdir()
    paths = [
        make_wheel(src, "big", {"big/__init__.py": b"BLOB = 1\n",
                                "big/blob.bin": os.urandom(600_000)}),
        make_wheel(src, "small", {"small.py": b"VALUE = 42\n"}),
        make_wheel(src, "pthpkg", {"pthpkg.pth": b"pthpkg_extra\n",
                                   "pthpkg_extra/hidden.py": b"FOUND = True\n"}),
    ]
    files = {p.name: vs.sha256_of(p) for p in paths}
    carries = vs.pack(src, tmp_path / "out", files, max_mib=0.3)
    return tmp_path, files, carries


def run_install(tmp: pathlib.Path, dirs: Sequence[pathlib.Path],
                complete: bool = False) -> int:
    return int(vs.install(list(dirs), tmp / "stage", tmp / "lib", complete=complete))


def test_pack_then_install_one_carry_per_call(packed: Tuple[pathlib.Path, Dict[str, str],
                                                            List[pathlib.Path]],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    tmp, files, carries = packed
    assert len(carries) == 3
    for c in carries:
        assert sum(p.stat().st_size for p in c.iterdir()) <= 0.3 * vs.MIB
    manifest = vs.read_manifest(carries[0])
    big = manifest["wheels"]["big-1.0-py3-none-any.whl"]
    assert len(big["parts"]) == 3 and big["sha256"] == files["big-1.0-py3-none-any.whl"]
    # All but the last: staged, waiting (status 0), nothing installed.
    for c in carries[:-1]:
        assert run_install(tmp, [c]) == 0
    assert "waiting for carries" in capsys.readouterr().out
    assert not (tmp / "lib").exists()
    # The last joins the parts (sha256 of the whole wheel checked) and installs.
    assert run_install(tmp, [carries[-1]], complete=True) == 0
    out = capsys.readouterr().out
    assert "installed: use it with PYTHONPATH=" in out
    setid = manifest["set"]
    joined = tmp / "stage" / setid / "wheels" / "big-1.0-py3-none-any.whl"
    assert vs.sha256_of(joined) == files["big-1.0-py3-none-any.whl"]
    assert not list((tmp / "stage" / setid / "parts").iterdir())
    # The packages import from the target, the .pth one through the
    # sitecustomize.py that install writes (PYTHONPATH runs no .pth).
    env = dict(os.environ, PYTHONPATH=str(tmp / "lib"))
    proc = subprocess.run([sys.executable, "-c", "import big, small, hidden; "
                           "print(small.VALUE, len(open(big.__path__[0] + '/blob.bin', "
                           "'rb').read()), hidden.FOUND)"],
                          capture_output=True, text=True, env=env, cwd=str(tmp))
    assert proc.stdout.split() == ["42", "600000", "True"], proc.stderr
    # Again: nothing to copy, not installed twice.
    assert run_install(tmp, carries) == 0
    assert "already installed" in capsys.readouterr().out


def test_a_missing_carry_is_named_and_fails_the_last_call(
        packed: Tuple[pathlib.Path, Dict[str, str], List[pathlib.Path]],
        capsys: pytest.CaptureFixture[str]) -> None:
    tmp, _, carries = packed
    manifest = vs.read_manifest(carries[1])
    held = [e["file"] for e in manifest["files"]]
    rest = [c for c in carries if c != carries[1]]
    assert run_install(tmp, rest, complete=True) == 3
    out = capsys.readouterr().out
    assert f"waiting for carries 2 of {len(carries)}" in out
    for name in held:
        assert name in out
    assert not (tmp / "lib").exists()


def test_a_part_missing_from_its_carry_is_an_error_naming_it(
        packed: Tuple[pathlib.Path, Dict[str, str], List[pathlib.Path]]) -> None:
    tmp, _, carries = packed
    part = next(c / e["file"] for c in carries for e in vs.read_manifest(c)["files"]
                if e["parts"] > 1 and e["part"] == 2)
    part.unlink()
    with pytest.raises(vs.StageError, match=r"carry \d+ .*big-1\.0-py3-none-any\.whl\.part2 "
                       r"\(part 2/3 of big-1\.0-py3-none-any\.whl\) is listed in its "
                       r"manifest\.json but missing"):
        run_install(tmp, carries)


def test_a_corrupted_part_is_an_error_naming_it(
        packed: Tuple[pathlib.Path, Dict[str, str], List[pathlib.Path]]) -> None:
    tmp, _, carries = packed
    part = next(c / e["file"] for c in carries for e in vs.read_manifest(c)["files"]
                if e["file"].endswith(".part1"))
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(vs.StageError, match=r"big-1\.0-py3-none-any\.whl\.part1 .*sha256"):
        run_install(tmp, carries)


def test_carries_not_carried_or_of_two_packs_are_refused(
        packed: Tuple[pathlib.Path, Dict[str, str], List[pathlib.Path]]) -> None:
    tmp, files, carries = packed
    with pytest.raises(vs.StageError, match=r"out/9: no such directory \(was it carried\?"):
        run_install(tmp, [tmp / "out" / "9"])
    other = vs.pack(tmp / "wheels", tmp / "other",
                    {n: d for n, d in files.items() if n.startswith("small")}, 0.3)
    with pytest.raises(vs.StageError, match="carries of different packs"):
        run_install(tmp, [carries[0], other[0]])


def test_install_cli_exit_status(packed: Tuple[pathlib.Path, Dict[str, str],
                                               List[pathlib.Path]]) -> None:
    tmp, _, carries = packed
    args = ["install", "--stage", str(tmp / "stage"), "--target", str(tmp / "lib")]
    assert vs.main(args + [str(carries[0])]) == 0
    assert vs.main(args + ["--complete", str(carries[0])]) == 3
    assert vs.main(args + [str(tmp / "nowhere")]) == 2


def test_pack_refuses_an_out_dir_it_did_not_write(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "w"
    src.mkdir()
    w = make_wheel(src, "small", {"small.py": b"X = 1\n"})
    (tmp_path / "out" / "mine").mkdir(parents=True)
    with pytest.raises(vs.StageError, match="holds mine, not a carry"):
        vs.pack(src, tmp_path / "out", {w.name: vs.sha256_of(w)}, 1)
    with pytest.raises(vs.StageError, match=r"absent\.whl: missing"):
        vs.pack(src, tmp_path / "new", {"absent.whl": "0" * 64}, 1)


def test_remote_file_reads_a_zip_member_by_ranges() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("x-1.dist-info/METADATA", "Requires-Dist: a>=1\nRequires-Dist: b; extra == 'e'\n")
        z.writestr("x/big.bin", os.urandom(700_000))
    data = buf.getvalue()
    asked: List[Tuple[int, int]] = []

    def get(url: str, span: Tuple[int, int]) -> bytes:
        asked.append(span)
        return data[span[0]:span[1] + 1]

    with zipfile.ZipFile(vs._RemoteFile("u", len(data), get)) as z:
        text = z.read("x-1.dist-info/METADATA").decode()
    assert vs.parse_requires(text) == ["a>=1", "b; extra == 'e'"]
    assert sum(hi - lo + 1 for lo, hi in asked) < len(data)


# ---------------------------------------------------------------------------
# lab/tools/hf_model.py: what vLLM's loaders need (no torch needed here).


def test_finish_for_vllm_makes_a_model_dir_vllm_loads(tmp_path: pathlib.Path) -> None:
    from tokenizers import Tokenizer

    write_model(tmp_path, arch="qwen3", vocab=64, head_dim=16, dtype="bfloat16")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["ModelForCausalLM"]      # as engine_shapes.make_model
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    problems = hf_model.check(tmp_path)
    assert any("architectures ['ModelForCausalLM']" in p for p in problems), problems
    hf_model.finish_for_vllm(tmp_path, 64)
    assert hf_model.check(tmp_path) == []
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["dtype"] == "bfloat16"
    # BOS comes from the tokenizer itself (as vLLM tokenizes), once.
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.encode("w5 w17").ids == [1, 5, 17]
    assert tok.encode("w5 w17", add_special_tokens=False).ids == [5, 17]
    tconfig = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "message['content']" in tconfig["chat_template"]
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2}


def test_check_names_missing_extra_and_misshapen_tensors(tmp_path: pathlib.Path) -> None:
    write_model(tmp_path, arch="llama", vocab=64, layers=2, head_dim=16, tie=True)
    hf_model.finish_for_vllm(tmp_path, 64)
    assert hf_model.check(tmp_path) == []
    want = hf_model.expected_tensors(json.loads((tmp_path / "config.json").read_text()))
    tensors = {n: ("F32", list(s), bytes(4 * int(np.prod(s)))) for n, s in want.items()}
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["lm_head.weight"] = ("F32", [64, 64], bytes(4 * 64 * 64))   # tied: none
    tensors["model.norm.weight"] = ("F32", [63], bytes(4 * 63))
    write_safetensors(tmp_path / "model.safetensors", tensors)
    problems = hf_model.check(tmp_path)
    st = tmp_path / "model.safetensors"
    assert problems == [f"{st}: no model.layers.1.mlp.up_proj.weight",
                        f"{st}: lm_head.weight is not a weight of LlamaForCausalLM",
                        f"{st}: model.norm.weight has shape [63], the config says [64]"]
