#!/usr/bin/env python3
"""Merge vflow's benchmark rows and the peers' rows (JSON lines) into the markdown
table that docs/design/PERFORMANCE.md asks for.

    python3 bench/table.py vflow.jsonl peers.jsonl \
        [--gpu NAME] [--commit SHA] [--command "..."] [--date DATE] > table.md

Any number of input files; each row says its "source" ("vflow" or "peer"). Lines
that are not JSON objects are skipped and counted. Ratios are peer_ms / vflow_ms
(above 1: vflow is faster). The row schema is in bench/README.md. Standard
library only.
"""

import argparse
import datetime as _dt
import json
import math
import sys

SHAPE_KEYS = ("B", "L", "Hkv", "G", "D", "P", "k", "dtype")
DENSE_KEYS = ("B", "L", "Hkv", "G", "D", "dtype")  # P and k do not matter for dense

VFLOW_TABLED = {"dense_attention", "sparse_attention", "decode_step", "compile_cold",
                "compile_hit", "emit_cuda", "copy"}
PEER_TABLED = {"env", "copy", "sdpa_dense", "sdpa_default", "flex_sparse",
               "flex_mask_build", "flex_mask_build_qblocks", "flex_compile",
               "eager_quest", "shape", "flashinfer_dense", "flashinfer_sparse"}
COMPILE_TARGETS_MS = {"compile_cold": 2000.0, "compile_hit": 20.0, "emit_cuda": 200.0}

DASH = "—"


# --------------------------------------------------------------------------- #
# reading and normalizing


def norm_dtype(v):
    if v is None:
        return None
    s = str(v).strip().lower()
    if s in ("bf16", "bfloat16", "torch.bfloat16"):
        return "bf16"
    if s.startswith("fp8") or s.startswith("float8") or "e4m3" in s or "e5m2" in s:
        return "fp8"
    if s in ("fp16", "float16", "half", "torch.float16"):
        return "fp16"
    return s


def to_int(v):
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v == int(v) else v
    s = str(v).strip()
    mult = 1
    if s[-1:] in ("k", "K"):
        mult, s = 1024, s[:-1]
    elif s[-1:] in ("m", "M"):
        mult, s = 1024 * 1024, s[:-1]
    try:
        return int(float(s) * mult)
    except ValueError:
        return v


def to_float(v):
    if v is None or isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def normalize(r):
    r = dict(r)
    for key in ("B", "L", "Hkv", "G", "D", "P", "k"):
        if key in r:
            r[key] = to_int(r[key])
    if "dtype" in r:
        r["dtype"] = norm_dtype(r["dtype"])
    for key in ("ms", "bytes", "gbps"):
        if key in r:
            r[key] = to_float(r[key])
    if r.get("gbps") is None and r.get("bytes") and r.get("ms"):
        r["gbps"] = r["bytes"] / r["ms"] / 1e6
    if r.get("program") is not None:
        r["program"] = str(r["program"])
    return r


def infer_source(r):
    what = r.get("what")
    if what in PEER_TABLED - {"copy"}:
        return "peer"
    return "vflow"


class Data:
    def __init__(self):
        self.rows = []          # every valid row (last of duplicates)
        self.bad_lines = 0
        self.duplicates = 0
        self.files = []

    def ok(self, r):
        return "error" not in r and "skipped" not in r and r.get("ms") is not None

    def select(self, source, what, **match):
        """Rows of source/what whose keys match; a key missing on either side is a
        wildcard. Only rows with a time and no error."""
        out = []
        for r in self.rows:
            if r["source"] != source or r.get("what") != what or not self.ok(r):
                continue
            good = True
            for key, val in match.items():
                if val is None or r.get(key) is None:
                    continue
                if r[key] != val:
                    good = False
                    break
            if good:
                out.append(r)
        return out

    def find(self, source, what, ref, keys, allow_bf16_for_fp8=False):
        """The last row of source/what that matches ref on keys (wildcards as in
        select). For fp8 refs, falls back to the bf16 row; returns (row, fallback)."""
        match = {key: ref.get(key) for key in keys}
        rows = self.select(source, what, **match)
        if rows:
            return rows[-1], False
        if allow_bf16_for_fp8 and ref.get("dtype") == "fp8":
            match["dtype"] = "bf16"
            rows = self.select(source, what, **match)
            if rows:
                return rows[-1], True
        return None, False

    def ceiling(self, source):
        rows = self.select(source, "copy")
        rows = [r for r in rows if r.get("gbps")]
        return rows[-1]["gbps"] if rows else None


