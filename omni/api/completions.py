"""POST /v1/completions (legacy text completions: one or more prompts, n choices each): the
handler, and the completions response format (the lifecycle's "assemble" step). The
lifecycle itself is omni.orchestrator.completion."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni import orchestrator
from omni.api import sse
from omni.api.logprobs import completion_logprobs
from omni.api.schemas import CompletionRequest
from omni.generation import Delta, Usage
from omni.orchestrator import Completion
from omni.output_router import OutputRouter


async def create_completion(request: web.Request) -> web.StreamResponse:
    return await orchestrator.completion(request, assemble)


async def assemble(
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


async def _complete(req: CompletionRequest, completion: Completion) -> web.Response:
    tokenizer = completion.model.tokenizer
    collected = await sse.collect(completion.outputs)
    choices = [
        {
            "index": i,
            "text": c.text,
            "logprobs": (
                completion_logprobs(tokenizer, c.logprobs, 0) if req.logprobs is not None else None
            ),
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(collected)
    ]
    body = sse.completion_body(completion.id, "text_completion", completion.model.name, choices)
    return web.json_response(body | {"usage": _usage(completion.outputs, req.n).to_json()})


async def _stream(
    request: web.Request, req: CompletionRequest, completion: Completion
) -> web.StreamResponse:
    tokenizer = completion.model.tokenizer
    response = await sse.open_event_stream(request)
    stream = sse.ChunkStream(
        response, completion.id, "text_completion", completion.model.name, req.include_usage
    )
    offsets = [0] * len(completion.outputs)  # characters of each choice sent so far (logprob offsets)

    def choice(index: int, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and delta.finish_reason is None and req.logprobs is None:
            return None
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(tokenizer, delta.logprobs, offsets[index])
        offsets[index] += len(delta.text)
        return {"index": index, "text": delta.text, "logprobs": lp, "finish_reason": delta.finish_reason}

    await stream.run(completion.outputs, choice, lambda: _usage(completion.outputs, req.n))
    return response
