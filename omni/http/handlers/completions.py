"""POST /v1/completions (legacy text completions: one or more prompts, n choices each): the
handler, and the completions response format. The lifecycle itself is
omni.serving.completions.completion."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from msgspec import UNSET, UnsetType

from omni.engines.generation import Delta, PromptLogprobs, TokenLogprob, Usage
from omni.http import sse
from omni.http.access_log import client_request_id, note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.http.logprobs import OffsetToken, completion_logprobs, prompt_logprobs_json
from omni.http.state import MODELS
from omni.modalities.outputs.router import OutputRouter
from omni.serving import completions as lifecycle
from omni.serving.bodies import (
    ChunkUsage,
    CompletionLogprobs,
    PromptTokenLogprob,
    TextChoice,
    TextCompletion,
    TextCompletionChunk,
    finish_reason,
    usage_body,
)
from omni.serving.prepared import Completion
from omni.serving.requests import CompletionRequest, parse_completion_request
from omni.text.detokenizer import token_offsets
from omni.text.tokenizer import TextTokenizer


async def create_completion(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_completion_request, timeout=body_timeout(request))
    completion = await lifecycle.completion(
        request.app[MODELS], req, timeout=request_timeout(request), client_request_id=client_request_id(request)
    )
    note_generation(request, completion.model.name, completion.generations)
    with completion.admitted():
        return await respond(request, req, completion)


async def respond(
    request: web.Request, req: CompletionRequest, completion: Completion
) -> web.StreamResponse:
    if req.stream:
        return await _stream(request, req, completion)
    return await _complete(req, completion)


def _usage(outputs: list[OutputRouter], n: int) -> Usage:
    usage = Usage()
    for index, o in enumerate(outputs):
        usage.completion_tokens += o.usage.completion_tokens
        if index % n == 0:  # each prompt counted once, as OpenAI does
            usage.prompt_tokens += o.usage.prompt_tokens
            usage.cached_tokens += o.usage.cached_tokens
    return usage


@dataclass(frozen=True, slots=True)
class _Echo:
    """A choice's prompt as its text starts: the text, and where each prompt token's starts."""

    text: str
    text_offsets: list[int]


def _echoes(req: CompletionRequest, completion: Completion) -> list[_Echo] | None:
    """Each choice's echoed prompt (None without echo). A text prompt is echoed as sent, unless
    truncate_prompt_tokens may have cut it, when it is its kept tokens' text; a token id prompt
    is its tokens' text, special tokens shown or not as skip_special_tokens says. Offsets come
    from decoding the prompt tokens: for a text prompt with every special token written out,
    as the client typed them."""
    if not req.echo:
        return None
    tokenizer = completion.model.tokenizer
    echoes = []
    for p, prompt in enumerate(req.prompts):
        ids = completion.outputs[p * req.n].generation.request.prompt_token_ids
        is_text = isinstance(prompt, str)
        text, offsets = token_offsets(
            tokenizer, ids, skip_special_tokens=req.skip_special_tokens and not is_text
        )
        if isinstance(prompt, str) and req.truncate_prompt_tokens is None:
            text = prompt
        echoes += [_Echo(text, offsets)] * req.n
    return echoes


def _offset_tokens(
    logprobs: Sequence[TokenLogprob], text_offsets: Sequence[int], shift: int
) -> list[OffsetToken]:
    """Generated tokens' logprobs; their offsets move past an echoed prompt of shift characters."""
    return [
        OffsetToken(lp.token_id, lp.logprob, lp.top, shift + offset)
        for lp, offset in zip(logprobs, text_offsets, strict=True)
    ]


def _prompt_tokens(
    echo: _Echo, prompt_ids: Sequence[int], prompt_logprobs: PromptLogprobs | None, num_top: int
) -> list[OffsetToken]:
    """An echoed prompt's tokens in completions' logprobs: the first has no logprob."""
    assert prompt_logprobs is not None  # echo with logprobs asks the worker for them
    tokens = []
    for token_id, entry, offset in zip(prompt_ids, prompt_logprobs, echo.text_offsets, strict=True):
        if entry is None:
            tokens.append(OffsetToken(token_id, None, None, offset))
        else:
            tokens.append(OffsetToken(token_id, entry.logprob, entry.top[:num_top], offset))
    return tokens


