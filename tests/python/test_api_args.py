"""Ints, tensors and paths at the Python API's entry points: a value the
C++ side cannot hold is a ValueError or TypeError naming the argument
(never pybind11's "Unable to cast ..." or "incompatible function
arguments"); an empty tensor is reported as empty with its shape; a path
with a NUL byte is refused instead of being read cut at the NUL."""

from __future__ import annotations

import pathlib
from typing import Any, Callable, List

import numpy as np
import pytest

import vflow
from vflow import _check, _vflow, torch_ops

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUEST = ROOT / "examples" / "quest.vflow"
H, G, D = 2, 3, 16
HUGE = [2**31, 2**63, 2**64, -(2**70)]


def names_it(call: Callable[[], Any], name: str) -> str:
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert message.startswith(name + ":"), message
    assert "Unable to cast" not in message
    assert "incompatible function arguments" not in message
    return message


@pytest.fixture(scope="module")
def prog() -> vflow.Program:
    return vflow.compile_file(QUEST, params={"block_size": 16})


def session(prog: vflow.Program, **kw: Any) -> vflow.Session:
    args: dict = dict(layers=2, kv_heads=H, group=G, head_dim=D, max_pages=8,
                      kv_dtype="f32", quiet=True)
    args.update(kw)
    return vflow.Session(prog, **args)


def test_the_helper() -> None:
    assert _check.integer("n", np.int64(5)) == 5
    assert "between 0 and 2147483647" in names_it(
        lambda: _check.integer("n", 2**31), "n")
    assert "expected an int, got bool" in names_it(
        lambda: _check.integer("n", True), "n")
    assert "expected an int, got float" in names_it(
        lambda: _check.integer("n", 2.0), "n")
    assert "must be >= 1" in names_it(
        lambda: _check.integer("n", 0, low=1, high=None), "n")
    assert _check.integers("xs", (1, 2)) == [1, 2]
    names_it(lambda: _check.integers("xs", [1, -1]), "xs[1]")
    names_it(lambda: _check.finite("x", float("nan")), "x")


def test_session_config_ints(prog: vflow.Program) -> None:
    for name in ("layers", "kv_heads", "group", "head_dim", "max_pages",
                 "max_batch", "max_sequences", "max_blocks_per_seq"):
        wide = name == "max_blocks_per_seq"  # an int64
        for bad in HUGE[wide:] + [-1, 1.5, "3", None]:
            names_it(lambda: session(prog, **{name: bad}), name)
    names_it(lambda: session(prog, scale=float("inf")), "scale")
    names_it(lambda: session(prog, device=3), "device")


def test_session_method_ints(prog: vflow.Program) -> None:
    s = session(prog)
    a = s.add_sequence()
    k = np.zeros((4, H, D), np.float32)
    s.append(0, a, k, k)
    for bad in HUGE[1:] + [-1, 1.5, "0", True]:  # ids are int64
        names_it(lambda: s.length(bad), "seq_id")
        names_it(lambda: s.fork(bad), "seq_id")
        names_it(lambda: s.release(bad), "seq_id")
        names_it(lambda: s.budget(bad), "seq_id")
        names_it(lambda: s.share_prefix(a, bad), "tokens")
        names_it(lambda: s.append(bad, a, k, k), "layer")
        names_it(lambda: s.append(0, [a, bad], k, k, lengths=[2, 2]),
                 "seq_ids[1]")
        names_it(lambda: s.append(0, [a], k, k, lengths=[bad]), "lengths[0]")
        names_it(lambda: s.decode(bad, a, np.zeros((1, H * G, D),
                                                   np.float32)), "layer")
    # A layer past the session's is named with the range.
    assert "between 0 and 1" in names_it(lambda: s.append(2, a, k, k),
                                         "layer")
    names_it(lambda: s.decode(0, [], np.zeros((0, H * G, D), np.float32)),
             "seq_ids")


