"""Tests for bench/table.py (and that bench/peers.py imports without torch).

Run: python3 -m pytest bench/tests -q   (no GPU, no torch, no numpy needed)
"""

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

import table  # noqa: E402

SHAPE = {"Hkv": 8, "G": 4, "D": 128, "P": 16}


def vrow(what, **kw):
    r = {"source": "vflow", "what": what}
    if what not in ("copy", "compile_cold", "compile_hit", "emit_cuda"):
        r.update(SHAPE)
    r.update(kw)
    return r


def prow(what, **kw):
    r = {"source": "peer", "what": what}
    if what not in ("copy", "env"):
        r.update(SHAPE)
        r.setdefault("k", 64)
    r.update(kw)
    return r


def write(path, rows, junk=()):
    with open(path, "w") as fh:
        for line in junk:
            fh.write(line + "\n")
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return str(path)


def render(tmp_path, vrows, prows, extra_args=(), junk=()):
    v = write(tmp_path / "vflow.jsonl", vrows, junk)
    p = write(tmp_path / "peers.jsonl", prows)
    args = [v, p, "--gpu", "H100 test", "--commit", "deadbeef", "--command",
            "tools/bench.sh --all", "--date", "2026-11-22"] + list(extra_args)
    d = table.load(args[:2])
    return table.Report(d, table.build_parser().parse_args(args)).render()


def section(md, title):
    """The text of the section whose heading starts with title."""
    m = re.search(r"^## " + re.escape(title) + r".*?(?=^## |\Z)", md, re.S | re.M)
    assert m, f"no section {title!r} in:\n{md}"
    return m.group(0)


def rows_of(md_section, first_cell):
    """Table rows (lists of cells) whose first cell equals first_cell."""
    out = []
    for line in md_section.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == first_cell:
                out.append(cells)
    return out


def target_row(md, prefix):
    sec = section(md, "(d) Targets")
    for line in sec.splitlines():
        if line.startswith("| " + prefix):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    raise AssertionError(f"no target row {prefix!r} in\n{sec}")


# a full, consistent set: ceilings 3000 (vflow) and 2500 (peers) GB/s
def full_rows():
    v = [
        vrow("copy", ms=1.0, bytes=3.0e9, gbps=3000.0),
        # dense: 134.5 MB in 0.05 ms -> 2690 GB/s = 89.7% of 3000
        vrow("dense_attention", B=8, L=32768, dtype="bf16", ms=0.05, bytes=134479872),
        vrow("dense_attention", B=64, L=32768, dtype="bf16", ms=0.40, bytes=1075838976),
        vrow("dense_attention", B=1, L=4096, dtype="bf16", ms=0.02, bytes=2105344),
        vrow("sparse_attention", program="quest", B=8, L=32768, k=64, dtype="bf16",
             ms=0.004, bytes=9000000),
        vrow("decode_step", program="quest", B=8, L=32768, k=64, dtype="bf16",
             ms=0.005, bytes=12845056),
        vrow("decode_step", program="quest", B=64, L=32768, k=64, dtype="bf16",
             ms=0.040, bytes=102760448),
        vrow("compile_cold", program="quest", ms=1500.0),
        vrow("compile_hit", program="quest", ms=30.0),
        vrow("emit_cuda", program="quest", ms=120.0),
    ]
    p = [
        prow("env", gpu="NVIDIA H100 80GB HBM3", torch="2.11.0", triton="3.6.0"),
        prow("copy", ms=0.8, bytes=2.0e9, gbps=2500.0),
        prow("sdpa_dense", B=8, L=32768, dtype="bf16", ms=0.40, bytes=134479872),
        prow("sdpa_dense", B=64, L=32768, dtype="bf16", ms=1.40, bytes=1075838976),
        prow("flex_sparse", B=8, L=32768, dtype="bf16", ms=0.12, bytes=8400000),
        prow("flex_sparse", B=64, L=32768, dtype="bf16", ms=0.072, bytes=67200000),
        prow("flex_mask_build", B=8, L=32768, dtype="bf16", ms=0.30, bytes=1000),
        prow("eager_quest", B=8, L=32768, dtype="bf16", ms=0.80, bytes=12845056),
        prow("flex_compile", B=8, L=32768, dtype="bf16", ms=9000.0),
    ]
    return v, p


def test_header(tmp_path):
    v, p = full_rows()
    md = render(tmp_path, v, p, junk=["starting benchmark", "{not json"])
    head = md.split("## ")[0]
    assert "H100 test" in head and "deadbeef" in head and "`tools/bench.sh --all`" in head
    assert "2026-11-22" in head
    assert "vflow 3000 GB/s" in head and "peers (torch copy_) 2500 GB/s" in head
    assert "2 non-JSON lines skipped" in head
    assert "torch 2.11.0" in head


