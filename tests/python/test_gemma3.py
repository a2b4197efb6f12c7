"""Gemma 3's text model (model_type gemma3_text) in the CPU engine, against
tiny_model's float64 reference written from the architecture: embeddings
times sqrt(hidden), norms scaling by 1 + w, q/k norms, the attention's and
the MLP's outputs normalized before the residual, GeGLU with tanh GELU, a
softmax scale of query_pre_attn_scalar^-1/2, and sliding-window layers with
their own RoPE base between full ones. Greedy tokens equal the reference
for prompts shorter and longer than the window, alone and batched, densely
and with a flow on the full layers; what the engine does not do is refused
with the reason."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List

import numpy as np
import pytest

from conftest import EXAMPLES
from gpu_common import OTHER_DEVICES, follows_reference
import model_specs
from tiny_model import Reference, write_models

vflow = pytest.importorskip("vflow")

N_NEW = 16
MIN_MARGIN = 1e-3
MODELS = model_specs.GEMMA3


def prompt(length: int, salt: int) -> List[int]:
    rng = np.random.default_rng(5000 + 7919 * salt + length)
    return [int(t) for t in rng.integers(3, 64, length)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    return write_models(tmp_path_factory.mktemp("gemma3"), MODELS)


def expected(ref: Reference, prompts: List[List[int]]) -> List[List[int]]:
    want = []
    for p in prompts:
        tokens, margins = ref.greedy_with_margins(p, N_NEW)
        assert min(margins) > MIN_MARGIN, f"test setup: {p}"
        want.append(tokens)
    return want


def test_greedy_matches_the_reference(models: Dict[str, Any]) -> None:
    path, ref = models["gemma3"]
    prompts = [prompt(n, 0) for n in (3, 11, 30, 57)]
    want = expected(ref, prompts)
    # The window matters: with every layer full the reference parts.
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


def test_a_flow_runs_on_the_full_layers(models: Dict[str, Any]) -> None:
    """Quest with a budget over every block selects them all: the same
    tokens as dense (the sliding layers stay dense either way)."""
    path, ref = models["gemma3"]
    prompts = [prompt(n, 1) for n in (40, 70)]
    want = expected(ref, prompts)
    engine = vflow.LLM(str(path), kv_dtype="f32", device="cpu",
                       block_size=16, flow=str(EXAMPLES / "quest.vflow"),
                       params={"budget": 64}, dense_layers=0)
    params = vflow.SamplingParams(max_tokens=N_NEW, temperature=0.0,
                                  ignore_eos=True)
    outs = engine.generate(prompts, params)
    assert [[int(t) for t in o.token_ids] for o in outs] == want


@pytest.mark.parametrize("edit,message", [
    ({"final_logit_softcapping": 30.0}, "logit soft-capping is not supported"),
    ({"hidden_activation": "gelu"}, "'gelu' is not supported for gemma3_text"),
    ({"layer_types": ["sliding_attention"]}, "has 1 entries for 3 layers"),
    ({"layer_types": ["sliding_attention", "chunked", "full_attention"]},
     "'chunked' is not sliding_attention or full_attention"),
    ({"model_type": "gemma3"}, "its text_config: gemma3_text"),
])
def test_what_gemma3_cannot_do_is_refused(models: Dict[str, Any],
                                          tmp_path: pathlib.Path,
                                          edit: Dict[str, Any],
                                          message: str) -> None:
    path, _ = models["gemma3"]
    bad = tmp_path / "m"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    config.update(edit)
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match=message):
        vflow.LLM(str(bad), kv_dtype="f32", device="cpu")


# Gemma 3 270M's layout with heads the GPU's attention takes (256, as the
# real model's): 4 query heads over 1 KV head, a window of 20.
GPU_MODEL: Dict[str, Any] = dict(
    arch="gemma3_text", seed=33, hidden=128, heads=4, kv_heads=1,
    head_dim=256, layers=3, sliding_window=20,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_theta=1.0e6, rope_local_theta=10000.0, query_pre_attn_scalar=256)


@pytest.mark.skipif(not OTHER_DEVICES,
                    reason="no device but the CPU in VFLOW_TEST_DEVICES")
def test_the_gpu_runs_gemma3(tmp_path: pathlib.Path) -> None:
    """On the GPU: embeddings times sqrt(hidden), norms by 1 + w, the four
    norms a layer, GeGLU, the sliding layers' window and RoPE base, against
    the float64 reference; with Quest on the full layer too (a budget
    covering every block: the same)."""
    path, ref = write_models(tmp_path, {"g": GPU_MODEL})["g"]
    prompts = [prompt(n, 6) for n in (2, 19, 70)]
    for device in OTHER_DEVICES:
        engine = vflow.LLM(str(path), device=device, kv_dtype="bf16")
        follows_reference(engine, ref, prompts, N_NEW)
        quest = vflow.LLM(str(path), device=device, kv_dtype="bf16",
                          flow=str(EXAMPLES / "quest.vflow"),
                          params={"budget": 1000}, dense_layers=0)
        follows_reference(quest, ref, prompts, N_NEW)
