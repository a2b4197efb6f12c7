"""Tiny Hugging Face style models for the serving engine's tests, and an
independent float64 reference of their forward pass.

    weights = write_model(tmp_path, arch="qwen3", head_dim=32, seed=3)
    write_tokenizer(tmp_path, vocab=64)
    ref = Reference(weights, json.loads((tmp_path / "config.json").read_text()))
    ids = ref.greedy([1, 5, 9], 12)

`write_model` writes config.json and a model.safetensors built by hand
(numpy only: no torch, no safetensors package), with Hugging Face's tensor
names and shapes for LlamaForCausalLM, Qwen2ForCausalLM and
Qwen3ForCausalLM, and returns the weights exactly as stored (after bf16/f16
rounding) as float64 arrays.

`Reference` is written from the architecture definitions (the Llama, Qwen2
and Qwen3 decoder layers of Hugging Face transformers, and transformers'
`_compute_llama3_parameters` for llama3 RoPE scaling), in float64 numpy. It
shares no code with vflow and reads nothing vflow wrote: it is what the
engine's outputs are checked against.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import numpy as np

__all__ = [
    "ARCHITECTURES",
    "LLAMA3_SCALING",
    "Reference",
    "read_config",
    "write_models",
    "write_model",
    "write_tokenizer",
]

PathLike = Union[str, "os.PathLike[str]"]
Weights = Dict[str, np.ndarray]

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
DEEPSEEK = ("deepseek_v2", "deepseek_v3")
MOE_ARCHITECTURES = ("qwen3_moe", "mixtral") + DEEPSEEK

# Llama 3.1's rope_scaling with a small original context, so that the three
# bands of the rule (kept, smoothed, divided by factor) all occur for a
# head_dim of 16 and theta 10000 (wavelengths 6.3, 20.9, 62.8, ...).
LLAMA3_SCALING: Dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

BOS_ID, EOS_ID, UNK_ID = 1, 2, 0

# Weight scales. A random tied model whose residual stream is dominated by
# the token embedding echoes its input (logit of the current token ~
# |embed[t]|^2): greedy decoding then repeats one id forever. So the
# embeddings are small (std 0.05: RMSNorm brings them to O(1) before the
# first layer) and every sub-layer adds an O(1) update (projections std
# gain/sqrt(fan_in)), so that the last hidden state is mostly what the layers
# computed; a tied model's final norm weight is ~10 (1 + 0.1 N(0,1), times
# 10) so that its logits have a spread of ~4 (not flat: top-2 margins are
# well above float32 noise, and temperature sampling is not uniform). An
# untied lm_head gets std 0.5 for the same spread.
EMBED_STD = 0.05
OUT_GAIN = 2.0
HEAD_STD = 0.5
FINAL_GAIN = 10.0

_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


# ---------------------------------------------------------------------------
# Storage: rounding to the stored dtype, and the safetensors file.


def _to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """The bfloat16 bits of float32 values: the top 16 bits, rounded to
    nearest even (finite values only)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = u.astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _stored(a: np.ndarray, dtype: str) -> Tuple[np.ndarray, bytes]:
    """(the values as stored, as float64; their little-endian bytes)."""
    if dtype == "float32":
        f = a.astype("<f4")
        return f.astype(np.float64), f.tobytes()
    if dtype == "float16":
        h = a.astype(np.float32).astype("<f2")
        if not np.all(np.isfinite(h)):
            raise ValueError("weight out of float16 range")
        return h.astype(np.float64), h.tobytes()
    if dtype == "bfloat16":
        bits = _to_bf16_bits(a.astype(np.float32)).astype("<u2")
        return _bf16_bits_to_f64(bits), bits.tobytes()
    raise ValueError(f"dtype {dtype!r}: expected one of {sorted(_ST_DTYPES)}")


