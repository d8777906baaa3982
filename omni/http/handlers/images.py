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

from aiohttp import web

from omni.engines.generation import GeneratedImage
from omni.engines.llm import EngineError
from omni.errors import internal_error
from omni.http import sse
from omni.http.access_log import note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.http.state import MODELS
from omni.modalities.outputs.router import OutputRouter
from omni.serving import lifecycle
from omni.serving.lifecycle import ImageGeneration, ImagePreview
from omni.serving.requests.images import ImageGenerationRequest, parse_image_generation_request
from omni.serving.responses import (
    ImageData,
    ImageGenCompletedEvent,
    ImageGenPartialImageEvent,
    ImagesResponse,
    ImageTokensDetails,
    ImageUsage,
)


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
        ImageData(b64_json=_b64(image.data)) if req.response_format == "b64_json" else ImageData(url=image.url)
        for image in images
    ]
    body = ImagesResponse(
        created=int(time.time()),
        data=data,
        output_format=req.output_format,
        size=_size(images[0]),
        quality="auto",
        background="opaque",
        usage=_usage(generation.outputs),
    )
    return await sse.json_response(body)


def _the_image(images: list[GeneratedImage]) -> GeneratedImage:
    # The span grammar and max_tokens make every choice exactly one whole span.
    if len(images) != 1:
        raise internal_error(f"the model's reply held {len(images)} images, not one")
    return images[0]


def _size(image: GeneratedImage) -> str:
    return f"{image.width}x{image.height}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _usage(outputs: list[OutputRouter]) -> ImageUsage:
    """OpenAI's image usage: the prompt's tokens as text input, the image spans' as output."""
    prompt = outputs[0].usage.prompt_tokens  # one prompt for all n
    output = sum(o.usage.completion_tokens for o in outputs)
    return ImageUsage(prompt, ImageTokensDetails(text_tokens=prompt, image_tokens=0), output, prompt + output)


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
                partial = ImageGenPartialImageEvent(
                    partial_image_index=event.index,
                    size=event.size,
                    b64_json=_b64(event.data),
                    created_at=int(time.time()),
                    output_format=req.output_format,
                    quality="auto",
                    background="opaque",
                )
                await sse.send_event(response, partial)
                continue
            remaining -= 1
            if isinstance(event.result, BaseException):
                await sse.send_error_and_done(response, _as_engine_error(event.result))
                return response
            completed = ImageGenCompletedEvent(
                b64_json=_b64(event.result.data),
                created_at=int(time.time()),
                output_format=req.output_format,
                quality="auto",
                background="opaque",
                size=_size(event.result),
                usage=_usage(generation.outputs),
            )
            await sse.send_event(response, completed)
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


def _as_engine_error(exc: BaseException) -> EngineError:
    if isinstance(exc, EngineError):
        return exc
    cause = exc.__cause__
    if isinstance(cause, EngineError):
        return cause
    return EngineError(str(exc) or type(exc).__name__)
