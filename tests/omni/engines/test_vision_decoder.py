"""VisionDecoderEngine against a real vision decoder worker (the tiny decoder, CPU, one rank):
images of one shape share a batch, the oldest waiting image goes next, the queue is bounded,
an image whose caller left is never drawn, and a refused image fails alone."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from omni.config import VisionDecoderConfig
from omni.engines.admission import Overloaded
from omni.engines.vision_decoder import ImageDrawError, ImageRequest, VisionDecoderEngine
from omni.metrics import Metrics
from omni.shared import protocol

MODEL = "tiny"
CODES = tuple(range(64))  # the tiny decoder's 8 x 8 grid


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    return make_tiny_vision_decoder(tmp_path_factory.mktemp("vd") / "vision_decoder", codebook=codebook)


@pytest.fixture
async def engine(decoder_dir: Path) -> AsyncIterator[VisionDecoderEngine]:
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(decoder_dir), num_threads=1)
    engine = VisionDecoderEngine(
        spec, Metrics(), MODEL, VisionDecoderConfig(max_batch_images=3, max_queued_images=6), start_timeout=120
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def image(seed: int, width: int = 768, height: int = 768, steps: int = 2, **kw: object) -> ImageRequest:
    return ImageRequest(codes=CODES, width=width, height=height, steps=steps, seed=seed, **kw)  # type: ignore[arg-type]


def sends(engine: VisionDecoderEngine) -> list[list[tuple[int, int]]]:
    """The batches the engine sends its worker from now on, each as its images' (width, height)."""
    sent: list[list[tuple[int, int]]] = []
    original = engine.worker.send

    async def record(message: object) -> None:
        if isinstance(message, protocol.DecodeImages):
            sent.append([(j.width, j.height) for j in message.jobs])
        await original(message)

    engine.worker.send = record  # type: ignore[method-assign]
    return sent


async def until_sent(sent: list[list[tuple[int, int]]]) -> None:
    """Until a batch has gone to the worker; a hang guard, not a timing: fails only if none goes."""

    async def poll() -> None:
        while not sent:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), 120)


def batches(engine: VisionDecoderEngine) -> list[float]:
    """The batch sizes the engine observed, in order of completion (from its histogram)."""
    hist = engine.metrics.decoder_batch_size.labels(MODEL)
    return [s.value for s in hist.collect()[0].samples if s.name.endswith("_sum")]


async def test_ready_message_describes_the_decoder(engine: VisionDecoderEngine) -> None:
    info = engine.info
    assert info is not None
    assert (info.grid_rows, info.grid_cols, info.num_codes, info.guidance) == (8, 8, 64, "autoguidance")
    assert "768x768" in info.sizes and "1024x576" in info.sizes


async def test_images_of_one_shape_share_batches_and_the_oldest_goes_first(engine: VisionDecoderEngine) -> None:
    sent = sends(engine)
    first = asyncio.ensure_future(engine.draw(image(0, steps=8)))  # in flight while the rest queue
    await until_sent(sent)
    rest = [image(1, 1024, 576), image(2), image(3), image(4, 1024, 576), image(5), image(6)]
    results = await asyncio.gather(first, *(engine.draw(r) for r in rest))
    # after the first: the oldest waiting (1024x576) and its like, then the 768s, 3 at most
    assert sent == [[(768, 768)], [(1024, 576)] * 2, [(768, 768)] * 3, [(768, 768)]]
    assert [(r.width, r.height) for r in results] == [(768, 768), (1024, 576), (768, 768), (768, 768), (1024, 576), (768, 768), (768, 768)]
    assert all(r.data.startswith(b"\x89PNG") for r in results)
    alone = await engine.draw(image(5))
    # drawn alone, the same image up to float rounding: a pixel may land one step apart
    a, b = (np.asarray(Image.open(io.BytesIO(r.data)), dtype=np.int16) for r in (alone, results[5]))
    assert np.abs(a - b).max() <= 1 and (a != b).mean() < 1e-3


async def test_the_most_urgent_image_goes_first_with_the_others_of_its_shape(engine: VisionDecoderEngine) -> None:
    sent = sends(engine)
    first = asyncio.ensure_future(engine.draw(image(0, steps=8)))  # in flight while the rest queue
    await until_sent(sent)
    rest = [image(1, 1024, 576), image(2), image(3, priority=-1), image(4, 1024, 576), image(5, priority=-1)]
    await asyncio.gather(first, *(engine.draw(r) for r in rest))
    # the urgent 768s lead their shape's batch (the 768 at 0 fills it); the older 1024x576s wait
    assert sent == [[(768, 768)], [(768, 768)] * 3, [(1024, 576)] * 2]


