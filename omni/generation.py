"""One completion choice: submit a request, detokenize its tokens, stop at stop strings.

Shared by /v1/chat/completions and /v1/completions. Whatever way the consumer leaves
(finished, stop string, client gone, cancelled handler), the request is aborted in the
engine so its KV blocks are freed before the next step.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from omni.constrained.constraint import TokenConstraint
from omni.detokenizer import IncrementalDetokenizer
from omni.served_model import ServedModel
from scheduler.request import MediaSpan, Request, RequestId, RequestStatus, SamplingParams


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens

    def to_json(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """The n choices of one seeded request differ from each other yet repeat as a set."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + index)


class Generation:
    """Iterate deltas of one choice; `usage` is complete once iteration ends."""

    def __init__(
        self,
        model: ServedModel,
        prompt_token_ids: list[int],
        params: SamplingParams,
        stop: tuple[str, ...],
        request_id: str,
        skip_special_tokens: bool = True,
        media: tuple[MediaSpan, ...] = (),
        constraint: TokenConstraint | None = None,
        keep_special: frozenset[int] = frozenset(),
    ) -> None:
        self.model = model
        self.request = Request(
            request_id=RequestId(request_id),
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_ids=model.tokenizer.eos_token_ids,
            media=media,
        )
        self.stop = stop
        self.constraint = constraint  # the choice's own grammar matcher, if it has one
        self.skip_special_tokens = skip_special_tokens
        self.keep_special = keep_special  # markup the chat parsers read, kept in the text
        self.usage = Usage(prompt_tokens=len(prompt_token_ids))

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        pool = self.model.pool
        stream = pool.submit(self.request, self.constraint)
        detok = IncrementalDetokenizer(
            self.model.tokenizer,
            skip_special_tokens=self.skip_special_tokens,
            keep_special=self.keep_special,
            stop=self.stop,
        )
        finished = False
        try:
            async for event in stream:
                self.usage.completion_tokens += 1
                text = detok.push([event.token_id])
                logprobs = []
                if event.logprob is not None:
                    logprobs.append(
                        TokenLogprob(event.token_id, event.logprob, event.top_logprobs or [])
                    )
                if detok.stopped:
                    finished = True
                    pool.abort(stream, RequestStatus.FINISHED_STOPPED)
                    yield Delta(text, [event.token_id], logprobs, "stop")
                    return
                if event.finish_reason is not None:
                    finished = True
                    text += detok.finish()
                    yield Delta(text, [event.token_id], logprobs, event.finish_reason)
                    return
                yield Delta(text, [event.token_id], logprobs)
        finally:
            self.usage.cached_tokens = self.request.num_cached_tokens
            if not finished:
                pool.abort(stream)
