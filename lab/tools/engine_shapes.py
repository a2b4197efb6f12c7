"""Engine throughput on random-weight models with real shapes, made on the
GPU machine (device tool): dense attention vs flows in the same engine.
Usage: python lab/tools/engine_shapes.py OUT_DIR [--shape qwen3-1.7b]
[--contexts 4096,16384] [--batches 1,4] [--output-len 128]
[--flows dense,quest,eps:budget=8,hf] (hf: transformers' generate)
[--model DIR] [--device cuda|cpu] [--kv-dtype bf16|f16|fp8e4m3|int8].
The model is made once (torch, safetensors) in /tmp/vflow-models/SHAPE;
--model runs an existing Hugging Face directory instead (then neither is
needed: e.g. the CPU smoke test's tiny model with --device cpu).
Decode throughput counts the pure decode steps (every running request
one token), timed on the host around each engine step; steps that also
prefill are left out (vflow._eval.decode_speed: each prompt is prefilled
once first, so that in the timed run the prefills are prefix-cache hits
and prefill_s, to the first pure decode step, is mostly that lookup).
One JSON line per row, also appended to OUT_DIR/engine_shapes.jsonl: the
shape (or the --model directory's name), flow, params, batch (the
requests run together), context, output_len, made_s, load_s and
decode_speed's members, its `batch` (the requests a timed step decoded,
on average) as decode_batch."""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

SHAPES: Dict[str, Dict[str, Any]] = {
    # Qwen3-1.7B: 28 layers, 16 q / 8 kv heads of 128, q/k norms, tied.
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048,
                       intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1000000.0),
    # Llama-3.1-8B: 32 layers, 32 q / 8 kv heads of 128, untied.
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, vocab_size=128256,
                         tie_word_embeddings=False, rope_theta=500000.0),
    # Qwen3-30B-A3B's layers (32 q / 4 kv heads of 128, q/k norms, 128
    # experts of 768, 8 a token, renormalized), 12 of its 48: the whole
    # model's 61 GB of bf16 weights would not fit the GPU machine's disk as
    # a file; a step's time is per layer.
    "qwen3-30b-a3b-12l": dict(model_type="qwen3_moe", hidden_size=2048,
                              intermediate_size=6144, num_hidden_layers=12,
                              num_attention_heads=32, num_key_value_heads=4,
                              head_dim=128, vocab_size=151936,
                              tie_word_embeddings=False,
                              rope_theta=1000000.0, num_experts=128,
                              num_experts_per_tok=8,
                              moe_intermediate_size=768, norm_topk_prob=True,
                              decoder_sparse_step=1, mlp_only_layers=[]),
    # DeepSeek-V2-Lite (16B, 2.4B active): 27 layers of multi-head latent
    # attention (16 heads; a cached latent of 512 + 64; nope 128, v 128),
    # YaRN x40; a dense first layer, then 64 routed experts of 1408 (6 a
    # token, softmax, not renormalized) and 2 shared ones. 31 GB of bf16.
    "deepseek-v2-lite": dict(model_type="deepseek_v2", hidden_size=2048,
                             intermediate_size=10944, num_hidden_layers=27,
                             num_attention_heads=16, num_key_value_heads=16,
                             head_dim=None, vocab_size=102400,
                             tie_word_embeddings=False, rope_theta=10000.0,
                             kv_lora_rank=512, q_lora_rank=None,
                             qk_nope_head_dim=128, qk_rope_head_dim=64,
                             v_head_dim=128, n_routed_experts=64,
                             n_shared_experts=2, num_experts_per_tok=6,
                             moe_intermediate_size=1408,
                             first_k_dense_replace=1, moe_layer_freq=1,
                             routed_scaling_factor=1.0, topk_method="greedy",
                             n_group=1, topk_group=1, scoring_func="softmax",
                             norm_topk_prob=False, attention_bias=False,
                             rope_scaling={
                                 "type": "yarn", "factor": 40.0,
                                 "original_max_position_embeddings": 4096,
                                 "beta_fast": 32, "beta_slow": 1,
                                 "mscale": 0.707, "mscale_all_dim": 0.707}),
}
# DeepSeek-V2-Lite's first 4 layers (the dense one and 3 of its 26 MoE
# layers, 5 GB): a step's time per layer, for profiles that do not need the
# whole model made and loaded.
SHAPES["deepseek-v2-lite-4l"] = dict(SHAPES["deepseek-v2-lite"],
                                     num_hidden_layers=4)


