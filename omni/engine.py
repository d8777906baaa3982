"""LLMEngine: one model's scheduler and worker, driven by a step loop in the event loop.

Requests come in as scheduler Requests and leave as a stream of TokenEvents. The loop runs
one step at a time: schedule -> send the Step -> await its StepResult -> update the scheduler
-> hand each request its new token. Aborts (client gone, stop string) happen between
awaits in the same loop, so the scheduler is only ever touched from one task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gpu_workers import protocol
from gpu_workers.worker import WorkerSpec
from omni.config import EngineConfig
from omni.metrics import Metrics
from omni.worker_process import WorkerDied, WorkerProcess, restart_until_up
from scheduler.block_manager import BlockManager
from scheduler.output import SchedulerOutput
from scheduler.placement import WorkerState
from scheduler.prefix_hash import BlockHash
from scheduler.request import Request, RequestId, RequestStatus
from scheduler.scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("omni.engine")


class EngineError(RuntimeError):
    """A request could not be completed because its worker failed."""


@dataclass(slots=True)
class TokenEvent:
    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    finish_reason: str | None  # "stop" | "length" when this token ended the request


@dataclass(slots=True)
class RequestStream:
    request: Request
    worker_id: int
    queue: asyncio.Queue[TokenEvent | BaseException] = field(default_factory=asyncio.Queue)
    first_token_time: float | None = None
    last_token_time: float | None = None

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                return


def worker_spec(config: EngineConfig, kind: str, worker_id: int, device: str) -> WorkerSpec:
    """A model's config as one of its worker processes gets it (kind "llm" or "encoder").

    Only an omni model's workers open the artifact store: a text-only LLM never reads it.
    """
    media = config.encoder_dir is not None
    return WorkerSpec(
        worker_id=worker_id,
        model_dir=str(config.model_dir if kind == "llm" else config.encoder_dir),
        device=device,
        dtype=config.dtype,
        block_size=config.block_size,
        num_kv_blocks=config.num_kv_blocks,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        max_model_len=config.max_model_len,
        attention_backend=config.attention_backend,
        num_threads=config.num_threads,
        kind=kind,
        store=config.store if media else None,
        store_endpoint_url=config.store_endpoint_url,
        store_region=config.store_region,
        media_limits=dataclasses.asdict(config.media_limits) if kind == "encoder" else {},
    )


class LLMEngine:
    """One LLM worker process and its scheduler; a ModelPool holds one per worker."""

    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics,
        *,
        worker_id: int = 0,
        device: str | None = None,
    ):
        self.config = config
        self.metrics = metrics
        self.worker_id = worker_id
        self.device = device or config.device
        self._label = str(worker_id)  # the metrics' worker label
        self._wakeup = asyncio.Event()
        # A worker that dies while this engine idles must still be noticed and restarted.
        self.worker = WorkerProcess(self._worker_spec(), on_exit=self._wakeup.set)
        self.scheduler: Scheduler | None = None
        self.max_model_len = 0
        self._streams: dict[RequestId, RequestStream] = {}
        self._task: asyncio.Task[None] | None = None
        self._step_id = 0
        self._ready = False
        self._closing = False
        self._prefix_seen = (0, 0)
        self._preemptions_seen = 0
        self._pending_finished: list[RequestId] = []
        # Leading block hashes of requests placed here and not yet finished: placement counts
        # them as cached, since their KV will be by the time a newcomer is scheduled.
        self._inflight: Counter[BlockHash] = Counter()
        self._inflight_of: dict[RequestId, list[BlockHash]] = {}

    # ---- lifecycle -------------------------------------------------------------------
    def _worker_spec(self) -> WorkerSpec:
        return worker_spec(self.config, "llm", self.worker_id, self.device)

    @property
    def ready(self) -> bool:
        return self._ready and self.worker.is_alive

    async def start(self) -> None:
        await self._start_worker()
        self._task = asyncio.create_task(self._run(), name=f"engine-{self.config.model_name}")

    async def _start_worker(self) -> None:
        ready = await self.worker.start(timeout=self.config.worker_start_timeout)
        # The context can never exceed what the KV cache holds for one request.
        self.max_model_len = min(ready.max_model_len, ready.num_kv_blocks * ready.block_size)
        block_manager = BlockManager(
            ready.num_kv_blocks, ready.block_size, self.config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=self.config.max_num_seqs,
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
            ),
            block_manager,
        )
        self._prefix_seen = (0, 0)
        self._preemptions_seen = 0
        self._pending_finished = []
        self._ready = True
        log.info(
            "%s: worker ready on %s, %d KV blocks of %d tokens, max_model_len %d",
            self.config.model_name,
            ready.device,
            ready.num_kv_blocks,
            ready.block_size,
            self.max_model_len,
        )

    async def stop(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._fail_all(EngineError("server shutting down"))
        await self.worker.stop()

    # ---- requests --------------------------------------------------------------------
    def submit(
        self, request: Request, block_hashes: list[BlockHash] | None = None
    ) -> RequestStream:
        if not self.ready or self.scheduler is None:
            raise EngineError("the model's worker is not ready")
        stream = RequestStream(request, self.worker_id)
        self._streams[request.request_id] = stream
        self.scheduler.add_request(request)
        if block_hashes:
            self._inflight.update(block_hashes)
            self._inflight_of[request.request_id] = block_hashes
        self._wakeup.set()
        return stream

    def placement_state(self, block_hashes: list[BlockHash]) -> WorkerState:
        """This worker as placement sees it, for a request with these leading block hashes."""
        scheduler = self.scheduler
        assert scheduler is not None
        cached = scheduler.block_manager.num_cached_leading_blocks(block_hashes)
        while cached < len(block_hashes) and block_hashes[cached] in self._inflight:
            cached += 1
        return WorkerState(
            worker_id=self.worker_id,
            num_waiting=scheduler.num_waiting,
            num_running=scheduler.num_running,
            kv_usage=scheduler.block_manager.occupancy,
            num_cached_blocks=cached,
            num_prefilling=scheduler.num_prefilling,
        )

    def _forget(self, request_id: RequestId) -> RequestStream | None:
        """Drop the server-side bookkeeping of a request that ended, however it ended."""
        hashes = self._inflight_of.pop(request_id, None)
        if hashes:
            self._inflight.subtract(hashes)
            for h in hashes:
                if self._inflight[h] <= 0:
                    del self._inflight[h]
        return self._streams.pop(request_id, None)

    def abort(
        self, request_id: RequestId, status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> None:
        """Drop a request now: its KV blocks are freed before the next step is scheduled.

        A stop string ends a request this way too (status FINISHED_STOPPED).
        """
        stream = self._forget(request_id)
        if self.scheduler is not None:
            self.scheduler.abort_request(request_id, status)
        if stream is not None:
            self.metrics.request_finished(self.config.model_name, status.value, stream.request)
        self._wakeup.set()

    # ---- the step loop ---------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing:
            if not self.worker.is_alive:
                died = WorkerDied(f"worker {self.worker_id} exited (code {self.worker.exitcode})")
                log.error("%s: %s; restarting it", self.config.model_name, died)
                await self._restart(died)
                continue
            scheduler = self.scheduler
            assert scheduler is not None
            if not scheduler.has_unfinished_requests:
                self._update_gauges()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            output = scheduler.schedule()
            # Ids of requests that ended between steps travel with the next real step.
            self._pending_finished.extend(output.finished_request_ids)
            if output.total_num_scheduled_tokens == 0:
                # Nothing fits right now (admission guarantees one request fits an empty
                # cache, so this only lasts until an abort or a finish frees blocks).
                self._update_gauges()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                await self._execute(scheduler, output)
            except WorkerDied as exc:
                log.error(
                    "%s worker %d: %s; restarting it", self.config.model_name, self.worker_id, exc
                )
                await self._restart(exc)
            except Exception as exc:  # a bug must cost this step's requests, not the server
                log.exception("%s: step failed", self.config.model_name)
                self._fail_step(output, EngineError(f"internal error: {exc}"))
            self._update_gauges()

    async def _execute(self, scheduler: Scheduler, output: SchedulerOutput) -> None:
        self._step_id += 1
        step = self._to_step(self._step_id, output, self._pending_finished)
        self._pending_finished = []
        sent = time.monotonic()
        await self.worker.send(step)
        reply = await self.worker.recv()
        elapsed = time.monotonic() - sent
        self.metrics.add_step(
            self.config.model_name, self._label, output.total_num_scheduled_tokens, elapsed
        )
        if isinstance(reply, protocol.WorkerError):
            self._fail_step(output, EngineError(f"worker error: {reply.message}"))
            return
        if not isinstance(reply, protocol.StepResult) or reply.step_id != self._step_id:
            raise WorkerDied(f"worker replied out of order: {type(reply).__name__}")
        for request_id, reason in reply.failed:  # dropped by the worker before its forward
            self._fail_request(RequestId(request_id), EngineError(reason))
        by_id = {RequestId(s.request_id): s for s in reply.sampled}
        updated = scheduler.update_from_output(
            output, {rid: s.token_id for rid, s in by_id.items()}
        )
        now = time.monotonic()
        for request in updated:
            stream = self._streams.get(request.request_id)
            if stream is None:
                continue
            sampled = by_id[request.request_id]
            finish_reason = request.status.value if request.is_finished else None
            self._observe_token(stream, now)
            stream.queue.put_nowait(
                TokenEvent(
                    token_id=sampled.token_id,
                    logprob=sampled.logprob,
                    top_logprobs=(
                        [(int(t), float(lp)) for t, lp in sampled.top_logprobs]
                        if sampled.top_logprobs is not None
                        else None
                    ),
                    finish_reason=finish_reason,
                )
            )
            if finish_reason is not None:
                self._forget(request.request_id)
                self.metrics.request_finished(self.config.model_name, finish_reason, request)

    def _to_step(
        self, step_id: int, output: SchedulerOutput, finished: list[RequestId]
    ) -> protocol.Step:
        new = []
        for s in output.scheduled_new:
            p = s.request.sampling_params
            new.append(
                protocol.NewRequest(
                    request_id=s.request.request_id,
                    token_ids=s.request.all_token_ids,
                    sampling=protocol.SamplingOptions(
                        temperature=p.temperature,
                        top_p=p.top_p,
                        top_k=p.top_k,
                        seed=p.seed,
                        logprobs=p.logprobs,
                    ),
                    block_ids=list(s.block_ids),
                    num_computed_tokens=s.num_computed_tokens,
                    num_scheduled_tokens=s.num_scheduled_tokens,
                    media=[protocol.MediaRef(m.key, m.offset, m.num_rows) for m in s.request.media],
                )
            )
        cached = [
            protocol.CachedRequest(
                request_id=c.request_id,
                new_block_ids=list(c.new_block_ids),
                num_computed_tokens=c.num_computed_tokens,
                num_scheduled_tokens=c.num_scheduled_tokens,
                resumed=c.resumed,
            )
            for c in output.scheduled_cached
        ]
        return protocol.Step(
            step_id=step_id,
            new_requests=new,
            cached_requests=cached,
            finished_request_ids=[str(r) for r in finished],
        )

    def _observe_token(self, stream: RequestStream, now: float) -> None:
        name = self.config.model_name
        if stream.first_token_time is None:
            stream.first_token_time = now
            self.metrics.observe_ttft(name, now - stream.request.arrival_time)
        else:
            assert stream.last_token_time is not None
            self.metrics.observe_itl(name, now - stream.last_token_time)
        stream.last_token_time = now

    def _update_gauges(self) -> None:
        scheduler = self.scheduler
        if scheduler is None:
            return
        name = self.config.model_name
        self.metrics.set_queue(name, self._label, scheduler.num_running, scheduler.num_waiting)
        self.metrics.set_kv_usage(name, self._label, scheduler.kv_usage)
        queried = scheduler.prefix_cache_queried_tokens
        hits = scheduler.prefix_cache_hit_tokens
        seen_q, seen_h = self._prefix_seen
        self.metrics.add_prefix_cache(name, self._label, queried - seen_q, hits - seen_h)
        self._prefix_seen = (queried, hits)
        preemptions = scheduler.num_preemptions_total
        if preemptions > self._preemptions_seen:
            self.metrics.add_preemptions(name, self._label, preemptions - self._preemptions_seen)
        self._preemptions_seen = preemptions

    # ---- failures --------------------------------------------------------------------
    def _fail_step(self, output: SchedulerOutput, error: BaseException) -> None:
        ids = [s.request.request_id for s in output.scheduled_new]
        ids += [c.request_id for c in output.scheduled_cached]
        for request_id in ids:
            self._fail_request(request_id, error)

    def _fail_request(self, request_id: RequestId, error: BaseException) -> None:
        """End a request whose scheduled tokens were never computed. Its blocks must not stay
        in the prefix cache: their hashes were registered at schedule time, for KV that was
        never written."""
        stream = self._forget(request_id)
        assert self.scheduler is not None
        self.scheduler.abort_request(request_id, uncache=True)
        if stream is not None:
            stream.queue.put_nowait(error)
            self.metrics.request_finished(self.config.model_name, "error", stream.request)

    def _fail_all(self, error: BaseException) -> None:
        for request_id, stream in list(self._streams.items()):
            if self.scheduler is not None:
                self.scheduler.abort_request(request_id)
            stream.queue.put_nowait(error)
        self._streams.clear()
        self._inflight.clear()
        self._inflight_of.clear()

    async def _restart(self, cause: BaseException) -> None:
        self._ready = False
        # Only the requests on this worker fail; the KV cache is gone with the process.
        self._fail_all(EngineError(f"worker failed: {cause}"))
        await self.worker.kill()
        await restart_until_up(self._start_worker, lambda: self._closing, self.config.model_name)

