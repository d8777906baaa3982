"""The vision decoder's worker kind through the real worker processes: a group of 2 gloo
ranks started by WorkerProcess answers ready, streams a batch's previews before its result,
draws what one process draws, keeps serving after a batch it refuses, and outlives idle
spells longer than its collective timeout (review A1)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.distributed import TIMEOUT_ENV, GroupMember
from gpu_workers.runner import runner_class
from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from gpu_workers.vision_decoder.decoder import VisionDecoder
from gpu_workers.vision_decoder.runner import SIZES, VisionDecoderRunner
from omni.engines.worker_process import WorkerProcess
from omni.shared import protocol
from omni.shared.media.image_sizes import ALLOWED_SIZES

CODES = [(3 * i + 2) % 64 for i in range(64)]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_the_spec_type_names_the_runner() -> None:
    assert runner_class(protocol.VisionDecoderWorkerSpec) is VisionDecoderRunner
    assert SIZES == list(ALLOWED_SIZES[1:])  # the table's sizes, without "auto"


async def _until_result(worker: WorkerProcess) -> list[Any]:
    replies: list[Any] = []
    while not replies or isinstance(replies[-1], protocol.PartialImage):
        replies.append(await asyncio.wait_for(worker.recv(), 120))
    return replies


async def test_a_two_rank_worker_streams_previews_then_the_images(tmp_path: Path) -> None:
    checkpoint = make_tiny_vision_decoder(tmp_path / "vision_decoder", seed=2, codebook=torch.randn(64, 16))
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(checkpoint), world_size=2, num_threads=1)
    jobs = [
        protocol.ImageJob(1, CODES, 144, 80, 4, seed=3, partial_images=2),
        protocol.ImageJob(2, CODES[:5], 144, 80, 4, seed=4),
    ]
    worker = WorkerProcess(spec)
    ready = await worker.start(timeout=120)
    try:
        assert ready == protocol.VisionDecoderReady(0, "cpu", 2, 8, 8, 64, "autoguidance", 0.75, SIZES)
        await worker.send(protocol.DecodeImages(7, jobs))
        replies = await _until_result(worker)
        # a batch of mixed shapes is refused on rank 0 before the other rank hears of it ...
        await worker.send(protocol.DecodeImages(8, [jobs[0], protocol.ImageJob(3, CODES, 160, 80, 4, seed=0)]))
        refused = await asyncio.wait_for(worker.recv(), 120)
        assert isinstance(refused, protocol.WorkerError) and refused.job_id == 8
        # ... so the group still serves the next one
        await worker.send(protocol.DecodeImages(9, jobs[:1]))
        again = await _until_result(worker)
    finally:
        await worker.stop()
    previews, result = replies[:-1], replies[-1]
    assert [(p.batch_id, p.job_id, p.index) for p in previews] == [(7, 1, 0), (7, 1, 1)]
    assert isinstance(result, protocol.DecodeResult) and result.batch_id == 7
    assert result.step_seconds > 0 and result.vae_seconds > 0
    drawn, bad = result.images
    assert bad.error == "an image needs 8x8 = 64 codes, got 5" and bad.data == b""
    assert (drawn.job_id, drawn.width, drawn.height, drawn.error) == (1, 144, 80, None)
    # the two ranks' image is one process's, byte for byte (see test_vision_decoder's Ulysses tests)
    alone = VisionDecoder.from_dir(checkpoint).decode(jobs[:1]).images[0]
    assert drawn.data == alone.data
    assert isinstance(again[-1], protocol.DecodeResult) and again[-1].images[0].data == drawn.data


def _state(pid: int | None) -> str:
    """The process's main thread's scheduler state: R running, S sleeping in a wait, ..."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


async def test_an_idle_group_outlives_its_collective_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review A1: the follower used to wait for its next batch inside a broadcast of the
    collective group, whose timeout (300 s; 5 s here) ended the idle rank and with it the
    group. Now it waits on the hand-off group: three timeouts' worth of idleness later the
    same processes draw the image, and the follower spends the wait blocked in the kernel (its
    main thread sleeping, S), not spinning (R): a state, not a CPU share of a busy host."""
    timeout_s = 5.0
    monkeypatch.setenv(TIMEOUT_ENV, str(timeout_s))  # the ranks inherit it (spawn)
    checkpoint = make_tiny_vision_decoder(tmp_path / "vision_decoder", seed=2, codebook=torch.randn(64, 16))
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(checkpoint), world_size=2, num_threads=1)
    worker = WorkerProcess(spec)
    await worker.start(timeout=120)
    try:
        pids = worker.pids
        await asyncio.sleep(3 * timeout_s + 1)  # the idle spell itself: what is tested, not a sync
        assert worker.is_alive and worker.pids == pids  # no rank left the group
        assert _state(pids[1]) == "S", "the idle follower is not blocked in a wait"
        await worker.send(protocol.DecodeImages(1, [protocol.ImageJob(1, CODES, 144, 80, 2, seed=3)]))
        replies = await _until_result(worker)
    finally:
        await worker.stop()
    result = replies[-1]
    assert isinstance(result, protocol.DecodeResult) and result.images[0].error is None


def test_one_rank_runs_in_process_without_a_group(tmp_path: Path) -> None:
    checkpoint = make_tiny_vision_decoder(tmp_path / "vision_decoder", seed=2, codebook=torch.randn(64, 16))
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(checkpoint))
    runner = VisionDecoderRunner.from_spec(spec, GroupMember())
    job = protocol.ImageJob(5, CODES, 128, 128, 3, seed=1, partial_images=1)
    replies = list(runner.run(protocol.DecodeImages(1, [job])))
    assert [type(r) for r in replies] == [protocol.PartialImage, protocol.DecodeResult]
    assert runner.ready_message(spec).world_size == 1


def test_the_profile_run_draws_the_engines_largest_batch(tmp_path: Path) -> None:
    """Review A7: on a GPU the worker draws its largest batch once before it says ready, so
    the allocator holds that peak for it. Here on the CPU: the batch is the largest size, as
    many images as both bounds allow (tokens: 16x16 pixels each), and it draws."""
    from omni.shared.media.image_sizes import RATIO_SIZES

    checkpoint = make_tiny_vision_decoder(tmp_path / "vision_decoder", seed=2, codebook=torch.randn(64, 16))
    width, height = max(RATIO_SIZES.values(), key=lambda wh: wh[0] * wh[1])
    tokens = (width // 16) * (height // 16)
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(checkpoint), max_batch_images=8, max_batch_tokens=3 * tokens + 1)
    runner = VisionDecoderRunner.from_spec(spec, GroupMember())
    jobs = runner.largest_batch()
    assert [(j.width, j.height, j.steps) for j in jobs] == [(width, height, 1)] * 3
    assert all(runner.decoder.job_error(j) is None for j in jobs)
    spec = protocol.VisionDecoderWorkerSpec(model_dir=str(checkpoint), max_batch_images=1)
    runner = VisionDecoderRunner.from_spec(spec, GroupMember())
    assert len(runner.largest_batch()) == 1
    runner.profile()  # draws it
