"""VisionDecoderReplicas against two real tiny decoder workers (CPU, one rank, one thread each):
an image goes to the replica with the least work, a seed draws the same bytes on either, the
metrics count each replica, and a replica that dies loses no image that had not started on it:
its queue moves to the other while it restarts."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from omni.config import VisionDecoderConfig
from omni.engines.supervisor import EngineError
from omni.engines.vision_decoder import ImageRequest, VisionDecoderEngine
from omni.engines.vision_replicas import VisionDecoderReplicas
from omni.metrics import Metrics
from omni.shared import protocol

MODEL = "tiny"
CODES = tuple(range(64))  # the tiny decoder's 8 x 8 grid


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    return make_tiny_vision_decoder(tmp_path_factory.mktemp("vd") / "vision_decoder", codebook=codebook)


@pytest.fixture
async def replicas(decoder_dir: Path) -> AsyncIterator[VisionDecoderReplicas]:
    specs = [protocol.VisionDecoderWorkerSpec(worker_id=r, model_dir=str(decoder_dir), num_threads=1) for r in range(2)]
    group = VisionDecoderReplicas(specs, Metrics(), MODEL, VisionDecoderConfig(replicas=2, max_batch_images=2), start_timeout=120)
    await asyncio.gather(*(w.start() for w in group.workers))
    try:
        yield group
    finally:
        await asyncio.gather(*(w.stop() for w in group.workers))


def image(seed: int, steps: int = 2) -> ImageRequest:
    return ImageRequest(codes=CODES, width=768, height=768, steps=steps, seed=seed)


def sends(engine: VisionDecoderEngine) -> list[list[int]]:
    """The batches `engine` sends its worker from now on, each as its jobs' seeds."""
    sent: list[list[int]] = []
    original = engine.worker.send

    async def record(message: object) -> None:
        if isinstance(message, protocol.DecodeImages):
            sent.append([j.seed for j in message.jobs])
        await original(message)

    engine.worker.send = record  # type: ignore[method-assign]
    return sent


async def until(condition: object, what: str) -> None:
    """Until the condition holds: a wait for an event, not for a time (a broken engine hangs the
    test rather than failing it on a slow machine)."""
    while not condition():  # type: ignore[operator]
        await asyncio.sleep(0.01)


def pause(engine: VisionDecoderEngine, sig: signal.Signals = signal.SIGSTOP) -> None:
    """SIGSTOP: the batch it was sent stays in flight until SIGCONT, whatever its speed."""
    pid = engine.worker.pids[0]
    assert pid is not None
    os.kill(pid, sig)


def gate_restart(engine: VisionDecoderEngine) -> asyncio.Event:
    """The engine's next worker start waits for the returned event."""
    gate = asyncio.Event()
    start = engine.worker.start

    async def gated(**kw: float) -> object:
        await gate.wait()
        return await start(**kw)

    engine.worker.start = gated  # type: ignore[method-assign]
    return gate


async def test_an_image_goes_to_the_replica_with_the_least_work(replicas: VisionDecoderReplicas) -> None:
    r0, r1 = replicas.replicas
    sent0, sent1 = sends(r0), sends(r1)
    long = asyncio.ensure_future(replicas.draw(image(1, steps=6)))  # both idle: the first replica
    await until(lambda: sent0, "the first batch")
    pause(r0)
    short = asyncio.ensure_future(replicas.draw(image(2)))  # r0 holds 6 steps' work: r1
    await until(lambda: sent1, "the second batch")
    pause(r1)
    assert r0.outstanding_work == 3 * r1.outstanding_work > 0
    third = asyncio.ensure_future(replicas.draw(image(3)))  # 2 steps running beat 6
    await asyncio.sleep(0)
    assert (r0.queue_length, r1.queue_length) == (0, 1)
    pause(r0, signal.SIGCONT)
    pause(r1, signal.SIGCONT)
    await asyncio.gather(long, short, third)
    assert (sent0, sent1) == ([[1]], [[2], [3]])
    jobs = r0.metrics.replica_jobs
    assert [jobs.labels(MODEL, r, "ok")._value.get() for r in ("0", "1")] == [1, 2]


async def test_a_seed_draws_the_same_bytes_on_either_replica(replicas: VisionDecoderReplicas) -> None:
    r0, r1 = replicas.replicas
    a, b = await asyncio.gather(r0.draw(image(7)), r1.draw(image(7)))
    other = await r1.draw(image(8))
    assert a.data == b.data and a.data != other.data


async def test_a_dead_replicas_queue_is_drawn_by_the_other(replicas: VisionDecoderReplicas) -> None:
    r0, r1 = replicas.replicas
    sent0, sent1 = sends(r0), sends(r1)
    running = asyncio.ensure_future(r0.draw(image(1)))
    await until(lambda: sent0, "the running batch")
    pause(r0)
    queued = [asyncio.ensure_future(r0.draw(image(s))) for s in (2, 3, 4)]  # not started
    await asyncio.sleep(0)
    assert r0.queue_length == 3
    pause(r0, signal.SIGKILL)
    with pytest.raises(EngineError):
        await running  # it had started on the dead replica
    drawn = await asyncio.gather(*queued)
    assert all(d.data.startswith(b"\x89PNG") for d in drawn)
    assert (sent0, sent1) == ([[1]], [[2, 3], [4]])  # placed in their order, batched by the other
    assert replicas.ready and r1.ready  # the other replica served throughout
    await until(lambda: r0.ready, "the restart")
    again = await r0.draw(image(4))
    assert again.data == drawn[2].data  # alone in its batch either way


async def test_with_no_replica_up_the_queue_waits_for_the_restart(replicas: VisionDecoderReplicas) -> None:
    r0, r1 = replicas.replicas
    sent0 = sends(r0)
    await r1.stop()  # the only other replica is gone for good
    gate = gate_restart(r0)
    running = asyncio.ensure_future(r0.draw(image(1)))
    await until(lambda: sent0, "the running batch")
    pause(r0)
    queued = asyncio.ensure_future(r0.draw(image(2)))
    await asyncio.sleep(0)
    pause(r0, signal.SIGKILL)
    with pytest.raises(EngineError):
        await running
    assert not replicas.ready and r0.queue_length == 1
    with pytest.raises(EngineError, match="not ready"):
        await replicas.draw(image(3))
    gate.set()
    drawn = await queued  # kept, and drawn once r0 is back
    assert drawn.data.startswith(b"\x89PNG") and sent0 == [[1], [2]]


def test_no_replicas_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        VisionDecoderReplicas([], Metrics(), MODEL)
