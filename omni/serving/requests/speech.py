"""The body of POST /v1/audio/speech, as the official openai client sends it.

OpenAI's fields: model, input (at most 4,096 characters), voice (a name, or {"id": name}),
instructions, response_format (mp3 | opus | aac | flac | wav | pcm), speed (0.25 to 4) and
stream_format (audio: the file's bytes as they are made; sse: speech.audio.delta events).
Extensions: seed (the same seed gives the same audio), max_units (the most units the model
may speak, 3 to 2,000; 25 a second) and reference_audio ({"data": base64, "format": "wav"}: a
recording whose voice is spoken in, on a checkpoint with a speaker encoder; voice may then be
left out). A field of neither is a 400 naming it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    Body,
    check_known_fields,
    opt_int,
    opt_number,
    opt_str,
    required_str,
    type_error,
    value_error,
)
from omni.text.constrained.audio_span import MAX_UNITS, MIN_UNITS
from omni.shared.media.audio_encoding import SPEECH_AUDIO_FORMATS

MAX_INPUT_CHARS = 4096  # OpenAI's
MIN_SPEED, MAX_SPEED = 0.25, 4.0
STREAM_FORMATS = ("audio", "sse")
_KNOWN = frozenset(
    {
        "model", "input", "voice", "instructions", "response_format", "speed", "stream_format", "seed", "max_units",
        "reference_audio",
    }  # fmt: skip
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechRequest:
    model: str | None  # None: the server's only model that speaks
    input: str
    voice: str
    instructions: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    seed: int | None = None
    max_units: int = MAX_UNITS
    reference_audio: bytes | None = None  # a recording to take the voice from
    reference_format: str | None = None


def parse_speech_request(body: Body) -> SpeechRequest:
    check_known_fields(body, _KNOWN, "/v1/audio/speech")
    text = required_str(body, "input")
    if not text.strip():
        raise value_error("input", "must not be empty.")
    if len(text) > MAX_INPUT_CHARS:
        raise value_error("input", f"must be at most {MAX_INPUT_CHARS} characters, got {len(text)}.")
    instructions = opt_str(body, "instructions")
    if instructions is not None and len(instructions) > MAX_INPUT_CHARS:
        raise value_error("instructions", f"must be at most {MAX_INPUT_CHARS} characters.")
    fmt = opt_str(body, "response_format") or "mp3"
    if fmt not in SPEECH_AUDIO_FORMATS:
        raise value_error("response_format", f"must be one of {', '.join(SPEECH_AUDIO_FORMATS)}, got {fmt!r}.")
    stream_format = opt_str(body, "stream_format") or "audio"
    if stream_format not in STREAM_FORMATS:
        raise value_error("stream_format", f"must be one of {', '.join(STREAM_FORMATS)}, got {stream_format!r}.")
    speed = opt_number(body, "speed")
    if speed is not None and not MIN_SPEED <= speed <= MAX_SPEED:
        raise value_error("speed", f"must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}.")
    max_units = opt_int(body, "max_units", lo=MIN_UNITS, hi=MAX_UNITS)
    reference, reference_format = _reference(body)
    return SpeechRequest(
        model=opt_str(body, "model"),
        input=text,
        voice="" if reference is not None and body.get("voice") is None else _voice(body),
        reference_audio=reference,
        reference_format=reference_format,
        instructions=instructions,
        response_format=fmt,
        speed=1.0 if speed is None else float(speed),
        stream_format=stream_format,
        seed=opt_int(body, "seed", lo=MIN_SEED, hi=MAX_SEED),
        max_units=MAX_UNITS if max_units is None else max_units,
    )


def _reference(body: Body) -> tuple[bytes | None, str | None]:
    raw = body.get("reference_audio")
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise type_error("reference_audio", "an object with data (base64) and format", raw)
    data = required_str(raw, "data", "reference_audio.data")
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise value_error("reference_audio.data", "is not valid base64.") from None
    if not decoded:
        raise value_error("reference_audio.data", "is empty.")
    return decoded, opt_str(raw, "format", "reference_audio.format")


def _voice(body: Body) -> str:
    """A voice name, or OpenAI's {"id": name} form of one."""
    raw = body.get("voice")
    if isinstance(raw, dict):
        return required_str(raw, "id", "voice.id")
    if raw is not None and not isinstance(raw, str):
        raise type_error("voice", "a string or an object with an id", raw)
    return required_str(body, "voice")