def mla_tensors(t: Dict[str, Any], p: str, shape: Dict[str, Any],
                rnd: Any) -> None:
    """A DeepSeek layer's attention (no low-rank query)."""
    import torch

    E, H = shape["hidden_size"], shape["num_attention_heads"]
    C, R = shape["kv_lora_rank"], shape["qk_rope_head_dim"]
    N, V = shape["qk_nope_head_dim"], shape["v_head_dim"]
    a = p + "self_attn."
    t[a + "q_proj.weight"] = rnd(H * (N + R), E)
    t[a + "kv_a_proj_with_mqa.weight"] = rnd(C + R, E)
    t[a + "kv_a_layernorm.weight"] = torch.ones(C, dtype=torch.bfloat16)
    t[a + "kv_b_proj.weight"] = rnd(H * (N + V), C)
    t[a + "o_proj.weight"] = rnd(E, H * V)


def make_model(path: str, shape: Dict[str, Any]) -> None:
    """Random bf16 weights (std 0.02, norms 1) written as safetensors."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    cfg = {k: v for k, v in dict(
        shape, rms_norm_eps=1e-6, max_position_embeddings=262144,
        bos_token_id=1, eos_token_id=2, hidden_act="silu",
        architectures=["ModelForCausalLM"]).items() if v is not None}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    E, I = shape["hidden_size"], shape["intermediate_size"]
    H, K, D = (shape["num_attention_heads"], shape["num_key_value_heads"],
               shape["head_dim"] or 0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*dims: int) -> Any:
        return (torch.randn(*dims, generator=g, device=dev) * 0.02
                ).bfloat16().cpu()

    t: Dict[str, Any] = {
        "model.embed_tokens.weight": rnd(shape["vocab_size"], E),
        "model.norm.weight": torch.ones(E, dtype=torch.bfloat16)}
    if not shape["tie_word_embeddings"]:
        t["lm_head.weight"] = rnd(shape["vocab_size"], E)
    for l in range(shape["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = torch.ones(E, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(
            E, dtype=torch.bfloat16)
        if shape.get("kv_lora_rank"):
            mla_tensors(t, p, shape, rnd)
        else:
            t[p + "self_attn.q_proj.weight"] = rnd(H * D, E)
            t[p + "self_attn.k_proj.weight"] = rnd(K * D, E)
            t[p + "self_attn.v_proj.weight"] = rnd(K * D, E)
            t[p + "self_attn.o_proj.weight"] = rnd(E, H * D)
        if shape["model_type"] in ("qwen3", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = torch.ones(
                D, dtype=torch.bfloat16)
            t[p + "self_attn.k_norm.weight"] = torch.ones(
                D, dtype=torch.bfloat16)
        deepseek_moe = (shape["model_type"] == "deepseek_v2" and
                        l >= shape["first_k_dense_replace"])
        if deepseek_moe:
            EI = shape["moe_intermediate_size"]
            S = shape["n_shared_experts"] * EI
            sp = p + "mlp.shared_experts."
            t[sp + "gate_proj.weight"] = rnd(S, E)
            t[sp + "up_proj.weight"] = rnd(S, E)
            t[sp + "down_proj.weight"] = rnd(E, S)
        if shape["model_type"] == "qwen3_moe" or deepseek_moe:
            X = shape.get("num_experts") or shape["n_routed_experts"]
            EI = shape["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = rnd(X, E)
            for e in range(X):
                t[p + f"mlp.experts.{e}.gate_proj.weight"] = rnd(EI, E)
                t[p + f"mlp.experts.{e}.up_proj.weight"] = rnd(EI, E)
                t[p + f"mlp.experts.{e}.down_proj.weight"] = rnd(E, EI)
            continue
        t[p + "mlp.gate_proj.weight"] = rnd(I, E)
        t[p + "mlp.up_proj.weight"] = rnd(I, E)
        t[p + "mlp.down_proj.weight"] = rnd(E, I)
    save_file(t, os.path.join(path, "model.safetensors"))
    del t
    if dev == "cuda":
        torch.cuda.empty_cache()


def parse_flow(spec: str, budget: int) -> Tuple[str, Optional[Dict[str, Any]]]:
    """'quest' or 'eps:budget=8:alpha=1.2' -> (name, params)."""
    name, *rest = spec.split(":")
    if name in ("dense", "hf"):
        return name, None
    # The default budget for a flow that has one (examples/NAME.vflow).
    path = os.path.join(ROOT, "examples", name + ".vflow")
    with open(path, encoding="utf-8") as f:
        has_budget = "param budget" in f.read()
    params: Dict[str, Any] = {"budget": budget} if has_budget else {}
    for kv in rest:
        k, _, v = kv.partition("=")
        params[k] = float(v) if "." in v else int(v)
    return name, params


def hf_rows(a: argparse.Namespace, path: str, vocab: int,
            contexts: List[int], batches: List[int]) -> List[Dict[str, Any]]:
    """transformers' generate on the same weights (bf16, sdpa): decode
    ms per step = (time(1 + N tokens) - time(1 token)) / N."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    rows = []
    for context in contexts:
        for batch in batches:
            rng = random.Random(context)
            ids = torch.tensor([[rng.randrange(3, vocab)
                                 for _ in range(context)]
                                for _ in range(batch)], device="cuda")
            times = []
            try:
                for n in (1, 1 + a.output_len):
                    torch.cuda.synchronize()
                    t0 = time.time()
                    model.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False)
                    torch.cuda.synchronize()
                    times.append(time.time() - t0)
            except torch.OutOfMemoryError:
                rows.append(dict(shape=a.shape, flow="transformers",
                                 batch=batch, context=context,
                                 error="out of memory"))
                torch.cuda.empty_cache()
                continue
            step = (times[1] - times[0]) / a.output_len
            rows.append(dict(shape=a.shape, flow="transformers", batch=batch,
                             context=context, output_len=a.output_len,
                             prefill_s=round(times[0], 2),
                             decode_tok_s=round(batch / step, 1),
                             ms_per_step=round(step * 1000, 3)))
    del model
    torch.cuda.empty_cache()
    return rows


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """OUT_DIR, the model (--shape or --model) and --device: the arguments
    this tool and engine_profile.py share."""
    ap.add_argument("out")
    ap.add_argument("--shape", default="qwen3-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None,
                    help="an existing model directory instead of the "
                    "random one of --shape")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))


