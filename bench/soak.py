#!/usr/bin/env python3
"""Soak (issue 12): minutes of mixed text and image-input traffic at the server's sustainable
rate. Zero errors, flat memory and steady latency percentiles are the point; the figures are
printed per minute.

Starts `bin/omni-serve` on its embedded default model (the tiny omni checkpoint: LLM and
encoders; no --model) with a fresh local store (removed after), on a free port, logging to a
file. Then:

  ramp   a closed loop of the traffic mix at concurrency 1, 2, 4, ... (--ramp-seconds each),
         until requests/s stops growing by 10 %: the best requests/s is the server's capacity
         for this mix on this machine, client included
  soak   --minutes of open-loop (Poisson) arrivals at --load x that capacity; a request that
         would pass --max-in-flight is not sent and counted as `backlog` (the rate was not
         sustainable after all)

The mix (weights): chat 3, chat streamed 3, completion 1, completion streamed 1, chat with an
image 2. Images are small PNG data URLs: one in four is new (an encoder-cache miss), the rest
come from a pool of 4 (hits). Every request asks for --max-tokens tokens, temperature 1.

Per minute of the soak, by when requests were sent: count, errors by status, E2E latency
p50/p95/p99, TTFT p50/p95/p99 (streamed requests: the first chunk with text or a finish reason;
the role chunk comes before generation), the encoder cache's hits and misses, and at the
minute's end the RSS summed over the server and every process under it (/proc), its PSS, the
server's waiting requests and /proc/loadavg (the machine is shared: say how busy it was).
Prints a table; writes bench/results/soak-<UTC time>.json.

    .venv/bin/python bench/soak.py                        # ramp + 10 minutes
    .venv/bin/python bench/soak.py --minutes 1 --ramp-seconds 10
    .venv/bin/python bench/soak.py --rate 12 --minutes 3  # no ramp: this many requests/s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx  # noqa: E402
from media_bench import Server, metric, parse_metrics, png_data_url  # noqa: E402  (one server harness)

SCHEMA = "soak/1"
MODEL = "omni-tiny"  # the embedded default's served name
RESULTS = ROOT / "bench" / "results"
MIX = {"chat": 3, "chat_stream": 3, "completion": 1, "completion_stream": 1, "image": 2}
IMAGE_POOL = 4
NEW_IMAGE_EVERY = 4  # every 4th image request sends a new image
_WORDS = "river engine signal garden window market paper silver winter harbor lantern orbit kernel".split()


# ---- the traffic ----------------------------------------------------------------------------
@dataclass(slots=True)
class Record:
    kind: str
    sent: float  # s since the phase began
    e2e: float | None = None
    ttft: float | None = None  # streamed requests only
    status: str = "200"  # an HTTP status, or what went wrong before one came


class Traffic:
    """The request mix, drawn from one seeded generator."""

    def __init__(self, seed: int, max_tokens: int, image_size: int) -> None:
        self.rng = random.Random(seed)
        self.max_tokens = max_tokens
        self.image_size = image_size
        self.kinds = [k for k, w in MIX.items() for _ in range(w)]
        self.pool = [png_data_url(image_size, seed=1000 + i) for i in range(IMAGE_POOL)]
        self.num_images = 0
        self.new_seed = 10_000

    def _text(self) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(12))

    def next(self) -> tuple[str, str, dict[str, Any]]:
        kind = self.rng.choice(self.kinds)
        common = {"model": MODEL, "max_tokens": self.max_tokens, "temperature": 1.0}
        if kind.startswith("completion"):
            return kind, "/v1/completions", common | {"prompt": self._text(), "stream": kind.endswith("stream")}
        content: Any = f"{self._text()}?"
        if kind == "image":
            self.num_images += 1
            if self.num_images % NEW_IMAGE_EVERY == 0:
                self.new_seed += 1
                url = png_data_url(self.image_size, seed=self.new_seed)
            else:
                url = self.rng.choice(self.pool)
            content = [{"type": "text", "text": content}, {"type": "image_url", "image_url": {"url": url}}]
        body = common | {"messages": [{"role": "user", "content": content}], "stream": kind == "chat_stream"}
        return kind, "/v1/chat/completions", body


def _has_output(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or choice.get("finish_reason"):
            return True
    return False


async def send(client: httpx.AsyncClient, kind: str, path: str, body: dict[str, Any], t0: float) -> Record:
    started = time.perf_counter()
    record = Record(kind, started - t0)
    try:
        if body["stream"]:
            async with client.stream("POST", path, json=body) as response:
                record.status = str(response.status_code)
                if response.status_code == 200:
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[len("data: ") :])
                        if "error" in chunk:
                            record.status = f"stream error {chunk['error'].get('code')}"
                        elif record.ttft is None and _has_output(chunk):
                            record.ttft = time.perf_counter() - started
                else:
                    await response.aread()
        else:
            response = await client.post(path, json=body)
            record.status = str(response.status_code)
            if response.status_code == 200 and not response.json().get("choices"):
                record.status = "no choices"
    except Exception as e:  # noqa: BLE001  (a bench counts what went wrong, by kind)
        record.status = type(e).__name__
    record.e2e = time.perf_counter() - started
    return record


# ---- phases ---------------------------------------------------------------------------------
async def closed_loop(
    client: httpx.AsyncClient, traffic: Traffic, concurrency: int, seconds: float
) -> list[Record]:
    t0 = time.perf_counter()
    records: list[Record] = []

    async def worker() -> None:
        while time.perf_counter() - t0 < seconds:
            records.append(await send(client, *traffic.next(), t0))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def ramp(
    client: httpx.AsyncClient, traffic: Traffic, seconds: float, max_concurrency: int
) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    concurrency = 1
    while concurrency <= max_concurrency:
        records = await closed_loop(client, traffic, concurrency, seconds)
        ok = [r for r in records if r.status == "200"]
        step = {
            "concurrency": concurrency,
            "requests": len(records),
            "errors": len(records) - len(ok),
            "requests_per_s": len(ok) / seconds,
            "e2e_p50_s": _percentile([r.e2e for r in ok], 50),
        }
        steps.append(step)
        print(f"ramp: concurrency {concurrency}: {step['requests_per_s']:.2f} req/s, "
              f"p50 {step['e2e_p50_s']:.3f} s, {step['errors']} errors", flush=True)  # fmt: skip
        if len(steps) > 1 and step["requests_per_s"] < 1.1 * steps[-2]["requests_per_s"]:
            break
        concurrency *= 2
    return steps


@dataclass
class Minute:
    minute: int
    records: list[Record] = field(default_factory=list)
    backlog: int = 0
    sample: dict[str, Any] = field(default_factory=dict)  # process tree and server state at its end


async def soak(
    client: httpx.AsyncClient, traffic: Traffic, rate: float, minutes: int, max_in_flight: int, server_pid: int,
    base: str,
) -> tuple[list[Minute], dict[str, Any]]:  # fmt: skip
    t0 = time.perf_counter()
    minutes_out = [Minute(m) for m in range(minutes)]
    in_flight: set[asyncio.Task[Record]] = set()
    start_sample = await sample(server_pid, base)
    rng = random.Random(1)

    def done(task: asyncio.Task[Record]) -> None:
        in_flight.discard(task)
        record = task.result()
        minutes_out[min(int(record.sent // 60), minutes - 1)].records.append(record)

    async def sampler() -> None:
        previous = start_sample
        for m in minutes_out:
            await asyncio.sleep(max(0.0, t0 + 60 * (m.minute + 1) - time.perf_counter()))
            m.sample = await sample(server_pid, base)
            print(_row(m, previous), flush=True)  # requests still in flight count later, in the final table
            previous = m.sample

    sampling = asyncio.create_task(sampler())
    next_at = t0
    while (now := time.perf_counter()) < t0 + 60 * minutes:
        if now < next_at:
            await asyncio.sleep(next_at - now)
            continue
        next_at += rng.expovariate(rate)
        if len(in_flight) >= max_in_flight:
            minutes_out[min(int((now - t0) // 60), minutes - 1)].backlog += 1
            continue
        task = asyncio.create_task(send(client, *traffic.next(), t0))
        in_flight.add(task)
        task.add_done_callback(done)
    while in_flight:  # the last requests finish; their minute is the last one
        await asyncio.sleep(0.05)
    await sampling
    return minutes_out, start_sample


# ---- the server's process tree --------------------------------------------------------------
def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def _status_kib(pid: int, key: str, name: str = "status") -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory(pid: int) -> dict[str, Any]:
    pids = process_tree(pid)
    rss = {p: _status_kib(p, "VmRSS:") for p in pids}
    pss = sum(_status_kib(p, "Pss:", "smaps_rollup") for p in pids)
    return {
        "processes": len(pids),
        "rss_mib": sum(rss.values()) / 1024,
        "pss_mib": pss / 1024,
        "server_rss_mib": rss[pid] / 1024,
        "rss_mib_by_process": {_name(p): v / 1024 for p, v in rss.items()},
    }


def _name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    tail = " ".join(a.decode(errors="replace") for a in argv[1:4])
    return f"{pid} {tail[:60]}"


async def sample(server_pid: int, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {"loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    out |= await asyncio.to_thread(memory, server_pid)
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            snap = parse_metrics((await c.get(f"{base}/metrics")).text)
        out["num_requests_waiting"] = metric(snap, "vllm:num_requests_waiting")
        out["encoder_cache_hits"] = metric(snap, "omni_encoder_cache_hits_total")
        out["encoder_cache_misses"] = metric(snap, "omni_encoder_cache_misses_total")
    except httpx.HTTPError as e:
        out["metrics_error"] = repr(e)
    return out


# ---- report ---------------------------------------------------------------------------------
def _percentile(values: list[float | None], q: float) -> float | None:
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def _latencies(records: list[Record]) -> dict[str, Any]:
    ok = [r for r in records if r.status == "200"]
    return {
        "requests": len(records),
        **{f"e2e_p{q}_s": _percentile([r.e2e for r in ok], q) for q in (50, 95, 99)},
        **{f"ttft_p{q}_s": _percentile([r.ttft for r in ok], q) for q in (50, 95, 99)},
    }


def summary(m: Minute) -> dict[str, Any]:
    kinds = sorted({r.kind for r in m.records})
    return {
        "minute": m.minute + 1,
        **_latencies(m.records),
        "errors": dict(Counter(r.status for r in m.records if r.status != "200")),
        "backlog": m.backlog,
        "by_kind": {k: _latencies([r for r in m.records if r.kind == k]) for k in kinds},
        "sample": m.sample,
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


HEADER = (
    "| min | requests | errors | E2E p50/p95/p99 (ms) | TTFT p50/p95/p99 (ms) | enc. hits/misses | "
    "RSS (MiB) | PSS (MiB) | waiting | loadavg |\n|---:|---:|---:|---|---|---|---:|---:|---:|---|"
)


def _row(m: Minute, previous: dict[str, Any] | None = None) -> str:
    s = summary(m)
    sample_ = m.sample
    hits = sample_.get("encoder_cache_hits", 0) - (previous or {}).get("encoder_cache_hits", 0)
    misses = sample_.get("encoder_cache_misses", 0) - (previous or {}).get("encoder_cache_misses", 0)
    errors = sum(s["errors"].values()) + s["backlog"]
    cache = f"{hits:.0f}/{misses:.0f}" if previous is not None else "-"
    return (
        f"| {s['minute']} | {s['requests']} | {errors} | "
        f"{_ms(s['e2e_p50_s'])}/{_ms(s['e2e_p95_s'])}/{_ms(s['e2e_p99_s'])} | "
        f"{_ms(s['ttft_p50_s'])}/{_ms(s['ttft_p95_s'])}/{_ms(s['ttft_p99_s'])} | {cache} | "
        f"{sample_.get('rss_mib', 0):.0f} | {sample_.get('pss_mib', 0):.0f} | "
        f"{sample_.get('num_requests_waiting', 0):.0f} | {' '.join(sample_.get('loadavg', []))} |"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    store = Path(tempfile.mkdtemp(prefix="soak-store-"))
    log_path = RESULTS / "logs" / f"soak-{stamp}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(ROOT / "bin" / "omni-serve"), "--port", str(port), "--store", f"local:{store}", *args.server_arg]
    server = Server(cmd, log_path, stop_timeout=60)
    print("starting:", " ".join(cmd), flush=True)
    server.start()
    traffic = Traffic(args.seed, args.max_tokens, args.image_size)
    report: dict[str, Any] = {
        "schema": SCHEMA, "started_utc": stamp, "args": vars(args), "command": cmd,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "mix": MIX, "image_pool": IMAGE_POOL, "new_image_every": NEW_IMAGE_EVERY,
    }  # fmt: skip
    try:
        report["startup_s"] = server.wait_healthy(base, timeout=args.start_timeout)
        assert server.proc is not None
        limits = httpx.Limits(max_connections=args.max_in_flight + 8, max_keepalive_connections=args.max_in_flight + 8)
        async with httpx.AsyncClient(base_url=base, timeout=args.request_timeout, limits=limits) as client:
            report["idle_sample"] = await sample(server.proc.pid, base)
            if args.rate is None:
                steps = await ramp(client, traffic, args.ramp_seconds, args.max_concurrency)
                capacity = max(s["requests_per_s"] for s in steps)
                report["ramp"] = steps
                rate = args.load * capacity
                print(f"capacity {capacity:.2f} req/s; soaking at {rate:.2f} req/s ({args.load:g} x)", flush=True)
            else:
                rate = args.rate
            report["rate_per_s"] = rate
            print(HEADER, flush=True)
            minutes, start = await soak(client, traffic, rate, args.minutes, args.max_in_flight, server.proc.pid, base)
        report["start_sample"] = start
        report["minutes"] = [summary(m) for m in minutes]
        if args.keep_records:
            report["records"] = [asdict(r) | {"minute": m.minute + 1} for m in minutes for r in m.records]
        previous = start
        table = [HEADER]
        for m in minutes:
            table.append(_row(m, previous))
            previous = m.sample
        report["table"] = "\n".join(table)
    finally:
        report["server_stop"] = server.stop()
        shutil.rmtree(store, ignore_errors=True)
    report["totals"] = _totals(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{stamp}.json"
    out.write_text(json.dumps(report, indent=1))
    print("\n" + report.get("table", ""))
    print(json.dumps(report["totals"], indent=1))
    print(f"wrote {out} (server log {log_path})")
    return report


def _totals(report: dict[str, Any]) -> dict[str, Any]:
    minutes = report.get("minutes", [])
    errors: Counter[str] = Counter()
    for m in minutes:
        errors.update(m["errors"])
    start, end = report.get("start_sample", {}), (minutes[-1]["sample"] if minutes else {})
    p99 = [m["e2e_p99_s"] for m in minutes if m["e2e_p99_s"] is not None]
    return {
        "requests": sum(m["requests"] for m in minutes),
        "errors": dict(errors),
        "backlog": sum(m["backlog"] for m in minutes),
        "rss_mib_start_end": [start.get("rss_mib"), end.get("rss_mib")],
        "pss_mib_start_end": [start.get("pss_mib"), end.get("pss_mib")],
        "e2e_p50_s_by_minute": [m["e2e_p50_s"] for m in minutes],
        "e2e_p99_s_spread": [min(p99), max(p99)] if p99 else None,
        "e2e_p50_s_stdev": statistics.pstdev([m["e2e_p50_s"] for m in minutes if m["e2e_p50_s"] is not None] or [0]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--rate", type=float, help="requests/s to soak at (skips the ramp)")
    p.add_argument("--load", type=float, default=0.7, help="the soak's rate as a fraction of the ramp's best")
    p.add_argument("--ramp-seconds", type=float, default=20.0)
    p.add_argument("--max-concurrency", type=int, default=32, help="the ramp's last step at most")
    p.add_argument("--max-in-flight", type=int, default=64, help="open-loop requests outstanding at most")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64, help="pixels per side of the PNGs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument(
        "--server-arg", action="append", default=[], help="one more omni-serve argument: --server-arg=--flag=value"
    )
    p.add_argument("--keep-records", action="store_true", help="every request's record in the JSON too")
    args = p.parse_args()
    report = asyncio.run(run(args))
    totals = report["totals"]
    sys.exit(1 if totals["errors"] or totals["backlog"] else 0)


if __name__ == "__main__":
    main()
