"""GET /openapi.json: the OpenAPI 3.1 document of the whole API, for schema-based fuzzers and
client generators.

The request schemas are written from the parsers (omni/serving/requests), not from OpenAI's
reference: a range here is the range the parser refuses outside of. Every field of
known_fields' tables is a property; a field the server only accepts at its default, or
refuses, gets its schema from its KnownField, so the table stays the one place that says
what is accepted. The images, speech and transcription endpoints have no table (their parsers
list their own fields), so their schemas are written here whole; the transcription body is a
multipart form, whose values are text: its schema gives the type each text is read as.
tests/omni/http/test_openapi.py fails when a field or a route is
undocumented. The response components are the JSON schemas of the Structs the handlers encode
(omni/serving/responses.py, and omni/errors.py's Error).

What a schema cannot say is left to the descriptions and answered with a 400 naming the
field: a token id past the vocabulary, a prompt past the context, two output constraints at
once, a tool named twice, min_tokens above max_tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeAlias

import msgspec
import orjson
from aiohttp import web

from omni.errors import Error
from omni.serving.responses import RESPONSE_TYPES

from omni.serving.requests.chat import AUDIO_FORMATS, MAX_TEMPLATE_BYTES, MAX_TOP_LOGPROBS, RESERVED_TEMPLATE_KWARGS, ROLES
from omni.serving.requests.completions import MAX_COMPLETION_LOGPROBS
from omni.serving.requests.fields import (
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_PROMPT_LOGPROBS,
    MAX_REQUEST_ID_LENGTH,
    MAX_SEED,
    MAX_STOP_STRINGS,
    MIN_SEED,
)
from omni.serving.requests.images import (
    MAX_GUIDANCE,
    MAX_IMAGES,
    MAX_PARTIAL_IMAGES,
    MAX_PROMPT_CHARS,
    MAX_STEPS,
    OUTPUT_FORMATS,
    RESPONSE_FORMATS,
)
from omni.serving.requests.speech import MAX_INPUT_CHARS, MAX_SPEED, MIN_SPEED, STREAM_FORMATS
from omni.serving.requests.transcriptions import (
    INCLUDES,
    LANGUAGE_PATTERN,
    MAX_TEMPERATURE,
    RESPONSE_FORMATS as TRANSCRIPTION_FORMATS,
)
from omni.serving.requests.transcriptions import KNOWN_FIELDS as TRANSCRIPTION_FIELDS
from omni.serving.requests.transcriptions import MAX_PROMPT_CHARS as MAX_TRANSCRIPTION_PROMPT_CHARS
from omni.serving.requests.transcriptions import UNSUPPORTED as TRANSCRIPTION_UNSUPPORTED
from omni.serving.requests.dispositions import (
    FIELDS,
    OBJECT,
    PATHS,
    STREAM_OPTIONS_FIELDS,
    STRING,
    STRING_MAP,
    Disposition,
    Endpoint,
    JsonType,
    KnownField,
    SameAs,
)
from omni.serving.requests.structured import GUIDED_BACKENDS
from omni.serving.requests.tools import MAX_TOOLS
from omni.http.handlers.speech import SPEECH_PATH
from omni.http.handlers.tokenize import DETOKENIZE_PATH, TEMPLATE_FIELDS, TOKENIZE_PATH
from omni.http.handlers.transcriptions import TRANSCRIPTIONS_PATH
from omni.text.constrained.audio_span import MAX_UNITS, MIN_UNITS
from omni.shared.media.audio_encoding import MEDIA_TYPES, SPEECH_AUDIO_FORMATS
from omni.shared.media.image_sizes import ALLOWED_SIZES
from omni.http.state import CONFIG, MODELS
from omni.shared.store.local import ARTIFACT_PATH

Schema: TypeAlias = dict[str, Any]

OPENAPI_PATH = "/openapi.json"
IMAGES_PATH = "/v1/images/generations"
# Not a request field: the server merges a literal extra_body object into the body (what the
# OpenAI SDK does with its extra_body argument) before the fields are checked.
EXTRA_BODY = "extra_body"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _or_null(schema: Schema, description: str | None = None) -> Schema:
    out: Schema = {"anyOf": [schema, {"type": "null"}]}
    if description:
        out["description"] = description
    return out


def _int(lo: int | None = None, hi: int | None = None) -> Schema:
    return _bounded("integer", lo, hi)


def _number(lo: float | None = None, hi: float | None = None) -> Schema:
    return _bounded("number", lo, hi)


def _bounded(kind: str, lo: float | None, hi: float | None) -> Schema:
    out: Schema = {"type": kind}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


_BOOL: Schema = {"type": "boolean"}
_STRING: Schema = {"type": "string"}
_NON_BLANK: Schema = {"type": "string", "pattern": r"\S"}
_TOKEN_IDS: Schema = {"type": "array", "items": _int(0)}
_JSON_SCHEMA: Schema = {"type": ["object", "boolean"], "description": "A JSON schema."}


# ----------------------------------------------------------------------------- request fields

# The drawing options a chat request's `image` object and an images request share.
_IMAGE_OPTIONS: dict[str, Schema] = {
    "size": {"enum": list(ALLOWED_SIZES), "description": "auto: the size of the aspect ratio the model picks."},
    "response_format": {"enum": list(RESPONSE_FORMATS), "description": "url: a signed URL; b64_json: the bytes."},
    "output_format": {"enum": list(OUTPUT_FORMATS), "default": "png"},
    "output_compression": {**_int(0, 100), "description": "The jpeg or webp quality."},
    "num_inference_steps": {**_int(1, MAX_STEPS), "description": "Denoising steps; default: the server's."},
    "guidance_scale": {**_number(0.0, MAX_GUIDANCE), "description": "Default: the checkpoint's."},
}
# output_format defaults to png, which has no compression
_COMPRESSION_NEEDS_JPEG_OR_WEBP: Schema = {
    "if": {"properties": {"output_compression": {"not": {"type": "null"}}}, "required": ["output_compression"]},
    "then": {"properties": {"output_format": {"enum": ["jpeg", "webp"]}}, "required": ["output_format"]},
}


# The schema of each HONOURED field (and of an INFORMATIONAL one whose parser checks more than
# its JsonType), without null: _field_schema adds it, as every known field takes null.
_SHARED_FIELDS: dict[str, Schema] = {
    "frequency_penalty": _number(-2.0, 2.0),
    "presence_penalty": _number(-2.0, 2.0),
    "logit_bias": {
        "type": "object",
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": _number(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS),
        "description": "Token id (as a decimal string, each id once) -> a bias added to its logit.",
    },
    "n": _int(1, MAX_N),
    "seed": _int(MIN_SEED, MAX_SEED),
    "stop": {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "maxItems": MAX_STOP_STRINGS, "items": {"type": "string", "minLength": 1}},
        ]
    },
    "stream": _BOOL,
    "stream_options": _ref("StreamOptions"),
    "temperature": _number(0.0, 2.0),
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": _int(-1),
    "min_p": _number(0.0, 1.0),
    "repetition_penalty": {"type": "number", "minimum": 0.001, "maximum": 1000},
    "stop_token_ids": _TOKEN_IDS,
    "include_stop_str_in_output": _BOOL,
    "ignore_eos": _BOOL,
    "min_tokens": _int(0),
    "skip_special_tokens": _BOOL,
    "truncate_prompt_tokens": {
        "type": "integer",
        "anyOf": [{"minimum": 1}, {"const": -1}],
        "description": "Keep the prompt's last N tokens; -1: the model's maximum context length.",
    },
    "prompt_logprobs": _int(0, MAX_PROMPT_LOGPROBS),
    "allowed_token_ids": {"type": "array", "minItems": 1, "items": _int(0)},
    "bad_words": {"type": "array", "items": _NON_BLANK},
    "response_format": _ref("ResponseFormat"),
    "structured_outputs": _ref("StructuredOutputs"),
    "guided_json": {"anyOf": [_JSON_SCHEMA, _STRING], "description": "A JSON schema, or its JSON text."},
    "guided_regex": {"type": "string", "minLength": 1},
    "guided_choice": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    "guided_grammar": {"type": "string", "minLength": 1},
    "guided_decoding_backend": {"enum": sorted(GUIDED_BACKENDS)},
    "request_id": {"type": "string", "minLength": 1, "maxLength": MAX_REQUEST_ID_LENGTH},
    "return_tokens_as_token_ids": _BOOL,
    "thinking_token_budget": _int(0),
}

_CHAT_FIELDS: dict[str, Schema] = {
    **_SHARED_FIELDS,
    "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
    "max_tokens": _int(1),
    "max_completion_tokens": _int(1),
    "logprobs": _BOOL,
    "top_logprobs": _int(0, MAX_TOP_LOGPROBS),
    # audio output is refused until the vocoder exists
    "modalities": {
        "type": "array",
        "minItems": 1,
        "items": {"enum": ["text", "image"]},
        "description": "Absent, or with image: the model may draw images (if it has a vision decoder).",
    },
    "image": {
        "type": "object",
        "properties": {name: _or_null(schema) for name, schema in _IMAGE_OPTIONS.items()},
        "additionalProperties": False,
        **_COMPRESSION_NEEDS_JPEG_OR_WEBP,
        "description": "How the images the model draws are drawn and returned (an extension, shaped like audio).",
    },
    "audio": {
        "type": "object",
        "properties": {"voice": _STRING, "format": {"enum": sorted(AUDIO_FORMATS)}},
        "required": ["voice", "format"],
    },
    "parallel_tool_calls": _BOOL,
    "tool_choice": _ref("ToolChoice"),
    "tools": {"type": "array", "maxItems": MAX_TOOLS, "items": _ref("Tool")},
    "echo": _BOOL,
    "add_generation_prompt": _BOOL,
    "continue_final_message": _BOOL,
    "documents": {"type": "array", "items": {"type": "object"}},
    "chat_template": {
        **_NON_BLANK,
        "description": f"At most {MAX_TEMPLATE_BYTES} bytes; refused unless the server trusts request templates.",
    },
    "chat_template_kwargs": {
        "type": "object",
        "propertyNames": {"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}},
    },
}

_COMPLETION_FIELDS: dict[str, Schema] = {
    **_SHARED_FIELDS,
    "prompt": {
        "anyOf": [
            _STRING,
            {"type": "array", "minItems": 1, "items": _STRING},
            {"type": "array", "minItems": 1, "items": _int(0)},
            {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": _int(0)}},
        ],
        "description": "Text or token ids, one prompt or many.",
    },
    "max_tokens": {**_int(0), "description": "0 only with echo: the prompt alone, scored."},
    "echo": _BOOL,
    "logprobs": _int(0, MAX_COMPLETION_LOGPROBS),
}

FIELD_SCHEMAS: Mapping[Endpoint, Mapping[str, Schema]] = {"chat": _CHAT_FIELDS, "completions": _COMPLETION_FIELDS}

# The fields a parser requires (null is "missing"); every other field takes null.
REQUIRED: Mapping[Endpoint, tuple[str, ...]] = {"chat": ("model", "messages"), "completions": ("model", "prompt")}

_JSON_TYPES: dict[JsonType, Schema] = {
    STRING: _STRING,
    OBJECT: {"type": "object"},
    STRING_MAP: {"type": "object", "additionalProperties": _STRING},
}


def _field_schema(field: KnownField, explicit: Schema | None) -> Schema | None:
    """The field's schema with null; None when an HONOURED field has none written (the test's
    failure: the document would leave the field out)."""
    if field.disposition is Disposition.HONOURED:
        return None if explicit is None else _or_null(explicit, field.reason)
    if field.disposition is Disposition.INFORMATIONAL:
        assert field.json_type is not None
        return _or_null(explicit or _JSON_TYPES[field.json_type], field.reason)
    if field.disposition is Disposition.REJECTED:
        return {"type": "null", "description": f"Not supported: {field.reason}. Only null is accepted."}
    # ACCEPTED_DEFAULT_ONLY
    same = [d for d in field.defaults if isinstance(d, SameAs)]
    if same:  # best_of: equal to n
        return _or_null(
            {"type": "number"},
            f"Only {field.accepted} is accepted: {field.reason}.",
        )
    return {"enum": [*field.defaults, None], "description": f"Only {field.accepted} is accepted: {field.reason}."}


def _request_schema(endpoint: Endpoint, model_names: list[str]) -> Schema:
    explicit = FIELD_SCHEMAS[endpoint]
    properties: dict[str, Schema] = {}
    for name, field in FIELDS[endpoint].items():
        if name == "model":
            model: Schema = {"type": "string", "description": "A served model's name (GET /v1/models)."}
            if model_names:
                model["enum"] = list(model_names)
            properties[name] = model
            continue
        schema = _field_schema(field, explicit.get(name))
        if schema is None:
            continue
        if name in REQUIRED[endpoint]:  # the parsers' missing_required_parameter: null is missing
            schema = {**explicit[name], "description": field.reason}
        properties[name] = schema
    properties[EXTRA_BODY] = _or_null(
        {"type": "object"}, "Merged into the body (its keys win): what the OpenAI SDK sends as extra_body."
    )
    return {
        "type": "object",
        "properties": properties,
        "required": list(REQUIRED[endpoint]),
        # a field of neither OpenAI's nor vLLM's API is a 400 naming it
        "additionalProperties": False,
    }


# POST /v1/images/generations: every field the parser reads, each taking null (its default)
# but prompt. quality, background and moderation are accepted only at "the server decides".
IMAGE_FIELDS: Mapping[str, Schema] = {
    "prompt": {"type": "string", "pattern": r"\S", "maxLength": MAX_PROMPT_CHARS},
    "n": _int(1, MAX_IMAGES),
    **_IMAGE_OPTIONS,
    "stream": _BOOL,
    "partial_images": {
        **_int(0, MAX_PARTIAL_IMAGES),
        "description": "Previews per image from intermediate denoising steps; more than 0 needs stream.",
    },
    "quality": {"enum": ["auto", "standard"], "description": "Only the default: this server decides it."},
    "background": {"enum": ["auto", "opaque"], "description": "Only the default: the images are opaque."},
    "moderation": {"enum": ["auto"], "description": "Only the default: no moderation model runs."},
    "user": _STRING,
    "seed": {**_int(MIN_SEED, MAX_SEED), "description": "Image i is drawn with seed + i."},
}


def _image_request_schema(model_names: list[str]) -> Schema:
    model: Schema = {"type": "string", "description": "A served model with a vision decoder; null: the only one."}
    if model_names:
        model["enum"] = list(model_names)
    properties: dict[str, Schema] = {"model": _or_null(model)}
    for name, schema in IMAGE_FIELDS.items():
        properties[name] = schema if name == "prompt" else _or_null(schema)
    properties["style"] = {"type": "null", "description": "Not supported: the image decoder has no styles."}
    properties[EXTRA_BODY] = _or_null({"type": "object"}, "Merged into the body (its keys win).")
    return {
        "type": "object",
        "properties": properties,
        "required": ["prompt"],
        "additionalProperties": False,
        "allOf": [
            _COMPRESSION_NEEDS_JPEG_OR_WEBP,
            {
                "if": {
                    "properties": {"partial_images": {"type": "integer", "minimum": 1}},
                    "required": ["partial_images"],
                },
                "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
            },
        ],
    }


def _transcription_request_schema(model_names: list[str]) -> Schema:
    """POST /v1/audio/transcriptions: every part of the multipart body the parser reads. A form
    has no null: a field left out has its default. The official client sends a list's parts
    named include[] (the brackets are dropped); a field given twice is a 400."""
    model: Schema = {"type": "string", "description": "A served model with an audio encoder; absent: the only one."}
    if model_names:
        model["enum"] = list(model_names)
    properties: dict[str, Schema] = {
        "file": {
            "type": "string",
            "format": "binary",
            "description": "The audio, in any format FFmpeg reads (wav, mp3, flac, ogg, webm, m4a, ...); "
            "at most --max-media-bytes (a 413), and --max-audio-seconds long.",
        },
        "model": model,
        "language": {
            "type": "string",
            "anyOf": [{"pattern": LANGUAGE_PATTERN}, {"maxLength": 0}],
            "description": "The speech's ISO-639-1 code (e.g. en), put in the prompt as a hint; empty: none.",
        },
        "prompt": {
            "type": "string",
            "maxLength": MAX_TRANSCRIPTION_PROMPT_CHARS,
            "description": "Text whose style, spelling and vocabulary the transcript follows (e.g. what came before).",
        },
        "response_format": {
            "enum": list(TRANSCRIPTION_FORMATS),
            "default": "json",
            "description": "srt and vtt are refused: the model gives no timestamps.",
        },
        "temperature": {**_number(0.0, MAX_TEMPERATURE), "default": 0, "description": "0: greedy, with no fallback."},
        "stream": {**_BOOL, "default": False, "description": "Server-sent events; not with verbose_json."},
        "include": {
            "type": "array",
            "items": {"enum": list(INCLUDES)},
            "description": "logprobs: each token's logprob, with response_format json only.",
        },
        "seed": {**_int(MIN_SEED, MAX_SEED), "description": "An extension (vLLM's): a seed repeats the transcript."},
    }
    for name, why in TRANSCRIPTION_UNSUPPORTED.items():
        properties[name] = {"not": {}, "description": f"Not supported: {why} Any value is a 400."}
    assert set(properties) == TRANSCRIPTION_FIELDS
    return {
        "type": "object",
        "properties": properties,
        "required": ["file"],
        "additionalProperties": False,
        "allOf": [
            {
                "if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
                "then": {"properties": {"response_format": {"not": {"const": "verbose_json"}}}},
            },
            {
                "if": {"properties": {"include": {"minItems": 1}}, "required": ["include"]},
                "then": {"properties": {"response_format": {"const": "json"}}},
            },
        ],
    }


def _speech_request_schema(model_names: list[str]) -> Schema:
    """POST /v1/audio/speech: every field omni/serving/requests/speech.py reads, each taking null (its
    default) but input and voice."""
    model: Schema = {"type": "string", "description": "A served model with an audio decoder; null: the only one."}
    if model_names:
        model["enum"] = list(model_names)
    voice_name: Schema = {
        "type": "string",
        "description": "A voice of the model: a speaker of its checkpoint, or one of OpenAI's voice names "
        "(alloy, ash, ...) mapped onto them; an unknown voice is a 400 listing the voices.",
    }
    properties: dict[str, Schema] = {
        "model": _or_null(model),
        "input": {**_NON_BLANK, "maxLength": MAX_INPUT_CHARS, "description": "The text to speak."},
        "voice": {
            "anyOf": [
                voice_name,
                {
                    "type": "object",
                    "properties": {"id": _STRING},
                    "required": ["id"],
                    "description": "OpenAI's custom voice reference; its id is a voice name here.",
                },
            ]
        },
        "instructions": _or_null({"type": "string", "maxLength": MAX_INPUT_CHARS}, "How to speak: a system turn."),
        "response_format": _or_null({"enum": list(SPEECH_AUDIO_FORMATS), "default": "mp3"}),
        "speed": _or_null({**_number(MIN_SPEED, MAX_SPEED), "default": 1.0}, "A time stretch that keeps the pitch."),
        "stream_format": _or_null(
            {"enum": list(STREAM_FORMATS), "default": "audio"},
            "audio: the file's bytes as they are made (chunked); sse: speech.audio.delta events, then "
            "speech.audio.done.",
        ),
        "seed": _or_null(_int(MIN_SEED, MAX_SEED), "An extension: the same seed speaks the same audio."),
        "max_units": _or_null(
            _int(MIN_UNITS, MAX_UNITS), f"An extension: the most units (25 a second) to speak; default {MAX_UNITS}."
        ),
        "reference_audio": _or_null(
            {
                "type": "object",
                "properties": {"data": {**_NON_BLANK, "contentEncoding": "base64"}, "format": _or_null(_STRING)},
                "required": ["data"],
                "additionalProperties": False,
            },
            "An extension: a recording (base64, any format FFmpeg reads) whose voice is spoken in, on a model "
            "with a speaker encoder; voice may then be left out.",
        ),
        EXTRA_BODY: _or_null({"type": "object"}, "Merged into the body (its keys win)."),
    }
    return {
        "type": "object",
        "properties": properties,
        "required": ["input"],
        # a voice, unless reference_audio gives one
        "anyOf": [{"required": ["voice"]}, {"required": ["reference_audio"], "properties": {"reference_audio": {"type": "object"}}}],
        "additionalProperties": False,
    }


def _tokenize_schemas(model_names: list[str]) -> dict[str, Schema]:
    """vLLM's tokenizer bodies; omni/http/handlers/tokenize.py lists the fields it reads."""
    model: Schema = {"type": "string", "description": "A served model; null: the only one."}
    if model_names:
        model["enum"] = list(model_names)
    common: dict[str, Schema] = {
        "model": _or_null(model),
        "return_token_strs": _or_null(_BOOL, "Also answer each token's string (token_strs)."),
        EXTRA_BODY: _or_null({"type": "object"}, "Merged into the body (its keys win)."),
    }
    chat = {name: _CHAT_FIELDS[name] if name == "messages" else _or_null(_CHAT_FIELDS[name]) for name in TEMPLATE_FIELDS}
    return {
        "TokenizeCompletionRequest": {
            "type": "object",
            "properties": {
                **common,
                "prompt": _STRING,
                "add_special_tokens": _or_null(_BOOL, "Add the tokenizer's special tokens (e.g. BOS); default true."),
            },
            "required": ["prompt"],
            "additionalProperties": False,
        },
        "TokenizeChatRequest": {
            "type": "object",
            "description": "Rendered as a chat completion renders them; media parts are a 400 for now.",
            "properties": {
                **common,
                **chat,
                "add_special_tokens": {"enum": [False, None], "description": "Only false: the template writes them."},
            },
            "required": ["messages"],
            "additionalProperties": False,
        },
        "DetokenizeRequest": {
            "type": "object",
            "properties": {
                "model": common["model"],
                "tokens": {**_TOKEN_IDS, "description": "Token ids, each in the model's vocabulary."},
                EXTRA_BODY: common[EXTRA_BODY],
            },
            "required": ["tokens"],
            "additionalProperties": False,
        },
    }


