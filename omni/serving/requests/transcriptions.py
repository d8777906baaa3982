"""The body of POST /v1/audio/transcriptions: a multipart/form-data upload, as the official
openai client sends it (every value a text part, the audio a file part named `file`; a list
field's parts named `include[]`, or `include` as other clients send them).

OpenAI's fields: file, model, language, prompt, response_format (json | text | verbose_json),
temperature, stream, include (["logprobs"]). What this model cannot give is a 400 naming the
field: timestamps (timestamp_granularities, and the srt and vtt formats, which are timed
captions), speaker labels (diarized_json, known_speaker_*), VAD chunking (chunking_strategy)
and gpt-transcribe's keywords and languages. vLLM's extension: seed. A field of neither is a
400 naming it, as on the other endpoints.

Reading the body (omni/http/body.py read_transcription_form) only collects the parts, bounded:
the file by --max-media-bytes, each text value by MAX_FIELD_BYTES, the whole body by
--max-request-bytes and --body-timeout. parse_transcription_request then reads the values, as
the JSON endpoints' parsers read theirs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from omni.errors import bad_request
from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    check_known_fields,
    missing,
    unsupported,
    value_error,
)

RESPONSE_FORMATS = ("json", "text", "verbose_json")
# Timed captions: the model writes no timestamps.
TIMED_FORMATS = ("srt", "vtt")
INCLUDES = ("logprobs",)
MAX_PROMPT_CHARS = 4096
MAX_TEMPERATURE = 1.0  # OpenAI's range for transcriptions: 0 to 1
LANGUAGE_PATTERN = "^[A-Za-z]{2}$"  # ISO-639-1, either case
_LANGUAGE = re.compile(LANGUAGE_PATTERN)

_TEXT_FIELDS = ("model", "language", "prompt", "response_format", "temperature", "stream", "seed")
_LIST_FIELDS = ("include", "timestamp_granularities")
# OpenAI's fields for what this model has not got: a 400 naming the field whatever its value.
UNSUPPORTED: Mapping[str, str] = {
    "timestamp_granularities": "this model gives no timestamps.",
    "chunking_strategy": "the audio is transcribed as one block (no voice activity detection).",
    "known_speaker_names": "this model labels no speakers.",
    "known_speaker_references": "this model labels no speakers.",
    "keywords": "put the words in 'prompt'.",
    "languages": "give one language in 'language'.",
}
KNOWN_FIELDS = frozenset({"file", *_TEXT_FIELDS, *_LIST_FIELDS, *UNSUPPORTED})


@dataclass(frozen=True, slots=True)
class TranscriptionForm:
    """The parts of the body, not yet read as values: each field's values in the order sent."""

    fields: Mapping[str, Sequence[str]]
    file: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptionRequest:
    model: str | None  # None: the server's only model that reads audio
    file: bytes
    language: str | None = None  # ISO-639-1, lower case
    prompt: str | None = None
    response_format: str = "json"
    temperature: float = 0.0
    stream: bool = False
    logprobs: bool = False  # include: ["logprobs"]
    seed: int | None = None


def parse_transcription_request(form: TranscriptionForm) -> TranscriptionRequest:
    fields = form.fields
    check_known_fields(fields, KNOWN_FIELDS, "/v1/audio/transcriptions")
    for name, why in UNSUPPORTED.items():
        if name in fields:
            raise unsupported(name, why)
    text = {name: _one(fields, name) for name in _TEXT_FIELDS}
    if form.file is None:
        raise missing("file")
    if not form.file:
        raise value_error("file", "the file is empty.")
    response_format = text["response_format"] or "json"
    if response_format in TIMED_FORMATS:
        raise unsupported("response_format", f"{response_format} captions need timestamps, and this model gives none.")
    if response_format not in RESPONSE_FORMATS:
        raise value_error("response_format", f"'{response_format}'; expected one of {', '.join(RESPONSE_FORMATS)}.")
    stream = _bool(text["stream"], "stream")
    if stream and response_format == "verbose_json":
        raise unsupported("response_format", "verbose_json is not streamed; send json or text with 'stream'.")
    logprobs = _include(fields.get("include", ()), response_format)
    return TranscriptionRequest(
        model=text["model"] or None,
        file=form.file,
        language=_language(text["language"]),
        prompt=_prompt(text["prompt"]),
        response_format=response_format,
        temperature=_temperature(text["temperature"]),
        stream=stream,
        logprobs=logprobs,
        seed=_seed(text["seed"]),
    )


def _one(fields: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = fields.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise bad_request(f"'{name}' is given {len(values)} times; send it once.", param=name)
    return values[0]


def _bool(value: str | None, name: str) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise value_error(name, f"expected true or false, got {value!r}.")
    return lowered == "true"


def _language(value: str | None) -> str | None:
    if not value:  # some clients send the field empty
        return None
    if not _LANGUAGE.fullmatch(value):  # (match would take "en\n")
        raise value_error("language", f"expected an ISO-639-1 code such as 'en', got {value!r}.")
    return value.lower()


def _prompt(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_PROMPT_CHARS:
        raise value_error("prompt", f"must be at most {MAX_PROMPT_CHARS} characters, got {len(value)}.")
    return value if value and value.strip() else None


def _temperature(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        raise value_error("temperature", f"expected a number, got {value!r}.") from None
    if not (math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE):
        raise value_error("temperature", f"must be between 0 and {MAX_TEMPERATURE:g}, got {value}.")
    return temperature


def _seed(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seed = int(value)
    except ValueError:
        raise value_error("seed", f"expected an integer, got {value!r}.") from None
    if not MIN_SEED <= seed <= MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {seed}.")
    return seed


def _include(values: Sequence[str], response_format: str) -> bool:
    for value in values:
        if value not in INCLUDES:
            raise value_error("include", f"'{value}'; expected one of {', '.join(INCLUDES)}.")
    if values and response_format != "json":
        raise unsupported("include", "logprobs come with response_format json only.")
    return bool(values)
