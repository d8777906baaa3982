"""The request lifecycle, in one place: one function per endpoint that reads top-down.

    parse -> model -> media -> prompt -> generate -> route output -> assemble

Each step lives in the module that owns its noun: parsing in omni/api/schemas, media items in
omni/media_input, prompt building in omni/prompt.py, one choice's tokens in omni/generation.py,
output spans in omni/output_router.py. Assembly (the JSON body or the SSE chunks) is the
endpoint's own response format, so its handler in omni/api passes it in: the API layer calls
down into this module, never the other way round.

Nothing runs on a worker until assembly iterates the outputs: Generation submits its request
when its deltas are first asked for, so an error in an earlier step costs no engine work.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from aiohttp import web

from omni.access_log import note_generation
from omni.api.errors import bad_request, service_unavailable
from omni.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat_completion_request,
    parse_completion_request,
    read_json,
    sampling_params,
)
from omni.api.schemas.fields import request_timeout, truncate_prompt, truncated_media
from omni.api.schemas.images import ImageGenerationRequest, parse_image_generation_request
from omni.chat_output import OutputFormat
from omni.chat_turns import ban_images, ban_tool_markup, chat_images, check_tool_choice, output_format, tool_grammar
from omni.choice_constraints import ChoiceConstraints, ImageSpans
from omni.constrained.compiler import CompiledGrammar
from omni.generation import Generation, choice_params, new_request_id, response_id
from omni.image_output import ImageSettings
from omni.output_router import OutputRouter
from omni.prompt import chat_prompt, completion_prompts, load_media
from omni.served_model import ServedModel
from omni.state import CONFIG, MODELS
from scheduler.request import SamplingParams


@dataclass(frozen=True, slots=True)
class Completion:
    """What assembly gets: every choice's routed output, in choice index order, not yet run."""

    id: str
    model: ServedModel
    outputs: list[OutputRouter]
    output_format: OutputFormat = OutputFormat()  # chat: how each choice's text is read back
    inline_images: bool = False  # chat: images are in the text (tool call arguments), not parts


R = TypeVar("R", ChatCompletionRequest, CompletionRequest)
# (the HTTP request, the parsed body, the completion) -> the response: JSON, or SSE if req.stream
Assemble: TypeAlias = Callable[[web.Request, R, Completion], Awaitable[web.StreamResponse]]