def _stream_options() -> Schema:
    properties: dict[str, Schema] = {}
    for name, field in STREAM_OPTIONS_FIELDS.items():
        schema = _field_schema(field, _BOOL)
        assert schema is not None
        properties[name] = schema
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "description": "Only when stream is true.",
    }


# ----------------------------------------------------------------------------- messages


def _part(kind: str, properties: Schema) -> Schema:
    return {
        "type": "object",
        "properties": {"type": {"const": kind}, **properties},
        "required": ["type", *properties],
    }


def _url_part(kind: str) -> Schema:
    url: Schema = {
        "anyOf": [
            {"type": "string", "description": "The URL itself (some clients send it bare)."},
            {
                "type": "object",
                "properties": {"url": _STRING, "detail": _or_null(_STRING)},
                "required": ["url"],
            },
        ],
        "description": "An http(s) or data: URL.",
    }
    return _part(kind, {kind: url})


_PART_NAMES = {"text": "TextPart", "image_url": "ImageURLPart", "input_audio": "InputAudioPart", "video_url": "VideoURLPart"}


def _message_schemas() -> dict[str, Schema]:
    text_only: Schema = {
        "anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _ref("TextPart")}],
        "description": "Only the user's messages may hold media parts.",
    }
    any_parts: Schema = {"anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _ref("ContentPart")}]}
    shared: Schema = {
        "name": _or_null(_STRING),
        "tool_call_id": _or_null(_STRING),
        "reasoning_content": _or_null(_STRING, "An earlier turn's reasoning, for templates that show it."),
        "reasoning": _or_null(_STRING, "reasoning_content's other name, read when it is absent."),
        "tool_calls": {"type": "null", "description": "Only an assistant message has tool calls."},
    }

    def message(roles: list[str], content: Schema, required: bool, **extra: Schema) -> Schema:
        return {
            "type": "object",
            "properties": {"role": {"enum": roles}, "content": content, **shared, **extra},
            "required": ["role", "content"] if required else ["role"],
        }

    by_role = {
        "SystemMessage": message(["developer", "system"], text_only, True),
        "UserMessage": message(["user"], any_parts, True),
        "AssistantMessage": message(
            ["assistant"],
            {"anyOf": [*text_only["anyOf"], {"type": "null"}], "description": "null: a turn that only calls tools."},
            False,
            tool_calls=_or_null({"type": "array", "items": _ref("RequestToolCall")}),
        ),
        "ToolMessage": message(["tool"], text_only, True),
    }
    assert {r for s in by_role.values() for r in s["properties"]["role"]["enum"]} == ROLES
    return {
        "ChatMessage": {"oneOf": [_ref(name) for name in by_role]},
        **by_role,
        "RequestToolCall": {
            "type": "object",
            "properties": {
                "id": _or_null(_STRING),
                "type": {"description": "'function'; not read."},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": _STRING,
                        "arguments": {
                            "anyOf": [{"type": "string", "description": "A JSON object, as text."}, {"type": "object"}],
                            "default": "{}",
                        },
                    },
                    "required": ["name"],
                },
            },
            "required": ["function"],
        },
        "ContentPart": {
            "oneOf": [_ref(name) for name in _PART_NAMES.values()],
            "discriminator": {
                "propertyName": "type",
                "mapping": {kind: f"#/components/schemas/{name}" for kind, name in _PART_NAMES.items()},
            },
        },
        "TextPart": _part("text", {"text": _STRING}),
        "ImageURLPart": _url_part("image_url"),
        "VideoURLPart": _url_part("video_url"),
        "InputAudioPart": _part(
            "input_audio",
            {
                "input_audio": {
                    "type": "object",
                    "properties": {"data": {"type": "string", "description": "base64"}, "format": _STRING},
                    "required": ["data", "format"],
                }
            },
        ),
    }


