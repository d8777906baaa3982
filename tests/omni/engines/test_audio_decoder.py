"""AudioDecoderEngine against a real audio decoder worker (the tiny vocoder, CPU), in one test
(one worker start): concurrent streams share batches and each still gives the samples of its
span decoded alone; a stream given up mid-span is closed in the worker; a worker that dies fails
the open streams only."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gpu_workers.tiny.checkpoints import make_tiny_audio_decoder
from omni.config import AudioDecoderConfig
from omni.engines.audio_decoder import AudioDecoderEngine, AudioStream, _Chunk
from omni.engines.supervisor import EngineError
from omni.metrics import Metrics
from omni.shared import protocol

CHUNKS = (4, 25, 25)


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_audio_decoder(tmp_path_factory.mktemp("ad") / "audio_decoder", seed=0, num_units=64)


@pytest.fixture
async def engine(decoder_dir: Path) -> AsyncIterator[AudioDecoderEngine]:
    spec = protocol.AudioDecoderWorkerSpec(model_dir=str(decoder_dir), num_threads=1)
    engine = AudioDecoderEngine(spec, Metrics(), "tiny", AudioDecoderConfig(max_batch_streams=4), start_timeout=120)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def speak(engine: AudioDecoderEngine, units: list[int], speaker: int = 0) -> np.ndarray:
    stream = engine.open_stream(speaker)
    parts, start = [], 0
    while start < len(units):
        size = CHUNKS[min(len(parts), len(CHUNKS) - 1)]
        chunk = units[start : start + size]
        start += size
        parts.append(np.frombuffer(await stream.decode(chunk, last=start >= len(units)), dtype="<f4"))
    return np.concatenate(parts)


async def test_streams_share_batches_keep_their_samples_close_and_survive_only_unopened_a_dead_worker(
    engine: AudioDecoderEngine,
) -> None:
    rng = np.random.default_rng(0)
    spans = [rng.integers(0, 64, n).tolist() for n in (60, 7, 33, 3, 41)]
    sizes: list[int] = []
    original = engine.worker.send

    async def record(message: object) -> None:
        if isinstance(message, protocol.DecodeAudio):
            sizes.append(len(message.chunks))
        await original(message)

    engine.worker.send = record  # type: ignore[method-assign]
    together = await asyncio.gather(*(speak(engine, s, i % 2) for i, s in enumerate(spans)))
    assert max(sizes) > 1 and max(sizes) <= 4  # streams shared batches, at most max_batch_streams
    for i, (span, samples) in enumerate(zip(spans, together, strict=True)):
        alone = await speak(engine, span, i % 2)
        assert samples.shape == (len(span) * 960,)
        np.testing.assert_array_equal(samples, alone)
    assert engine.num_open_streams == 0
    chunks = engine.metrics.audio_chunks.labels("tiny", "ok")._value.get()
    assert chunks == 2 * sum(-(-(len(s) - 4) // 25) + 1 for s in spans)  # together and alone
    assert engine.metrics.audio_seconds.labels("tiny")._value.get() == pytest.approx(2 * sum(map(len, spans)) / 25)

    # a stream given up mid-span (its client left) is closed in the worker with the next batch
    engine.worker.send = original  # type: ignore[method-assign]
    stream = engine.open_stream()
    await stream.decode([1, 2, 3, 4])
    sent: list[protocol.DecodeAudio] = []
    original = engine.worker.send

    async def record(message: object) -> None:
        if isinstance(message, protocol.DecodeAudio):
            sent.append(message)
        await original(message)

    engine.worker.send = record  # type: ignore[method-assign]
    stream.close()
    await speak(engine, [5, 6, 7])
    assert stream.stream_id in sent[0].closed and engine.num_open_streams == 0
    engine.worker.send = original  # type: ignore[method-assign]

    # a worker that dies fails the streams whose state it held, and only those
    opened = engine.open_stream()
    await opened.decode([1, 2, 3])
    fresh = engine.open_stream()  # nothing sent yet: its state is not in the worker
    pid = engine.worker.pids[0]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineError):
        await opened.decode([4, 5, 6])
    async def restarted() -> None:
        while not engine.ready:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(restarted(), 300)  # a hang guard: fails only if it never comes back
    samples = await fresh.decode([4, 5, 6], last=True)
    assert len(samples) == 3 * 960 * 4


async def test_a_batch_takes_the_most_urgent_streams_then_live_sessions_then_the_oldest() -> None:
    spec = protocol.AudioDecoderWorkerSpec(model_dir=".")
    engine = AudioDecoderEngine(spec, Metrics(), "tiny", AudioDecoderConfig(max_batch_streams=3))
    orders = [(0, False), (0, True), (5, True), (-1, False), (0, True)]  # (priority, live), oldest first
    loop = asyncio.get_running_loop()
    for stream_id, (priority, live) in enumerate(orders, 1):
        stream = AudioStream(engine, stream_id, 0, None, priority=priority, live=live)
        stream.queue.append(_Chunk(protocol.AudioChunk(stream_id, [1], first=True), loop.create_future()))
        engine._streams[stream_id] = stream
    assert [s.stream_id for s, _ in engine._next_batch()] == [4, 2, 5]
    assert [s.stream_id for s, _ in engine._next_batch()] == [1, 3]  # one chunk each: the rest
