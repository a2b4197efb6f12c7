"""The serving engine (vflow.LLM) on the CPU, against an independent float64
reference (tiny_model.Reference) of tiny random Llama / Qwen2 / Qwen3 models
written to tmp dirs.

Two groups:
  - tiny_model's own checks (the safetensors files parse back to the stored
    arrays, the reference is causal, agrees with a second token-by-token
    implementation, is not degenerate, and every reference case the engine
    tests use has a clear greedy winner): these always run;
  - the engine tests (marked `needs_engine`): skipped, "engine not built
    yet", while vflow has no LLM.

Why greedy ids must be EQUAL to the reference's: the models' weights are
stored in float32 (or bf16/f16, which the reference reads back exactly), the
engine runs with kv_dtype="f32", so its logits differ from the float64 ones
by float32 rounding only: ~1e-6 relative on logits of magnitude ~10 over 3
layers, i.e. ~1e-5. Every reference step used here has a top-2 logit margin
> MIN_MARGIN = 1e-3 (asserted, in `expected` and in
test_reference_cases_have_clear_winners), 100x that error, so the argmax
cannot flip and any difference is an engine bug, not noise.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
import struct
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytest

from tiny_model import (LLAMA3_SCALING, Reference, read_config, write_model,
                        write_tokenizer)

try:
    import vflow
except ImportError:  # pragma: no cover - the package is always built here
    vflow = None

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUEST = ROOT / "examples" / "quest.vflow"

HAS_ENGINE = vflow is not None and hasattr(vflow, "LLM")
needs_engine = pytest.mark.skipif(not HAS_ENGINE, reason="engine not built yet")

MIN_MARGIN = 1e-3
EOS = 2
VOCAB = 64

# The models (tiny_model.write_model arguments). Each one exercises
# something: tied embeddings, q/k/v biases + untied lm_head + rope_theta,
# q/k norm + head_dim (32) != hidden/heads (16), llama3 rope scaling (all
# three bands at head_dim 16), bf16 and f16 storage, MQA (one kv head).
MODELS: Dict[str, Dict[str, Any]] = {
    "llama": dict(arch="llama", seed=0),
    "qwen2": dict(arch="qwen2", tie=False, rope_theta=1e6, seed=1),
    "qwen3": dict(arch="qwen3", head_dim=32, seed=2),
    "llama3-rope": dict(arch="llama", rope_scaling=LLAMA3_SCALING, seed=3),
    "llama-bf16": dict(arch="llama", dtype="bfloat16", seed=4),
    "qwen3-f16-mqa": dict(arch="qwen3", head_dim=32, kv_heads=1,
                          dtype="float16", seed=5),
}


def make_prompt(length: int, salt: int) -> List[int]:
    """A fixed random prompt of ordinary ids (3 .. VOCAB-1: no <unk>, BOS or
    EOS)."""
    rng = np.random.default_rng(1000 + 7919 * salt + length)
    return [int(t) for t in rng.integers(3, VOCAB, length)]


# Every (model, prompt, new tokens) the engine tests compare with the
# reference, so that test_reference_cases_have_clear_winners checks them all
# now, before there is an engine.
PROMPT_LENGTHS = (1, 5, 17, 40)
N_NEW = 12
GREEDY_CASES: List[Tuple[str, Tuple[int, ...], int]] = [
    (m, tuple(make_prompt(n, 0)), N_NEW) for m in MODELS for n in PROMPT_LENGTHS]
BATCH_PROMPTS = [make_prompt(n, 1) for n in (3, 9, 17, 26, 40)]
GREEDY_CASES += [("llama", tuple(p), N_NEW) for p in BATCH_PROMPTS]
GREEDY_CASES += [("qwen3", tuple(p), N_NEW) for p in BATCH_PROMPTS]
FLOW_PROMPTS = [make_prompt(n, 2) for n in (40, 100)]
GREEDY_CASES += [(m, tuple(p), 20) for m in ("llama", "qwen3")
                 for p in FLOW_PROMPTS]
PREEMPT_PROMPTS = [make_prompt(6, 3 + i) for i in range(4)]
PREEMPT_NEW = 36
GREEDY_CASES += [("llama", tuple(p), PREEMPT_NEW) for p in PREEMPT_PROMPTS]
PREFIX_P = make_prompt(40, 4)
PREFIX_EXTRA = make_prompt(10, 5)
GREEDY_CASES += [("llama", tuple(PREFIX_P), N_NEW),
                 ("llama", tuple(PREFIX_P + PREFIX_EXTRA), N_NEW)]
TEXT_PROMPTS = ["w5 w17 w42 w9 w33", "w60 w3 w3 w11"]
TEXT_IDS = [[1, 5, 17, 42, 9, 33], [1, 60, 3, 3, 11]]
GREEDY_CASES += [("llama", tuple(p), N_NEW) for p in TEXT_IDS]
# A prompt after which greedy decoding emits EOS (id 2) at step EOS_STEP of
# EOS_NEW (found by searching salts with the reference; checked below).
EOS_PROMPT = make_prompt(6, 26)
EOS_NEW = 16
EOS_STEP = 4
GREEDY_CASES += [("llama", tuple(EOS_PROMPT), EOS_NEW)]
LEAK_PROMPTS = [make_prompt(n, 6) for n in (1, 16, 33, 40)]
GREEDY_CASES += [("llama", tuple(LEAK_PROMPTS[2]), N_NEW)]
SAMPLE_PROMPTS = [make_prompt(n, 9) for n in (4, 11, 23)]
GREEDY_CASES += [("llama", tuple(p), 16) for p in SAMPLE_PROMPTS]


# ---------------------------------------------------------------------------
# Models and reference results.


class Model:
    def __init__(self, path: pathlib.Path, weights: Dict[str, np.ndarray]):
        self.path = path
        self.config = read_config(path)
        self.weights = weights
        self.ref = Reference(weights, self.config)


_MODEL_ROOT: List[pathlib.Path] = []
_MODEL_CACHE: Dict[str, Model] = {}


@pytest.fixture(scope="session", autouse=True)
def _model_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    _MODEL_ROOT.append(tmp_path_factory.mktemp("models"))


def model(key: str) -> Model:
    """The model MODELS[key], written once per session."""
    if key not in _MODEL_CACHE:
        path = _MODEL_ROOT[0] / key
        weights = write_model(path, **MODELS[key])
        _MODEL_CACHE[key] = Model(path, weights)
    return _MODEL_CACHE[key]


@functools.lru_cache(maxsize=None)
def _greedy(key: str, prompt: Tuple[int, ...], n: int) -> Tuple[Tuple[int, ...], float]:
    tokens, margins = model(key).ref.greedy_with_margins(list(prompt), n)
    return tuple(tokens), min(margins)


def expected(key: str, prompt: Sequence[int], n: int,
             ignore_eos: bool = True) -> List[int]:
    """The reference's n greedy tokens (cut after the first EOS unless
    ignore_eos), after asserting that every step has a clear winner."""
    tokens, margin = _greedy(key, tuple(prompt), n)
    assert margin > MIN_MARGIN, (
        f"test setup: model {key}, prompt {list(prompt)}: a greedy step has a "
        f"top-2 logit margin of {margin:.2e} <= {MIN_MARGIN}; pick another "
        "prompt or seed (the comparison would hinge on rounding)")
    out = list(tokens)
    if not ignore_eos and EOS in out:
        out = out[:out.index(EOS) + 1]
    return out


# ---------------------------------------------------------------------------
# tiny_model's own checks (no engine needed).


_ST = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


def read_safetensors(path: pathlib.Path) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """A small safetensors reader, independent of tiny_model's writer:
    checks the layout rules (header length, 8-byte alignment of the data,
    offsets in order, contiguous and covering the whole data section)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    assert (8 + n) % 8 == 0, "data section not 8-byte aligned"
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k)
                   for k, v in header.items())
    pos = 0
    out: Dict[str, np.ndarray] = {}
    for begin, end, name in spans:
        assert begin == pos, f"{name}: a hole or overlap at {begin}"
        info = header[name]
        np_dtype, size = _ST[info["dtype"]]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        assert end - begin == count * size, f"{name}: wrong byte count"
        a = np.frombuffer(data[begin:end], dtype=np_dtype)
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float64).reshape(info["shape"])
        pos = end
    assert pos == len(data), "trailing bytes after the last tensor"
    return out, {"metadata": meta, "header": header}