# ----------------------------------------------------------------------------- tools and constraints


def _tool_schemas() -> dict[str, Schema]:
    return {
        "Tool": {
            "type": "object",
            "properties": {
                "type": {"const": "function", "default": "function"},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                        "description": _or_null(_STRING),
                        "parameters": _or_null({"type": "object", "description": "A JSON schema."}),
                        "strict": _or_null(_BOOL),
                    },
                    "required": ["name"],
                },
            },
            "required": ["function"],
            "description": "Each tool's name once.",
        },
        "ToolChoice": {
            "anyOf": [
                {"enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "function", "default": "function"},
                        "function": {"type": "object", "properties": {"name": _STRING}, "required": ["name"]},
                    },
                    "required": ["function"],
                    "description": "A named function, one of the request's tools.",
                },
            ],
            "description": "required and a named function need tools.",
        },
        "ResponseFormat": {
            "oneOf": [
                {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"]},
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "json_schema"},
                        "json_schema": {
                            "type": "object",
                            "properties": {
                                "name": _STRING,
                                "description": _STRING,
                                "schema": {**_JSON_SCHEMA, "default": {}},
                                "strict": _or_null(_BOOL, "The output is held to the schema either way."),
                            },
                        },
                    },
                    "required": ["type", "json_schema"],
                },
            ]
        },
        "StructuredOutputs": _structured_outputs(),
        "StreamOptions": _stream_options(),
    }