def load(paths):
    d = Data()
    seen = {}
    for path in paths:
        d.files.append(path)
        try:
            fh = open(path, encoding="utf-8", errors="replace")
        except OSError as e:
            print(f"table.py: cannot read {path}: {e}", file=sys.stderr)
            continue
        with fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                if not line.startswith("{"):
                    d.bad_lines += 1
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    d.bad_lines += 1
                    continue
                if not isinstance(r, dict) or "what" not in r:
                    d.bad_lines += 1
                    continue
                r = normalize(r)
                r["source"] = str(r.get("source") or infer_source(r)).lower()
                if r["source"] in ("peers", "torch"):
                    r["source"] = "peer"
                key = (r["source"], r.get("what"), r.get("program"), r.get("mode"),
                       "error" in r or "skipped" in r) + tuple(r.get(k) for k in SHAPE_KEYS)
                if key in seen:
                    d.duplicates += 1
                    d.rows[seen[key]] = r
                else:
                    seen[key] = len(d.rows)
                    d.rows.append(r)
    return d


# --------------------------------------------------------------------------- #
# formatting


# (smallest value, digits after the point), largest first; smaller values get 4.
MS_DIGITS = ((100, 0), (10, 1), (1, 2), (0.1, 3))


def f_ms(x):
    if x is None:
        return DASH
    digits = next((d for least, d in MS_DIGITS if x >= least), 4)
    return f"{x:.{digits}f}"


def f_ratio(x):
    if x is None:
        return DASH
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def f_pct(x):
    return DASH if x is None else f"{100 * x:.0f}%"


def f_gbps(x):
    return DASH if x is None else f"{x:.0f}"


# (unit size, unit, digits after the point), largest first; smaller counts
# are whole bytes.
BYTE_UNITS = ((1e9, "GB", 2), (1e6, "MB", 1), (1e3, "kB", 1))


def f_bytes(b):
    if b is None:
        return DASH
    for size, unit, digits in BYTE_UNITS:
        if b >= size:
            return f"{b / size:.{digits}f} {unit}"
    return f"{b:.0f} B"


def f_len(L):
    if L is None:
        return DASH
    if isinstance(L, int) and L >= 1024 and L % 1024 == 0:
        return f"{L // 1024}K"
    return str(L)


def f_val(v):
    return DASH if v is None else str(v)


def ratio(peer_ms, vflow_ms):
    if peer_ms is None or not vflow_ms:
        return None
    return peer_ms / vflow_ms


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
    return "\n".join(out)


def shape_text(r):
    parts = [f"B={f_val(r.get('B'))}", f"L={f_len(r.get('L'))}"]
    if r.get("dtype"):
        parts.append(r["dtype"])
    if r.get("k") is not None and r.get("what") not in ("dense_attention", "sdpa_dense"):
        parts.append(f"k={r['k']}")
    if r.get("program"):
        parts.insert(0, r["program"])
    return " ".join(parts)


def sort_key(r):
    def n(v):
        return v if isinstance(v, (int, float)) else -1
    return (str(r.get("program") or ""), str(r.get("dtype") or ""), n(r.get("B")),
            n(r.get("L")), n(r.get("k")), n(r.get("P")))


# --------------------------------------------------------------------------- #
# the report


