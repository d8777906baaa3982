"""The request lifecycle, in one place: one function per endpoint that reads top-down.

    model -> media -> prompt -> generate -> route output

Each takes what it uses (the served models, the parsed request, the client's deadline) and
returns the request made ready to run: every choice's routed output, not yet run. The handler
in omni/http/handlers read and parsed the body before, and writes the response after, in its
endpoint's format (JSON or SSE), inside the returned value's admitted():

    completion = await lifecycle.chat(models, req, store=store, timeout=timeout)
    with completion.admitted():  # or a 429, before any response is written
        return await respond(request, req, completion)

Each step lives in the module that owns its noun: parsing in omni/serving/requests, media items in
omni/modalities/inputs, prompt building in omni/serving/prompt.py, one choice's tokens in omni/engines/generation.py,
output spans in omni/modalities/outputs/router.py. Nothing here knows of HTTP.

Nothing runs on a worker until the response iterates the outputs: Generation submits its request
when its deltas are first asked for, so an error in an earlier step costs no engine work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from omni.engines.generation import Generation, OutputOptions, choice_params, new_request_id, response_id
from omni.errors import APIError, bad_request, service_unavailable
from omni.modalities.inputs.items import MediaItem, decode_params
from omni.modalities.inputs.pipeline import PromptInputs
from omni.modalities.inputs.placeholders import placeholder_ids
from omni.modalities.outputs.image import IMAGE, ImageSettings
from omni.modalities.outputs.kinds import OUTPUT_KINDS
from omni.modalities.outputs.router import OutputRouter
from omni.serving.chat_turns import (
    ChatImages,
    ban_spans,
    ban_tool_markup,
    chat_outputs,
    check_tool_choice,
    leave_room_for_speech,
    output_format,
    tool_grammar,
)
from omni.serving.choice_constraints import ChoiceConstraints, OutputSpans
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.prompt import chat_prompt, completion_prompts, load_media
from omni.serving.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat_completion_request,
)
from omni.serving.requests.images import ImageGenerationRequest
from omni.serving.requests.responses import ResponseRequest
from omni.serving.requests.transcriptions import TranscriptionRequest
from omni.serving.response_store import ResponseStore
from omni.serving.response_turns import ResponseTurn, check_image_tool_model, response_turn
from omni.serving.sampling import sampling_params, truncate_prompt, truncated_media
from omni.serving.spoken import ChatAudio, recall_spoken
from omni.shared.media import MediaLimits
from omni.shared.media.compositing import EditCanvas
from omni.shared.media.errors import MediaError
from omni.shared.store.base import ArtifactStore
from omni.shared.store.keys import content_hash
from omni.text.constrained.compiler import CompiledGrammar
from omni.text.reply_parser import OutputFormat
from scheduler.request import SamplingParams


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A request made ready to run: every choice's routed output, in choice index order, not
    yet run, and the client's deadline for them."""

    model: ServedModel
    outputs: list[OutputRouter]
    timeout: float | None  # seconds, the client's (X-Request-Timeout); the server's caps it

    @property
    def generations(self) -> list[Generation]:
        return [o.generation for o in self.outputs]

    def admitted(self) -> AbstractContextManager[object]:
        """The choices' place in the model's queue, all together, or Overloaded (a 429) now,
        before any response is written. Write the response inside it: each choice leaves the
        queue when it is submitted (its deltas first asked for), and leaving the block gives
        back the place of any never submitted (a stream the client left, say)."""
        return self.model.pool.admit([o.generation.request for o in self.outputs], self.timeout)


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion(Prepared):
    """A chat or text completion, ready to run."""

    id: str
    output_format: OutputFormat = OutputFormat()  # chat: how each choice's text is read back
    inline_images: bool = False  # chat: images are in the text (tool call arguments), not parts
    audio: ChatAudio | None = None  # chat: how the choices speak (None: they cannot)