def _structured_outputs() -> Schema:
    # Exactly one of these is given (not null, not false); the others are absent or null.
    kinds: dict[str, Schema] = {
        "json": {"anyOf": [{"type": "object"}, {"const": True}, _STRING], "description": "A JSON schema or its text."},
        "regex": {"type": "string", "minLength": 1},
        "choice": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "grammar": {"type": "string", "minLength": 1, "description": "A Lark grammar."},
        "json_object": {"const": True},
    }
    loose: dict[str, Schema] = {
        "json": _or_null({"anyOf": [_JSON_SCHEMA, _STRING]}),
        "regex": _or_null(kinds["regex"]),
        "choice": _or_null(kinds["choice"]),
        "grammar": _or_null(kinds["grammar"]),
        "json_object": {"enum": [True, False, None]},
    }
    return {
        "type": "object",
        "properties": {
            **loose,
            "backend": {"description": "Not read: every constraint is compiled by llguidance."},
            "whitespace_pattern": {"type": "null", "description": "Not supported: JSON output is compact."},
        },
        "additionalProperties": False,
        "oneOf": [{"properties": {k: s}, "required": [k]} for k, s in kinds.items()],
    }


# ----------------------------------------------------------------------------- responses


def _response_schemas() -> dict[str, Schema]:
    """The bodies' and events' schemas, from their Structs (omni/serving/responses.py and the
    error object's in omni/errors.py): what the handlers encode is what is described."""
    _, components = msgspec.json.schema_components(
        (*RESPONSE_TYPES, Error), ref_template="#/components/schemas/{name}"
    )
    return components


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


