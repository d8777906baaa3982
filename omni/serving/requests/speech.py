"""The body of POST /v1/audio/speech, as the official openai client sends it. Each field is
declared once (common.py says how).

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
import typing
from typing import Annotated, Literal, TypeAlias

from msgspec import Meta, Struct, field

from omni.serving.requests.common import Priority, check_known, honoured, known_fields
from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    Body,
    convert,
    missing,
    value_error,
)
from omni.shared.media.audio_encoding import SPEECH_AUDIO_FORMATS
from omni.text.constrained.audio_span import MAX_UNITS, MIN_UNITS

SPEECH_PATH = "/v1/audio/speech"
MAX_INPUT_CHARS = 4096  # OpenAI's
MIN_SPEED, MAX_SPEED = 0.25, 4.0
AudioFormat: TypeAlias = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
StreamFormat: TypeAlias = Literal["audio", "sse"]
assert typing.get_args(AudioFormat) == SPEECH_AUDIO_FORMATS
STREAM_FORMATS: tuple[str, ...] = typing.get_args(StreamFormat)


class VoiceId(Struct, frozen=True, forbid_unknown_fields=True):
    """OpenAI's custom voice reference; its id is a voice name here."""

    id: str


class ReferenceAudio(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    data: Annotated[str, Meta(description="base64", extra_json_schema={"pattern": r"\S", "contentEncoding": "base64"})]
    format: str | None = None


class SpeechRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    input: Annotated[
        str, honoured("the text to speak", max_length=MAX_INPUT_CHARS, extra_json_schema={"pattern": r"\S"})
    ]
    # "": none given (reference_audio gives the voice)
    voice_sent: Annotated[
        str | VoiceId,
        honoured(
            "a voice of the model: a speaker of its checkpoint, or one of OpenAI's voice names (alloy, ash, ...) "
            "mapped onto them; an unknown voice is a 400 listing the voices"
        ),
    ] = field(name="voice", default="")
    # None: the server's only model that speaks
    model: Annotated[str | None, honoured("a served model with an audio decoder; null: the only one")] = None
    instructions: Annotated[str, honoured("how to speak: a system turn", max_length=MAX_INPUT_CHARS)] | None = None
    response_format: Annotated[AudioFormat, honoured("the audio file's format")] = "mp3"
    speed: Annotated[float, honoured("a time stretch that keeps the pitch", ge=MIN_SPEED, le=MAX_SPEED)] = 1.0
    stream_format: Annotated[
        StreamFormat,
        honoured(
            "audio: the file's bytes as they are made (chunked); sse: speech.audio.delta events, then speech.audio.done"
        ),
    ] = "audio"
    seed: Annotated[
        int,
        honoured(
            "an extension: the same seed speaks the same audio", ge=MIN_SEED, extra_json_schema={"maximum": MAX_SEED}
        ),
    ] | None = None
    max_units: Annotated[
        int,
        honoured(f"an extension: the most units (25 a second) to speak; default {MAX_UNITS}", ge=MIN_UNITS, le=MAX_UNITS),
    ] = MAX_UNITS
    # None: --voice-priority under the priority policy (0 under fcfs)
    priority: Priority | None = None
    reference: Annotated[
        ReferenceAudio,
        honoured(
            "an extension: a recording (base64, any format FFmpeg reads) whose voice is spoken in, on a model with a "
            "speaker encoder; voice may then be left out"
        ),
    ] | None = field(name="reference_audio", default=None)

    @property
    def voice(self) -> str:
        return self.voice_sent if isinstance(self.voice_sent, str) else self.voice_sent.id

    @property
    def reference_audio(self) -> bytes | None:
        """The recording to take the voice from (its base64 checked by parse_speech_request)."""
        return None if self.reference is None else base64.b64decode(self.reference.data, validate=True)

    @property
    def reference_format(self) -> str | None:
        return None if self.reference is None else self.reference.format


SPEECH_FIELDS = known_fields(SpeechRequest)


def parse_speech_request(body: Body) -> SpeechRequest:
    check_known(body, SPEECH_FIELDS, SPEECH_PATH)
    req = convert(body, SpeechRequest, within=("voice", "reference_audio"))
    if not req.input.strip():
        raise value_error("input", "must not be empty.")
    if req.reference is None and not req.voice:
        raise missing("voice")
    if req.reference is not None:
        try:
            decoded = base64.b64decode(req.reference.data, validate=True)
        except (binascii.Error, ValueError):
            raise value_error("reference_audio.data", "is not valid base64.") from None
        if not decoded:
            raise value_error("reference_audio.data", "is empty.")
    if req.seed is not None and req.seed > MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {req.seed}.")
    return req