def write_safetensors(path: PathLike, tensors: Mapping[str, Tuple[str, Sequence[int], bytes]]) -> None:
    """Writes a safetensors file: 8-byte little-endian header length, the
    JSON header (padded with spaces to a multiple of 8 bytes, as the
    safetensors library does), then every tensor's bytes back to back.
    `tensors` maps name -> (safetensors dtype, shape, raw bytes)."""
    header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs: List[bytes] = []
    for name, (st_dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": st_dtype,
            "shape": [int(s) for s in shape],
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------
# Models.


def _expert_names(arch: str, layer: int) -> Dict[str, str]:
    """Hugging Face names of a mixture-of-experts layer's tensors (`{}`:
    the expert's index)."""
    if arch == "mixtral":
        p = f"model.layers.{layer}.block_sparse_moe."
        return {"router": p + "gate.weight",
                "gate": p + "experts.{}.w1.weight",
                "up": p + "experts.{}.w3.weight",
                "down": p + "experts.{}.w2.weight"}
    p = f"model.layers.{layer}.mlp."
    return {"router": p + "gate.weight",
            "gate": p + "experts.{}.gate_proj.weight",
            "up": p + "experts.{}.up_proj.weight",
            "down": p + "experts.{}.down_proj.weight"}


def _config(arch: str, *, vocab: int, hidden: int, layers: int, heads: int,
            kv_heads: int, head_dim: Optional[int], intermediate: int,
            tie: bool, rope_theta: float,
            rope_scaling: Optional[Mapping[str, Any]], eps: float,
            dtype: str, experts: int = 0, experts_per_token: int = 0,
            expert_intermediate: int = 0,
            dense_mlp_layers: Sequence[int] = (),
            sliding_window: Optional[int] = None,
            layer_types: Optional[Sequence[str]] = None,
            rope_local_theta: float = 10000.0,
            query_pre_attn_scalar: Optional[int] = None,
            mla: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": eps,
        "rope_theta": rope_theta,
        "rope_scaling": dict(rope_scaling) if rope_scaling else None,
        "tie_word_embeddings": tie,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": dtype,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if arch == "gemma3_text":
        del cfg["hidden_act"]
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["head_dim"] = head_dim if head_dim is not None else hidden // heads
        cfg["query_pre_attn_scalar"] = (query_pre_attn_scalar if
                                        query_pre_attn_scalar is not None
                                        else cfg["head_dim"])
        cfg["sliding_window"] = sliding_window
        cfg["layer_types"] = list(layer_types or [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
            for i in range(layers)])
        cfg["rope_local_base_freq"] = rope_local_theta
        cfg["attention_bias"] = False
        cfg["attn_logit_softcapping"] = None
        cfg["final_logit_softcapping"] = None
    elif arch == "mistral":
        cfg["sliding_window"] = sliding_window
    elif arch == "llama":
        cfg["attention_bias"] = False
        cfg["mlp_bias"] = False
        cfg["pretraining_tp"] = 1
    elif arch == "mixtral":
        cfg["intermediate_size"] = expert_intermediate
        cfg["num_local_experts"] = experts
        cfg["num_experts_per_tok"] = experts_per_token
        cfg["sliding_window"] = sliding_window
        cfg["router_jitter_noise"] = 0.0
        cfg["output_router_logits"] = False
    else:
        cfg["attention_bias"] = arch == "qwen2"
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = layers
    if arch in DEEPSEEK:
        m = dict(mla or {})
        cfg.update({
            "kv_lora_rank": m["kv_lora_rank"],
            "q_lora_rank": m.get("q_lora_rank"),
            "qk_nope_head_dim": m["qk_nope_head_dim"],
            "qk_rope_head_dim": m["qk_rope_head_dim"],
            "v_head_dim": m["v_head_dim"],
            "n_routed_experts": experts,
            "num_experts_per_tok": experts_per_token,
            "moe_intermediate_size": expert_intermediate,
            "n_shared_experts": m.get("n_shared_experts", 1),
            "routed_scaling_factor": m.get("routed_scaling_factor", 1.0),
            "topk_method": m.get("topk_method", "greedy"),
            "n_group": m.get("n_group"),
            "topk_group": m.get("topk_group"),
            "first_k_dense_replace": m.get("first_k_dense_replace", 0),
            "norm_topk_prob": False,
            "attention_bias": False,
            "mlp_bias": False,
        })
        cfg.pop("head_dim", None)
        if arch == "deepseek_v3":
            # V3's router has no method to choose (noaux_tc), ranks groups
            # by their two best and renormalizes.
            for key in ("topk_method",):
                cfg.pop(key)
            cfg["n_group"] = m.get("n_group", 1)
            cfg["topk_group"] = m.get("topk_group", 1)
            cfg["norm_topk_prob"] = m.get("norm_topk_prob", True)
            cfg["rope_interleave"] = m.get("rope_interleave", True)
            cfg["num_nextn_predict_layers"] = 0
    if arch == "qwen3_moe":
        cfg["num_experts"] = experts
        cfg["num_experts_per_tok"] = experts_per_token
        cfg["moe_intermediate_size"] = expert_intermediate
        cfg["norm_topk_prob"] = True
        cfg["decoder_sparse_step"] = 1
        cfg["mlp_only_layers"] = list(dense_mlp_layers)
        cfg["output_router_logits"] = False
    return cfg



Normal = Callable[[Tuple[int, ...], float], np.ndarray]


def _attention(raw: Dict[str, np.ndarray], p: str, arch: str, hidden: int,
               heads: int, kv_heads: int, hd: int, normal: Normal,
               norm: Callable[[int], np.ndarray]) -> None:
    """A grouped-query attention layer's tensors (q/k/v, qwen2's biases,
    o_proj, qwen3's and gemma3's q/k norms), drawn in this order."""
    raw[p + "self_attn.q_proj.weight"] = normal((heads * hd, hidden), hidden ** -0.5)
    raw[p + "self_attn.k_proj.weight"] = normal((kv_heads * hd, hidden), hidden ** -0.5)
    raw[p + "self_attn.v_proj.weight"] = normal((kv_heads * hd, hidden), hidden ** -0.5)
    if arch == "qwen2":
        raw[p + "self_attn.q_proj.bias"] = normal((heads * hd,), 0.2)
        raw[p + "self_attn.k_proj.bias"] = normal((kv_heads * hd,), 0.2)
        raw[p + "self_attn.v_proj.bias"] = normal((kv_heads * hd,), 0.2)
    raw[p + "self_attn.o_proj.weight"] = normal((hidden, heads * hd), OUT_GAIN * (heads * hd) ** -0.5)
    if arch in ("qwen3", "qwen3_moe", "gemma3_text"):
        raw[p + "self_attn.q_norm.weight"] = norm(hd)
        raw[p + "self_attn.k_norm.weight"] = norm(hd)


def _latent_attention(raw: Dict[str, np.ndarray], p: str,
                      mla: Mapping[str, Any], hidden: int, heads: int,
                      normal: Normal, norm: Callable[[int], np.ndarray]
                      ) -> None:
    """DeepSeek-V2's attention tensors: q_proj (or q_a_proj, q_a_layernorm,
    q_b_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj."""
    c, r = int(mla["kv_lora_rank"]), int(mla["qk_rope_head_dim"])
    n, v = int(mla["qk_nope_head_dim"]), int(mla["v_head_dim"])
    ql = mla.get("q_lora_rank")
    a = p + "self_attn."
    if ql:
        raw[a + "q_a_proj.weight"] = normal((ql, hidden), hidden ** -0.5)
        raw[a + "q_a_layernorm.weight"] = norm(ql)
        raw[a + "q_b_proj.weight"] = normal((heads * (n + r), ql), ql ** -0.5)
    else:
        raw[a + "q_proj.weight"] = normal((heads * (n + r), hidden), hidden ** -0.5)
    raw[a + "kv_a_proj_with_mqa.weight"] = normal((c + r, hidden), hidden ** -0.5)
    raw[a + "kv_a_layernorm.weight"] = norm(c)
    raw[a + "kv_b_proj.weight"] = normal((heads * (n + v), c), c ** -0.5)
    raw[a + "o_proj.weight"] = normal((hidden, heads * v), OUT_GAIN * (heads * v) ** -0.5)


def write_model(directory: PathLike, *, arch: str = "llama", vocab: int = 64,
                hidden: int = 64, layers: int = 3, heads: int = 4,
                kv_heads: int = 2, head_dim: Optional[int] = None,
                intermediate: int = 96, tie: bool = True,
                rope_theta: float = 10000.0,
                rope_scaling: Optional[Mapping[str, Any]] = None,
                eps: float = 1e-5, seed: int = 0,
                dtype: str = "float32", experts: int = 8,
                experts_per_token: int = 2, expert_intermediate: int = 32,
                dense_mlp_layers: Sequence[int] = (),
                sliding_window: Optional[int] = None,
                layer_types: Optional[Sequence[str]] = None,
                rope_local_theta: float = 10000.0,
                query_pre_attn_scalar: Optional[int] = None,
                mla: Optional[Mapping[str, Any]] = None) -> Weights:
    """Writes `directory`/config.json and model.safetensors of a random
    model; returns its weights (Hugging Face names) as float64 arrays equal
    to what was stored.

    Scales (see EMBED_STD above): embeddings std 0.05; q/k/v, gate/up
    std 1/sqrt(fan_in), o_proj/down_proj 2/sqrt(fan_in); norm weights
    1 + 0.1 N(0,1) (the final norm of a tied model times 10); qwen2 biases
    0.2 N(0,1); an untied lm_head std 0.5. Logits have a spread of ~4 and
    greedy decoding does not collapse into one repeated id (for most seeds
    and prompts: the tests check the ones they use).

    qwen3_moe and mixtral layers have `experts` experts of
    `expert_intermediate` (router std 1/sqrt(hidden), experts as the MLP
    above), `experts_per_token` per token; qwen3_moe's `dense_mlp_layers`
    (its mlp_only_layers) keep the dense MLP of `intermediate`. mistral
    and mixtral attend the last `sliding_window` tokens (None: all).
    gemma3_text (Gemma 3's text model) stores its norms as w with the
    model scaling by 1 + w (w = 0.1 N(0,1); the final norm of a tied
    model 10 x (1 + 0.1 N) - 1), has q/k norms, post-attention and
    pre/post-feedforward norms, `layer_types` (default: every sixth layer
    full, the others sliding over `sliding_window`), `rope_local_theta`
    for its sliding layers and `query_pre_attn_scalar`. deepseek_v2
    (DeepSeek-V2's multi-head latent attention and mixture of experts)
    takes `mla`: kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim, optional q_lora_rank, n_shared_experts (1),
    routed_scaling_factor, topk_method / n_group / topk_group and
    first_k_dense_replace (its first layers keep the dense MLP)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch {arch!r}: expected one of {sorted(ARCHITECTURES)}")
    if dtype not in _ST_DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(_ST_DTYPES)}")
    if heads % kv_heads:
        raise ValueError("heads must be a multiple of kv_heads")
    hd = head_dim if head_dim is not None else hidden // heads
    if hd % 2:
        raise ValueError("head_dim must be even (RoPE)")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def normal(shape: Tuple[int, ...], std: float) -> np.ndarray:
        return rng.standard_normal(shape) * std

    gemma = arch == "gemma3_text"

    def norm(n: int) -> np.ndarray:
        # Gemma stores w and scales by 1 + w.
        return (0.0 if gemma else 1.0) + 0.1 * rng.standard_normal(n)

    raw: Dict[str, np.ndarray] = {}
    raw["model.embed_tokens.weight"] = normal((vocab, hidden), EMBED_STD)
    deepseek = arch in DEEPSEEK
    if deepseek:
        dense_mlp_layers = tuple(range(int((mla or {}).get(
            "first_k_dense_replace", 0))))
    for i in range(layers):
        p = f"model.layers.{i}."
        raw[p + "input_layernorm.weight"] = norm(hidden)
        if deepseek:
            _latent_attention(raw, p, dict(mla or {}), hidden, heads, normal,
                              norm)
        else:
            _attention(raw, p, arch, hidden, heads, kv_heads, hd, normal,
                       norm)
        raw[p + "post_attention_layernorm.weight"] = norm(hidden)
        if gemma:
            raw[p + "pre_feedforward_layernorm.weight"] = norm(hidden)
            raw[p + "post_feedforward_layernorm.weight"] = norm(hidden)
        if arch in MOE_ARCHITECTURES and i not in dense_mlp_layers:
            names = _expert_names(arch, i)
            ei = expert_intermediate
            raw[names["router"]] = normal((experts, hidden), hidden ** -0.5)
            for e in range(experts):
                raw[names["gate"].format(e)] = normal((ei, hidden), hidden ** -0.5)
                raw[names["up"].format(e)] = normal((ei, hidden), hidden ** -0.5)
                raw[names["down"].format(e)] = normal((hidden, ei), OUT_GAIN * ei ** -0.5)
            if arch == "deepseek_v3":
                raw[names["router"].replace("weight", "e_score_correction_bias")] = \
                    normal((experts,), 0.05)
            if deepseek:
                si = ei * int((mla or {}).get("n_shared_experts", 1))
                sp = p + "mlp.shared_experts."
                raw[sp + "gate_proj.weight"] = normal((si, hidden), hidden ** -0.5)
                raw[sp + "up_proj.weight"] = normal((si, hidden), hidden ** -0.5)
                raw[sp + "down_proj.weight"] = normal((hidden, si), OUT_GAIN * si ** -0.5)
        else:
            raw[p + "mlp.gate_proj.weight"] = normal((intermediate, hidden), hidden ** -0.5)
            raw[p + "mlp.up_proj.weight"] = normal((intermediate, hidden), hidden ** -0.5)
            raw[p + "mlp.down_proj.weight"] = normal((hidden, intermediate), OUT_GAIN * intermediate ** -0.5)
    gain = FINAL_GAIN if tie else 1.0
    if gemma:  # the same gain on 1 + w
        raw["model.norm.weight"] = gain * (1.0 + norm(hidden)) - 1.0
    else:
        raw["model.norm.weight"] = gain * norm(hidden)
    if not tie:
        raw["lm_head.weight"] = normal((vocab, hidden), HEAD_STD)

    weights: Weights = {}
    tensors: Dict[str, Tuple[str, Sequence[int], bytes]] = {}
    for name, a in raw.items():
        values, data = _stored(a, dtype)
        weights[name] = values
        tensors[name] = (_ST_DTYPES[dtype], a.shape, data)
    write_safetensors(d / "model.safetensors", tensors)
    cfg = _config(arch, vocab=vocab, hidden=hidden, layers=layers,
                  heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                  intermediate=intermediate, tie=tie, rope_theta=rope_theta,
                  rope_scaling=rope_scaling, eps=eps, dtype=dtype,
                  experts=experts, experts_per_token=experts_per_token,
                  expert_intermediate=expert_intermediate,
                  dense_mlp_layers=dense_mlp_layers,
                  sliding_window=sliding_window, layer_types=layer_types,
                  rope_local_theta=rope_local_theta,
                  query_pre_attn_scalar=query_pre_attn_scalar, mla=mla)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return weights


def write_models(root: PathLike, specs: Mapping[str, Mapping[str, Any]]
                 ) -> Dict[str, Tuple[Path, "Reference"]]:
    """Writes each model of `specs` (name -> write_model arguments) to
    root/name; returns name -> (its directory, its Reference)."""
    out: Dict[str, Tuple[Path, Reference]] = {}
    for name, kw in specs.items():
        d = Path(root) / name
        weights = write_model(d, **kw)
        out[name] = (d, Reference(weights, read_config(d)))
    return out


def read_config(directory: PathLike) -> Dict[str, Any]:
    cfg: Dict[str, Any] = json.loads((Path(directory) / "config.json").read_text())
    return cfg


def write_tokenizer(directory: PathLike, vocab: int) -> None:
    """tokenizer.json (a `tokenizers` WordLevel model: <unk> <s> </s> as
    ids 0 1 2, then words "w3" .. "w{vocab-1}" as ids 3 .. vocab-1; split on
    whitespace; decoded by joining with spaces, special tokens skipped) and
    tokenizer_config.json (BOS <s> added in front, EOS </s>). Text
    "w5 w17" encodes to [1, 5, 17]."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    words = {t: i for i, t in enumerate(specials)}
    for i in range(len(specials), vocab):
        words[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder joins tokens with spaces ("##" pieces glue; no
    # word here has that prefix); no clean-up of spaces.
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in specials])
    tok.save(str(d / "tokenizer.json"))
    tconfig = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(tconfig, indent=2) + "\n")


# ---------------------------------------------------------------------------
# The reference forward pass.


def rope_inv_freq(head_dim: int, theta: float,
                  scaling: Optional[Mapping[str, Any]]) -> np.ndarray:
    """inv_freq[i] = theta^(-2i/d), i < d/2; with rope_type "llama3",
    transformers' _compute_llama3_parameters: wavelengths longer than
    original/low_freq_factor are divided by `factor`, shorter than
    original/high_freq_factor kept, and those between interpolated."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    if kind != "llama3":
        raise NotImplementedError(f"rope_type {kind!r}")
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    low_wavelen = old / low
    high_wavelen = old / high
    wavelen = 2 * math.pi / inv_freq
    llama = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, llama)


def _yarn_inv_freq(inv_freq: np.ndarray, dim: int, theta: float,
                   scaling: Mapping[str, Any]) -> np.ndarray:
    """YaRN (the paper's NTK-by-parts, as transformers'
    _compute_yarn_parameters with truncation): dimensions that turn more
    than beta_fast times over the original context keep their frequency,
    fewer than beta_slow times are divided by `factor`, a linear ramp
    between."""
    factor = float(scaling["factor"])
    old = float(scaling["original_max_position_embeddings"])
    fast = float(scaling.get("beta_fast") or 32)
    slow = float(scaling.get("beta_slow") or 1)

    def dim_of(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_of(fast)), 0)
    high: float = min(math.ceil(dim_of(slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    out: np.ndarray = inv_freq / factor * (1 - keep) + inv_freq * keep
    return out


def _yarn_mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def yarn_factors(scaling: Optional[Mapping[str, Any]]) -> Tuple[float, float]:
    """(the factor on RoPE's cos and sin, the factor on the softmax scale)
    of a rope scaling: 1 and 1 unless it is YaRN, whose attention factor is
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) (both given) or
    mscale(factor, 1), and whose softmax scale grows by
    mscale(factor, mscale_all_dim)^2 (DeepSeek's yarn_get_mscale)."""
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0, 1.0
    f = float(scaling["factor"])
    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if scaling.get("attention_factor") is not None:
        rot = float(scaling["attention_factor"])
    elif m and m_all:
        rot = _yarn_mscale(f, float(m)) / _yarn_mscale(f, float(m_all))
    else:
        rot = _yarn_mscale(f, 1.0)
    soft = _yarn_mscale(f, float(m_all)) ** 2 if m_all else 1.0
    return rot, soft


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return out


def _rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (transformers' gelu_pytorch_tanh)."""
    out: np.ndarray = 0.5 * x * (1.0 + np.tanh(
        math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / (1.0 + np.exp(-x))
    return out


class Reference:
    """The causal forward pass of a Llama / Qwen2 / Qwen3 decoder in float64,
    from `weights` (Hugging Face names, as `write_model` returns them) and
    the model's config.json dict. Independent of vflow: written from the
    architecture definitions only.

      x = embed[tokens]
      per layer:  h = rmsnorm(x) * input_layernorm
                  q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)  (qwen2 biases)
                  per head, qwen3: q, k = rmsnorm(q) * q_norm, rmsnorm(k) * k_norm
                  RoPE (rotate_half layout, position p = index in the sequence)
                  query head j attends with kv head j // (heads / kv_heads),
                  causally, softmax(q k^T / sqrt(head_dim)) v
                  x += o_proj(attn);  h = rmsnorm(x) * post_attention_layernorm
                  x += down(silu(gate(h)) * up(h))
      logits = (rmsnorm(x) * norm) lm_head^T   (embed when tied)
    """

    def __init__(self, weights: Mapping[str, np.ndarray], config: Mapping[str, Any]):
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        self.config = dict(config)
        c = self.config
        self.arch = str(c["model_type"])
        self.hidden = int(c["hidden_size"])
        self.layers = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        hd = c.get("head_dim")
        self.head_dim = int(hd) if hd else self.hidden // self.heads
        self.eps = float(c["rms_norm_eps"])
        self.vocab = int(c["vocab_size"])
        self.deepseek = self.arch in DEEPSEEK
        rope_dim = int(c["qk_rope_head_dim"]) if self.deepseek else self.head_dim
        self.inv_freq = rope_inv_freq(rope_dim, float(c.get("rope_theta", 10000.0)),
                                      c.get("rope_scaling"))
        self.rope_gain, self.softmax_gain = yarn_factors(c.get("rope_scaling"))
        self.gemma = self.arch == "gemma3_text"
        self.route_gaps: np.ndarray = np.zeros(0)  # set by logits()
        # Gemma 3: sliding layers have their own, unscaled RoPE base.
        self.local_inv_freq = (rope_inv_freq(
            self.head_dim, float(c.get("rope_local_base_freq", 10000.0)), None)
            if self.gemma else self.inv_freq)
        if c.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w:
            self.lm_head = self.w["model.embed_tokens.weight"]
        else:
            self.lm_head = self.w["lm_head.weight"]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """RMSNorm with weight `name` (Gemma's scales by 1 + w)."""
        return _rms_norm(x, self.w[name] + (1.0 if self.gemma else 0.0),
                         self.eps)

    def _sliding(self, layer: int) -> bool:
        c = self.config
        if self.gemma:
            return bool(c.get("sliding_window")) and \
                c["layer_types"][layer] == "sliding_attention"
        return self.arch in ("mistral", "mixtral") and \
            bool(c.get("sliding_window"))

    def _rope(self, x: np.ndarray, inv_freq: Optional[np.ndarray] = None
              ) -> np.ndarray:
        """x [n, heads, head_dim] at positions 0..n-1."""
        pos = np.arange(x.shape[0], dtype=np.float64)
        freqs = np.outer(pos, self.inv_freq if inv_freq is None
                         else inv_freq)                      # [n, d/2]
        emb = np.concatenate([freqs, freqs], axis=-1)        # [n, d]
        cos = np.cos(emb)[:, None, :]
        sin = np.sin(emb)[:, None, :]
        out: np.ndarray = (x * cos + _rotate_half(x) * sin) * self.rope_gain
        return out

    def logits(self, tokens: Sequence[int],
               masked: Optional[Callable[[int], np.ndarray]] = None
               ) -> np.ndarray:
        """Logits [len(tokens), vocab] of every position (row i predicts
        token i+1). `masked(n)`, when given, is an [n, n] bool array of
        further positions each row may not see (an eviction policy)."""
        ids = np.asarray(list(tokens), dtype=np.int64)
        #: Per row, the smallest margin over the layers' routers between the
        #: last expert (or group) a row chose and the next, in router-logit
        #: units (DeepSeek-V2's group-limited log-probabilities; V3's biased
        #: sigmoid scores scaled by their largest slope): rounding larger
        #: than it may route the row elsewhere. Infinite without a router.
        self.route_gaps = np.full(ids.size, np.inf)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("tokens: a non-empty list of ids")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise ValueError("token id outside the vocabulary")
        w, n, hd, eps = self.w, ids.size, self.head_dim, self.eps
        group = self.heads // self.kv_heads
        x = w["model.embed_tokens.weight"][ids]
        if self.gemma:  # Gemma scales the embeddings by sqrt(hidden)
            x = x * math.sqrt(self.hidden)
        full = np.triu(np.ones((n, n), dtype=bool), k=1)     # True = masked
        if masked is not None:
            full |= masked(n)
        window = self.config.get("sliding_window")
        # Row i sees positions i - window + 1 .. i (transformers'
        # sliding_window_causal mask).
        sliding = full | np.tril(np.ones((n, n), dtype=bool),
                                 k=-int(window or 1))
        scale = (float(self.config["query_pre_attn_scalar"]) ** -0.5
                 if self.gemma else 1.0 / math.sqrt(hd))
        for i in range(self.layers):
            p = f"model.layers.{i}."
            causal = sliding if self._sliding(i) else full
            inv_freq = self.local_inv_freq if self._sliding(i) else None
            h = self._norm(x, p + "input_layernorm.weight")
            if self.deepseek:
                x = x + self._latent_attention(i, h, full)
                h = self._norm(x, p + "post_attention_layernorm.weight")
                x = x + self._mlp(i, h)
                continue
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in w:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = q.reshape(n, self.heads, hd)
            k = k.reshape(n, self.kv_heads, hd)
            v = v.reshape(n, self.kv_heads, hd)
            if p + "self_attn.q_norm.weight" in w:
                q = self._norm(q, p + "self_attn.q_norm.weight")
                k = self._norm(k, p + "self_attn.k_norm.weight")
            q, k = self._rope(q, inv_freq), self._rope(k, inv_freq)
            out = np.empty((n, self.heads, hd))
            for j in range(self.heads):
                g = j // group
                s = (q[:, j, :] @ k[:, g, :].T) * scale
                s = np.where(causal, -np.inf, s)
                s = s - s.max(axis=-1, keepdims=True)
                a = np.exp(s)
                a /= a.sum(axis=-1, keepdims=True)
                out[:, j, :] = a @ v[:, g, :]
            o = out.reshape(n, self.heads * hd) @ w[p + "self_attn.o_proj.weight"].T
            if self.gemma:  # Gemma's four norms a layer
                x = x + self._norm(o, p + "post_attention_layernorm.weight")
                h = self._norm(x, p + "pre_feedforward_layernorm.weight")
                x = x + self._norm(self._mlp(i, h),
                                   p + "post_feedforward_layernorm.weight")
                continue
            x = x + o
            h = self._norm(x, p + "post_attention_layernorm.weight")
            x = x + self._mlp(i, h)
        x = self._norm(x, "model.norm.weight")
        out_logits: np.ndarray = x @ self.lm_head.T
        return out_logits

    def _rope_pairs(self, x: np.ndarray) -> np.ndarray:
        """DeepSeek's RoPE of x [n, heads, d] at positions 0..n-1: adjacent
        pairs (2i, 2i+1) rotate as complex numbers by position x
        inv_freq[i], times YaRN's attention factor (transformers'
        apply_rotary_emb with freqs_cis)."""
        pos = np.arange(x.shape[0], dtype=np.float64)
        ang = np.outer(pos, self.inv_freq)[:, None, :]      # [n, 1, d/2]
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * ang) * self.rope_gain
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    def _latent_attention(self, layer: int, h: np.ndarray,
                          causal: np.ndarray) -> np.ndarray:
        """transformers' DeepseekV2Attention, unabsorbed: per head a key
        [k_nope; k_pe] and a value expanded from the normed latent by
        kv_b_proj, softmax scale (nope + rope)^-1/2 (times YaRN's mscale^2),
        then o_proj."""
        c, w = self.config, self.w
        a = f"model.layers.{layer}.self_attn."
        n, H = h.shape[0], self.heads
        C, R = int(c["kv_lora_rank"]), int(c["qk_rope_head_dim"])
        N, Vd = int(c["qk_nope_head_dim"]), int(c["v_head_dim"])
        if c.get("q_lora_rank"):
            qa = _rms_norm(h @ w[a + "q_a_proj.weight"].T,
                           w[a + "q_a_layernorm.weight"], self.eps)
            q = qa @ w[a + "q_b_proj.weight"].T
        else:
            q = h @ w[a + "q_proj.weight"].T
        q = q.reshape(n, H, N + R)
        # V3 may rotate halves (rope_interleave false) instead of pairs.
        rope = (self._rope if c.get("rope_interleave", True) is False
                else self._rope_pairs)
        q = np.concatenate([q[..., :N], rope(q[..., N:])], axis=-1)
        ckv = h @ w[a + "kv_a_proj_with_mqa.weight"].T
        latent = _rms_norm(ckv[:, :C], w[a + "kv_a_layernorm.weight"], self.eps)
        k_pe = rope(ckv[:, None, C:])[:, 0, :]
        kv = (latent @ w[a + "kv_b_proj.weight"].T).reshape(n, H, N + Vd)
        scale = (N + R) ** -0.5 * self.softmax_gain
        out = np.empty((n, H, Vd))
        for j in range(H):
            key = np.concatenate([kv[:, j, :N], k_pe], axis=-1)
            s = (q[:, j, :] @ key.T) * scale
            s = np.where(causal, -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, j, :] = (s / s.sum(axis=-1, keepdims=True)) @ kv[:, j, N:]
        o: np.ndarray = out.reshape(n, H * Vd) @ w[a + "o_proj.weight"].T
        return o

    def _mlp(self, layer: int, h: np.ndarray) -> np.ndarray:
        """The layer's MLP of h [n, hidden]: SwiGLU, or for a mixture of
        experts (transformers' Qwen3MoeSparseMoeBlock and
        MixtralSparseMoeBlock) the softmax of the router's logits over all
        experts, the top experts_per_token of it renormalized to sum 1
        (Qwen3-MoE's norm_topk_prob, always for Mixtral), and the weighted
        sum of those experts' SwiGLU."""
        w, p = self.w, f"model.layers.{layer}."

        act = _gelu_tanh if self.gemma else _silu

        def swiglu(x: np.ndarray, gate: str, up: str, down: str) -> np.ndarray:
            out: np.ndarray = (act(x @ w[gate].T) * (x @ w[up].T)) @ w[down].T
            return out

        names = _expert_names(self.arch, layer)
        if names["router"] not in w:
            return swiglu(h, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                          p + "mlp.down_proj.weight")
        c = self.config
        k = int(c["num_experts_per_tok"])
        normalize = self.arch == "mixtral" or bool(c.get("norm_topk_prob", False))
        z = h @ w[names["router"]].T
        if not self.deepseek:
            self._note_gaps(z, k)
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        probs = z / z.sum(axis=-1, keepdims=True)
        out = np.zeros_like(h)
        if self.deepseek:
            # Plus the shared experts' MLP of every row.
            sp = p + "mlp.shared_experts."
            out = swiglu(h, sp + "gate_proj.weight", sp + "up_proj.weight",
                         sp + "down_proj.weight")
        if self.arch == "deepseek_v3":
            return out + self._v3_experts(layer, h, names, swiglu)
        if self.deepseek:
            # DeepseekV2TopkRouter: group-limited candidates, weights times
            # routed_scaling_factor, never renormalized.
            probs = self._group_limited(probs)
            self._note_gaps(np.log(np.maximum(probs, 1e-300)), k)
            normalize = False
            probs = probs * float(c.get("routed_scaling_factor", 1.0))
        for r in range(h.shape[0]):
            top = sorted(range(probs.shape[1]), key=lambda e: (-probs[r, e], e))[:k]
            weights = probs[r, top]
            if normalize:
                weights = weights / weights.sum()
            for e, wt in zip(top, weights):
                out[r] += wt * swiglu(h[r:r + 1], names["gate"].format(e),
                                      names["up"].format(e),
                                      names["down"].format(e))[0]
        return out

    def _note_gaps(self, z: np.ndarray, k: int) -> None:
        """route_gaps: each row's margin between its k-th and (k+1)-th
        ranked values of z [rows, experts] (log-probabilities or logits)."""
        if z.shape[1] > k:
            ranked = -np.sort(-z, axis=-1)
            self.route_gaps = np.minimum(self.route_gaps,
                                         ranked[:, k - 1] - ranked[:, k])

    def _v3_experts(self, layer: int, h: np.ndarray, names: Mapping[str, str],
                    swiglu: Callable[[np.ndarray, str, str, str], np.ndarray]
                    ) -> np.ndarray:
        """transformers' DeepseekV3TopkRouter and experts: sigmoid scores;
        the choice ranks score + e_score_correction_bias, first the
        topk_group of n_group groups by the sum of their two best, then
        num_experts_per_tok experts among theirs; the weights are the
        chosen scores over their sum (+1e-20) when norm_topk_prob, times
        routed_scaling_factor."""
        c, w = self.config, self.w
        k, g = int(c["num_experts_per_tok"]), int(c["n_group"])
        keep = int(c["topk_group"])
        scores = 1.0 / (1.0 + np.exp(-(h @ w[names["router"]].T)))
        choice = scores + w[names["router"].replace("weight", "e_score_correction_bias")]
        out = np.zeros_like(h)
        rows, experts = scores.shape
        size = experts // g
        for r in range(rows):
            groups = [sum(sorted(choice[r, i * size:(i + 1) * size])[-2:])
                      for i in range(g)]
            order = sorted(range(g), key=lambda i: (-groups[i], i))
            kept = order[:keep]
            # Margins in router-logit units: a logit moved by d moves a
            # sigmoid score by at most d / 4 and a group's two-best sum by
            # at most d / 2 (a group near-tie reroutes as an expert one).
            if g > keep:
                self.route_gaps[r] = min(self.route_gaps[r],
                                         2 * (groups[order[keep - 1]] -
                                              groups[order[keep]]))
            cand = [e for e in range(experts) if e // size in kept]
            top = sorted(cand, key=lambda e: (-choice[r, e], e))[:k]
            ranked = sorted((choice[r, e] for e in cand), reverse=True)
            if len(ranked) > k:
                self.route_gaps[r] = min(self.route_gaps[r],
                                         4 * (ranked[k - 1] - ranked[k]))
            wt = scores[r, top]
            if c.get("norm_topk_prob", True):
                wt = wt / (wt.sum() + 1e-20)
            wt = wt * float(c.get("routed_scaling_factor", 1.0))
            for e, x in zip(top, wt):
                out[r] += x * swiglu(h[r:r + 1], names["gate"].format(e),
                                     names["up"].format(e),
                                     names["down"].format(e))[0]
        return out

    def _group_limited(self, probs: np.ndarray) -> np.ndarray:
        """topk_method group_limited_greedy: experts outside the topk_group
        groups of the largest best probability are zeroed (greedy: as
        is)."""
        c = self.config
        if c.get("topk_method", "greedy") != "group_limited_greedy":
            return probs
        g, keep = int(c["n_group"]), int(c["topk_group"])
        rows, experts = probs.shape
        best = probs.reshape(rows, g, experts // g).max(axis=-1)
        if g > keep:  # the kept groups' margin over the first dropped
            self._note_gaps(np.log(np.maximum(best, 1e-300)), keep)
        out = probs.copy()
        for r in range(rows):
            kept = sorted(range(g), key=lambda i: (-best[r, i], i))[:keep]
            for i in range(g):
                if i not in kept:
                    out[r, i * (experts // g):(i + 1) * (experts // g)] = 0
        return out

    def greedy_with_margins(self, prompt: Sequence[int], n: int,
                            masked: Optional[Callable[[int], np.ndarray]] = None
                            ) -> Tuple[List[int], List[float]]:
        """n greedy tokens after `prompt` (no stop at EOS), and at each step
        the gap between the largest and the second largest logit (`masked`:
        as logits() takes it)."""
        seq = [int(t) for t in prompt]
        out: List[int] = []
        margins: List[float] = []
        for _ in range(n):
            row = self.logits(seq, masked)[-1]
            top2 = np.sort(row)[-2:]
            margins.append(float(top2[1] - top2[0]))
            t = int(np.argmax(row))
            out.append(t)
            seq.append(t)
        return out, margins

    def greedy(self, prompt: Sequence[int], n: int) -> List[int]:
        """n greedy (argmax) tokens after `prompt`; EOS does not stop it."""
        return self.greedy_with_margins(prompt, n)[0]
