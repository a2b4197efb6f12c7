#!/usr/bin/env python3
"""Peer measurements for vflow's benchmark (docs/design/PERFORMANCE.md, "Protocol").

Measures, in one process on one GPU, on random data (never zeros), with CUDA
events after warm-up, the median of >= 20 runs, rotating input sets so that the
bytes touched between two runs of the same input exceed the L2 cache:

  copy             device-to-device copy ceiling (bytes read + written)
  sdpa_dense       torch SDPA dense decode, FlashAttention backend, enable_gqa
  sdpa_default     the same call with torch's own backend choice (cuDNN on H100)
  flex_sparse      FlexAttention decode (torch.compile) with a BlockMask that
                   selects k*P tokens per (batch, kv head) in 64-token blocks
  flex_mask_build  building that BlockMask from block ids, per step
  flex_compile     wall time of the first (compiling) flex call per shape
  eager_quest      eager PyTorch Quest step on a paged KV layout:
                   score (min/max fields), max over the group, topk, gather, SDPA

Writes one JSON object per line to --out (schema: bench/README.md) and progress
to stderr. torch is imported inside main() so that --help works without it.
"""

import argparse
import json
import math
import statistics
import sys
import time

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_T0 = time.time()


def log(msg):
    print(f"[peers {time.time() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def parse_len(s):
    """'4096', '4K', '32k', '128K', '1M' -> tokens."""
    s = s.strip()
    mult = 1
    if s[-1:] in ("k", "K"):
        mult, s = 1024, s[:-1]
    elif s[-1:] in ("m", "M"):
        mult, s = 1024 * 1024, s[:-1]
    return int(s) * mult


def parse_list(s, conv=int):
    return [conv(x) for x in s.split(",") if x.strip()]


def fmt_len(L):
    return f"{L // 1024}K" if L % 1024 == 0 else str(L)


def build_parser():
    p = argparse.ArgumentParser(
        description="Measure vflow's peers (copy, torch SDPA, FlexAttention, eager Quest) "
        "and write JSON lines.")
    p.add_argument("--out", required=True, help="output .jsonl (one row per line)")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--lengths", default="4096,32768,131072",
                   help="tokens per sequence; 4K-style suffixes accepted")
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--group", type=int, default=4, help="query heads per KV head (G)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--page", type=int, default=16, help="tokens per page/block (P)")
    p.add_argument("--k", type=int, default=64, help="selected blocks per (seq, kv head)")
    p.add_argument("--dtypes", default="bf16,fp8", help="KV dtypes: bf16, fp8")
    p.add_argument("--quick", action="store_true", help="B 1,8; L 4K,32K")
    p.add_argument("--iters", type=int, default=30, help="timed runs (>= 20)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--copy-gib", type=float, default=1.0, help="copy buffer size (GiB)")
    p.add_argument("--flex-block", type=int, default=64,
                   help="FlexAttention KV block (>= 64; 16 fails)")
    p.add_argument("--flex-layout", choices=("auto", "folded", "per_q_head"), default="auto",
                   help="folded: kv heads folded into the batch (mask head dim 1, the "
                   "GQA-packed decode kernel); per_q_head: mask per query head; auto: "
                   "folded, then per_q_head if that fails")
    p.add_argument("--quest-score", choices=("matmul", "elementwise"), default="matmul",
                   help="matmul: q+ @ kmax^T + q- @ kmin^T (same value as "
                   "sum_d max(q*kmax, q*kmin)); elementwise: the literal formula")
    p.add_argument("--skip", default="", help="comma list of peers to skip: "
                   "copy,sdpa,flex,quest")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--mem-margin-gib", type=float, default=3.0,
                   help="GPU memory left free when sizing the rotation")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # tests only
    return p


# --------------------------------------------------------------------------- #
# bytes (PERFORMANCE.md, "Bytes per decode step")


def kv_elem_bytes(dtype):
    return 1 if dtype == "fp8" else 2


def qo_bytes(B, Hkv, G, D):
    return B * G * Hkv * D * (2 + 2)


def dense_bytes(B, L, Hkv, G, D, s_kv=2):
    return 2 * B * L * Hkv * D * s_kv + qo_bytes(B, Hkv, G, D)