_RETRY_AFTER = {"Retry-After": {"schema": _int(0), "description": "Seconds to wait before retrying."}}

_ERRORS: dict[str, tuple[str, bool]] = {  # status -> (description, with Retry-After)
    "400": ("The request is invalid; param names the field.", False),
    "401": ("The API key is missing or wrong (only when the server has one).", False),
    "403": ("The artifact URL's signature is invalid or has expired.", False),
    "404": ("No such model, route or artifact.", False),
    "413": ("The body is larger than the server's --max-request-bytes.", False),
    "429": ("Too many requests are waiting; retry after Retry-After seconds.", True),
    "500": ("The server had an error while processing the request.", False),
    "503": ("The model is starting, or its worker failed.", True),
    "504": ("The request passed its deadline (--request-timeout) and was aborted.", False),
}


def _error_responses() -> dict[str, Schema]:
    out: dict[str, Schema] = {}
    for status, (description, retry) in _ERRORS.items():
        response: Schema = {"description": description, "content": _json(_ref("Error"))}
        if retry:
            response["headers"] = _RETRY_AFTER
        out[status] = response
    out["default"] = {"description": "Any other error (e.g. 405), as an error object.", "content": _json(_ref("Error"))}
    return out


def _errors(*statuses: str) -> dict[str, Schema]:
    return {s: {"$ref": f"#/components/responses/{s}"} for s in (*statuses, "default")}