async def chat(
    models: ModelRegistry,
    req: ChatCompletionRequest,
    *,
    store: ArtifactStore | None,
    timeout: float | None,
    client_request_id: str | None = None,
    previews: asyncio.Queue[Any] | None = None,
    partial_images: int = 0,
) -> Completion:
    """store: where earlier spoken answers are kept, for turns that refer to one by id.
    client_request_id: the client's X-Request-Id; it names the response before the body's
    request_id does, as in vLLM. previews: where partial_images previews of each drawn image
    go, as ImagePreview (the Responses API streams them)."""
    model = models.get(req.model)  # a 404 naming the model if it is not served
    req = await recall_spoken(store, req)  # earlier spoken answers referred to by id
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
    params = ban_spans(model, req, ban_tool_markup(model, req, params))
    kinds = chat_outputs(model, req)  # each output kind the choices may make: its spans and its routes
    kinds, params = leave_room_for_speech(kinds, params)  # a spoken turn's text leaves room for its speech
    if previews is not None and partial_images:
        on_preview = functools.partial(_choice_previews, previews)
        kinds = [k.with_previews(partial_images, on_preview) if isinstance(k, ChatImages) else k for k in kinds]
    fmt = output_format(model, req, token_ids)
    grammar = await _grammar(model, req) if req.grammar is not None else await tool_grammar(model, req, params.max_tokens)
    constraints = ChoiceConstraints(model, req, grammar, token_ids, params.max_tokens, [k.spans() for k in kinds])
    keep_special = model.tokenizer.special_ids(*fmt.markup_tokens)
    completion_id = new_request_id("chatcmpl")
    generations = [
        Generation(
            model.pool,
            model.tokenizer,
            token_ids,
            choice_params(params, i),
            f"{completion_id}-{i}",
            output=OutputOptions(
                req.stop, req.skip_special_tokens, keep_special, req.include_stop_str_in_output, req.stop_token_ids
            ),
            media=media,
            constraint=constraints.new(),
            cache_salt=req.cache_salt,
        )
        for i in range(req.n)
    ]
    outputs = [OutputRouter(g, *(k.route(model, i) for k in kinds)) for i, g in enumerate(generations)]
    return Completion(
        id=response_id("chatcmpl", client_request_id or req.request_id, completion_id), model=model, outputs=outputs, timeout=timeout,
        output_format=fmt, inline_images=any(isinstance(k, ChatImages) and k.inline for k in kinds),
        audio=next((k for k in kinds if isinstance(k, ChatAudio)), None),
    )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Response(Completion):
    """A Responses API turn, ready to run: chat's one choice, the turn it answers (the
    conversation to store), and the queue its image previews arrive on (ImagePreview)."""

    turn: ResponseTurn
    previews: asyncio.Queue[Any]


