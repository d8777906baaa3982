"""VisionDecoderEngine: the image decoder's worker group and the batching of its images.

Callers ask for one image at a time (draw); the engine sends the worker batches of images that
can share every denoising step: the same size and number of steps. While a batch runs, new
images queue; the next batch takes the most urgent waiting image (its request's priority, lower
first; all are 0 under fcfs), the oldest of those, and the other waiting images of its shape
in the same order, up to max_batch_images, so concurrent requests share forwards without
waiting for a window to fill, and no shape starves among equals (the oldest goes next).

A batch streams back its previews (PartialImage) before its result (DecodeResult); each goes
to the image it belongs to. An image whose caller has gone (a client that disconnected) is
dropped from the queue before it is sent; one already in a batch finishes with it.

The queue is bounded (max_queued_images): beyond it an image is refused at once with
Overloaded (a 429), unless the queue is empty. A worker that dies (any rank of its group)
fails only the batch in flight, with an EngineError (a 503); the queue waits for the group to
be restarted; with replicas (omni/engines/vision_replicas.py) the group's queue goes to the
replicas still up instead (on_lost).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from omni.config import VisionDecoderConfig
from omni.engines.admission import Limit, Overloaded
from omni.engines.supervisor import EngineError, SupervisedWorker, fail_futures
from omni.engines.worker_process import WorkerDied
from omni.metrics import Metrics
from omni.shared import protocol

log = logging.getLogger("omni.engines.vision_decoder")

QUEUED_BATCHES = 4  # default queue bound, in batches
RETRY_AFTER_S = 5  # a batch of images takes seconds: wait about one before retrying

# (preview index, encoded preview bytes)
PreviewCallback = Callable[[int, bytes], None]


class ImageDrawError(EngineError):
    """The decoder refused one image (its codes or its size). The span grammar and the size
    table keep requests from getting here; if one does, it fails as the decoder's error (a 503)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRequest:
    """One image to draw: the span's codes and how to draw them."""

    codes: tuple[int, ...]
    width: int
    height: int
    steps: int
    seed: int
    guidance_scale: float | None = None  # None: the checkpoint's default
    step_cache: float | None = None  # None: the server's --image-step-cache (0: off)
    output_format: str = "png"
    quality: int | None = None
    partial_images: int = 0
    priority: int = 0  # its request's (--scheduling-policy priority; lower first)

    @property
    def shape(self) -> tuple[int, int, int]:
        """What images must share to be drawn in one batch."""
        return self.width, self.height, self.steps


@dataclass(slots=True)
class _Pending:
    job: protocol.ImageJob
    future: asyncio.Future[protocol.DecodedImage]
    on_preview: PreviewCallback | None = None
    previews: int = field(default=0)
    priority: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.job.width, self.job.height, self.job.steps

    @property
    def order(self) -> tuple[int, int]:
        """Most urgent, then oldest, first."""
        return self.priority, self.job.job_id


# Pixels per DiT token along each side: Flux's VAE halves three times, then 2x2 patches.
PIXELS_PER_TOKEN_SIDE = 16