def quest_fields_bytes(B, N, Hkv, D):
    return B * N * Hkv * (2 * D * 2)  # min + max, bf16


# --------------------------------------------------------------------------- #


class Ctx:
    pass


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.quick:
        args.batches, args.lengths = "1,8", "4096,32768"
    batches = parse_list(args.batches)
    lengths = parse_list(args.lengths, parse_len)
    dtypes = [d.strip().lower() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in ("bf16", "fp8"):
            raise SystemExit(f"unknown dtype {d!r} (bf16, fp8)")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    iters = max(20, args.iters)

    import torch  # noqa: E402  (deliberately late: --help works without torch)

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("peers.py needs a CUDA GPU")

    c = Ctx()
    c.torch = torch
    c.args = args
    c.iters = iters
    c.warmup = max(1, args.warmup)
    c.dev = torch.device(args.device)
    props = torch.cuda.get_device_properties(0)
    c.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * MIB)
    c.rot_target = 4 * c.l2  # bytes touched between two uses of the same input
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False

    out = open(args.out, "w")

    def emit(row):
        row = {"source": "peer", **row}
        out.write(json.dumps(row) + "\n")
        out.flush()
        if "error" in row or "skipped" in row:
            log(f"  {row.get('what')}: {row.get('error') or row.get('skipped')}")
        elif row.get("ms") is not None:
            log(f"  {row['what']:<16} {row.get('dtype', ''):<4} "
                f"B={row.get('B', '-')} L={row.get('L', '-')}: {row['ms']:.4f} ms"
                + (f", {row['gbps']:.0f} GB/s" if row.get("gbps") else ""))

    c.emit = emit

    try:
        import triton
        triton_ver = triton.__version__
    except Exception:  # noqa: BLE001
        triton_ver = None
    emit({"what": "env", "gpu": props.name, "torch": torch.__version__,
          "cuda": torch.version.cuda, "triton": triton_ver,
          "sm_count": props.multi_processor_count, "l2_bytes": c.l2,
          "mem_bytes": props.total_memory, "iters": iters, "warmup": c.warmup,
          "note": "peers.py: median of CUDA-event timings; rotating inputs > 4x L2"})
    log(f"{props.name}, torch {torch.__version__}, triton {triton_ver}, "
        f"L2 {c.l2 / MIB:.0f} MiB, iters {iters}")

    if "copy" not in skip:
        run_guarded(c, {"what": "copy"}, lambda: measure_copy(c))

    c.flex_fn = None
    for B in batches:
        for L in lengths:
            shape = dict(B=B, L=L, Hkv=args.hkv, G=args.group, D=args.dim,
                         P=args.page, k=args.k)
            log(f"shape B={B} L={fmt_len(L)} Hkv={args.hkv} G={args.group} "
                f"D={args.dim} P={args.page} k={args.k}")
            if L % args.page or L % args.flex_block:
                emit({"what": "shape", **shape,
                      "skipped": f"L must be a multiple of P={args.page} and "
                                 f"the flex block {args.flex_block}"})
                continue
            if "sdpa" not in skip or "flex" not in skip:
                dense_group(c, shape, dtypes, skip)
            if "quest" not in skip:
                for dt in dtypes:
                    quest_group(c, shape, dt)
    out.close()
    log(f"done: {args.out}")


# --------------------------------------------------------------------------- #
# helpers


def run_guarded(c, base, fn, emit=None):
    """Run one measurement; on any error emit an error row and go on."""
    torch = c.torch
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        text = str(e).strip()
        msg = f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"
        (emit or c.emit)({**base, "error": msg})
        return None
    finally:
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass


def free_memory(c):
    import gc
    gc.collect()
    c.torch.cuda.synchronize()
    c.torch.cuda.empty_cache()


def free_bytes(c):
    free, _total = c.torch.cuda.mem_get_info()
    return free


def n_sets_for(c, op_bytes, per_set_alloc, fixed_alloc=0, cap=32):
    """How many input sets to rotate: enough that op_bytes * sets >= rot_target,
    as memory allows. Returns 0 when even one set does not fit."""
    budget = free_bytes(c) - int(c.args.mem_margin_gib * GIB) - fixed_alloc
    by_mem = budget // max(1, per_set_alloc)
    want = max(1, math.ceil(c.rot_target / max(1, op_bytes)))
    return int(max(0, min(want, by_mem, cap)))


