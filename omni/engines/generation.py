"""One completion choice: submit a request, detokenize its tokens, stop at stop strings.

Shared by /v1/chat/completions and /v1/completions. Whatever way the consumer leaves
(finished, stop string, client gone, cancelled handler), the request is aborted in the
engine so its KV blocks are freed before the next step.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from omni.engines.llm import PrefillDone
from omni.engines.pool import ModelPool
from omni.shared import protocol
from omni.text.constrained.constraint import TokenConstraint
from omni.text.detokenizer import IncrementalDetokenizer
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan, Request, RequestId, RequestStatus, SamplingParams


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class PromptLogprob:
    """A prompt token's logprob given the tokens before it, its rank there (1: the most
    likely token), and the top alternatives there, best first."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


# Per prompt position: None for the first token (nothing predicts it), then one entry each.
PromptLogprobs = list[PromptLogprob | None]


@dataclass(slots=True)
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    # Where each token's text starts in the choice's whole text (its characters up to here
    # and beyond): text[text_offsets[i]:text_offsets[i + 1]] is what token i added.
    text_offsets: list[int] = field(default_factory=list)
    # What the output spans completed on this Delta (omni/modalities/outputs/router.py), by output
    # kind's name: the images drawn, the audio chunks spoken (OutputKind.pieces reads them typed).
    pieces: dict[str, list[Any]] = field(default_factory=dict)
    # On the last delta, what stopped it (vLLM's stop_reason): the stop string it hit, or the
    # client's stop token id it sampled; None for EOS, the length or anything else.
    stop_reason: str | int | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def response_id(prefix: str, client_request_id: str | None, generated_id: str) -> str:
    """The response's id: vLLM's "<prefix>-<request_id>" when the client named the request
    (request_id), else the generated one. The engine's request ids stay generated either way:
    two requests may carry the same client id."""
    return generated_id if client_request_id is None else f"{prefix}-{client_request_id}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """The n choices of one seeded request differ from each other yet repeat as a set."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + index)


def prompt_logprobs(
    prompt_token_ids: list[int], parts: list[protocol.PromptLogprobs]
) -> PromptLogprobs:
    """The worker's PromptLogprobs messages of one request, in order, as one entry per prompt
    position."""
    entries: PromptLogprobs = [None]
    for part in parts:
        if part.start != len(entries):
            raise RuntimeError(f"prompt logprobs from {part.start}, expected {len(entries)}")
        for i, logprob in enumerate(part.token_logprobs):
            top = list(zip(part.top_token_ids[i], part.top_logprobs[i]))
            token_id = prompt_token_ids[part.start + i]
            entries.append(PromptLogprob(token_id, logprob, part.ranks[i], top))
    if len(entries) != len(prompt_token_ids):
        raise RuntimeError(f"prompt logprobs for {len(entries)} of {len(prompt_token_ids)} tokens")
    return entries


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How a choice's tokens become its text."""

    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one written
    skip_special_tokens: bool = True
    keep_special: frozenset[int] = frozenset()  # markup the chat parsers read, kept in the text
    include_stop_str_in_output: bool = False  # the matched stop string (or stop token) stays in
    stop_token_ids: tuple[int, ...] = ()  # the client's: one that ends a choice is its stop_reason


class Generation:
    """Iterate deltas of one choice; `usage` is complete once iteration ends, and
    `prompt_logprobs` (when the params ask for them) once the first delta is out."""

    def __init__(
        self,
        pool: ModelPool,
        tokenizer: TextTokenizer,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        *,
        output: OutputOptions,
        media: tuple[MediaSpan, ...] = (),
        constraint: TokenConstraint | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.request = Request(
            request_id=RequestId(request_id),
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_ids=tokenizer.eos_token_ids,
            media=media,
            cache_salt=cache_salt,
        )
        self.output = output
        self.constraint = constraint  # the choice's own grammar matcher, if it has one
        self.usage = Usage(prompt_tokens=len(prompt_token_ids))
        self.first_token_time: float | None = None  # time.monotonic() of its first token
        self.prompt_logprobs: PromptLogprobs | None = None

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        params = self.request.sampling_params
        if params.prefill_only and params.prompt_logprobs is None:
            # Nothing the prompt's computation gives would reach the client: skip the engine.
            yield Delta("", [], finish_reason=RequestStatus.FINISHED_LENGTH.value)
            return
        pool, output = self.pool, self.output
        stop_token_ids = frozenset(params.stop_token_ids) | self.request.eos_token_ids
        stream = pool.submit(self.request, self.constraint)
        detok = IncrementalDetokenizer(
            self.tokenizer,
            skip_special_tokens=output.skip_special_tokens,
            keep_special=output.keep_special,
            stop=output.stop,
            include_stop_str_in_output=output.include_stop_str_in_output,
        )
        finished = False
        try:
            async for event in stream:
                if params.prompt_logprobs is not None and self.prompt_logprobs is None:
                    # The step that computed the last prompt token also made this event.
                    self.prompt_logprobs = prompt_logprobs(
                        self.request.prompt_token_ids, stream.prompt_logprobs
                    )
                self.usage.cached_tokens = self.request.num_cached_tokens  # known by now
                if isinstance(event, PrefillDone):
                    finished = True
                    yield Delta("", [], finish_reason=event.finish_reason)
                    return
                self.usage.completion_tokens += 1
                if self.first_token_time is None:
                    self.first_token_time = time.monotonic()
                offsets = [detok.num_decoded_chars]
                # A stop token ends the text without adding to it (as vLLM has it), unless the
                # client asked to see what stopped it.
                ends_on_stop_token = (
                    event.finish_reason == RequestStatus.FINISHED_STOPPED.value
                    and event.token_id in stop_token_ids
                    and not output.include_stop_str_in_output
                )
                text = "" if ends_on_stop_token else detok.push([event.token_id])
                logprobs = []
                if event.logprob is not None:
                    logprobs.append(
                        TokenLogprob(event.token_id, event.logprob, event.top_logprobs or [])
                    )
                if detok.stopped:
                    finished = True
                    pool.abort(stream, RequestStatus.FINISHED_STOPPED)
                    yield Delta(text, [event.token_id], logprobs, "stop", offsets, stop_reason=detok.stop_reason)
                    return
                if event.finish_reason is not None:
                    finished = True
                    text += detok.finish()
                    stopped_by = event.token_id if event.token_id in output.stop_token_ids else None
                    yield Delta(text, [event.token_id], logprobs, event.finish_reason, offsets, stop_reason=stopped_by)
                    return
                yield Delta(text, [event.token_id], logprobs, None, offsets)
        finally:
            self.usage.cached_tokens = self.request.num_cached_tokens
            if not finished:
                pool.abort(stream)
