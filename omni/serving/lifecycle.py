"""The request lifecycle, in one place: one function per endpoint that reads top-down.

    parse -> model -> media -> prompt -> generate -> route output -> assemble

Each step lives in the module that owns its noun: parsing in omni/serving/requests, media items in
omni/modalities/inputs, prompt building in omni/serving/prompt.py, one choice's tokens in omni/engines/generation.py,
output spans in omni/modalities/outputs/router.py. Assembly (the JSON body or the SSE chunks) is the
endpoint's own response format, so its handler in omni/http/handlers passes it in: the API layer calls
down into this module, never the other way round.

Nothing runs on a worker until assembly iterates the outputs: Generation submits its request
when its deltas are first asked for, so an error in an earlier step costs no engine work.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from aiohttp import web

from omni.http.access_log import note_generation
from omni.errors import APIError, bad_request, service_unavailable
from omni.serving.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat_completion_request,
    parse_completion_request,
)
from omni.http.body import read_parsed, request_timeout
from omni.serving.sampling import sampling_params, truncate_prompt, truncated_media
from omni.serving.requests.images import ImageGenerationRequest, parse_image_generation_request
from omni.serving.requests.transcriptions import TranscriptionRequest, parse_transcription_request, read_transcription_form
from omni.serving.spoken import ChatAudio, ban_audio, chat_audio, recall_spoken
from omni.text.reply_parser import OutputFormat
from omni.serving.chat_turns import ban_images, ban_tool_markup, chat_images, check_tool_choice, output_format, tool_grammar
from omni.serving.choice_constraints import ChoiceConstraints, OutputSpans
from omni.text.constrained import audio_span, image_span
from omni.text.constrained.compiler import CompiledGrammar
from omni.engines.generation import Generation, OutputOptions, choice_params, new_request_id, response_id
from omni.modalities.outputs.image import ImageSettings
from omni.shared.media import MediaLimits
from omni.modalities.inputs.items import MediaItem, decode_params
from omni.modalities.inputs.placeholders import placeholder_ids
from omni.modalities.outputs.router import OutputRouter
from omni.serving.prompt import chat_prompt, completion_prompts, load_media
from omni.serving.model import ServedModel
from omni.http.state import CONFIG, MODELS
from omni.shared.store.keys import content_hash
from scheduler.request import SamplingParams


@dataclass(frozen=True, slots=True)
class Completion:
    """What assembly gets: every choice's routed output, in choice index order, not yet run."""

    id: str
    model: ServedModel
    outputs: list[OutputRouter]
    output_format: OutputFormat = OutputFormat()  # chat: how each choice's text is read back
    inline_images: bool = False  # chat: images are in the text (tool call arguments), not parts
    audio: ChatAudio | None = None  # chat: how the choices speak (None: they cannot)


R = TypeVar("R", ChatCompletionRequest, CompletionRequest)
# (the HTTP request, the parsed body, the completion) -> the response: JSON, or SSE if req.stream
Assemble: TypeAlias = Callable[[web.Request, R, Completion], Awaitable[web.StreamResponse]]


async def chat_completion(
    request: web.Request, assemble: Assemble[ChatCompletionRequest]
) -> web.StreamResponse:
    req = await read_parsed(request, parse_chat_completion_request, timeout=body_timeout(request))
    timeout = request_timeout(request)
    model = _model(request, req.model)
    req = await recall_spoken(model, req)  # earlier spoken answers referred to by id
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
        max_logprobs=model.pool.config.llm.max_logprobs,
    )
    params = ban_audio(model, req, ban_images(model, req, ban_tool_markup(model, req, params)))
    images = chat_images(model, req)
    speaking = chat_audio(model, req)
    fmt = output_format(model, req, token_ids)
    grammar = await _grammar(model, req) if req.grammar is not None else await tool_grammar(model, req, params.max_tokens)
    spans = images.spans() if images is not None else None
    constraints = ChoiceConstraints(
        model, req, grammar, token_ids, params.max_tokens, images=spans,
        audio=speaking.spans() if speaking is not None else None,
    )  # fmt: skip
    keep_special = model.tokenizer.special_ids(*fmt.markup_tokens)
    completion_id = new_request_id("chatcmpl")
    generations = [
        Generation(
            model.pool,
            model.tokenizer,
            token_ids,
            choice_params(params, i),
            f"{completion_id}-{i}",
            output=OutputOptions(req.stop, req.skip_special_tokens, keep_special, req.include_stop_str_in_output),
            media=media,
            constraint=constraints.new(),
        )
        for i in range(req.n)
    ]
    outputs = [
        OutputRouter(
            g,
            images.route(i) if images is not None else None,
            speaking.route(model) if speaking is not None else None,
        )
        for i, g in enumerate(generations)
    ]
    completion_out = Completion(
        response_id("chatcmpl", req.request_id, completion_id), model, outputs, fmt,
        inline_images=images is not None and images.inline, audio=speaking,
    )  # fmt: skip
    note_generation(request, model.name, generations)
    with model.pool.admit([g.request for g in generations], timeout):  # or a 429, before any streaming
        return await assemble(request, req, completion_out)


