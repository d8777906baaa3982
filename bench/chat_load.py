#!/usr/bin/env python3
"""Closed-loop chat-completions load generator for any OpenAI-compatible server.

One client process, ``--concurrency`` workers pulling from a queue of ``--num-requests``
seeded, distinct chat prompts; every request streams (``stream=True`` with
``stream_options.include_usage``) so that

* TTFT  = time from sending the request until the first *non-empty content delta*
          (the role-only opening chunk some servers send does not count);
* E2E   = time from sending the request until the stream ends;
* output tokens are taken from the final ``usage.completion_tokens`` (when the server
  sends no usage the number of content chunks is used instead and the request is flagged
  ``usage_missing``).

Throughput = total output tokens / wall time (first request sent -> last stream closed).
Every request that produced fewer than ``--max-tokens`` tokens, or whose finish_reason is
not ``length``, is listed under ``early_stops`` so a run that did not do the intended
amount of work cannot pass silently.

Examples::

    python bench/chat_load.py --base-url http://127.0.0.1:8000/v1            # 64 req, c=32, 128 tok
    python bench/chat_load.py --base-url http://127.0.0.1:8000/v1 \
        --num-requests 4 --concurrency 4 --max-tokens 8 --out /tmp/x.json

The prompt set is produced by :func:`make_prompts` so other benchmarks (``raw_loop.py``)
can replay exactly the same conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field

# A fixed, plain-ASCII word list: every tokenizer handles it, and joining ~30 of these
# gives a prompt of a few dozen tokens.
_WORDS = (
    "the of and to in is was for on are with as by at from his that this be it an have not "
    "they which or had one were all we when there can been has more if will would who so no "
    "river mountain engine signal garden window market paper silver winter summer harbor "
    "lantern orbit circuit kernel matrix vector token stream server client batch cache "
    "memory thread socket packet router planet comet forest meadow valley canyon island "
    "bridge tunnel castle tower village city number letter question answer story poem song "
    "music color light shadow water fire earth stone metal glass wood cloud storm rain snow "
    "quick slow bright dark warm cold green blue red yellow purple orange small large ancient "
    "modern simple complex happy calm brave gentle clever quiet loud swift steady"
).split()

_TASKS = (
    "Write a short story about",
    "Explain in simple terms",
    "Give three facts about",
    "Describe a day spent with",
    "Summarize the following notes:",
    "Translate into plain English:",
    "List the key ideas behind",
    "Compose a brief poem on",
)


def make_prompts(num_requests: int = 64, seed: int = 0, words_per_prompt: int = 10) -> list[list[dict]]:
    """Deterministic, distinct chat conversations (OpenAI ``messages`` lists).

    Each prompt starts with a unique request index so no two are identical (no accidental
    prefix-cache wins beyond the chat template's shared header), followed by a seeded
    random task and ``words_per_prompt`` seeded random words.
    """
    rng = random.Random(seed)
    prompts = []
    for i in range(num_requests):
        task = rng.choice(_TASKS)
        words = " ".join(rng.choice(_WORDS) for _ in range(words_per_prompt))
        prompts.append([{"role": "user", "content": f"Request {i}. {task} {words}."}])
    return prompts


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); ``None`` for no data."""
    if not values:
        return None
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str | None = None
    start: float = 0.0  # relative to the run's t0
    ttft: float | None = None
    e2e: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    content_chunks: int = 0
    usage_missing: bool = False
    finish_reason: str | None = None
    text_preview: str = ""
    # Gaps between consecutive content chunks (only summarised, not dumped).
    itl: list[float] = field(default_factory=list, repr=False)


async def discover_model(client, fallback: str = "default") -> str:
    try:
        models = await client.models.list()
        ids = [m.id for m in models.data]
        if ids:
            return ids[0]
    except Exception as e:  # noqa: BLE001 - best effort
        print(f"[chat_load] /models failed ({type(e).__name__}: {e}); using model={fallback!r}", file=sys.stderr)
    return fallback


async def one_request(client, model: str, idx: int, messages: list[dict], args, t0: float,
                      res: RequestResult | None = None) -> RequestResult:
    res = res if res is not None else RequestResult(index=idx)
    extra_body = {}
    if args.ignore_eos:
        extra_body["ignore_eos"] = True
    if args.extra_body:
        extra_body.update(json.loads(args.extra_body))
    if "min_tokens" in extra_body:  # a fixed length: at most this request's max_tokens (a warm-up's are fewer)
        extra_body["min_tokens"] = min(extra_body["min_tokens"], args.max_tokens)
    text_parts: list[str] = []
    start = time.perf_counter()
    res.start = start - t0
    last = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra_body or None,
            timeout=args.request_timeout,
        )
        async for chunk in stream:
            now = time.perf_counter()
            if getattr(chunk, "usage", None) is not None and chunk.usage.completion_tokens is not None:
                res.completion_tokens = chunk.usage.completion_tokens
                res.prompt_tokens = chunk.usage.prompt_tokens
            for choice in chunk.choices or []:
                delta = choice.delta
                content = getattr(delta, "content", None) if delta is not None else None
                if content:
                    if res.ttft is None:
                        res.ttft = now - start
                    elif last is not None:
                        res.itl.append(now - last)
                    last = now
                    res.content_chunks += 1
                    if len(text_parts) < 256:
                        text_parts.append(content)
                if choice.finish_reason:
                    res.finish_reason = choice.finish_reason
        res.e2e = time.perf_counter() - start
        if res.completion_tokens == 0 and res.content_chunks:
            res.usage_missing = True
            res.completion_tokens = res.content_chunks
        res.ok = True
    except Exception as e:  # noqa: BLE001 - recorded per request
        res.e2e = time.perf_counter() - start
        res.error = f"{type(e).__name__}: {e}"[:500]
    except asyncio.CancelledError:  # global timeout: keep what we saw
        res.e2e = time.perf_counter() - start
        res.error = f"cancelled by global timeout after {res.content_chunks} content chunks"
        res.text_preview = "".join(text_parts)[:120]
        raise
    res.text_preview = "".join(text_parts)[:120]
    return res


