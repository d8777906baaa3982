#!/usr/bin/env python3
"""omni-serve against llama-server on the CPU, pair by pair (issue 23, acceptance 1 and 3).

    .venv/bin/python bench/compare_llama_cpp.py                    # every pair, the issue's load
    .venv/bin/python bench/compare_llama_cpp.py --pairs fp32,bf16   # some of them
    .venv/bin/python bench/compare_llama_cpp.py --smoke             # tiny checkpoint, 4 requests: it works
    .venv/bin/python bench/compare_llama_cpp.py -c 1 -n 12          # one user (issue 33)

The load is the text benchmark's (bench/chat_load.py through the official openai client): 64
chat requests, 32 at a time, 128 output tokens each, greedy. Both sides make exactly that many
tokens: omni-serve gets vLLM's `ignore_eos` and `min_tokens`, llama-server its `ignore_eos`
(max_tokens is its n_predict). Both use the same CPU threads (`--threads`, 2).

Pairs, each run back to back (omni-serve first, then llama-server, on one quiet machine):

| pair | omni-serve | llama-server |
|---|---|---|
| fp32 | the ~100M qwen2 checkpoint, `--dtype float32` | the same converted to an f32 GGUF |
| bf16 | `--dtype bfloat16` | bf16 GGUF |
| int8 | `--dtype bfloat16 --quantization int8` | the faster of Q8_0 and bf16 GGUF |
| smollm2-bf16 | `--model smollm2 --dtype bfloat16` (the Q4_1 file, dequantized) | the same weights as a bf16 GGUF |
| smollm2-int8 | `--model smollm2 --dtype bfloat16 --quantization int8` | the same weights as Q8_0 |
| smollm2-gguf | `--model smollm2 --quantization gguf` (the file's blocks as they are) | the Q4_1 file |

llama-server is built from the pinned source by bench/build_llama_cpp.sh; the qwen2 GGUF files
are made by bench/convert_to_gguf.py (llama.cpp's own converter), SmolLM2's bf16 and Q8_0 from
its Q4_1 file by llama.cpp's llama-quantize (--allow-requantize: the Q4_1 values, which is what
omni-serve's bf16 and int8 sides read too); all are made here when missing.

Each side's share of the memory-bandwidth limit is its weights' bytes a token (what a decode
step reads: the GGUF file's tensors, the embedding table counted once as the tied output
projection; for omni-serve's int8 its own mix) / its TPOT / the machine's read bandwidth, which
the script measures first (a 256 MB torch sum on --threads threads, best of 5). Where omni-serve does not take `--quantization int8` (or refuses it at start) the int8
pairs are skipped with the reason. A llama-server result one pair needs again (bf16 for int8,
Q4_1 for the second SmolLM2 pair) is run again, not reused: each pair stays back to back.

Servers listen on 127.0.0.1 only, each in its own process group, stopped at the end, on error
and on Ctrl-C. Prints a markdown table (tok/s, TTFT p90, mean TPOT of both sides, the ratio)
and writes bench/results/llama_cpp_<UTC time>.json (server logs beside it under logs/).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from run_text_bench import bench_server, free_port, log, omni_cmd, stop_all

PAIRS = ("fp32", "bf16", "int8", "smollm2-bf16", "smollm2-int8", "smollm2-gguf")
OMNI_ARGS = {
    "fp32": ["--dtype", "float32"],
    "bf16": ["--dtype", "bfloat16"],
    "int8": ["--dtype", "bfloat16", "--quantization", "int8"],
    "smollm2-bf16": ["--dtype", "bfloat16"],
    "smollm2-int8": ["--dtype", "bfloat16", "--quantization", "int8"],
    "smollm2-gguf": ["--dtype", "bfloat16", "--quantization", "gguf"],
}
# llama-server's files per pair: several are run and the fastest counts ("best of").
LLAMA_FILES = {"fp32": ("f32",), "bf16": ("bf16",), "int8": ("q8_0", "bf16"),
               "smollm2-bf16": ("smollm2-bf16",), "smollm2-int8": ("smollm2-q8_0",), "smollm2-gguf": ("q4_1",)}  # fmt: skip
SMOLLM2_KINDS = {"q4_1": None, "smollm2-bf16": "BF16", "smollm2-q8_0": "Q8_0"}  # llama-quantize's type names
# the bytes a token reads come from this file of the pair (omni-serve's int8 computes its own)
BYTES_FILE = {"fp32": "f32", "bf16": "bf16", "int8": "bf16", "smollm2-bf16": "smollm2-bf16",
              "smollm2-int8": "smollm2-bf16", "smollm2-gguf": "q4_1"}  # fmt: skip


def read_bandwidth(threads: int) -> float:
    """The machine's read bandwidth in bytes/s: a 256 MB float32 torch sum on `threads` threads."""
    import time

    import torch

    torch.set_num_threads(threads)
    x = torch.ones(64 << 20)
    best = float("inf")
    for _ in range(6):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