async def test_the_queue_is_bounded(engine: VisionDecoderEngine) -> None:
    sent = sends(engine)
    first = asyncio.ensure_future(engine.draw(image(0, steps=8)))
    await until_sent(sent)  # first is in flight, out of the queue
    waiting = [asyncio.ensure_future(engine.draw(image(i))) for i in range(1, 7)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as info:
        await engine.draw(image(9))
    assert info.value.retry_after_s > 0 and "queue is full" in str(info.value)
    await asyncio.gather(first, *waiting)


async def test_an_image_whose_caller_left_is_not_drawn(engine: VisionDecoderEngine) -> None:
    sent = sends(engine)
    first = asyncio.ensure_future(engine.draw(image(0, steps=8)))
    await until_sent(sent)  # first is in flight: what follows queues behind it
    gone = asyncio.ensure_future(engine.draw(image(1, 1024, 576)))
    await asyncio.sleep(0)
    gone.cancel()
    kept = await engine.draw(image(2))
    await first
    ok = engine.metrics.decoder_jobs.labels(MODEL, "ok")._value.get()
    assert ok == 2 and kept.width == 768  # the 1024x576 never reached the worker


async def test_a_refused_image_fails_alone(engine: VisionDecoderEngine) -> None:
    bad = ImageRequest(codes=CODES[:10], width=768, height=768, steps=2, seed=0)
    results = await asyncio.gather(engine.draw(bad), engine.draw(image(1)), return_exceptions=True)
    assert isinstance(results[0], ImageDrawError)
    assert isinstance(results[1], protocol.DecodedImage) and results[1].error is None


async def test_previews_reach_their_image(engine: VisionDecoderEngine) -> None:
    got: list[tuple[int, bytes]] = []
    final = await engine.draw(image(3, steps=6, partial_images=2), lambda i, data: got.append((i, data)))
    assert [i for i, _ in got] == [0, 1]
    assert all(data.startswith(b"\x89PNG") and data != final.data for _, data in got)


async def test_a_batch_is_bounded_by_its_dit_tokens_too(decoder_dir: Path) -> None:
    """Review A7: 768x768 is 48 x 48 = 2304 DiT tokens; with 5000 a batch, two such images go
    together (of 3 allowed), and a 2048x2048 image (16384 tokens) goes alone. No worker runs."""
    from omni.engines.vision_decoder import _Pending, dit_tokens

    assert (dit_tokens(768, 768), dit_tokens(1024, 576), dit_tokens(770, 768)) == (2304, 2304, 49 * 48)
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(decoder_dir))
    engine = VisionDecoderEngine(spec, Metrics(), MODEL, VisionDecoderConfig(max_batch_images=3, max_batch_tokens=5000))
    loop = asyncio.get_running_loop()

    def job(i: int, side: int) -> _Pending:
        request = protocol.ImageJob(i, list(CODES), side, side, 2, i)
        return _Pending(request, loop.create_future())

    engine._queue = [job(0, 768), job(1, 2048), job(2, 768), job(3, 768), job(4, 2048)]
    sizes = []
    while batch := engine._next_batch():
        sizes.append([p.job.width for p in batch])
    assert sizes == [[768, 768], [2048], [768], [2048]]


async def test_the_servers_step_cache_applies_unless_an_image_asks_otherwise(decoder_dir: Path) -> None:
    """--image-step-cache is every image's threshold unless its request gives one (0: off); the
    blocks each image skipped reach its result and the metrics."""
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(decoder_dir), num_threads=1)
    config = VisionDecoderConfig(image_step_cache=1000.0)
    engine = VisionDecoderEngine(spec, Metrics(), MODEL, config, start_timeout=120)
    await engine.start()
    try:
        # 5 steps: 2 and 3 may skip (the first 2 and the last run); the tiny DiT has 2 blocks and
        # its weak twin 1, so each skipped step saves the main DiT's second block
        default = await engine.draw(image(1, 128, 128, steps=5))
        off = await engine.draw(image(1, 128, 128, steps=5, step_cache=0.0))
    finally:
        await engine.stop()
    assert (default.blocks_computed, default.blocks_skipped) == (5 * 3 - 2, 2)
    assert (off.blocks_computed, off.blocks_skipped) == (5 * 3, 0)
    assert default.data != off.data
    blocks = engine.metrics.decoder_blocks
    assert blocks.labels(MODEL, "skipped")._value.get() == 2
    assert blocks.labels(MODEL, "computed")._value.get() == 2 * 5 * 3 - 2
