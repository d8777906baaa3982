#!/usr/bin/env python3
"""Priority scheduling under load (issue 37, acceptance 1 and 2), on the embedded default on
this CPU, one server per policy (--policies, each started with --scheduling-policy P
--max-num-seqs --max-num-seqs and a queue that holds the whole background load):

  warm-up     a probe and one spoken turn, unmeasured
  idle        --probes probes, one at a time: a completion of one token (its latency is its
              TTFT) at priority -1 (0 under fcfs, which takes no other); then --turns spoken
              Realtime turns (bench/realtime_latency.py's clip and server VAD, sessions of
              --turns-per-session turns), first audio after speech_stopped as the client saw it
  alone       (first policy only) each background prompt alone, greedy: the reference texts
  loaded      --background requests at once, each a greedy completion of --background-tokens
              tokens (ignore_eos) at priority 0, each one sent again as soon as it answers, so
              the batch stays full; once the server runs a full batch with more waiting, the
              same probes and turns as idle; then the background stops sending and drains
  check       every background answer (every round of every prompt) equals its prompt's text
              alone: a preempted request's work is recomputed, never lost or changed

Prints, per policy: probe TTFT and first audio (p50, p90, max) idle and loaded, the loaded/idle
p90 ratios (acceptance: at most 2x, and first audio under 700 ms under priority), the
background's answers and how many equal their reference, and preemptions by reason. Run it on
a quiet machine: nothing else may use the CPU meanwhile.

    PYTHONPATH=. .venv/bin/python bench/priority_load.py
    PYTHONPATH=. .venv/bin/python bench/priority_load.py --background 16 --probes 5 --turns 5   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realtime_load import (
    MODEL,
    TEXT,
    clip_pcm16,
    configure,
    connect,
    dithered,
    im_end_bias,
    read_metrics,
    speak,
    started_server,
)

PROBE_PRIORITY = -1


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": _pct(values, 50), "p90": _pct(values, 90), "max": max(values, default=float("nan"))}


async def completion(client: httpx.AsyncClient, prompt: str, max_tokens: int, priority: int) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if priority:
        body["priority"] = priority
    r = await client.post("/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return str(r.json()["choices"][0]["text"])


async def probes(client: httpx.AsyncClient, n: int, priority: int, gap_s: float = 0.2) -> list[float]:
    """ms per one-token completion at priority, one at a time (each prompt its own)."""
    out = []
    for i in range(n):
        start = time.monotonic()
        await completion(client, f"Probe {i}: what is two plus {i}?", 1, priority)
        out.append((time.monotonic() - start) * 1000)
        await asyncio.sleep(gap_s)
    return out


async def turns(base: str, n: int, per_session: int, pcm: bytes, bias: dict[str, float], seed0: int) -> list[float]:
    """First audio after speech_stopped (ms) per spoken turn; a turn without audio counts as inf."""
    out: list[float] = []
    for first in range(0, n, per_session):
        async with connect(base, MODEL) as conn:
            await configure(conn, bias, silence_ms=400)
            for i in range(first, min(first + per_session, n)):
                turn = await speak(conn, dithered(pcm, seed0 + i))
                out.append(float("inf") if turn.first_audio_s is None else turn.first_audio_s * 1000)
                await asyncio.sleep(0.3)
    return out


def background_prompt(i: int) -> str:
    return f"Story {i}: the lighthouse keeper counted the ships that passed in the night, and"


class Background:
    """Background requests at priority 0, each sent again as soon as it answers, until stopped."""

    def __init__(self, client: httpx.AsyncClient, n: int, max_tokens: int) -> None:
        self.client, self.n, self.max_tokens = client, n, max_tokens
        self.answers: list[tuple[int, str]] = []  # (prompt index, text)
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(i)) for i in range(self.n)]

    async def _loop(self, i: int) -> None:
        while not self._stop.is_set():
            try:
                self.answers.append((i, await completion(self.client, background_prompt(i), self.max_tokens, 0)))
            except httpx.HTTPError as exc:
                self.errors.append(f"{i}: {exc!r}")
                await asyncio.sleep(0.5)

    async def drain(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def until_full(base: str, max_num_seqs: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = await asyncio.to_thread(read_metrics, base)
        if m.get("vllm:num_requests_running", 0) >= max_num_seqs and m.get("vllm:num_requests_waiting", 0) > 0:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the background never filled the batch")


async def run_policy(base: str, policy: str, args: argparse.Namespace, reference: dict[int, str] | None) -> dict[str, Any]:
    pcm = clip_pcm16(TEXT)
    bias = im_end_bias(base, MODEL)
    priority = PROBE_PRIORITY if policy == "priority" else 0
    limits = httpx.Limits(max_connections=args.background + 8)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=600) as client:
        await probes(client, 1, priority)  # warm-up
        await turns(base, 1, 1, pcm, bias, 10_000)
        idle_probes = await probes(client, args.probes, priority)
        idle_turns = await turns(base, args.turns, args.turns_per_session, pcm, bias, 0)
        if reference is None:
            reference = {}
            for i in range(args.background):
                reference[i] = await completion(client, background_prompt(i), args.background_tokens, 0)
        before_reasons = await asyncio.to_thread(preemptions_by_reason, base)
        background = Background(client, args.background, args.background_tokens)
        background.start()
        await until_full(base, args.max_num_seqs)
        loaded_probes = await probes(client, args.probes, priority)
        loaded_turns = await turns(base, args.turns, args.turns_per_session, pcm, bias, 1000)
        await background.drain()
        after_reasons = await asyncio.to_thread(preemptions_by_reason, base)
    same = sum(1 for i, text in background.answers if text == reference[i])
    return {
        "policy": policy,
        "probe_priority": priority,
        "idle_probe_ms": summary(idle_probes),
        "loaded_probe_ms": summary(loaded_probes),
        "idle_first_audio_ms": summary(idle_turns),
        "loaded_first_audio_ms": summary(loaded_turns),
        "background_answers": len(background.answers),
        "background_same_as_alone": same,
        "background_errors": background.errors[:5],
        "preemptions": {k: after_reasons[k] - before_reasons[k] for k in after_reasons},
        "reference": reference,
    }


def preemptions_by_reason(base: str) -> dict[str, float]:
    """omni_preemptions_by_reason_total per reason, summed over the engines."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out = {"kv_cache": 0.0, "priority": 0.0}
    for line in text.splitlines():
        if line.startswith("omni_preemptions_by_reason_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def report(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        ip, lp = r["idle_probe_ms"], r["loaded_probe_ms"]
        ia, la = r["idle_first_audio_ms"], r["loaded_first_audio_ms"]
        lines += [
            f"## --scheduling-policy {r['policy']} (probes at priority {r['probe_priority']})",
            "| | idle p50 | idle p90 | loaded p50 | loaded p90 | loaded max | p90 loaded/idle |",
            "|---|---|---|---|---|---|---|",
            (f"| probe TTFT, ms ({lp['n']}) | {ip['p50']:.0f} | {ip['p90']:.0f} | {lp['p50']:.0f} | {lp['p90']:.0f} | "
            f"{lp['max']:.0f} | {lp['p90'] / ip['p90']:.2f}x |"),
            (f"| Realtime first audio, ms ({la['n']}) | {ia['p50']:.0f} | {ia['p90']:.0f} | {la['p50']:.0f} | "
            f"{la['p90']:.0f} | {la['max']:.0f} | {la['p90'] / ia['p90']:.2f}x |"),
            "",
            (f"background: {r['background_answers']} answers, {r['background_same_as_alone']} equal to their prompt's "
            f"text alone; preemptions during the load, by reason: {r['preemptions']}; "
            f"errors: {r['background_errors'] or 'none'}"),
            "",
        ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    reference = None
    for policy in args.policies.split(","):
        server_args = ["--scheduling-policy", policy, "--max-num-seqs", str(args.max_num_seqs),
                       "--max-queued-requests", str(4 * args.background), *args.server_arg]  # fmt: skip
        with started_server(f"priority-load-{policy}", server_args) as (base, _):
            result = await run_policy(base, policy, args, reference)
        reference = result["reference"]
        results.append(result)
        print(report([result]), flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default="priority,fcfs")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--background", type=int, default=64)
    p.add_argument("--background-tokens", type=int, default=256)
    p.add_argument("--probes", type=int, default=20)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--turns-per-session", type=int, default=5)
    p.add_argument("--server-arg", action="append", default=[], help="an extra omni-serve argument (repeatable)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    results = asyncio.run(main_async(args))
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "reference"} for r in results], indent=2))


if __name__ == "__main__":
    main()