# ----------------------------------------------------------------------------- operations

# The bearer key is needed only when the server runs with --api-key: {} makes it optional.
_KEYED: list[Schema] = [{"bearer": []}, {}]
_OPEN: list[Schema] = []


def _generation(operation_id: str, summary: str, request: str, result: str, events: str) -> Schema:
    """A POST answered with result, or with stream true with server-sent events: `events`
    says what each 'data: ' line holds."""
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "security": _KEYED,
            "requestBody": {"required": True, "content": _json(_ref(request))},
            "responses": {
                "200": {
                    "description": f"A {result}; with stream true, server-sent events.",
                    "content": {
                        **_json(_ref(result)),
                        "text/event-stream": {
                            "schema": _sse_event(
                                f"'data: ' lines, each {events} as JSON, then 'data: [DONE]'. A worker "
                                "failing mid-stream sends an Error object as the last event before [DONE]."
                            )
                        },
                    },
                },
                **_errors("400", "401", "404", "413", "429", "500", "503", "504"),
            },
        }
    }


# The audio APIs' events are named (an `event:` line with each one's type) and no [DONE] follows.
_AUDIO_EVENTS = (
    "'data: ' lines, {events}, each as JSON after an 'event: ' line naming its type; no [DONE]. A worker "
    "failing mid-stream sends an event of type error (with an Error object's error) and ends the stream."
)


