"""ModelPool: the data-parallel LLM workers of one model, the placement between them, and
admission to their shared queue (omni/engines/admission.py).

    check_admission()   before any work for a request: is there room for one more?
    admit(requests)     once its prompts are known: reserve their place, or Overloaded
    submit(request)     place it on a worker; a request never admitted is admitted here,
                        and refused with RefusedAtSubmit (an EngineError: a stream may be open)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from omni.config import ModelConfig
from omni.engines.admission import Overloaded, QueueLimits, QueueLoad, retry_after_s
from omni.engines.llm import EngineError, LLMEngine, RefusedAtSubmit, RequestStream
from omni.engines.worker_specs import llm_worker_spec
from omni.metrics import ChoiceGroup, Metrics
from omni.text.constrained.constraint import TokenConstraint
from scheduler.placement import Placement, make_placement, parse_weights
from scheduler.prefix_hash import block_hashes, salt_root
from scheduler.request import Request, RequestId, RequestStatus
from scheduler.waiting_queue import urgency

log = logging.getLogger("omni.engines.pool")


@dataclass(frozen=True, slots=True)
class _Reservation:
    num_tokens: int
    timeout: float | None  # the request's deadline, in seconds from its arrival
    group: ChoiceGroup  # the choices of its prompt admitted with it (itself among them)


def choice_groups(requests: Sequence[Request]) -> list[ChoiceGroup]:
    """Each request's group of choices: one HTTP request's choices come prompt after prompt,
    the n of one prompt side by side and on one prompt (the same token list), so a run of
    requests with the same prompt is one prompt's n choices."""
    groups: list[ChoiceGroup] = []
    start = 0
    for i in range(1, len(requests) + 1):
        if i == len(requests) or not _same_prompt(requests[i], requests[start]):
            group = ChoiceGroup(i - start)
            groups += [group] * (i - start)
            start = i
    return groups


def _same_prompt(a: Request, b: Request) -> bool:
    if a.prompt_token_ids is b.prompt_token_ids:
        return True
    return a.prompt_token_ids == b.prompt_token_ids and a.media == b.media


class Admission:
    """The place in the queue of requests admitted together (a request's choices): they
    count as queued from admission until submitted. Leaving the `with` block (the request's
    handler ending, however it ends) gives back the place of any never submitted."""

    def __init__(self, pool: ModelPool, request_ids: Sequence[RequestId]) -> None:
        self._pool = pool
        self.request_ids = tuple(request_ids)

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        self._pool._release(self.request_ids)