async def run_load(args) -> dict:
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=max(args.concurrency * 2, 16), max_keepalive_connections=args.concurrency * 2)
    http_client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.request_timeout, connect=30.0))
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, http_client=http_client, max_retries=0)
    try:
        model = args.model or await discover_model(client)
        prompts = make_prompts(args.num_requests, seed=args.seed, words_per_prompt=args.prompt_words)

        # Warm-up (not measured): first-request costs (lazy model/worker init, allocator,
        # kernel selection) should not land on the measured requests.
        warmup = []
        for w in range(args.warmup):
            msgs = [{"role": "user", "content": f"Warm-up {w}. Say something about rivers and engines."}]
            wargs = argparse.Namespace(**{**vars(args), "max_tokens": args.warmup_tokens})
            r = await one_request(client, model, -1 - w, msgs, wargs, time.perf_counter())
            warmup.append({"ok": r.ok, "error": r.error, "e2e": r.e2e, "completion_tokens": r.completion_tokens})
            if not r.ok:
                print(f"[chat_load] warm-up request failed: {r.error}", file=sys.stderr)

        queue: asyncio.Queue = asyncio.Queue()
        for i, p in enumerate(prompts):
            queue.put_nowait((i, p))
        results: list[RequestResult] = []  # every request that was started
        t0 = time.perf_counter()

        async def worker():
            while True:
                try:
                    i, p = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                res = RequestResult(index=i)
                results.append(res)
                await one_request(client, model, i, p, args, t0, res)

        workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.gather(*workers), timeout=args.timeout)
        except asyncio.TimeoutError:
            timed_out = True
            print(f"[chat_load] global timeout {args.timeout}s hit; reporting partial results", file=sys.stderr)
        wall = time.perf_counter() - t0
    finally:
        await http_client.aclose()

    results.sort(key=lambda r: r.index)
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    itls = [x for r in ok for x in r.itl]
    total_out = sum(r.completion_tokens for r in ok)
    early = [
        {"index": r.index, "completion_tokens": r.completion_tokens, "finish_reason": r.finish_reason}
        for r in ok
        if r.completion_tokens < args.max_tokens or (r.finish_reason not in (None, "length"))
    ]
    failed = [{"index": r.index, "error": r.error or "not finished"} for r in results if not r.ok]
    summary = {
        "model": model,
        "num_requests": args.num_requests,
        "completed": len(ok),
        "failed": len(failed) + (args.num_requests - len(results)),
        "timed_out": timed_out,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "total_output_tokens": total_out,
        "total_prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "wall_s": wall,
        "output_tok_per_s": total_out / wall if wall > 0 else None,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "ttft_mean_s": mean(ttfts),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "e2e_mean_s": mean(e2es),
        "e2e_p90_s": percentile(e2es, 90),
        "itl_mean_s": mean(itls),
        "itl_p90_s": percentile(itls, 90),
        "num_early_stops": len(early),
        "usage_missing": sum(1 for r in ok if r.usage_missing),
    }
    return {
        "system": args.label,
        "base_url": args.base_url,
        "args": {k: v for k, v in vars(args).items() if k != "api_key"},
        "summary": summary,
        "early_stops": early,
        "failures": failed,
        "warmup": warmup,
        "requests": [{k: v for k, v in asdict(r).items() if k != "itl"} for r in results],
    }


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def print_summary(report: dict) -> None:
    s = report["summary"]
    print(
        f"[{report['system']}] {s['completed']}/{s['num_requests']} ok, failed={s['failed']}, "
        f"early_stops={s['num_early_stops']}, out_tokens={s['total_output_tokens']}, wall={fmt(s['wall_s'])}s\n"
        f"  output tok/s = {fmt(s['output_tok_per_s'])}\n"
        f"  TTFT mean/p50/p90/p99 = {fmt(s['ttft_mean_s'], 3)} / {fmt(s['ttft_p50_s'], 3)} / "
        f"{fmt(s['ttft_p90_s'], 3)} / {fmt(s['ttft_p99_s'], 3)} s\n"
        f"  E2E mean/p90 = {fmt(s['e2e_mean_s'], 3)} / {fmt(s['e2e_p90_s'], 3)} s, "
        f"ITL mean = {fmt((s['itl_mean_s'] or 0) * 1000, 1)} ms"
    )
    if report["early_stops"]:
        print(f"  EARLY STOPS: {report['early_stops'][:8]}{' ...' if len(report['early_stops']) > 8 else ''}")
    if report["failures"]:
        print(f"  FAILURES: {report['failures'][:4]}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI base URL (ending in /v1)")
    p.add_argument("--model", default=None, help="model name to send (default: first id of GET /v1/models)")
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--label", default="server", help="system name used in the report")
    p.add_argument("--num-requests", "-n", type=int, default=64)
    p.add_argument("--concurrency", "-c", type=int, default=32)
    p.add_argument("--max-tokens", "-m", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="prompt-set seed")
    p.add_argument("--prompt-words", type=int, default=10, help="random words per prompt")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send vLLM-style extra_body ignore_eos=true (transformers serve rejects unknown fields with 422)")
    p.add_argument("--extra-body", default=None, help="JSON object merged into every request body")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up requests sent first (sequentially)")
    p.add_argument("--warmup-tokens", type=int, default=4)
    p.add_argument("--timeout", type=float, default=1800.0, help="global timeout for the measured phase (s)")
    p.add_argument("--request-timeout", type=float, default=1800.0, help="per-request timeout (s)")
    p.add_argument("--out", default=None, help="write the JSON report here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    report = asyncio.run(run_load(args))
    print_summary(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"  wrote {args.out}")
    s = report["summary"]
    return 0 if s["completed"] == s["num_requests"] and not s["timed_out"] else 1


if __name__ == "__main__":
    sys.exit(main())