def time_runs(c, fn, n_inputs=1):
    """Median ms of c.iters runs of fn(i) (i picks the rotating input), CUDA events,
    after c.warmup runs. Runs are launched back to back (no sync in between)."""
    torch = c.torch
    for i in range(c.warmup):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(c.iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(c.iters)]
    for i in range(c.iters):
        j = (c.warmup + i) % n_inputs
        starts[i].record()
        fn(j)
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(times), min(times), max(times)


def randn_(c, t, chunk_bytes=512 * MIB):
    """Fill t with N(0,1) values (fp8 via bf16 in chunks along dim 0)."""
    torch = c.torch
    if t.dtype in (torch.bfloat16, torch.float16, torch.float32):
        t.normal_()
        return t
    rows = t.shape[0]
    per_row = max(1, t[0].numel() * 2)
    step = max(1, chunk_bytes // per_row)
    for r in range(0, rows, step):
        sl = t[r:r + step]
        sl.copy_(torch.randn(sl.shape, dtype=torch.bfloat16, device=t.device))
    return t


def row(shape, what, dtype, ms, nbytes, note, extra=None):
    r = {"what": what, **shape, "dtype": dtype, "ms": ms, "bytes": int(nbytes),
         "gbps": (nbytes / ms / 1e6) if ms and ms > 0 else None, "note": note}
    if extra:
        r.update(extra)
    return r


# --------------------------------------------------------------------------- #
# 1. copy ceiling


def measure_copy(c):
    torch = c.torch
    n = int(c.args.copy_gib * GIB) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=c.dev).normal_()
    dst = torch.empty_like(src)
    ms, lo, hi = time_runs(c, lambda i: dst.copy_(src))
    nbytes = 2 * n * 2
    c.emit({"what": "copy", "ms": ms, "bytes": nbytes, "gbps": nbytes / ms / 1e6,
            "min_ms": lo, "max_ms": hi,
            "note": f"dst.copy_(src), {c.args.copy_gib:g} GiB each; bytes = read + written"})
    src = dst = None
    free_memory(c)


# --------------------------------------------------------------------------- #
# 2. + 3. dense SDPA and FlexAttention on the same contiguous KV [B, Hkv, L, D]


def get_flex(c):
    torch = c.torch
    if c.flex_fn is None:
        import torch._dynamo as dynamo
        cfg = dynamo.config
        # one compile per shape (dynamic=False): lift the recompile limits, and
        # fail loudly instead of silently falling back to eager flex_attention
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, 256)
        for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, 4096)
        if hasattr(cfg, "fail_on_recompile_limit_hit"):
            cfg.fail_on_recompile_limit_hit = True
        from torch.nn.attention.flex_attention import flex_attention
        c.flex_fn = torch.compile(flex_attention, dynamic=False)
    return c.flex_fn


def make_block_mask(c, ids, n_cols, L, compute_q_blocks):
    """BlockMask for q_len 1 from selected block ids [Bm, Hm, nsel];
    kv_indices zero-padded to the full width n_cols (= L / flex block)."""
    torch = c.torch
    from torch.nn.attention.flex_attention import BlockMask
    Bm, Hm, nsel = ids.shape
    fb = c.args.flex_block
    kv_idx = torch.zeros((Bm, Hm, 1, n_cols), dtype=torch.int32, device=ids.device)
    kv_idx[:, :, 0, :nsel] = ids
    kv_num = torch.full((Bm, Hm, 1), nsel, dtype=torch.int32, device=ids.device)
    kw = dict(BLOCK_SIZE=(fb, fb), seq_lengths=(1, L))
    if compute_q_blocks is not None:
        kw["compute_q_blocks"] = compute_q_blocks
    return BlockMask.from_kv_blocks(kv_num, kv_idx, **kw)


