"""The three forms of a run's result: a printed table, a JSON file and a latency plot.

JSON layout (schema "omni-bench/1"):
    schema, created (UTC ISO time),
    config    the run's settings (api key left out),
    summary   Summary as a dict; latencies in seconds,
    requests  one RequestRecord.to_json() per measured request, in dispatch order,
    warmup    the same for the unmeasured warm-up requests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from bench.omni_bench.record import RequestRecord
from bench.omni_bench.runner import RunResult
from bench.omni_bench.summary import LatencyStats, Summary

SCHEMA = "omni-bench/1"


def result_json(config: dict[str, Any], run: RunResult, summary: Summary) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "summary": asdict(summary),
        "requests": [r.to_json() for r in run.records],
        "warmup": [r.to_json() for r in run.warmup_records],
    }


def write_json(path: str | Path, result: dict[str, Any]) -> None:
    Path(path).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def format_table(summary: Summary, header: Sequence[tuple[str, str]] = ()) -> str:
    s = summary
    rows = list(header)
    rows.append(("requests", (f"{s.num_requests} sent, {s.num_completed} ok, {s.num_errors} errors, "
                              f"{s.num_cancelled} cancelled")))
    rows.append(("duration", f"{s.duration_s:.2f} s" + ("  (stopped by --timeout)" if s.timed_out else "")))
    rows.append(("throughput", (f"{s.request_throughput:.2f} req/s, input {s.input_throughput:.1f} tok/s, "
                                f"output {s.output_throughput:.1f} tok/s")))
    rows.append(("tokens", (f"prompt {s.total_prompt_tokens}, completion {s.total_completion_tokens}, "
                            f"cached {s.total_cached_tokens}")))
    hit = "-" if s.prefix_cache_hit_rate is None else f"{s.prefix_cache_hit_rate:.1%}"
    rows.append(("prefix cache hit", (f"{hit} ({s.num_cached_tokens_reported}/{s.num_completed} "
                                      "replies reported cached_tokens)")))
    if s.num_usage_missing:
        rows.append(("usage missing", f"{s.num_usage_missing} replies (output tokens = chunks)"))
    if s.goodput is not None:
        g = s.goodput
        bounds = ", ".join(f"{k[:-2]}<={v:g}s" for k, v in asdict(g.slo).items() if v is not None)
        fraction = "-" if g.fraction is None else f"{g.fraction:.1%}"
        finished = s.num_completed + s.num_errors
        rows.append(("goodput", (f"{g.requests_per_s:.2f} req/s meet {bounds} "
                                 f"({g.num_good}/{finished} finished = {fraction})")))
    width = max(len(k) for k, _ in rows) + 2
    lines = ["=" * 20 + " omni-bench " + "=" * 20]
    lines += [f"{k:<{width}}{v}" for k, v in rows]
    lines.append(f"{'latency (ms)':<{width}}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}{'n':>8}")
    stats: list[tuple[str, LatencyStats]] = [
        ("TTFT", s.ttft), ("TPOT", s.tpot), ("ITL", s.itl), ("E2E", s.e2e)]
    for name, st in stats:
        cells = "".join(f"{_ms(x):>9}" for x in (st.mean, st.p50, st.p90, st.p99))
        lines.append(f"{name:<{width}}{cells}{st.count:>8}")
    if s.errors:
        lines.append("errors:")
        lines += [f"  {n:>5} x {message}" for message, n in s.errors.items()]
    return "\n".join(lines)


def write_plot(path: str | Path, records: Sequence[RequestRecord]) -> None:
    """Histogram (top) and CDF (bottom) of TTFT, TPOT and E2E. Needs matplotlib
    (the optional 'bench' extra); raises ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    import numpy as np

    ok = [r for r in records if r.ok]
    series = {
        "TTFT": [r.ttft_s for r in ok if r.ttft_s is not None],
        "TPOT": [t for r in ok if (t := r.tpot_s) is not None],
        "E2E": [r.e2e_s for r in ok if r.e2e_s is not None],
    }
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), squeeze=False)
    for col, (name, values) in enumerate(series.items()):
        ms = np.sort(np.asarray(values, dtype=float)) * 1000
        hist, cdf = axes[0][col], axes[1][col]
        hist.set_title(f"{name} (n={len(ms)})")
        cdf.set_xlabel(f"{name} (ms)")
        if len(ms):
            hist.hist(ms, bins=min(50, max(5, len(ms) // 4)))
            cdf.plot(ms, np.arange(1, len(ms) + 1) / len(ms), drawstyle="steps-post")
            for q in (50, 90, 99):
                cdf.axvline(float(np.percentile(ms, q)), linestyle=":", color="grey")
        hist.set_ylabel("requests")
        cdf.set_ylabel("fraction ≤ x")
        cdf.set_ylim(0, 1.01)
        cdf.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