def weight_bytes(path: Path, int8_mix: bool = False) -> int:
    """Bytes a decode step reads from a GGUF file's tensors: each tensor once (a tied embedding is
    the output projection). int8_mix: omni-serve's --quantization int8 of that file's shapes
    (int8 weights and a float32 scale a row, but q|k|v, down and the embedding in bf16)."""
    import gguf

    total = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if not int8_mix:
            total += int(t.n_bytes)
            continue
        rows = int(t.shape[-1]) if len(t.shape) > 1 else 1
        if any(k in t.name for k in ("attn_output", "ffn_gate", "ffn_up")):
            total += int(t.n_elements) + 4 * rows
        else:
            total += 2 * int(t.n_elements)
    return total


def tpot_mean(report: dict) -> float | None:
    """Mean time per output token after the first, per request (vLLM's TPOT), in seconds."""
    values = [
        (r["e2e"] - r["ttft"]) / (r["completion_tokens"] - 1)
        for r in report.get("requests", [])
        if r.get("ok") and r.get("ttft") is not None and r.get("completion_tokens", 0) > 1
    ]
    return sum(values) / len(values) if values else None


def figures(report: dict) -> dict:
    if "error" in report or "skipped" in report:
        return {}
    s = report["summary"]
    return {
        "tok_s": s["output_tok_per_s"],
        "ttft_mean_s": s["ttft_mean_s"],
        "ttft_p90_s": s["ttft_p90_s"],
        "tpot_s": tpot_mean(report),
        "completed": s["completed"],
        "requests": s["num_requests"],
        "early_stops": s["num_early_stops"],
    }


def same_text(a: dict, b: dict) -> str:
    """How many requests' greedy text (first 120 characters) both sides share: informational (a
    near-tie argmax may flip between kernels), but most differing means different models."""
    texts = {r["index"]: r["text_preview"] for r in a.get("requests", []) if r.get("ok")}
    same = sum(1 for r in b.get("requests", []) if r.get("ok") and texts.get(r["index"]) == r["text_preview"])
    return f"{same}/{len(texts)}"


def omni_flag_missing(flag: str) -> bool:
    h = subprocess.run(
        [str(REPO / "bin" / "omni-serve"), "--help"], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )
    return flag not in h.stdout + h.stderr


def run_omni(pair: str, model: str, args, tmp: Path) -> dict:
    extra = [*OMNI_ARGS[pair], "--num-threads", str(args.threads), *args.omni_args.split()]
    if "--quantization" in extra and omni_flag_missing("--quantization"):
        log(f"{pair}: omni-serve has no --quantization flag yet: skipping the pair")
        return {"skipped": "omni-serve has no --quantization flag"}
    port = free_port()
    cmd = omni_cmd(Path(model), port, extra)
    assert cmd is not None, "bin/omni-serve is missing"
    label = f"{pair}-omni"
    client = ["--ignore-eos", "--extra-body", json.dumps({"min_tokens": args.max_tokens})]
    try:
        return bench_server(label, cmd, f"http://127.0.0.1:{port}/v1", args, tmp, tmp, client)
    except RuntimeError as e:
        text = (tmp / f"{label}.log").read_text(errors="replace") if (tmp / f"{label}.log").exists() else ""
        if "--quantization" in extra and "quantization" in text.lower():
            reason = next((ln for ln in reversed(text.splitlines()) if "quantization" in ln.lower()), str(e))
            log(f"{pair}: omni-serve refused int8 ({reason.strip()}): skipping the pair")
            return {"skipped": reason.strip()[:300]}
        raise


def run_llama(pair: str, kind: str, gguf: Path, server: Path, args, tmp: Path) -> dict:
    port = free_port()
    slots = args.concurrency
    cmd = [
        str(server),
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--alias",
        f"llama-{kind}",
        "--threads",
        str(args.threads),
        "--threads-batch",
        str(args.threads),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(slots * args.ctx_per_slot),
        *args.llama_args.split(),
    ]
    return bench_server(f"{pair}-llama-{kind}", cmd, f"http://127.0.0.1:{port}/v1", args, tmp, tmp, ["--ignore-eos"])


