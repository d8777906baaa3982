"""ModelPool on its own: its real engines, schedulers and placement, each worker a
FakeLLMWorker (tests/omni/engines/fake_worker.py: the last token plus one). The queue's
arithmetic and deadlines are tests/omni/engines/test_admission.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from omni.config import AdmissionConfig, LLMConfig, ModelConfig
from omni.engines.admission import QueueLimits, QueueLoad
from omni.engines.llm import EngineError, RequestStream, TokenEvent
from omni.engines.pool import ModelPool, choice_groups
from omni.metrics import Metrics
from scheduler.placement import Placement, make_placement
from scheduler.request import MediaSpan, Request, RequestId, SamplingParams
from tests.omni.engines.fake_worker import FakeLLMWorker

GUARD_S = 120.0  # a hung engine fails the test instead of hanging it


def make_pool(num_workers: int, placement: Placement | None = None, **admission: Any) -> tuple[ModelPool, list[FakeLLMWorker]]:
    config = ModelConfig(
        name="m",
        model_dir=Path("."),
        llm=LLMConfig(block_size=4, max_num_seqs=2, num_workers=num_workers),
        admission=AdmissionConfig(**admission),
    )
    pool = ModelPool(config, Metrics(), placement)
    workers = []
    for engine in pool.engines:
        worker = FakeLLMWorker(engine.spec, engine.wake)  # type: ignore[arg-type]
        engine.worker = worker  # type: ignore[assignment]
        workers.append(worker)
    return pool, workers


@pytest.fixture
async def two() -> AsyncIterator[tuple[ModelPool, list[FakeLLMWorker]]]:
    pool, workers = make_pool(2, make_placement("round-robin"))
    await pool.start()
    yield pool, workers
    await pool.stop()


def request(name: str, prompt: Sequence[int], max_tokens: int = 2, media: tuple[MediaSpan, ...] = ()) -> Request:
    return Request(RequestId(name), list(prompt), SamplingParams(max_tokens=max_tokens), media=media)


async def tokens(stream: RequestStream) -> list[int]:
    async def drain() -> list[int]:
        return [cast(TokenEvent, e).token_id async for e in stream]

    return await asyncio.wait_for(drain(), GUARD_S)


def placements(pool: ModelPool, engine: str, reason: str) -> float:
    value = pool.metrics.registry.get_sample_value(
        "omni_placement_decisions_total", {"model_name": "m", "engine": engine, "reason": reason}
    )
    return value or 0.0


def test_a_run_of_requests_on_one_prompt_is_one_group() -> None:
    prompt = [1, 2, 3]
    image = (MediaSpan(0, 2, "in/a"),)
    requests = [
        request("a", prompt), request("b", list(prompt)), request("c", [9]),
        request("d", prompt), request("e", prompt, media=image), request("f", prompt, media=image),
    ]  # fmt: skip
    groups = choice_groups(requests)
    assert [g.n for g in groups] == [2, 2, 1, 1, 2, 2]
    assert groups[0] is groups[1] and groups[4] is groups[5]
    assert groups[3] is not groups[0]  # the same prompt again, after another: a new prompt's choices
    assert choice_groups([]) == []


async def test_one_worker_takes_every_request_unhashed() -> None:
    pool, workers = make_pool(1)
    await pool.start()
    try:
        assert pool.ready and pool.serving and pool.max_model_len == 64
        assert await tokens(pool.submit(request("a", [4, 5]))) == [6, 7]
        assert placements(pool, "0", "only") == 1.0
        assert [n.request_id for s in workers[0].steps for n in s.new_requests] == ["a"]
    finally:
        await pool.stop()


async def test_round_robin_alternates_and_each_worker_serves_its_own(two: tuple[ModelPool, list[FakeLLMWorker]]) -> None:
    pool, workers = two
    streams = [pool.submit(request(f"r{i}", [10 * i])) for i in range(1, 4)]
    assert [s.worker_id for s in streams] == [0, 1, 0]
    assert [await tokens(s) for s in streams] == [[11, 12], [21, 22], [31, 32]]
    held = [sorted({n.request_id for s in w.steps for n in s.new_requests}) for w in workers]
    assert held == [["r1", "r3"], ["r2"]]
    assert (placements(pool, "0", "round_robin"), placements(pool, "1", "round_robin")) == (2.0, 1.0)


async def test_prefix_aware_placement_follows_a_prompt_in_flight_and_then_cached() -> None:
    pool, workers = make_pool(2, make_placement("prefix-aware", seed=0))
    await pool.start()
    try:
        prompt = list(range(1, 10))  # two full blocks of 4: what the hash chain covers
        first = pool.submit(request("a", prompt))
        # submitted before a's first step: its blocks are not cached yet, but in flight there
        second = pool.submit(request("b", prompt))
        assert second.worker_id == first.worker_id
        assert placements(pool, str(first.worker_id), "prefix") == 1.0
        assert await tokens(first) == [10, 11] and await tokens(second) == [10, 11]
        third = request("c", prompt, max_tokens=1)
        stream = pool.submit(third)
        assert stream.worker_id == first.worker_id
        assert await tokens(stream) == [10]
        assert third.num_cached_tokens == 8
        # the prefix kept every request on one worker: the other saw nothing
        other = workers[1 - first.worker_id]
        assert other.steps == []
    finally:
        await pool.stop()


async def test_a_worker_down_leaves_the_pool_serving_on_the_other() -> None:
    pool, workers = make_pool(2, make_placement("round-robin"))
    await pool.engines[0].start()  # worker 1 never came up
    try:
        assert pool.serving and not pool.ready
        assert pool.queue_limits == QueueLimits.for_model(pool.config.admission, [pool.engines[0].queue_limits])
        streams = [pool.submit(request(f"r{i}", [i])) for i in range(3)]
        assert [s.worker_id for s in streams] == [0, 0, 0]
        assert [await tokens(s) for s in streams] == [[1, 2], [2, 3], [3, 4]]
        assert workers[1].steps == [] and workers[1].starts == 0
    finally:
        await pool.stop()


async def test_with_no_worker_ready_nothing_is_admitted_or_placed() -> None:
    pool, _ = make_pool(1)
    assert not pool.serving and pool.max_model_len == 0
    with pytest.raises(EngineError, match="no worker of this model is ready"):
        pool.admit([request("a", [1])])
    with pytest.raises(EngineError, match="no worker of this model is ready"):
        pool.submit(request("a", [1]))


async def test_a_worker_dying_fails_only_its_own_requests(two: tuple[ModelPool, list[FakeLLMWorker]]) -> None:
    pool, workers = two
    workers[0].die_on_step = {1}
    doomed = pool.submit(request("a", [1], max_tokens=5))
    fine = pool.submit(request("b", [100], max_tokens=5))
    with pytest.raises(EngineError, match="llm worker failed"):
        await tokens(doomed)
    assert await tokens(fine) == [101, 102, 103, 104, 105]
    assert (workers[0].starts, workers[1].starts) == (2, 1)


async def test_an_abort_reaches_the_worker_that_holds_the_request(two: tuple[ModelPool, list[FakeLLMWorker]]) -> None:
    pool, workers = two
    for worker in workers:
        worker.gate = asyncio.Event()
    a = pool.submit(request("a", [1], max_tokens=3))
    b = pool.submit(request("b", [2], max_tokens=3))
    assert (a.worker_id, b.worker_id) == (0, 1)
    pool.abort(b)
    assert pool.engines[1].scheduler is not None and pool.engines[1].scheduler.get_request(RequestId("b")) is None
    assert pool.engines[0].scheduler is not None and pool.engines[0].scheduler.get_request(RequestId("a")) is not None
    for worker in workers:
        worker.gate.set()  # type: ignore[union-attr]
    assert await tokens(a) == [2, 3, 4]
    assert b.queue.empty()


async def test_admitted_requests_count_as_queued_until_submitted(two: tuple[ModelPool, list[FakeLLMWorker]]) -> None:
    pool, workers = two
    for worker in workers:
        worker.gate = asyncio.Event()  # nothing runs: what is submitted stays put
    choices = [request("c0", [1, 2, 3]), request("c1", [1, 2, 3])]
    with pool.admit(choices) as admission:
        assert admission.request_ids == ("c0", "c1")
        assert pool.queued == QueueLoad(2, 6)
        with pytest.raises(ValueError, match="admitted already"):
            pool.admit([request("c0", [1])])
        stream = pool.submit(choices[0])
        assert stream.group is not None and stream.group.n == 2  # admitted as one prompt's two choices
    # c1 was never submitted: its place is given back; c0 waits in its worker's scheduler (no
    # await since: the step loop has not taken it)
    assert pool.queued == QueueLoad(1, 3)
    pool.abort(stream)
    assert pool.queued == QueueLoad(0, 0)