def dense_group(c, shape, dtypes, skip):
    torch = c.torch
    import torch.nn.functional as F
    B, L, Hkv, G, D, P, k = (shape[x] for x in ("B", "L", "Hkv", "G", "D", "P", "k"))
    Hq = Hkv * G
    kv_set = 2 * B * Hkv * L * D * 2
    dbytes = dense_bytes(B, L, Hkv, G, D)
    fb = c.args.flex_block
    n_cols = L // fb
    nsel = min(n_cols, math.ceil(k * P / fb))
    sel_tokens = nsel * fb
    fbytes = 2 * B * Hkv * sel_tokens * D * 2 + qo_bytes(B, Hkv, G, D) + B * Hkv * nsel * 4
    fp8_note = ("; fp8 row: torch has no fp8 SDPA/Flex path, so this is the bf16-KV "
                "measurement (bytes are bf16 bytes)")

    def emit_all(r):
        for dt in dtypes:
            rr = dict(r)
            rr["dtype"] = dt
            if dt == "fp8":
                rr["note"] = rr.get("note", "") + fp8_note
                rr["kv_dtype_measured"] = "bf16"
            c.emit(rr)

    n_sets = n_sets_for(c, dbytes, kv_set + 2 * B * Hq * D * 2)
    if n_sets < 1:
        need = (kv_set + c.args.mem_margin_gib * GIB) / GIB
        for what in ("sdpa_dense", "flex_sparse"):
            emit_all({"what": what, **shape,
                      "skipped": f"needs {need:.1f} GiB, {free_bytes(c) / GIB:.1f} GiB free"})
        return
    log(f"  dense KV sets: {n_sets} x {kv_set / GIB:.2f} GiB")
    try:
        Ks, Vs, Qs = [], [], []
        for _ in range(n_sets):
            Ks.append(torch.empty((B, Hkv, L, D), dtype=torch.bfloat16, device=c.dev).normal_())
            Vs.append(torch.empty((B, Hkv, L, D), dtype=torch.bfloat16, device=c.dev).normal_())
            Qs.append(torch.empty((B, Hq, 1, D), dtype=torch.bfloat16, device=c.dev).normal_())
    except torch.cuda.OutOfMemoryError as e:
        Ks = Vs = Qs = None
        free_memory(c)
        for what in ("sdpa_dense", "flex_sparse"):
            emit_all({"what": what, **shape, "error": f"OOM allocating inputs: {e}"[:300]})
        return

    base = {**shape}
    if "sdpa" not in skip:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa_flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms, lo, hi = time_runs(
                    c, lambda i: F.scaled_dot_product_attention(
                        Qs[i], Ks[i], Vs[i], enable_gqa=True), n_sets)
            emit_all(row(shape, "sdpa_dense", "bf16", ms, dbytes,
                         f"torch SDPA, FlashAttention backend, enable_gqa, q [B,{Hq},1,{D}], "
                         f"k/v [B,{Hkv},L,{D}] bf16 contiguous; {n_sets} rotating sets",
                         {"min_ms": lo, "max_ms": hi, "sets": n_sets}))

        def sdpa_default():
            ms, lo, hi = time_runs(
                c, lambda i: F.scaled_dot_product_attention(
                    Qs[i], Ks[i], Vs[i], enable_gqa=True), n_sets)
            emit_all(row(shape, "sdpa_default", "bf16", ms, dbytes,
                         "torch SDPA, backend chosen by torch (cuDNN preferred on H100 "
                         f"when available), enable_gqa; {n_sets} rotating sets",
                         {"min_ms": lo, "max_ms": hi, "sets": n_sets}))

        run_guarded(c, {"what": "sdpa_dense", **base}, sdpa_flash, emit_all)
        run_guarded(c, {"what": "sdpa_default", **base}, sdpa_default, emit_all)

    if "flex" not in skip:
        run_guarded(c, {"what": "flex_sparse", **base},
                    lambda: flex_measure(c, shape, Qs, Ks, Vs, n_sets, nsel, n_cols,
                                         fbytes, emit_all), emit_all)
    Ks = Vs = Qs = None
    free_memory(c)


