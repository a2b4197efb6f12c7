#!/usr/bin/env python3
"""Hugging Face model directories that vLLM loads offline (issue 30).

  python lab/tools/hf_model.py from-gguf GGUF OUT [--dtype bfloat16]
  python lab/tools/hf_model.py random --shape qwen3-1.7b OUT
  python lab/tools/hf_model.py check DIR
  python lab/tools/hf_model.py compare GGUF DIR [--tokens 16] [--prompt TEXT]

from-gguf: transformers' own GGUF loading (AutoModelForCausalLM /
AutoTokenizer .from_pretrained(dir, gguf_file=...); needs torch,
transformers, gguf and accelerate) dequantizes the weights to --dtype;
written as config.json, model.safetensors, generation_config.json,
tokenizer.json and tokenizer_config.json with the GGUF's chat template.
transformers refuses to save a model it loaded from a GGUF (its quantizer
is marked unserializable), so the weights are saved from the state dict,
and the tokenizer's special tokens are set from the GGUF's ids (for
SmolLM2, transformers 5.17 names <|im_start|> its EOS; the GGUF says
<|im_end|>).

random: lab/tools/engine_shapes.py's model of a real shape (SHAPES,
make_model: random bf16 weights, needs torch and CUDA) with
tests/python/tiny_model.py's word-level tokenizer, plus what vLLM needs on
top: the architecture vLLM's registry knows (make_model writes
ModelForCausalLM), the dtype, generation_config.json and a chat template.

check: config.json has what vLLM's Llama/Qwen2/Qwen3 loaders read and
model.safetensors holds exactly the tensors they load, with the shapes the
config implies (run at the end of the two above).

compare: greedy tokens of vflow's engine on the GGUF and on DIR, and of
transformers on DIR when it is installed: the three lists and where they
part."""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# The architecture vLLM's model registry knows, per config.json model_type.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}

# A chat template for the word-level tokenizer of `random` (words "w3" ..):
# the messages' contents after BOS, separated by spaces. vLLM's chat
# endpoint tokenizes the rendered text without adding special tokens.
WORD_CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}"
                      "{{ message['content'] }}{% if not loop.last %} {% endif %}"
                      "{% endfor %}")


# ---------------------------------------------------------------------------
# check: what vLLM's loaders read.


def read_safetensors_header(path: Path) -> Dict[str, Dict[str, Any]]:
    """name -> {"dtype", "shape", "data_offsets"} of a .safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > os.path.getsize(path) - 8:
            raise ValueError(f"{path}: header length {n} past the end of the file")
        header: Dict[str, Dict[str, Any]] = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def expected_tensors(cfg: Mapping[str, Any]) -> Dict[str, Tuple[int, ...]]:
    """The tensors (Hugging Face names) and shapes a Llama/Qwen2/Qwen3
    decoder of this config has: what vLLM's load_weights looks for."""
    kind = cfg["model_type"]
    E, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, L = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    K = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or E // H
    bias = kind == "qwen2" or bool(cfg.get("attention_bias"))
    out: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (V, E),
                                       "model.norm.weight": (E,)}
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (V, E)
    for i in range(L):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (E,),
                    p + "post_attention_layernorm.weight": (E,),
                    p + "self_attn.q_proj.weight": (H * D, E),
                    p + "self_attn.k_proj.weight": (K * D, E),
                    p + "self_attn.v_proj.weight": (K * D, E),
                    p + "self_attn.o_proj.weight": (E, H * D),
                    p + "mlp.gate_proj.weight": (I, E),
                    p + "mlp.up_proj.weight": (I, E),
                    p + "mlp.down_proj.weight": (E, I)})
        if bias:
            out.update({p + "self_attn.q_proj.bias": (H * D,),
                        p + "self_attn.k_proj.bias": (K * D,),
                        p + "self_attn.v_proj.bias": (K * D,)})
        if kind == "qwen3":
            out.update({p + "self_attn.q_norm.weight": (D,),
                        p + "self_attn.k_norm.weight": (D,)})
    return out


# config.json keys vLLM 0.26.0's LlamaForCausalLM / Qwen2ForCausalLM /
# Qwen3ForCausalLM read without a default (model_executor/models/llama.py,
# qwen2.py, qwen3.py; rope_parameters is transformers 5's view of
# rope_theta and rope_scaling).
REQUIRED_KEYS = ("architectures", "model_type", "vocab_size", "hidden_size",
                 "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "hidden_act",
                 "max_position_embeddings", "tie_word_embeddings")


