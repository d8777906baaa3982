"""LLMEngine on its own: its real scheduler and step loop (started and stopped as the server
does), the worker a FakeLLMWorker (tests/omni/engines/fake_worker.py) that samples the last
token plus one. So a prompt [5, 6, 7] generates 8, 9, 10, ... and every assert is exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest

from omni.config import AdmissionConfig, LLMConfig
from omni.engines.admission import Limit
from omni.engines.llm import EngineError, LLMEngine, PrefillDone, RefusedAtSubmit, RequestStream, TokenEvent
from omni.metrics import Metrics
from omni.shared import protocol
from omni.text.constrained.constraint import TokenConstraint, single_token_mask
from scheduler.request import Request, RequestId, SamplingParams
from tests.omni.engines.fake_worker import FakeLLMWorker

GUARD_S = 120.0  # a hung engine fails the test instead of hanging it; never reached when it works


def make_engine(max_num_seqs: int = 2, scheduling_policy: str = "fcfs", **fake: Any) -> tuple[LLMEngine, FakeLLMWorker]:
    spec = protocol.LLMWorkerSpec(worker_id=0, model_dir=".", block_size=4)
    config = LLMConfig(block_size=4, max_num_seqs=max_num_seqs, scheduling_policy=scheduling_policy)
    engine = LLMEngine(spec, config, AdmissionConfig(), Metrics(), model_name="m")
    worker = FakeLLMWorker(spec, engine.wake, **fake)
    engine.worker = worker  # type: ignore[assignment]
    return engine, worker


@pytest.fixture
async def running() -> AsyncIterator[tuple[LLMEngine, FakeLLMWorker]]:
    engine, worker = make_engine()
    await engine.start()
    yield engine, worker
    await engine.stop()


def request(name: str, prompt: Sequence[int], max_tokens: int = 4, **params: Any) -> Request:
    eos = frozenset(params.pop("eos", ()))
    return Request(RequestId(name), list(prompt), SamplingParams(max_tokens=max_tokens, **params), eos_token_ids=eos)


async def events(stream: RequestStream) -> list[TokenEvent | PrefillDone]:
    async def drain() -> list[TokenEvent | PrefillDone]:
        return [e async for e in stream]

    return await asyncio.wait_for(drain(), GUARD_S)


async def tokens(stream: RequestStream) -> list[int]:
    return [cast(TokenEvent, e).token_id for e in await events(stream)]


async def test_a_request_gets_the_workers_tokens_and_ends_at_max_tokens(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    got = await events(engine.submit(request("a", [5, 6, 7], max_tokens=4)))
    assert [(e.token_id, e.finish_reason) for e in got if isinstance(e, TokenEvent)] == [
        (8, None), (9, None), (10, None), (11, "length"),
    ]  # fmt: skip
    assert all(e.logprob is None and e.top_logprobs is None for e in got if isinstance(e, TokenEvent))
    # the prompt goes once in full, then one token a step as a delta
    first, *rest = worker.steps
    assert [(n.request_id, n.token_ids, n.num_computed_tokens, n.num_scheduled_tokens) for n in first.new_requests] == [
        ("a", [5, 6, 7], 0, 3)
    ]
    assert [(c.num_computed_tokens, c.num_scheduled_tokens) for s in rest for c in s.cached_requests] == [
        (3, 1), (4, 1), (5, 1),
    ]  # fmt: skip
    assert not any(s.new_requests for s in rest)
    assert engine.scheduler is not None and not engine.scheduler.has_unfinished_requests


async def test_an_eos_token_ends_the_request_as_stop(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    got = await events(engine.submit(request("a", [1, 2], max_tokens=10, eos={5})))
    assert [(cast(TokenEvent, e).token_id, e.finish_reason) for e in got] == [(3, None), (4, None), (5, "stop")]
    # the next request's step tells the worker to drop the finished one
    assert await tokens(engine.submit(request("b", [20], max_tokens=1))) == [21]
    assert worker.steps[-1].finished_request_ids == ["a"]
    assert set(worker.held) == {"b"}


async def test_requests_share_steps_each_getting_its_own_tokens(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    a = engine.submit(request("a", [10, 11], max_tokens=3))
    b = engine.submit(request("b", [50], max_tokens=2))  # before the loop's next turn
    assert await tokens(a) == [12, 13, 14]
    assert await tokens(b) == [51, 52]
    batches = [sorted(r.request_id for r in [*s.new_requests, *s.cached_requests]) for s in worker.steps]
    assert batches == [["a", "b"], ["a", "b"], ["a"]]
    assert [n.request_id for n in worker.steps[0].new_requests] == ["a", "b"]  # in arrival order
    assert worker.steps[2].finished_request_ids == ["b"]


async def test_logprobs_reach_the_stream_as_the_worker_sent_them(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, _ = running
    (event,) = await events(engine.submit(request("a", [7], max_tokens=1, logprobs=2)))
    assert isinstance(event, TokenEvent)
    assert (event.token_id, event.logprob, event.top_logprobs) == (8, -0.25, [(8, -0.25), (9, -0.5)])


async def test_a_prefill_only_request_ends_with_no_token(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    assert await events(engine.submit(request("a", [1, 2, 3], max_tokens=0))) == [PrefillDone("length")]
    assert worker.steps[0].new_requests[0].sampling.prefill_only
    assert worker.held["a"].tokens == [1, 2, 3]  # it computed the prompt and sampled nothing


async def test_a_worker_that_dies_mid_request_fails_it_and_is_restarted(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    worker.die_on_step = {2}  # the third step (ids count from 0)
    stream = engine.submit(request("a", [5], max_tokens=10))
    got = []
    with pytest.raises(EngineError, match=r"llm worker failed: llm worker 0 exited"):
        async for event in stream:
            got.append(cast(TokenEvent, event).token_id)
    assert got == [6, 7]  # the two steps answered before the death, then the error
    assert [m.step_id for m in worker.steps] == [0, 1, 2]
    # The fake starts without suspending, so the loop restarted it before the error reached here.
    assert worker.starts == 2 and engine.ready
    assert engine.scheduler is not None and not engine.scheduler.has_unfinished_requests
    # a new process: the next request is sent in full, and served
    assert await tokens(engine.submit(request("b", [40], max_tokens=2))) == [41, 42]
    assert worker.steps[-2].new_requests[0].request_id == "b"


async def test_a_worker_error_fails_the_steps_requests_and_uncaches_their_blocks() -> None:
    engine, worker = make_engine(error_on_step={0})
    await engine.start()
    try:
        prompt = list(range(1, 10))  # two full blocks of 4, and one more token
        with pytest.raises(EngineError, match="worker error: out of memory"):
            await events(engine.submit(request("a", prompt, max_tokens=2)))
        assert worker.starts == 1 and engine.ready  # an error the worker answered is not a death
        again = request("b", prompt, max_tokens=2)
        assert await tokens(engine.submit(again)) == [10, 11]
        # the failed step's blocks were never written: the same prompt hits no cached block
        assert again.num_cached_tokens == 0
        assert worker.steps[1].new_requests[0].num_computed_tokens == 0
        third = request("c", prompt, max_tokens=1)
        assert await tokens(engine.submit(third)) == [10]
        assert third.num_cached_tokens == 8  # b's blocks, written, are cached
    finally:
        await engine.stop()


async def test_a_request_the_worker_drops_fails_alone(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    worker.gate = asyncio.Event()
    a = engine.submit(request("a", [1], max_tokens=3))
    await worker.wait_for_steps(1)
    worker.fail["b"] = "media key out/x missing"
    b = engine.submit(request("b", [9], max_tokens=3))
    worker.gate.set()
    with pytest.raises(EngineError, match="media key out/x missing"):
        await events(b)
    assert await tokens(a) == [2, 3, 4]


async def test_an_abort_during_a_step_drops_the_request_and_tells_the_worker(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    worker.gate = asyncio.Event()
    a = engine.submit(request("a", [1], max_tokens=5))
    b = engine.submit(request("b", [100], max_tokens=1))
    await worker.wait_for_steps(1)  # a's first step is out: the worker will sample for it
    engine.abort(RequestId("a"))
    worker.gate.set()
    assert await tokens(b) == [101]
    assert a.queue.empty()  # the token sampled for it in flight was dropped
    assert engine.scheduler is not None and engine.scheduler.get_request(RequestId("a")) is None
    # the ids of what ended travel with the next step sent
    assert await tokens(engine.submit(request("c", [7], max_tokens=1))) == [8]
    assert sorted(worker.steps[-1].finished_request_ids) == ["a", "b"]
    assert set(worker.held) == {"c"}


async def test_a_full_queue_refuses_at_submit_then_drains(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    worker.gate = asyncio.Event()
    streams = [engine.submit(request("r0", [1], max_tokens=1))]
    await worker.wait_for_steps(1)  # r0 runs; what follows waits
    # a worker's own bound: its share (2 x max_num_seqs) and a full batch more
    streams += [engine.submit(request(f"r{i}", [1 + i], max_tokens=1)) for i in range(1, 7)]
    assert engine.queued.num_requests == 6
    with pytest.raises(RefusedAtSubmit) as refused:
        engine.submit(request("r7", [8], max_tokens=1))
    assert refused.value.overloaded.limit is Limit.REQUESTS
    assert engine.metrics.registry.get_sample_value(
        "omni_requests_rejected_total", {"model_name": "m", "reason": "requests"}
    ) == 1.0
    worker.gate.set()
    assert [await tokens(s) for s in streams] == [[2], [3], [4], [5], [6], [7], [8]]
    assert engine.queued.num_requests == 0


async def test_under_priority_a_full_queue_sheds_its_least_urgent_for_a_more_urgent_one() -> None:
    engine, worker = make_engine(scheduling_policy="priority")
    await engine.start()
    try:
        worker.gate = asyncio.Event()
        streams = [engine.submit(request("r0", [1], max_tokens=1))]
        await worker.wait_for_steps(1)  # r0 runs; what follows waits, 6 at most
        streams += [engine.submit(request(f"r{i}", [1 + i], max_tokens=1, priority=1)) for i in range(1, 7)]
        urgent = engine.submit(request("urgent", [20], max_tokens=1, priority=0))
        with pytest.raises(RefusedAtSubmit) as refused:  # r6 came last among the least urgent
            await tokens(streams[6])
        assert refused.value.overloaded.limit is Limit.REQUESTS and "shed" in refused.value.overloaded.message
        assert engine.queued.num_requests == 6
        with pytest.raises(RefusedAtSubmit):  # none waiting is less urgent than an equal newcomer
            engine.submit(request("also", [30], max_tokens=1, priority=1))
        worker.gate.set()
        assert [await tokens(s) for s in streams[:6]] == [[2], [3], [4], [5], [6], [7]]
        assert await tokens(urgent) == [21]
    finally:
        await engine.stop()


async def test_stopping_fails_what_is_pending(running: tuple[LLMEngine, FakeLLMWorker]) -> None:
    engine, worker = running
    worker.gate = asyncio.Event()
    stream = engine.submit(request("a", [1], max_tokens=3))
    await worker.wait_for_steps(1)
    await engine.stop()
    with pytest.raises(EngineError, match="server shutting down"):
        await events(stream)
    assert not worker.is_alive and not engine.ready
    with pytest.raises(EngineError, match="not ready"):
        engine.submit(request("b", [1]))


class TwoTokenGrammar:
    """The part of TokenConstraint the engine reads: allows `script` in order, then is complete."""

    forced_token_id = None
    violated = False
    cut_short = False
    vocab_size = 64

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.seen: list[int] = []

    @property
    def active(self) -> bool:
        return len(self.seen) < len(self.script)

    @property
    def complete(self) -> bool:
        return not self.active

    def advance(self, token_id: int) -> None:
        self.seen.append(token_id)


class ScriptFiller:
    async def fill(self, constraints: Sequence[TokenConstraint]) -> list[bytes]:
        grammars = cast(list[TwoTokenGrammar], list(constraints))
        return [single_token_mask(g.script[len(g.seen)], g.vocab_size) for g in grammars]


async def test_a_grammar_gets_masks_after_its_step_and_its_completion_stops_the_request(
    running: tuple[LLMEngine, FakeLLMWorker],
) -> None:
    engine, worker = running
    engine._masks = ScriptFiller()  # type: ignore[assignment]
    grammar = TwoTokenGrammar([4, 5])  # what the fake samples after [3], as it happens
    got = await events(engine.submit(request("a", [3], max_tokens=10), constraint=cast(TokenConstraint, grammar)))
    assert [(cast(TokenEvent, e).token_id, e.finish_reason) for e in got] == [(4, None), (5, "stop")]
    assert grammar.seen == [4, 5]
    masks = [m for m in worker.sent if isinstance(m, protocol.StepMasks)]
    assert [m.step_id for m in masks] == [s.step_id for s in worker.steps[:2]]
    assert all(s.masks_follow for s in worker.steps[:2])
    assert [[t.request_id for t in m.token_masks] for m in masks] == [["a"], ["a"]]
    # an unconstrained request after it sends no masks
    assert await tokens(engine.submit(request("b", [1], max_tokens=1))) == [2]
    assert not worker.steps[-1].masks_follow