def flex_measure(c, shape, Qs, Ks, Vs, n_sets, nsel, n_cols, fbytes, emit_all):
    torch = c.torch
    B, L, Hkv, G, D, P, k = (shape[x] for x in ("B", "L", "Hkv", "G", "D", "P", "k"))
    fb = c.args.flex_block
    R = B * Hkv
    flex = get_flex(c)
    sel_note = (f"KV_BLOCK_SIZE={fb} (16 fails in Flex): {nsel} random distinct {fb}-token "
                f"blocks per (batch, kv head) = {nsel * fb} tokens (vflow: k*P = {k * P})")

    # selections: n_var per set, so that the selected bytes rotate past L2 too
    n_var = max(1, min(16, math.ceil(c.rot_target / max(1, fbytes * n_sets))))
    ids = []  # [set][var] -> [B*Hkv, nsel] int32, sorted
    for _ in range(n_sets):
        per = []
        for _ in range(n_var):
            r = torch.rand((R, n_cols), device=c.dev).argsort(dim=-1)[:, :nsel]
            per.append(r.sort(dim=-1).values.to(torch.int32).contiguous())
        ids.append(per)

    # Layout "folded": KV heads folded into the batch, q [B*Hkv, G, 1, D], k/v
    # [B*Hkv, 1, L, D] (views of the same tensors), mask [B*Hkv, 1, 1, cols]: one
    # selection per (batch, kv head) with a mask head dim of 1, which Flex's
    # GQA-packed decode kernel requires. Fallback "per_q_head": q [B, Hq, 1, D],
    # k/v [B, Hkv, L, D], mask [B, Hq, 1, cols] (selection repeated over the G heads).
    def views(i, layout):
        if layout == "folded":
            return (Qs[i].view(R, G, 1, D), Ks[i].view(R, 1, L, D), Vs[i].view(R, 1, L, D))
        return Qs[i], Ks[i], Vs[i]

    def mask_for(sel, layout, cq):
        if layout == "folded":
            return make_block_mask(c, sel.view(R, 1, nsel), n_cols, L, cq)
        selq = sel.view(B, Hkv, 1, nsel).expand(B, Hkv, G, nsel).reshape(B, Hkv * G, nsel)
        return make_block_mask(c, selq, n_cols, L, cq)

    # cq=False: forward-only mask (no transposed q-block index); None: torch default
    lays = ("folded", "per_q_head") if c.args.flex_layout == "auto" else (c.args.flex_layout,)
    attempts = [(lay, cq) for lay in lays for cq in (False, None)]
    last_err = None
    for layout, cq in attempts:
        try:
            masks = [[mask_for(s, layout, cq) for s in per] for per in ids]
            q0, k0, v0 = views(0, layout)
            torch.cuda.synchronize()
            t0 = time.time()
            out0 = flex(q0, k0, v0, block_mask=masks[0][0], enable_gqa=True)
            torch.cuda.synchronize()
            compile_ms = (time.time() - t0) * 1e3
            err = flex_check(c, q0, k0, v0, ids[0][0], out0, B, Hkv, G, D)
            break
        except Exception as e:  # noqa: BLE001
            last_err = e
            log(f"  flex layout={layout} compute_q_blocks={cq} failed: "
                f"{type(e).__name__}: {str(e)[:300]}")
    else:
        raise last_err

    emit_all({"what": "flex_compile", **shape, "ms": compile_ms,
              "note": "first flex_attention call (torch.compile, dynamic=False) for this "
                      f"shape: wall clock incl. Dynamo/Inductor/Triton; layout {layout}"})

    def run(i):
        s, v = i % n_sets, (i // n_sets) % n_var
        q, kk, vv = views(s, layout)
        return flex(q, kk, vv, block_mask=masks[s][v], enable_gqa=True)

    ms, lo, hi = time_runs(c, run, n_sets * n_var)
    check = f"max rel err vs gathered SDPA {err:.1e}" + (" CHECK FAILED" if err > 2e-2 else "")
    emit_all(row(shape, "flex_sparse", "bf16", ms, fbytes,
                 f"FlexAttention decode (torch.compile), attention only; {sel_note}; "
                 f"layout {layout}; {n_sets} sets x {n_var} selections; {check}",
                 {"min_ms": lo, "max_ms": hi, "flex_block": fb, "sel_tokens": nsel * fb,
                  "layout": layout, "check_rel_err": err, "sets": n_sets}))
    masks = None

    # BlockMask construction from block ids, per step
    n_ids = n_sets * n_var
    flat_ids = [ids[i % n_sets][(i // n_sets) % n_var] for i in range(n_ids)]
    mh = 1 if layout == "folded" else G
    build_bytes = R * mh * (n_cols * 4 + 4) + R * nsel * 4
    variants = [("flex_mask_build", False,
                 "BlockMask.from_kv_blocks(compute_q_blocks=False) from block ids "
                 f"[B*Hkv, {nsel}]: zero-padded kv_indices (width {n_cols}) + kv_num_blocks"),
                ("flex_mask_build_qblocks", None,
                 "BlockMask.from_kv_blocks with torch's default compute_q_blocks=True "
                 "(also builds the transposed q-block index, needed only for backward)")]
    for what, cqv, note in variants:
        def measure(cqv=cqv, what=what, note=note):
            ms_b, lo_b, hi_b = time_runs(c, lambda i: mask_for(flat_ids[i], layout, cqv),
                                         n_ids)
            emit_all(row(shape, what, "bf16", ms_b, build_bytes,
                         note + f"; layout {layout}; host + device time between CUDA "
                         "events (GPU otherwise idle)", {"min_ms": lo_b, "max_ms": hi_b}))
        run_guarded(c, {"what": what, **shape}, measure, emit_all)


def flex_check(c, q, k, v, sel, out, B, Hkv, G, D):
    """Max relative error of Flex's output vs SDPA (fp32) over the gathered selected
    tokens; sel is [B*Hkv, nsel] block ids. Checks only the first sequence (memory)."""
    torch = c.torch
    import torch.nn.functional as F
    fb = c.args.flex_block
    R = Hkv  # first sequence: rows 0 .. Hkv-1
    sel = sel[:R]
    tok = (sel.long().unsqueeze(-1) * fb + torch.arange(fb, device=sel.device)).reshape(R, -1)
    kf = k.reshape(B * Hkv, -1, D)[:R]
    vf = v.reshape(B * Hkv, -1, D)[:R]
    idx = tok.unsqueeze(-1).expand(R, tok.shape[1], D)
    ks = torch.gather(kf, 1, idx).float().unsqueeze(1).expand(R, G, tok.shape[1], D)
    vs = torch.gather(vf, 1, idx).float().unsqueeze(1).expand(R, G, tok.shape[1], D)
    qf = q.reshape(B * Hkv, G, 1, D)[:R].float()
    ref = F.scaled_dot_product_attention(qf, ks.contiguous(), vs.contiguous())
    o = out.reshape(B * Hkv, G, 1, D)[:R].float()
    return float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


# --------------------------------------------------------------------------- #
# 4. eager Quest on a paged layout


def quest_group(c, shape, dt):
    B, L, Hkv, G, D, P, k = (shape[x] for x in ("B", "L", "Hkv", "G", "D", "P", "k"))
    Hq = Hkv * G
    N = L // P
    ksel = min(k, N)
    s_kv = kv_elem_bytes(dt)
    pages = B * N
    pool_set = 2 * pages * Hkv * P * D * s_kv
    fields_set = quest_fields_bytes(B, N, Hkv, D)
    sel_bytes = 2 * B * Hkv * ksel * P * D * s_kv
    qbytes = fields_set + sel_bytes + qo_bytes(B, Hkv, G, D)
    # transients of one step: scores, gathered K/V (+ bf16 copy for fp8), elementwise temps
    transient = B * Hkv * G * N * 4 * 3 + 2 * B * Hkv * ksel * P * D * (s_kv + 4)
    if c.args.quest_score == "elementwise":
        transient += 3 * B * Hkv * G * N * D * 2
    transient += 2 * GIB  # generation chunk and slack
    per_set = pool_set + fields_set + pages * 8 + 2 * B * Hq * D * 2 * 4
    n_sets = n_sets_for(c, qbytes, per_set, fixed_alloc=transient)
    base = {"what": "eager_quest", **shape, "dtype": dt}
    if n_sets < 1:
        c.emit({**base, "skipped": f"needs {(per_set + transient) / GIB + c.args.mem_margin_gib:.1f}"
                f" GiB, {free_bytes(c) / GIB:.1f} GiB free"})
        return
    log(f"  quest {dt}: {n_sets} sets x {(pool_set + fields_set) / GIB:.2f} GiB")
    run_guarded(c, base, lambda: quest_measure(c, shape, dt, n_sets, qbytes))
    free_memory(c)


def quest_measure(c, shape, dt, n_sets, qbytes):
    torch = c.torch
    import torch.nn.functional as F
    B, L, Hkv, G, D, P, k = (shape[x] for x in ("B", "L", "Hkv", "G", "D", "P", "k"))
    Hq = Hkv * G
    N = L // P
    ksel = min(k, N)
    pages = B * N
    kv_dtype = torch.float8_e4m3fn if dt == "fp8" else torch.bfloat16
    scale = 1.0  # per-tensor dequant scale for fp8 (values ~N(0,1) fit e4m3)
    hidx = torch.arange(Hkv, device=c.dev).view(1, Hkv, 1)
    n_q = 4  # query variants per set: different q -> different top-k blocks

    sets = []
    chunk_pages = max(1, (256 * MIB) // (Hkv * P * D * 2))
    for _ in range(n_sets):
        kp = torch.empty((pages, Hkv, P, D), dtype=kv_dtype, device=c.dev)
        vp = torch.empty((pages, Hkv, P, D), dtype=kv_dtype, device=c.dev)
        kmax_p = torch.empty((pages, Hkv, D), dtype=torch.bfloat16, device=c.dev)
        kmin_p = torch.empty((pages, Hkv, D), dtype=torch.bfloat16, device=c.dev)
        for p0 in range(0, pages, chunk_pages):
            p1 = min(pages, p0 + chunk_pages)
            kb = torch.randn((p1 - p0, Hkv, P, D), dtype=torch.bfloat16, device=c.dev)
            kp[p0:p1].copy_(kb)
            kd = kp[p0:p1].to(torch.bfloat16) if dt == "fp8" else kb
            kmax_p[p0:p1] = kd.amax(dim=2)
            kmin_p[p0:p1] = kd.amin(dim=2)
            del kb, kd
        randn_(c, vp)
        table = torch.randperm(pages, device=c.dev).view(B, N)  # logical block -> page
        # per-sequence contiguous fields [B, Hkv, N, D], bf16, precomputed (not timed)
        kmax = kmax_p[table].permute(0, 2, 1, 3).contiguous()
        kmin = kmin_p[table].permute(0, 2, 1, 3).contiguous()
        del kmax_p, kmin_p
        qs = [torch.randn((B, Hq, 1, D), dtype=torch.bfloat16, device=c.dev)
              for _ in range(n_q)]
        sets.append((kp, vp, kmax, kmin, table, qs))

    elementwise = c.args.quest_score == "elementwise"
    fp8 = dt == "fp8"

    def select(q, kmax, kmin):
        qg = q.view(B, Hkv, G, D)
        if elementwise:
            qe = qg.unsqueeze(3)                                     # [B,Hkv,G,1,D]
            s = torch.maximum(qe * kmax.unsqueeze(2), qe * kmin.unsqueeze(2)).sum(-1)
        else:
            # sum_d max(q*kmax, q*kmin) == q+ . kmax + q- . kmin   (kmax >= kmin)
            s = (torch.matmul(qg.clamp(min=0), kmax.transpose(-1, -2))
                 + torch.matmul(qg.clamp(max=0), kmin.transpose(-1, -2)))  # [B,Hkv,G,N]
        s = s.amax(dim=2)                                            # [B,Hkv,N]
        return s.topk(ksel, dim=-1).indices                          # [B,Hkv,ksel]

    def attend(q, kp, vp, table, idx):
        pg = torch.gather(table.unsqueeze(1).expand(B, Hkv, N), 2, idx)  # physical pages
        if fp8:  # gather the raw bytes, then dequantize the selected blocks only
            ks = kp.view(torch.uint8)[pg, hidx].view(kv_dtype)
            vs = vp.view(torch.uint8)[pg, hidx].view(kv_dtype)
            ks = ks.to(torch.bfloat16) * scale
            vs = vs.to(torch.bfloat16) * scale
        else:
            ks = kp[pg, hidx]
            vs = vp[pg, hidx]
        ks = ks.reshape(B, Hkv, ksel * P, D)
        vs = vs.reshape(B, Hkv, ksel * P, D)
        return F.scaled_dot_product_attention(q, ks, vs, enable_gqa=True)

    def step(q, kp, vp, kmax, kmin, table):
        return attend(q, kp, vp, table, select(q, kmax, kmin))

    # sanity checks on set 0, first sequence only (memory): the attention over the
    # step's own selection vs fp32 SDPA, and the selection's overlap with the
    # literal fp32 formula's
    kp, vp, kmax, kmin, table, qs = sets[0]
    idx0 = select(qs[0], kmax, kmin)
    out0 = attend(qs[0], kp, vp, table, idx0)
    check = quest_check(c, qs[0], kp, vp, kmax, kmin, table, idx0, out0, Hkv, G, D, P, N,
                        ksel)
    del kp, vp, kmax, kmin, table, qs, idx0, out0

    nin = n_sets * n_q

    def run(i):
        s, v = i % n_sets, (i // n_sets) % n_q
        kp, vp, kmax, kmin, table, qs = sets[s]
        return step(qs[v], kp, vp, kmax, kmin, table)

    ms, lo, hi = time_runs(c, run, nin)
    c.emit(row(shape, "eager_quest", dt, ms, qbytes,
               f"eager PyTorch Quest step: {c.args.quest_score} score over bf16 min/max "
               f"fields [B,Hkv,N,D], max over G, topk({ksel}), gather pages from "
               f"[pages,Hkv,P,D] {dt} pools via a random block table"
               + (", dequant to bf16" if fp8 else "")
               + ", SDPA(enable_gqa, default backend); bytes = floor (fields + selected "
               f"KV + q/out), eager intermediates not counted; {n_sets} sets x {n_q} q; "
               + check,
               {"min_ms": lo, "max_ms": hi, "sets": n_sets, "score": c.args.quest_score}))
    sets.clear()


def quest_check(c, q, kp, vp, kmax, kmin, table, idx, out, Hkv, G, D, P, N, ksel):
    torch = c.torch
    import torch.nn.functional as F
    b = 0
    hidx = torch.arange(Hkv, device=q.device).view(Hkv, 1)
    pg = table[b][idx[b]]                                            # [Hkv, ksel]

    def gather(pool):
        if pool.element_size() == 1:
            return pool.view(torch.uint8)[pg, hidx].view(pool.dtype).float()
        return pool[pg, hidx].float()                                # [Hkv,ksel,P,D]

    T = ksel * P
    ks = gather(kp).reshape(Hkv, 1, T, D).expand(Hkv, G, T, D).contiguous()
    vs = gather(vp).reshape(Hkv, 1, T, D).expand(Hkv, G, T, D).contiguous()
    qb = q[b].float().reshape(Hkv, G, 1, D)
    ref = F.scaled_dot_product_attention(qb, ks, vs)
    o = out[b].float().reshape(Hkv, G, 1, D)
    err = float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    # the literal formula in fp32: sum_d max(q*kmax, q*kmin), max over the group.
    # The step scores in bf16, so near-ties at the top-k boundary may swap: count a
    # selected block as valid when its fp32 score is within bf16 rounding of the
    # fp32 k-th score (a wrong head or block mapping scores far below it).
    s = torch.maximum(qb * kmax[b].float().unsqueeze(1), qb * kmin[b].float().unsqueeze(1))
    s = s.sum(-1).amax(dim=1)                                        # [Hkv, N]
    top = s.topk(ksel, dim=-1)
    kth = top.values[:, -1:]                                         # [Hkv, 1]
    tol = 4.0 * 2.0 ** -8 * s.abs().amax(dim=-1, keepdim=True)
    valid = float((s.gather(1, idx[b]) >= kth - tol).float().mean())
    hit = torch.zeros((Hkv, N), dtype=torch.bool, device=q.device)
    hit.scatter_(1, top.indices, True)
    overlap = float(hit.gather(1, idx[b]).float().mean())
    bad = err > 2e-2 or valid < 0.99
    return (f"check: rel err vs fp32 SDPA over its selection {err:.1e}; selected blocks "
            f"within bf16 rounding of the fp32 top-{ksel} {valid:.3f} (exact overlap "
            f"{overlap:.3f})" + (" CHECK FAILED" if bad else ""))


if __name__ == "__main__":
    main()
