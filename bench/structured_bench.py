"""Structured-output overhead: the issue-2 text load with a json_schema on every request
against the same load without, on one omni-serve; and grammar compile times.

    .venv/bin/python bench/structured_bench.py            # 64 requests, c=32, 128 tokens, 100M qwen2
    .venv/bin/python bench/structured_bench.py --size tiny -n 8 -c 4 -m 16   # smoke test

Loads run plain, json_schema, plain, json_schema on one server without prefix caching. The
schema asks for 200 integers, so no constrained request can finish before max_tokens:
both loads produce exactly the same number of tokens, and the difference is the grammar's
cost (masks filled in the server, applied in the worker). Compile times are measured in
this process with omni-serve's own GrammarCompiler on the checkpoint's tokenizer: cold (each
of the five schemas of tests/e2e/test_structured_output.py compiled the first time) and
cached (compiled again), plus the one-off tokenizer conversion. Writes
bench/results/structured_<UTC time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

import run_text_bench as rtb  # noqa: E402

LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "values": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 200, "maxItems": 200}
    },
    "required": ["values"],
    "additionalProperties": False,
}


def compile_times(ckpt: Path) -> dict:
    from omni.text.constrained.compiler import GrammarCompiler
    from omni.text.constrained.spec import GrammarKind, GrammarSpec
    from omni.text.tokenizer import TextTokenizer
    from tests.e2e.test_structured_output import SCHEMAS

    tokenizer = TextTokenizer.from_dir(ckpt)
    compiler = GrammarCompiler(tokenizer)

    async def run() -> dict:
        t = time.perf_counter()
        await compiler.compile(GrammarSpec(GrammarKind.JSON_OBJECT))  # converts the tokenizer once
        first = time.perf_counter() - t
        out: dict = {"tokenizer_and_json_object_s": first, "schemas": {}}
        for name, schema in SCHEMAS.items():
            spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True))
            t = time.perf_counter()
            grammar = await compiler.compile(spec)
            cold = time.perf_counter() - t
            t = time.perf_counter()
            await compiler.compile(spec)
            cached = time.perf_counter() - t
            t = time.perf_counter()
            grammar.new_constraint()
            copy = time.perf_counter() - t
            out["schemas"][name] = {"cold_ms": cold * 1e3, "cached_ms": cached * 1e3, "per_request_copy_ms": copy * 1e3}
        return out

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="100m", choices=["100m", "tiny"])
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--num-requests", "-n", type=int, default=64)
    ap.add_argument("--concurrency", "-c", type=int, default=32)
    ap.add_argument("--max-tokens", "-m", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-words", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--client-timeout", type=float, default=3600.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ckpt = args.ckpt or BENCH / ".cache" / f"qwen2-{args.size}"
    if not (ckpt / "config.json").is_file():
        subprocess.run([sys.executable, str(BENCH / "make_checkpoint.py"), "--size", args.size, "--out", str(ckpt)], check=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    logs = BENCH / "results" / "logs" / f"structured-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    port = rtb.free_port()
    base = f"http://127.0.0.1:{port}/v1"
    # Every load sends the same prompts: without prefix caching a later load cannot gain
    # from an earlier one's KV, so the loads differ only in the constraint.
    cmd = rtb.omni_cmd(ckpt, port, ["--no-prefix-caching"])
    assert cmd is not None
    server = rtb.start_server(cmd, logs / "omni.log")
    results = {}
    try:
        model = rtb.wait_ready(base, server, args.ready_timeout)
        fmt = {"response_format": {"type": "json_schema", "json_schema": {"name": "values", "schema": LONG_SCHEMA, "strict": True}}}
        # interleaved, so drift on a shared machine hits both kinds alike
        loads = (("plain 1", None), ("json_schema 1", fmt), ("plain 2", None), ("json_schema 2", fmt))
        for label, extra in loads:
            out = logs / f"{label.replace(' ', '_')}.json"
            client = [sys.executable, str(BENCH / "chat_load.py"), "--base-url", base, "--label", label,
                      "-n", str(args.num_requests), "-c", str(args.concurrency), "-m", str(args.max_tokens),
                      "--seed", str(args.seed), "--prompt-words", str(args.prompt_words), "--warmup", str(args.warmup),
                      "--timeout", str(args.client_timeout), "--out", str(out), "--model", model]
            if extra is not None:
                client += ["--extra-body", json.dumps(extra)]
            rtb.log(f"client ({label})")
            subprocess.run(client, cwd=REPO, timeout=args.client_timeout + 600)
            results[label] = json.loads(out.read_text())["summary"]
    finally:
        rtb.stop_server(server)
    compiles = compile_times(ckpt)
    rows = ["| load | output tok/s | TTFT mean (s) | TTFT p90 (s) | completion tokens | ok/requests |", "|---|---:|---:|---:|---:|---:|"]
    for label, s in results.items():
        rows.append(f"| {label} | {s['output_tok_per_s']:.1f} | {s['ttft_mean_s']:.2f} | {s['ttft_p90_s']:.2f} | "
                    f"{s.get('total_output_tokens', '-')} | {s['completed']}/{s['num_requests']} |")
    print("\n".join(rows))
    print(json.dumps(compiles, indent=2))
    out_path = args.out or BENCH / "results" / f"structured_{stamp}.json"
    out_path.write_text(json.dumps({"date_utc": stamp, "checkpoint": str(ckpt), "args": {k: str(v) for k, v in vars(args).items()},
                                    "loads": results, "compile": compiles, "table_markdown": "\n".join(rows)}, indent=2))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