def _prompt_logprobs_field(
    tokenizer: TextTokenizer, req: CompletionRequest, output: OutputRouter
) -> list[dict[str, PromptTokenLogprob] | None] | UnsetType:
    if req.prompt_logprobs is None or req.stream:
        return UNSET
    entries = output.generation.prompt_logprobs
    assert entries is not None  # asked for, and the choice has run
    return prompt_logprobs_json(tokenizer, entries, req.prompt_logprobs)


async def _complete(req: CompletionRequest, completion: Completion) -> web.Response:
    tokenizer = completion.model.tokenizer
    collected = await sse.collect(completion.outputs)
    echoes = _echoes(req, completion)
    choices = []
    for i, (c, output) in enumerate(zip(collected, completion.outputs)):
        echo = echoes[i] if echoes is not None else None
        prefix = echo.text if echo is not None else ""
        logprobs = None
        if req.logprobs is not None:
            tokens = _offset_tokens(c.logprobs, c.text_offsets, len(prefix))
            if echo is not None:
                prompt_ids = output.generation.request.prompt_token_ids
                prompt = _prompt_tokens(echo, prompt_ids, output.generation.prompt_logprobs, req.logprobs)
                tokens = prompt + tokens
            logprobs = completion_logprobs(tokenizer, tokens, as_token_ids=req.return_tokens_as_token_ids)
        choices.append(
            TextChoice(
                index=i,
                text=prefix + c.text,
                logprobs=logprobs,
                finish_reason=finish_reason(c.finish_reason),
                stop_reason=c.stop_reason,
                prompt_logprobs=_prompt_logprobs_field(tokenizer, req, output),
            )
        )
    body = TextCompletion(
        id=completion.id,
        object="text_completion",
        created=int(time.time()),
        model=completion.model.name,
        choices=choices,
        usage=usage_body(_usage(completion.outputs, req.n)),
    )
    num_items = sum(len(c.logprobs) for c in collected)
    if req.echo or req.prompt_logprobs is not None:  # each choice carries its prompt's tokens
        num_items += sum(len(o.generation.request.prompt_token_ids) for o in completion.outputs)
    return await sse.json_response(body, num_items=num_items)


async def _stream(
    request: web.Request, req: CompletionRequest, completion: Completion
) -> web.StreamResponse:
    tokenizer = completion.model.tokenizer
    response = await sse.open_event_stream(request)
    created, name = int(time.time()), completion.model.name

    def chunk(choices: list[TextChoice], usage: ChunkUsage) -> TextCompletionChunk:
        return TextCompletionChunk(completion.id, "text_completion", created, name, choices, usage)

    stream = sse.ChunkStream(response, chunk, req.include_usage, req.continuous_usage)
    echoes = _echoes(req, completion)
    echoed = [False] * len(completion.outputs)  # the prompt goes out with a choice's first chunk

    def choice(index: int, delta: Delta) -> TextChoice | None:
        prefix, prompt = "", []
        shift = len(echoes[index].text) if echoes is not None else 0
        if echoes is not None and not echoed[index]:
            echoed[index] = True
            prefix = echoes[index].text
            if req.logprobs is not None:
                generation = completion.outputs[index].generation
                prompt = _prompt_tokens(
                    echoes[index], generation.request.prompt_token_ids, generation.prompt_logprobs, req.logprobs
                )
        if not prefix and not delta.text and delta.finish_reason is None and req.logprobs is None:
            return None
        lp: CompletionLogprobs | None = None
        if req.logprobs is not None:
            tokens = prompt + _offset_tokens(delta.logprobs, delta.text_offsets, shift)
            lp = completion_logprobs(tokenizer, tokens, as_token_ids=req.return_tokens_as_token_ids)
        body = TextChoice(
            index=index, text=prefix + delta.text, logprobs=lp, finish_reason=finish_reason(delta.finish_reason)
        )
        if delta.finish_reason is not None:
            body.stop_reason = delta.stop_reason
        return body

    await stream.run(completion.outputs, choice, lambda: usage_body(_usage(completion.outputs, req.n)))
    return response