def hf_names(arch: str, layers: int, tie: bool) -> Dict[str, str]:
    """Hugging Face's tensor names for the architecture (name -> kind)."""
    names = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm"}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            names[p + n + ".weight"] = "norm"
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[p + "self_attn." + n + ".weight"] = n
        for n in ("gate_proj", "up_proj", "down_proj"):
            names[p + "mlp." + n + ".weight"] = n
        if arch == "qwen2":
            for n in ("q_proj", "k_proj", "v_proj"):
                names[p + "self_attn." + n + ".bias"] = n + ".bias"
        if arch == "qwen3":
            names[p + "self_attn.q_norm.weight"] = "head_norm"
            names[p + "self_attn.k_norm.weight"] = "head_norm"
    if not tie:
        names["lm_head.weight"] = "embed"
    return names


@pytest.mark.parametrize("key", list(MODELS))
def test_tiny_model_files_parse_back(tmp_path: pathlib.Path, key: str) -> None:
    kw = MODELS[key]
    weights = write_model(tmp_path, **kw)
    cfg = json.loads((tmp_path / "config.json").read_text())
    tensors, info = read_safetensors(tmp_path / "model.safetensors")
    assert info["metadata"] == {"format": "pt"}
    dtype = kw.get("dtype", "float32")
    want_st = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]
    assert {v["dtype"] for v in info["header"].values()} == {want_st}
    arch, tie = kw["arch"], kw.get("tie", True)
    names = hf_names(arch, 3, tie)
    assert set(tensors) == set(names) == set(weights)
    for name, a in tensors.items():
        assert np.array_equal(a, weights[name]), name
        assert weights[name].dtype == np.float64
    hidden, heads, kv = 64, 4, kw.get("kv_heads", 2)
    hd = kw.get("head_dim", hidden // heads)
    shapes = {"embed": (VOCAB, hidden), "norm": (hidden,),
              "q_proj": (heads * hd, hidden), "k_proj": (kv * hd, hidden),
              "v_proj": (kv * hd, hidden), "o_proj": (hidden, heads * hd),
              "gate_proj": (96, hidden), "up_proj": (96, hidden),
              "down_proj": (hidden, 96), "q_proj.bias": (heads * hd,),
              "k_proj.bias": (kv * hd,), "v_proj.bias": (kv * hd,),
              "head_norm": (hd,)}
    for name, kind in names.items():
        assert tensors[name].shape == shapes[kind], name
    assert cfg["model_type"] == arch
    assert cfg["architectures"] == [{"llama": "LlamaForCausalLM",
                                     "qwen2": "Qwen2ForCausalLM",
                                     "qwen3": "Qwen3ForCausalLM"}[arch]]
    assert cfg["tie_word_embeddings"] is tie
    assert cfg["num_key_value_heads"] == kv
    assert ("head_dim" in cfg) == ("head_dim" in kw)
    assert cfg["bos_token_id"] == 1 and cfg["eos_token_id"] == EOS
    assert cfg["max_position_embeddings"] == 4096
    assert cfg["rope_scaling"] == kw.get("rope_scaling")
    if arch == "qwen2":
        assert cfg["attention_bias"] is True


def test_tiny_model_bf16_f16_rounding(tmp_path: pathlib.Path) -> None:
    """bf16 is float32's top half rounded to nearest even; the returned
    weights are what was stored."""
    from tiny_model import _stored
    ulp = 2.0 ** -7
    x = np.array([1.0, 1 + ulp / 2, 1 + 1.5 * ulp, 1 + 0.75 * ulp, -3.0e-3])
    got, raw = _stored(x, "bfloat16")
    assert got[:4].tolist() == [1.0, 1.0, 1 + 2 * ulp, 1 + ulp]
    assert np.frombuffer(raw, "<u2")[0] == 0x3F80
    assert abs(got[4] - x[4]) <= abs(x[4]) * 2.0 ** -8
    h, _ = _stored(x, "float16")
    assert np.array_equal(h, x.astype(np.float16).astype(np.float64))
    w = write_model(tmp_path, dtype="bfloat16", seed=9)
    for a in w.values():  # exactly representable in bf16: low bits zero
        assert np.all((a.astype(np.float32).view(np.uint32) & 0xFFFF) == 0)


@pytest.mark.parametrize("key", ["llama", "qwen2", "qwen3", "llama3-rope"])
def test_reference_is_causal(key: str) -> None:
    ref = model(key).ref
    seq = make_prompt(30, 11)
    full = ref.logits(seq)
    assert full.shape == (30, VOCAB)
    for k in (1, 7, 20):
        np.testing.assert_allclose(ref.logits(seq[:k]), full[:k],
                                   rtol=0, atol=1e-9)
    # ... and attention does look back: changing token 3 changes later rows.
    changed = list(seq)
    changed[3] = 3 + (seq[3] - 3 + 1) % (VOCAB - 3)
    other = ref.logits(changed)
    np.testing.assert_allclose(other[:3], full[:3], rtol=0, atol=1e-9)
    assert np.abs(other[10:] - full[10:]).max() > 1e-3


def _incremental_last_logits(weights: Mapping[str, np.ndarray],
                             cfg: Mapping[str, Any],
                             tokens: Sequence[int]) -> np.ndarray:
    """A second, token-at-a-time implementation (a KV cache, explicit RoPE on
    (i, i + d/2) pairs, explicit GQA indexing), to cross-check Reference's
    vectorised one. Returns the logits of every position."""
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kvh = cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or hidden // heads
    eps = cfg["rms_norm_eps"]
    from tiny_model import rope_inv_freq
    inv = rope_inv_freq(d, cfg["rope_theta"], cfg["rope_scaling"])
    layers = cfg["num_hidden_layers"]
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])

    def rms(v: np.ndarray, w: np.ndarray) -> np.ndarray:
        out: np.ndarray = v / math.sqrt(float(np.dot(v, v)) / v.size + eps) * w
        return out

    def rope(v: np.ndarray, pos: int) -> np.ndarray:
        out = v.copy()
        for i in range(d // 2):
            c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
            a, b = v[i], v[i + d // 2]
            out[i], out[i + d // 2] = a * c - b * s, b * c + a * s
        return out

    kcache: List[List[List[np.ndarray]]] = [[[] for _ in range(kvh)] for _ in range(layers)]
    vcache: List[List[List[np.ndarray]]] = [[[] for _ in range(kvh)] for _ in range(layers)]
    rows = []
    for pos, t in enumerate(tokens):
        x = weights["model.embed_tokens.weight"][t].copy()
        for li in range(layers):
            p = f"model.layers.{li}."

            def W(n: str, p: str = p) -> np.ndarray:
                return np.asarray(weights[p + n])

            h = rms(x, W("input_layernorm.weight"))
            attn = np.zeros(heads * d)
            for g in range(kvh):
                kk = W("self_attn.k_proj.weight")[g * d:(g + 1) * d] @ h
                vv = W("self_attn.v_proj.weight")[g * d:(g + 1) * d] @ h
                if p + "self_attn.k_proj.bias" in weights:
                    kk = kk + W("self_attn.k_proj.bias")[g * d:(g + 1) * d]
                    vv = vv + W("self_attn.v_proj.bias")[g * d:(g + 1) * d]
                if p + "self_attn.k_norm.weight" in weights:
                    kk = rms(kk, W("self_attn.k_norm.weight"))
                kcache[li][g].append(rope(kk, pos))
                vcache[li][g].append(vv)
            for j in range(heads):
                g = j * kvh // heads
                qq = W("self_attn.q_proj.weight")[j * d:(j + 1) * d] @ h
                if p + "self_attn.q_proj.bias" in weights:
                    qq = qq + W("self_attn.q_proj.bias")[j * d:(j + 1) * d]
                if p + "self_attn.q_norm.weight" in weights:
                    qq = rms(qq, W("self_attn.q_norm.weight"))
                qq = rope(qq, pos)
                scores = np.array([float(qq @ kk) for kk in kcache[li][g]]) / math.sqrt(d)
                pr = np.exp(scores - scores.max())
                pr /= pr.sum()
                attn[j * d:(j + 1) * d] = sum(a * vv for a, vv in zip(pr, vcache[li][g]))
            x = x + W("self_attn.o_proj.weight") @ attn
            h = rms(x, W("post_attention_layernorm.weight"))
            gate = W("mlp.gate_proj.weight") @ h
            up = W("mlp.up_proj.weight") @ h
            x = x + W("mlp.down_proj.weight") @ (gate / (1 + np.exp(-gate)) * up)
        rows.append(head @ rms(x, weights["model.norm.weight"]))
    return np.array(rows)


@pytest.mark.parametrize("key", list(MODELS))
def test_reference_agrees_with_token_by_token(key: str) -> None:
    m = model(key)
    seq = make_prompt(24, 12)
    np.testing.assert_allclose(
        _incremental_last_logits(m.weights, m.config, seq),
        m.ref.logits(seq), rtol=1e-10, atol=1e-10)


def test_llama3_rope_scaling_bands() -> None:
    """head_dim 16, theta 1e4, original context 32, low/high 1/4: wavelengths
    6.3 (kept), 20.9 (smoothed), >= 62.8 (divided by 8)."""
    from tiny_model import rope_inv_freq
    plain = rope_inv_freq(16, 1e4, None)
    scaled = rope_inv_freq(16, 1e4, LLAMA3_SCALING)
    assert scaled[0] == plain[0]
    np.testing.assert_allclose(scaled[2:], plain[2:] / 8, rtol=1e-15)
    # wavelength 2*pi*10: smooth = (32/wl - 1)/3; (1-s)*f/8 + s*f
    wl = 2 * math.pi / plain[1]
    s = (32 / wl - 1) / 3
    assert 0 < s < 1
    assert scaled[1] == pytest.approx((1 - s) * plain[1] / 8 + s * plain[1], rel=1e-14)


@pytest.mark.parametrize("key", list(MODELS))
def test_reference_greedy_not_degenerate(key: str) -> None:
    tokens = model(key).ref.greedy(make_prompt(7, 13), 20)
    assert len(set(tokens)) >= 4, tokens


def test_reference_cases_have_clear_winners() -> None:
    """Every reference result the engine tests compare with has a top-2 logit
    margin > MIN_MARGIN at every step (see the module docstring); and the
    EOS case does emit EOS mid-way."""
    for key, prompt, n in GREEDY_CASES:
        expected(key, prompt, n)
    tokens = expected("llama", EOS_PROMPT, EOS_NEW)
    assert EOS in tokens[1:-1], tokens
    assert tokens.index(EOS) == EOS_STEP


def test_tokenizer_files(tmp_path: pathlib.Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    write_tokenizer(tmp_path, VOCAB)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB
    for text, ids in zip(TEXT_PROMPTS, TEXT_IDS):
        assert tok.encode(text).ids == ids[1:]
    assert tok.decode([1, 5, 2, 17, 0, 40]) == "w5 w17 w40"
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<s>" and cfg["add_bos_token"] is True
    # The engine's tokenizer reads these files as meant: BOS first.
    try:
        from vflow._tokenizer import Tokenizer
    except ImportError:
        return
    write_model(tmp_path, seed=0)
    vt = Tokenizer.from_model(tmp_path)
    for text, ids in zip(TEXT_PROMPTS, TEXT_IDS):
        assert vt.encode(text) == ids
    assert vt.decode([1, 5, 2, 17]) == "w5 w17"
    assert vt.eos_token_ids == [EOS]


# ---------------------------------------------------------------------------
# The engine.


def greedy_params(n: int = N_NEW, ignore_eos: bool = True) -> Any:
    return vflow.SamplingParams(max_tokens=n, temperature=0.0,
                                ignore_eos=ignore_eos)


def ids(x: Any) -> List[int]:
    return [int(t) for t in x]


def check(out: Any, prompt: Sequence[int], want: Sequence[int],
          finish: str = "length") -> None:
    assert out.error is None, out.error
    assert ids(out.prompt_token_ids) == list(prompt)
    assert ids(out.token_ids) == list(want)
    assert out.finish_reason == finish


def llm(key: str, **kw: Any) -> Any:
    kw.setdefault("kv_dtype", "f32")
    kw.setdefault("device", "cpu")
    return vflow.LLM(str(model(key).path), **kw)


def generate_alone(engine: Any, prompts: Sequence[Sequence[int]],
                   params: Any) -> List[List[int]]:
    return [ids(engine.generate([list(p)], params)[0].token_ids)
            for p in prompts]


STATS_KEYS = ("running", "waiting", "pages_used", "pages_total",
              "prefix_hits", "prefix_queries", "steps", "preemptions")


def assert_idle(engine: Any) -> Dict[str, Any]:
    s = engine.stats()
    assert s["running"] == 0 and s["waiting"] == 0, s
    return dict(s)


@needs_engine
@pytest.mark.parametrize("key", list(MODELS))
def test_greedy_matches_reference(key: str) -> None:
    engine = llm(key)
    for n in PROMPT_LENGTHS:
        prompt = make_prompt(n, 0)
        want = expected(key, prompt, N_NEW)
        (out,) = engine.generate([prompt], greedy_params())
        check(out, prompt, want)
        assert out.text is None  # no tokenizer in this model dir


@needs_engine
def test_stats_keys_and_prompt_forms() -> None:
    engine = llm("llama")
    s = engine.stats()
    for k in STATS_KEYS:
        assert k in s, k
        assert isinstance(s[k], int) and s[k] >= 0, (k, s[k])
    assert s["pages_total"] > 0
    prompt = make_prompt(5, 0)
    want = expected("llama", prompt, N_NEW)
    single = engine.generate(prompt, greedy_params())  # one list[int]
    assert isinstance(single, list) and len(single) == 1
    check(single[0], prompt, want)
    s = assert_idle(engine)
    assert s["steps"] > 0


@needs_engine
@pytest.mark.parametrize("key", ["llama", "qwen3"])
@pytest.mark.parametrize("form", ["path", "program"])
def test_flow_covering_every_block_equals_dense(key: str, form: str) -> None:
    """Quest with a budget above the number of blocks selects every block in
    every layer (dense_layers=0): attention is dense, tokens equal flow=None
    and the reference. (With budget 1 the same prompts decode differently:
    the flow is in the decode path, so the equality is not vacuous.)"""
    flow: Any
    if form == "path":
        flow, params = str(QUEST), {"budget": 100000}
    else:
        flow = vflow.compile(QUEST.read_text(), params={"budget": 100000})
        params = None
    sparse = llm(key, flow=flow, params=params, dense_layers=0, block_size=16)
    dense = llm(key, flow=None, block_size=16)
    p = greedy_params(20)
    got = sparse.generate(FLOW_PROMPTS, p)
    base = dense.generate(FLOW_PROMPTS, p)
    for prompt, o, b in zip(FLOW_PROMPTS, got, base):
        want = expected(key, prompt, 20)
        check(b, prompt, want)
        check(o, prompt, want)
    if form == "path":
        tight = llm(key, flow=str(QUEST), params={"budget": 1},
                    dense_layers=0, block_size=16).generate(FLOW_PROMPTS, p)
        assert any(ids(t.token_ids) != ids(b.token_ids)
                   for t, b in zip(tight, base))


@needs_engine
def test_chunked_prefill_equals_unchunked() -> None:
    prompts = [make_prompt(40, 0), make_prompt(17, 0)]
    chunked = llm("llama", max_tokens_per_step=8).generate(prompts, greedy_params())
    whole = llm("llama").generate(prompts, greedy_params())
    for prompt, c, w in zip(prompts, chunked, whole):
        want = expected("llama", prompt, N_NEW)
        check(w, prompt, want)
        check(c, prompt, want)


@needs_engine
@pytest.mark.parametrize("key", ["llama", "qwen3"])
@pytest.mark.parametrize("max_batch", [64, 2])
def test_continuous_batching(key: str, max_batch: int) -> None:
    """Five prompts of different lengths in one generate() (all at once, or
    at most two running with max_batch=2) equal each one generated alone and
    the reference, in prompt order."""
    engine = llm(key, max_batch=max_batch)
    outs = engine.generate(BATCH_PROMPTS, greedy_params())
    assert len(outs) == len(BATCH_PROMPTS)
    alone = generate_alone(engine, BATCH_PROMPTS, greedy_params())
    for prompt, o, a in zip(BATCH_PROMPTS, outs, alone):
        want = expected(key, prompt, N_NEW)
        assert a == want
        check(o, prompt, want)
    assert_idle(engine)


@needs_engine
def test_preemption() -> None:
    """4 pages of 16 tokens; 4 requests of 6 prompt + 36 new tokens (3 pages
    each: each fits alone, all 4 need 12). They must be preempted and
    resumed, with the same tokens as a large pool."""
    p = greedy_params(PREEMPT_NEW)
    small = llm("llama", block_size=16, kv_pool_tokens=64,
                enable_prefix_caching=False)
    outs = small.generate(PREEMPT_PROMPTS, p)
    big = llm("llama", block_size=16, enable_prefix_caching=False)
    base = big.generate(PREEMPT_PROMPTS, p)
    for prompt, o, b in zip(PREEMPT_PROMPTS, outs, base):
        want = expected("llama", prompt, PREEMPT_NEW)
        check(b, prompt, want)
        check(o, prompt, want)
    s = assert_idle(small)
    assert s["preemptions"] > 0, s
    assert s["pages_used"] == 0, s
    assert assert_idle(big)["preemptions"] == 0


@needs_engine
def test_prefix_caching() -> None:
    """P (40 tokens: 2 full blocks of 16), then P + 10 more: the second
    request reuses P's blocks; tokens equal a run without caching and the
    reference. The same prompt again gives the same tokens."""
    longer = PREFIX_P + PREFIX_EXTRA
    engine = llm("llama", block_size=16)
    (first,) = engine.generate([PREFIX_P], greedy_params())
    check(first, PREFIX_P, expected("llama", PREFIX_P, N_NEW))
    before = engine.stats()
    (second,) = engine.generate([longer], greedy_params())
    after = engine.stats()
    assert after["prefix_hits"] > before["prefix_hits"], (before, after)
    assert after["prefix_queries"] > 0
    plain = llm("llama", block_size=16, enable_prefix_caching=False)
    (base,) = plain.generate([longer], greedy_params())
    want = expected("llama", longer, N_NEW)
    check(base, longer, want)
    check(second, longer, want)
    assert plain.stats()["prefix_hits"] == 0

    (again,) = engine.generate([PREFIX_P], greedy_params())
    assert engine.stats()["prefix_hits"] > after["prefix_hits"]
    check(again, PREFIX_P, ids(first.token_ids))
    # the same prompt twice in one batch
    twins = engine.generate([longer, longer], greedy_params())
    check(twins[0], longer, want)
    check(twins[1], longer, want)
    assert_idle(engine)


@needs_engine
def test_prefix_caching_with_sparse_flow() -> None:
    """With Quest selecting 1 block in every layer (so its per-block
    kmax/kmin decide what is attended), reusing P's cached blocks (pages
    and cache fields) must give the tokens of recomputing them. No reference
    here (the sparse model is not the dense one): the tokens differ from
    dense ones, so the flow does matter for this prompt."""
    longer = PREFIX_P + PREFIX_EXTRA
    kw: Dict[str, Any] = dict(flow=str(QUEST), params={"budget": 1},
                              dense_layers=0, block_size=16)
    cached = llm("llama", **kw)
    cached.generate([PREFIX_P], greedy_params())
    hits = cached.stats()["prefix_hits"]
    (second,) = cached.generate([longer], greedy_params(20))
    assert cached.stats()["prefix_hits"] > hits
    plain = llm("llama", enable_prefix_caching=False, **kw)
    (base,) = plain.generate([longer], greedy_params(20))
    assert base.error is None and second.error is None
    assert len(ids(base.token_ids)) == 20
    assert ids(second.token_ids) == ids(base.token_ids)
    (dense,) = llm("llama", block_size=16).generate([longer], greedy_params(20))
    assert ids(dense.token_ids) != ids(base.token_ids)


@needs_engine
def test_no_page_leaked() -> None:
    prompts = LEAK_PROMPTS
    plain = llm("llama", block_size=16, enable_prefix_caching=False)
    plain.generate(prompts, greedy_params(9))
    plain.generate(prompts[:1], greedy_params(1))
    s = assert_idle(plain)
    assert s["pages_used"] == 0, s
    assert s["pages_total"] > 0

    cached = llm("llama", block_size=16)
    cached.generate(prompts, greedy_params(9))
    cached.generate(prompts, greedy_params(9))  # the same again: cache hits
    assert cached.stats()["prefix_hits"] > 0
    assert_idle(cached)
    cached.clear_prefix_cache()
    s = cached.stats()
    assert s["pages_used"] == 0, s
    # and it still works after clearing
    (o,) = cached.generate([prompts[2]], greedy_params())
    check(o, prompts[2], expected("llama", prompts[2], N_NEW))


@needs_engine
def test_step_by_step_and_abort() -> None:
    """The serving loop's API: add_request, step, abort. An aborted request
    ends with what it had, frees its pages, and leaves the others' tokens
    unchanged."""
    prompts = LEAK_PROMPTS[:3]
    engine = llm("llama", block_size=16, enable_prefix_caching=False)
    ids_ = [engine.add_request(p, greedy_params(12)) for p in prompts]
    done: Dict[int, Any] = {}
    for _ in range(3):
        for o in engine.step():
            done[o.request_id] = o
    aborted = engine.abort(ids_[1])
    assert aborted is not None and aborted.finish_reason == "abort"
    assert 0 < len(aborted.token_ids) < 12
    assert engine.abort(ids_[1]) is None  # already gone
    while engine.has_unfinished_requests():
        for o in engine.step():
            done[o.request_id] = o
    assert set(done) == {ids_[0], ids_[2]}
    for i in (0, 2):
        check(done[ids_[i]], prompts[i], expected("llama", prompts[i], 12))
    s = assert_idle(engine)
    assert s["pages_used"] == 0, s


@needs_engine
def test_error_for_one_request_only() -> None:
    """A prompt longer than the whole KV pool fails alone: finish_reason
    "error", a message naming its length; the others complete."""
    good = [make_prompt(5, 0), make_prompt(17, 0)]
    too_long = make_prompt(150, 7)
    engine = llm("llama", block_size=16, kv_pool_tokens=64,
                 enable_prefix_caching=False)
    outs = engine.generate([good[0], too_long, good[1]], greedy_params())
    assert len(outs) == 3
    bad = outs[1]
    assert bad.finish_reason == "error"
    assert bad.error and "150" in bad.error, bad.error
    assert ids(bad.token_ids) == []
    assert ids(bad.prompt_token_ids) == too_long
    for prompt, o in zip(good, (outs[0], outs[2])):
        check(o, prompt, expected("llama", prompt, N_NEW))
    s = assert_idle(engine)
    assert s["pages_used"] == 0, s


@needs_engine
def test_several_bad_requests_fail_alone() -> None:
    """Empty prompts and out-of-vocabulary ids, alone, together and among
    good prompts: each bad one ends with an error naming the problem."""
    good = make_prompt(5, 0)
    engine = llm("llama", enable_prefix_caching=False)
    for batch in ([[]], [[], [10 ** 6]], [[], good, [10 ** 6], [-1], good]):
        outs = engine.generate(batch, greedy_params())
        assert len(outs) == len(batch)
        for prompt, o in zip(batch, outs):
            if list(prompt) == good:
                check(o, good, expected("llama", good, N_NEW))
            else:
                assert o.finish_reason == "error", o
                assert o.error and ("empty" in o.error
                                    or "vocabulary" in o.error), o.error
    assert assert_idle(engine)["pages_used"] == 0


@needs_engine
def test_error_prompt_beyond_max_positions() -> None:
    """max_position_embeddings is 4096: a 4100-token prompt fails alone."""
    good = make_prompt(5, 0)
    too_long = make_prompt(4100, 8)
    engine = llm("llama", enable_prefix_caching=False)
    outs = engine.generate([too_long, good], greedy_params())
    assert outs[0].finish_reason == "error"
    assert outs[0].error and "4100" in outs[0].error, outs[0].error
    check(outs[1], good, expected("llama", good, N_NEW))
    assert assert_idle(engine)["pages_used"] == 0


@needs_engine
@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", -1), ("top_p", 0.0), ("top_p", 1.5),
    ("temperature", -0.5), ("top_k", -5)])
def test_bad_sampling_params(field: str, value: Any) -> None:
    """Raised by SamplingParams or at the latest by generate(), as a
    ValueError naming the field."""
    engine = llm("llama")
    with pytest.raises(ValueError, match=field):
        sp = vflow.SamplingParams(**{field: value})
        engine.generate([make_prompt(5, 0)], sp)


@needs_engine
def test_missing_model_path(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(Exception) as info:
        vflow.LLM(str(missing), kv_dtype="f32")
    assert str(missing) in str(info.value)


def sampling(seed: Optional[int], **kw: Any) -> Any:
    args: Dict[str, Any] = dict(max_tokens=16, temperature=0.8, top_p=0.9,
                                top_k=20, seed=seed, ignore_eos=True)
    args.update(kw)
    return vflow.SamplingParams(**args)


@needs_engine
def test_sampling_seed_reproducible() -> None:
    engine = llm("llama")
    a = [ids(o.token_ids) for o in engine.generate(SAMPLE_PROMPTS, sampling(123))]
    b = [ids(o.token_ids) for o in engine.generate(SAMPLE_PROMPTS, sampling(123))]
    c = [ids(o.token_ids) for o in llm("llama").generate(SAMPLE_PROMPTS, sampling(123))]
    assert a == b == c
    assert all(len(t) == 16 and all(0 <= x < VOCAB for x in t) for t in a)


@needs_engine
def test_sampling_seeds_differ() -> None:
    engine = llm("llama")
    a = [ids(o.token_ids) for o in engine.generate(SAMPLE_PROMPTS, sampling(123))]
    b = [ids(o.token_ids) for o in engine.generate(SAMPLE_PROMPTS, sampling(456))]
    assert a != b
    greedy = [ids(o.token_ids) for o in engine.generate(SAMPLE_PROMPTS, greedy_params(16))]
    assert a != greedy and b != greedy


@needs_engine
def test_sampling_top_k() -> None:
    """top_k=1 is greedy whatever the temperature; with top_k=3 every
    sampled token is among the reference's 3 largest logits at its step."""
    engine = llm("llama")
    outs = engine.generate(SAMPLE_PROMPTS, sampling(7, top_k=1, top_p=1.0,
                                                    temperature=1.5))
    for prompt, o in zip(SAMPLE_PROMPTS, outs):
        check(o, prompt, expected("llama", prompt, 16))
    ref = model("llama").ref
    outs = engine.generate(SAMPLE_PROMPTS, sampling(8, top_k=3, top_p=1.0,
                                                    temperature=2.0))
    for prompt, o in zip(SAMPLE_PROMPTS, outs):
        toks = ids(o.token_ids)
        rows = ref.logits(prompt + toks[:-1])[len(prompt) - 1:]
        for step, (t, row) in enumerate(zip(toks, rows)):
            third = np.sort(row)[-3]
            assert row[t] > third - MIN_MARGIN, (prompt, step, t)


@needs_engine
def test_eos_stops_generation() -> None:
    """Greedy decoding of EOS_PROMPT emits EOS (2) at step EOS_STEP: with
    ignore_eos=False the output ends with that EOS, finish_reason "stop";
    with ignore_eos=True it runs on to max_tokens."""
    engine = llm("llama")
    full = expected("llama", EOS_PROMPT, EOS_NEW)
    assert full.index(EOS) == EOS_STEP
    (stop,) = engine.generate([EOS_PROMPT], greedy_params(EOS_NEW, ignore_eos=False))
    check(stop, EOS_PROMPT, full[:EOS_STEP + 1], finish="stop")
    (run_on,) = engine.generate([EOS_PROMPT], greedy_params(EOS_NEW, ignore_eos=True))
    check(run_on, EOS_PROMPT, full)
    # Sampled: whenever EOS comes, it is the last token.
    outs = engine.generate([make_prompt(n, 10) for n in (3, 8, 13, 21)] * 3,
                           sampling(5, ignore_eos=False, max_tokens=24,
                                    temperature=1.0, top_k=0, top_p=1.0))
    for o in outs:
        t = ids(o.token_ids)
        assert EOS not in t[:-1]
        if t and t[-1] == EOS:
            assert o.finish_reason == "stop"
        else:
            assert o.finish_reason == "length" and len(t) == 24


@needs_engine
def test_text_prompts(tmp_path: pathlib.Path) -> None:
    """With tokenizer.json in the model dir: text prompts are encoded (BOS
    first, as tokenizer_config.json asks) and o.text decodes o.token_ids
    (special tokens left out, words joined with spaces)."""
    path = tmp_path / "llama-text"
    write_model(path, **MODELS["llama"])
    write_tokenizer(path, VOCAB)
    engine = vflow.LLM(str(path), kv_dtype="f32", device="cpu")
    outs = engine.generate(TEXT_PROMPTS, greedy_params())
    for text, prompt, o in zip(TEXT_PROMPTS, TEXT_IDS, outs):
        check(o, prompt, expected("llama", prompt, N_NEW))
        assert o.text == " ".join(f"w{t}" for t in ids(o.token_ids) if t >= 3)
    (one,) = engine.generate(TEXT_PROMPTS[0], greedy_params())  # a single str
    check(one, TEXT_IDS[0], ids(outs[0].token_ids))
    (ided,) = engine.generate([TEXT_IDS[1]], greedy_params())  # ids still work
    check(ided, TEXT_IDS[1], ids(outs[1].token_ids))
    assert ided.text == outs[1].text