def check(directory: Path) -> List[str]:
    """What vLLM would miss in `directory` (empty: nothing)."""
    problems: List[str] = []
    cfg_path = directory / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [f"{cfg_path}: {e}"]
    kind = cfg.get("model_type")
    if kind not in ARCHITECTURES:
        return [f"{cfg_path}: model_type {kind!r}: expected one of {sorted(ARCHITECTURES)}"]
    problems += [f"{cfg_path}: no {k!r}" for k in REQUIRED_KEYS if k not in cfg]
    if cfg.get("architectures") != [ARCHITECTURES[kind]]:
        problems.append(f"{cfg_path}: architectures {cfg.get('architectures')!r}, vLLM's "
                        f"registry loads {kind} as [{ARCHITECTURES[kind]!r}]")
    if "rope_theta" not in cfg and "theta" not in json.dumps(cfg.get("rope_parameters")):
        problems.append(f"{cfg_path}: no rope_theta (nor rope_parameters.rope_theta)")
    if cfg.get("dtype", cfg.get("torch_dtype")) not in ("bfloat16", "float16", "float32"):
        problems.append(f"{cfg_path}: no dtype (vLLM's dtype=auto reads it)")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if not (directory / name).is_file():
            problems.append(f"{directory / name}: missing")
    if problems:
        return problems
    st = directory / "model.safetensors"
    try:
        header = read_safetensors_header(st)
    except (OSError, ValueError) as e:
        return [f"{st}: {e}"]
    want = expected_tensors(cfg)
    problems += [f"{st}: no {n}" for n in sorted(set(want) - set(header))]
    problems += [f"{st}: {n} is not a weight of {ARCHITECTURES[kind]}"
                 for n in sorted(set(header) - set(want))]
    problems += [f"{st}: {n} has shape {header[n]['shape']}, the config says {list(s)}"
                 for n, s in sorted(want.items())
                 if n in header and tuple(header[n]["shape"]) != s]
    return problems


# ---------------------------------------------------------------------------
# from-gguf