async def response(
    models: ModelRegistry, req: ResponseRequest, *, responses: ResponseStore, store: ArtifactStore | None,
    timeout: float | None,
) -> Response:  # fmt: skip
    """POST /v1/responses: the earlier turns of previous_response_id, then the request as a
    chat turn (omni/serving/response_turns.py), answered by chat's lifecycle."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        earlier = await responses.fetch(req.previous_response_id)
        if earlier is None:
            raise bad_request(
                f"Previous response with id '{req.previous_response_id}' not found (or it expired).",
                param="previous_response_id",
            )
        history = earlier.messages
    model = models.get(req.model)
    check_image_tool_model(models, req)
    turn = response_turn(model, req, history)
    previews: asyncio.Queue[Any] = asyncio.Queue()
    partial = turn.image_tool.partial_images if turn.image_tool is not None and req.stream else 0
    try:
        done = await chat(models, turn.chat, store=store, timeout=timeout, previews=previews, partial_images=partial)
    except (APIError, MediaError) as exc:
        raise turn.params.rename(exc) from None
    fields = {f.name: getattr(done, f.name) for f in dataclasses.fields(done)}
    return Response(**fields, turn=turn, previews=previews)


async def completion(
    models: ModelRegistry, req: CompletionRequest, *, timeout: float | None, client_request_id: str | None = None
) -> Completion:
    model = models.get(req.model)
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
                    req.stop,
                    req.skip_special_tokens,
                    include_stop_str_in_output=req.include_stop_str_in_output,
                    stop_token_ids=req.stop_token_ids,
                ),
                constraint=constraints.new(),
                cache_salt=req.cache_salt,
            )
            for i in range(req.n)
        ]
    outputs = [OutputRouter(g) for g in generations]
    completion_id = response_id("cmpl", client_request_id or req.request_id, completion_id)
    return Completion(id=completion_id, model=model, outputs=outputs, timeout=timeout)


@dataclass(frozen=True, slots=True)
class ImagePreview:
    image: int  # which of the request's n images
    index: int  # its previews count from 0
    data: bytes
    size: str  # "WxH"


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageGeneration(Prepared):
    """Image generation, ready to run: one routed output per image (each draws exactly one),
    and the queue its previews arrive on, in the order they are made. The response may put its
    own events on the same queue (an image finished), so that one consumer sees both in the
    order they happened."""

    previews: asyncio.Queue[Any]  # ImagePreview, and what the response puts there itself
    # An edit's: previews are finished against it as its images are (ImageSettings.canvas)
    canvas: EditCanvas | None = None
    num_image_tokens: int = 0  # an edit's: the prompt tokens standing for its input images


async def image_generation(
    models: ModelRegistry, req: ImageGenerationRequest, *, timeout: float | None
) -> ImageGeneration:
    """POST /v1/images/generations: the prompt as a user turn, the reply forced to be one image
    span (the prompt ends with its opening token), n choices each drawn with seed + i."""
    model = image_model(models, req.model)
    turn = image_turn(model, req.prompt)
    check_drawing(model)
    prompt = await chat_prompt(model, turn, [])
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
    return image_choices(model, turn, prompt, settings, n=req.n, timeout=timeout)


def image_turn(model: ServedModel, text: str) -> ChatCompletionRequest:
    """A drawing request's user turn, as the chat request its constraints are made for."""
    return parse_chat_completion_request(
        {
            "model": model.name,
            "messages": [{"role": "user", "content": text}],
            # the answer is the image: templates that reason first are told not to
            "chat_template_kwargs": {"enable_thinking": False, "skip_reasoning": True},
        }
    )


def check_drawing(model: ServedModel) -> None:
    """The model's engines are up and its queue has room (503, 429), before any prompt work."""
    images = model.output(IMAGE)
    assert images is not None  # image_model
    check_serving(model)
    if not images.ready:
        raise service_unavailable("The image decoder is starting; retry shortly.", retry_after_s=5)
    model.pool.check_admission()


def image_choices(
    model: ServedModel,
    turn: ChatCompletionRequest,
    prompt: PromptInputs,
    settings: ImageSettings,
    *,
    n: int,
    timeout: float | None,
) -> ImageGeneration:
    """n choices of the prompt followed by an image span's opening token, each held to the span
    grammar and drawn with settings.seed + i."""
    images = model.output(IMAGE)
    assert images is not None and images.grammar is not None  # compiled at start-up
    token_ids = [*prompt.token_ids, images.format.start_token_id]
    if len(token_ids) + images.format.span_tokens > model.pool.max_model_len:
        raise bad_request(
            f"The prompt is {len(token_ids)} tokens; with the {images.format.span_tokens} of an image it "
            f"exceeds the model's context of {model.pool.max_model_len}.",
            param="prompt",
            code="context_length_exceeded",
        )
    spans = OutputSpans(images.grammar, images.format.start_token_id, opened=True)
    constraints = ChoiceConstraints(model, turn, None, token_ids, images.format.span_tokens, [spans])
    previews: asyncio.Queue[Any] = asyncio.Queue()
    request_id = new_request_id("img")
    outputs = []
    for i in range(n):
        seed = None if settings.seed is None else settings.seed + i
        params = SamplingParams(max_tokens=images.format.span_tokens, seed=seed)
        generation = Generation(
            model.pool, model.tokenizer, token_ids, params, f"{request_id}-{i}",
            output=OutputOptions(), media=prompt.media, constraint=constraints.new(),
        )  # fmt: skip
        on_preview = functools.partial(_queue_preview, previews, i)
        outputs.append(OutputRouter(generation, images.route(settings, first_seed=seed, opened=True, on_preview=on_preview)))
    return ImageGeneration(model=model, outputs=outputs, timeout=timeout, previews=previews)