def dit_tokens(width: int, height: int) -> int:
    return -(-width // PIXELS_PER_TOKEN_SIDE) * -(-height // PIXELS_PER_TOKEN_SIDE)


class VisionDecoderEngine(SupervisedWorker):
    def __init__(
        self,
        spec: protocol.VisionDecoderWorkerSpec,
        metrics: Metrics,
        model_name: str,
        config: VisionDecoderConfig | None = None,
        *,
        start_timeout: float = 600.0,
    ) -> None:
        config = config or VisionDecoderConfig()
        self.replica = spec.worker_id
        replica = f" replica {self.replica}" if config.replicas > 1 else ""
        super().__init__(spec, name=f"{model_name} vision decoder{replica}", start_timeout=start_timeout)
        self.metrics = metrics
        self.model_name = model_name
        self.max_batch_images = config.max_batch_images
        self.max_batch_tokens = config.max_batch_tokens
        self.default_step_cache = config.image_step_cache
        queued = config.max_queued_images
        self.max_queued_images = QUEUED_BATCHES * self.max_batch_images if queued is None else queued
        self.info: protocol.VisionDecoderReady | None = None
        self._queue: list[_Pending] = []
        self._inflight: list[_Pending] = []
        self.job_ids: Iterator[int] = itertools.count(1)  # replicas share one
        self._batch_id = 0
        # Replicas: called with this group's queue when the group dies (its images are placed
        # on the replicas still up; whatever the callback hands back waits here for the restart).
        self.on_lost: Callable[[list[_Pending]], list[_Pending]] | None = None

    def on_ready(self, ready: protocol.VisionDecoderReady) -> None:
        self.info = ready
        log.info(
            "%s: ready on %s (%d rank%s): %dx%d codes of %d, guidance %s",
            self.name, ready.device, ready.world_size, "" if ready.world_size == 1 else "s",
            ready.grid_rows, ready.grid_cols, ready.num_codes, ready.guidance,
        )  # fmt: skip

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def outstanding_work(self) -> int:
        """DiT tokens x steps of the images queued and in flight: what placement balances."""
        return sum(dit_tokens(*p.shape[:2]) * p.shape[2] for p in (*self._queue, *self._inflight) if not p.future.done())

    @property
    def has_room(self) -> bool:
        return sum(not p.future.done() for p in self._queue) < self.max_queued_images

    async def draw(self, image: ImageRequest, on_preview: PreviewCallback | None = None) -> protocol.DecodedImage:
        """Draw one image; previews (image.partial_images of them) go to on_preview first.
        Raises Overloaded (queue full), EngineError (no worker, or it died with the image) or
        ImageDrawError (the decoder refused the codes or the size)."""
        if not self.ready:
            raise EngineError("the vision decoder is not ready")
        self._check_room()
        job = protocol.ImageJob(
            next(self.job_ids),
            list(image.codes),
            image.width,
            image.height,
            image.steps,
            image.seed,
            image.guidance_scale,
            image.output_format,
            image.quality,
            image.partial_images,
            self.default_step_cache if image.step_cache is None else image.step_cache,
        )
        future: asyncio.Future[protocol.DecodedImage] = asyncio.get_running_loop().create_future()
        self.adopt([_Pending(job, future, on_preview, priority=image.priority)])
        result = await future  # cancelled with the caller: the image is dropped before it is sent
        if result.error is not None:
            raise ImageDrawError(result.error)
        return result

    def adopt(self, pending: Sequence[_Pending]) -> None:
        """Queue images (a draw's, or a lost replica's: their callers still await them)."""
        self._queue.extend(pending)
        self._set_queue_metric()
        self.wake()

    def _set_queue_metric(self) -> None:
        self.metrics.set_decoder_queue(self.model_name, len(self._queue), replica=self.replica)

    def _check_room(self) -> None:
        live = [p for p in self._queue if not p.future.done()]
        if not live or len(live) < self.max_queued_images:
            return
        self.metrics.add_rejected(self.model_name, Limit.IMAGES.value)
        raise Overloaded(
            self.model_name,
            Limit.IMAGES,
            f"The image decoder's queue is full: {len(live)} images are waiting, and at most "
            f"{self.max_queued_images} may. Please try again in {RETRY_AFTER_S} s.",
            RETRY_AFTER_S,
        )

    def _next_batch(self) -> list[_Pending]:
        """The most urgent (then oldest) waiting image and the others of its shape in the same
        order, up to max_batch_images and max_batch_tokens (one image always goes, however large)."""
        self._queue = [p for p in self._queue if not p.future.done()]  # callers gone
        if not self._queue:
            return []
        ordered = sorted(self._queue, key=lambda p: p.order)
        shape = ordered[0].shape
        by_tokens = max(1, self.max_batch_tokens // dit_tokens(shape[0], shape[1]))
        batch = [p for p in ordered if p.shape == shape][: min(self.max_batch_images, by_tokens)]
        taken = {id(p) for p in batch}
        self._queue = [p for p in self._queue if id(p) not in taken]
        self._set_queue_metric()
        return batch

    async def run_once(self) -> None:
        batch = self._next_batch()
        if not batch:
            await self.wait_for_work()
            return
        self._inflight = batch
        self.metrics.set_decoder_running(self.model_name, len(batch), replica=self.replica)
        try:
            await self._execute(batch)
        except WorkerDied:
            raise  # fail_on_worker fails the batch in flight; the supervisor restarts the group
        except Exception as exc:  # a bug costs this batch, not the server
            log.exception("%s: image batch failed", self.name)
            self._fail(batch, EngineError(f"internal error in the vision decoder: {exc}"))
        finally:
            self.metrics.set_decoder_running(self.model_name, 0, replica=self.replica)
        self._inflight = []

    async def _execute(self, batch: list[_Pending]) -> None:
        self._batch_id += 1
        sent = time.monotonic()
        await self.worker.send(protocol.DecodeImages(self._batch_id, [p.job for p in batch]))
        by_id = {p.job.job_id: p for p in batch}
        while True:
            reply = await self.worker.recv()
            if isinstance(reply, protocol.PartialImage) and reply.batch_id == self._batch_id:
                pending = by_id.get(reply.job_id)
                if pending is not None and pending.on_preview is not None and not pending.future.done():
                    pending.on_preview(reply.index, reply.data)
                continue
            if isinstance(reply, protocol.WorkerError):
                self._count("failed", len(batch))
                self._fail(batch, EngineError(f"vision decoder error: {reply.message}"))
                return
            if not isinstance(reply, protocol.DecodeResult) or reply.batch_id != self._batch_id:
                raise WorkerDied(f"vision decoder replied out of order: {type(reply).__name__}")
            break
        self.metrics.observe_decoder_batch(self.model_name, len(batch), time.monotonic() - sent, reply.step_seconds)
        results = {image.job_id: image for image in reply.images}
        for pending in batch:
            result = results.get(pending.job.job_id)
            if result is None:
                self._count("failed")
                self._fail([pending], EngineError("the vision decoder returned no image"))
                continue
            self._count("ok" if result.error is None else "error")
            self.metrics.add_decoder_blocks(self.model_name, result.blocks_computed, result.blocks_skipped)
            if not pending.future.done():
                pending.future.set_result(result)

    def _count(self, outcome: str, n: int = 1) -> None:
        self.metrics.add_decoder_jobs(self.model_name, outcome, n, replica=self.replica)

    def fail_on_worker(self, error: EngineError) -> None:
        """Only the batch in flight died with the group; the queue waits for the new one, or
        goes to the other replicas (on_lost)."""
        self._count("failed", sum(not p.future.done() for p in self._inflight))
        self._fail(self._inflight, error)
        self._inflight = []
        if self.on_lost is not None and self._queue:
            queue, self._queue = self._queue, []
            self._queue = self.on_lost(queue) + self._queue
            self._set_queue_metric()

    def fail_pending(self, error: EngineError) -> None:
        self._fail(self._inflight + self._queue, error)
        self._inflight, self._queue = [], []

    @staticmethod
    def _fail(batch: list[_Pending], error: Exception) -> None:
        fail_futures((pending.future for pending in batch), error)
