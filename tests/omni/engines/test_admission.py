"""Admission: the arithmetic of the queue limits, ModelPool's reservations and refusals, the
deadline that aborts a request, the encoder's bound, and the errors clients see.

The engines here are ready without a worker process: on_ready gets the message a worker would
send, and no step loop runs, so what is submitted stays queued exactly as the test left it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.cli.options import build_parser, server_config
from omni.config import AdmissionConfig, EncoderConfig, LLMConfig, ModelConfig
from omni.engines.admission import Limit, Overloaded, QueueLimits, QueueLoad, retry_after_s
from omni.engines.encoder import EncoderEngine
from omni.engines.llm import DeadlineExceeded, EngineError, LLMEngine, RefusedAtSubmit
from omni.engines.pool import ModelPool
from omni.errors import service_unavailable
from omni.http.errors import error_middleware, error_response
from omni.metrics import Metrics
from omni.serving.errors import engine_error, too_many_requests
from omni.shared import protocol
from scheduler.request import Request, RequestId, SamplingParams

MODEL = "m"
BLOCK_SIZE = 4
NUM_KV_BLOCKS = 16  # 64 tokens: a worker's default token limit is 128


# ----------------------------------------------------------------------------- arithmetic


def test_an_empty_queue_admits_anything() -> None:
    limits = QueueLimits(max_requests=1, max_tokens=10)
    assert limits.refusal(QueueLoad(0, 0), QueueLoad(16, 1000)) is None


def test_each_bound_refuses_what_would_pass_it() -> None:
    limits = QueueLimits(max_requests=3, max_tokens=100)
    assert limits.refusal(QueueLoad(2, 90), QueueLoad(1, 10)) is None  # exactly at both
    assert limits.refusal(QueueLoad(2, 10), QueueLoad(2, 10)) is Limit.REQUESTS
    assert limits.refusal(QueueLoad(1, 90), QueueLoad(1, 11)) is Limit.TOKENS


def test_default_limits_come_from_the_batch_and_the_kv_cache() -> None:
    share = QueueLimits.for_worker(max_num_seqs=8, num_kv_tokens=1024, max_model_len=128)
    assert share == QueueLimits(16, 2048)
    # a small cache still lets a batch of full-length prompts wait
    assert QueueLimits.for_worker(max_num_seqs=8, num_kv_tokens=160, max_model_len=160).max_tokens == 8 * 160
    assert QueueLimits.for_model(AdmissionConfig(), [share, share]) == QueueLimits(32, 4096)
    flagged = AdmissionConfig(max_queued_tokens=500)
    assert QueueLimits.for_model(flagged, [share, share]) == QueueLimits(32, 500)


def test_retry_after_is_the_time_to_drain_the_queue_clamped() -> None:
    assert retry_after_s(1000, 0.0) == 1  # no rate measured yet
    assert retry_after_s(1000, 300.0) == 4  # 3.33 s, rounded up
    assert retry_after_s(10, 1e6) == 1
    assert retry_after_s(10**9, 1.0) == 60


def test_a_refusal_is_openais_rate_limit_error() -> None:
    error = too_many_requests(Overloaded(MODEL, Limit.TOKENS, "The model's queue is full.", 7))
    assert error.status == 429
    assert error.headers == {"Retry-After": "7"}
    body = orjson.loads(error_response(error).body)  # type: ignore[arg-type]
    assert body == {
        "error": {
            "message": "The model's queue is full.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


def test_a_passed_deadline_is_a_504_a_late_refusal_a_429_and_a_failed_worker_a_503() -> None:
    assert engine_error(DeadlineExceeded("late")).status == 504
    assert engine_error(DeadlineExceeded("late")).code == "deadline_exceeded"
    refused = engine_error(RefusedAtSubmit(Overloaded(MODEL, Limit.REQUESTS, "full", 3)))
    assert (refused.status, refused.headers) == (429, {"Retry-After": "3"})
    assert engine_error(EngineError("llm worker failed")).status == 503


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (Overloaded(MODEL, Limit.REQUESTS, "full", 2), 429),
        (DeadlineExceeded("late"), 504),
        (RefusedAtSubmit(Overloaded(MODEL, Limit.TOKENS, "full", 2)), 429),
    ],
)
async def test_the_middleware_answers_each_as_its_status(raised: Exception, status: int) -> None:
    async def direct(request: web.Request) -> web.StreamResponse:
        raise raised

    async def through_assembly(request: web.Request) -> web.StreamResponse:
        # what assembly (omni/http/sse.py collect) makes of an engine error: a 503 raised from it
        try:
            raise raised
        except EngineError as exc:
            raise service_unavailable(str(exc)) from exc

    request = make_mocked_request("POST", "/v1/chat/completions")
    assert (await error_middleware(request, direct)).status == status
    if isinstance(raised, EngineError):
        assert (await error_middleware(request, through_assembly)).status == status


# ----------------------------------------------------------------------------- the pool


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every engine counts as ready: its worker is never spawned."""
    monkeypatch.setattr(LLMEngine, "ready", property(lambda self: self.scheduler is not None))
    monkeypatch.setattr(EncoderEngine, "ready", property(lambda self: True))
    yield