class Report:
    def __init__(self, d, args):
        self.d = d
        self.args = args
        self.ceil = {"vflow": d.ceiling("vflow"), "peer": d.ceiling("peer")}
        self.notes = []

    def pct(self, r):
        """GB/s of r over the copy ceiling of its own process (or the other one, marked)."""
        g = r.get("gbps") if r else None
        if g is None:
            return None, ""
        own = self.ceil.get(r["source"])
        if own:
            return g / own, ""
        other = self.ceil["peer" if r["source"] == "vflow" else "vflow"]
        if other:
            return g / other, "*"
        return None, ""

    def f_pct_of(self, r):
        p, mark = self.pct(r)
        return DASH if p is None else f_pct(p) + mark

    def ceil_for(self, r):
        c = self.ceil.get(r["source"])
        return c if c else self.ceil["peer" if r["source"] == "vflow" else "vflow"]

    # peers of a vflow row --------------------------------------------------- #

    def dense_of(self, r):
        row, _ = self.d.find("vflow", "dense_attention", r, DENSE_KEYS)
        return row

    def peer(self, what, r, dense=False):
        """The peer row for vflow row r; fb is True when the peer ran on bf16 KV
        for an fp8 row (its own fp8 row says so, or only a bf16 row exists)."""
        keys = DENSE_KEYS if dense else SHAPE_KEYS
        row, fb = self.d.find("peer", what, r, keys, allow_bf16_for_fp8=True)
        if row is not None and r.get("dtype") == "fp8" and \
                norm_dtype(row.get("kv_dtype_measured")) == "bf16":
            fb = True
        return row, fb

    def same_dtype_peer(self, what, r, dense=False):
        """The peer row measured on r's own KV dtype (FlashInfer has fp8
        rows of its own: no bf16 stand-in)."""
        keys = DENSE_KEYS if dense else SHAPE_KEYS
        return self.d.find("peer", what, r, keys, allow_bf16_for_fp8=False)[0]

    def peer_ms(self, what, r, dense=False):
        row, fb = self.peer(what, r, dense)
        return (row["ms"] if row else None), fb

    @staticmethod
    def mark(txt, fb):
        return txt + ("†" if fb and txt != DASH else "")

    @staticmethod
    def ms_cell(peer, fb=False):
        """A peer row's ms (DASH for none), marked when it fell back."""
        return Report.mark(f_ms(peer["ms"]) if peer else DASH, fb)

    @staticmethod
    def vs_cell(peer, r, fb=False):
        """peer ms / r's ms (DASH for no peer row), marked when it fell
        back."""
        return Report.mark(f_ratio(ratio(peer["ms"] if peer else None, r["ms"])),
                           fb)

    # sections ---------------------------------------------------------------- #

    def header(self):
        d, a = self.d, self.args
        env = [r for r in d.rows if r.get("what") == "env"]
        gpu = a.gpu or next((r.get("gpu") for r in reversed(d.rows) if r.get("gpu")), None)
        date = a.date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        lines = ["# vflow decode attention: benchmark", ""]
        lines.append(f"- date: {date}")
        lines.append(f"- GPU: {gpu or 'unknown'}")
        lines.append(f"- commit: {a.commit or 'unknown'}")
        lines.append(f"- command: `{a.command}`" if a.command else "- command: unknown")
        cv, cp = self.ceil["vflow"], self.ceil["peer"]
        lines.append("- copy ceiling (device-to-device, bytes read + written): "
                     f"vflow {f_gbps(cv) + ' GB/s' if cv else 'not measured'}, "
                     f"peers (torch copy_) {f_gbps(cp) + ' GB/s' if cp else 'not measured'}")
        if env:
            e = env[-1]
            lines.append(f"- peers' software: torch {e.get('torch')}, triton {e.get('triton')}, "
                         f"CUDA {e.get('cuda')}; L2 {f_bytes(e.get('l2_bytes'))}")
        nv = sum(1 for r in d.rows if r["source"] == "vflow")
        npr = sum(1 for r in d.rows if r["source"] == "peer")
        extra = []
        if d.bad_lines:
            extra.append(f"{d.bad_lines} non-JSON lines skipped")
        if d.duplicates:
            extra.append(f"{d.duplicates} repeated rows replaced by the later one")
        lines.append(f"- inputs: {', '.join(d.files)}: {nv} vflow rows, {npr} peer rows"
                     + (f" ({'; '.join(extra)})" if extra else ""))
        lines.append("")
        lines.append("Ratios are peer ms / vflow ms: above 1 means vflow is faster. "
                     "% = GB/s over the copy ceiling measured in the same process (vflow rows: "
                     "vflow's copy; peer rows: the peers' copy; * = the other process's "
                     "ceiling, for lack of its own). † = the peer ran on bf16 KV (torch has "
                     "no fp8 SDPA/Flex path); the fp8 vflow row is compared against it. "
                     f"{DASH} = not measured.")
        return "\n".join(lines)

    def vflow_table(self, kind, header, row):
        """The table of the vflow rows of `kind` (`row(r)`: one row's cells), or
        a line saying there are none."""
        records = sorted(self.d.select("vflow", kind), key=sort_key)
        if not records:
            return f"No vflow {kind} rows."
        return table(header, [row(r) for r in records])

    def attention(self):
        return "\n".join([
            "## (a) Attention kernels", "",
            "### Dense paged decode attention", "",
            self.vflow_table(
                "dense_attention",
                ["B", "L", "dtype", "vflow ms", "bytes", "GB/s", "% ceil",
                 "SDPA flash ms", "SDPA % ceil", "SDPA / vflow",
                 "SDPA default ms", "default / vflow",
                 "FlashInfer ms", "FlashInfer / vflow"], self.dense_row),
            "",
            "### Sparse paged decode attention (selected blocks given)", "",
            self.vflow_table(
                "sparse_attention",
                ["program", "B", "L", "dtype", "P", "k", "vflow ms", "bytes",
                 "GB/s", "% ceil", "Flex ms", "Flex % ceil", "Flex / vflow",
                 "SDPA / vflow", "vflow dense / sparse", "FlashInfer ms",
                 "FlashInfer / vflow"], self.sparse_row),
        ])

    def dense_row(self, r):
        sf, fb = self.peer("sdpa_dense", r, dense=True)
        sd, fbd = self.peer("sdpa_default", r, dense=True)
        fi = self.same_dtype_peer("flashinfer_dense", r, dense=True)
        return [
            f_val(r.get("B")), f_len(r.get("L")), f_val(r.get("dtype")),
            f_ms(r["ms"]), f_bytes(r.get("bytes")), f_gbps(r.get("gbps")),
            self.f_pct_of(r),
            self.ms_cell(sf, fb), self.f_pct_of(sf) if sf else DASH,
            self.vs_cell(sf, r, fb),
            self.ms_cell(sd, fbd), self.vs_cell(sd, r, fbd),
            self.ms_cell(fi), self.vs_cell(fi, r),
        ]

    def sparse_row(self, r):
        fl, fb = self.peer("flex_sparse", r)
        sf, fbs = self.peer("sdpa_dense", r, dense=True)
        dn = self.dense_of(r)
        fi = self.same_dtype_peer("flashinfer_sparse", r)
        return [
            f_val(r.get("program")), f_val(r.get("B")), f_len(r.get("L")),
            f_val(r.get("dtype")), f_val(r.get("P")), f_val(r.get("k")),
            f_ms(r["ms"]), f_bytes(r.get("bytes")), f_gbps(r.get("gbps")),
            self.f_pct_of(r),
            self.ms_cell(fl, fb), self.f_pct_of(fl) if fl else DASH,
            self.vs_cell(fl, r, fb),
            self.vs_cell(sf, r, fbs),
            self.vs_cell(dn, r),
            self.ms_cell(fi), self.vs_cell(fi, r),
        ]

    def floor_bytes(self, r):
        """Byte floor of a decode step: the row's floor_bytes, else its bytes, else
        PERFORMANCE.md's Quest formula (bf16 min+max fields)."""
        if to_float(r.get("floor_bytes")):
            return to_float(r["floor_bytes"]), "floor_bytes"
        if r.get("bytes"):
            return r["bytes"], "bytes"
        q = quest_floor(r)
        return (q, "Quest formula") if q else (None, "")

    def x_floor(self, r):
        fb, _ = self.floor_bytes(r)
        c = self.ceil_for(r)
        if not fb or not c or not r.get("ms"):
            return None
        return r["ms"] / (fb / (c * 1e6))

    def decode(self):
        d = self.d
        out = ["## (b) Whole sparse decode step (index + select + attend)", ""]
        steps = sorted(d.select("vflow", "decode_step"), key=sort_key)
        if not steps:
            out.append("No vflow decode_step rows.")
            return "\n".join(out)
        rows = []
        for r in steps:
            dn = self.dense_of(r)
            sf, fbs = self.peer("sdpa_dense", r, dense=True)
            fl, fbf = self.peer("flex_sparse", r)
            mb, fbm = self.peer("flex_mask_build", r)
            eq, _ = self.d.find("peer", "eager_quest", r, SHAPE_KEYS)
            flm = fl["ms"] + mb["ms"] if (fl and mb) else None
            rows.append([
                f_val(r.get("program")), f_val(r.get("B")), f_len(r.get("L")),
                f_val(r.get("dtype")), f_val(r.get("P")), f_val(r.get("k")),
                f_ms(r["ms"]), f_bytes(r.get("bytes")), f_gbps(r.get("gbps")),
                self.f_pct_of(r), f_ratio(self.x_floor(r)),
                self.vs_cell(dn, r),
                self.vs_cell(sf, r, fbs),
                self.vs_cell(fl, r, fbf),
                self.mark(f_ratio(ratio(flm, r["ms"])), fbf or fbm),
                self.vs_cell(eq, r),
            ])
        out.append(table(["program", "B", "L", "dtype", "P", "k", "ms", "bytes", "GB/s",
                          "% ceil", "x floor", "vs vflow dense", "vs SDPA", "vs Flex",
                          "vs Flex + mask build", "vs eager Quest"], rows))
        out.append("")
        out.append("x floor = ms over (bytes / copy ceiling): the byte floor of "
                   "PERFORMANCE.md when the row's bytes follow its formula. Flex is given "
                   "the selection (attention only); 'Flex + mask build' adds building its "
                   "BlockMask from block ids. eager Quest is matched on the same dtype only.")
        return "\n".join(out)

    def compile(self):
        d = self.d
        out = ["## (c) Compile times", ""]
        rows = []
        for what, tgt in COMPILE_TARGETS_MS.items():
            for r in sorted(d.select("vflow", what), key=sort_key):
                rows.append([what, f_val(r.get("program")), f_ms(r["ms"]), f"<= {tgt:g} ms",
                             "met" if r["ms"] <= tgt else "NOT met"])
        flex = d.select("peer", "flex_compile")
        if rows:
            out.append(table(["what", "program", "ms", "target", "status"], rows))
        else:
            out.append("No vflow compile rows (compile_cold, compile_hit, emit_cuda).")
        if flex:
            ms = sorted({(r.get("B"), r.get("L")): r["ms"] for r in flex}.values())
            span = (f"{ms[0] / 1e3:.1f} s" if len(ms) == 1
                    else f"{ms[0] / 1e3:.1f} to {ms[-1] / 1e3:.1f} s")
            out.append("")
            out.append("For reference, torch.compile of FlexAttention decode (first call per "
                       f"shape, peers): {plural(len(ms), 'shape')}, {span}.")
        return "\n".join(out)

    # targets ------------------------------------------------------------------ #

    def targets(self):
        d = self.d
        res = []

        def where(r):
            if r.get("B") is None and r.get("L") is None:
                return str(r.get("program") or r.get("what"))
            return shape_text(r)

        def summarize(name, target, vals, good, fmt, higher_better=True):
            """vals: list of (row, value or None); good(value) -> bool."""
            have = [(r, v) for r, v in vals if v is not None]
            if not have:
                why = (f"{plural(len(vals), 'row')} without the row or ceiling to compare "
                       "with") if vals else ""
                res.append([name, target, "not measured", why])
                return
            bad = [(r, v) for r, v in have if not good(v)]
            pick = min if higher_better else max
            worst = pick(have, key=lambda rv: rv[1])
            detail = f"{plural(len(have), 'row')}; worst {fmt(worst[1])} ({where(worst[0])})"
            if bad:
                detail += "; missing the target: " + ", ".join(
                    f"{where(r)}: {fmt(v)}" for r, v in bad[:6]) + (
                    f", +{len(bad) - 6} more" if len(bad) > 6 else "")
            nmiss = len(vals) - len(have)
            if nmiss:
                detail += (f"; {plural(nmiss, 'row')} without the row or ceiling to "
                           "compare with")
            res.append([name, target, "met" if not bad else "NOT met", detail])

        # 1. dense >= 85% of ceiling, B*L >= 256K
        rows = [r for r in d.select("vflow", "dense_attention")
                if _num(r.get("B")) and _num(r.get("L")) and r["B"] * r["L"] >= 256 * 1024]
        summarize("dense paged decode attention, B*L >= 256K tokens",
                  ">= 85% of the copy ceiling",
                  [(r, self.pct(r)[0]) for r in rows], lambda v: v >= 0.85, f_pct)

        # 2. sparse >= 75% on the bytes it moves, B >= 8
        rows = [r for r in d.select("vflow", "sparse_attention")
                if _num(r.get("B")) and r["B"] >= 8]
        summarize("sparse paged decode attention, on the bytes it moves, B >= 8",
                  ">= 75% of the ceiling", [(r, self.pct(r)[0]) for r in rows],
                  lambda v: v >= 0.75, f_pct)

        # 3. whole step within 1.3x of the byte floor, B >= 8, L >= 32K
        # (bench/flow/dense.vflow, vflow's dense baseline, is not sparse.)
        rows = [r for r in d.select("vflow", "decode_step")
                if _num(r.get("B")) and _num(r.get("L")) and r["B"] >= 8 and r["L"] >= 32768
                and r.get("program") != "dense"]
        summarize("whole sparse decode step, B >= 8, L >= 32K",
                  "within 1.3x of the byte floor", [(r, self.x_floor(r)) for r in rows],
                  lambda v: v <= 1.3, f_ratio, higher_better=False)

        # 4. Quest k=64 L=32K B=8..64 vs our dense >= 7x
        quest = self.quest_rows("decode_step")
        label = "decode_step"
        if not quest:
            quest, label = self.quest_rows("sparse_attention"), "sparse_attention"
        vals = []
        for r in quest:
            dn = self.dense_of(r)
            vals.append((r, ratio(dn["ms"] if dn else None, r["ms"])))
        summarize(f"Quest, k = 64, L = 32K, B = 8..64, vs our own dense ({label})",
                  ">= 7x faster (floor: 10.7x)", vals, lambda v: v >= 7.0, f_ratio)

        # 5. same selection through Flex: vflow >= 2x faster
        vals = []
        for r in quest:
            fl, _ = self.peer("flex_sparse", r)
            vals.append((r, ratio(fl["ms"] if fl else None, r["ms"])))
        summarize(f"the same selection through FlexAttention's block-sparse decode "
                  f"(attention only, vs vflow {label})", "vflow >= 2x faster", vals,
                  lambda v: v >= 2.0, f_ratio)

        # 6. vs SDPA dense at 32K: vflow sparse >= 6x
        rows = [r for r in d.select("vflow", "decode_step")
                if r.get("L") == 32768 and r.get("program") != "dense"]
        label = "decode_step"
        if not rows:
            rows = [r for r in d.select("vflow", "sparse_attention") if r.get("L") == 32768]
            label = "sparse_attention"
        vals = []
        for r in rows:
            sf, _ = self.peer("sdpa_dense", r, dense=True)
            vals.append((r, ratio(sf["ms"] if sf else None, r["ms"])))
        summarize(f"vs torch SDPA (FlashAttention) dense decode on the same KV, L = 32K "
                  f"(vflow {label})", "vflow sparse >= 6x faster", vals,
                  lambda v: v >= 6.0, f_ratio)

        # 7. compile times
        for what, tgt in COMPILE_TARGETS_MS.items():
            rows = d.select("vflow", what)
            summarize({"compile_cold": "cold compile of a stock program, source to cubin",
                       "compile_hit": "compile cache hit",
                       "emit_cuda": "`--emit=cuda`"}[what],
                      f"<= {tgt:g} ms", [(r, r["ms"]) for r in rows],
                      lambda v, t=tgt: v <= t, lambda v: f_ms(v) + " ms", higher_better=False)

        # 8. CUDA graph replay vs eager
        res.append(self.graph_target())

        out = ["## (d) Targets (PERFORMANCE.md, first round)", ""]
        out.append(table(["what", "target", "status", "numbers"], res))
        return "\n".join(out)

    def quest_rows(self, what):
        return [r for r in self.d.select("vflow", what)
                if str(r.get("program") or "").lower().startswith("quest")
                and r.get("k") == 64 and r.get("L") == 32768
                and _num(r.get("B")) and 8 <= r["B"] <= 64]

    def graph_target(self):
        """Rows: what "graph_replay" with "ms" and either "eager_ms" or a matching
        "decode_step_eager" row, and "identical" (bool)."""
        name, tgt = "CUDA graph replay of a decode step vs eager", "replay faster, outputs identical"
        rows = self.d.select("vflow", "graph_replay")
        if not rows:
            return [name, tgt, "not measured", ""]
        parts, all_ok, any_val = [], True, False
        for r in rows:
            eager = to_float(r.get("eager_ms"))
            if eager is None:
                e, _ = self.d.find("vflow", "decode_step_eager", r, SHAPE_KEYS + ("program",))
                eager = e["ms"] if e else None
            ident = r.get("identical")
            if eager is None:
                parts.append(f"{shape_text(r)}: replay {f_ms(r['ms'])} ms, eager not measured")
                all_ok = False
                continue
            any_val = True
            ok = r["ms"] < eager and ident is True
            all_ok &= ok
            parts.append(f"{shape_text(r)}: replay {f_ms(r['ms'])} ms vs eager {f_ms(eager)} ms"
                         f", identical: {ident if ident is not None else 'not reported'}")
        status = "met" if (all_ok and any_val) else ("NOT met" if any_val else "not measured")
        return [name, tgt, status, "; ".join(parts[:6])]

    # peers alone, errors, other rows ---------------------------------------- #

    def peers(self):
        d = self.d
        whats = ("sdpa_dense", "sdpa_default", "flex_sparse", "flex_mask_build",
                 "flex_mask_build_qblocks", "flex_compile", "eager_quest")
        keys = {}
        for r in d.rows:
            if r["source"] == "peer" and r.get("what") in whats and d.ok(r):
                kk = tuple(r.get(x) for x in SHAPE_KEYS)
                keys.setdefault(kk, dict(zip(SHAPE_KEYS, kk)))
        out = ["## (e) Peers, measured in the same run", ""]
        if not keys:
            out.append("No peer rows.")
            return "\n".join(out)
        rows = []
        for ref in sorted(keys.values(), key=sort_key):
            def get(what):
                rr = d.select("peer", what, **ref)
                return rr[-1] if rr else None

            def cell(r, with_pct=False):
                if r is None:
                    return DASH
                s = f_ms(r["ms"])
                if with_pct:
                    s += f" ({f_gbps(r.get('gbps'))} GB/s, {self.f_pct_of(r)})"
                if "CHECK FAILED" in str(r.get("note", "")):
                    s += " CHECK FAILED"
                return s

            fl = get("flex_compile")
            bf = "†" if any(get(w) and get(w).get("kv_dtype_measured") == "bf16"
                            for w in ("sdpa_dense", "flex_sparse")) else ""
            rows.append([f_val(ref["B"]), f_len(ref["L"]), f_val(ref["dtype"]) + bf,
                         f_val(ref["P"]), f_val(ref["k"]),
                         cell(get("sdpa_dense"), True), cell(get("sdpa_default")),
                         cell(get("eager_quest"), True), cell(get("flex_sparse"), True),
                         cell(get("flex_mask_build")), cell(get("flex_mask_build_qblocks")),
                         f"{fl['ms'] / 1e3:.1f} s" if fl else DASH])
        out.append(table(["B", "L", "dtype", "P", "k", "SDPA flash ms", "SDPA default ms",
                          "eager Quest ms", "Flex sparse ms (attention only)",
                          "Flex mask build ms", "mask build, default from_kv_blocks ms",
                          "Flex compile"], rows))
        out.append("")
        out.append("Bytes: dense = K and V once + q/out; eager Quest = its floor (fields + "
                   "selected KV + q/out); Flex = the selected K/V (64-token blocks) + q/out.")
        return "\n".join(out)

    def problems(self):
        d = self.d
        bad = [r for r in d.rows if "error" in r or "skipped" in r
               or "CHECK FAILED" in str(r.get("note", ""))]
        if not bad:
            return ""
        rows = []
        for r in bad:
            kind = "error" if "error" in r else ("skipped" if "skipped" in r else "check")
            msg = r.get("error") or r.get("skipped") or r.get("note")
            if kind == "check":  # the clause that failed, not the whole note
                msg = next((part.strip() for part in str(msg).split(";")
                            if "CHECK FAILED" in part), msg)
            rows.append([r["source"], f_val(r.get("what")), shape_text(r), kind,
                         str(msg)[:300]])
        return "\n".join(["## Errors, skipped and failed checks", "",
                          table(["source", "what", "shape", "kind", "message"], rows)])

    def other(self):
        d = self.d
        rows = []
        for r in d.rows:
            tabled = VFLOW_TABLED if r["source"] == "vflow" else PEER_TABLED
            if r["source"] not in ("vflow", "peer") or r.get("what") not in tabled:
                if "error" in r or "skipped" in r:
                    continue
                rows.append([r["source"], f_val(r.get("what")), f_val(r.get("program")),
                             f_val(r.get("B")), f_len(r.get("L")), f_val(r.get("dtype")),
                             f_val(r.get("P")), f_val(r.get("k")), f_ms(r.get("ms")),
                             f_bytes(r.get("bytes")), f_gbps(r.get("gbps")),
                             str(r.get("note", ""))[:160]])
        if not rows:
            return ""
        return "\n".join(["## Other rows", "",
                          table(["source", "what", "program", "B", "L", "dtype", "P", "k",
                                 "ms", "bytes", "GB/s", "note"], rows)])

    def render(self):
        parts = [self.header(), self.attention(), self.decode(), self.compile(),
                 self.targets(), self.peers(), self.problems(), self.other()]
        return "\n\n".join(p for p in parts if p) + "\n"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def quest_floor(r):
    """PERFORMANCE.md byte floor of a Quest step: every block's bf16 min+max fields,
    the selected blocks' K and V, q and out."""
    try:
        B, L, Hkv, G, D, P, k = (int(r[x]) for x in ("B", "L", "Hkv", "G", "D", "P", "k"))
    except (KeyError, TypeError, ValueError):
        return None
    s_kv = 1 if r.get("dtype") == "fp8" else 2
    N = -(-L // P)
    kb = min(k, N)
    return (B * N * Hkv * 2 * D * 2 + 2 * B * kb * P * Hkv * D * s_kv
            + B * G * Hkv * D * 4)


def build_parser():
    p = argparse.ArgumentParser(description="Merge vflow and peer JSON lines into the "
                                "PERFORMANCE.md markdown table (stdout).")
    p.add_argument("inputs", nargs="+", help="JSON-lines files (vflow's, peers')")
    p.add_argument("--gpu", default=None)
    p.add_argument("--commit", default=None)
    p.add_argument("--command", default=None)
    p.add_argument("--date", default=None, help="default: now, UTC")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    d = load(args.inputs)
    sys.stdout.write(Report(d, args).render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
