"""Sliding-window attention (Mistral's and Mixtral's sliding_window) in the
CPU engine, against tiny_model's float64 reference (transformers'
sliding-window causal mask: a row sees its last `sliding_window` positions):
greedy tokens equal for prompts shorter and longer than the window, alone
and batched, a Mixtral with a window too; the GPU session refuses windows."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

from tiny_model import Reference, write_models

vflow = pytest.importorskip("vflow")

N_NEW = 16
MIN_MARGIN = 1e-3
MODELS: Dict[str, Dict[str, Any]] = {
    # A window of 12 tokens over blocks of 16: windows start inside blocks.
    "mistral": dict(arch="mistral", seed=21, sliding_window=12),
    "mixtral-window": dict(arch="mixtral", seed=22, experts=4,
                           experts_per_token=2, expert_intermediate=48,
                           sliding_window=20),
}


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


@pytest.mark.skipif(not (hasattr(vflow, "cuda_devices") and
                         vflow.cuda_devices() > 0), reason="no GPU")
def test_the_gpu_refuses_windows(models: Dict[str, Any]) -> None:
    with pytest.raises(Exception, match="sliding-window"):
        vflow.LLM(str(models["mistral"][0]), device="cuda")