def make_pool(num_workers: int = 1, policy: str = "fcfs", **admission: object) -> ModelPool:
    engine_config = ModelConfig(
        name=MODEL,
        model_dir=Path("."),
        # max_num_seqs: a worker's default request limit is 4
        llm=LLMConfig(block_size=BLOCK_SIZE, max_num_seqs=2, num_workers=num_workers, scheduling_policy=policy),
        admission=AdmissionConfig(**admission),  # type: ignore[arg-type]
    )
    pool = ModelPool(engine_config, Metrics())
    for engine in pool.engines:
        engine.on_ready(protocol.LLMReady(engine.worker_id, "cpu", NUM_KV_BLOCKS, BLOCK_SIZE, 64))
    return pool


def make_request(request_id: str, num_prompt_tokens: int = 8, priority: int = 0) -> Request:
    return Request(RequestId(request_id), [1] * num_prompt_tokens, SamplingParams(max_tokens=4, priority=priority))


def rejected(pool: ModelPool, reason: str) -> float:
    value = pool.metrics.registry.get_sample_value(
        "omni_requests_rejected_total", {"model_name": MODEL, "reason": reason}
    )
    return value or 0.0


async def test_the_queue_admits_up_to_its_limits_then_refuses(live: None) -> None:
    pool = make_pool()
    assert pool.queue_limits == QueueLimits(4, 128)
    for i in range(4):
        pool.submit(make_request(f"r{i}"))
    assert pool.queued == QueueLoad(4, 32)
    with pytest.raises(RefusedAtSubmit) as refused:  # submitted without admit()
        pool.submit(make_request("r4"))
    assert refused.value.overloaded.limit is Limit.REQUESTS
    assert refused.value.overloaded.retry_after_s == 1  # nothing computed yet: no rate known
    with pytest.raises(Overloaded):
        pool.check_admission()
    assert rejected(pool, "requests") == 2
    assert pool.queued == QueueLoad(4, 32)  # a refusal leaves nothing behind


async def test_under_priority_a_full_queue_sheds_less_urgent_waiting_requests_for_an_urgent_one(live: None) -> None:
    pool = make_pool(num_workers=2, policy="priority")  # 8 requests across the two workers
    streams = {f"r{i}": pool.submit(make_request(f"r{i}", priority=p)) for i, p in enumerate([0, 5, 0, 3, 0, 0, 0, 0])}
    pool.check_admission(priority=-1)  # room can be made: no refusal, and nothing shed yet
    assert pool.queued == QueueLoad(8, 64)
    with pytest.raises(Overloaded):  # none is less urgent than the least urgent waiting one
        pool.check_admission(priority=5)
    urgent = [make_request("u0", priority=-1), make_request("u1", priority=-1)]
    with pool.admit(urgent):
        assert pool.queued == QueueLoad(8, 64)  # two shed, the two urgent ones in their place
        for r in urgent:
            pool.submit(r)
    for name, victim in (("r1", 5), ("r3", 3)):  # the least urgent first, each with the 429 it would have got
        with pytest.raises(RefusedAtSubmit) as shed:
            await asyncio.wait_for(anext(aiter(streams[name])), 5)
        assert f"(priority {victim}) was shed for a more urgent one (priority -1)" in str(shed.value)
        assert shed.value.overloaded.limit is Limit.REQUESTS
    with pytest.raises(Overloaded):  # nothing less urgent than 0 is left to shed
        pool.admit([make_request("late", priority=0)])
    with pytest.raises(Overloaded):  # shedding all six at 0 would still leave no room for nine
        pool.admit([make_request(f"many{i}", priority=-1) for i in range(9)])
    assert pool.queued == QueueLoad(8, 64)  # a refusal sheds nothing