def gguf_metadata(path: Path) -> Dict[str, Any]:
    """The GGUF's key/values this tool uses: special token ids, the BOS/EOS
    flags, the token strings and the chat template."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: Dict[str, Any] = {}
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                "tokenizer.chat_template", "tokenizer.ggml.tokens"):
        field = reader.fields.get(key)
        if field is not None:
            out[key] = field.contents()
    return out


def _special_tokens(meta: Mapping[str, Any]) -> Dict[str, str]:
    tokens: List[str] = meta.get("tokenizer.ggml.tokens", [])
    out = {}
    for attr, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is not None and 0 <= int(i) < len(tokens):
            out[attr] = tokens[int(i)]
    return out


def from_gguf(gguf_path: Path, out: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    d, name = str(gguf_path.parent), gguf_path.name
    meta = gguf_metadata(gguf_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    for attr, text in _special_tokens(meta).items():
        setattr(tok, attr, text)
    for flag in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{flag}" in meta:
            setattr(tok, flag, bool(meta[f"tokenizer.ggml.{flag}"]))
    if meta.get("tokenizer.chat_template"):
        tok.chat_template = meta["tokenizer.chat_template"]
    tok.model_max_length = int(AutoConfig.from_pretrained(d, gguf_file=name)
                               .max_position_embeddings)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name,
                                                 dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses a GGUF-quantized model; its state dict holds
    # the dequantized weights. A tied lm_head is the embedding: saved once,
    # under the embedding's name (vLLM's loaders skip lm_head when tied).
    config = model.config
    tensors = {n: t.detach().contiguous() for n, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = getattr(torch, dtype)
    config.architectures = [type(model).__name__]  # not set from a GGUF
    config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    _chat_template_into_config(out)


def _chat_template_into_config(out: Path) -> None:
    """transformers 5 saves the chat template as chat_template.jinja; older
    readers (and vflow's) look in tokenizer_config.json: keep it there."""
    jinja = out / "chat_template.jinja"
    tconfig_path = out / "tokenizer_config.json"
    tconfig = json.loads(tconfig_path.read_text())
    if jinja.is_file():
        tconfig["chat_template"] = jinja.read_text()
        jinja.unlink()
    tconfig_path.write_text(json.dumps(tconfig, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------
# random


def finish_for_vllm(out: Path, vocab: int, dtype: str = "bfloat16") -> None:
    """What vLLM needs beyond engine_shapes.make_model's config and
    weights: the registry's architecture name, the dtype, a tokenizer
    (tiny_model.write_tokenizer's words) with a chat template, and
    generation_config.json."""
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    from tiny_model import write_tokenizer

    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [ARCHITECTURES[cfg["model_type"]]]
    cfg["dtype"] = dtype
    cfg.setdefault("tie_word_embeddings", False)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    write_tokenizer(out, vocab)
    _bos_by_the_tokenizer(out / "tokenizer.json", "<s>")
    tconfig_path = out / "tokenizer_config.json"
    tconfig = json.loads(tconfig_path.read_text())
    tconfig["chat_template"] = WORD_CHAT_TEMPLATE
    tconfig["model_max_length"] = int(cfg.get("max_position_embeddings", 4096))
    tconfig_path.write_text(json.dumps(tconfig, indent=2) + "\n")
    gen = {"bos_token_id": cfg.get("bos_token_id", 1),
           "eos_token_id": cfg.get("eos_token_id", 2)}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def _bos_by_the_tokenizer(path: Path, bos: str) -> None:
    """write_tokenizer's tokenizer.json leaves BOS to tokenizer_config.json's
    add_bos_token, which vflow honours but transformers 5 (so vLLM) does
    not: a post-processor puts it first for them too. (vflow encodes with
    add_special_tokens=False and adds BOS itself: no second BOS.)"""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(path))
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    tok.save(str(path))


def random_model(shape: str, out: Path) -> None:
    sys.path.insert(0, str(HERE))
    from engine_shapes import SHAPES, make_model

    make_model(str(out), SHAPES[shape])
    finish_for_vllm(out, int(SHAPES[shape]["vocab_size"]))


# ---------------------------------------------------------------------------
# compare


def vflow_greedy(model: Path, prompt: str, n: int) -> Tuple[List[int], List[int]]:
    """(prompt ids, n greedy ids) of vflow's engine on `model` (EOS does
    not stop it)."""
    import vflow

    llm = vflow.LLM(str(model), device="cpu")
    ids = list(llm.tokenizer.encode(prompt))
    out = llm.generate([ids], vflow.SamplingParams(temperature=0.0, max_tokens=n,
                                                   ignore_eos=True))
    return ids, list(out[0].token_ids)


def transformers_greedy(model: Path, ids: Sequence[int], n: int) -> List[int]:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model), dtype="auto")
    with torch.no_grad():
        out = m.generate(torch.tensor([list(ids)]), max_new_tokens=n, do_sample=False,
                         min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(gguf_path: Path, directory: Path, prompt: str, n: int) -> int:
    ids, ref = vflow_greedy(gguf_path, prompt, n)
    ids_dir, got = vflow_greedy(directory, prompt, n)
    rows = [("vflow, GGUF", ref), ("vflow, DIR", got)]
    status = 0 if ids == ids_dir and ref == got else 1
    try:
        rows.append(("transformers, DIR", transformers_greedy(directory, ids, n)))
        status |= int(rows[-1][1] != ref)
    except ImportError as e:
        print(f"(no transformers run: {e})")
    print(f"prompt ids (GGUF's tokenizer): {ids}")
    if ids_dir != ids:
        print(f"prompt ids (DIR's tokenizer):  {ids_dir}  DIFFERENT")
    for what, toks in rows:
        at = first_difference(ref, toks)
        where = "same" if at is None else f"first differs at token {at}"
        print(f"{what:18s} {toks}  ({where})")
    return status


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Hugging Face model directories vLLM loads offline: a GGUF "
        "converted, or random weights of a real shape.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("from-gguf", help="convert a GGUF (transformers' loader)")
    g.add_argument("gguf", type=Path)
    g.add_argument("out", type=Path)
    g.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    r = sub.add_parser("random", help="random weights of a real shape")
    r.add_argument("--shape", required=True,
                   help="a name of lab/tools/engine_shapes.py's SHAPES (qwen3-1.7b, ...)")
    r.add_argument("out", type=Path)
    c = sub.add_parser("check", help="what vLLM's loaders would miss in DIR")
    c.add_argument("dir", type=Path)
    k = sub.add_parser("compare", help="greedy tokens: the GGUF vs DIR")
    k.add_argument("gguf", type=Path)
    k.add_argument("dir", type=Path)
    k.add_argument("--prompt", default="The capital of France is")
    k.add_argument("--tokens", type=int, default=16)
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    if a.cmd == "compare":
        return compare(a.gguf, a.dir, a.prompt, a.tokens)
    if a.cmd == "from-gguf":
        if not a.gguf.is_file():
            print(f"error: {a.gguf}: no such file", file=sys.stderr)
            return 2
        from_gguf(a.gguf, a.out, a.dtype)
    elif a.cmd == "random":
        sys.path.insert(0, str(HERE))
        from engine_shapes import SHAPES
        if a.shape not in SHAPES:
            print(f"error: --shape {a.shape!r}: expected one of {sorted(SHAPES)}",
                  file=sys.stderr)
            return 2
        random_model(a.shape, a.out)
    directory = a.out if a.cmd != "check" else a.dir
    problems = check(directory)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if not problems:
        print(f"{directory}: loadable by vLLM's "
              f"{json.loads((directory / 'config.json').read_text())['architectures'][0]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
