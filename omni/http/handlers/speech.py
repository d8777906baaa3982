"""POST /v1/audio/speech: text to speech, as OpenAI's API answers it.

    parse -> the speaking model -> prompt (the instructions as a system turn, the input as the
    user's, reasoning off) + the audio span's opening token -> one choice held to the span
    grammar (3 to max_units units, then the end) -> the router sends its units to the vocoder
    in chunks as they are sampled -> encoded (response_format), time-stretched (speed)

stream_format "audio" (the default) sends the file's bytes as they are encoded, so a player
starts before the answer is done (chunked transfer; streamed wav has unknown sizes, as
OpenAI's); "sse" sends `speech.audio.delta` events whose `audio` is base64 of those bytes,
then `speech.audio.done` with the usage. A vocoder that fails before the first byte is a 503;
after it, the stream ends early (the status is sent already; an SSE stream ends with an error
event). The same seed gives the same audio.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

import numpy as np
import orjson
from aiohttp import web

from omni.http.access_log import note_generation
from omni.errors import bad_request
from omni.http.errors import engine_error
from omni.http.body import read_parsed, request_timeout
from omni.serving.requests import parse_chat_completion_request
from omni.serving.requests.speech import SpeechRequest, parse_speech_request
from omni.engines.audio_decoder import AudioDecodeError
from omni.modalities.outputs.audio import AudioRoute, ModelAudio
from omni.text.constrained.audio_span import MIN_UNITS
from omni.engines.llm import EngineError
from omni.engines.generation import Generation, OutputOptions, new_request_id
from omni.shared.media.audio import decode_audio
from omni.shared.media.audio_encoding import MEDIA_TYPES, StreamingAudioEncoder
from omni.shared.media.errors import MediaError
from omni.shared.media.tempo import TimeStretch
from omni.serving.lifecycle import body_timeout, check_serving
from omni.modalities.outputs.router import OutputRouter
from omni.serving.prompt import chat_prompt
from omni.serving.model import ServedModel
from omni.http.state import MODELS
from scheduler.request import SamplingParams

log = logging.getLogger("omni.http.handlers.speech")

SPEECH_PATH = "/v1/audio/speech"


async def create_speech(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_speech_request, timeout=body_timeout(request))
    model = _speaking_model(request, req.model)
    audio = model.audio
    assert audio is not None
    check_serving(model)
    audio.check_ready()
    model.pool.check_admission()
    audio.engine.check_room()
    embedding = None
    if req.reference_audio is not None:
        embedding = await _reference_voice(model, audio, req)
        voice = 0
    else:
        voice = audio.voice_index(req.voice, "voice")
    router = await _speech_choice(model, audio, req, voice, embedding)
    note_generation(request, model.name, [router.generation])
    with model.pool.admit([router.generation.request], request_timeout(request)):
        if req.stream_format == "sse":
            return await _send_events(request, req, router)
        return await _send_audio(request, req, router)


async def _reference_voice(model: ServedModel, audio: ModelAudio, req: SpeechRequest) -> bytes:
    """The speaker embedding of the request's reference recording (the zero-shot voice)."""
    info = audio.engine.info
    if info is None or not info.speaker_encoder:
        raise bad_request("This model's voices cannot be taken from a recording (it has no speaker encoder).",
                          param="reference_audio")  # fmt: skip
    assert req.reference_audio is not None
    limits = model.pool.config.media_limits
    try:  # PyAV decodes off the event loop
        samples = await asyncio.to_thread(
            decode_audio, req.reference_audio, req.reference_format, limits, "reference_audio"
        )
    except MediaError as exc:
        raise bad_request(exc.message, param=exc.param) from None
    try:
        return await audio.engine.embed_speaker(samples.astype("<f4").tobytes(), info.speaker_sample_rate)
    except AudioDecodeError as exc:  # too short a clip, say: the client's
        raise bad_request(f"reference_audio: {exc}", param="reference_audio") from None
    except EngineError as exc:
        raise engine_error(exc) from exc


