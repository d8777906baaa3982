"""POST /v1/chat/completions: the handler, and the chat response format (the lifecycle's
"assemble" step). The lifecycle itself is omni.orchestrator.chat_completion."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni import orchestrator
from omni.api import sse
from omni.api.logprobs import chat_logprob_entries
from omni.api.schemas import ChatCompletionRequest
from omni.generation import Delta, Usage
from omni.orchestrator import Completion
from omni.output_router import OutputRouter


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    return await orchestrator.chat_completion(request, assemble)


async def assemble(
    request: web.Request, req: ChatCompletionRequest, completion: Completion
) -> web.StreamResponse:
    if req.stream:
        return await _stream(request, req, completion)
    return await _complete(req, completion)


async def _complete(req: ChatCompletionRequest, completion: Completion) -> web.Response:
    tokenizer = completion.model.tokenizer
    collected = await sse.collect(completion.outputs)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": (
                {"content": chat_logprob_entries(tokenizer, c.logprobs)} if req.logprobs else None
            ),
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(collected)
    ]
    body = sse.completion_body(completion.id, "chat.completion", completion.model.name, choices)
    return web.json_response(body | {"usage": _usage(completion.outputs).to_json()})


async def _stream(
    request: web.Request, req: ChatCompletionRequest, completion: Completion
) -> web.StreamResponse:
    tokenizer = completion.model.tokenizer
    response = await sse.open_event_stream(request)
    stream = sse.ChunkStream(
        response, completion.id, "chat.completion.chunk", completion.model.name, req.include_usage
    )
    for i in range(len(completion.outputs)):  # the role comes first, in a chunk of its own
        role = {"role": "assistant", "content": ""}
        await stream.send([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])

    def choice(index: int, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and delta.finish_reason is None and not req.logprobs:
            return None  # a token that completes no character yet
        return {
            "index": index,
            "delta": {"content": delta.text} if delta.text else {},
            "logprobs": (
                {"content": chat_logprob_entries(tokenizer, delta.logprobs)} if req.logprobs else None
            ),
            "finish_reason": delta.finish_reason,
        }

    await stream.run(completion.outputs, choice, lambda: _usage(completion.outputs))
    return response


def _usage(outputs: list[OutputRouter]) -> Usage:
    # The n choices share one prompt: counted once, as OpenAI does.
    return Usage(
        prompt_tokens=outputs[0].usage.prompt_tokens,
        cached_tokens=outputs[0].usage.cached_tokens,
        completion_tokens=sum(o.usage.completion_tokens for o in outputs),
    )
