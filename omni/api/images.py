"""POST /v1/images/generations: the handler, and the images API's response format (the
lifecycle is omni.orchestrator.image_generation).

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
from typing import Any

from aiohttp import web

from omni import orchestrator
from omni.api import sse
from omni.api.errors import internal_error
from omni.api.schemas.images import ImageGenerationRequest
from omni.engine import EngineError
from omni.generation import GeneratedImage
from omni.orchestrator import ImageGeneration
from omni.output_router import OutputRouter

_PARTIAL = "image_generation.partial_image"
_COMPLETED = "image_generation.completed"


async def create_image(request: web.Request) -> web.StreamResponse:
    return await orchestrator.image_generation(request, assemble)


async def assemble(request: web.Request, req: ImageGenerationRequest, generation: ImageGeneration) -> web.StreamResponse:
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
    response = await sse.open_event_stream(request)
    done: asyncio.Queue[tuple[int, GeneratedImage | BaseException]] = asyncio.Queue()

    async def draw(index: int, output: OutputRouter) -> None:
        try:
            choices = await sse.collect([output])
            done.put_nowait((index, _the_image(choices[0].images)))
        except Exception as exc:  # handed to the loop below, which ends the stream with it
            done.put_nowait((index, exc))

    tasks = [asyncio.create_task(draw(i, o)) for i, o in enumerate(generation.outputs)]
    previews = generation.previews
    try:
        remaining = len(tasks)
        while remaining:
            next_preview = asyncio.ensure_future(previews.get())
            next_done = asyncio.ensure_future(done.get())
            finished, _ = await asyncio.wait((next_preview, next_done), return_when=asyncio.FIRST_COMPLETED)
            for waiter in (next_preview, next_done):
                if waiter not in finished:
                    waiter.cancel()
            if next_preview in finished:
                await _send_preview(response, req, next_preview.result())
            if next_done in finished:
                _index, result = next_done.result()
                remaining -= 1
                if isinstance(result, BaseException):
                    await sse.send_error_and_done(response, _as_engine_error(result))
                    return response
                while not previews.empty():  # a preview never follows its image
                    await _send_preview(response, req, previews.get_nowait())
                body = {**_event_image(req, result.data), **_described(req, result)}
                await _send(response, _COMPLETED, body | {"usage": _usage(generation.outputs)})
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError, Exception):
                await task
    await sse.send_done(response)
    return response


async def _send_preview(response: web.StreamResponse, req: ImageGenerationRequest, preview: tuple[int, int, bytes, str]) -> None:
    _image, index, data, size = preview
    await _send(response, _PARTIAL, {"partial_image_index": index, "size": size, **_event_image(req, data)})


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
