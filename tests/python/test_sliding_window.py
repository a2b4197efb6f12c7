"""Sliding-window attention (Mistral's and Mixtral's sliding_window) in the
CPU engine, against tiny_model's float64 reference (transformers'
sliding-window causal mask: a row sees its last `sliding_window` positions):
greedy tokens equal for prompts shorter and longer than the window, alone
and batched, a Mixtral with a window too; the GPU session refuses windows."""

from __future__ import annotations

import pathlib
from typing import Any, Dict, List

import numpy as np
import pytest

from gpu_common import OTHER_DEVICES, follows_reference
import model_specs
from tiny_model import Reference, write_models

vflow = pytest.importorskip("vflow")

N_NEW = 16
MIN_MARGIN = 1e-3
MODELS = model_specs.WINDOW


def prompt(length: int, salt: int) -> List[int]:
    rng = np.random.default_rng(3000 + 7919 * salt + length)
    return [int(t) for t in rng.integers(3, 64, length)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    return write_models(tmp_path_factory.mktemp("window"), MODELS)


@pytest.mark.parametrize("key", list(MODELS))
def test_greedy_matches_the_windowed_reference(key: str,
                                               models: Dict[str, Any]) -> None:
    path, ref = models[key]
    prompts = [prompt(n, 0) for n in (3, 11, 30, 57)]
    want = []
    for p in prompts:
        tokens, margins = ref.greedy_with_margins(p, N_NEW)
        assert min(margins) > MIN_MARGIN, f"test setup: {key} {p}"
        want.append(tokens)
    # The window matters: without it the reference parts from itself.
    full = Reference(ref.w, {**ref.config, "sliding_window": None})
    assert any(full.greedy(p, N_NEW) != w for p, w in zip(prompts, want))
    engine = vflow.LLM(str(path), kv_dtype="f32", device="cpu",
                       block_size=16)
    params = vflow.SamplingParams(max_tokens=N_NEW, temperature=0.0,
                                  ignore_eos=True)
    for p, w in zip(prompts, want):
        (out,) = engine.generate([p], params)
        assert [int(t) for t in out.token_ids] == w
    outs = engine.generate(prompts, params)
    assert [[int(t) for t in o.token_ids] for o in outs] == want


# The GPU's attention takes head dims of 64, 128 and 256.
GPU_MODELS: Dict[str, Dict[str, Any]] = {
    "mistral": dict(arch="mistral", hidden=128, heads=2, kv_heads=1,
                    seed=23, sliding_window=12),
    "mistral-long-window": dict(arch="mistral", hidden=128, heads=2,
                                kv_heads=1, seed=24, sliding_window=45),
}


@pytest.mark.skipif(not OTHER_DEVICES,
                    reason="no device but the CPU in VFLOW_TEST_DEVICES")
@pytest.mark.parametrize("key", list(GPU_MODELS))
def test_the_gpu_attends_the_window(key: str,
                                    tmp_path: pathlib.Path) -> None:
    """Decode and prefill on the GPU mask every key before a row's window
    (windows starting inside blocks and chunks; prompts shorter and far
    longer than the window), against the windowed float64 reference."""
    path, ref = write_models(tmp_path, {key: GPU_MODELS[key]})[key]
    prompts = [prompt(n, 4) for n in (3, 12, 40, 150)]
    for device in OTHER_DEVICES:
        engine = vflow.LLM(str(path), device=device, kv_dtype="bf16")
        follows_reference(engine, ref, prompts, N_NEW)
