"""FakePool: ModelPool's interface to the orchestrator, with no worker. Every request gets the
same scripted tokens, the last one finishing it, and every submit and abort is recorded."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from omni.config import ModelConfig
from omni.text.constrained.constraint import TokenConstraint, allowed_tokens, fill_masks
from scheduler.request import Request, RequestId, RequestStatus


@dataclass(frozen=True, slots=True)
class FakeEvent:
    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    finish_reason: str | None


@dataclass(slots=True)
class FakeStream:
    request: Request
    events: list[FakeEvent]

    async def __aiter__(self) -> AsyncIterator[FakeEvent]:
        for event in self.events:
            yield event


@dataclass
class FakePool:
    tokens: list[int]  # what every request generates, in order
    finish_reason: str = "length"
    serving: bool = True
    max_model_len: int = 256
    config: ModelConfig = field(default_factory=lambda: ModelConfig("fake", Path("fake")))
    submitted: list[Request] = field(default_factory=list)
    aborted: list[tuple[RequestId, RequestStatus]] = field(default_factory=list)

    def check_admission(self, priority: int = 0) -> None:
        pass  # the fake's queue is never full

    def admit(self, requests: Sequence[Request], timeout: float | None = None) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def submit(self, request: Request, constraint: object = None) -> FakeStream:
        self.submitted.append(request)
        last = len(self.tokens) - 1
        events = [
            FakeEvent(t, -0.5, None, self.finish_reason if i == last else None)
            for i, t in enumerate(self.tokens)
        ]
        return FakeStream(request, events)

    def abort(self, stream: FakeStream, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.aborted.append((stream.request.request_id, status))


@dataclass
class SamplingPool(FakePool):
    """FakePool that samples, as the weakest model would: each request with a token constraint
    gets tokens drawn uniformly (seeded by its seed) among those the constraint allows, end of
    text included where it allows that, until the constraint completes (finish "stop") or
    max_tokens runs out ("length"). A request without a constraint gets the scripted tokens."""

    eos_token_ids: frozenset[int] = frozenset()

    def submit(self, request: Request, constraint: object = None) -> FakeStream:
        if constraint is None:
            return super().submit(request)
        assert isinstance(constraint, TokenConstraint)
        self.submitted.append(request)
        params = request.sampling_params
        rng = np.random.default_rng(params.seed)
        tokens: list[int] = []
        finish = "length"
        while len(tokens) < params.max_tokens:
            (mask,) = fill_masks([constraint])
            token = int(rng.choice(allowed_tokens(mask, constraint.vocab_size)))
            if token in self.eos_token_ids:
                finish = "stop"
                break
            tokens.append(token)
            constraint.advance(token)
            if constraint.complete:
                finish = "stop"
                break
        last = len(tokens) - 1
        events = [FakeEvent(t, -0.5, None, finish if i == last else None) for i, t in enumerate(tokens)]
        return FakeStream(request, events)