def _event_stream(events: str) -> Schema:
    return {"schema": _sse_event(_AUDIO_EVENTS.format(events=events))}


def _sse_event(description: str) -> Schema:
    """One server-sent event, as a client's parser reads it: its data line (JSON, or [DONE]) and,
    for the audio endpoints' named events, its event name."""
    return {
        "type": "object",
        "properties": {"data": _STRING, "event": _STRING, "id": _STRING, "retry": {"type": "integer"}},
        "required": ["data"],
        "description": description,
    }


def _transcription_operation() -> Schema:
    events = "a TranscriptTextDeltaEvent as the text comes, then one TranscriptTextDoneEvent"
    return {
        "post": {
            "operationId": "create_transcription",
            "summary": "Transcribe audio",
            "security": _KEYED,
            "requestBody": {
                "required": True,
                "content": {"multipart/form-data": {"schema": _ref("TranscriptionRequest")}},
            },
            "responses": {
                "200": {
                    "description": "By response_format: json a Transcription, verbose_json a TranscriptionVerbose, "
                    "text the transcript; with stream true, server-sent events.",
                    "content": {
                        **_json({"oneOf": [_ref("Transcription"), _ref("TranscriptionVerbose")]}),
                        "text/plain": {"schema": _STRING},
                        "text/event-stream": _event_stream(events),
                    },
                },
                **_errors("400", "401", "404", "413", "429", "500", "503", "504"),
            },
        }
    }


def _speech_operation() -> Schema:
    audio = {MEDIA_TYPES[f]: {"schema": {"type": "string", "format": "binary"}} for f in SPEECH_AUDIO_FORMATS}
    events = "a SpeechAudioDeltaEvent as the audio is made, then one SpeechAudioDoneEvent"
    return {
        "post": {
            "operationId": "create_speech",
            "summary": "Speak text",
            "security": _KEYED,
            "requestBody": {"required": True, "content": _json(_ref("SpeechRequest"))},
            "responses": {
                "200": {
                    "description": "The audio file in response_format, its bytes sent as they are made (chunked); "
                    "with stream_format sse, server-sent events.",
                    "content": {
                        **audio,
                        "text/event-stream": _event_stream(events),
                    },
                },
                **_errors("400", "401", "404", "413", "429", "500", "503", "504"),
            },
        }
    }


def _get(operation_id: str, summary: str, responses: dict[str, Schema], security: list[Schema], **extra: Any) -> Schema:
    return {"get": {"operationId": operation_id, "summary": summary, "security": security, **extra, "responses": responses}}


def _post(operation_id: str, summary: str, request: Schema, result: str) -> Schema:
    """A POST answered with one JSON body (no stream, no worker: it answers while models start)."""
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "security": _KEYED,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": {
                "200": {"description": f"A {result}.", "content": _json(_ref(result))},
                **_errors("400", "401", "404", "413", "500"),
            },
        }
    }