def test_gpu_from_env_row(tmp_path):
    v, p = full_rows()
    vv = write(tmp_path / "v.jsonl", v)
    pp = write(tmp_path / "p.jsonl", p)
    args = table.build_parser().parse_args([vv, pp])
    md = table.Report(table.load([vv, pp]), args).render()
    assert "GPU: NVIDIA H100 80GB HBM3" in md
    assert "commit: unknown" in md


def test_dense_table_ratios_and_percent(tmp_path):
    v, p = full_rows()
    md = render(tmp_path, v, p)
    sec = section(md, "(a) Attention kernels")
    r = rows_of(sec, "8")[0]   # B=8 dense row
    # B | L | dtype | ms | bytes | GB/s | % | SDPA ms | SDPA % | SDPA/vflow | default ms | ratio
    assert r[1] == "32K" and r[2] == "bf16"
    assert r[3] == "0.0500"
    assert r[5] == "2690"                  # 134479872 / 0.05 / 1e6
    assert r[6] == "90%"                   # of vflow's 3000 GB/s
    assert r[7] == "0.400"
    assert r[8] == "13%"                   # 336 GB/s of the peers' 2500 GB/s
    assert r[9] == "8.00x"                 # 0.40 / 0.05
    assert r[10] == "—" and r[11] == "—"   # no sdpa_default rows
    r1 = rows_of(sec, "1")[0]
    assert r1[7] == "—" and r1[9] == "—"   # no SDPA at B=1 L=4K


def test_sparse_table(tmp_path):
    v, p = full_rows()
    md = render(tmp_path, v, p)
    sec = section(md, "(a) Attention kernels")
    r = rows_of(sec, "quest")[0]
    # program B L dtype P k ms bytes GB/s % Flex-ms Flex-% Flex/vflow SDPA/vflow dense/sparse
    assert r[1:6] == ["8", "32K", "bf16", "16", "64"]
    assert r[9] == "75%"                   # 2250 GB/s / 3000
    assert r[12] == "30.0x"                # 0.12 / 0.004
    assert r[13] == "100.0x"               # 0.40 / 0.004
    assert r[14] == "12.5x"                # dense 0.05 / 0.004


def test_decode_table(tmp_path):
    v, p = full_rows()
    md = render(tmp_path, v, p)
    sec = section(md, "(b) Whole sparse decode step")
    r = [x for x in rows_of(sec, "quest") if x[1] == "8"][0]
    # program B L dtype P k ms bytes GB/s % xfloor dense SDPA Flex Flex+mask eager
    assert r[6] == "0.0050"
    assert r[9] == "86%"                   # 2569 GB/s / 3000
    assert r[10] == "1.17x"                # 0.005 / (12845056 / 3000e6 ms)
    assert r[11] == "10.0x"                # 0.05 / 0.005
    assert r[12] == "80.0x"
    assert r[13] == "24.0x"                # 0.12 / 0.005
    assert r[14] == "84.0x"                # (0.12 + 0.30) / 0.005
    assert r[15] == "160.0x"               # 0.80 / 0.005
    r64 = [x for x in rows_of(sec, "quest") if x[1] == "64"][0]
    assert r64[11] == "10.0x" and r64[13] == "1.80x" and r64[15] == "—"
    assert r64[10] == "1.17x"              # 0.04 / (102760448 / 3000e6 ms)


def test_targets_met_and_not_met(tmp_path):
    v, p = full_rows()
    md = render(tmp_path, v, p)
    t = target_row(md, "dense paged decode attention")
    # B*L >= 256K: B=8 L=32K (90%) and B=64 L=32K (1075838976/0.4 = 2690 -> 90%)
    assert t[2] == "met" and "2 rows" in t[3]
    t = target_row(md, "sparse paged decode attention")
    assert t[2] == "met" and "75%" in t[3]
    t = target_row(md, "whole sparse decode step")
    assert t[2] == "met" and "1.17x" in t[3]
    t = target_row(md, "Quest, k = 64")
    assert t[2] == "met" and "worst 10.0x" in t[3]
    t = target_row(md, "the same selection through FlexAttention")
    assert t[2] == "NOT met" and "1.80x" in t[3]
    t = target_row(md, "vs torch SDPA")
    assert t[2] == "met" and "worst 35.0x" in t[3]   # 1.40 / 0.04
    assert target_row(md, "cold compile")[2] == "met"
    t = target_row(md, "compile cache hit")
    assert t[2] == "NOT met" and "30.0 ms" in t[3]
    assert target_row(md, "`--emit=cuda`")[2] == "met"
    assert target_row(md, "CUDA graph replay")[2] == "not measured"


