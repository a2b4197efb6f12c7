"""Greedy tokens of a GGUF model in vflow's engine and in Hugging Face
transformers (which dequantizes the same file to f32), on the CPU, to
check a model family or a quantization end to end. Each side runs in its
own environment (vflow's venv has no torch):

    .venv/bin/python lab/tools/gguf_greedy.py vflow MODEL.gguf OUT/vflow.json
        [--device cuda]
    HF_PY lab/tools/gguf_greedy.py hf MODEL.gguf OUT/hf.json
    python3 lab/tools/gguf_greedy.py compare OUT/vflow.json OUT/hf.json

Each side tokenizes the prompts with its own tokenizer (the comparison
checks the prompt ids too) and generates --tokens tokens (eos ignored).
`--prompts FILE` (a JSON list of strings) replaces the four short prompts,
e.g. with prompts longer than a model's sliding window."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "// quicksort in C\nvoid quicksort(int *a, int n) {",
    "Write a haiku about autumn leaves.",
]


def run_vflow(model: str, tokens: int, prompts: List[str],
              device: str = "cpu") -> Dict[str, Any]:
    import vflow

    start = time.time()
    llm = vflow.LLM(model, device=device)
    loaded = time.time() - start
    params = vflow.SamplingParams(max_tokens=tokens, temperature=0.0,
                                  ignore_eos=True)
    outs = llm.generate(prompts, params)
    return dict(side="vflow", load_s=round(loaded, 1),
                prompts=[list(o.prompt_token_ids) for o in outs],
                tokens=[list(o.token_ids) for o in outs],
                text=[o.text for o in outs])


def run_hf(model: str, tokens: int, texts: List[str]) -> Dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(model))
    start = time.time()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                             dtype=torch.float32)
    loaded = time.time() - start
    prompts: List[List[int]] = []
    out: List[List[int]] = []
    for text in texts:
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            g = m.generate(torch.tensor([ids]), max_new_tokens=tokens,
                           min_new_tokens=tokens, do_sample=False)
        prompts.append(ids)
        out.append(g[0, len(ids):].tolist())
    return dict(side="hf", load_s=round(loaded, 1), prompts=prompts,
                tokens=out, text=[tok.decode(t) for t in out])


def compare(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    firsts = []
    for x, y in zip(a["tokens"], b["tokens"]):
        d = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
        firsts.append(d)
    same = sum(p == q for x, y in zip(a["tokens"], b["tokens"])
               for p, q in zip(x, y))
    total = sum(len(x) for x in a["tokens"])
    return dict(prompt_ids_equal=a["prompts"] == b["prompts"],
                first_difference=firsts, tokens_equal=same, tokens=total)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["vflow", "hf", "compare"])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", help="a JSON file: a list of prompt strings")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="vflow's device (the hf side runs on the CPU)")
    args = ap.parse_args()
    if args.mode == "compare":
        with open(args.a) as f, open(args.b) as g:
            row = compare(json.load(f), json.load(g))
        print(json.dumps(row))
        return 0 if row["prompt_ids_equal"] and all(
            d is None for d in row["first_difference"]) else 1
    prompts = PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = json.load(f)
        if not (isinstance(prompts, list) and prompts and
                all(isinstance(p, str) for p in prompts)):
            print(f"--prompts: {args.prompts} is not a JSON list of strings",
                  file=sys.stderr)
            return 2
    ran = (run_vflow(args.a, args.tokens, prompts, args.device)
           if args.mode == "vflow" else run_hf(args.a, args.tokens, prompts))
    result = dict(ran, model=os.path.basename(args.a))
    with open(args.b, "w") as f:
        json.dump(result, f)
    print(json.dumps(dict(side=result["side"], load_s=result["load_s"],
                          text=result["text"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
