"""POST /v1/images/generations and /v1/images/edits: the handlers, and the images API's
response format (the lifecycles are omni.serving.images.image_generation and
omni.serving.image_edits.image_edit).

Not streamed: {created, data: [{url} | {b64_json}], output_format, size, quality, background,
usage}, as the official client's ImagesResponse reads it. Streamed (stream: true), as OpenAI
streams image generation: `image_generation.partial_image` events (partial_images of them per
image, from intermediate denoising steps) and one `image_generation.completed` event per image,
every image as b64_json, then [DONE]. An edit's events are `image_edit.partial_image` and
`image_edit.completed`, its previews finished (sized and composited) as its images are.
"""

from __future__ import annotations

import asyncio
import base64
import time
from contextlib import suppress
from dataclasses import dataclass

from aiohttp import web

from omni.engines.llm import EngineError
from omni.errors import internal_error
from omni.http import sse
from omni.http.access_log import note_generation
from omni.http.body import body_timeout, read_image_edit_form, read_parsed, request_timeout
from omni.http.state import MODELS
from omni.modalities.outputs.image import IMAGE, GeneratedImage, ImagePreview
from omni.modalities.outputs.image_chat import decoder_details
from omni.modalities.outputs.router import OutputRouter
from omni.serving import image_edits
from omni.serving import images as lifecycle
from omni.serving.bodies import (
    ImageData,
    ImageEditCompletedEvent,
    ImageEditPartialImageEvent,
    ImageGenCompletedEvent,
    ImageGenPartialImageEvent,
    ImagesResponse,
    ImageTokensDetails,
    ImageUsage,
)
from omni.serving.images import ImageGeneration
from omni.serving.prepared import max_upload_bytes
from omni.serving.requests.image_edits import ImageEditFields, parse_image_edit_request
from omni.serving.requests.images import ImageGenerationRequest, parse_image_generation_request


async def create_image(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_image_generation_request, timeout=body_timeout(request))
    generation = await lifecycle.image_generation(request.app[MODELS], req, timeout=request_timeout(request))
    note_generation(request, generation.model.name, generation.generations)
    with generation.admitted():
        return await respond(request, req, generation)


async def create_image_edit(request: web.Request) -> web.StreamResponse:
    models = request.app[MODELS]
    max_file_bytes = max_upload_bytes(models)
    form = await read_image_edit_form(request, max_file_bytes=max_file_bytes, timeout=body_timeout(request))
    req = parse_image_edit_request(form)
    generation = await image_edits.image_edit(models, req, timeout=request_timeout(request))
    note_generation(request, generation.model.name, generation.generations)
    with generation.admitted():
        return await respond(request, req, generation, _EDIT_EVENTS)


@dataclass(frozen=True, slots=True)
class _Events:
    partial: type[ImageGenPartialImageEvent] | type[ImageEditPartialImageEvent]
    completed: type[ImageGenCompletedEvent] | type[ImageEditCompletedEvent]


_GENERATION_EVENTS = _Events(ImageGenPartialImageEvent, ImageGenCompletedEvent)
_EDIT_EVENTS = _Events(ImageEditPartialImageEvent, ImageEditCompletedEvent)


async def respond(
    request: web.Request,
    req: ImageGenerationRequest | ImageEditFields,
    generation: ImageGeneration,
    events: _Events = _GENERATION_EVENTS,
) -> web.StreamResponse:
    if req.stream:
        return await _stream(request, req, generation, events)
    choices = await sse.collect(generation.outputs)
    images = [_the_image(IMAGE.pieces(c)) for c in choices]
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
        usage=_usage(generation, images),
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


def _usage(generation: ImageGeneration, drawn: list[GeneratedImage]) -> ImageUsage:
    """OpenAI's image usage: the prompt's tokens as input (an edit's input images' apart from
    the text's), the image spans' as output; and ours, the DiT blocks the drawn images took."""
    outputs = generation.outputs
    prompt = outputs[0].usage.prompt_tokens  # one prompt for all n
    output = sum(o.usage.completion_tokens for o in outputs)
    images = generation.num_image_tokens
    details = ImageTokensDetails(text_tokens=prompt - images, image_tokens=images)
    return ImageUsage(prompt, details, output, prompt + output, decoder_details(drawn))


async def _stream(
    request: web.Request, req: ImageGenerationRequest | ImageEditFields, generation: ImageGeneration, kinds: _Events
) -> web.StreamResponse:
    """Each image is drawn by a task of its own. Its previews and, last, the image itself
    arrive on the one queue in the order they happen, so a preview never follows its image."""
    response = await sse.open_event_stream(request)
    events = generation.previews

    async def draw(output: OutputRouter) -> None:
        try:
            choices = await sse.collect([output])
            events.put_nowait(_Drawn(_the_image(IMAGE.pieces(choices[0]))))
        except Exception as exc:  # handed to the loop below, which ends the stream with it
            events.put_nowait(_Drawn(exc))

    tasks = [asyncio.create_task(draw(o)) for o in generation.outputs]
    drawn: list[GeneratedImage] = []  # the images so far: each completed event's usage counts them
    try:
        remaining = len(tasks)
        while remaining:
            event = await events.get()
            if isinstance(event, ImagePreview):
                data, size = event.data, event.size
                if generation.canvas is not None:  # as the image will be: its size, the input outside the mask
                    data, width, height = await asyncio.to_thread(
                        generation.canvas.finish, data, req.output_format, req.output_compression
                    )
                    size = f"{width}x{height}"
                partial = kinds.partial(
                    partial_image_index=event.index,
                    size=size,
                    b64_json=_b64(data),
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
            drawn.append(event.result)
            completed = kinds.completed(
                b64_json=_b64(event.result.data),
                created_at=int(time.time()),
                output_format=req.output_format,
                quality="auto",
                background="opaque",
                size=_size(event.result),
                usage=_usage(generation, drawn),
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