def _paths() -> dict[str, Schema]:
    health = {
        "200": {"description": "Every model is ready.", "content": _json(_ref("Health"))},
        "503": {"description": "A model is still starting (not_ready names it).", "content": _json(_ref("Health"))},
        **_errors("500"),
    }
    artifact_params = [
        {"name": "key", "in": "path", "required": True, "schema": _STRING, "description": "The artifact's store key."},
        {"name": "expires", "in": "query", "required": True, "schema": _int(), "description": "Unix time."},
        {"name": "sig", "in": "query", "required": True, "schema": _STRING},
    ]
    return {
        PATHS["chat"]: _generation(
            "create_chat_completion",
            "Create a chat completion",
            "ChatCompletionRequest",
            "ChatCompletion",
            "a ChatCompletionChunk",
        ),
        PATHS["completions"]: _generation(
            "create_completion",
            "Create a completion",
            "TextCompletionRequest",
            "TextCompletion",
            "a TextCompletionChunk",
        ),
        IMAGES_PATH: _generation(
            "create_image",
            "Draw images from a prompt",
            "ImageGenerationRequest",
            "ImagesResponse",
            (
                "an ImageGenPartialImageEvent (partial_images of them per image, from intermediate denoising steps) "
                "or, one per image, an ImageGenCompletedEvent (its image as b64_json whatever response_format)"
            ),
        ),
        TRANSCRIPTIONS_PATH: _transcription_operation(),
        SPEECH_PATH: _speech_operation(),
        "/v1/models": _get(
            "list_models",
            "The served models",
            {"200": {"description": "The served models.", "content": _json(_ref("ModelList"))}, **_errors("401", "500")},
            _KEYED,
        ),
        "/v1/models/{model}": _get(
            "get_model",
            "One served model",
            {"200": {"description": "The model.", "content": _json(_ref("Model"))}, **_errors("401", "404", "500")},
            _KEYED,
            parameters=[{"name": "model", "in": "path", "required": True, "schema": _STRING}],
        ),
        "/health": _get("health", "Whether every model is ready", health, _OPEN),
        "/ready": _get("ready", "The same as /health", health, _OPEN),
        "/ping": {
            **_get("ping", "The same as /health (vLLM's name for it)", health, _OPEN),
            "post": {"operationId": "ping_post", "summary": "The same as GET /ping", "security": _OPEN, "responses": health},
        },
        "/version": _get(
            "version",
            "The server's version",
            {"200": {"description": "The installed package's version.", "content": _json(_ref("Version"))}, **_errors("500")},
            _OPEN,
        ),
        TOKENIZE_PATH: _post(
            "tokenize",
            "A prompt's or chat's token ids",
            {"oneOf": [_ref("TokenizeCompletionRequest"), _ref("TokenizeChatRequest")]},
            "TokenizeResponse",
        ),
        DETOKENIZE_PATH: _post("detokenize", "Token ids back to text", _ref("DetokenizeRequest"), "DetokenizeResponse"),
        "/metrics": _get(
            "metrics",
            "Prometheus metrics",
            {
                "200": {
                    "description": "The Prometheus text format.",
                    "content": {"text/plain": {"schema": _STRING}},
                },
                **_errors("500"),
            },
            _OPEN,
        ),
        ARTIFACT_PATH + "{key}": _get(
            "get_artifact",
            "An artifact of the local store, by its signed URL (the signature is the authorization)",
            {
                "200": {
                    "description": "The artifact's bytes, typed from its key.",
                    "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
                },
                **_errors("403", "404", "500"),
            },
            _OPEN,
            parameters=artifact_params,
        ),
        OPENAPI_PATH: _get(
            "openapi",
            "This document",
            {"200": {"description": "OpenAPI 3.1.", "content": _json({"type": "object"})}, **_errors("401", "500")},
            _KEYED,
        ),
    }


def openapi_document(model_names: list[str], root_path: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API, with `model` an enum of model_names; served under
    root_path (behind a proxy), its one server is that path."""
    return {
        "openapi": "3.1.0",
        "servers": [{"url": root_path or "/"}],
        "info": {
            "title": "omni-serve",
            "version": "1",
            "description": "OpenAI's chat completions, completions, images, speech and transcription APIs, "
            "with vLLM's extra fields.",
        },
        "paths": _paths(),
        "components": {
            "schemas": {
                # first, so a request component of the same name (TextPart) is the request's own
                **_response_schemas(),
                "ChatCompletionRequest": _request_schema("chat", model_names),
                "TextCompletionRequest": _request_schema("completions", model_names),
                "ImageGenerationRequest": _image_request_schema(model_names),
                "TranscriptionRequest": _transcription_request_schema(model_names),
                "SpeechRequest": _speech_request_schema(model_names),
                **_tokenize_schemas(model_names),
                **_message_schemas(),
                **_tool_schemas(),
            },
            "responses": _error_responses(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


@functools.lru_cache(maxsize=4)
def _document_bytes(model_names: tuple[str, ...], root_path: str) -> bytes:
    return orjson.dumps(openapi_document(list(model_names), root_path))


async def openapi_handler(request: web.Request) -> web.Response:
    names = tuple(m.name for m in request.app[MODELS])
    config = request.app.get(CONFIG)  # an app built by a test may have none
    body = _document_bytes(names, config.root_path if config is not None else "")
    return web.Response(body=body, content_type="application/json")
