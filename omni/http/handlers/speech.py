"""POST /v1/audio/speech: text to speech, as OpenAI's API answers it: the handler, and the
speech API's response format (the lifecycle is omni.serving.speech.speech).

    parse -> the lifecycle (the speaking model, the prompt, one choice held to the audio span
    grammar, routed to the vocoder) -> encoded (response_format), time-stretched (speed)

stream_format "audio" (the default) sends the file's bytes as they are encoded, so a player
starts before the answer is done (chunked transfer; streamed wav has unknown sizes, as
OpenAI's); "sse" sends `speech.audio.delta` events whose `audio` is base64 of those bytes,
then `speech.audio.done` with the usage. A vocoder that fails before the first byte is a 503;
after it, the stream ends early (the status is sent already; an SSE stream ends with an error
event). The same seed gives the same audio.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

import msgspec
import numpy as np
from aiohttp import web

from omni.engines.llm import EngineError
from omni.http.access_log import note_generation
from omni.http.body import body_timeout, read_parsed, request_timeout
from omni.http.state import MODELS
from omni.modalities.outputs.audio import AUDIO
from omni.serving import speech as lifecycle
from omni.serving.bodies import SpeechAudioDeltaEvent, SpeechAudioDoneEvent, SpeechUsage
from omni.serving.errors import engine_error
from omni.serving.requests.speech import SpeechRequest, parse_speech_request
from omni.serving.speech import Speech
from omni.shared.media.audio_encoding import MEDIA_TYPES, StreamingAudioEncoder
from omni.shared.media.tempo import TimeStretch

log = logging.getLogger("omni.http.handlers.speech")



async def create_speech(request: web.Request) -> web.StreamResponse:
    req = await read_parsed(request, parse_speech_request, timeout=body_timeout(request))
    speech = await lifecycle.speech(request.app[MODELS], req, timeout=request_timeout(request))
    note_generation(request, speech.model.name, speech.generations)
    with speech.admitted():
        if req.stream_format == "sse":
            return await _send_events(request, req, speech)
        return await _send_audio(request, req, speech)


async def _encoded(req: SpeechRequest, speech: Speech) -> AsyncGenerator[bytes, None]:
    """The file's bytes as the span's chunks are decoded, stretched and encoded."""
    sample_rate = speech.sample_rate
    encoder = StreamingAudioEncoder(req.response_format, sample_rate)
    stretch = TimeStretch(sample_rate, req.speed) if req.speed != 1.0 else None
    try:
        async with aclosing(speech.output.deltas()) as deltas:
            async for delta in deltas:
                for piece in AUDIO.pieces(delta):
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


async def _send_audio(request: web.Request, req: SpeechRequest, speech: Speech) -> web.StreamResponse:
    chunks = _encoded(req, speech)
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
            log.warning("%s: speech ended early: %s", speech.output.generation.request.request_id, exc)
            return response
        await response.write_eof()
        return response


async def _send_events(request: web.Request, req: SpeechRequest, speech: Speech) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    try:
        async with aclosing(_encoded(req, speech)) as chunks:
            async for data in chunks:
                await _event(response, "speech.audio.delta", SpeechAudioDeltaEvent(base64.b64encode(data).decode()))
    except EngineError as exc:
        await _event(response, "error", {"type": "error", **engine_error(exc).to_dict()})
        await response.write_eof()
        return response
    usage = speech.output.usage
    prompt = usage.prompt_tokens
    done = SpeechUsage(prompt, usage.completion_tokens, prompt + usage.completion_tokens)
    await _event(response, "speech.audio.done", SpeechAudioDoneEvent(done))
    await response.write_eof()
    return response


async def _event(response: web.StreamResponse, kind: str, payload: object) -> None:
    # OpenAI's speech events carry their type as the SSE event name and in the data
    await response.write(f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode(payload) + b"\n\n")
