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
--max-request-bytes and --body-timeout. parse_transcription_request then reads the values into
TranscriptionFields, where each field is declared once (common.py says how), as the JSON
endpoints' parsers read theirs.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias

from msgspec import Struct

from omni.serving.requests.common import (
    Priority,
    Refused,
    check_known,
    honoured,
    known_fields,
    rejected,
)
from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    convert,
    form_bool,
    form_value,
    unsupported,
    value_error,
)
from omni.shared.sampling_bounds import sampling_bound

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
ResponseFormat: TypeAlias = Literal["json", "text", "verbose_json"]
Include: TypeAlias = Literal["logprobs"]
RESPONSE_FORMATS: tuple[str, ...] = typing.get_args(ResponseFormat)
# Timed captions: the model writes no timestamps.
TIMED_FORMATS = ("srt", "vtt")
MAX_PROMPT_CHARS = 4096
MAX_TEMPERATURE = 1.0  # OpenAI's range for transcriptions: 0 to 1
LANGUAGE_PATTERN = "^[A-Za-z]{2}$"  # ISO-639-1, either case


class TranscriptionFields(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The form's fields, each text read as its type."""

    file: Annotated[bytes, honoured("the audio file, in any format FFmpeg reads", extra_json_schema={"format": "binary"})]
    # A form has no null: a model left out is the only one that reads audio.
    model: Annotated[str, honoured("a served model with an audio encoder; left out: the only one")] = ""
    language: Annotated[
        str, honoured("the spoken language, ISO-639-1; empty: detected", extra_json_schema={"anyOf": [{"pattern": LANGUAGE_PATTERN}, {"maxLength": 0}]})
    ] = ""
    prompt: Annotated[str, honoured("text the speech continues, e.g. names to spell", max_length=MAX_PROMPT_CHARS)] = ""
    response_format: Annotated[ResponseFormat, honoured("json, text or verbose_json (with duration and language)")] = (
        "json"
    )
    temperature: Annotated[float, honoured("the sampling temperature; 0 is greedy", **sampling_bound("temperature", le=MAX_TEMPERATURE))] = 0.0
    stream: Annotated[bool, honoured("server-sent events as the text comes; not with verbose_json")] = False
    include: Annotated[list[Include], honoured("logprobs: each token's log probability (with json only)")] = []
    seed: Annotated[
        int, honoured("seeds the sampling", ge=MIN_SEED, extra_json_schema={"maximum": MAX_SEED})
    ] | None = None
    priority: Priority = 0
    # OpenAI's fields for what this model has not got: a 400 naming the field whatever its value.
    timestamp_granularities: Annotated[Refused, rejected("this model gives no timestamps")] = None
    chunking_strategy: Annotated[
        Refused, rejected("the audio is transcribed as one block (no voice activity detection)")
    ] = None
    known_speaker_names: Annotated[Refused, rejected("this model labels no speakers")] = None
    known_speaker_references: Annotated[Refused, rejected("this model labels no speakers")] = None
    keywords: Annotated[Refused, rejected("put the words in 'prompt'")] = None
    languages: Annotated[Refused, rejected("give one language in 'language'")] = None


TRANSCRIPTION_FIELDS = known_fields(TranscriptionFields)
# The field a form gives as several parts (`include[]`); every other one is one text.
_LISTS = frozenset({"include"})


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
    priority: int = 0


def parse_transcription_request(form: TranscriptionForm) -> TranscriptionRequest:
    check_known(form.fields, TRANSCRIPTION_FIELDS, TRANSCRIPTIONS_PATH)
    values: dict[str, Any] = {
        name: list(parts) if name in _LISTS else form_value(name, parts) for name, parts in form.fields.items() if parts
    }
    if form.file is not None:
        values["file"] = form.file
    if values.get("response_format") in TIMED_FORMATS:
        fmt = values["response_format"]
        raise unsupported("response_format", f"{fmt} captions need timestamps, and this model gives none.")
    if "stream" in values:
        values["stream"] = form_bool(values["stream"], "stream")
    # not strict: each text is read as its field's type ("0.4" a number)
    fields = convert(values, TranscriptionFields, strict=False)
    if not fields.file:
        raise value_error("file", "the file is empty.")
    if fields.stream and fields.response_format == "verbose_json":
        raise unsupported("response_format", "verbose_json is not streamed; send json or text with 'stream'.")
    if fields.include and fields.response_format != "json":
        raise unsupported("include", "logprobs come with response_format json only.")
    if fields.seed is not None and fields.seed > MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {fields.seed}.")
    return TranscriptionRequest(
        model=fields.model or None,
        file=fields.file,
        language=_language(fields.language),
        prompt=fields.prompt if fields.prompt.strip() else None,
        response_format=fields.response_format,
        temperature=fields.temperature,
        stream=fields.stream,
        logprobs=bool(fields.include),
        seed=fields.seed,
        priority=fields.priority,
    )


def _language(value: str) -> str | None:
    if not value:  # some clients send the field empty
        return None
    if not (len(value) == 2 and value.isascii() and value.isalpha()):  # (a pattern's $ would take "en\n")
        raise value_error("language", f"expected an ISO-639-1 code such as 'en', got {value!r}.")
    return value.lower()
