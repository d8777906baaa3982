"""Token-budget continuous batching for one llm worker.

Each schedule() spends at most max_num_batched_tokens on at most max_num_seqs requests:
first the running ones in order (a decode costs 1 token, an unfinished chunked prefill
continues), then waiting ones in FIFO order. When KV blocks run out, the latest running
request is preempted by recompute: its blocks are freed and it rejoins the front of the
waiting queue, where the prefix cache usually gives most of its KV back.

The loop is synchronous: schedule() -> worker runs the step -> update_from_output() ->
schedule(). At most one step is in flight; schedule() advances num_computed_tokens at once.

Speculative decoding: a decoding request whose worker holds draft tokens (num_draft_tokens,
from the last result) is scheduled 1 + d tokens, d drafts within the budget, max_model_len and
max_tokens; they take budget and KV slots like any token. The result brings 1 to d + 1
tokens; rejected drafts' slots are recomputed by the next step (num_computed_tokens goes back
to the last verified token), and the prefix cache only ever hashes verified tokens.

The waiting queue is bounded (max_num_waiting requests, max_num_waiting_tokens tokens):
add_request refuses a newcomer beyond either with QueueFull. The server admits requests
against tighter limits before they get here (omni/engines/admission.py); this bound is the backstop.
Preempted requests rejoin the queue whatever its length: they were admitted already.

Policies (vLLM's --scheduling-policy; scheduler/waiting_queue.py): fcfs serves in arrival order,
as above. priority keeps the waiting queue and the running batch ordered by (priority,
arrival), lower first: running requests are scheduled most urgent first and the least urgent
is the one preempted; the token budget goes to a waiting request before the running ones less
urgent than it (its prefill is not kept behind their prefill chunks); a waiting request more urgent than the least urgent running one
preempts it when the batch or the KV cache has no room for its first step; and a full queue
sheds its least urgent never-scheduled requests for a more urgent newcomer (add_request
returns them, aborted) instead of refusing it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scheduler.block_manager import BlockId, BlockManager
from scheduler.output import ScheduledCachedRequest, ScheduledNewRequest, SchedulerOutput
from scheduler.request import Request, RequestId, RequestStatus
from scheduler.waiting_queue import QUEUES, SchedulingPolicy, urgency


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    # Bounds of the waiting queue for newcomers; None: unbounded.
    max_num_waiting: int | None = None
    max_num_waiting_tokens: int | None = None
    # Speculative decoding: no drafts are scheduled in a step while more than this many
    # requests run (vLLM's disable_by_batch_size); None: at any batch size.
    speculative_max_running: int | None = None
    policy: SchedulingPolicy = "fcfs"

    def __post_init__(self) -> None:
        if self.policy not in QUEUES:
            raise ValueError(f"scheduling policy {self.policy!r} is not one of {', '.join(QUEUES)}")
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len) <= 0:
            raise ValueError("max_num_seqs, max_num_batched_tokens, max_model_len must be > 0")
        bounds = (self.max_num_waiting, self.max_num_waiting_tokens)
        if any(b is not None and b <= 0 for b in bounds):
            raise ValueError("max_num_waiting and max_num_waiting_tokens must be > 0")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            # Otherwise a long prompt could never be scheduled in one piece.
            raise ValueError("without chunked prefill, max_num_batched_tokens >= max_model_len")


# Why a running request was preempted: a running one needed KV blocks the cache no longer
# had, or (priority) a more urgent waiting one needed its seat in the batch or its blocks.
PreemptionReason = Literal["kv_cache", "priority"]
PREEMPTION_REASONS: tuple[PreemptionReason, ...] = ("kv_cache", "priority")


class QueueFull(RuntimeError):
    """add_request refused a request: the waiting queue is at one of its bounds."""

    def __init__(self, message: str, bound: Literal["requests", "tokens"]) -> None:
        super().__init__(message)
        self.bound = bound


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        capacity = block_manager.num_blocks * block_manager.block_size
        if capacity < config.max_model_len:
            # A request alone in the pool must always fit, or preemption would loop forever.
            raise ValueError(f"{capacity} KV slots cannot hold max_model_len tokens")
        self.config = config
        self.block_manager = block_manager
        self._requests: dict[RequestId, Request] = {}
        self._waiting = QUEUES[config.policy]()
        self._num_waiting_tokens = 0  # sum of num_tokens over _waiting
        self._running: list[Request] = []
        self._known_to_worker: set[RequestId] = set()
        self._finished_ids: list[RequestId] = []  # for the next output
        self._next_step_id = 0
        self.prefix_cache_queried_tokens = 0
        self.prefix_cache_hit_tokens = 0
        self.num_preemptions_total = 0
        self.num_preemptions_by_reason: dict[PreemptionReason, int] = dict.fromkeys(PREEMPTION_REASONS, 0)

    # -- requests in and out -----------------------------------------------------------

    def add_request(self, request: Request) -> list[Request]:
        """Queue a newcomer; QueueFull if the queue has no room for it. Under priority, the
        requests shed to make that room (aborted; the caller fails them as it would have
        failed a refusal): always [] under fcfs."""
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        if request.num_tokens >= self.config.max_model_len:
            raise ValueError(f"{request.num_tokens} tokens leave no room under max_model_len")
        if request.status is not RequestStatus.WAITING:
            raise ValueError(f"a new request must be WAITING, not {request.status}")
        shed = self._make_room(request)
        self._requests[request.request_id] = request
        self._waiting.add(request)
        self._num_waiting_tokens += request.num_tokens
        return shed

    def _make_room(self, request: Request) -> list[Request]:
        """The requests to shed so the newcomer fits (priority: the least urgent ones that never
        ran, each of a higher priority value than its, as few as will do), or QueueFull."""
        refusal = self._refusal(len(self._waiting), self._num_waiting_tokens, request)
        if refusal is None:
            return []
        if self.config.policy != "priority":
            raise refusal
        sheddable = self.sheddable(request.priority)
        count, tokens = len(self._waiting), self._num_waiting_tokens
        for n, victim in enumerate(sheddable, 1):
            count, tokens = count - 1, tokens - victim.num_tokens
            if self._refusal(count, tokens, request) is None:
                shed = sheddable[:n]
                for r in shed:
                    self.abort_request(r.request_id)
                return shed
        raise refusal

    def sheddable(self, priority: int) -> list[Request]:
        """The waiting requests a newcomer of this priority may have shed, least urgent first:
        those less urgent than it that never ran (one that ran has a client with tokens already;
        it was admitted once). [] under fcfs."""
        if self.config.policy != "priority":
            return []
        return [
            r for r in reversed(list(self._waiting))
            if r.status is RequestStatus.WAITING and r.priority > priority
        ]  # fmt: skip

    def _refusal(self, count: int, tokens: int, request: Request) -> QueueFull | None:
        """QueueFull unless a waiting queue of count requests and tokens tokens has room for this
        newcomer. An empty queue always has room, so a prompt longer than the token bound can
        still be served."""
        if count == 0:
            return None
        config = self.config
        if config.max_num_waiting is not None and count >= config.max_num_waiting:
            return QueueFull(f"{count} requests are waiting (at most {config.max_num_waiting})", "requests")
        limit = config.max_num_waiting_tokens
        if limit is not None and tokens + request.num_tokens > limit:
            return QueueFull(f"{tokens} tokens are waiting; {request.num_tokens} more would pass {limit}", "tokens")
        return None

    def abort_request(
        self,
        request_id: RequestId,
        status: RequestStatus = RequestStatus.FINISHED_ABORTED,
        *,
        uncache: bool = False,
    ) -> Request | None:
        """Finish a request from outside (client gone, stop string); frees its blocks now.

        uncache: the request's last step never ran, so blocks it alone held leave the
        prefix cache instead of staying there with hashes of KV that was never written."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        request = self._requests.get(request_id)
        if request is None:
            return None
        # By identity: Request is a dataclass, so == would compare every field.
        if request.status is RequestStatus.RUNNING:
            self._running = [r for r in self._running if r is not request]
        else:
            self._waiting.remove(request)
            self._num_waiting_tokens -= request.num_tokens
        request.status = status
        self._finish(request, uncache=uncache)
        return request

    def get_request(self, request_id: RequestId) -> Request | None:
        return self._requests.get(request_id)

    def _finish(self, request: Request, *, uncache: bool = False) -> None:
        """Release a request already taken out of the queues."""
        del self._requests[request.request_id]
        self.block_manager.free(request, uncache=uncache)
        if request.request_id in self._known_to_worker:
            self._known_to_worker.remove(request.request_id)
            self._finished_ids.append(request.request_id)

    # -- stats -------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_waiting_tokens(self) -> int:
        """Tokens the waiting requests must compute before they decode (a preempted one's
        output included: it is recomputed)."""
        return self._num_waiting_tokens

    @property
    def num_prefilling(self) -> int:
        """Running requests whose prompt is not fully computed yet (no first token)."""
        return sum(1 for r in self._running if r.num_computed_tokens < r.num_prompt_tokens)

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    # -- scheduling --------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput(
            step_id=self._next_step_id,
            scheduled_new=[],
            scheduled_cached=[],
            finished_request_ids=self._finished_ids,
            preempted_request_ids=[],
        )
        self._next_step_id += 1
        self._finished_ids = []
        self._preempt_for_waiting(output)
        num_made_room = len(output.preempted_request_ids)
        budget = self.config.max_num_batched_tokens
        start = 0  # the first running request not scheduled yet
        if self.config.policy == "priority" and self._waiting:
            # The budget serves urgent rows first: the running requests more urgent than the
            # queue's head, then the waiting ones more urgent than every running one left (a
            # voice turn's prefill is not kept behind the chunks of long background prompts).
            # Those join the running list before the rest (it is kept in urgency order).
            budget, start = self._schedule_running(output, budget, before=urgency(self._waiting.peek()))
            if len(output.preempted_request_ids) == num_made_room:
                rest = self._running[start] if start < len(self._running) else None
                num_running = len(self._running)
                budget = self._schedule_waiting(output, budget, before=None if rest is None else urgency(rest))
                start += len(self._running) - num_running
        budget, _ = self._schedule_running(output, budget, start)
        # A request preempted for lack of blocks means none are spare for newcomers.
        if len(output.preempted_request_ids) == num_made_room:
            self._schedule_waiting(output, budget)
        return output

    def _preempt_for_waiting(self, output: SchedulerOutput) -> None:
        """priority: each waiting request, most urgent first, that is more urgent than the least
        urgent running one and finds no seat in the batch or no KV room for its first step,
        preempts running ones, least urgent first, until it has both. The KV check reserves
        nothing for the waiting ones before it: one that fits only because another has not
        taken its blocks yet waits a step, and the next schedule() preempts for it."""
        if self.config.policy != "priority":
            return
        seats = self.config.max_num_seqs - len(self._running)
        for request in list(self._waiting):
            while (
                self._running
                and urgency(self._running[-1]) > urgency(request)
                and (seats <= 0 or not self._first_step_fits(request))
            ):
                victim = self._running.pop()
                self._preempt(victim, "priority")
                output.preempted_request_ids.append(victim.request_id)
                seats += 1
            if seats <= 0 or not self._first_step_fits(request):
                return
            seats -= 1

    def _first_step_fits(self, request: Request) -> bool:
        """Whether the KV cache has room now for a waiting request's first chunk."""
        computed_blocks: list[BlockId] = []
        num_cached = 0
        if request.reads_prefix_cache:
            computed_blocks, num_cached = self.block_manager.get_computed_blocks(request)
        num_new = min(request.num_tokens - num_cached, self.config.max_num_batched_tokens)
        return self.block_manager.can_allocate(request, num_new, computed_blocks)

    def _schedule_running(
        self, output: SchedulerOutput, budget: int, start: int = 0, before: tuple[int, float] | None = None
    ) -> tuple[int, int]:
        """Schedule the running requests in order from index start; before: stop at the first
        one not more urgent than this (the priority policy's first pass). The budget left, and
        the index of the first request not scheduled."""
        limit = self.config.speculative_max_running
        speculate = limit is None or len(self._running) <= limit
        i = start
        while i < len(self._running) and budget > 0:
            request = self._running[i]
            if before is not None and urgency(request) >= before:
                break
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:  # only if its last step's token never came back
                i += 1
                continue
            drafts = 0
            if num_new == 1 and request.num_draft_tokens and speculate:
                drafts = self._num_drafts(request, budget - 1)
                num_new += drafts
            new_blocks = self._allocate_or_preempt(request, num_new, output)
            if new_blocks is None:  # it was its own victim, and was last in the list
                break
            output.scheduled_cached.append(
                ScheduledCachedRequest(
                    request.request_id, new_blocks, request.num_computed_tokens, num_new, False, drafts
                )
            )
            output.num_draft_tokens += drafts
            self._advance(request, num_new)
            budget -= num_new
            i += 1
        return budget, i

    def _num_drafts(self, request: Request, budget: int) -> int:
        """Drafts to verify after a decoding request's next token: the step emits up to one
        token more than it verifies, within max_model_len and max_tokens."""
        room = min(
            self.config.max_model_len - request.num_tokens - 1,
            request.sampling_params.max_tokens - request.num_output_tokens - 1,
        )
        return max(0, min(request.num_draft_tokens, budget, room))

    def _allocate_or_preempt(
        self, request: Request, num_new: int, output: SchedulerOutput
    ) -> list[BlockId] | None:
        while not self.block_manager.can_allocate(request, num_new):
            victim = self._running.pop()
            self._preempt(victim, "kv_cache")
            output.preempted_request_ids.append(victim.request_id)
            if victim is request:
                return None
        return self.block_manager.allocate(request, num_new)

    def _preempt(self, request: Request, reason: PreemptionReason) -> None:
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_draft_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.num_preemptions_by_reason[reason] += 1
        self._waiting.add_preempted(request)
        self._num_waiting_tokens += request.num_tokens

    def _schedule_waiting(
        self, output: SchedulerOutput, budget: int, before: tuple[int, float] | None = None
    ) -> int:
        """Admit waiting requests in queue order while budget, seats and KV last; before: only
        those more urgent than this (the priority policy's first pass)."""
        preempted_now = set(output.preempted_request_ids)
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            request = self._waiting.peek()
            if request.request_id in preempted_now:
                break  # it made room for those before it: it does not take that room back
            if before is not None and urgency(request) >= before:
                break
            computed_blocks: list[BlockId] = []
            num_cached = 0
            if request.reads_prefix_cache:
                computed_blocks, num_cached = self.block_manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_cached
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            if not self.block_manager.can_allocate(request, num_new, computed_blocks):
                break
            block_ids = self.block_manager.allocate(request, num_new, computed_blocks)
            self._waiting.pop()
            self._num_waiting_tokens -= request.num_tokens
            if self.config.policy == "priority":  # the least urgent last: the one to preempt
                bisect.insort_right(self._running, request, key=urgency)
            else:
                self._running.append(request)
            if request.reads_prefix_cache:
                self.prefix_cache_queried_tokens += request.num_tokens
                self.prefix_cache_hit_tokens += num_cached
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_cached
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.request_id in self._known_to_worker:  # resumed after a preemption
                output.scheduled_cached.append(
                    ScheduledCachedRequest(
                        request.request_id, block_ids, num_cached, num_new, resumed=True
                    )
                )
            else:
                self._known_to_worker.add(request.request_id)
                output.scheduled_new.append(
                    ScheduledNewRequest(request, block_ids, num_cached, num_new)
                )
            self._advance(request, num_new)
            budget -= num_new
        return budget

    def _advance(self, request: Request, num_scheduled: int) -> None:
        # Counted at schedule time: the KV of these tokens exists once the step runs, so the
        # blocks may be shared from now on, even by a request admitted later in this same
        # step. That is safe because a step writes the KV of all its tokens before attention
        # reads any (per layer), and later steps run after this one.
        request.num_computed_tokens += num_scheduled
        self.block_manager.cache_full_blocks(request)

    # -- results -----------------------------------------------------------------------

    def update_from_output(
        self,
        output: SchedulerOutput,
        sampled: Mapping[RequestId, int | Sequence[int]],
        drafted: Mapping[RequestId, int] | None = None,
    ) -> list[Request]:
        """Append the sampled tokens; return the requests that got one (finished or not), and
        the prefill-only ones whose prompt is now computed (finished, with no token).

        sampled: a request's token, or with speculative decoding its tokens in order (the
        accepted drafts, then one more); tokens after one that ends the request are dropped.
        drafted: the draft tokens the worker now holds per request (absent: none)."""
        scheduled = [
            (s.request.request_id, s.num_computed_tokens, s.num_scheduled_tokens)
            for s in output.scheduled_new
        ] + [
            (s.request_id, s.num_computed_tokens, s.num_scheduled_tokens)
            for s in output.scheduled_cached
        ]
        updated: list[Request] = []
        for request_id, num_computed, num_scheduled in scheduled:
            request = self._requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted (or preempted) since this step was scheduled
            if num_computed + num_scheduled < request.num_tokens:
                continue  # a partial prefill chunk samples nothing
            if request.sampling_params.prefill_only:  # nor does the last chunk of these
                request.status = RequestStatus.FINISHED_LENGTH
                self._finish(request)
                updated.append(request)
                continue
            if request_id not in sampled:
                raise ValueError(f"step {output.step_id}: no sampled token for {request_id}")
            tokens = sampled[request_id]
            for token_id in [tokens] if isinstance(tokens, int) else tokens:
                request.append_output_token(token_id)
                if not request.is_finished and request.num_tokens >= self.config.max_model_len:
                    request.status = RequestStatus.FINISHED_LENGTH
                if request.is_finished:
                    break
            if request.is_finished:
                self._finish(request)
            else:
                # rejected drafts: their KV is recomputed from the last verified token on
                request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
                request.num_draft_tokens = drafted.get(request_id, 0) if drafted else 0
            updated.append(request)
        if any(r.is_finished for r in updated):
            self._running = [r for r in self._running if not r.is_finished]
        return updated

    # -- invariants --------------------------------------------------------------------

    def check_invariants(self) -> None:
        self.block_manager.check_invariants()
        running = {r.request_id for r in self._running}
        waiting = {r.request_id for r in self._waiting}
        assert len(running) == len(self._running) and len(waiting) == len(self._waiting)
        assert not running & waiting
        assert running | waiting == self._requests.keys()
        assert self._num_waiting_tokens == sum(r.num_tokens for r in self._waiting)
        assert len(self._running) <= self.config.max_num_seqs
        if self.config.policy == "priority":
            for queue in (self._running, list(self._waiting)):
                keys = [urgency(r) for r in queue]
                assert keys == sorted(keys)
        bs = self.block_manager.block_size
        for request in self._running:
            assert request.status is RequestStatus.RUNNING
            assert request.num_computed_tokens <= request.num_tokens
            num_blocks = len(self.block_manager.block_ids(request.request_id))
            assert num_blocks * bs >= request.num_computed_tokens
        for request in self._waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert request.num_computed_tokens == 0
            assert not self.block_manager.block_ids(request.request_id)
