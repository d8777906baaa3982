#!/usr/bin/env python3
"""Speculative decoding against none, same run: output tok/s, TPOT, mean acceptance length and
the share of decode steps that verified drafts, per workload and concurrency (issue 35).

Starts bin/omni-serve on --model once per setting (none, then each --spec), and for each
workload of bench/spec_workloads.py (copy, open, multi-turn) and each --concurrency level sends
--requests chat completions (greedy, streamed, at most --max-tokens, ending at the model's own
stop), that many at a time. Each setting's server serves the same requests, so with greedy
output both produce the same tokens (a different text is reported: a near-tie can go either
way when a step's rows differ).

- tok/s: completion tokens over the wall time of the level;
- TPOT: each request's (last token - first token) / (tokens - 1), averaged;
- acceptance length: vLLM's mean acceptance length, 1 + accepted / drafts (the tokens a
  verifying request-step emits);
- drafted: the share of request-steps that verified drafts, drafts / (generation tokens -
  accepted tokens), from the vllm:spec_decode_* and vllm:generation_tokens counters.

    python bench/spec_decode.py --model ~/.cache/omni-serve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --dtype bfloat16 --threads 2 --concurrency 1,8,32 --json bench/results/spec_decode.json

Issue 35's acceptance 1 at concurrency 1 (every prompt, and unstreamed with --no-stream):
    python bench/spec_decode.py --model ... --concurrency 1 --requests 21
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from run_text_bench import free_port, start_server, stop_server, wait_ready  # noqa: E402

from bench.spec_workloads import WORKLOADS  # noqa: E402

# k = 7: a verifying step stays within the CPU's one-call native decode (8 rows)
NGRAM = '{"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
SUFFIX = '{"method": "suffix", "num_speculative_tokens": 7}'
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:generation_tokens_total")  # fmt: skip


def counters(base: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as r:
        text = r.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def stream_chat(base: str, model: str, messages: list[dict[str, Any]], max_tokens: int, stream: bool = True) -> dict[str, Any]:
    if not stream:  # one JSON answer: no TPOT
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                         {"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as r:
            answer = json.load(r)
        return {"tokens": answer["usage"]["completion_tokens"], "tpot": None,
                "text": answer["choices"][0]["message"]["content"]}  # fmt: skip
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})  # fmt: skip
    times, text, tokens = [], [], 0
    with urllib.request.urlopen(request, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    times.append(time.perf_counter())
                    text.append(choice["delta"]["content"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    tpot = (times[-1] - times[0]) / (tokens - 1) if tokens > 1 and len(times) > 1 else None
    return {"tokens": tokens, "tpot": tpot, "text": "".join(text)}


def run_level(base: str, model: str, prompts: list[Any], concurrency: int, requests: int, max_tokens: int,
              stream: bool = True) -> dict:  # fmt: skip
    chosen = [prompts[i % len(prompts)] for i in range(requests)]
    results: list[dict[str, Any] | None] = [None] * requests
    lock, cursor = threading.Lock(), [0]

    def worker() -> None:
        while True:
            with lock:
                i = cursor[0]
                cursor[0] += 1
            if i >= requests:
                return
            results[i] = stream_chat(base, model, chosen[i], max_tokens, stream)

    before = counters(base)
    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = counters(base)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    done = [r for r in results if r is not None]
    tokens = sum(r["tokens"] for r in done)
    tpots = [r["tpot"] for r in done if r["tpot"] is not None]
    drafts, accepted = delta[COUNTERS[0]], delta[COUNTERS[1]]
    request_steps = delta[COUNTERS[2]] - accepted
    return {
        "tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
        "tpot_ms": 1e3 * sum(tpots) / len(tpots) if tpots else None,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "drafted_share": drafts / request_steps if request_steps > 0 else 0.0,
        "texts": [r["text"] for r in done],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec", action="append", default=None,
                    help=f"a --speculative-config (repeatable; default {NGRAM} and {SUFFIX})")  # fmt: skip
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--workloads", default="copy,open,multi-turn")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--omni-args", default="", help="more bin/omni-serve flags (one string)")
    ap.add_argument("--no-stream", action="store_true", help="non-streamed requests (no TPOT)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    settings = [("none", None)] + [(s, s) for s in (args.spec or [NGRAM, SUFFIX])]
    levels = [int(c) for c in args.concurrency.split(",")]
    workloads = args.workloads.split(",")
    report: dict[str, Any] = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "runs": {}}
    logs = REPO / "bench" / ".cache" / "spec_decode_logs"
    for label, spec in settings:
        port = free_port()
        cmd = [str(REPO / "bin" / "omni-serve"), "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", args.dtype, "--num-threads", str(args.threads), *args.omni_args.split()]  # fmt: skip
        if spec:
            cmd += ["--speculative-config", spec]
        server = start_server(cmd, logs / f"server-{len(report['runs'])}.log")
        try:
            base = f"http://127.0.0.1:{port}"
            model = wait_ready(f"{base}/v1", server, 600.0, None)
            runs = report["runs"][label] = {}
            for workload in workloads:
                prompts = WORKLOADS[workload]()
                for c in levels:
                    n = args.requests or max(8, 2 * c)
                    r = runs[f"{workload}@{c}"] = run_level(base, model, prompts, c, n, args.max_tokens, not args.no_stream)
                    acc = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
                    print(f"{label[:40]:<40} {workload:<10} c={c:<3} {r['tok_s']:7.1f} tok/s  TPOT "
                          f"{r['tpot_ms'] or 0:6.1f} ms  acceptance {acc:>5}  drafted {100 * r['drafted_share']:5.1f}%",
                          flush=True)  # fmt: skip
        finally:
            stop_server(server)
    base_runs = report["runs"]["none"]
    print("\nratio to none (output tok/s), and same text as none")
    for label, runs in report["runs"].items():
        if label == "none":
            continue
        for key, r in runs.items():
            same = sum(a == b for a, b in zip(r["texts"], base_runs[key]["texts"]))
            print(f"  {key:<16} {r['tok_s'] / base_runs[key]['tok_s']:5.2f}x  same text {same}/{len(r['texts'])}")
    if args.json:
        for runs in report["runs"].values():
            for r in runs.values():
                r.pop("texts")
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