def test_empty_tensors_are_reported_as_empty(prog: vflow.Program) -> None:
    s = session(prog)
    a = s.add_sequence()
    empty = np.zeros((0, H, D), np.float32)
    with pytest.raises(ValueError, match=r"^k is empty \(shape \[0, 2, 16\]"):
        s.append(0, a, empty, empty)
    k = np.zeros((4, H, D), np.float32)
    s.append(0, a, k, k)
    with pytest.raises(ValueError, match=r"^q is empty \(shape \[1, 0, 16\]\)"
                       r", expected \[1, 6, 16\]"):
        s.decode(0, a, np.zeros((1, 0, D), np.float32))
    with pytest.raises(ValueError, match=r"^out is empty \(shape \[0, 6, 16\]"):
        s.decode(0, a, np.zeros((1, H * G, D), np.float32),
                 out=np.zeros((0, H * G, D), np.float32))


def test_program_and_run_ints(prog: vflow.Program) -> None:
    for bad in HUGE + [0, "4"]:
        names_it(lambda: prog.ptx(group=bad), "group")
        names_it(lambda: prog.ptx(head_dim=bad), "head_dim")
    for name in ("seed", "seeds", "kv_heads", "group", "head_dim", "steps",
                 "needles"):
        for bad in [2**64, -1, "3"]:
            names_it(lambda: vflow.run(prog, **{name: bad}), name)
    names_it(lambda: vflow.run(prog, lengths=[100, 2**63]), "lengths[1]")
    names_it(lambda: vflow.run(prog, outlier=float("nan")), "outlier")


def test_torch_op_wrapper_ints(prog: vflow.Program) -> None:
    # Checked before torch is imported or the ops are built.
    for bad in HUGE + [0, -1, 2.0]:
        names_it(lambda: torch_ops.Flow(prog, group=bad, head_dim=D),
                 "group")
        names_it(lambda: torch_ops.Flow(prog, group=G, head_dim=bad),
                 "head_dim")
        w = object.__new__(torch_ops.PagedDecodeWrapper)
        names_it(lambda: w.plan(None, None, None, None, kv_heads=bad,
                                group=G, head_dim=D), "kv_heads")
        names_it(lambda: w.plan_dense(None, None, kv_heads=H, group=G,
                                      head_dim=D, page_size=bad), "page_size")


def test_eval_options(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tokenizers")
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from tiny_model import write_model, write_tokenizer

    write_model(tmp_path, vocab=64, head_dim=16, seed=1)
    write_tokenizer(tmp_path, 64)
    base: dict = dict(tasks=["passkey"], lengths=[96], n=1, device="cpu")
    for name, bad in [("n", 2**40), ("max_tokens", 0), ("max_batch", -1),
                      ("dense_layers", 2**64), ("seed", 2**60)]:
        names_it(lambda: vflow.evaluate(str(tmp_path),
                                        **{**base, name: bad}), name)
    names_it(lambda: vflow.evaluate(str(tmp_path), **{**base,
                                                      "lengths": [2**70]}),
             "lengths[0]")
    with pytest.raises(ValueError, match="sweep: budget: expected a "
                       "non-empty list"):
        vflow.evaluate(str(tmp_path), [str(QUEST)], sweep={"budget": 4},
                       **base)


def test_paths_with_a_nul_byte(prog: vflow.Program,
                               tmp_path: pathlib.Path) -> None:
    good = tmp_path / "p.vfa"
    prog.save(good)
    cut = str(good) + "\0junk"
    calls: List[Callable[[], Any]] = [
        lambda: vflow.load(cut), lambda: prog.save(cut),
        lambda: vflow.compile_file(str(QUEST) + "\0x")]
    for call in calls:
        with pytest.raises(ValueError, match="NUL byte"):
            call()
    # The extension refuses them too (the file before the NUL exists: it
    # used to be read instead).
    for call in [lambda: _vflow.load_artifact(cut),
                 lambda: _vflow.save_artifact(prog._artifact, cut),
                 lambda: _vflow.model_info(cut),
                 lambda: _vflow.ModelFile(cut)]:
        with pytest.raises(ValueError, match=r"path '.*p\.vfa\\0junk' holds "
                           "a NUL byte at offset"):
            call()