def prepare(pairs: list[str], args) -> tuple[Path, dict[str, Path], Path | None]:
    """llama-server's binary, the GGUF files the pairs need ({kind: path}) and the checkpoint."""
    server = Path(
        subprocess.run([str(BENCH / "build_llama_cpp.sh")], check=True, capture_output=True, text=True, cwd=REPO)
        .stdout.strip()
        .splitlines()[-1]
    )
    kinds = {k for p in pairs for k in LLAMA_FILES[p]}
    files: dict[str, Path] = {}
    ckpt = None
    qwen = sorted(kinds - set(SMOLLM2_KINDS))
    if qwen:
        from convert_to_gguf import gguf_files

        ckpt = (args.ckpt or BENCH / ".cache" / f"qwen2-{args.size}").resolve()
        files.update(gguf_files(args.size, tuple(qwen), ckpt))
    if kinds & set(SMOLLM2_KINDS):
        out = subprocess.run(
            [sys.executable, "-m", "gpu_workers.tiny.smollm2"],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        q4_1 = Path(out.stdout.strip().splitlines()[-1])
        files["q4_1"] = q4_1
        for kind in sorted(kinds & set(SMOLLM2_KINDS) - {"q4_1"}):
            target = q4_1.with_name(f"{q4_1.stem}.requantized.{kind.split('-')[1]}.gguf")
            if not target.exists():
                log(f"making {target.name} with llama-quantize")
                subprocess.run(
                    [str(server.with_name("llama-quantize")), "--allow-requantize", str(q4_1), str(target),
                     str(SMOLLM2_KINDS[kind])],
                    check=True, capture_output=True,
                )  # fmt: skip
            files[kind] = target
    return server, files, ckpt


def fmt(x: float | None, scale: float = 1.0, nd: int = 1) -> str:
    return "-" if x is None else f"{x * scale:.{nd}f}"


def table(rows: list[dict]) -> str:
    head = (
        "| pair | omni-serve tok/s | llama-server tok/s (file) | ratio | TTFT mean omni / llama (ms) "
        "| TTFT p90 omni / llama (s) | TPOT omni / llama (ms) | bandwidth share omni / llama "
        "| requests ok omni / llama | same text |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        o, ll = r["omni"], r["llama"]
        if "skipped" in r:
            lines.append(f"| {r['pair']} | skipped: {r['skipped'][:80]} | | | | | | | | |")
            continue
        ratio = f"{o['tok_s'] / ll['tok_s']:.2f}x" if o.get("tok_s") and ll.get("tok_s") else "-"
        lines.append(
            f"| {r['pair']} | {fmt(o.get('tok_s'))} | {fmt(ll.get('tok_s'))} ({r.get('llama_file', '-')}) | {ratio} "
            f"| {fmt(o.get('ttft_mean_s'), 1e3, 0)} / {fmt(ll.get('ttft_mean_s'), 1e3, 0)} "
            f"| {fmt(o.get('ttft_p90_s'), nd=2)} / {fmt(ll.get('ttft_p90_s'), nd=2)} "
            f"| {fmt(o.get('tpot_s'), 1e3)} / {fmt(ll.get('tpot_s'), 1e3)} "
            f"| {fmt(o.get('bandwidth_share'), 100, 0)}% / {fmt(ll.get('bandwidth_share'), 100, 0)}% "
            f"| {o.get('completed', '-')}/{o.get('requests', '-')} / {ll.get('completed', '-')}/{ll.get('requests', '-')} "
            f"| {r.get('same_text', '-')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma list of {', '.join(PAIRS)}")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="check it works end to end: tiny checkpoint, 4 requests at 4, 8 tokens (no figures)",
    )
    ap.add_argument("--size", default="100m", choices=["100m", "tiny"])
    ap.add_argument("--ckpt", type=Path, default=None, help="checkpoint dir (default bench/.cache/qwen2-<size>)")
    ap.add_argument("--num-requests", "-n", type=int, default=64)
    ap.add_argument("--concurrency", "-c", type=int, default=32)
    ap.add_argument("--max-tokens", "-m", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each side")
    ap.add_argument("--ctx-per-slot", type=int, default=512, help="llama-server's context per parallel slot")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-words", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up requests per server")
    ap.add_argument("--omni-args", default="", help="more bin/omni-serve flags for every omni side (one string)")
    ap.add_argument("--llama-args", default="", help="more llama-server flags for every llama side (one string)")
    ap.add_argument("--ready-timeout", type=float, default=900.0)
    ap.add_argument("--client-timeout", type=float, default=3600.0)
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/llama_cpp_<date>.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size, args.num_requests, args.concurrency, args.max_tokens = "tiny", 4, 4, 8
    args.model_name = None  # run_text_bench's readiness probe: the first id of /v1/models
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    unknown = set(pairs) - set(PAIRS)
    if unknown:
        ap.error(f"unknown pairs {sorted(unknown)}; known: {', '.join(PAIRS)}")

    def _sig(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _sig)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tmp = BENCH / "results" / "logs" / f"llama_cpp_{stamp}"
    tmp.mkdir(parents=True, exist_ok=True)
    out = args.out or BENCH / "results" / f"llama_cpp_{stamp}.json"
    server, files, ckpt = prepare(pairs, args)
    bandwidth = read_bandwidth(args.threads)
    log(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s ({args.threads} threads, 256 MB torch sum)")
    rows: list[dict] = []
    raw: dict[str, dict] = {}
    try:
        for pair in pairs:
            model = "smollm2" if pair.startswith("smollm2") else str(ckpt)
            row: dict = {"pair": pair, "omni_args": OMNI_ARGS[pair]}
            load = [os.getloadavg()[0]]
            try:
                omni = run_omni(pair, model, args, tmp)
            except (Exception, subprocess.SubprocessError) as e:  # noqa: BLE001 - report, go on
                log(f"{pair} omni FAILED: {type(e).__name__}: {e}")
                omni = {"error": f"{type(e).__name__}: {e}"}
            raw[f"{pair}/omni"] = omni
            if "skipped" in omni:
                rows.append({**row, "skipped": omni["skipped"], "omni": {}, "llama": {}})
                continue
            best: dict = {}
            for kind in LLAMA_FILES[pair]:
                load.append(os.getloadavg()[0])
                try:
                    rep = run_llama(pair, kind, files[kind], server, args, tmp)
                except (Exception, subprocess.SubprocessError) as e:  # noqa: BLE001
                    log(f"{pair} llama-server {kind} FAILED: {type(e).__name__}: {e}")
                    rep = {"error": f"{type(e).__name__}: {e}"}
                raw[f"{pair}/llama-{kind}"] = rep
                got = figures(rep)
                if got.get("tok_s") and got["tok_s"] > best.get("tok_s", 0.0):
                    best, row["llama_file"], row["same_text"] = got, kind, same_text(omni, rep)
            load.append(os.getloadavg()[0])
            mine = figures(omni)
            if files.get(BYTES_FILE[pair]) is not None:
                per_token = {"omni": weight_bytes(files[BYTES_FILE[pair]], int8_mix=pair.endswith("int8"))}
                if row.get("llama_file"):
                    per_token["llama"] = weight_bytes(files[row["llama_file"]])
                for side, got in (("omni", mine), ("llama", best)):
                    if got.get("tpot_s") and side in per_token:
                        got["bytes_a_token"] = per_token[side]
                        got["bandwidth_share"] = per_token[side] / got["tpot_s"] / bandwidth
            rows.append({**row, "omni": mine, "llama": best, "loadavg_1min": load})
            log(f"{pair}: loadavg (1 min) along the pair {', '.join(f'{x:.2f}' for x in load)}")
    finally:
        stop_all()

    md = table(rows)
    print()
    print(
        f"omni-serve vs llama-server: {args.num_requests} chat requests, concurrency {args.concurrency}, "
        f"{args.max_tokens} output tokens each, {args.threads} threads each side, {os.cpu_count()} CPU cores, "
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s"
        f"{' (SMOKE: no figures)' if args.smoke else ''}"
    )
    print()
    print(md)
    report = {
        "date_utc": stamp,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "llama_server": str(server),
        "read_bandwidth_bytes_s": bandwidth,
        "gguf": {k: str(v) for k, v in files.items()},
        "checkpoint": str(ckpt),
        "table_markdown": md,
        "rows": rows,
        "reports": raw,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")
    failed = [r["pair"] for r in rows if "skipped" not in r and not (r["omni"] and r["llama"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