def check_model_args(ap: argparse.ArgumentParser,
                     a: argparse.Namespace) -> None:
    """Refuses a --model directory without config.json (before any run)."""
    if a.model is not None and not os.path.isfile(
            os.path.join(a.model, "config.json")):
        ap.error(f"--model: {a.model} has no config.json")


def model_dir(a: argparse.Namespace) -> Tuple[str, str, int]:
    """The model's directory, its name in the rows and its vocabulary size:
    --model as it is, or --shape's random model (made once, in
    /tmp/vflow-models/SHAPE)."""
    if a.model is not None:
        with open(os.path.join(a.model, "config.json")) as f:
            vocab = int(json.load(f)["vocab_size"])
        return a.model, os.path.basename(os.path.normpath(a.model)), vocab
    path = f"/tmp/vflow-models/{a.shape}"
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        make_model(path, SHAPES[a.shape])
    return path, a.shape, int(SHAPES[a.shape]["vocab_size"])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Engine decode throughput, dense vs flows "
        "(OUT_DIR/engine_shapes.jsonl).")
    add_model_args(ap)
    ap.add_argument("--contexts", default="16384")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--flows", default="dense,quest,block_topk",
                    help="names (examples/NAME.vflow), 'dense', 'hf' "
                    "(transformers), params as NAME:k=v:k=v")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--kv-dtype", default="bf16",
                    help="the KV cache's dtype (rows say it as kv_dtype)")
    a = ap.parse_args(argv)
    try:
        a.contexts = [int(c) for c in a.contexts.split(",")]
        a.batches = [int(b) for b in a.batches.split(",")]
    except ValueError as e:
        ap.error(f"--contexts and --batches are comma-separated ints: {e}")
    if min(a.contexts + a.batches) < 1 or a.output_len < 1:
        ap.error("--contexts, --batches and --output-len must be >= 1")
    flows = a.flows.split(",")
    if a.device != "cuda" and "hf" in flows:
        ap.error("--flows: hf (transformers' generate) runs on cuda only")
    for spec in flows:
        name = spec.split(":")[0]
        if name not in ("dense", "hf") and not os.path.isfile(
                os.path.join(ROOT, "examples", f"{name}.vflow")):
            ap.error(f"--flows: {name}: no examples/{name}.vflow")
    check_model_args(ap, a)
    return a


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    out = open(os.path.join(a.out, "engine_shapes.jsonl"), "a")
    t0 = time.time()
    path, shape, vocab = model_dir(a)
    made_s = time.time() - t0
    contexts, batches = a.contexts, a.batches

    def emit(row: Dict[str, Any]) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()

    for spec in a.flows.split(","):
        flow, params = parse_flow(spec, a.budget)
        if flow == "hf":
            for row in hf_rows(a, path, vocab, contexts, batches):
                emit(row)
            continue
        import vflow

        prog = None if flow == "dense" else os.path.join(
            ROOT, "examples", f"{flow}.vflow")
        # One engine per flow, sized for the largest shape; prefix caching
        # spares the prefill of prompts a smaller batch already ran.
        t0 = time.time()
        llm = vflow.LLM(path, flow=prog, params=params, device=a.device,
                        kv_dtype=a.kv_dtype, max_batch=max(batches),
                        kv_pool_tokens=max(batches) * (
                            max(contexts) + a.output_len + 64) + 4096,
                        max_tokens_per_step=max(contexts))
        load_s = time.time() - t0
        # Warm-up: loads every kernel (a short prompt, a few steps).
        llm.generate([[5 % vocab] * 64], vflow.SamplingParams(max_tokens=4))
        for context in contexts:
            rng = random.Random(context)
            prompts = [[rng.randrange(3, vocab) for _ in range(context)]
                       for _ in range(max(batches))]
            for batch in batches:
                emit(dict(shape=shape, flow=flow, params=params,
                          kv_dtype=a.kv_dtype, batch=batch, context=context,
                          output_len=a.output_len, made_s=round(made_s, 1),
                          load_s=round(load_s, 1),
                          **run_batch(llm, prompts[:batch], a.output_len)))
        del llm
    return 0


def run_batch(llm: Any, prompts: List[List[int]],
              output_len: int) -> Dict[str, Any]:
    """vflow's decode timing (vflow._eval.decode_speed), its `batch` (the
    requests a timed step decoded, on average) renamed decode_batch: the
    row's own `batch` is the number of requests run together. First the
    prompts' prefill is timed (prefill_tokens: those not already in the
    prefix cache, e.g. from a smaller batch's run; prefill_tok_s), which
    leaves them cached for the decode timing."""
    import vflow
    from vflow._eval import decode_speed

    before = llm.stats()
    t0 = time.time()
    llm.generate(list(prompts), vflow.SamplingParams(max_tokens=1))
    fill_s = time.time() - t0
    filled = llm.stats()["tokens_computed"] - before["tokens_computed"]
    speed = dict(decode_speed(llm, prompts, output_len))
    speed["prefill_tokens"] = filled
    speed["prefill_tok_s"] = round(filled / fill_s, 1) if fill_s else None
    speed["decode_batch"] = speed.pop("batch", None)
    return speed


if __name__ == "__main__":
    raise SystemExit(main())
