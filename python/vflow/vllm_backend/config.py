"""The vflow backend's settings, read from vLLM's additional config:

    --additional-config '{"vflow": {"flow": "quest.vflow",
                                    "params": {"budget": 64},
                                    "dense_layers": 2}}'

Plain data, no vLLM or torch: the front end (which never attends) and the
tests read it too. Every error names the key it is about."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

#: The vLLM release this adapter is written against (its backend API and the
#: Model Runner V2 internals it hooks change between releases).
VLLM_VERSION = "0.26.0"

_KEYS = ("flow", "flow_name", "params", "dense_layers")


class ConfigError(ValueError):
    """A bad `vflow` entry in vLLM's additional config."""


@dataclass(frozen=True)
class VflowConfig:
    """What the backend runs: a program (a .vflow source or a .vfa
    artifact), which of its flows, params over its defaults, and how many
    leading layers stay dense (None: vflow.EngineConfig's default)."""

    flow: str
    flow_name: Optional[str] = None
    params: Dict[str, float] = field(default_factory=dict)
    dense_layers: Optional[int] = None

    def program(self) -> Any:
        """The compiled program (vflow's compiler, or vflowc through
        VFLOW_VFLOWC where the package is runtime-only)."""
        from .._llm import _flow_program
        from .._program import CompileError

        try:
            prog = _flow_program(self.flow, self.params or None)
        except (CompileError, ValueError) as e:
            raise ConfigError(f"additional_config.vflow: {self.flow}: "
                              f"{str(e).strip()}") from None
        assert prog is not None
        if self.flow_name is not None and self.flow_name not in prog.flows:
            raise ConfigError(
                f"additional_config.vflow.flow_name: {self.flow_name!r} is "
                f"not a flow of {self.flow} (it has {', '.join(prog.flows)})")
        return prog


def parse(additional_config: Any, *,
          base_dir: Optional[str] = None) -> Optional[VflowConfig]:
    """The `vflow` entry of vLLM's additional_config, or None when there is
    none. A relative flow path is taken from `base_dir` (default: the
    working directory, as vLLM's own paths)."""
    if additional_config is None:
        return None
    if not isinstance(additional_config, Mapping):
        raise ConfigError("additional_config: expected a JSON object, got "
                          f"{type(additional_config).__name__}")
    entry = additional_config.get("vflow")
    if entry is None:
        return None
    where = "additional_config.vflow"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected an object with a 'flow' key, "
                          f"got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: "
                          f"{', '.join(_KEYS)})")
    flow = entry.get("flow")
    if not isinstance(flow, str) or not flow:
        raise ConfigError(f"{where}.flow: expected the path of a .vflow or "
                          ".vfa file")
    path = os.path.join(base_dir or os.getcwd(), os.path.expanduser(flow))
    if not os.path.isfile(path):
        raise ConfigError(f"{where}.flow: no such file: {path}")
    flow_name = entry.get("flow_name")
    if flow_name is not None and not isinstance(flow_name, str):
        raise ConfigError(f"{where}.flow_name: expected a string")
    return VflowConfig(flow=path, flow_name=flow_name,
                       params=_params(entry.get("params"), f"{where}.params"),
                       dense_layers=_dense_layers(entry.get("dense_layers"),
                                                  f"{where}.dense_layers"))


def _params(value: Any, where: str) -> Dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected an object of name: number")
    out: Dict[str, float] = {}
    for name, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}.{name}: expected a number, got "
                              f"{type(v).__name__}")
        if not math.isfinite(v):
            raise ConfigError(f"{where}.{name}: must be finite")
        out[str(name)] = v
    return out


def _dense_layers(value: Any, where: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a whole number >= 0")
    return value
