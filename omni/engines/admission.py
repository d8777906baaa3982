"""Bounded admission: how much work may wait for a model, and the refusal beyond it.

A model's queue is every request admitted and not yet running: reserved by the orchestrator
(ModelPool.admit) but not submitted yet, or waiting in one of its workers' schedulers
(preempted requests included). It is bounded in requests and in tokens to compute, summed
over the model's live data-parallel workers:

    admitted  <=>  queue empty  or  (queued + incoming) <= limits, in requests and in tokens

An empty queue admits anything (a prompt longer than the token bound is still served alone).
Beyond the limits a request is refused at once with Overloaded, which the API answers with
429, a Retry-After header and an OpenAI rate-limit error object; the official clients retry
such answers themselves. The encoder's queue of media items has the same rule in items and
bytes (omni/engines/encoder.py).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from omni.config import AdmissionConfig

# Defaults per worker, from its KV cache and batch size: a queue of QUEUED_SEQS_FACTOR
# batches of requests and QUEUED_KV_FACTOR caches' worth of tokens, so the last admitted
# request waits for about that many turnovers of the running batch, not more. A small cache
# still lets one batch of full-length prompts wait: a queue that refuses fewer requests than
# one step could run refuses load the scheduler would take (preempting as it must).
QUEUED_SEQS_FACTOR = 2
QUEUED_KV_FACTOR = 2
# Retry-After is an estimate clamped to these seconds (the OpenAI client honours up to 60).
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


class Limit(enum.Enum):
    """Which bound refused a request. The value is the error object's type (OpenAI's 429s
    say "requests" or "tokens") and the rejection metric's reason label."""

    REQUESTS = "requests"
    TOKENS = "tokens"
    MEDIA_ITEMS = "media_items"
    MEDIA_BYTES = "media_bytes"
    IMAGES = "images"  # waiting for the image decoder
    AUDIO = "audio_streams"  # answers the audio decoder speaks at once


class Overloaded(Exception):
    """A request refused before any work was queued for it: retry after retry_after_s."""

    def __init__(self, model: str, limit: Limit, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.model = model
        self.limit = limit
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class QueueLoad:
    num_requests: int
    num_tokens: int

    def __add__(self, other: QueueLoad) -> QueueLoad:
        return QueueLoad(self.num_requests + other.num_requests, self.num_tokens + other.num_tokens)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    max_requests: int
    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_requests <= 0 or self.max_tokens <= 0:
            raise ValueError("queue limits must be > 0")

    @classmethod
    def for_worker(cls, max_num_seqs: int, num_kv_tokens: int, max_model_len: int) -> QueueLimits:
        """The default limits one worker adds to its model's queue."""
        max_tokens = max(QUEUED_KV_FACTOR * num_kv_tokens, max_num_seqs * max_model_len)
        return cls(QUEUED_SEQS_FACTOR * max_num_seqs, max_tokens)

    @classmethod
    def for_model(cls, config: AdmissionConfig, shares: Sequence[QueueLimits]) -> QueueLimits:
        """A model's limits: each flag that is set, else the sum of the given workers' shares."""
        max_requests, max_tokens = config.max_queued_requests, config.max_queued_tokens
        return cls(
            sum(s.max_requests for s in shares) if max_requests is None else max_requests,
            sum(s.max_tokens for s in shares) if max_tokens is None else max_tokens,
        )

    def __add__(self, other: QueueLimits) -> QueueLimits:
        return QueueLimits(self.max_requests + other.max_requests, self.max_tokens + other.max_tokens)

    def refusal(self, queued: QueueLoad, incoming: QueueLoad) -> Limit | None:
        """The bound that incoming would pass with queued ahead of it, or None: admitted."""
        if queued.num_requests == 0:
            return None
        if queued.num_requests + incoming.num_requests > self.max_requests:
            return Limit.REQUESTS
        if queued.num_tokens + incoming.num_tokens > self.max_tokens:
            return Limit.TOKENS
        return None


def retry_after_s(queued_tokens: int, tokens_per_second: float) -> int:
    """Seconds until the tokens queued now are computed at the recent rate: by then a retry
    finds the queue drained. With no rate measured yet, the smallest wait."""
    if tokens_per_second <= 0.0:
        return MIN_RETRY_AFTER_S
    seconds = math.ceil(queued_tokens / tokens_per_second)
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, seconds))
