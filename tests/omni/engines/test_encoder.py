"""EncoderEngine against a real encoder worker process on the tiny omni checkpoint (CPU):
continuous batching, dedup by key, and recovery from a worker that dies mid-batch."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpu_workers.tiny.checkpoints import make_tiny_component_checkpoint
from omni.engines.encoder import EncoderEngine
from omni.engines.llm import EngineError
from omni.metrics import Metrics
from omni.shared.protocol import EncodedItem, EncoderWorkerSpec, StoreSettings
from omni.shared.store.codec import EMBEDDINGS, artifact_rows
from omni.shared.store.keys import encoder_key
from omni.shared.store.local import LocalStore
from tests.omni.shared.media.conftest import png_bytes

MODEL = "tiny-omni"
# (width, height) -> embedding rows. The tiny vision encoder's pixel budget is
# [56*56, 112*112] and its patch 14 x merge 2 = 28 pixels per row each way, so these sizes
# are used as they are: rows = (width / 28) * (height / 28).
IMAGES = {(56, 56): 4, (112, 112): 16, (84, 56): 6, (112, 56): 8}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_component_checkpoint(tmp_path_factory.mktemp("omni"))


@pytest.fixture
async def engine(checkpoint: Path, tmp_path: Path) -> AsyncIterator[EncoderEngine]:
    spec = EncoderWorkerSpec(
        model_dir=str(checkpoint), store=StoreSettings(f"local:{tmp_path / 'store'}"), num_threads=1
    )
    engine = EncoderEngine(spec, Metrics(), MODEL, start_timeout=120.0)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def image_key(data: bytes) -> str:
    return encoder_key("vision_encoder", "test", data, {"kind": "image"})


async def encode_image(engine: EncoderEngine, data: bytes, param: str = "messages[0].content[0]") -> EncodedItem:
    return await engine.encode("vision_encoder", "image", image_key(data), data, None, param)


def batch_sizes(engine: EncoderEngine, component: str) -> tuple[float | None, float | None]:
    """(forwards, items) the metrics saw for component."""
    labels = {"model_name": MODEL, "component": component}
    get = engine.metrics.registry.get_sample_value
    return get("omni_encoder_batch_size_count", labels), get("omni_encoder_batch_size_sum", labels)


async def until(condition: Callable[[], bool], timeout: float) -> None:
    """Poll condition; the timeout only bounds a hang, it is not what the test checks."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_concurrent_items_are_encoded_in_one_forward(engine: EncoderEngine, tmp_path: Path) -> None:
    images = [png_bytes(w, h) for w, h in IMAGES]
    # gather starts all four before the engine's loop task runs again: one queue, one batch
    results = await asyncio.wait_for(
        asyncio.gather(*(encode_image(engine, d, f"messages[0].content[{i}]") for i, d in enumerate(images))), 120
    )
    assert [(r.num_rows, r.codes, r.error, r.store_error) for r in results] == [
        (rows, None, None, None) for rows in IMAGES.values()
    ]
    assert batch_sizes(engine, "vision_encoder") == (1.0, 4.0)
    store = LocalStore(tmp_path / "store", "http://x", b"secret")
    for data, rows in zip(images, IMAGES.values()):
        assert artifact_rows(await store.get(image_key(data))) == (EMBEDDINGS, rows)


async def test_two_submissions_of_one_key_share_one_encode(engine: EncoderEngine) -> None:
    data = png_bytes(56, 56)
    first, second = await asyncio.wait_for(asyncio.gather(encode_image(engine, data), encode_image(engine, data)), 120)
    assert first == second
    assert batch_sizes(engine, "vision_encoder") == (1.0, 1.0)


async def test_a_killed_worker_fails_its_batch_and_is_restarted(engine: EncoderEngine) -> None:
    process = engine.worker._processes[0]
    assert process is not None and process.pid is not None
    pid = process.pid
    # Stopped, the worker cannot answer: the batch is certainly in flight when it dies.
    os.kill(pid, signal.SIGSTOP)
    try:
        in_flight = asyncio.ensure_future(encode_image(engine, png_bytes(56, 56)))
        await until(lambda: engine._batch_id == 1 and not engine._queue, timeout=120)
    finally:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineError, match="encoder worker failed"):
        await asyncio.wait_for(in_flight, 120)

    await until(lambda: engine.ready, timeout=120)
    new_process = engine.worker._processes[0]
    assert new_process is not None and new_process.pid != pid
    result = await asyncio.wait_for(encode_image(engine, png_bytes(112, 56)), 120)
    assert (result.num_rows, result.error) == (8, None)


async def test_stop_fails_the_batch_in_flight(engine: EncoderEngine) -> None:
    process = engine.worker._processes[0]
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGSTOP)  # the batch stays unanswered until stop()
    in_flight = asyncio.ensure_future(encode_image(engine, png_bytes(56, 56)))
    await until(lambda: engine._batch_id == 1 and not engine._queue, timeout=120)
    stopping = asyncio.ensure_future(engine.stop())
    with pytest.raises(EngineError, match="shutting down"):
        await asyncio.wait_for(in_flight, 120)  # failed before the worker is even asked to exit
    os.kill(process.pid, signal.SIGCONT)  # now it reads Shutdown and exits
    await asyncio.wait_for(stopping, 120)


async def test_store_writes_are_timed_and_failures_counted(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "blocker").write_bytes(b"")  # a file where the store's directory should be
    spec = EncoderWorkerSpec(
        model_dir=str(checkpoint), store=StoreSettings(f"local:{tmp_path / 'blocker' / 'store'}"), num_threads=1
    )
    metrics = Metrics()
    engine = EncoderEngine(spec, metrics, MODEL, start_timeout=120.0)
    await engine.start()
    try:
        result = await asyncio.wait_for(encode_image(engine, png_bytes(56, 56)), 120)
    finally:
        await engine.stop()
    assert result.num_rows == 4 and result.store_error is not None
    registry = metrics.registry
    assert registry.get_sample_value("omni_store_errors_total", {"operation": "put"}) == 1.0
    assert registry.get_sample_value("omni_store_operation_seconds_count", {"operation": "put"}) == 1.0
