"""A worker of several processes (one torch.distributed group, gloo on CPU) fits the
supervised-worker base: it starts whole, answers through rank 0, and when any rank dies the
whole group is restarted. A job's error fails that job alone, unless it is a CUDA error that
leaves the device unusable: then the worker exits and is restarted (review A3)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable

import pytest

from omni.engines.supervisor import EngineError, SupervisedWorker
from omni.shared import protocol
from tests.omni import group_runner
from tests.omni.group_runner import Probe, ProbeReady, ProbeResult, ProbeSpec


class ProbeEngine(SupervisedWorker):
    def __init__(self, world_size: int) -> None:
        super().__init__(
            ProbeSpec(world_size=world_size, num_threads=1),
            name="probe",
            start_timeout=120.0,
            entry=group_runner.main,
        )
        self.world_size_seen = 0
        self.readies = 0
        self._jobs: list[tuple[int, asyncio.Future[int]]] = []
        self._inflight: asyncio.Future[int] | None = None
        self._next = 0

    def on_ready(self, ready: ProbeReady) -> None:
        self.world_size_seen = ready.world_size
        self.readies += 1

    async def probe(self, value: int) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._jobs.append((value, future))
        self.wake()
        return await future

    async def run_once(self) -> None:
        if not self._jobs:
            await self.wait_for_work()
            return
        value, self._inflight = self._jobs.pop(0)
        self._next += 1
        await self.worker.send(Probe(self._next, value))
        reply = await self.worker.recv()
        if isinstance(reply, protocol.WorkerError):
            self._inflight.set_exception(EngineError(reply.message))
            self._inflight = None
            return
        assert isinstance(reply, ProbeResult) and reply.job_id == self._next
        self._inflight.set_result(reply.total)
        self._inflight = None

    def fail_on_worker(self, error: EngineError) -> None:
        if self._inflight is not None and not self._inflight.done():
            self._inflight.set_exception(error)
        self._inflight = None

    def fail_pending(self, error: EngineError) -> None:
        self.fail_on_worker(error)
        for _, future in self._jobs:
            future.set_exception(error)
        self._jobs = []


async def until(condition: Callable[[], bool], timeout: float) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def group() -> AsyncIterator[ProbeEngine]:
    engine = ProbeEngine(world_size=2)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def test_a_group_starts_whole_and_every_rank_takes_part(group: ProbeEngine) -> None:
    assert group.ready and group.world_size_seen == 2
    assert len(group.worker.pids) == 2 and all(pid is not None for pid in group.worker.pids)
    # rank 0 contributes 1x, rank 1 2x: only a real two-process collective gives 3 * 3
    assert await asyncio.wait_for(group.probe(3), 120) == 9
    assert await asyncio.wait_for(group.probe(5), 120) == 15


async def test_a_dead_follower_restarts_the_whole_group(group: ProbeEngine) -> None:
    before = list(group.worker.pids)
    assert before[1] is not None
    os.kill(before[1], signal.SIGKILL)  # rank 1 only; rank 0 is still alive
    await until(lambda: not group.ready, timeout=120)
    await until(lambda: group.ready, timeout=120)
    after = group.worker.pids
    assert group.readies == 2
    assert len(after) == 2 and set(after).isdisjoint(before)  # both ranks are new processes
    assert await asyncio.wait_for(group.probe(2), 120) == 6


async def test_a_job_on_a_dying_group_fails_and_stop_fails_the_queue() -> None:
    engine = ProbeEngine(world_size=2)
    await engine.start()
    try:
        leader = engine.worker.pids[0]
        assert leader is not None
        os.kill(leader, signal.SIGSTOP)  # rank 0 cannot answer: the job is surely in flight
        job = asyncio.ensure_future(engine.probe(1))
        await until(lambda: engine._inflight is not None, timeout=120)
        os.kill(leader, signal.SIGKILL)
        with pytest.raises(EngineError, match="probe worker failed"):
            await asyncio.wait_for(job, 120)
    finally:
        queued = asyncio.ensure_future(engine.probe(4))
        await asyncio.sleep(0)
        await engine.stop()
    with pytest.raises(EngineError, match="shutting down"):
        await queued


@pytest.mark.parametrize("world_size", [1, 2])
async def test_a_cuda_error_restarts_the_worker_and_other_errors_fail_one_job(world_size: int) -> None:
    """The probe's job raises what torch raises on a GPU (group_runner.FAILURES): an
    out-of-range index (IndexError on the CPU) and running out of memory fail that job and
    keep the process; a CUDA error (a device-side assert: sticky) fails it and ends the
    process, which the supervisor starts again."""
    engine = ProbeEngine(world_size=world_size)
    await engine.start()
    try:
        first = list(engine.worker.pids)
        for value, says in ((-3, "IndexError: index 1000000000"), (-2, "OutOfMemoryError: CUDA out of memory")):
            with pytest.raises(EngineError, match=says):
                await asyncio.wait_for(engine.probe(value), 120)
        assert engine.ready and engine.worker.pids == first and engine.readies == 1
        with pytest.raises(EngineError, match="device-side assert triggered"):
            await asyncio.wait_for(engine.probe(-1), 120)
        await until(lambda: engine.readies == 2 and engine.ready, timeout=120)
        assert set(engine.worker.pids).isdisjoint(first)  # a new process (every rank of a group)
        assert await asyncio.wait_for(engine.probe(2), 120) == 2 * sum(range(1, world_size + 1))
    finally:
        await engine.stop()


async def test_a_clean_stop_of_a_group_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """stop() asks the group to exit, and a follower may exit before its leader: its lifeline
    closes as when a rank dies, but that is the stop, not a fault, so nothing is logged at
    ERROR (a clean SIGTERM of the server logged "a rank of its group exited" for its image
    decoder group). The order is forced: the leader is held (SIGSTOP) while the follower goes."""
    engine = ProbeEngine(world_size=2)
    await engine.start()
    leader, follower = engine.worker.pids
    assert leader is not None and follower is not None
    os.kill(leader, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.INFO):
            stopping = asyncio.ensure_future(engine.stop())
            # its loop cancelled, stop() goes on to the worker's stop (no await in between)
            await until(lambda: engine._task is not None and engine._task.done(), timeout=120)
            os.kill(follower, signal.SIGKILL)  # the follower is gone first, its leader still there
            await until(lambda: engine.worker._dead, timeout=120)  # its lifeline's EOF was read
    finally:
        os.kill(leader, signal.SIGKILL)  # stop() ends the wait for it and joins it
    await asyncio.wait_for(stopping, 120)
    assert "a rank of its group exited while it stops" in caplog.text
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
