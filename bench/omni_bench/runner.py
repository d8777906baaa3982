"""Paces a workload's requests: a closed loop of C workers, or open-loop Poisson arrivals.

Either way the unit dispatched is a conversation, whose turns go out one after another
(turn t needs the reply to turn t-1). Closed loop: C workers each take the next
conversation and run it to its end, so C requests are in flight. Open loop: conversations
start at seeded Poisson arrival times (for one-turn workloads that is R requests/s; for
multi-turn, R conversation starts/s), optionally capped at max_concurrency requests in
flight, later arrivals waiting for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.omni_bench.client import Client
from bench.omni_bench.record import RequestRecord
from bench.omni_bench.workload import Conversation


@dataclass(frozen=True)
class LoadConfig:
    concurrency: int | None = 1  # closed loop; None with request_rate set
    request_rate: float | None = None  # open loop, arrivals per second (inf: all at once)
    max_concurrency: int | None = None  # open loop only
    num_requests: int | None = None  # cap on measured requests; None: the whole workload
    timeout_s: float | None = None  # stop the measured phase and keep partial results
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or request_rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError("request_rate must be > 0")


@dataclass
class RunResult:
    records: list[RequestRecord]
    duration_s: float
    timed_out: bool
    warmup_records: list[RequestRecord] = field(default_factory=list)


def poisson_arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each of n arrivals happens; the first at 0."""
    rng = random.Random(f"arrivals-{seed}")
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def planned_requests(conversations: list[Conversation], num_requests: int | None) -> int:
    total = sum(c.num_turns for c in conversations)
    return total if num_requests is None else min(total, num_requests)


class Runner:
    def __init__(self, client: Client, model: str, load: LoadConfig,
                 on_done: Callable[[RequestRecord], None] | None = None) -> None:
        self.client = client
        self.model = model
        self.load = load
        self.on_done = on_done
        self._records: list[RequestRecord] = []
        self._remaining = 0
        self._slots: asyncio.Semaphore | None = None
        self._phase_start = 0.0

    async def run(self, conversations: list[Conversation],
                  warmup: list[Conversation] | None = None) -> RunResult:
        warmup_records = await self._warmup(warmup or [])
        self._records = []
        self._remaining = planned_requests(conversations, self.load.num_requests)
        self._phase_start = time.perf_counter()
        timed_out = False
        try:
            await asyncio.wait_for(self._measure(conversations), timeout=self.load.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        duration = time.perf_counter() - self._phase_start
        return RunResult(self._records, duration, timed_out, warmup_records)

    async def _warmup(self, conversations: list[Conversation]) -> list[RequestRecord]:
        # One at a time and unmeasured: first-request costs (lazy init, graph capture)
        # should not land on the measured requests.
        self._records, self._remaining = [], planned_requests(conversations, None)
        self._phase_start = time.perf_counter()
        for conversation in conversations:
            await self._conversation(conversation, report=False)
        return self._records

    async def _measure(self, conversations: list[Conversation]) -> None:
        if self.load.concurrency is not None:
            await self._closed_loop(conversations, self.load.concurrency)
        else:
            assert self.load.request_rate is not None
            await self._open_loop(conversations, self.load.request_rate)

    async def _closed_loop(self, conversations: list[Conversation], concurrency: int) -> None:
        queue = deque(conversations)

        async def worker() -> None:
            while queue and self._remaining > 0:
                await self._conversation(queue.popleft())

        # gather cancels every worker when --timeout cancels it.
        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def _open_loop(self, conversations: list[Conversation], rate: float) -> None:
        if self.load.max_concurrency is not None:
            self._slots = asyncio.Semaphore(self.load.max_concurrency)
        arrivals = poisson_arrival_times(len(conversations), rate, self.load.seed)
        tasks: list[asyncio.Task[None]] = []
        try:
            for conversation, at in zip(conversations, arrivals, strict=True):
                if self._remaining <= 0:
                    break
                delay = self._phase_start + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._conversation(conversation)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _conversation(self, conversation: Conversation, report: bool = True) -> None:
        replies: list[str] = []
        for turn in range(conversation.num_turns):
            if self._remaining <= 0:
                return
            self._remaining -= 1
            payload = self.client.payload(self.model, conversation, replies)
            async with self._slots if self._slots is not None else contextlib.nullcontext():
                # Recorded once sent: a request still waiting for a slot at --timeout
                # was never in flight and leaves no record.
                record = RequestRecord(
                    index=len(self._records), conversation_id=conversation.conversation_id,
                    turn=turn, max_tokens=conversation.max_tokens[turn], group=conversation.group,
                )
                self._records.append(record)
                reply = await self.client.send(payload, record, self._phase_start)
            if report and self.on_done is not None:
                self.on_done(record)
            if not record.ok:
                return  # a later turn would resend a history the server never produced
            replies.append(reply)
