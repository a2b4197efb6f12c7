"""The vLLM backend's settings (vflow.vllm_backend.config): what a user
writes in --additional-config, and the errors that name the key. No vLLM
or torch needed; the backend itself is tested on the GPU machine
(docs/vllm.md)."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest

from vflow.vllm_backend.config import ConfigError, VLLM_VERSION, parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUEST = str(ROOT / "examples" / "quest.vflow")


def test_no_entry_is_none() -> None:
    assert parse(None) is None
    assert parse({}) is None
    assert parse({"other": 1}) is None


def test_an_entry_with_params() -> None:
    cfg = parse({"vflow": {"flow": QUEST, "params": {"budget": 8},
                           "dense_layers": 1}})
    assert cfg is not None
    assert (cfg.flow, cfg.params, cfg.dense_layers) == (QUEST, {"budget": 8},
                                                        1)
    prog = cfg.program()
    assert prog.flows == ["quest"]
    assert prog.params == {"budget": 8}


def test_relative_paths_start_at_base_dir() -> None:
    cfg = parse({"vflow": {"flow": "examples/quest.vflow"}},
                base_dir=str(ROOT))
    assert cfg is not None and cfg.flow == QUEST


@pytest.mark.parametrize("entry, where", [
    ([1], "additional_config: expected a JSON object"),
    ({"vflow": 1}, "additional_config.vflow: expected an object"),
    ({"vflow": {"flw": QUEST}}, "additional_config.vflow.flw: unknown key"),
    ({"vflow": {}}, "additional_config.vflow.flow: expected the path"),
    ({"vflow": {"flow": "/nonexistent/x.vflow"}},
     "additional_config.vflow.flow: no such file"),
    ({"vflow": {"flow": QUEST, "params": [1]}},
     "additional_config.vflow.params: expected an object"),
    ({"vflow": {"flow": QUEST, "params": {"budget": "8"}}},
     "additional_config.vflow.params.budget: expected a number"),
    ({"vflow": {"flow": QUEST, "params": {"budget": True}}},
     "additional_config.vflow.params.budget: expected a number"),
    ({"vflow": {"flow": QUEST, "params": {"budget": float("nan")}}},
     "additional_config.vflow.params.budget: must be finite"),
    ({"vflow": {"flow": QUEST, "dense_layers": -1}},
     "additional_config.vflow.dense_layers: expected a whole number"),
    ({"vflow": {"flow": QUEST, "dense_layers": 1.5}},
     "additional_config.vflow.dense_layers: expected a whole number"),
    ({"vflow": {"flow": QUEST, "flow_name": 3}},
     "additional_config.vflow.flow_name: expected a string"),
])
def test_bad_entries_name_the_key(entry: Any, where: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(entry)
    assert where in str(e.value)


def test_program_errors_name_the_entry(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.vflow"
    bad.write_text("flow f { index { return topk(nosuch, 4); } }\n")
    for entry, text in (
            ({"flow": str(bad)}, "nosuch"),
            ({"flow": QUEST, "params": {"nosuch": 1}}, "nosuch"),
            ({"flow": QUEST, "flow_name": "other"},
             "'other' is not a flow of")):
        cfg = parse({"vflow": entry})
        assert cfg is not None
        with pytest.raises(ConfigError) as e:
            cfg.program()
        assert str(e.value).startswith("additional_config.vflow")
        assert text in str(e.value)


def test_register_without_vllm_does_nothing() -> None:
    """The entry point is safe to call where vLLM is absent (CI)."""
    if "vllm" in sys.modules or _importable("vllm"):
        pytest.skip("vLLM is installed here")
    from vflow.vllm_backend import register

    register()
    assert "vflow.vllm_backend.backend" not in sys.modules


def test_the_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="vllm.general_plugins")
             if e.name == "vflow"]
    assert [e.value for e in found] == ["vflow.vllm_backend:register"]
    assert VLLM_VERSION == "0.26.0"


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
