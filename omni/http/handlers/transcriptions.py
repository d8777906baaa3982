"""POST /v1/audio/transcriptions: the handler, and the transcription API's response formats (the
lifecycle is omni.serving.transcriptions.transcription), as the official client reads them.

    json          {"text", "usage"}: OpenAI's token usage (type "tokens", the audio's tokens
                  apart from the text's); "logprobs" too with include ["logprobs"]
    text          the transcript, text/plain
    verbose_json  {"task": "transcribe", "language", "duration", "text", "segments", "usage"}
                  (usage: type "duration"). The model writes no timestamps, so the one segment
                  is the whole clip, 0 to duration; its tokens and avg_logprob are the answer's,
                  compression_ratio Whisper's (the text's bytes over their zlib size), and
                  no_speech_prob 0 (the model has no no-speech estimate). language is the
                  request's, or "unknown": the model is not asked to name one.
    stream        `transcript.text.delta` events ({"delta"}) as the text comes, then one
                  `transcript.text.done` ({"text", "usage"}): the deltas joined. As the speech
                  API's events, each is named by its type (an `event:` line) and no [DONE]
                  follows; a worker failing mid-stream ends it with an `error` event.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from contextlib import aclosing

import msgspec
from aiohttp import web

from omni.engines.generation import TokenLogprob
from omni.engines.llm import EngineError
from omni.http import sse
from omni.http.access_log import note_generation
from omni.http.body import body_timeout, read_transcription_form, request_timeout
from omni.http.logprobs import logprob_entry
from omni.http.state import MODELS
from omni.serving import transcriptions as lifecycle
from omni.serving.bodies import (
    DurationUsage,
    LogprobEntry,
    TranscriptionSegment,
    TranscriptionTokenDetails,
    TranscriptionUsage,
    TranscriptionVerbose,
    TranscriptTextDeltaEvent,
    TranscriptTextDoneEvent,
)
from omni.serving.bodies import Transcription as TranscriptionBody
from omni.serving.errors import engine_error
from omni.serving.prepared import max_upload_bytes
from omni.serving.requests.transcriptions import TranscriptionRequest, parse_transcription_request
from omni.serving.transcriptions import Transcription
from omni.text.tokenizer import TextTokenizer


async def create_transcription(request: web.Request) -> web.StreamResponse:
    models = request.app[MODELS]
    max_file_bytes = max_upload_bytes(models)
    form = await read_transcription_form(request, max_file_bytes=max_file_bytes, timeout=body_timeout(request))
    req = parse_transcription_request(form)
    t = await lifecycle.transcription(models, req, timeout=request_timeout(request))
    note_generation(request, t.model.name, t.generations)
    with t.admitted():
        return await respond(request, req, t)


async def respond(request: web.Request, req: TranscriptionRequest, t: Transcription) -> web.StreamResponse:
    if req.stream:
        return await _stream(request, req, t)
    [choice] = await sse.collect([t.output])
    if req.response_format == "text":
        return web.Response(text=choice.text, content_type="text/plain")
    if req.response_format == "verbose_json":
        return await sse.json_response(_verbose(req, t, choice.text, choice.logprobs))
    body = TranscriptionBody(text=choice.text, usage=_usage(t))
    if req.logprobs:
        body.logprobs = _logprob_entries(t, choice.logprobs)
    return await sse.json_response(body)


def _usage(t: Transcription) -> TranscriptionUsage:
    prompt = t.output.usage.prompt_tokens
    output = t.output.usage.completion_tokens
    details = TranscriptionTokenDetails(text_tokens=prompt - t.num_audio_tokens, audio_tokens=t.num_audio_tokens)
    return TranscriptionUsage(prompt, details, output, prompt + output)


def _verbose(
    req: TranscriptionRequest, t: Transcription, text: str, logprobs: Sequence[TokenLogprob]
) -> TranscriptionVerbose:
    duration = round(t.duration, 3)
    raw = text.encode()
    segment = TranscriptionSegment(
        id=0,
        seek=0,
        start=0.0,
        end=duration,
        text=text,
        tokens=[lp.token_id for lp in logprobs],
        temperature=req.temperature,
        avg_logprob=sum(lp.logprob for lp in logprobs) / len(logprobs) if logprobs else 0.0,
        compression_ratio=len(raw) / len(zlib.compress(raw)),
        no_speech_prob=0.0,
    )
    return TranscriptionVerbose(
        language=req.language or "unknown",
        duration=duration,
        text=text,
        segments=[segment],
        usage=DurationUsage(duration),
    )


def _logprob_entries(t: Transcription, logprobs: Sequence[TokenLogprob]) -> list[LogprobEntry]:
    """OpenAI's {token, logprob, bytes} per token of the transcript (the stop token is none)."""
    tokenizer: TextTokenizer = t.model.tokenizer
    eos = tokenizer.eos_token_ids
    return [logprob_entry(tokenizer, lp.token_id, lp.logprob) for lp in logprobs if lp.token_id not in eos]


async def _stream(request: web.Request, req: TranscriptionRequest, t: Transcription) -> web.StreamResponse:
    response = await sse.open_event_stream(request)
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    pending: list[TokenLogprob] = []  # of tokens that added no text yet: sent with the next delta
    try:
        async with aclosing(t.output.deltas()) as deltas:
            async for delta in deltas:
                logprobs += delta.logprobs
                pending += delta.logprobs
                if not delta.text:
                    continue
                parts.append(delta.text)
                event = TranscriptTextDeltaEvent(delta=delta.text)
                if req.logprobs:
                    event.logprobs = _logprob_entries(t, pending)
                pending = []
                await _event(response, "transcript.text.delta", event)
    except EngineError as exc:  # the status is sent already: say it in the stream
        await _event(response, "error", {"type": "error", **engine_error(exc).to_dict()})
        await response.write_eof()
        return response
    done = TranscriptTextDoneEvent(text="".join(parts), usage=_usage(t))
    if req.logprobs:
        done.logprobs = _logprob_entries(t, logprobs)
    await _event(response, "transcript.text.done", done)
    await response.write_eof()
    return response


async def _event(response: web.StreamResponse, kind: str, payload: object) -> None:
    await response.write(f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode(payload) + b"\n\n")

