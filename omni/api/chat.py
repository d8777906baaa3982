"""POST /v1/chat/completions (text in, text out; streamed or not)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni.api import sse
from omni.api.errors import bad_request, service_unavailable
from omni.api.logprobs import chat_logprob_entries
from omni.api.schemas import (
    ChatCompletionRequest,
    parse_chat_completion_request,
    read_json,
    sampling_params,
)
from omni.generation import Delta, Generation, Usage, choice_params, new_request_id
from omni.served_model import ServedModel
from omni.state import MODELS
from scheduler.request import MediaSpan


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req = parse_chat_completion_request(body)
    model = request.app[MODELS].get(req.model)
    if not model.pool.serving:  # a media request also needs the encoder: see MediaPipeline
        raise service_unavailable("The model is starting; retry shortly.", retry_after_s=5)
    prompt_ids, media = await _render_prompt(model, req)
    params = sampling_params(
        req, max_model_len=model.pool.max_model_len, num_prompt_tokens=len(prompt_ids)
    )
    completion_id = new_request_id("chatcmpl")
    generations = [
        Generation(
            model,
            prompt_ids,
            choice_params(params, i),
            req.stop,
            f"{completion_id}-{i}",
            req.skip_special_tokens,
            media,
        )
        for i in range(req.n)
    ]
    if req.stream:
        return await _stream(request, req, model, completion_id, generations)
    return await _complete(req, model, completion_id, generations)


async def _complete(
    req: ChatCompletionRequest,
    model: ServedModel,
    completion_id: str,
    generations: list[Generation],
) -> web.Response:
    collected = await sse.collect(generations)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": (
                {"content": chat_logprob_entries(model.tokenizer, c.logprobs)}
                if req.logprobs
                else None
            ),
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(collected)
    ]
    body = sse.completion_body(completion_id, "chat.completion", model.name, choices)
    return web.json_response(body | {"usage": _usage(generations).to_json()})


async def _stream(
    request: web.Request,
    req: ChatCompletionRequest,
    model: ServedModel,
    completion_id: str,
    generations: list[Generation],
) -> web.StreamResponse:
    response = await sse.open_event_stream(request)
    stream = sse.ChunkStream(response, completion_id, "chat.completion.chunk", model.name, req.include_usage)
    for i in range(len(generations)):  # the role comes first, in a chunk of its own
        role = {"role": "assistant", "content": ""}
        await stream.send([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])

    def choice(index: int, delta: Delta) -> dict[str, Any] | None:
        if not delta.text and delta.finish_reason is None and not req.logprobs:
            return None  # a token that completes no character yet
        return {
            "index": index,
            "delta": {"content": delta.text} if delta.text else {},
            "logprobs": (
                {"content": chat_logprob_entries(model.tokenizer, delta.logprobs)}
                if req.logprobs
                else None
            ),
            "finish_reason": delta.finish_reason,
        }

    await stream.run(generations, choice, lambda: _usage(generations))
    return response


async def _render_prompt(
    model: ServedModel, req: ChatCompletionRequest
) -> tuple[list[int], tuple[MediaSpan, ...]]:
    """Prompt token ids with media placeholders expanded, and the spans to inject."""
    pipeline = model.media
    has_media = any(
        isinstance(m.content, tuple) and any(p.type != "text" for p in m.content)
        for m in req.messages
    )
    if pipeline is None or not has_media:
        if has_media:
            _reject_media(req)
        return _apply_template(model, list(req.messages)), ()
    items = await pipeline.load_items(req.messages)
    prompt_ids = _apply_template(model, pipeline.template_messages(req.messages, items))
    prompt = await pipeline.expand(prompt_ids, items)
    return prompt.token_ids, prompt.media


def _apply_template(model: ServedModel, messages: list[Any]) -> list[int]:
    try:
        return model.tokenizer.apply_chat_template(messages)
    except ValueError as exc:
        raise bad_request(f"Could not render the chat template: {exc}", param="messages")


def _reject_media(req: ChatCompletionRequest) -> None:
    """A text-only model (no encoder components) refuses media parts by name."""
    for i, message in enumerate(req.messages):
        if isinstance(message.content, tuple):
            for j, part in enumerate(message.content):
                if part.type != "text":
                    raise bad_request(
                        f"This model does not accept {part.type} input.",
                        param=f"messages[{i}].content[{j}]",
                        code="unsupported_content_type",
                    )


def _usage(generations: list[Generation]) -> Usage:
    # The n choices share one prompt: counted once, as OpenAI does.
    return Usage(
        prompt_tokens=generations[0].usage.prompt_tokens,
        cached_tokens=generations[0].usage.cached_tokens,
        completion_tokens=sum(g.usage.completion_tokens for g in generations),
    )
