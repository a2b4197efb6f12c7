"""vflow inside vLLM: an attention backend that runs any .vflow program
(docs/vllm.md).

    pip install 'vflow[vllm]'
    vllm serve MODEL --attention-backend CUSTOM \\
        --additional-config '{"vflow": {"flow": "quest.vflow",
                                        "params": {"budget": 64}}}'

vLLM loads register() in each of its processes through the
`vllm.general_plugins` entry point. vLLM 0.26.0 has a fixed list of
backend names; third-party backends take the one named CUSTOM."""

from __future__ import annotations

import logging

from .config import VLLM_VERSION, ConfigError, VflowConfig, parse

__all__ = ["register", "VLLM_VERSION", "ConfigError", "VflowConfig", "parse"]

BACKEND = "vflow.vllm_backend.backend.VflowAttentionBackend"


def register() -> None:
    """vLLM's plugin hook: registers the backend as CUSTOM and installs the
    worker hooks (lifecycle.py). Idempotent. With another vLLM release it
    registers nothing and says why (its internals differ)."""
    log = logging.getLogger("vllm")
    try:
        import vllm
    except ImportError:
        return  # vLLM absent: nothing to register into
    if vllm.__version__ != VLLM_VERSION:
        log.warning("vflow: vLLM %s is not the supported %s; the vflow "
                    "attention backend is not registered", vllm.__version__,
                    VLLM_VERSION)
        return
    from vllm.v1.attention.backends.registry import (AttentionBackendEnum,
                                                     register_backend)

    from . import lifecycle

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)
    lifecycle.install()
