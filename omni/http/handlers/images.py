"""POST /v1/images/generations: the handler, and the images API's response format (the
lifecycle is omni.serving.lifecycle.image_generation).

Not streamed: {created, data: [{url} | {b64_json}], output_format, size, quality, background,
usage}, as the official client's ImagesResponse reads it. Streamed (stream: true), as OpenAI
streams image generation: `image_generation.partial_image` events (partial_images of them per
image, from intermediate denoising steps) and one `image_generation.completed` event per image,
every image as b64_json, then [DONE].
"""

from __future__ import annotations

import asyncio
import base64
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from omni.serving import lifecycle
from omni.http import sse
from omni.http.access_log import note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.errors import internal_error
from omni.serving.requests.images import ImageGenerationRequest, parse_image_generation_request
from omni.engines.llm import EngineError
from omni.engines.generation import GeneratedImage
from omni.serving.lifecycle import ImageGeneration, ImagePreview
from omni.modalities.outputs.router import OutputRouter
from omni.http.state import MODELS

_PARTIAL = "image_generation.partial_image"
_COMPLETED = "image_generation.completed"


async def create_image(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_image_generation_request, timeout=body_timeout(request))
    generation = await lifecycle.image_generation(request.app[MODELS], req, timeout=request_timeout(request))
    note_generation(request, generation.model.name, generation.generations)
    with generation.admitted():
        return await respond(request, req, generation)


async def respond(request: web.Request, req: ImageGenerationRequest, generation: ImageGeneration) -> web.StreamResponse:
    if req.stream:
        return await _stream(request, req, generation)
    choices = await sse.collect(generation.outputs)
    images = [_the_image(c.images) for c in choices]
    data = [
        {"b64_json": base64.b64encode(image.data).decode()} if req.response_format == "b64_json" else {"url": image.url}
        for image in images
    ]
    body = {"created": int(time.time()), "data": data, **_described(req, images[0]), "usage": _usage(generation.outputs)}
    return await sse.json_response(body)


def _the_image(images: list[GeneratedImage]) -> GeneratedImage:
    # The span grammar and max_tokens make every choice exactly one whole span.
    if len(images) != 1:
        raise internal_error(f"the model's reply held {len(images)} images, not one")
    return images[0]


def _described(req: ImageGenerationRequest, image: GeneratedImage) -> dict[str, Any]:
    return {
        "output_format": req.output_format,
        "size": f"{image.width}x{image.height}",
        "quality": "auto",
        "background": "opaque",
    }


def _usage(outputs: list[OutputRouter]) -> dict[str, Any]:
    """OpenAI's image usage: the prompt's tokens as text input, the image spans' as output."""
    prompt = outputs[0].usage.prompt_tokens  # one prompt for all n
    output = sum(o.usage.completion_tokens for o in outputs)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"text_tokens": prompt, "image_tokens": 0},
        "output_tokens": output,
        "total_tokens": prompt + output,
    }


async def _stream(request: web.Request, req: ImageGenerationRequest, generation: ImageGeneration) -> web.StreamResponse:
    """Each image is drawn by a task of its own. Its previews and, last, the image itself
    arrive on the one queue in the order they happen, so a preview never follows its image."""
    response = await sse.open_event_stream(request)
    events = generation.previews

    async def draw(output: OutputRouter) -> None:
        try:
            choices = await sse.collect([output])
            events.put_nowait(_Drawn(_the_image(choices[0].images)))
        except Exception as exc:  # handed to the loop below, which ends the stream with it
            events.put_nowait(_Drawn(exc))

    tasks = [asyncio.create_task(draw(o)) for o in generation.outputs]
    try:
        remaining = len(tasks)
        while remaining:
            event = await events.get()
            if isinstance(event, ImagePreview):
                body = {"partial_image_index": event.index, "size": event.size, **_event_image(req, event.data)}
                await _send(response, _PARTIAL, body)
                continue
            remaining -= 1
            if isinstance(event.result, BaseException):
                await sse.send_error_and_done(response, _as_engine_error(event.result))
                return response
            body = {**_event_image(req, event.result.data), **_described(req, event.result)}
            await _send(response, _COMPLETED, body | {"usage": _usage(generation.outputs)})
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError, Exception):
                await task
    await sse.send_done(response)
    return response


@dataclass(frozen=True, slots=True)
class _Drawn:
    result: GeneratedImage | BaseException


def _event_image(req: ImageGenerationRequest, data: bytes) -> dict[str, Any]:
    return {
        "b64_json": base64.b64encode(data).decode(),
        "created_at": int(time.time()),
        "output_format": req.output_format,
        "quality": "auto",
        "background": "opaque",
    }


async def _send(response: web.StreamResponse, event: str, body: dict[str, Any]) -> None:
    await sse.send_event(response, {"type": event, **body})


def _as_engine_error(exc: BaseException) -> EngineError:
    if isinstance(exc, EngineError):
        return exc
    cause = exc.__cause__
    if isinstance(cause, EngineError):
        return cause
    return EngineError(str(exc) or type(exc).__name__)