class ModelPool:
    def __init__(
        self, config: ModelConfig, metrics: Metrics, placement: Placement | None = None
    ) -> None:
        self.config = config
        self.metrics = metrics
        llm = config.llm
        self.placement = placement or make_placement(llm.placement, parse_weights(llm.placement_weights))
        devices = llm.worker_devices
        self.engines = [
            LLMEngine(
                llm_worker_spec(config, i, devices[i % len(devices)]),
                llm,
                config.admission,
                metrics,
                model_name=config.name,
                start_timeout=config.worker.worker_start_timeout,
            )
            for i in range(llm.num_workers)
        ]
        self._reserved: dict[RequestId, _Reservation] = {}
        self._reserved_tokens = 0

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def ready(self) -> bool:
        """Every worker is up (what /health reports)."""
        return all(e.ready for e in self.engines)

    @property
    def serving(self) -> bool:
        """At least one worker can take requests."""
        return any(e.ready for e in self.engines)

    @property
    def max_model_len(self) -> int:
        lens = [e.max_model_len for e in self.engines if e.max_model_len]
        return min(lens) if lens else 0

    # ---- admission -------------------------------------------------------------------
    @property
    def queue_limits(self) -> QueueLimits:
        """The bounds of the model's queue: the flags', else the sum of the live workers'
        defaults (a worker that is down takes its share away until it is back)."""
        return QueueLimits.for_model(self.config.admission, [e.queue_limits for e in self._live()])

    @property
    def queued(self) -> QueueLoad:
        """Requests admitted and not yet running, and the tokens they must compute."""
        load = QueueLoad(len(self._reserved), self._reserved_tokens)
        for engine in self.engines:
            load += engine.queued
        return load

    def check_admission(self, priority: int = 0) -> None:
        """Raise Overloaded when the queue has no room for even one more request (of this
        priority: it could have less urgent ones shed): a request is refused this way before
        its media are fetched or its prompt is built."""
        self._admit(QueueLoad(1, 0), priority, shed=False)

    def admit(self, requests: Sequence[Request], timeout: float | None = None) -> Admission:
        """Admit requests (one HTTP request's choices) all together or raise Overloaded;
        timeout: the deadline the client asked for, in seconds (the server's
        --request-timeout caps it). Use the result as a context manager around the rest of
        the request's handling."""
        if not self._live():
            raise EngineError("no worker of this model is ready")
        priority = min((r.priority for r in requests), default=0)
        self._admit(QueueLoad(len(requests), sum(r.num_tokens for r in requests)), priority)
        timeout = self._timeout(timeout)
        for request, group in zip(requests, choice_groups(requests)):
            if request.request_id in self._reserved:
                raise ValueError(f"request {request.request_id} is admitted already")
            self._reserved[request.request_id] = _Reservation(request.num_tokens, timeout, group)
            self._reserved_tokens += request.num_tokens
        return Admission(self, [r.request_id for r in requests])

    def _admit(self, incoming: QueueLoad, priority: int, *, shed: bool = True) -> None:
        """Refuse incoming (Overloaded) unless the queue has room for it, or (priority policy)
        less urgent requests that never ran can be shed to make that room: then they are, when
        shed is set (they fail with the 429 they would have got had they come last)."""
        limits = self.queue_limits
        queued = self.queued
        limit = limits.refusal(queued, incoming)
        if limit is None or self._shed_for(incoming, priority, limits, queued, shed=shed):
            return
        self.metrics.add_rejected(self.name, limit.value)
        wait = self.retry_after_s(queued)
        raise Overloaded(
            self.name,
            limit,
            f"The model's queue is full: {queued.num_requests} requests ({queued.num_tokens} "
            f"tokens) are waiting, and at most {limits.max_requests} requests "
            f"({limits.max_tokens} tokens) may. Please try again in {wait} s.",
            wait,
        )

    def _shed_for(
        self, incoming: QueueLoad, priority: int, limits: QueueLimits, queued: QueueLoad, *, shed: bool
    ) -> bool:
        """Whether shedding waiting requests less urgent than priority, least urgent first and as
        few as will do, makes room for incoming; if so and shed is set, they are shed. Requests
        admitted but not yet submitted are never shed: their handlers are building prompts."""
        candidates = [(victim, engine) for engine in self._live() for victim in engine.sheddable(priority)]
        candidates.sort(key=lambda c: urgency(c[0]), reverse=True)
        for n, (victim, _) in enumerate(candidates, 1):
            queued = QueueLoad(queued.num_requests - 1, queued.num_tokens - victim.num_tokens)
            if limits.refusal(queued, incoming) is None:
                if shed:
                    for victim, engine in candidates[:n]:
                        engine.shed(victim, priority)
                return True
        return False

    def retry_after_s(self, queued: QueueLoad) -> int:
        rate = sum(e.tokens_per_second for e in self._live())
        return retry_after_s(queued.num_tokens, rate)

    def _timeout(self, requested: float | None) -> float | None:
        """A request may ask for a shorter deadline than the server's, never a longer one."""
        server = self.config.admission.request_timeout
        if requested is None or server is None:
            return server if requested is None else requested
        return min(requested, server)

    def _release(self, request_ids: Sequence[RequestId]) -> None:
        for request_id in request_ids:
            reservation = self._reserved.pop(request_id, None)
            if reservation is not None:
                self._reserved_tokens -= reservation.num_tokens
                reservation.group.end(0)  # never ran: its siblings' group need not wait for it

    def _live(self) -> list[LLMEngine]:
        return [e for e in self.engines if e.ready]

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.gather(*(e.start() for e in self.engines))

    async def stop(self) -> None:
        await asyncio.gather(*(e.stop() for e in self.engines), return_exceptions=True)

    # ---- requests --------------------------------------------------------------------
    def submit(self, request: Request, constraint: TokenConstraint | None = None) -> RequestStream:
        """Place a request on a worker. One admit() did not cover is admitted now, with the
        server's deadline (RefusedAtSubmit if there is no room)."""
        live = self._live()
        if not live:
            raise EngineError("no worker of this model is ready")
        reservation = self._reserved.pop(request.request_id, None)
        group: ChoiceGroup | None = None
        if reservation is None:
            try:
                self._admit(QueueLoad(1, request.num_tokens), request.priority)
            except Overloaded as exc:
                raise RefusedAtSubmit(exc) from None
            timeout = self.config.admission.request_timeout
        else:
            self._reserved_tokens -= reservation.num_tokens
            timeout, group = reservation.timeout, reservation.group
        if len(self.engines) == 1:  # nothing to choose: skip hashing the prompt here
            self.metrics.add_placement(self.name, str(live[0].worker_id), "only")
            return live[0].submit(request, constraint=constraint, timeout=timeout, group=group)
        # One hash chain serves every worker: they share the block size. Full blocks only.
        hashes = block_hashes(
            request.prompt_token_ids, self.config.llm.block_size, salt_root(request.cache_salt), request.media
        )
        decision = self.placement.choose(
            [e.placement_state(hashes) for e in live], len(hashes)
        )
        engine = self.engines[decision.worker_id]
        self.metrics.add_placement(self.name, str(decision.worker_id), decision.reason)
        return engine.submit(request, hashes, constraint, timeout=timeout, group=group)

    def abort(
        self, stream: RequestStream, status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> None:
        self.engines[stream.worker_id].abort(stream.request.request_id, status)
