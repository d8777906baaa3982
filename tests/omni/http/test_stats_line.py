"""The periodic stats line reads the vLLM series of the server's registry."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from omni.http.stats_line import ModelStats, log_stats_forever, read_stats, stats_line


def _registry() -> tuple[CollectorRegistry, dict[str, Counter | Gauge]]:
    r = CollectorRegistry()
    labels = ["model_name", "engine"]
    series: dict[str, Counter | Gauge] = {
        "prompt": Counter("vllm:prompt_tokens", "", labels, registry=r),
        "generation": Counter("vllm:generation_tokens", "", labels, registry=r),
        "queries": Counter("vllm:prefix_cache_queries", "", labels, registry=r),
        "hits": Counter("vllm:prefix_cache_hits", "", labels, registry=r),
        "running": Gauge("vllm:num_requests_running", "", labels, registry=r),
        "waiting": Gauge("vllm:num_requests_waiting", "", labels, registry=r),
        "kv": Gauge("vllm:kv_cache_usage_perc", "", labels, registry=r),
    }
    return r, series


def test_the_line_sums_workers_and_takes_rates_over_the_interval() -> None:
    registry, s = _registry()
    before = read_stats(registry)
    for engine, (prompt, gen, running, kv) in enumerate([(300, 40, 2, 0.25), (100, 20, 1, 0.5)]):
        labels = ("m", str(engine))
        s["prompt"].labels(*labels).inc(prompt)
        s["generation"].labels(*labels).inc(gen)
        s["running"].labels(*labels).set(running)  # type: ignore[union-attr]
        s["kv"].labels(*labels).set(kv)  # type: ignore[union-attr]
    s["queries"].labels("m", "0").inc(200)
    s["hits"].labels("m", "0").inc(50)
    now = read_stats(registry)
    assert before == {}  # no series had samples yet
    line = stats_line("m", ModelStats(), now["m"], 2.0)
    assert line == (
        "m: prompt 200.0 tokens/s, generation 30.0 tokens/s, running 3 reqs, waiting 0 reqs, "
        "KV cache 50.0%, prefix cache hit rate 25.0%"
    )


async def test_an_idle_model_logs_once_then_waits_for_traffic(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's ticks are the test's: its sleep waits for tick(), which returns once the loop
    has logged (or not) and sleeps again. Counted turns, not wall time."""
    registry, s = _registry()
    s["prompt"].labels("m", "0").inc(0)  # the series exists, idle
    caplog.set_level(logging.INFO, logger="omni.stats")
    real_sleep = asyncio.sleep
    ticks: asyncio.Queue[None] = asyncio.Queue()
    sleeps = 0

    async def sleep(seconds: float) -> None:
        nonlocal sleeps
        sleeps += 1
        await ticks.get()

    async def tick() -> None:
        before = sleeps
        ticks.put_nowait(None)
        while sleeps == before:  # until the turn is done and the loop sleeps again
            await real_sleep(0)

    monkeypatch.setattr("omni.http.stats_line.asyncio.sleep", sleep)
    task = asyncio.create_task(log_stats_forever(registry, 0.02))
    while sleeps == 0:
        await real_sleep(0)
    for _ in range(3):
        await tick()
    idle_lines = [r.message for r in caplog.records]
    s["generation"].labels("m", "0").inc(10)
    for _ in range(2):
        await tick()
    task.cancel()
    lines = [r.message for r in caplog.records]
    assert len(idle_lines) == 1 and "generation 0.0 tokens/s" in idle_lines[0]
    busy = [line for line in lines[1:] if "generation 0.0" not in line]
    assert len(busy) == 1 and busy[0].startswith("m: prompt 0.0 tokens/s, generation ")
    assert len(lines) == 3  # idle once, busy, then idle once again
