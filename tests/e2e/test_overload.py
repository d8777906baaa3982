"""Overload through the real server: a burst beyond the queue limits is refused at once with
429 and Retry-After while every admitted request finishes, the OpenAI client retries such
refusals by itself, and a request past its deadline is aborted with its KV blocks freed.

The queue is filled with a gate, not with timing: two requests start running, the server's
workers are held (SIGSTOP, tests.e2e.server.workers_held), and what comes next queues behind
them and cannot move until the test releases the workers. So the counts asserted are exact.

The burst's figures (admitted, refused, the server's peak resident memory, the time) are
printed (run with -s to see them), never asserted: no timing or memory thresholds here, only
generous hang guards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import read_metric
from tests.e2e.server import PROCESSES, running_server, worker_pids, workers_held

MODEL = "m"
MAX_NUM_SEQS = 2
MAX_QUEUED_REQUESTS = 4
# What the limits admit at once: a running batch and a full queue; the burst is 4x that.
BURST = 4 * (MAX_NUM_SEQS + MAX_QUEUED_REQUESTS)
HANG_GUARD_S = 120.0


@pytest.fixture(scope="module")
def small_server(tiny_model_dir: Path) -> Iterator[str]:
    with running_server(
        "--model", f"{MODEL}={tiny_model_dir}",
        "--block-size", "4",
        "--num-kv-blocks", "256",
        "--max-model-len", "1024",
        "--max-num-seqs", str(MAX_NUM_SEQS),
        "--max-queued-requests", str(MAX_QUEUED_REQUESTS),
    ) as base:  # fmt: skip
        yield base


@pytest.fixture(scope="module")
def deadline_server(tiny_model_dir: Path) -> Iterator[str]:
    with running_server(
        "--model", f"{MODEL}={tiny_model_dir}",
        "--block-size", "4",
        "--num-kv-blocks", "256",
        "--max-model-len", "1024",
        "--request-timeout", "0.5",
    ) as base:  # fmt: skip
        yield base


def chat(i: int, max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Count to ten, {i}."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every admitted request runs its full length
        "stream": stream,
    }


class RssSampler:
    """The peak resident memory of the server process and of its workers, sampled from /proc
    every few milliseconds while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_server_kib = 0
        self.peak_total_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss_kib(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
        return 0

    def _run(self) -> None:
        workers = worker_pids(self.pid)
        while not self._stop.wait(0.005):
            server = self._rss_kib(self.pid)
            self.peak_server_kib = max(self.peak_server_kib, server)
            self.peak_total_kib = max(self.peak_total_kib, server + sum(self._rss_kib(w) for w in workers))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# Each running request is this long: it cannot finish in the moment between its first token
# and the workers being held, and after the release it ends soon.
RUNNING_TOKENS = 256


async def _running(client: httpx.AsyncClient, i: int, started: asyncio.Event, max_tokens: int) -> str | None:
    """A streamed chat request that sets started once its first token is out (so it is in
    the running batch); its finish_reason, once it ends."""
    body = {**chat(i, max_tokens, stream=True), "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    finish = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if (chunk.get("usage") or {}).get("completion_tokens", 0) >= 1:
                started.set()
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
    return finish


async def _start_running(client: httpx.AsyncClient, max_tokens: int) -> list[asyncio.Task[str | None]]:
    """MAX_NUM_SEQS streams, returned once each has its first token: the running batch is full."""
    started = [asyncio.Event() for _ in range(MAX_NUM_SEQS)]
    tasks = [asyncio.create_task(_running(client, 100 + i, e, max_tokens)) for i, e in enumerate(started)]
    for event, task in zip(started, tasks):
        await asyncio.wait({asyncio.create_task(event.wait()), task}, return_when=asyncio.FIRST_COMPLETED)
        assert event.is_set(), f"a running request ended before its first token: {task.result()}"
    return tasks


async def _fill_queue(client: httpx.AsyncClient, n: int) -> list[asyncio.Task[httpx.Response]]:
    """With the running batch full and the workers held, n > MAX_QUEUED_REQUESTS requests
    posted at once: the queue takes MAX_QUEUED_REQUESTS of them and refuses the rest. Returns
    once every refusal is answered, so the queue is surely full (a refusal sees it full, and
    while the workers are held nothing leaves it); the admitted ones are still pending."""
    posts = [asyncio.create_task(client.post("/v1/chat/completions", json=chat(i, 64))) for i in range(n)]
    while sum(p.done() for p in posts) < n - MAX_QUEUED_REQUESTS:
        await asyncio.wait([p for p in posts if not p.done()], return_when=asyncio.FIRST_COMPLETED)
    assert all(p.result().status_code == 429 for p in posts if p.done())
    return posts


async def _burst(base: str) -> tuple[list[str | None], list[httpx.Response]]:
    """With the running batch full and the workers held, BURST requests: the queue takes
    MAX_QUEUED_REQUESTS of them, the rest are refused while it is full. The refusals are all
    answered before the workers are released; then everything admitted runs to its end."""
    limits = httpx.Limits(max_connections=BURST + MAX_NUM_SEQS)
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S, limits=limits) as client:
        running = await _start_running(client, RUNNING_TOKENS)
        with workers_held(PROCESSES[base].pid):
            posts = await _fill_queue(client, BURST)
            assert not any(r.done() for r in running), "a running request ended while the workers were held"
        return await asyncio.gather(*running), await asyncio.gather(*posts)


def test_a_burst_beyond_the_limits_is_refused_at_once_and_the_rest_finish(small_server: str) -> None:
    before = read_metric(small_server, "omni_requests_rejected_total", model_name=MODEL, reason="requests")
    with RssSampler(PROCESSES[small_server].pid) as rss:
        start = time.monotonic()
        finishes, responses = asyncio.run(asyncio.wait_for(_burst(small_server), HANG_GUARD_S))
        elapsed = time.monotonic() - start
    assert finishes == ["length"] * MAX_NUM_SEQS
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(admitted) + len(refused) == BURST, sorted({r.status_code for r in responses})
    # exactly what the queue holds is admitted; the rest are refused while it is full
    assert (len(admitted), len(refused)) == (MAX_QUEUED_REQUESTS, BURST - MAX_QUEUED_REQUESTS)
    for r in refused:
        assert int(r.headers["Retry-After"]) >= 1
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("requests", "rate_limit_exceeded", None)
        assert "queue is full" in error["message"]
    for r in admitted:
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 64
    after = read_metric(small_server, "omni_requests_rejected_total", model_name=MODEL, reason="requests")
    assert after - before == len(refused)
    assert read_metric(small_server, "vllm:num_requests_waiting", model_name=MODEL) == 0
    assert read_metric(small_server, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0
    refusal_times = sorted(r.elapsed.total_seconds() for r in refused)
    print(
        f"\nburst of {BURST}: {len(admitted)} admitted (200), {len(refused)} refused (429) in "
        f"{elapsed:.2f} s; slowest refusal {refusal_times[-1] * 1000:.0f} ms; peak RSS: server "
        f"{rss.peak_server_kib / 1024:.0f} MiB, server and workers {rss.peak_total_kib / 1024:.0f} MiB"
    )


def test_the_openai_client_retries_refusals_by_itself(small_server: str) -> None:
    async def burst() -> list[str | None]:
        client = openai.AsyncOpenAI(base_url=f"{small_server}/v1", api_key="none", max_retries=10, timeout=HANG_GUARD_S)
        async with client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"Count to ten, {i}."}],
                        max_tokens=16,
                        extra_body={"ignore_eos": True},
                    )
                    for i in range(2 * (MAX_NUM_SEQS + MAX_QUEUED_REQUESTS))
                )
            )
        return [r.choices[0].finish_reason for r in replies]

    assert asyncio.run(asyncio.wait_for(burst(), HANG_GUARD_S)) == ["length"] * (2 * (MAX_NUM_SEQS + MAX_QUEUED_REQUESTS))