def test_floor_target_fails_when_slow(tmp_path):
    v, p = full_rows()
    for r in v:
        if r["what"] == "decode_step" and r["B"] == 64:
            r["ms"] = 0.060                  # 0.06 / 0.03425 = 1.75x the floor
    md = render(tmp_path, v, p)
    t = target_row(md, "whole sparse decode step")
    assert t[2] == "NOT met" and "1.75x" in t[3]
    t = target_row(md, "Quest, k = 64")
    assert t[2] == "NOT met" and "6.67x" in t[3]    # 0.40 / 0.06


def test_missing_rows(tmp_path):
    # peers only: every vflow section says so, targets are 'not measured'
    _, p = full_rows()
    md = render(tmp_path, [], p)
    assert "No vflow dense_attention rows." in md
    assert "No vflow decode_step rows." in md
    sec = section(md, "(d) Targets")
    assert "| met |" not in sec and "NOT met" not in sec
    assert sec.count("not measured") >= 9
    # the peers still show up
    peers = section(md, "(e) Peers")
    assert "0.400" in peers and "0.120" in peers
    # vflow only: peer columns are dashes, the vflow ceiling is used
    v, _ = full_rows()
    md = render(tmp_path, v, [])
    assert "peers (torch copy_) not measured" in md
    r = rows_of(section(md, "(b) Whole sparse"), "quest")[0]
    assert r[12] == "—" and r[13] == "—" and r[15] == "—" and r[11] == "10.0x"
    assert target_row(md, "the same selection")[2] == "not measured"
    # no ceilings at all: percentages are dashes, nothing crashes
    v = [r for r in v if r["what"] != "copy"]
    md = render(tmp_path, v, [])
    r = rows_of(section(md, "(a) Attention"), "8")[0]
    assert r[6] == "—"
    assert target_row(md, "dense paged decode attention")[2] == "not measured"


def test_other_ceiling_is_marked(tmp_path):
    v, p = full_rows()
    v = [r for r in v if r["what"] != "copy"]
    md = render(tmp_path, v, p)
    r = rows_of(section(md, "(a) Attention"), "8")[0]
    assert r[6] == "108%*"                 # 2690 / 2500, the peers' ceiling


def test_fp8_rows_use_bf16_peers(tmp_path):
    v, p = full_rows()
    v.append(vrow("decode_step", program="quest", B=8, L=32768, k=64, dtype="float8_e4m3",
                  ms=0.004, bytes=10485760))
    # peers.py writes an fp8 copy of the bf16 SDPA row, marked as measured on bf16
    p.append(prow("sdpa_dense", B=8, L=32768, dtype="fp8", ms=0.40, bytes=134479872,
                  kv_dtype_measured="bf16"))
    md = render(tmp_path, v, p)
    sec = section(md, "(b) Whole sparse")
    r = [x for x in rows_of(sec, "quest") if x[3] == "fp8"][0]
    assert r[12] == "100.0x†"              # fp8 SDPA row, measured on bf16
    assert r[13] == "30.0x†"               # no fp8 Flex row: falls back to bf16
    assert r[15] == "—"                    # eager Quest: same dtype only
    assert r[11] == "—"                    # no vflow fp8 dense row


def test_unknown_and_error_rows(tmp_path):
    v, p = full_rows()
    v.append(vrow("graph_replay", program="quest", B=8, L=32768, k=64, dtype="bf16",
                  ms=0.004, eager_ms=0.010, identical=True))
    v.append({"source": "vflow", "what": "bogus_metric", "ms": 3.0, "note": "hello"})
    p.append(prow("eager_quest", B=64, L=131072, dtype="bf16", skipped="needs 90 GiB"))
    p.append(prow("flex_sparse", B=1, L=4096, dtype="bf16", error="BackendCompilerFailed: x"))
    p.append(prow("flex_sparse", B=8, L=4096, dtype="bf16", ms=0.2,
                  note="max rel err 1e0 CHECK FAILED"))
    md = render(tmp_path, v, p)
    other = section(md, "Other rows")
    assert "bogus_metric" in other and "hello" in other and "graph_replay" in other
    errs = section(md, "Errors, skipped and failed checks")
    assert "needs 90 GiB" in errs and "BackendCompilerFailed" in errs and "check" in errs
    assert target_row(md, "CUDA graph replay")[2] == "met"
    assert "CHECK FAILED" in section(md, "(e) Peers")


