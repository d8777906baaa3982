"""Prefix-aware placement against round-robin (and least-loaded) on 2 CPU LLM workers.

For each workload and policy: start omni-serve with `--llm-workers 2`, run `omni-bench` with
the same seed (so the same requests in the same order), scrape /metrics, stop the server.
Workloads:
  shared-prefix  G groups x Q questions behind long system prompts; each worker's KV cache is
                 sized to hold about 5 of the 8 prefixes, so all of them fit only across both;
  random         distinct random prompts (little to share), to show no regression.
Prints a markdown table and writes bench/results/placement_<UTC time>.json.

    .venv/bin/python bench/placement_bench.py [--policies prefix-aware,round-robin] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


def metric_by_label(text: str, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{([^}}]*)\}}\s+(\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def run_one(args: argparse.Namespace, policy: str, workload: list[str], label: str, outdir: Path) -> dict:
    port = free_port()
    server_cmd = [
        str(ROOT / "bin" / "omni-serve"), "--model", f"m={args.ckpt}", "--port", str(port),
        "--llm-workers", "2", "--num-threads", "1", "--placement", policy,
        "--num-kv-blocks", str(args.kv_blocks), "--block-size", "16", "--log-level", "WARNING",
    ]  # fmt: skip
    log = open(outdir / f"{label}-{policy}.server.log", "w")
    server = subprocess.Popen(server_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"omni-serve exited {server.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("omni-serve not healthy")
            time.sleep(0.5)
        result_file = outdir / f"{label}-{policy}.json"
        bench_cmd = [
            PY, "-m", "bench.omni_bench", "--base-url", f"{base}/v1", "--seed", str(args.seed),
            "--concurrency", str(args.concurrency), "--warmup", "0", "--no-progress",
            "--timeout", str(args.timeout), "--out", str(result_file), *workload,
        ]  # fmt: skip
        print(f"[placement-bench] {label} / {policy}: {' '.join(bench_cmd[3:])}", flush=True)
        subprocess.run(bench_cmd, check=False, cwd=ROOT)
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
    summary = json.loads(result_file.read_text())["summary"]
    computed = metric_sum(metrics, "vllm:iteration_tokens_total_sum")
    completion = summary["total_completion_tokens"]
    # Each request's first token comes out of its prefill; every later one is one decode token.
    decode_tokens = completion - summary["num_completed"]
    return {
        "workload": label,
        "policy": policy,
        "summary": summary,
        "prompt_tokens": summary["total_prompt_tokens"],
        "cached_tokens": summary["total_cached_tokens"],
        "hit_rate": summary["prefix_cache_hit_rate"],
        "prompt_tokens_computed": computed - decode_tokens,
        "requests_per_worker": metric_by_label(metrics, "omni_placement_decisions_total", "engine"),
        "placement_reasons": metric_by_label(metrics, "omni_placement_decisions_total", "reason"),
        "preemptions": metric_sum(metrics, "vllm:num_preemptions_total"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, default=ROOT / "bench" / ".cache" / "qwen2-100m")
    ap.add_argument("--policies", default="prefix-aware,round-robin")
    ap.add_argument("--workloads", default="shared-prefix,random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=360, help="per worker, of 16 tokens")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    args = ap.parse_args()
    if not (args.ckpt / "config.json").is_file():
        subprocess.run([PY, str(ROOT / "bench" / "make_checkpoint.py"), "--out", str(args.ckpt)], check=True)
    groups, questions = (4, 4) if args.quick else (8, 24)
    workloads = {
        "shared-prefix": [
            "--workload", "shared-prefix", "--num-groups", str(groups),
            "--questions-per-group", str(questions), "--prefix-len", "400",
            "--question-len", "8", "--max-tokens", "16", "--order", "random",
        ],
        "random": [
            "--workload", "random", "--num-requests", "16" if args.quick else "64",
            "--input-len", "150:250", "--max-tokens", "32",
        ],
    }  # fmt: skip
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    outdir = ROOT / "bench" / "results" / "logs" / f"placement-{stamp}"
    outdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for label in args.workloads.split(","):
        for policy in args.policies.split(","):
            rows.append(run_one(args, policy, workloads[label], label, outdir))
    print("\n| workload | placement | hit rate | prompt tokens computed / sent | TTFT p50 (s) | TTFT p90 (s) | "
          "E2E p90 (s) | req/s | output tok/s | requests per worker |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        s = r["summary"]
        per_worker = ", ".join(f"{k}: {int(v)}" for k, v in sorted(r["requests_per_worker"].items()))
        print(
            f"| {r['workload']} | {r['policy']} | {r['hit_rate']:.3f} | "
            f"{int(r['prompt_tokens_computed'])} / {r['prompt_tokens']} | {s['ttft']['p50']:.2f} | "
            f"{s['ttft']['p90']:.2f} | {s['e2e']['p90']:.2f} | {s['request_throughput']:.2f} | "
            f"{s['output_throughput']:.1f} | {per_worker} |"
        )
    out = ROOT / "bench" / "results" / f"placement_{stamp}.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
