import pytest
from pytest import approx

from bench.omni_bench.record import RequestRecord
from bench.omni_bench.report import format_table
from bench.omni_bench.summary import LatencyStats, Slo, latency_stats, summarize


def ok(index, ttft, e2e, completion, prompt, cached, itl=()):
    return RequestRecord(index, index, 0, 16, outcome="ok", ttft_s=ttft, e2e_s=e2e, itl_s=list(itl),
                         num_prompt_tokens=prompt, num_completion_tokens=completion,
                         num_cached_tokens=cached, num_chunks=completion, usage_reported=True)


def records():
    return [
        ok(0, 0.1, 1.1, 11, 100, 50, itl=(0.1, 0.1)),  # tpot 0.1
        ok(1, 0.2, 0.7, 6, 100, 0, itl=(0.2,)),  # tpot 0.1
        ok(2, 0.3, 2.3, 5, 200, None, itl=(0.3, 0.5)),  # tpot 0.5; server sent no cached_tokens
        ok(3, 0.4, 0.4, 1, 100, 100),  # one token: tpot undefined
        RequestRecord(4, 4, 0, 16, outcome="error", http_status=429, error="HTTP 429: slow down"),
        RequestRecord(5, 5, 0, 16, outcome="error", http_status=429, error="HTTP 429: slow down"),
        RequestRecord(6, 6, 0, 16, outcome="cancelled"),
    ]


def test_latency_stats_interpolate_linearly():
    assert latency_stats([0.4, 0.1, 0.3, 0.2]) == LatencyStats(
        4, approx(0.25), approx(0.25), approx(0.37), approx(0.397))
    assert latency_stats([]) == LatencyStats(0, None, None, None, None)
    assert latency_stats([2.0]) == LatencyStats(1, 2.0, 2.0, 2.0, 2.0)


def test_tpot_is_decode_time_per_token_after_the_first():
    assert records()[0].tpot_s == approx(0.1)
    assert records()[3].tpot_s is None
    no_usage = RequestRecord(0, 0, 0, 8, outcome="ok", ttft_s=0.5, e2e_s=1.5, num_chunks=5)
    assert no_usage.num_output_tokens == 5 and no_usage.tpot_s == approx(0.25)


def test_summary_counts_tokens_and_latencies():
    s = summarize(records(), duration_s=2.0)
    assert (s.num_requests, s.num_completed, s.num_errors, s.num_cancelled) == (7, 4, 2, 1)
    assert s.errors == {"HTTP 429: slow down": 2}
    assert (s.total_prompt_tokens, s.total_completion_tokens, s.total_cached_tokens) == (500, 23, 150)
    assert s.request_throughput == 2.0 and s.input_throughput == 250.0 and s.output_throughput == 11.5
    assert s.prefix_cache_hit_rate == 0.3 and s.num_cached_tokens_reported == 3
    assert s.ttft == LatencyStats(4, approx(0.25), approx(0.25), approx(0.37), approx(0.397))
    assert s.e2e == LatencyStats(4, approx(1.125), approx(0.9), approx(1.94), approx(2.264))
    assert s.tpot == LatencyStats(3, approx(0.7 / 3), approx(0.1), approx(0.42), approx(0.492))
    assert s.itl.count == 5 and s.itl.mean == approx(0.24) and s.itl.p50 == approx(0.2)
    assert s.goodput is None and s.num_usage_missing == 0


@pytest.mark.parametrize("slo, good", [
    ("ttft=0.25,tpot=0.2", 2),  # r0, r1; r2 and r3 miss ttft
    ("e2e=1.0", 2),  # r1, r3
    ("tpot=0.2", 3),  # r0, r1, r3 (one token: no TPOT to miss)
    ("ttft=1,tpot=1,e2e=10", 4),
])
def test_goodput_counts_requests_meeting_every_slo(slo, good):
    g = summarize(records(), duration_s=2.0, slo=Slo.parse(slo)).goodput
    assert g.num_good == good
    assert g.requests_per_s == good / 2.0
    assert g.fraction == good / 6  # errors count as misses; cancelled requests not at all


def test_slo_parse():
    assert Slo.parse("ttft=0.5,tpot=0.05,e2e=10") == Slo(0.5, 0.05, 10.0)
    assert Slo.parse("e2e=3") == Slo(e2e_s=3.0)
    for bad in ("", "ttft", "itl=1", "ttft=x"):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def test_empty_run():
    s = summarize([], duration_s=0.0, slo=Slo(ttft_s=1.0))
    assert s.num_requests == 0 and s.request_throughput == 0.0 and s.prefix_cache_hit_rate is None
    assert s.ttft.mean is None and s.goodput.num_good == 0 and s.goodput.fraction is None


def test_table_lists_every_latency_and_error():
    table = format_table(summarize(records(), 2.0, slo=Slo(ttft_s=0.25)), [("model", "m")])
    for needle in ("TTFT", "TPOT", "ITL", "E2E", "30.0%", "goodput", "2 x HTTP 429: slow down",
                   "250.0", "11.5"):
        assert needle in table, needle
    assert table.splitlines()[-6].split() == ["TTFT", "250.0", "250.0", "370.0", "397.0", "4"]