async def completion(request: web.Request, assemble: Assemble[CompletionRequest]) -> web.StreamResponse:
    req = await read_parsed(request, parse_completion_request, timeout=body_timeout(request))
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
            max_logprobs=model.pool.config.llm.max_logprobs,
        )
        constraints = ChoiceConstraints(model, req, grammar, ids, params.max_tokens)
        generations += [
            Generation(
                model.pool,
                model.tokenizer,
                ids,
                choice_params(params, i),
                f"{completion_id}-{p * req.n + i}",
                output=OutputOptions(
                    req.stop, req.skip_special_tokens, include_stop_str_in_output=req.include_stop_str_in_output
                ),
                constraint=constraints.new(),
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
    req = await read_parsed(request, parse_image_generation_request, timeout=body_timeout(request))
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
        images=OutputSpans(images.grammar, images.format.start_token_id, opened=True),
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
        generation = Generation(
            model.pool, model.tokenizer, token_ids, params, f"{request_id}-{i}",
            output=OutputOptions(), constraint=constraints.new(),
        )  # fmt: skip
        on_preview = functools.partial(_queue_preview, previews, i)
        outputs.append(OutputRouter(generation, images.route(settings, first_seed=seed, opened=True, on_preview=on_preview)))
    note_generation(request, model.name, [o.generation for o in outputs])
    with model.pool.admit([o.generation.request for o in outputs], timeout):
        return await assemble(request, req, ImageGeneration(model, outputs, previews))


def _queue_preview(queue: asyncio.Queue[Any], image: int, index: int, data: bytes, *, size: str) -> None:
    queue.put_nowait(ImagePreview(image, index, data, size))


def _image_model(request: web.Request, name: str | None) -> ServedModel:
    """The named model, which must draw images, or the only served model that does."""
    return request.app[MODELS].capable(
        name, lambda m: m.images is not None, lacks="has no image decoder: it cannot draw images",
        does=("draws images", "draw images"),
    )  # fmt: skip


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


# ----------------------------------------------------------------------------- transcriptions
# POST /v1/audio/transcriptions (assembly: omni/http/handlers/transcriptions.py).

# The audio encoder's embedding rows per second of audio: 16 kHz samples, a 10 ms mel hop, then
# two halvings (Qwen2-Audio's stride-2 convolution and its pooling). The encoder reports rows,
# not samples, so a clip's duration is known to 1 / 25 s.
AUDIO_ROWS_PER_SECOND = 25
# A transcript's length bound: fast speech is about 5 words (7 Korean syllables) a second, a
# few tokens each. A model still writing past this is not transcribing.
TRANSCRIPT_TOKENS_PER_SECOND = 20
MIN_TRANSCRIPT_TOKENS = 32
TRANSCRIBE_INSTRUCTION = "Transcribe the audio verbatim."
_HASH_IN_THREAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Transcription:
    """What the transcription API's assembly gets: the one routed output, not yet run."""

    model: ServedModel
    output: OutputRouter
    duration: float  # seconds of audio, from the encoder's rows
    num_audio_tokens: int  # the prompt tokens standing for the audio (the rest is text)


TranscriptionAssemble: TypeAlias = Callable[
    [web.Request, TranscriptionRequest, Transcription], Awaitable[web.StreamResponse]
]


async def transcription(request: web.Request, assemble: TranscriptionAssemble) -> web.StreamResponse:
    """A user turn of the audio and an instruction to write down what is said (the language and
    the client's prompt as hints), reasoning off, no image or audio span: the answer is the
    transcript. The upload is a media item like a chat's input_audio part, named `file`."""
    registry = request.app[MODELS]
    limit = max((m.media.limits.max_bytes for m in registry if m.media is not None), default=MediaLimits().max_bytes)
    form = await read_transcription_form(request, max_file_bytes=limit, timeout=body_timeout(request))
    req = parse_transcription_request(form)
    timeout = request_timeout(request)
    model = _hearing_model(request, req.model)
    media = model.media
    assert media is not None  # _hearing_model
    if len(req.file) > media.limits.max_bytes:
        raise APIError(
            413, f"'file' is larger than {media.limits.max_bytes} bytes (--max-media-bytes).",
            param="file", code="payload_too_large",
        )  # fmt: skip
    check_serving(model)
    if not media.ready:
        raise service_unavailable("The model's encoders are starting; retry shortly.", retry_after_s=5)
    if "audio_encoder" not in media.encoder.components:
        raise bad_request(f"The model '{model.name}' has no audio encoder: it cannot transcribe.", param="model")
    model.pool.check_admission()
    params = decode_params("audio", media.limits)
    if len(req.file) > _HASH_IN_THREAD_BYTES:
        digest = await asyncio.to_thread(content_hash, req.file, params)
    else:
        digest = content_hash(req.file, params)
    item = MediaItem("audio", "file", req.file, None, digest)  # fmt None: FFmpeg probes the container
    turn = [{"type": "audio", "id": "audio_0"}, {"type": "text", "text": transcription_instruction(req)}]
    template_ids = await asyncio.to_thread(_transcription_template, model, [{"role": "user", "content": turn}])
    prompt = await media.expand(template_ids, [item])
    placeholders = placeholder_ids(model.tokenizer)
    num_audio = len(prompt.token_ids) - sum(t not in placeholders for t in template_ids)
    duration = (prompt.media[0].num_rows if prompt.media else num_audio) / AUDIO_ROWS_PER_SECOND
    room = model.pool.max_model_len - len(prompt.token_ids)
    if room <= 0:
        raise bad_request(
            f"The audio is {duration:g} s, {num_audio} prompt tokens; with the instruction the prompt is "
            f"{len(prompt.token_ids)} tokens, which leaves no room in the model's context of "
            f"{model.pool.max_model_len}.",
            param="file",
            code="context_length_exceeded",
        )
    params_out = SamplingParams(
        max_tokens=min(room, MIN_TRANSCRIPT_TOKENS + math.ceil(TRANSCRIPT_TOKENS_PER_SECOND * duration)),
        temperature=req.temperature,
        seed=req.seed,
        # verbose_json's segment lists the tokens and their mean logprob
        logprobs=0 if req.logprobs or req.response_format == "verbose_json" else None,
        bad_words_token_ids=_span_openers(model),
    )
    generation = Generation(
        model.pool, model.tokenizer, prompt.token_ids, params_out, new_request_id("trsc"),
        output=OutputOptions(), media=prompt.media,
    )  # fmt: skip
    output = OutputRouter(generation)
    note_generation(request, model.name, [generation])
    with model.pool.admit([generation.request], timeout):
        return await assemble(request, req, Transcription(model, output, duration, num_audio))


def transcription_instruction(req: TranscriptionRequest) -> str:
    """The user turn's text after the audio: the instruction, then the client's hints."""
    parts = [TRANSCRIBE_INSTRUCTION]
    if req.language is not None:
        parts.append(f"The speech is in the language with ISO-639-1 code '{req.language}'.")
    if req.prompt is not None:
        parts.append(f"Follow the style, spelling and words of this text, which may precede the audio: {req.prompt}")
    return " ".join(parts)


def _transcription_template(model: ServedModel, messages: list[dict[str, Any]]) -> list[int]:
    # The answer is the transcript: templates that reason first are told not to.
    return model.tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=True,
        chat_template=model.chat_format.chat_template,
        enable_thinking=False,
        skip_reasoning=True,
    )


def _span_openers(model: ServedModel) -> tuple[tuple[int, ...], ...]:
    """Bad words: the opening tokens of image and audio spans, so that the answer is text."""
    ids = (model.tokenizer.token_to_id(t) for t in (image_span.START, audio_span.START))
    return tuple((i,) for i in ids if i is not None)


def _hearing_model(request: web.Request, name: str | None) -> ServedModel:
    """The named model, which must read audio, or the only served model that reads media."""
    return request.app[MODELS].capable(
        name, lambda m: m.media is not None, lacks="has no audio encoder: it cannot transcribe",
        does=("reads audio", "read audio"),
    )  # fmt: skip
