"""Mixture-of-experts models (Qwen3-MoE and Mixtral layouts) in the CPU
engine, against tiny_model's float64 reference (written from transformers'
Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock, no vflow code): greedy
tokens equal, alone and batched, with and without a flow; bad configs are
errors naming the field. lab/tools/hf_tiny_check.py checks the same files
against transformers itself."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List

import numpy as np
import pytest

from gpu_common import OTHER_DEVICES, follows_reference
from tiny_model import write_models

vflow = pytest.importorskip("vflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = 64
N_NEW = 12
MIN_MARGIN = 1e-3

# Qwen3-MoE with a dense layer (mlp_only_layers) and head_dim != hidden /
# heads; Mixtral with Llama's attention and bf16 storage.
MOE_MODELS: Dict[str, Dict[str, Any]] = {
    "qwen3-moe": dict(arch="qwen3_moe", head_dim=32, seed=11, experts=8,
                      experts_per_token=2, dense_mlp_layers=(1,)),
    "mixtral": dict(arch="mixtral", seed=12, experts=4, experts_per_token=2,
                    expert_intermediate=48, dtype="bfloat16"),
}


def prompt(length: int, salt: int) -> List[int]:
    rng = np.random.default_rng(2000 + 7919 * salt + length)
    return [int(t) for t in rng.integers(3, VOCAB, length)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    return write_models(tmp_path_factory.mktemp("moe"), MOE_MODELS)


def greedy(key: str, models: Dict[str, Any], p: List[int]) -> List[int]:
    tokens, margins = models[key][1].greedy_with_margins(p, N_NEW)
    assert min(margins) > MIN_MARGIN, (
        f"test setup: {key}, prompt {p}: a top-2 margin of {min(margins):.2e}")
    return tokens


def params() -> Any:
    return vflow.SamplingParams(max_tokens=N_NEW, temperature=0.0,
                                ignore_eos=True)


@pytest.mark.parametrize("key", list(MOE_MODELS))
def test_greedy_matches_the_reference_alone_and_batched(
        key: str, models: Dict[str, Any]) -> None:
    prompts = [prompt(n, 0) for n in (1, 5, 17, 40)]
    want = [greedy(key, models, p) for p in prompts]
    engine = vflow.LLM(str(models[key][0]), kv_dtype="f32", device="cpu")
    for p, w in zip(prompts, want):
        (out,) = engine.generate([p], params())
        assert [int(t) for t in out.token_ids] == w
    # Batched: every step's rows go through the router together.
    outs = engine.generate(prompts, params())
    assert [[int(t) for t in o.token_ids] for o in outs] == want


def test_a_flow_runs_on_a_moe_model(models: Dict[str, Any]) -> None:
    # Quest with a budget covering every block attends like dense.
    p = prompt(40, 1)
    want = greedy("qwen3-moe", models, p)
    engine = vflow.LLM(str(models["qwen3-moe"][0]), kv_dtype="f32",
                       device="cpu", flow=str(ROOT / "examples/quest.vflow"),
                       params={"budget": 1000}, block_size=16)
    (out,) = engine.generate([p], params())
    assert [int(t) for t in out.token_ids] == want


@pytest.mark.parametrize("field, value, message", [
    ("num_experts_per_tok", 9, "expertsPerToken"),
    ("num_experts", 0, "numExperts must be in"),
    ("decoder_sparse_step", 0, "'decoder_sparse_step' must be >= 1"),
    ("moe_intermediate_size", 40, "experts.0.gate_proj.weight' has shape .32, 64., but the config implies .40, 64."),
])
def test_bad_moe_configs_name_the_field(models: Dict[str, Any],
                                        tmp_path: pathlib.Path, field: str,
                                        value: Any, message: str) -> None:
    src = models["qwen3-moe"][0]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match=message):
        vflow.LLM(str(tmp_path), kv_dtype="f32", device="cpu")


# The GPU's attention takes head dims of 64, 128 and 256: the same
# layouts with heads of 64.
GPU_MODELS: Dict[str, Dict[str, Any]] = {
    "qwen3-moe": dict(arch="qwen3_moe", hidden=128, heads=2, kv_heads=1,
                      head_dim=64, seed=13, experts=8, experts_per_token=2,
                      dense_mlp_layers=(1,)),
    "mixtral": dict(arch="mixtral", hidden=128, heads=2, kv_heads=1,
                    seed=14, experts=4, experts_per_token=2,
                    expert_intermediate=48, dtype="bfloat16"),
}


@pytest.fixture(scope="module")
def gpu_models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    return write_models(tmp_path_factory.mktemp("moe-gpu"), GPU_MODELS)


@pytest.mark.skipif(not OTHER_DEVICES,
                    reason="no device but the CPU in VFLOW_TEST_DEVICES")
@pytest.mark.parametrize("key", list(GPU_MODELS))
def test_the_gpu_routes_as_the_reference(key: str,
                                         gpu_models: Dict[str, Any]) -> None:
    """The GPU's experts (routing, expert lists and the expert kernels on
    the device, bf16 activations): a prompt's last logits within 3% of the
    float64 reference's spread; greedy tokens equal the reference's while
    its top-2 margin is above 0.2 (below it bf16 rounding may pick the
    other); a batch decodes as its requests do alone (a CUDA graph replays
    the expert kernels)."""
    prompts = [prompt(n, 3) for n in (1, 7, 23, 60)]
    for device in OTHER_DEVICES:
        engine = vflow.LLM(str(gpu_models[key][0]), device=device,
                           kv_dtype="bf16")
        follows_reference(engine, gpu_models[key][1], prompts, N_NEW)
