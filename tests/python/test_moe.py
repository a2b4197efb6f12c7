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

import pytest

import model_checks
from gpu_common import OTHER_DEVICES, routed_model_follows
import model_specs
from tiny_model import write_models

vflow = pytest.importorskip("vflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = 64
N_NEW = 12

MOE_MODELS = model_specs.MOE


def prompt(length: int, salt: int) -> List[int]:
    return model_checks.prompt(length, salt, 2000, VOCAB)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    return write_models(tmp_path_factory.mktemp("moe"), MOE_MODELS)


@pytest.mark.parametrize("key", list(MOE_MODELS))
def test_greedy_matches_the_reference_alone_and_batched(
        key: str, models: Dict[str, Any]) -> None:
    # Batched, every step's rows go through the router together.
    engine = vflow.LLM(str(models[key][0]), kv_dtype="f32", device="cpu")
    model_checks.matches_reference(engine, models[key][1],
                                   [prompt(n, 0) for n in (1, 5, 17, 40)],
                                   N_NEW)


def test_a_flow_runs_on_a_moe_model(models: Dict[str, Any]) -> None:
    # Quest with a budget covering every block attends like dense.
    p = prompt(40, 1)
    want = model_checks.reference_greedy(models["qwen3-moe"][1], p, N_NEW)
    engine = vflow.LLM(str(models["qwen3-moe"][0]), kv_dtype="f32",
                       device="cpu", flow=str(ROOT / "examples/quest.vflow"),
                       params={"budget": 1000}, block_size=16)
    (out,) = engine.generate([p], model_checks.greedy_params(N_NEW))
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
    its choices of token and experts are clear (routed_model_follows); a
    batch decodes as its requests do alone (a CUDA graph replays the expert
    kernels)."""
    routed_model_follows(str(gpu_models[key][0]), gpu_models[key][1], prompt,
                         N_NEW)
