"""LLMEngine: one LLM worker and its scheduler, driven by a step loop in the event loop.

Requests come in as scheduler Requests and leave as a stream of TokenEvents. One turn of the
loop (run_once) runs one step: schedule -> send the Step -> await its StepResult -> update the
scheduler -> hand each request its new token. A step with constrained requests that sample
sends their grammar masks after the Step, filled while the worker runs its forward. Aborts
(client gone, stop string, a deadline passed) happen between awaits in the same loop, so the
scheduler is only ever touched from one task. Spawning, restarting and stopping the worker
are SupervisedWorker's (omni/engines/supervisor.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from omni.config import AdmissionConfig, LLMConfig
from omni.engines.admission import Limit, Overloaded, QueueLimits, QueueLoad, retry_after_s
from omni.engines.step import step_message
from omni.engines.supervisor import EngineError, SupervisedWorker
from omni.engines.worker_process import WorkerDied
from omni.metrics import ChoiceGroup, EngineMetrics, Metrics
from omni.shared import protocol
from omni.text.constrained.constraint import MaskFiller, TokenConstraint
from scheduler.block_manager import BlockManager
from scheduler.output import SchedulerOutput
from scheduler.placement import WorkerState
from scheduler.prefix_hash import BlockHash
from scheduler.request import Request, RequestId, RequestStatus
from scheduler.scheduler import PreemptionReason, QueueFull, Scheduler, SchedulerConfig

__all__ = [
    "DeadlineExceeded",
    "EngineError",
    "LLMEngine",
    "PrefillDone",
    "RefusedAtSubmit",
    "RequestStream",
    "TokenEvent",
]

log = logging.getLogger("omni.engines.llm")

# Weight of the newest step in the computed-token rate behind Retry-After estimates.
_RATE_SMOOTHING = 0.2


class DeadlineExceeded(EngineError):
    """The request ran past its deadline and was aborted (its KV blocks freed at once)."""


class RefusedAtSubmit(EngineError):
    """Overloaded, found only when the request was submitted (no ModelPool.admit reserved its
    place). Assembly submits lazily, so a stream may have begun: the refusal travels as an
    engine error, an SSE error event in a stream, a 429 in a JSON response (engine_error)."""

    def __init__(self, overloaded: Overloaded) -> None:
        super().__init__(overloaded.message)
        self.overloaded = overloaded


@dataclass(slots=True)
class TokenEvent:
    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    finish_reason: str | None  # "stop" | "length" when this token ended the request


@dataclass(slots=True)
class PrefillDone:
    """A prefill-only request (max_tokens 0) has computed its prompt: it ends with no token."""

    finish_reason: str = "length"


@dataclass(slots=True)
class RequestStream:
    request: Request
    worker_id: int
    # The request's grammar (omni/text/constrained): masks its sampling, ends it when complete.
    constraint: TokenConstraint | None = None
    queue: asyncio.Queue[TokenEvent | PrefillDone | BaseException] = field(default_factory=asyncio.Queue)
    # What the worker sent of the prompt's logprobs, in order; complete once the first event
    # is queued (the step that computes the last prompt token also samples, or ends a
    # prefill-only request).
    prompt_logprobs: list[protocol.PromptLogprobs] = field(default_factory=list)
    # Fires at the request's deadline, if it has one; cancelled however else it ends.
    deadline_timer: asyncio.TimerHandle | None = None
    # The choices of its prompt it was admitted with (for vllm:request_params_n), if any.
    group: ChoiceGroup | None = None
    # A constrained request's drafts its grammar takes (those its next step may verify).
    drafts: list[int] = field(default_factory=list)

    async def __aiter__(self) -> AsyncIterator[TokenEvent | PrefillDone]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                return


class InflightPrefixes:
    """Leading block hashes of requests placed on a worker and not yet finished: placement
    counts them as cached, since their KV will be by the time a newcomer is scheduled."""

    def __init__(self) -> None:
        self._count: Counter[BlockHash] = Counter()
        self._of: dict[RequestId, list[BlockHash]] = {}

    def add(self, request_id: RequestId, hashes: list[BlockHash]) -> None:
        self._count.update(hashes)
        self._of[request_id] = hashes

    def remove(self, request_id: RequestId) -> None:
        hashes = self._of.pop(request_id, None)
        if hashes:
            self._count.subtract(hashes)
            for h in hashes:
                if self._count[h] <= 0:
                    del self._count[h]

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._count

    def clear(self) -> None:
        self._count.clear()
        self._of.clear()


class LLMEngine(SupervisedWorker):
    """One LLM worker process and its scheduler; a ModelPool holds one per worker."""

    sizes_from_free_memory = True  # its KV cache takes what the model's weights leave

    def __init__(
        self,
        spec: protocol.LLMWorkerSpec,
        config: LLMConfig,
        admission: AdmissionConfig,
        metrics: Metrics,
        *,
        model_name: str,
        start_timeout: float = 600.0,
    ):
        self.config = config
        self.admission = admission
        self.metrics = metrics
        self.model_name = model_name
        self.worker_id = spec.worker_id
        self.device = spec.device
        super().__init__(spec, name=f"{model_name} llm worker {spec.worker_id}", start_timeout=start_timeout)
        # Its vLLM series: engine is the worker's index, as vLLM's is a data-parallel rank's.
        self.stats: EngineMetrics = metrics.engine(model_name, str(spec.worker_id))
        if config.speculative is not None:
            self.stats.set_speculative_tokens(config.speculative.num_speculative_tokens)
        self.scheduler: Scheduler | None = None
        self.max_model_len = 0
        self.num_kv_tokens = 0  # what the worker's KV cache holds, known once it is ready
        # Tokens computed per second of step time, smoothed: what Retry-After is estimated from.
        self.tokens_per_second = 0.0
        self._streams: dict[RequestId, RequestStream] = {}
        self._prefix_seen = (0, 0)
        self._preemptions_seen: dict[PreemptionReason, int] = {}
        self._pending_finished: list[RequestId] = []
        self._inflight = InflightPrefixes()
        self._masks = MaskFiller()
        self._num_constrained = 0  # streams with a grammar: none means no step looks for masks
        self._placed_media: list[str] = []  # artifact keys of requests placed since the last step

    # ---- lifecycle -------------------------------------------------------------------
    def on_ready(self, ready: protocol.LLMReady) -> None:
        # The context can never exceed what the KV cache holds for one request.
        self.max_model_len = min(ready.max_model_len, ready.num_kv_blocks * ready.block_size)
        self.num_kv_tokens = ready.num_kv_blocks * ready.block_size
        block_manager = BlockManager(
            ready.num_kv_blocks, ready.block_size, self.config.enable_prefix_caching
        )
        # The backstop behind the pool's admission: the whole model's queue may be placed on
        # this one worker, and preempted requests (at most a full batch and a full cache)
        # rejoin its queue beyond any bound.
        model_limits = QueueLimits.for_model(self.admission, [self.queue_limits] * self.config.num_workers)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=self.config.max_num_seqs,
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                max_num_waiting=model_limits.max_requests + self.config.max_num_seqs,
                max_num_waiting_tokens=model_limits.max_tokens + self.num_kv_tokens,
                speculative_max_running=(
                    self.config.speculative.disable_by_batch_size if self.config.speculative else None
                ),
                policy="priority" if self.config.scheduling_policy == "priority" else "fcfs",
            ),
            block_manager,
        )
        self._prefix_seen = (0, 0)
        self._preemptions_seen = {}
        self._pending_finished = []
        self._placed_media = []
        self.stats.set_cache_config(
            block_size=ready.block_size,
            num_gpu_blocks=ready.num_kv_blocks,
            enable_prefix_caching=self.config.enable_prefix_caching,
        )
        self._update_gauges()
        log.info(
            "%s: ready on %s, %d KV blocks of %d tokens, max_model_len %d",
            self.name,
            ready.device,
            ready.num_kv_blocks,
            ready.block_size,
            self.max_model_len,
        )

    # ---- requests --------------------------------------------------------------------
    @property
    def queue_limits(self) -> QueueLimits:
        """This worker's share of its model's default queue limits (once it is ready)."""
        return QueueLimits.for_worker(self.config.max_num_seqs, self.num_kv_tokens, self.max_model_len)

    @property
    def queued(self) -> QueueLoad:
        """What waits in this worker's scheduler: requests, and the tokens they must compute."""
        if self.scheduler is None:
            return QueueLoad(0, 0)
        return QueueLoad(self.scheduler.num_waiting, self.scheduler.num_waiting_tokens)

    def submit(
        self,
        request: Request,
        block_hashes: list[BlockHash] | None = None,
        constraint: TokenConstraint | None = None,
        *,
        timeout: float | None = None,
        group: ChoiceGroup | None = None,
    ) -> RequestStream:
        """Queue a request; timeout: seconds from its arrival after which it is aborted and
        its stream raises DeadlineExceeded; group: its prompt's choices, admitted together."""
        if not self.ready or self.scheduler is None:
            raise EngineError("the model's worker is not ready")
        # drafts where each can be checked as it is sampled: a grammar only if it can roll back
        request.speculate = (
            self.config.speculative is not None
            and request.sampling_params.speculative
            and (constraint is None or constraint.speculable)
        )
        try:
            shed = self.scheduler.add_request(request)
        except QueueFull as exc:
            raise RefusedAtSubmit(self._overloaded(exc)) from None
        for victim in shed:  # --scheduling-policy priority: less urgent ones made room for it
            self._shed(victim, request.priority)
        request.queued_time = time.monotonic()
        stream = RequestStream(request, self.worker_id, constraint, group=group)
        self._streams[request.request_id] = stream
        if timeout is not None:
            delay = max(0.0, request.arrival_time + timeout - time.monotonic())
            loop = asyncio.get_running_loop()
            stream.deadline_timer = loop.call_later(delay, self._expire, request.request_id, timeout)
        if block_hashes:
            self._inflight.add(request.request_id, block_hashes)
        if constraint is not None:
            self._num_constrained += 1
        self._placed_media += [m.key for m in request.media]
        self.wake()
        return stream

    def _overloaded(self, exc: QueueFull) -> Overloaded:
        assert self.scheduler is not None
        limit = Limit.TOKENS if exc.bound == "tokens" else Limit.REQUESTS
        wait = retry_after_s(self.scheduler.num_waiting_tokens, self.tokens_per_second)
        self.metrics.add_rejected(self.model_name, limit.value)
        return Overloaded(self.model_name, limit, f"The model's queue is full: {exc}.", wait)

    def sheddable(self, priority: int) -> list[Request]:
        """Waiting requests that never ran and are less urgent than priority, least urgent first
        (--scheduling-policy priority; [] under fcfs)."""
        return [] if self.scheduler is None else self.scheduler.sheddable(priority)

    def shed(self, victim: Request, priority: int) -> None:
        """Drop one of sheddable(priority) to make room in the model's queue for a more urgent
        request: it fails with the 429 it would have got had it come last."""
        assert self.scheduler is not None
        self.scheduler.abort_request(victim.request_id)
        self._shed(victim, priority)

    def _shed(self, victim: Request, priority: int) -> None:
        """A waiting request the scheduler shed (aborted, never scheduled) for a more urgent
        newcomer: its stream fails as its submit would have failed had it come last."""
        stream = self._forget(victim.request_id)
        if stream is None:
            return
        refusal = QueueFull(
            f"request {victim.request_id} (priority {victim.priority}) was shed for a more urgent one "
            f"(priority {priority})",
            "requests",
        )
        stream.queue.put_nowait(RefusedAtSubmit(self._overloaded(refusal)))
        self._finished(stream, RequestStatus.FINISHED_ABORTED.value)

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
        self._inflight.remove(request_id)
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return None
        if stream.constraint is not None:
            self._num_constrained -= 1
        if stream.deadline_timer is not None:
            stream.deadline_timer.cancel()
        return stream

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
            self._finished(stream, status.value)
        self.wake()

    def _expire(self, request_id: RequestId, timeout: float) -> None:
        """The request's deadline passed: abort it as a disconnect would (its blocks are
        free before the next step) and tell its consumer why."""
        stream = self._forget(request_id)
        if stream is None or self.scheduler is None:
            return
        self.scheduler.abort_request(request_id)
        stream.queue.put_nowait(DeadlineExceeded(f"The request did not finish within its {timeout:g} s deadline."))
        self.stats.deadlines_exceeded.inc()
        self._finished(stream, RequestStatus.FINISHED_ABORTED.value)
        self._update_gauges()
        self.wake()

    # ---- the step loop ---------------------------------------------------------------
    async def run_once(self) -> None:
        scheduler = self.scheduler
        assert scheduler is not None
        if not scheduler.has_unfinished_requests:
            self._update_gauges()
            await self.wait_for_work()
            return
        output = scheduler.schedule()
        now = time.monotonic()
        for new in output.scheduled_new:  # a request's first scheduling (resumptions are cached)
            if new.request.scheduled_time is None:
                new.request.scheduled_time = now
        # Ids of requests that ended between steps travel with the next real step.
        self._pending_finished.extend(output.finished_request_ids)
        if output.total_num_scheduled_tokens == 0:
            # Nothing fits right now (admission guarantees one request fits an empty
            # cache, so this only lasts until an abort or a finish frees blocks).
            self._update_gauges()
            await self.wait_for_work()
            return
        try:
            await self._execute(scheduler, output)
        except WorkerDied:
            raise
        except Exception as exc:  # a bug must cost this step's requests, not the server
            log.exception("%s: step failed", self.name)
            self._fail_step(output, EngineError(f"internal error: {exc}"))
        self._update_gauges()

    async def _execute(self, scheduler: Scheduler, output: SchedulerOutput) -> None:
        constrained = self._sampling_constraints(output)
        step = step_message(output, self._pending_finished, (), self._placed_media, masks_follow=bool(constrained))
        self._pending_finished = []
        self._placed_media = []
        sent = time.monotonic()
        await self.worker.send(step)
        masks = None
        if constrained:  # filled while the worker runs the step's forward (review C5)
            masks = await self._step_masks(step.step_id, constrained)
            await self.worker.send(masks)
        reply = await self.worker.recv()
        elapsed = time.monotonic() - sent
        self.stats.add_step(output.total_num_scheduled_tokens, elapsed)
        if elapsed > 0.0:
            rate = output.total_num_scheduled_tokens / elapsed
            self.tokens_per_second += _RATE_SMOOTHING * (rate - self.tokens_per_second)
        if isinstance(reply, protocol.WorkerError):
            self._fail_step(output, EngineError(f"worker error: {reply.message}"))
            return
        if not isinstance(reply, protocol.StepResult) or reply.step_id != step.step_id:
            raise WorkerDied(f"worker replied out of order: {type(reply).__name__}")
        if masks is not None and masks.error is not None:  # as before C5: the step's requests fail
            self._fail_step(output, EngineError(f"internal error: {masks.error}"))
            return
        for failed in reply.failed:  # dropped by the worker before its forward
            self._fail_request(RequestId(failed.request_id), EngineError(failed.reason))
        for part in reply.prompt_logprobs:
            if (listener := self._streams.get(RequestId(part.request_id))) is not None:
                listener.prompt_logprobs.append(part)
        by_id: dict[RequestId, list[protocol.SampledToken]] = {}
        for s in reply.sampled:  # a request's tokens in order: several after verified drafts
            by_id.setdefault(RequestId(s.request_id), []).append(s)
        # a verifying request's output length before: the scheduler drops tokens after a stop
        before = {
            rid: r.num_output_tokens
            for rid, tokens in by_id.items()
            if len(tokens) > 1 and (r := scheduler.get_request(rid)) is not None
        }
        if output.num_draft_tokens:
            self._count_drafts(output, by_id)
        drafted = {RequestId(d.request_id): d.token_ids for d in reply.drafted}
        updated = scheduler.update_from_output(
            output, {rid: [s.token_id for s in tokens] for rid, tokens in by_id.items()}, {r: len(d) for r, d in drafted.items()}
        )
        now = time.monotonic()
        for request in updated:
            stream = self._streams.get(request.request_id)
            if stream is None:
                continue
            if request.sampling_params.prefill_only:  # finished, and sampled nothing
                stream.queue.put_nowait(PrefillDone(request.status.value))
                self._forget(request.request_id)
                self.stats.prefill_done(request)
                self._finished(stream, request.status.value, now)
                continue
            kept = by_id[request.request_id]  # those the scheduler appended: none past a stop
            if len(kept) > 1:
                kept = kept[: request.num_output_tokens - before[request.request_id]]
            if stream.constraint is not None and not request.is_finished:
                kept = self._advance_constraint(request, stream, kept, drafted.get(request.request_id, []))
            finish_reason = request.status.value if request.is_finished else None
            for i, sampled in enumerate(kept):
                self._observe_token(stream, now)
                top = sampled.top_logprobs
                stream.queue.put_nowait(
                    TokenEvent(
                        token_id=sampled.token_id,
                        logprob=sampled.logprob,
                        top_logprobs=[(t.token_id, t.logprob) for t in top] if top is not None else None,
                        finish_reason=finish_reason if i == len(kept) - 1 else None,
                    )
                )
            if finish_reason is not None:
                self._forget(request.request_id)
                self._finished(stream, finish_reason, now)

    def _count_drafts(self, output: SchedulerOutput, by_id: dict[RequestId, list[protocol.SampledToken]]) -> None:
        """vLLM's spec_decode counters for the requests that verified drafts in this step."""
        for c in output.scheduled_cached:
            tokens = by_id.get(c.request_id)
            if c.num_draft_tokens and tokens:
                self.stats.add_drafts(c.num_draft_tokens, len(tokens) - 1)

    def _sampling_constraints(self, output: SchedulerOutput) -> list[tuple[RequestId, TokenConstraint, list[int]]]:
        """The constrained requests whose chunk samples in this step (they need a mask), with
        the drafts the step verifies for each (a mask for each row)."""
        if self._num_constrained == 0:  # the common step: nothing to look at
            return []
        sampling: list[tuple[RequestId, TokenConstraint, list[int]]] = []
        scheduled = [(s.request.request_id, s.num_computed_tokens, s.num_scheduled_tokens) for s in output.scheduled_new]
        scheduled += [(c.request_id, c.num_computed_tokens, c.num_scheduled_tokens) for c in output.scheduled_cached]
        for request_id, computed, num in scheduled:
            stream = self._streams.get(request_id)
            if stream is None or stream.constraint is None or not stream.constraint.active:
                continue
            drafts = computed + num - stream.request.num_tokens  # past its last token: drafts
            if drafts >= 0:  # the chunk reaches its last token
                sampling.append((request_id, stream.constraint, stream.drafts[:drafts]))
        return sampling

    async def _step_masks(
        self, step_id: int, sampling: list[tuple[RequestId, TokenConstraint, list[int]]]
    ) -> protocol.StepMasks:
        """Their masks, for the StepMasks that follows the Step. It is sent even when filling
        fails (with the error), as the worker waits for it before it samples."""
        try:
            masks = await self._masks.fill([c for _, c, d in sampling if not d])
            rows = iter(masks)
            token_masks = [
                protocol.TokenMask(r, c.draft_masks(d), 1 + len(d)) if d else protocol.TokenMask(r, next(rows))
                for r, c, d in sampling
            ]
        except Exception as exc:
            log.exception("%s: filling the grammar masks of step %d failed", self.name, step_id)
            return protocol.StepMasks(step_id, [], error=f"{type(exc).__name__}: {exc}")
        return protocol.StepMasks(step_id, token_masks)

    def _advance_constraint(
        self, request: Request, stream: RequestStream, kept: list[protocol.SampledToken], drafts: list[int]
    ) -> list[protocol.SampledToken]:
        """Feed the step's tokens to the grammar; one that completes it ends the request as a
        stop string would (no extra step to sample an EOS it would force anyway). Returns the
        tokens up to there; the drafts the grammar takes are those the next step may verify."""
        constraint = stream.constraint
        assert constraint is not None and self.scheduler is not None
        for i, sampled in enumerate(kept):
            constraint.advance(sampled.token_id)
            if constraint.complete or constraint.violated:
                # An answer closed early to fit max_tokens was cut, even though it is well formed.
                status = RequestStatus.FINISHED_LENGTH if constraint.cut_short else RequestStatus.FINISHED_STOPPED
                self.scheduler.abort_request(request.request_id, status)
                return kept[: i + 1]
        stream.drafts = []
        if request.num_draft_tokens:
            request.num_draft_tokens = constraint.draft_prefix(drafts[: request.num_draft_tokens])
            stream.drafts = drafts[: request.num_draft_tokens]
        return kept

    def _observe_token(self, stream: RequestStream, now: float) -> None:
        request = stream.request
        if request.first_token_time is None:
            request.first_token_time = now
            self.stats.prefill_done(request)
        else:
            assert request.last_token_time is not None
            self.stats.token_gap(now - request.last_token_time)
        request.last_token_time = now
        self.stats.generation_tokens.inc()

    def _finished(self, stream: RequestStream, finished_reason: str, now: float | None = None) -> None:
        """Count a request that ended, whichever way (finished_reason: vLLM's)."""
        end = time.monotonic() if now is None else now
        self.stats.request_finished(stream.request, finished_reason, end, stream.group)

    def _update_gauges(self) -> None:
        scheduler = self.scheduler
        if scheduler is None:
            return
        self.stats.set_scheduler_state(scheduler.num_running, scheduler.num_waiting, scheduler.kv_usage)
        queried = scheduler.prefix_cache_queried_tokens
        hits = scheduler.prefix_cache_hit_tokens
        seen_q, seen_h = self._prefix_seen
        self.stats.add_prefix_cache(queried - seen_q, hits - seen_h)
        self._prefix_seen = (queried, hits)
        for reason, count in scheduler.num_preemptions_by_reason.items():
            seen = self._preemptions_seen.get(reason, 0)
            if count > seen:
                self.stats.add_preemptions(reason, count - seen)
        self._preemptions_seen = dict(scheduler.num_preemptions_by_reason)

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
            self._finished(stream, "error")

    def fail_on_worker(self, error: EngineError) -> None:
        """Every request of this engine: the KV cache, and so all their state, is gone with
        the process (the scheduler is rebuilt when the worker is back)."""
        for request_id, stream in list(self._streams.items()):
            if self.scheduler is not None:
                self.scheduler.abort_request(request_id)
            if stream.deadline_timer is not None:
                stream.deadline_timer.cancel()
            stream.queue.put_nowait(error)
            self._finished(stream, "error")
        self._streams.clear()
        self._inflight.clear()
        self._num_constrained = 0