def test_error_rows_are_not_peers(tmp_path):
    v, p = full_rows()
    v.append(vrow("sparse_attention", program="quest", B=1, L=4096, k=64, dtype="bf16",
                  ms=0.01, bytes=1e6))
    p.append(prow("flex_sparse", B=1, L=4096, dtype="bf16", error="BackendCompilerFailed"))
    md = render(tmp_path, v, p)
    r = [x for x in rows_of(section(md, "(a) Attention"), "quest") if x[1] == "1"][0]
    assert r[10] == "—" and r[12] == "—"


def test_duplicates_keep_last(tmp_path):
    v, p = full_rows()
    v.append(vrow("dense_attention", B=8, L=32768, dtype="bf16", ms=0.10, bytes=134479872))
    md = render(tmp_path, v, p)
    assert "1 repeated rows replaced" in md
    r = rows_of(section(md, "(a) Attention"), "8")[0]
    assert r[3] == "0.100" and r[9] == "4.00x"


def test_normalization():
    r = table.normalize({"what": "x", "B": "8", "L": "32K", "dtype": "bfloat16",
                         "ms": "0.5", "bytes": 1e6})
    assert r["B"] == 8 and r["L"] == 32768 and r["dtype"] == "bf16"
    assert r["gbps"] == pytest.approx(2.0)
    assert table.norm_dtype("torch.float8_e4m3fn") == "fp8"
    assert table.quest_floor({"B": 8, "L": 32768, "Hkv": 8, "G": 4, "D": 128, "P": 16,
                              "k": 64, "dtype": "bf16"}) == 100794368  # PERFORMANCE.md: ~101 MB


def test_cli_writes_markdown(tmp_path):
    v, p = full_rows()
    vv = write(tmp_path / "v.jsonl", v)
    pp = write(tmp_path / "p.jsonl", p)
    out = subprocess.run([sys.executable, os.path.join(BENCH, "table.py"), vv, pp,
                          "--gpu", "G", "--commit", "c", "--command", "cmd"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("# vflow decode attention: benchmark")
    assert "## (d) Targets" in out


def test_peers_help_without_torch():
    """peers.py imports torch only inside main(): --help works where torch is absent."""
    code = ("import sys, builtins\n"
            "real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    if name == 'torch' or name.startswith('torch.') or name in ('numpy', 'triton'):\n"
            "        raise ImportError('blocked: ' + name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard\n"
            f"sys.path.insert(0, {BENCH!r})\n"
            "import peers\n"
            "sys.argv = ['peers.py', '--help']\n"
            "try:\n"
            "    peers.main()\n"
            "except SystemExit as e:\n"
            "    assert e.code in (0, None), e.code\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "--quick" in res.stdout and "--dtypes" in res.stdout
    res = subprocess.run([sys.executable, os.path.join(BENCH, "peers.py"), "--help"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "--out" in res.stdout


def test_peers_byte_formulas():
    import peers
    # PERFORMANCE.md: one sequence of 32K, Llama-3.1-8B heads: dense K+V = 128 MiB
    assert peers.dense_bytes(1, 32768, 8, 4, 128) - peers.qo_bytes(1, 8, 4, 128) == 128 * 2**20
    # Quest fields at P=16: 8 MiB for 32K tokens
    assert peers.quest_fields_bytes(1, 32768 // 16, 8, 128) == 8 * 2**20
    assert peers.parse_len("32K") == 32768 and peers.parse_len("4096") == 4096


def test_flashinfer_columns_same_dtype_only(tmp_path):
    v = [vrow("copy", ms=1.0, bytes=3.0e9, gbps=3000.0),
         vrow("dense_attention", B=8, L=32768, dtype="bf16", ms=0.25, bytes=1.0e9),
         vrow("dense_attention", B=8, L=32768, dtype="fp8", ms=0.16, bytes=5.0e8),
         vrow("sparse_attention", B=8, L=32768, k=64, dtype="bf16", ms=0.020,
              bytes=3.4e7)]
    # FlashInfer's rows come from vflow's own bench (same pools and lists),
    # as peer rows; there is no fp8 one, and no bf16 stand-in is used.
    v += [prow("flashinfer_dense", B=8, L=32768, dtype="bf16", ms=0.38),
          prow("flashinfer_sparse", B=8, L=32768, dtype="bf16", ms=0.023)]
    md = render(tmp_path, v, [])
    sec = section(md, "(a) Attention kernels")
    bf16, fp8 = rows_of(sec, "8")[:2]
    assert bf16[2] == "bf16" and bf16[-2:] == ["0.380", "1.52x"]
    assert fp8[2] == "fp8" and fp8[-2:] == ["—", "—"]
    sparse = [r for r in sec.splitlines() if "| 0.0200 |" in r]
    assert sparse and sparse[0].rstrip(" |").endswith("1.15x")
    assert "flashinfer_dense" not in md  # in the tables, not under other rows