async def _speech_choice(
    model: ServedModel, audio: ModelAudio, req: SpeechRequest, voice: int, embedding: bytes | None
) -> OutputRouter:
    messages = [{"role": "user", "content": req.input}]
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    chat = parse_chat_completion_request(
        {
            "model": model.name,
            "messages": messages,
            # the answer is the speech: templates that reason first are told not to
            "chat_template_kwargs": {"enable_thinking": False, "skip_reasoning": True},
        }
    )
    prompt = await chat_prompt(model, chat, [])
    token_ids = [*prompt.token_ids, audio.format.start_token_id]
    room = model.pool.max_model_len - len(token_ids)
    if room < MIN_UNITS + 1:
        raise bad_request(
            f"The input is {len(token_ids)} tokens; it leaves no room for speech in the model's context of "
            f"{model.pool.max_model_len}.",
            param="input",
            code="context_length_exceeded",
        )
    # The units (at most max_units: the grammar's own bound, so the last token is the span's end
    # rather than a unit the length limit cuts), then the end.
    grammar = await audio.span_grammar(model.grammars, min(req.max_units, room - 1))
    params = SamplingParams(max_tokens=min(req.max_units + 1, room), seed=req.seed)
    constraint = grammar.new_constraint(None)  # the whole output is the span the prompt opened
    generation = Generation(
        model.pool, model.tokenizer, token_ids, params, new_request_id("speech"), output=OutputOptions(), constraint=constraint
    )
    return OutputRouter(generation, audio.route(voice, embedding=embedding, opened=True))


async def _encoded(req: SpeechRequest, router: OutputRouter, sample_rate: int) -> AsyncGenerator[bytes, None]:
    """The file's bytes as the span's chunks are decoded, stretched and encoded."""
    encoder = StreamingAudioEncoder(req.response_format, sample_rate)
    stretch = TimeStretch(sample_rate, req.speed) if req.speed != 1.0 else None
    try:
        async with aclosing(router.deltas()) as deltas:
            async for delta in deltas:
                for piece in delta.audio:
                    samples = np.frombuffer(piece.samples, dtype="<f4")
                    if stretch is not None:
                        samples = stretch.feed(samples)
                    data = encoder.feed(samples)
                    if data:
                        yield data
        tail = stretch.finish() if stretch is not None else np.zeros(0, dtype=np.float32)
        data = encoder.feed(tail) + encoder.finish()
        if data:
            yield data
    finally:
        encoder.close()


async def _send_audio(request: web.Request, req: SpeechRequest, router: OutputRouter) -> web.StreamResponse:
    chunks = _encoded(req, router, _sample_rate(router))
    async with aclosing(chunks):
        try:
            first = await anext(chunks, b"")  # before the status: an early failure is still a 503
        except EngineError as exc:
            raise engine_error(exc) from exc
        response = web.StreamResponse(headers={"Content-Type": MEDIA_TYPES[req.response_format]})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(first)
        try:
            async for data in chunks:
                await response.write(data)
        except EngineError as exc:  # mid-stream: the status is sent; end the body early
            log.warning("%s: speech ended early: %s", router.generation.request.request_id, exc)
            return response
        await response.write_eof()
        return response


async def _send_events(request: web.Request, req: SpeechRequest, router: OutputRouter) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    try:
        async with aclosing(_encoded(req, router, _sample_rate(router))) as chunks:
            async for data in chunks:
                await _event(response, {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except EngineError as exc:
        await _event(response, {"type": "error", **engine_error(exc).to_dict()})
        await response.write_eof()
        return response
    usage = router.usage
    prompt = usage.prompt_tokens
    await _event(
        response,
        {
            "type": "speech.audio.done",
            "usage": {
                "input_tokens": prompt,
                "output_tokens": usage.completion_tokens,
                "total_tokens": prompt + usage.completion_tokens,
            },
        },
    )
    await response.write_eof()
    return response


async def _event(response: web.StreamResponse, payload: dict[str, object]) -> None:
    # OpenAI's speech events carry their type as the SSE event name and in the data
    await response.write(f"event: {payload['type']}\n".encode() + b"data: " + orjson.dumps(payload) + b"\n\n")


def _sample_rate(router: OutputRouter) -> int:
    rates = [r.sample_rate for r in router.routes if isinstance(r, AudioRoute)]
    return rates[0] if rates else 24000


def _speaking_model(request: web.Request, name: str | None) -> ServedModel:
    """The named model, which must speak, or the only served model that does."""
    return request.app[MODELS].capable(
        name, lambda m: m.audio is not None, lacks="has no audio decoder: it cannot speak", does=("speaks", "speak")
    )
