"""The periodic stats line, as vLLM writes it, one per model every --log-stats-interval seconds:

    omni-tiny: prompt 812.4 tokens/s, generation 96.0 tokens/s, running 6 reqs, waiting 0 reqs,
    KV cache 12.5%, prefix cache hit rate 61.0%

Read from the server's own metrics (the `vllm:` series, summed over the model's LLM workers),
so the line and /metrics never disagree. Throughputs and the hit rate are over the interval;
running, waiting and KV usage are now (KV usage: the fullest worker's). An idle model logs one
line when it goes idle, then nothing until traffic returns (--disable-log-stats: none at all).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

log = logging.getLogger("omni.stats")

_SUMS = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prefix_cache_queries": "prefix_queries",
    "vllm:prefix_cache_hits": "prefix_hits",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
_MAXIMA = {"vllm:kv_cache_usage_perc": "kv_usage"}


@dataclass(slots=True)
class ModelStats:
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1
    drafts: float = 0.0  # speculative decoding: requests' drafts verified, their tokens, accepted
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0


def read_stats(registry: CollectorRegistry) -> dict[str, ModelStats]:
    """Each model's counters and gauges, from the registry's current samples."""
    stats: dict[str, ModelStats] = defaultdict(ModelStats)
    for family in registry.collect():
        field, summed = (_SUMS[family.name], True) if family.name in _SUMS else (_MAXIMA.get(family.name), False)
        if field is None:
            continue
        for sample in family.samples:
            model = sample.labels.get("model_name")
            if model is None or sample.name.endswith("_created"):
                continue
            entry, value = stats[model], sample.value
            old = getattr(entry, field)
            setattr(entry, field, old + value if summed else max(old, value))
    return dict(stats)


def stats_line(model: str, before: ModelStats, now: ModelStats, seconds: float) -> str:
    queries = now.prefix_queries - before.prefix_queries
    hit_rate = (now.prefix_hits - before.prefix_hits) / queries * 100 if queries > 0 else 0.0
    line = (
        f"{model}: prompt {(now.prompt_tokens - before.prompt_tokens) / seconds:.1f} tokens/s, "
        f"generation {(now.generation_tokens - before.generation_tokens) / seconds:.1f} tokens/s, "
        f"running {now.running:.0f} reqs, waiting {now.waiting:.0f} reqs, "
        f"KV cache {now.kv_usage * 100:.1f}%, prefix cache hit rate {hit_rate:.1f}%"
    )
    drafts = now.drafts - before.drafts
    if drafts > 0:  # vLLM's mean acceptance length: the tokens a verifying step emits, on average
        accepted = now.accepted_tokens - before.accepted_tokens
        rate = accepted / max(1.0, now.draft_tokens - before.draft_tokens) * 100
        line += f", spec decode mean acceptance length {1 + accepted / drafts:.2f}, draft acceptance rate {rate:.1f}%"
    return line


def _busy(before: ModelStats, now: ModelStats) -> bool:
    return (
        now.running > 0
        or now.waiting > 0
        or now.prompt_tokens != before.prompt_tokens
        or now.generation_tokens != before.generation_tokens
    )


async def log_stats_forever(registry: CollectorRegistry, interval: float) -> None:
    """The stats loop (a task of the app's, cancelled on shutdown)."""
    before, then = read_stats(registry), time.monotonic()
    idle: set[str] = set()
    while True:
        await asyncio.sleep(interval)
        now, at = read_stats(registry), time.monotonic()
        for model, stats in now.items():
            previous = before.get(model, ModelStats())
            if _busy(previous, stats):
                idle.discard(model)
            elif model in idle:
                continue  # said once that it is idle
            else:
                idle.add(model)
            log.info("%s", stats_line(model, previous, stats, at - then))
        before, then = now, at