async def test_under_fcfs_a_full_queue_sheds_nothing(live: None) -> None:
    pool = make_pool()
    for i in range(4):
        pool.submit(make_request(f"r{i}", priority=5))  # (the server refuses these under fcfs)
    with pytest.raises(Overloaded):
        pool.check_admission(priority=-1)
    with pytest.raises(RefusedAtSubmit):
        pool.submit(make_request("urgent", priority=-1))
    assert pool.queued == QueueLoad(4, 32)


async def test_an_admission_holds_its_place_until_submitted_or_released(live: None) -> None:
    pool = make_pool(max_queued_tokens=40)
    first = [make_request("a-0", 16), make_request("a-1", 16)]
    with pool.admit(first):
        assert pool.queued == QueueLoad(2, 32)
        with pytest.raises(Overloaded) as refused:  # 32 + 16 tokens would pass 40
            pool.admit([make_request("b-0", 16)])
        assert refused.value.limit is Limit.TOKENS
        pool.submit(first[0])  # from the reservation to the scheduler's queue: no new check
        assert pool.queued == QueueLoad(2, 32)
    # first[1] was never submitted: its place is given back with the block's end
    assert pool.queued == QueueLoad(1, 16)
    with pool.admit([make_request("c-0", 16)]):
        assert pool.queued == QueueLoad(2, 32)


async def test_the_limits_are_the_models_across_its_workers(live: None) -> None:
    pool = make_pool(num_workers=2)
    assert pool.queue_limits == QueueLimits(8, 256)
    streams = [pool.submit(make_request(f"r{i}", 4 + i)) for i in range(8)]
    assert sum(e.queued.num_requests for e in pool.engines) == 8
    with pytest.raises(RefusedAtSubmit):
        pool.submit(make_request("r8"))
    pool.abort(streams[0])  # frees a place on whichever worker held it
    pool.submit(make_request("r8"))


async def test_a_request_past_its_deadline_is_aborted_and_its_stream_told(live: None) -> None:
    pool = make_pool(request_timeout=30.0)
    engine = pool.engines[0]
    assert engine.scheduler is not None
    request = make_request("late")
    with pool.admit([request], timeout=0.05):  # asks for less than the server's 30 s
        stream = pool.submit(request)
        output = engine.scheduler.schedule()  # it runs: it holds KV blocks now
        assert output.scheduled_new and engine.scheduler.kv_usage > 0
        with pytest.raises(DeadlineExceeded, match="0.05 s deadline"):
            await asyncio.wait_for(anext(aiter(stream)), 5)
    assert engine.scheduler.get_request(request.request_id) is None
    assert engine.scheduler.kv_usage == 0.0  # freed at the deadline, before any next step
    worker = {"model_name": MODEL, "engine": "0"}
    sample = pool.metrics.registry.get_sample_value
    assert sample("omni_request_deadlines_exceeded_total", worker) == 1.0
    assert sample("vllm:request_success_total", {**worker, "finished_reason": "abort"}) == 1.0  # vLLM's name for it


async def test_a_request_that_ends_in_time_cancels_its_deadline(live: None) -> None:
    pool = make_pool(request_timeout=0.05)
    request = make_request("quick")
    stream = pool.submit(request)
    timer = stream.deadline_timer
    assert timer is not None
    pool.abort(stream)
    assert timer.cancelled()