async def chat_completion(
    request: web.Request, assemble: Assemble[ChatCompletionRequest]
) -> web.StreamResponse:
    req = parse_chat_completion_request(await read_json(request, timeout=body_timeout(request)))
    timeout = request_timeout(request)
    model = _model(request, req.model)
    check_tool_choice(model, req)
    check_serving(model)  # before media: no fetching or encoding for a model that cannot answer
    model.pool.check_admission()  # nor for one whose queue is full (429)
    items = await load_media(model, req)
    prompt = await chat_prompt(model, req, items)
    token_ids = truncate_prompt(prompt.token_ids, req, model.pool.max_model_len)
    media = truncated_media(prompt.media, len(prompt.token_ids) - len(token_ids))
    params = sampling_params(
        req,
        max_model_len=model.pool.max_model_len,
        num_prompt_tokens=len(token_ids),
        tokenizer=model.tokenizer,
        max_logprobs=model.pool.config.max_logprobs,
    )
    params = ban_images(model, req, ban_tool_markup(model, req, params))
    images = chat_images(model, req)
    fmt = output_format(model, req, token_ids)
    grammar = await _grammar(model, req) if req.grammar is not None else await tool_grammar(model, req, params.max_tokens)
    spans = images.spans() if images is not None else None
    constraints = ChoiceConstraints(model, req, grammar, token_ids, params.max_tokens, images=spans)
    keep_special = model.tokenizer.special_ids(*fmt.markup_tokens)
    completion_id = new_request_id("chatcmpl")
    generations = [
        Generation(
            model,
            token_ids,
            choice_params(params, i),
            req.stop,
            f"{completion_id}-{i}",
            req.skip_special_tokens,
            media,
            constraints.new(),
            keep_special,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
        for i in range(req.n)
    ]
    outputs = [OutputRouter(g, images.route(i) if images is not None else None) for i, g in enumerate(generations)]
    completion_out = Completion(
        response_id("chatcmpl", req.request_id, completion_id), model, outputs, fmt,
        inline_images=images is not None and images.inline,
    )  # fmt: skip
    note_generation(request, model.name, generations)
    with model.pool.admit([g.request for g in generations], timeout):  # or a 429, before any streaming
        return await assemble(request, req, completion_out)


async def completion(request: web.Request, assemble: Assemble[CompletionRequest]) -> web.StreamResponse:
    req = parse_completion_request(await read_json(request, timeout=body_timeout(request)))
    timeout = request_timeout(request)
    model = _model(request, req.model)
    prompts = await completion_prompts(model, req)  # no media: a malformed prompt is a 400 even while starting
    check_serving(model)
    model.pool.check_admission()
    grammar = await _grammar(model, req)
    completion_id = new_request_id("cmpl")
    max_model_len = model.pool.max_model_len
    generations = []
    for p, full in enumerate(prompts):  # n choices per prompt: choice index = p * n + i
        ids = truncate_prompt(full, req, max_model_len)
        params = sampling_params(
            req,
            max_model_len=max_model_len,
            num_prompt_tokens=len(ids),
            tokenizer=model.tokenizer,
            max_logprobs=model.pool.config.max_logprobs,
        )
        constraints = ChoiceConstraints(model, req, grammar, ids, params.max_tokens)
        generations += [
            Generation(
                model,
                ids,
                choice_params(params, i),
                req.stop,
                f"{completion_id}-{p * req.n + i}",
                req.skip_special_tokens,
                constraint=constraints.new(),
                include_stop_str_in_output=req.include_stop_str_in_output,
            )
            for i in range(req.n)
        ]
    outputs = [OutputRouter(g) for g in generations]
    completion_out = Completion(response_id("cmpl", req.request_id, completion_id), model, outputs)
    note_generation(request, model.name, generations)
    with model.pool.admit([g.request for g in generations], timeout):
        return await assemble(request, req, completion_out)


@dataclass(frozen=True, slots=True)
class ImagePreview:
    image: int  # which of the request's n images
    index: int  # its previews count from 0
    data: bytes
    size: str  # "WxH"


@dataclass(frozen=True, slots=True)
class ImageGeneration:
    """What the images API's assembly gets: one routed output per image (each draws exactly
    one), not yet run, and the queue its previews arrive on, in the order they are made.
    Assembly may put its own events on the same queue (an image finished), so that one
    consumer sees both in the order they happened."""

    model: ServedModel
    outputs: list[OutputRouter]
    previews: asyncio.Queue[Any]  # ImagePreview, and what assembly puts there itself


ImageAssemble: TypeAlias = Callable[[web.Request, ImageGenerationRequest, ImageGeneration], Awaitable[web.StreamResponse]]


async def image_generation(request: web.Request, assemble: ImageAssemble) -> web.StreamResponse:
    """POST /v1/images/generations: the prompt as a user turn, the reply forced to be one image
    span (the prompt ends with its opening token), n choices each drawn with seed + i."""
    req = parse_image_generation_request(await read_json(request, timeout=body_timeout(request)))
    timeout = request_timeout(request)
    model = _image_model(request, req.model)
    images = model.images
    assert images is not None
    chat = parse_chat_completion_request(
        {
            "model": model.name,
            "messages": [{"role": "user", "content": req.prompt}],
            # the answer is the image: templates that reason first are told not to
            "chat_template_kwargs": {"enable_thinking": False, "skip_reasoning": True},
        }
    )
    check_serving(model)
    if not images.ready:
        raise service_unavailable("The image decoder is starting; retry shortly.", retry_after_s=5)
    model.pool.check_admission()
    prompt = await chat_prompt(model, chat, [])
    token_ids = [*prompt.token_ids, images.format.start_token_id]
    if len(token_ids) + images.format.span_tokens > model.pool.max_model_len:
        raise bad_request(
            f"The prompt is {len(token_ids)} tokens; with the {images.format.span_tokens} of an image it "
            f"exceeds the model's context of {model.pool.max_model_len}.",
            param="prompt",
            code="context_length_exceeded",
        )
    assert images.grammar is not None  # compiled at start-up
    constraints = ChoiceConstraints(
        model, chat, None, token_ids, images.format.span_tokens,
        images=ImageSpans(images.grammar, images.format.start_token_id, opened=True),
    )  # fmt: skip
    settings = ImageSettings(
        size=req.size,
        steps=req.num_inference_steps,
        guidance_scale=req.guidance_scale,
        seed=req.seed,
        output_format=req.output_format,
        quality=req.output_compression,
        as_url=req.response_format == "url" and not req.stream,
        partial_images=req.partial_images,
    )
    previews: asyncio.Queue[Any] = asyncio.Queue()
    request_id = new_request_id("img")
    outputs = []
    for i in range(req.n):
        seed = None if req.seed is None else req.seed + i
        params = SamplingParams(max_tokens=images.format.span_tokens, seed=seed)
        generation = Generation(model, token_ids, params, (), f"{request_id}-{i}", constraint=constraints.new())
        on_preview = functools.partial(_queue_preview, previews, i)
        outputs.append(OutputRouter(generation, images.route(settings, first_seed=seed, opened=True, on_preview=on_preview)))
    note_generation(request, model.name, [o.generation for o in outputs])
    with model.pool.admit([o.generation.request for o in outputs], timeout):
        return await assemble(request, req, ImageGeneration(model, outputs, previews))


def _queue_preview(queue: asyncio.Queue[Any], image: int, index: int, data: bytes, *, size: str) -> None:
    queue.put_nowait(ImagePreview(image, index, data, size))


def _image_model(request: web.Request, name: str | None) -> ServedModel:
    """The named model, which must draw images, or the only served model that does."""
    registry = request.app[MODELS]
    if name is not None:
        model = registry.get(name)
        if model.images is None:
            raise bad_request(f"The model '{name}' has no image decoder: it cannot draw images.", param="model")
        return model
    drawing = [m for m in registry if m.images is not None]
    if len(drawing) != 1:
        what = "No served model draws images" if not drawing else "Several served models draw images; name one"
        raise bad_request(f"{what}.", param="model")
    return drawing[0]


async def _grammar(model: ServedModel, req: ChatCompletionRequest | CompletionRequest) -> CompiledGrammar | None:
    """The request's output constraint, compiled (off the event loop, once per spec); a spec
    that does not compile is a 400 before any work is queued."""
    return None if req.grammar is None else await model.grammars.compile(req.grammar)


def body_timeout(request: web.Request) -> float | None:
    config = request.app.get(CONFIG)  # an app built without create_app (tests) has none
    return None if config is None else config.body_timeout


def _model(request: web.Request, name: str) -> ServedModel:
    return request.app[MODELS].get(name)  # a 404 naming the model if it is not served


def check_serving(model: ServedModel) -> None:
    # A media request also needs the encoder: MediaPipeline.expand answers 503 for that.
    if not model.pool.serving:
        raise service_unavailable("The model is starting; retry shortly.", retry_after_s=5)