def test_a_stream_past_its_deadline_ends_with_an_error_and_frees_its_blocks(deadline_server: str) -> None:
    """Once the stream has its first token the workers are held, so it surely outlives its
    0.5 s deadline (no bet on how fast the device decodes)."""
    events: list[str] = []
    body = {**chat(0, 1000, stream=True), "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    holding = False
    with contextlib.ExitStack() as held:
        with httpx.stream("POST", f"{deadline_server}/v1/chat/completions", json=body, timeout=HANG_GUARD_S) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    usage = json.loads(line[6:]).get("usage") if line != "data: [DONE]" else None
                    if usage and usage["completion_tokens"] >= 1 and not holding:
                        held.enter_context(workers_held(PROCESSES[deadline_server].pid))
                        holding = True
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "0.5 s deadline" in error["message"]
    assert len(events) > 3  # the role chunk, some text, then the error
    assert read_metric(deadline_server, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0
    assert read_metric(deadline_server, "vllm:num_requests_running", model_name=MODEL) == 0
    assert read_metric(deadline_server, "omni_request_deadlines_exceeded_total", model_name=MODEL) >= 1


def test_a_request_past_its_deadline_is_a_504(deadline_server: str) -> None:
    with workers_held(PROCESSES[deadline_server].pid):  # it cannot finish before its deadline
        r = httpx.post(f"{deadline_server}/v1/chat/completions", json=chat(1, 1000), timeout=HANG_GUARD_S)
    assert r.status_code == 504
    error = r.json()["error"]
    assert error["code"] == "deadline_exceeded"
    assert "0.5 s deadline" in error["message"]
    assert read_metric(deadline_server, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0


async def _realtime_answer(base: str, **response: object) -> list[dict[str, object]]:
    """One realtime response to a text turn on the text model (client commits, text out): the
    events from response.create's to response.done, then a session.update's answer (the socket
    still takes events)."""
    from bench.realtime_load import connect

    events: list[dict[str, object]] = []

    async def until(conn: object, kind: str) -> None:
        while True:
            event = json.loads(await conn.recv_bytes())  # type: ignore[attr-defined]
            events.append(event)
            if event["type"] == kind:
                return

    async with connect(base, MODEL) as conn:
        await conn.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
        await conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                     "content": [{"type": "input_text", "text": "Count to ten."}]}})  # fmt: skip
        await conn.send({"type": "response.create", "event_id": "the_create", "response": response})
        await asyncio.wait_for(until(conn, "response.done"), HANG_GUARD_S)
        await conn.send({"type": "session.update", "session": {"type": "realtime", "instructions": "still here"}})
        await asyncio.wait_for(until(conn, "session.updated"), HANG_GUARD_S)
    return events


