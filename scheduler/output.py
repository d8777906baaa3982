"""What one schedule() call decided: the content of one worker Step.

num_computed_tokens is always the value BEFORE this step: the worker computes tokens
[num_computed_tokens, num_computed_tokens + num_scheduled_tokens) and samples a token
exactly when that range ends at the request's last known token, unless the request is
prefill-only (max_tokens 0), which ends there without one.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.block_manager import BlockId
from scheduler.request import Request, RequestId


@dataclass(slots=True)
class ScheduledNewRequest:
    """A request the worker has never seen: sent in full."""

    request: Request
    block_ids: list[BlockId]  # the whole table
    num_computed_tokens: int  # prefix-cache hits
    num_scheduled_tokens: int


@dataclass(slots=True)
class ScheduledCachedRequest:
    """A request the worker already holds: only the delta."""

    request_id: RequestId
    new_block_ids: list[BlockId]  # appended to the table, or the whole table if resumed
    num_computed_tokens: int
    num_scheduled_tokens: int
    # Back after a preemption: new_block_ids replaces the worker's table and
    # num_computed_tokens counts only prefix-cache hits.
    resumed: bool
    # Of num_scheduled_tokens, the draft tokens verified after its next token.
    num_draft_tokens: int = 0


@dataclass(slots=True)
class SchedulerOutput:
    step_id: int
    scheduled_new: list[ScheduledNewRequest]
    scheduled_cached: list[ScheduledCachedRequest]
    # Finished or aborted since the last output, and known to the worker: drop their state.
    finished_request_ids: list[RequestId]
    # Preempted by this step (for stats; the worker keeps their tokens until resumed).
    preempted_request_ids: list[RequestId]
    num_draft_tokens: int = 0  # over every request: speculative decoding's drafts to verify

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.num_scheduled_tokens for s in self.scheduled_new) + sum(
            s.num_scheduled_tokens for s in self.scheduled_cached
        )

    @property
    def is_empty(self) -> bool:
        """Nothing to compute and nothing to drop: no need to send a step."""
        return not (self.scheduled_new or self.scheduled_cached or self.finished_request_ids)

    def num_scheduled_tokens(self, request_id: RequestId) -> int:
        for new in self.scheduled_new:
            if new.request.request_id == request_id:
                return new.num_scheduled_tokens
        for cached in self.scheduled_cached:
            if cached.request_id == request_id:
                return cached.num_scheduled_tokens
        return 0
