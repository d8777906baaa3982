"""Pure statistics over request records: latency percentiles, throughput, goodput, hit rate.

Latencies and token counts come from completed requests only (outcome "ok"); errors are
counted by message; requests cancelled by --timeout are counted and otherwise ignored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.omni_bench.record import RequestRecord

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    """Per-request latency objectives in seconds; None: not constrained."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """'ttft=0.5,tpot=0.05,e2e=10' (seconds; any subset)."""
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in ("ttft", "tpot", "e2e"):
                raise ValueError(f"bad SLO {item!r}: expected ttft=S, tpot=S or e2e=S")
            values[f"{key.strip()}_s"] = float(value)
        if not values:
            raise ValueError("empty SLO")
        return cls(**values)

    def met_by(self, record: RequestRecord) -> bool:
        """A completed request meets the SLO when every given bound holds. TPOT is
        undefined for replies of fewer than two tokens; such replies pass the TPOT bound."""
        if not record.ok:
            return False
        if self.ttft_s is not None and (record.ttft_s is None or record.ttft_s > self.ttft_s):
            return False
        if self.e2e_s is not None and (record.e2e_s is None or record.e2e_s > self.e2e_s):
            return False
        tpot = record.tpot_s
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


@dataclass(frozen=True)
class LatencyStats:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class Goodput:
    slo: Slo
    num_good: int
    requests_per_s: float  # good requests / duration
    fraction: float | None  # good / finished (completed + errors)


@dataclass(frozen=True)
class Summary:
    num_requests: int  # sent during the measured phase
    num_completed: int
    num_errors: int
    num_cancelled: int  # in flight when --timeout stopped the run
    errors: dict[str, int]  # error message -> count
    timed_out: bool
    duration_s: float
    total_prompt_tokens: int
    total_completion_tokens: int
    total_cached_tokens: int
    request_throughput: float  # completed requests / s
    input_throughput: float  # prompt tokens of completed requests / s
    output_throughput: float  # completion tokens / s
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats  # every gap between token-bearing chunks, pooled
    e2e: LatencyStats
    prefix_cache_hit_rate: float | None  # cached / prompt tokens; None without prompt tokens
    num_cached_tokens_reported: int  # completed requests whose usage had cached_tokens
    num_usage_missing: int  # completed requests without a usage chunk
    goodput: Goodput | None


def latency_stats(values: Sequence[float]) -> LatencyStats:
    """Mean and linearly interpolated percentiles (numpy's default method)."""
    if len(values) == 0:
        return LatencyStats(0, None, None, None, None)
    array = np.asarray(values, dtype=float)
    p50, p90, p99 = (float(p) for p in np.percentile(array, PERCENTILES))
    return LatencyStats(len(array), float(array.mean()), p50, p90, p99)


def prefix_cache_hit_rate(records: Sequence[RequestRecord]) -> float | None:
    prompt = sum(r.num_prompt_tokens or 0 for r in records)
    cached = sum(r.num_cached_tokens or 0 for r in records)
    return cached / prompt if prompt else None


def goodput(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> Goodput:
    finished = [r for r in records if r.outcome != "cancelled"]
    good = sum(slo.met_by(r) for r in finished)
    return Goodput(
        slo, good, good / duration_s if duration_s > 0 else 0.0,
        good / len(finished) if finished else None,
    )


def summarize(records: Sequence[RequestRecord], duration_s: float, timed_out: bool = False,
              slo: Slo | None = None) -> Summary:
    ok = [r for r in records if r.ok]
    errors = Counter(r.error or "unknown error" for r in records if r.outcome == "error")
    prompt_tokens = sum(r.num_prompt_tokens or 0 for r in ok)
    completion_tokens = sum(r.num_output_tokens for r in ok)

    def per_s(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    return Summary(
        num_requests=len(records),
        num_completed=len(ok),
        num_errors=sum(errors.values()),
        num_cancelled=sum(r.outcome == "cancelled" for r in records),
        errors=dict(errors.most_common()),
        timed_out=timed_out,
        duration_s=duration_s,
        total_prompt_tokens=prompt_tokens,
        total_completion_tokens=completion_tokens,
        total_cached_tokens=sum(r.num_cached_tokens or 0 for r in ok),
        request_throughput=per_s(len(ok)),
        input_throughput=per_s(prompt_tokens),
        output_throughput=per_s(completion_tokens),
        ttft=latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot=latency_stats([t for r in ok if (t := r.tpot_s) is not None]),
        itl=latency_stats([gap for r in ok for gap in r.itl_s]),
        e2e=latency_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        prefix_cache_hit_rate=prefix_cache_hit_rate(ok),
        num_cached_tokens_reported=sum(r.num_cached_tokens is not None for r in ok),
        num_usage_missing=sum(not r.usage_reported for r in ok),
        goodput=goodput(records, duration_s, slo) if slo is not None else None,
    )
