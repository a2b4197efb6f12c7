"""Greedy tokens of tiny random models of an architecture (written by
tests/python/tiny_model.write_model, Hugging Face names and config) in
vflow's CPU engine and in Hugging Face transformers, to check a model
family against transformers itself. Each side runs in its own environment
(vflow's venv has no torch):

    .venv/bin/python lab/tools/hf_tiny_check.py write DIR
    .venv/bin/python lab/tools/hf_tiny_check.py vflow DIR OUT/vflow.json
    HF_PY lab/tools/hf_tiny_check.py hf DIR OUT/hf.json
    python3 lab/tools/hf_tiny_check.py compare OUT/vflow.json OUT/hf.json

`write` makes DIR/<name> for each model of MODELS (tests/python/
model_specs.py's, the models of test_moe.py, test_sliding_window.py,
test_gemma3.py and test_deepseek.py, and two controls); both sides then read the same
files and generate --tokens greedy tokens (EOS ignored) after each prompt
of fixed random ids."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "tests" / "python"))
import model_specs  # noqa: E402 (the tests' models, no vflow import)

# Two controls beside the tests' models: Qwen3 and YaRN on Qwen2's
# attention (rotate_half; cos and sin times mscale).
MODELS: Dict[str, Dict[str, Any]] = {
    **model_specs.MOE,
    "qwen3": dict(arch="qwen3", head_dim=32, seed=2),
    "qwen2-yarn": dict(arch="qwen2", seed=3,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 16}),
    **model_specs.WINDOW,
    **model_specs.GEMMA3,
    **model_specs.DEEPSEEK,
}


def prompts() -> List[List[int]]:
    import random

    rng = random.Random(5)
    return [[rng.randrange(3, 64) for _ in range(n)] for n in (1, 5, 17, 40)]


def write(directory: pathlib.Path) -> None:
    from tiny_model import write_model

    for name, kw in MODELS.items():
        write_model(directory / name, **kw)
        print("wrote", directory / name)


def run_vflow(directory: pathlib.Path, tokens: int) -> Dict[str, Any]:
    import vflow

    out: Dict[str, Any] = {}
    params = vflow.SamplingParams(max_tokens=tokens, temperature=0.0,
                                  ignore_eos=True)
    for name in MODELS:
        llm = vflow.LLM(str(directory / name), kv_dtype="f32", device="cpu")
        out[name] = [[int(t) for t in o.token_ids]
                     for o in llm.generate(prompts(), params)]
    return out


def run_hf(directory: pathlib.Path, tokens: int) -> Dict[str, Any]:
    import torch
    import transformers

    out: Dict[str, Any] = {"transformers": transformers.__version__}
    for name in MODELS:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(directory / name), dtype=torch.float32)
        model.eval()
        rows = []
        for p in prompts():
            ids = torch.tensor([p])
            with torch.no_grad():
                gen = model.generate(ids, max_new_tokens=tokens,
                                     min_new_tokens=tokens, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            rows.append([int(t) for t in gen[0, len(p):]])
        out[name] = rows
    return out


def compare(a: Dict[str, Any], b: Dict[str, Any]) -> int:
    bad = 0
    for name in MODELS:
        for i, (x, y) in enumerate(zip(a[name], b[name])):
            same = sum(1 for s, t in zip(x, y) if s == t)
            first = next((j for j, (s, t) in enumerate(zip(x, y)) if s != t),
                         None)
            print(f"{name:10s} prompt {i}: {same}/{len(x)} equal"
                  + ("" if first is None else f" (first difference at {first})"))
            bad += first is not None
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["write", "vflow", "hf", "compare"])
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    if args.mode == "write":
        write(pathlib.Path(args.a))
        return 0
    if args.mode == "compare":
        return compare(json.loads(pathlib.Path(args.a).read_text()),
                       json.loads(pathlib.Path(args.b).read_text()))
    run = run_vflow if args.mode == "vflow" else run_hf
    pathlib.Path(args.b).write_text(
        json.dumps(run(pathlib.Path(args.a), args.tokens)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