def _choice_previews(queue: asyncio.Queue[Any], choice_index: int) -> Callable[..., None]:
    return functools.partial(_queue_preview, queue, choice_index)


def _queue_preview(queue: asyncio.Queue[Any], image: int, index: int, data: bytes, *, size: str) -> None:
    queue.put_nowait(ImagePreview(image, index, data, size))


def image_model(models: ModelRegistry, name: str | None) -> ServedModel:
    """The named model, which must draw images, or the only served model that does."""
    return models.capable(
        name, lambda m: m.output(IMAGE) is not None, lacks="has no image decoder: it cannot draw images",
        does=("draws images", "draw images"),
    )  # fmt: skip


async def _grammar(model: ServedModel, req: ChatCompletionRequest | CompletionRequest) -> CompiledGrammar | None:
    """The request's output constraint, compiled (off the event loop, once per spec); a spec
    that does not compile is a 400 before any work is queued."""
    return None if req.grammar is None else await model.grammars.compile(req.grammar)


def check_serving(model: ServedModel) -> None:
    # A media request also needs the encoder: MediaPipeline.expand answers 503 for that.
    if not model.pool.serving:
        raise service_unavailable("The model is starting; retry shortly.", retry_after_s=5)


# ----------------------------------------------------------------------------- transcriptions
# POST /v1/audio/transcriptions (the response: omni/http/handlers/transcriptions.py).

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Transcription(Prepared):
    """A transcription, ready to run: its one routed output."""

    duration: float  # seconds of audio, from the encoder's rows
    num_audio_tokens: int  # the prompt tokens standing for the audio (the rest is text)

    @property
    def output(self) -> OutputRouter:
        return self.outputs[0]


def max_upload_bytes(models: ModelRegistry) -> int:
    """The largest audio file any served model reads (--max-media-bytes): the bound on the
    upload while it is read, before the request names its model."""
    return max((m.media.limits.max_bytes for m in models if m.media is not None), default=MediaLimits().max_bytes)


async def transcription(models: ModelRegistry, req: TranscriptionRequest, *, timeout: float | None) -> Transcription:
    """A user turn of the audio and an instruction to write down what is said (the language and
    the client's prompt as hints), reasoning off, no image or audio span: the answer is the
    transcript. The upload is a media item like a chat's input_audio part, named `file`."""
    model = _hearing_model(models, req.model)
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
    template_ids = await asyncio.to_thread(answer_template, model, [{"role": "user", "content": turn}])
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
    return Transcription(model=model, outputs=[output], timeout=timeout, duration=duration, num_audio_tokens=num_audio)


def transcription_instruction(req: TranscriptionRequest) -> str:
    """The user turn's text after the audio: the instruction, then the client's hints."""
    parts = [TRANSCRIBE_INSTRUCTION]
    if req.language is not None:
        parts.append(f"The speech is in the language with ISO-639-1 code '{req.language}'.")
    if req.prompt is not None:
        parts.append(f"Follow the style, spelling and words of this text, which may precede the audio: {req.prompt}")
    return " ".join(parts)


def answer_template(model: ServedModel, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt of a turn whose answer is the endpoint's output (a transcript, an edited
    image): templates that reason first are told not to."""
    return model.tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=True,
        chat_template=model.chat_format.chat_template,
        enable_thinking=False,
        skip_reasoning=True,
    )


def _span_openers(model: ServedModel) -> tuple[tuple[int, ...], ...]:
    """Bad words: the opening tokens of every kind's spans the vocabulary has (decoder or not),
    so that the answer is text."""
    ids = (model.tokenizer.token_to_id(kind.start_token) for kind in OUTPUT_KINDS)
    return tuple((i,) for i in ids if i is not None)


def _hearing_model(models: ModelRegistry, name: str | None) -> ServedModel:
    """The named model, which must read audio, or the only served model that reads media."""
    return models.capable(
        name, lambda m: m.media is not None, lacks="has no audio encoder: it cannot transcribe",
        does=("reads audio", "read audio"),
    )  # fmt: skip
