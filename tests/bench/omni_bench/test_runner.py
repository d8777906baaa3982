import asyncio
import itertools

import orjson
import pytest

from bench.omni_bench import client as client_module
from bench.omni_bench import runner as runner_module
from bench.omni_bench.client import Client, ClientConfig, open_session
from bench.omni_bench.runner import LoadConfig, Runner, poisson_arrival_times
from bench.omni_bench.summary import summarize
from bench.omni_bench.workload import LengthRange, MultiTurnWorkload, RandomWorkload

from .conftest import MODEL


async def run(fake, conversations, load, warmup=None, **client_kwargs):
    async with open_session() as session:
        client = Client(ClientConfig(fake.url, **client_kwargs), session)
        done = []
        result = await Runner(client, MODEL, load, on_done=done.append).run(conversations, warmup)
    # on_done hears of every finished request exactly once
    assert sorted(r.index for r in done) == [r.index for r in result.records if r.outcome != "cancelled"]
    return result


def random_conversations(n, max_tokens=4, seed=0):
    return RandomWorkload(n, LengthRange(5, 12), LengthRange(max_tokens, max_tokens)).conversations(seed)


async def test_closed_loop_counts_and_token_totals(fake_server):
    conversations = random_conversations(12)
    result = await run(fake_server, conversations, LoadConfig(concurrency=4))
    records = result.records
    assert [r.conversation_id for r in records] == list(range(12))  # dispatched in order
    assert all(r.ok and r.http_status == 200 and r.finish_reason == "length" for r in records)
    assert fake_server.max_in_flight <= 4 and len(fake_server.bodies) == 12
    prompt_tokens = [len(c.user_turns[0].split()) for c in conversations]
    s = summarize(records, result.duration_s)
    assert (s.num_completed, s.num_errors, s.num_cancelled, s.timed_out) == (12, 0, 0, False)
    assert s.total_prompt_tokens == sum(prompt_tokens)
    assert s.total_completion_tokens == 12 * 4
    assert s.total_cached_tokens == sum(p // 2 for p in prompt_tokens)
    assert s.itl.count == 12 * 3 and s.ttft.count == 12 and s.tpot.count == 12
    r = records[0]
    assert r.num_chunks == 4 and r.usage_reported and len(r.itl_s) == 3
    assert 0 < r.ttft_s < r.e2e_s and r.tpot_s > 0
    body = fake_server.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == MODEL and body["max_tokens"] == 4


class FakeClock:
    """The runner's and client's clock, which moves only when the runner sleeps, by exactly what
    it asked: the schedule is checked on this clock, with no wall time in the test."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay
        await asyncio.sleep(0)


class _AsyncioWith:
    """The asyncio module, but for its sleep: the fake clock's."""

    def __init__(self, clock: FakeClock) -> None:
        self.sleep = clock.sleep

    def __getattr__(self, name):
        return getattr(asyncio, name)


async def test_poisson_arrivals_respect_schedule_and_cap(fake_server, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(runner_module, "time", clock)
    monkeypatch.setattr(runner_module, "asyncio", _AsyncioWith(clock))
    monkeypatch.setattr(client_module, "time", clock)
    conversations = random_conversations(10)
    load = LoadConfig(concurrency=None, request_rate=200.0, max_concurrency=2, seed=3)
    result = await run(fake_server, conversations, load)
    assert len(result.records) == 10 and all(r.ok for r in result.records)
    assert fake_server.max_in_flight <= 2
    arrivals = poisson_arrival_times(10, 200.0, seed=3)
    # the runner slept from arrival to arrival (the clock stands still otherwise), so every
    # conversation started at its arrival: none before it
    assert clock.sleeps == pytest.approx([b - a for a, b in itertools.pairwise(arrivals)])
    for record in result.records:
        assert record.start_s >= arrivals[record.conversation_id] - 1e-9
    assert result.duration_s == pytest.approx(arrivals[-1])


def test_poisson_arrival_times_are_seeded_exponential_gaps():
    times = poisson_arrival_times(20_000, 4.0, seed=0)
    assert times[0] == 0.0 and times == sorted(times)
    assert times == poisson_arrival_times(20_000, 4.0, seed=0) != poisson_arrival_times(20_000, 4.0, seed=1)
    assert times[-1] / (len(times) - 1) == pytest.approx(0.25, rel=0.03)
    assert poisson_arrival_times(3, float("inf"), seed=0) == [0.0, 0.0, 0.0]


async def test_multi_turn_resends_the_servers_replies(fake_server):
    conversations = MultiTurnWorkload(3, 3, LengthRange(4, 6), LengthRange(3, 3)).conversations(0)
    result = await run(fake_server, conversations, LoadConfig(concurrency=2))
    assert len(result.records) == 9 and all(r.ok for r in result.records)
    turns_seen = {(r.conversation_id, r.turn) for r in result.records}
    assert turns_seen == {(c, t) for c in range(3) for t in range(3)}
    for body in fake_server.bodies:
        messages = body["messages"]
        for t in range(1, len(messages) // 2 + 1):
            # messages[2t-1] is the assistant reply to the request made of messages[:2t-1]
            assert messages[2 * t - 1]["role"] == "assistant"
            assert messages[2 * t - 1]["content"] == fake_server.replies[orjson.dumps(messages[:2 * t - 1])]
    assert max(len(b["messages"]) for b in fake_server.bodies) == 5
    by_turn = {(r.conversation_id, r.turn): r for r in result.records}
    for c in range(3):
        for t in (1, 2):  # each turn is sent only after the previous reply ended
            prev = by_turn[c, t - 1]
            assert by_turn[c, t].start_s >= prev.start_s + prev.e2e_s


async def test_http_errors_are_counted_not_raised(fake_server):
    fake_server.fail_every = 3
    result = await run(fake_server, random_conversations(9), LoadConfig(concurrency=3))
    s = summarize(result.records, result.duration_s)
    assert (s.num_requests, s.num_completed, s.num_errors) == (9, 6, 3)
    assert s.errors == {"HTTP 429: slow down": 3}
    assert sorted(r.http_status for r in result.records) == [200] * 6 + [429] * 3


async def test_stream_error_events_are_counted(fake_server):
    fake_server.stream_error_every = 4
    result = await run(fake_server, random_conversations(8), LoadConfig(concurrency=1))
    failed = [r for r in result.records if not r.ok]
    assert [r.index for r in failed] == [3, 7]
    assert failed[0].error == "stream error: engine died" and failed[0].num_chunks == 1
    assert summarize(result.records, result.duration_s).total_completion_tokens == 6 * 4


async def test_a_failed_turn_ends_its_conversation(fake_server):
    fake_server.fail_every = 2  # serials 2 and 4: each conversation's second turn
    conversations = MultiTurnWorkload(2, 3, LengthRange(4, 4), LengthRange(2, 2)).conversations(0)
    result = await run(fake_server, conversations, LoadConfig(concurrency=1))
    assert [(r.conversation_id, r.turn, r.outcome) for r in result.records] == [
        (0, 0, "ok"), (0, 1, "error"), (1, 0, "ok"), (1, 1, "error")]


async def test_num_requests_caps_a_multi_turn_run(fake_server):
    conversations = MultiTurnWorkload(3, 3, LengthRange(4, 4), LengthRange(2, 2)).conversations(0)
    result = await run(fake_server, conversations, LoadConfig(concurrency=2, num_requests=5))
    assert len(result.records) == 5 == len(fake_server.bodies)


async def test_timeout_keeps_partial_results(fake_server):
    fake_server.hold_after = 2  # each reply stops after 2 chunks: only the timeout ends the run
    conversations = random_conversations(4, max_tokens=40)
    result = await run(fake_server, conversations, LoadConfig(concurrency=2, timeout_s=1.0))
    assert result.timed_out
    assert [r.outcome for r in result.records] == ["cancelled", "cancelled"]
    assert [r.num_chunks for r in result.records] == [2, 2]  # what arrived before the stop is kept
    s = summarize(result.records, result.duration_s, result.timed_out)
    assert (s.num_requests, s.num_completed, s.num_errors, s.num_cancelled) == (2, 0, 0, 2)


async def test_warmup_is_sent_first_and_not_measured(fake_server):
    warmup = random_conversations(2, seed=99)
    result = await run(fake_server, random_conversations(3), LoadConfig(concurrency=1), warmup=warmup)
    assert len(result.warmup_records) == 2 and len(result.records) == 3
    assert [b["messages"] for b in fake_server.bodies[:2]] == [c.messages([]) for c in warmup]


async def test_completions_endpoint_and_api_key(fake_server):
    conversations = random_conversations(3)
    result = await run(fake_server, conversations, LoadConfig(concurrency=3),
                       endpoint="completions", api_key="sk-test", extra_body={"top_k": 1})
    assert all(r.ok and r.num_chunks == 4 and r.num_completion_tokens == 4 for r in result.records)
    assert {b["prompt"] for b in fake_server.bodies} == {c.prompt([]) for c in conversations}
    assert all(b["top_k"] == 1 for b in fake_server.bodies)
    assert all(h["Authorization"] == "Bearer sk-test" for h in fake_server.headers)


async def test_timeout_stops_an_open_loop(fake_server):
    fake_server.hold_after = 0  # the replies never end: only the timeout stops the run
    load = LoadConfig(concurrency=None, request_rate=float("inf"), max_concurrency=2, timeout_s=1.0)
    result = await run(fake_server, random_conversations(3, max_tokens=40), load)
    # Two were in flight; the third waited for a slot and was never sent.
    assert result.timed_out and [r.outcome for r in result.records] == ["cancelled", "cancelled"]
    assert len(fake_server.bodies) == 2