def test_a_realtime_response_refused_by_admission_control_fails_and_the_session_goes_on(small_server: str) -> None:
    """With the queue full (MAX_NUM_SEQS running, MAX_QUEUED_REQUESTS waiting, the workers
    held so none of them can move), a realtime response is refused as a chat request is: an `error` naming its response.create (the 429's
    type and code), then response.done failed; the socket stays usable."""

    async def scenario() -> list[dict[str, object]]:
        limits = httpx.Limits(max_connections=MAX_NUM_SEQS + MAX_QUEUED_REQUESTS + 1)
        async with httpx.AsyncClient(base_url=small_server, timeout=HANG_GUARD_S, limits=limits) as client:
            running = await _start_running(client, 1000)
            waiting: list[asyncio.Task[httpx.Response]] = []
            try:
                with workers_held(PROCESSES[small_server].pid):
                    waiting = await _fill_queue(client, MAX_QUEUED_REQUESTS + 1)
                    assert not any(t.done() for t in running), "a running request ended while the workers were held"
                    return await _realtime_answer(small_server)
            finally:
                for t in running + waiting:
                    t.cancel()
                await asyncio.gather(*running, *waiting, return_exceptions=True)

    refused_before = read_metric(small_server, "omni_realtime_responses_total", model_name=MODEL, status="failed")
    events = asyncio.run(asyncio.wait_for(scenario(), HANG_GUARD_S))
    kinds = [e["type"] for e in events]
    error = next(e for e in events if e["type"] == "error")["error"]
    assert isinstance(error, dict)
    assert (error["type"], error["code"], error["event_id"]) == ("requests", "rate_limit_exceeded", "the_create"), error
    assert "queue is full" in error["message"]
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert isinstance(done, dict) and done["status"] == "failed"
    assert done["status_details"]["error"]["code"] == "rate_limit_exceeded"
    assert kinds.index("error") < kinds.index("response.done") and kinds[-1] == "session.updated"
    assert read_metric(small_server, "omni_realtime_responses_total", model_name=MODEL, status="failed") == refused_before + 1


def test_a_realtime_response_past_its_deadline_fails_and_frees_its_blocks(deadline_server: str) -> None:
    """--request-timeout applies to each realtime response as to a chat request: the answer is
    aborted at the deadline (an `error` deadline_exceeded naming its response.create, then
    response.done failed), its KV blocks freed, and the session goes on."""
    # held, the answer cannot end (sampled, the random model once drew its end token before the
    # deadline) nor run to its length before the 0.5 s deadline, however fast the device
    with workers_held(PROCESSES[deadline_server].pid):
        events = asyncio.run(asyncio.wait_for(_realtime_answer(deadline_server, max_output_tokens=1000), HANG_GUARD_S))
    error = next(e for e in events if e["type"] == "error")["error"]
    assert isinstance(error, dict)
    assert (error["code"], error["event_id"]) == ("deadline_exceeded", "the_create") and "0.5 s deadline" in error["message"]
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert isinstance(done, dict) and done["status"] == "failed"
    assert events[-1]["type"] == "session.updated"
    assert read_metric(deadline_server, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0
    assert read_metric(deadline_server, "vllm:num_requests_running", model_name=MODEL) == 0
