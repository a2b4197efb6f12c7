"""The engine on a real model on the GPU machine (device tool), against
Hugging Face transformers on the same dequantized weights, then a small
throughput table. Usage: python lab/tools/engine_check.py MODEL.gguf OUT_DIR
(vflow importable; torch and transformers installed; a CUDA device; a
llama-arch model). Prints one JSON line per check and writes them to
OUT_DIR/engine_check.jsonl."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any, Dict, List

import vflow
from vflow import _vflow
from vflow._tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
H2O = os.path.join(ROOT, "examples", "h2o.vflow")
QUEST = os.path.join(ROOT, "examples", "quest.vflow")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write a short poem about the sea.",
    "The three primary colors are",
    "One of the special magic numbers for blue-dog is: 4812. What is the "
    "special magic number for blue-dog? The special magic number for "
    "blue-dog is:",
]


def emit(out: Any, row: Dict[str, Any]) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


def rel(flow: Any) -> Any:
    """A flow file as the rows name it: relative to the repository."""
    return os.path.relpath(flow, ROOT) if flow else None


def transformers_model(path: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    f = _vflow.ModelFile(path)
    c = json.loads(f.config())
    if c["arch"] != "llama":
        raise SystemExit("engine_check: only llama-arch files here")
    cfg = LlamaConfig(
        vocab_size=c["vocabSize"], hidden_size=c["hiddenSize"],
        intermediate_size=c["intermediateSize"],
        num_hidden_layers=c["numLayers"], num_attention_heads=c["numHeads"],
        num_key_value_heads=c["numKVHeads"], head_dim=c["headDim"],
        rms_norm_eps=c["rmsNormEps"], rope_theta=c["ropeTheta"],
        max_position_embeddings=c["maxPositions"],
        tie_word_embeddings=c["tieEmbeddings"])
    # transformers 5 reads RoPE from rope_parameters (rope_theta alone is
    # ignored there).
    if hasattr(cfg, "rope_parameters"):
        cfg.rope_parameters = {"rope_type": "default",
                               "rope_theta": c["ropeTheta"]}
    model = LlamaForCausalLM(cfg)
    state = {}
    for name in f.names():
        data = torch.frombuffer(bytearray(f.to_float(name)),
                                dtype=torch.float32)
        state[name] = data.reshape(f.shape(name))
    if c["tieEmbeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise SystemExit(f"engine_check: weights do not fit: {missing} "
                         f"{unexpected}")
    return model.to(torch.bfloat16).cuda().eval()


def main() -> int:
    ap = argparse.ArgumentParser(
        description="The engine against transformers on a real model "
        "(CUDA), then a throughput table; rows in "
        "OUT_DIR/engine_check.jsonl.")
    ap.add_argument("model", help="a llama-arch model (GGUF or directory)")
    ap.add_argument("out_dir")
    args = ap.parse_args()
    path, out_dir = args.model, args.out_dir
    if not os.path.exists(path):
        ap.error(f"model: {path} does not exist")
    os.makedirs(out_dir, exist_ok=True)
    out = open(os.path.join(out_dir, "engine_check.jsonl"), "w")
    import torch

    tok = Tokenizer.from_model(path)
    ids = [tok.encode(p) for p in PROMPTS]
    n_new = 64
    # 1. Greedy tokens: the engine (dense, CUDA) against transformers.
    llm = vflow.LLM(path, device="cuda", max_batch=8)
    t0 = time.time()
    mine = llm.generate(ids, vflow.SamplingParams(max_tokens=n_new,
                                                  ignore_eos=True))
    engine_s = time.time() - t0
    for o in mine:
        if o.error:
            emit(out, dict(check="engine_error", error=o.error,
                           tokens=len(o.token_ids)))
            return 1
    hf = transformers_model(path)
    agree: List[int] = []
    for p, o in zip(ids, mine):
        with torch.no_grad():
            # Like the engine with ignore_eos: EOS is an ordinary token
            # (min_new_tokens would forbid it instead).
            hf.generation_config.eos_token_id = None
            hf.generation_config.pad_token_id = 0
            g = hf.generate(torch.tensor([p]).cuda(), max_new_tokens=n_new,
                            do_sample=False)
        theirs = g[0, len(p):].tolist()
        same = 0
        while same < n_new and theirs[same] == o.token_ids[same]:
            same += 1
        agree.append(same)
        emit(out, dict(check="greedy_vs_transformers", prompt=tok.decode(p),
                       same_prefix=same, of=n_new,
                       engine=tok.decode(o.token_ids)[:200],
                       transformers=tok.decode(theirs)[:200]))
    emit(out, dict(check="greedy_summary", agree=agree, engine_s=engine_s))
    # Where the greedy tokens part, are the two implementations' logits
    # within bf16 noise? Both see the engine's own tokens up to there.
    for p, o, same in zip(ids, mine, agree):
        ctx = p + o.token_ids[:same]
        a = torch.tensor(llm._engine.prompt_logits(ctx))
        with torch.no_grad():
            b = hf(torch.tensor([ctx]).cuda()).logits[0, -1].float().cpu()
        top2 = torch.topk(b, 2).values
        emit(out, dict(check="logits_at_divergence", step=same,
                       max_abs_diff=round(float((a - b).abs().max()), 4),
                       logit_scale=round(float(b.abs().max()), 2),
                       transformers_top2_margin=round(
                           float(top2[0] - top2[1]), 4),
                       engine_argmax=int(a.argmax()),
                       transformers_argmax=int(b.argmax())))
    # Device sampling: a seed reproduces its tokens run after run (alone and
    # in a batch), top_k=1 is greedy. Alone vs batched is reported, not
    # required: cuBLAS picks kernels by batch size, so the bf16 logits of a
    # row (and, where two tokens are close, its draws) depend on the batch.
    sp = vflow.SamplingParams(max_tokens=32, temperature=0.8, top_p=0.9,
                              top_k=40, seed=7)
    a = llm.generate(ids[:3], sp)
    a2 = llm.generate(ids[:3], sp)
    b = llm.generate(ids[:1], sp)
    b2 = llm.generate(ids[:1], sp)
    c = llm.generate(ids[:3], vflow.SamplingParams(max_tokens=16,
                                                   temperature=1.0, top_k=1))
    g = llm.generate(ids[:3], vflow.SamplingParams(max_tokens=16))
    same = 0
    while (same < min(len(a[0].token_ids), len(b[0].token_ids))
           and a[0].token_ids[same] == b[0].token_ids[same]):
        same += 1
    emit(out, dict(check="device_sampling",
                   seeded_batched_reproduces=all(
                       x.token_ids == y.token_ids for x, y in zip(a, a2)),
                   seeded_alone_reproduces=b[0].token_ids == b2[0].token_ids,
                   alone_vs_batched_same_prefix=same,
                   of=len(b[0].token_ids),
                   top_k_1_equals_greedy=[x.token_ids == y.token_ids
                                          for x, y in zip(c, g)],
                   sampled=tok.decode(a[0].token_ids)[:120]))
    # CUDA graphs: replayed decode steps give the eager steps' tokens, dense
    # and with a flow (H2O: states and the attention mass). Requests end at
    # different steps, so the batch shrinks 5 -> 1 and the graphs of the
    # padded sizes (8, 4, 2, 1) replay batches smaller than they were
    # captured with.
    for flow in (None, H2O):
        params = {"budget": 8} if flow else None
        runs = []
        for graphs in (False, True):
            g_llm = vflow.LLM(path, device="cuda", flow=flow, params=params,
                              cuda_graphs=graphs, max_batch=8)
            rids = [g_llm.add_request(p, vflow.SamplingParams(
                max_tokens=48 - 8 * i, ignore_eos=True))
                for i, p in enumerate(ids)]
            done: Dict[int, Any] = {}
            while g_llm.has_unfinished_requests():
                for o in g_llm.step():
                    done[o.request_id] = o.token_ids
            runs.append([done[r] for r in rids])
            graph_ms = g_llm.stats()["step_ms"]["graph"]
        emit(out, dict(check="cuda_graphs_equal_eager", flow=rel(flow),
                       equal=[a == b for a, b in zip(runs[0], runs[1])],
                       graph_ms=round(graph_ms, 1)))
    # 2. Quest on a long needle prompt.
    hay = "The grass is green. The sky is blue. The sun is yellow. " * 120
    needle = ("One of the special magic numbers for blue-dog is: 4812. " +
              hay + "What is the special magic number for blue-dog? The "
              "special magic number for blue-dog is:")
    for flow, params in ((None, None), (QUEST, {"budget": 8})):
        llm = vflow.LLM(path, device="cuda", flow=flow, params=params)
        o = llm.generate([needle], vflow.SamplingParams(max_tokens=8))[0]
        emit(out, dict(check="needle", flow=rel(flow), params=params,
                       prompt_tokens=len(o.prompt_token_ids), text=o.text,
                       found="4812" in (o.text or "")))
    # 3. Throughput: dense vs Quest, the engine's own step split.
    vocab = json.loads(_vflow.ModelFile(path).config())["vocabSize"]
    for flow, params in ((None, None), (QUEST, {"budget": 16})):
        for batch in (1, 8):
            llm = vflow.LLM(path, device="cuda", flow=flow, params=params,
                            max_batch=batch,
                            kv_pool_tokens=batch * 4096 + 4096,
                            enable_prefix_caching=False)
            rng = random.Random(0)
            prompts = [[rng.randrange(3, vocab) for _ in range(2048)]
                       for _ in range(batch)]
            llm.generate(prompts[:1], vflow.SamplingParams(max_tokens=2))
            before = llm.stats()
            t0 = time.time()
            llm.generate(prompts, vflow.SamplingParams(max_tokens=64,
                                                       ignore_eos=True))
            elapsed = time.time() - t0
            after = llm.stats()
            split = {k: round(after["step_ms"][k] - before["step_ms"][k], 1)
                     for k in after["step_ms"]}
            emit(out, dict(check="throughput", flow=rel(flow), params=params,
                           batch=batch, input_len=2048, output_len=64,
                           elapsed_s=round(elapsed, 3),
                           output_tok_s=round(batch * 64 / elapsed, 1),
                           steps=after["steps"] - before["steps"],
                           step_ms=split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