async def test_a_request_may_not_ask_for_more_than_the_servers_deadline(live: None) -> None:
    pool = make_pool(request_timeout=0.05)
    request = make_request("greedy")
    with pool.admit([request], timeout=3600.0):
        stream = pool.submit(request)
        with pytest.raises(DeadlineExceeded, match="0.05 s deadline"):
            await asyncio.wait_for(anext(aiter(stream)), 5)


# ----------------------------------------------------------------------------- the encoder


async def test_the_encoder_refuses_items_beyond_its_queue(live: None) -> None:
    spec = protocol.EncoderWorkerSpec(model_dir=".")
    encoder = EncoderEngine(spec, Metrics(), MODEL, EncoderConfig(max_queued_items=2, max_queued_bytes=10))

    def encode(key: str, size: int) -> asyncio.Task[protocol.EncodedItem]:
        return asyncio.ensure_future(encoder.encode("vision_encoder", "image", key, b"x" * size, None, "p"))

    waiting = [encode("a", 20)]  # over the byte bound alone: the queue was empty
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        await encoder.encode("vision_encoder", "image", "b", b"x", None, "p")
    assert refused.value.limit is Limit.MEDIA_BYTES
    waiting.append(encode("a", 20))  # the same key joins the queued encode: free
    await asyncio.sleep(0)
    assert len(encoder._queue) == 1
    encoder.fail_pending(EngineError("stopping"))
    for task in waiting:
        with pytest.raises(EngineError):
            await task
    waiting = [encode("c", 1), encode("d", 1)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        await encoder.encode("vision_encoder", "image", "e", b"x", None, "p")
    assert refused.value.limit is Limit.MEDIA_ITEMS
    assert encoder.metrics.registry.get_sample_value(
        "omni_requests_rejected_total", {"model_name": MODEL, "reason": "media_items"}
    ) == 1.0
    encoder.fail_pending(EngineError("stopping"))
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_the_encoder_takes_the_most_urgent_items_first(live: None) -> None:
    spec = protocol.EncoderWorkerSpec(model_dir=".")
    encoder = EncoderEngine(spec, Metrics(), MODEL)

    def encode(key: str, priority: int) -> asyncio.Task[protocol.EncodedItem]:
        return asyncio.ensure_future(encoder.encode("audio_encoder", "audio", key, b"x", None, "p", priority=priority))

    waiting = [encode("batch", 0), encode("later", 0), encode("voice", -1), encode("lazy", 4)]
    await asyncio.sleep(0)
    assert [p.item.key for p in encoder._queue] == ["voice", "batch", "later", "lazy"]
    waiting.append(encode("lazy", -2))  # a more urgent asker of a queued key moves it up
    await asyncio.sleep(0)
    assert [p.item.key for p in encoder._queue] == ["lazy", "voice", "batch", "later"]
    encoder.fail_pending(EngineError("stopping"))
    await asyncio.gather(*waiting, return_exceptions=True)


# ----------------------------------------------------------------------------- the flags


def test_the_flags_reach_each_models_config(tmp_path: Path) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / "text", "llama")
    flags = ["--model", str(model_dir), "--max-queued-requests", "7", "--max-queued-tokens", "900"]
    flags += ["--request-timeout", "2.5", "--max-queued-media-items", "40", "--max-queued-media-bytes", "64MiB"]
    (config,) = server_config(build_parser().parse_args(flags)).models
    admission = config.admission
    assert (admission.max_queued_requests, admission.max_queued_tokens, admission.request_timeout) == (7, 900, 2.5)
    assert (config.encoder.max_queued_items, config.encoder.max_queued_bytes) == (40, 64 * 2**20)
    defaults = server_config(build_parser().parse_args(["--model", str(model_dir)])).models[0].admission
    assert (defaults.max_queued_requests, defaults.max_queued_tokens, defaults.request_timeout) == (None, None, None)
    # the encoder admits a request's items one by one: its queue must hold one request's
    with pytest.raises(SystemExit, match="at least 32"):
        server_config(build_parser().parse_args(["--model", str(model_dir), "--max-queued-media-items", "4"]))
