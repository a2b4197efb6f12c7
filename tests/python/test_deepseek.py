"""DeepSeek-V2 models (multi-head latent attention and DeepSeek's mixture
of experts) in the CPU engine, against tiny_model's float64 reference
(written from transformers' DeepseekV2Attention, unabsorbed, and its
router; no vflow code): greedy tokens equal, alone and batched; a flow
runs over the latent cache; bad configs are errors naming the field.
lab/tools/hf_tiny_check.py checks the same models against transformers."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List

import numpy as np
import pytest

import model_checks
import model_specs
from gpu_common import OTHER_DEVICES, routed_model_follows
from tiny_model import write_models, write_safetensors

vflow = pytest.importorskip("vflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = 64
N_NEW = 12

MODELS = model_specs.DEEPSEEK


def prompt(length: int, salt: int) -> List[int]:
    return model_checks.prompt(length, salt, 3000, VOCAB)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    return write_models(tmp_path_factory.mktemp("deepseek"), MODELS)


def greedy(key: str, models: Dict[str, Any], p: List[int]) -> List[int]:
    return model_checks.reference_greedy(models[key][1], p, N_NEW)


def params() -> Any:
    return model_checks.greedy_params(N_NEW)


@pytest.mark.parametrize("key", list(MODELS))
def test_greedy_matches_the_reference_alone_and_batched(
        key: str, models: Dict[str, Any]) -> None:
    engine = vflow.LLM(str(models[key][0]), kv_dtype="f32", device="cpu")
    model_checks.matches_reference(engine, models[key][1],
                                   [prompt(n, 0) for n in (1, 6, 19, 41)],
                                   N_NEW)


def test_the_cache_holds_one_latent_row_a_token(
        models: Dict[str, Any]) -> None:
    """The session's KV head is the latent row (kv_lora_rank +
    qk_rope_head_dim wide), one per token whatever the query heads."""
    from vflow._eval import model_config

    cfg = model_config(str(models["deepseek-v2"][0]))
    assert (cfg["arch"], cfg["numKVHeads"], cfg["headDim"]) == \
        ("deepseek_v2", 1, 32 + 8)
    assert cfg["kvLoraRank"] == 32 and cfg["ropeInterleaved"] is True


def test_flows_run_over_the_latent_cache(models: Dict[str, Any]) -> None:
    """A flow's K is the latent row and q the absorbed query, so q . K is
    the true logit: Quest with a budget covering every block attends like
    dense (the same tokens); with 2 blocks it attends fewer."""
    p = prompt(70, 1)
    want = greedy("deepseek-v2", models, p)
    quest = str(ROOT / "examples/quest.vflow")
    engine = vflow.LLM(str(models["deepseek-v2"][0]), kv_dtype="f32",
                       device="cpu", flow=quest, params={"budget": 1000},
                       block_size=16, dense_layers=0)
    (out,) = engine.generate([p], params())
    assert [int(t) for t in out.token_ids] == want
    sparse = vflow.LLM(str(models["deepseek-v2"][0]), kv_dtype="f32",
                       device="cpu", flow=quest, params={"budget": 2},
                       block_size=16, dense_layers=0)
    (out,) = sparse.generate([p], params())
    assert len(out.token_ids) == N_NEW
    assert 0 < out.blocks_attended < out.blocks_available


@pytest.mark.parametrize("field, value, message", [
    ("norm_topk_prob", True, "'norm_topk_prob' = true is not supported"),
    ("scoring_func", "sigmoid", "'scoring_func': 'sigmoid' is not supported"),
    ("topk_method", "noaux_tc", "'topk_method': 'noaux_tc' is not supported"),
    ("moe_layer_freq", 2, "'moe_layer_freq' must be 1"),
    ("kv_lora_rank", 16, "kv_a_proj_with_mqa.weight' has shape .40, 64., "
                         "but the config implies .24, 64."),
    ("n_shared_experts", 3, "shared_experts.gate_proj.weight' has shape "
                            ".64, 64., but the config implies .96, 64."),
])
def test_bad_configs_name_the_field(models: Dict[str, Any],
                                    tmp_path: pathlib.Path, field: str,
                                    value: Any, message: str) -> None:
    src = models["deepseek-v2"][0]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match=message):
        vflow.LLM(str(tmp_path), kv_dtype="f32", device="cpu")


def test_multi_token_prediction_layers_are_skipped(
        models: Dict[str, Any], tmp_path: pathlib.Path) -> None:
    """DeepSeek-V3 checkpoints store their multi-token prediction layer
    after the model's (num_nextn_predict_layers): its tensors load as
    skipped, the tokens are the model's; a tensor of a layer past those is
    still an error."""
    src = models["deepseek-v3"][0]
    # Two shards (the loader reads every *.safetensors).
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(
        (src / "model.safetensors").read_bytes())
    extra = np.zeros(4, dtype=np.float32).tobytes()
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                      {"model.layers.3.eh_proj.weight": ("F32", [4], extra)})
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = prompt(9, 2)
    engine = vflow.LLM(str(tmp_path), kv_dtype="f32", device="cpu")
    (out,) = engine.generate([p], params())
    assert [int(t) for t in out.token_ids] == greedy("deepseek-v3", models, p)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                      {"model.layers.4.eh_proj.weight": ("F32", [4], extra)})
    with pytest.raises(Exception, match="model.layers.4.eh_proj.weight"):
        vflow.LLM(str(tmp_path), kv_dtype="f32", device="cpu")


@pytest.mark.skipif(not OTHER_DEVICES,
                    reason="no device but the CPU in VFLOW_TEST_DEVICES")
@pytest.mark.parametrize("key", list(MODELS))
def test_the_gpu_runs_latent_attention_as_the_reference(
        key: str, models: Dict[str, Any]) -> None:
    """The GPU's latent attention (a bf16 cache of one [c; k_pe] row a
    token, absorbed queries through per-head GEMMs, the latent kernels),
    DeepSeek's experts (shared ones, groups, V3's biased sigmoid router)
    and YaRN: a prompt's last logits within 3% of the float64 reference's
    spread, greedy tokens alone and batched while its choices are clear
    (routed_model_follows)."""
    routed_model_follows(str(models[key][0]), models[key][1], prompt, N_NEW)
