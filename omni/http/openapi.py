"""GET /openapi.json: the OpenAPI 3.1 document of the whole API, for schema-based fuzzers and
client generators.

The request components are generated from the request Structs (omni/serving/requests) by
msgspec, so a range here is the range the parser refuses outside of. A post-pass adds what a
Struct's types cannot say: null (the default) on every optional top-level field, the accepted
values of a refused or default-only field (from its disposition), the served models as an enum
on `model`, extra_body, and the few rules between fields the parsers check. The transcription
body is a multipart form, whose values are text (and never null): its schema gives the type
each text is read as. tests/omni/http/test_openapi.py checks that the schemas refuse what the
parsers refuse.
The response components are the JSON schemas of the Structs the handlers encode
(omni/serving/bodies.py, and omni/errors.py's Error).

What a schema cannot say is left to the descriptions and answered with a 400 naming the
field: a token id past the vocabulary, a prompt past the context, two output constraints at
once, a tool named twice, min_tokens above max_tokens.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any, TypeAlias

import msgspec
import orjson
from aiohttp import web
from msgspec import Struct

from omni.errors import Error
from omni.http.handlers.realtime import REALTIME_PATH
from omni.http.state import CONFIG, MODELS
from omni.serving.bodies import RESPONSE_TYPES
from omni.serving.requests.chat import ChatCompletionRequest
from omni.serving.requests.common import known_fields
from omni.serving.requests.completions import CompletionRequest
from omni.serving.requests.dispositions import (
    FIELDS,
    PATHS,
    STREAM_OPTIONS_FIELDS,
    Disposition,
    Endpoint,
    KnownField,
    SameAs,
)
from omni.serving.requests.image_edits import IMAGE_EDITS_PATH, ImageEditFields
from omni.serving.requests.images import (
    IMAGES_PATH,
    ImageGenerationRequest,
)
from omni.serving.requests.responses import RESPONSES_PATH, ResponseRequest
from omni.serving.requests.speech import SPEECH_PATH, SpeechRequest
from omni.serving.requests.tokenize import (
    DETOKENIZE_PATH,
    TEMPLATE_FIELDS,
    TOKENIZE_PATH,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from omni.serving.requests.transcriptions import (
    TRANSCRIPTIONS_PATH,
    TranscriptionFields,
)
from omni.shared.media.audio_encoding import MEDIA_TYPES, SPEECH_AUDIO_FORMATS
from omni.shared.store.local import ARTIFACT_PATH

Schema: TypeAlias = dict[str, Any]

OPENAPI_PATH = "/openapi.json"
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


def _bounded(kind: str, lo: float | None, hi: float | None) -> Schema:
    out: Schema = {"type": kind}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


_STRING: Schema = {"type": "string"}
_JSON, _FORM = "application/json", "multipart/form-data"  # request bodies' media types
_TOKEN_IDS: Schema = {"type": "array", "items": _int(0)}


# ----------------------------------------------------------------------------- requests

# The request bodies, generated from their Structs: each field's type, bounds, default and
# description are declared once there. The post-pass below adds what a Struct cannot say.
_REQUESTS: dict[str, type[Struct]] = {
    "ChatCompletionRequest": ChatCompletionRequest,
    "TextCompletionRequest": CompletionRequest,
    "ImageGenerationRequest": ImageGenerationRequest,
    "ImageEditRequest": ImageEditFields,
    "SpeechRequest": SpeechRequest,
    "TranscriptionRequest": TranscriptionFields,
    "TokenizeCompletionRequest": TokenizeCompletionRequest,
    "TokenizeChatRequest": TokenizeChatRequest,
    "DetokenizeRequest": DetokenizeRequest,
    "ResponseRequest": ResponseRequest,
}
# The generation endpoints' request components.
_GENERATION: Mapping[Endpoint, str] = {"chat": "ChatCompletionRequest", "completions": "TextCompletionRequest"}
_MODEL_DESCRIPTIONS = {
    "ChatCompletionRequest": "A served model's name (GET /v1/models).",
    "TextCompletionRequest": "A served model's name (GET /v1/models).",
}
# A multipart form has no null: a field left out has its default.
_FORMS = frozenset({"TranscriptionRequest", "ImageEditRequest"})

# The rules between fields that a Struct's types cannot say (the parsers' checks say them too).
_COMPRESSION_NEEDS_JPEG_OR_WEBP: Schema = {
    # output_format defaults to png, which has no compression
    "if": {"properties": {"output_compression": {"not": {"type": "null"}}}, "required": ["output_compression"]},
    "then": {"properties": {"output_format": {"enum": ["jpeg", "webp"]}}, "required": ["output_format"]},
}
_PARTIALS_NEED_STREAM: Schema = {
    "if": {"properties": {"partial_images": {"type": "integer", "minimum": 1}}, "required": ["partial_images"]},
    "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
}
_RULES: dict[str, list[Schema]] = {
    "ChatCompletionRequest": [
        {  # audio output needs the voice and format
            "if": {"properties": {"modalities": {"type": "array", "contains": {"const": "audio"}}}, "required": ["modalities"]},
            "then": {"properties": {"audio": {"type": "object"}}, "required": ["audio"]},
        }
    ],
    "ImageGenerationRequest": [_COMPRESSION_NEEDS_JPEG_OR_WEBP, _PARTIALS_NEED_STREAM],
    "ImageEditRequest": [_COMPRESSION_NEEDS_JPEG_OR_WEBP, _PARTIALS_NEED_STREAM],
    "TranscriptionRequest": [
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
_MEDIA_PARTS: Schema = {"properties": {"type": {"not": {"const": "text"}}}, "required": ["type"]}
# Nested objects: what their Structs cannot say.
_NESTED_RULES: dict[str, Schema] = {
    "ChatMessage": {
        "allOf": [
            {  # only an assistant's turn may be null (one that only calls tools), or carry calls or audio
                "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
                "then": {
                    "properties": {
                        "content": {"not": {"type": "null"}},
                        "tool_calls": {"type": "null"},
                        "audio": {"type": "null"},
                    },
                    "required": ["content"],
                },
            },
            {  # only the user's messages may hold media parts
                "if": {"properties": {"role": {"not": {"const": "user"}}}},
                "then": {"properties": {"content": {"not": {"type": "array", "contains": _MEDIA_PARTS}}}},
            },
        ]
    },
    "ChatImageOptions": _COMPRESSION_NEEDS_JPEG_OR_WEBP,
    # exactly one of these is given (not null, not false)
    "StructuredOutputs": {
        "oneOf": [
            {"properties": {k: {"not": {"enum": [None, False]}}}, "required": [k]}
            for k in ("json", "regex", "choice", "grammar", "json_object")
        ]
    },
}


def _field_schema(known: KnownField, generated: Schema, *, required: bool, form: bool) -> Schema:
    """A top-level field's schema: what the Struct says, with null (the default) on every
    optional field, and a refused or default-only field's accepted values."""
    null: list[Any] = [] if form else [None]
    if known.disposition is Disposition.REJECTED:
        return {"not": {}} if form else {"type": "null", "description": generated.get("description", known.reason)}
    if known.disposition is Disposition.ACCEPTED_DEFAULT_ONLY:
        if any(isinstance(d, SameAs) for d in known.defaults):  # best_of: equal to n
            return _or_null({"type": "number"}, generated.get("description"))
        return {"enum": [*known.defaults, *null], "description": generated.get("description", known.reason)}
    if required or form or _takes_null(generated):
        return generated
    out = _or_null({k: v for k, v in generated.items() if k not in ("description", "default")})
    out["description"] = generated.get("description", known.reason)
    return out


def _takes_null(schema: Schema) -> bool:
    return any(b.get("type") == "null" for b in schema.get("anyOf", ()))


@functools.lru_cache(maxsize=1)
def _generated() -> tuple[dict[str, Schema], dict[str, Schema]]:
    """The request Structs' schemas and those of the objects they hold, by component name."""
    structs = list(_REQUESTS.values())
    tops, components = msgspec.json.schema_components(structs, ref_template="#/components/schemas/{name}")
    by_name = {name: components.pop(top["$ref"].rsplit("/", 1)[-1]) for name, top in zip(_REQUESTS, tops)}
    for name, rule in _NESTED_RULES.items():
        components[name] = {**components[name], **rule}
    structured = components["StructuredOutputs"]["properties"]
    structured["whitespace_pattern"] = {"type": "null", "description": structured["whitespace_pattern"].get("description")}
    options = components["StreamOptions"]["properties"]
    for key, known in STREAM_OPTIONS_FIELDS.items():
        options[key] = _field_schema(known, options[key], required=False, form=False)
    return by_name, components


def _request_schemas(model_names: list[str]) -> dict[str, Schema]:
    generated, nested = _generated()
    out: dict[str, Schema] = copy.deepcopy(nested)
    for name, cls in _REQUESTS.items():
        schema = copy.deepcopy(generated[name])
        form = name in _FORMS
        required = set(schema.get("required", ()))
        table = known_fields(cls)
        properties = schema["properties"]
        for key, known in table.items():
            properties[key] = _field_schema(known, properties[key], required=key in required, form=form)
        model: Schema = {"type": "string", "description": _MODEL_DESCRIPTIONS.get(name, table["model"].reason)}
        if model_names:
            model["enum"] = list(model_names)
        properties["model"] = model if "model" in required or form else _or_null(model)
        if not form:
            properties[EXTRA_BODY] = _or_null(
                {"type": "object"}, "Merged into the body (its keys win): what the OpenAI SDK sends as extra_body."
            )
        schema["required"] = list(schema.get("required", []))
        if name in _RULES:
            schema["allOf"] = _RULES[name]
        out[name] = schema
    # a voice, unless reference_audio gives one (null is no voice)
    out["SpeechRequest"]["properties"]["voice"] = generated["SpeechRequest"]["properties"]["voice"]
    out["SpeechRequest"]["anyOf"] = [
        {"required": ["voice"]},
        {"required": ["reference_audio"], "properties": {"reference_audio": {"type": "object"}}},
    ]
    # the template fields are the chat request's own
    chat = out["ChatCompletionRequest"]["properties"]
    for key in TEMPLATE_FIELDS:
        out["TokenizeChatRequest"]["properties"][key] = chat[key]
    out["TokenizeChatRequest"]["properties"]["messages"] = chat["messages"]
    return out


def _field_schemas() -> Mapping[Endpoint, Mapping[str, Schema]]:
    schemas = _request_schemas([])
    return {
        endpoint: {
            key: schemas[name]["properties"][key]
            for key, known in FIELDS[endpoint].items()
            if known.disposition in (Disposition.HONOURED, Disposition.INFORMATIONAL)
        }
        for endpoint, name in _GENERATION.items()
    }


# The generated schema of each field the server takes at more than its default.
FIELD_SCHEMAS: Mapping[Endpoint, Mapping[str, Schema]] = _field_schemas()

# The fields a parser requires (null is "missing"); every other field takes null.
REQUIRED: Mapping[Endpoint, tuple[str, ...]] = {
    endpoint: tuple(_generated()[0][name]["required"])
    for endpoint, name in _GENERATION.items()
}


# ----------------------------------------------------------------------------- responses


def _response_schemas() -> dict[str, Schema]:
    """The bodies' and events' schemas, from their Structs (omni/serving/bodies.py and the
    error object's in omni/errors.py): what the handlers encode is what is described."""
    _, components = msgspec.json.schema_components(
        (*RESPONSE_TYPES, Error), ref_template="#/components/schemas/{name}"
    )
    # The Responses API's Response object (omni/serving/responses/events.py builds it), in outline.
    components["Response"] = {
        "type": "object",
        "properties": {
            "id": _STRING, "object": {"const": "response"}, "status": _STRING, "output": {"type": "array"},
            "usage": {"anyOf": [{"type": "object", "properties": {"decoder_details": _ref("ImageDecoderDetails")}},
                                {"type": "null"}]},
        },
        "required": ["id", "object", "status", "output"],
    }  # fmt: skip
    return components


def _json(schema: Schema) -> Schema:
    return {_JSON: {"schema": schema}}


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
            "requestBody": {"required": True, "content": {_FORM if request in _FORMS else _JSON: {"schema": _ref(request)}}},
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


_IMAGE_SSE = (  # "Gen" or "Edit"
    "an Image{0}PartialImageEvent (partial_images of them per image, from intermediate denoising steps) "
    "or, one per image, an Image{0}CompletedEvent (its image as b64_json whatever response_format)"
).format
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
                "content": {_FORM: {"schema": _ref("TranscriptionRequest")}},
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


_RESPONSE_ID = [{"name": "response_id", "in": "path", "required": True, "schema": _STRING}]


def _stored_response(description: str) -> Schema:
    return {"200": {"description": description, "content": _json(_ref("Response"))}, **_errors("400", "401", "404", "500")}


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
            "create_image", "Draw images from a prompt", "ImageGenerationRequest", "ImagesResponse", _IMAGE_SSE("Gen")
        ),
        IMAGE_EDITS_PATH: _generation(
            "create_image_edit", "Edit images from a prompt", "ImageEditRequest", "ImagesResponse", _IMAGE_SSE("Edit")
        ),
        RESPONSES_PATH: _generation(
            "create_response",
            "Create a model response (OpenAI's Responses API)",
            "ResponseRequest",
            "Response",
            "a Responses stream event (response.created, response.output_text.delta, ...; each after an "
            "'event: ' line naming its type, with a sequence_number; no [DONE])",
        ),
        RESPONSES_PATH + "/{response_id}": {
            **_get("get_response", "A stored response", _stored_response("The response."), _KEYED,
                   parameters=_RESPONSE_ID),
            "delete": {"operationId": "delete_response", "summary": "Delete a stored response", "security": _KEYED,
                       "parameters": _RESPONSE_ID, "responses": _stored_response("It is deleted.")},
        },  # fmt: skip
        RESPONSES_PATH + "/{response_id}/cancel": {
            "post": {"operationId": "cancel_response", "summary": "Cancel a background response", "security": _KEYED,
                     "parameters": _RESPONSE_ID, "responses": _stored_response("The response, cancelled.")},
        },  # fmt: skip
        REALTIME_PATH: _get(
            "realtime",
            "OpenAI's Realtime API: a WebSocket of its GA events (docs/REALTIME.md)",
            {"101": {"description": "Switching to the WebSocket."}, **_errors("400", "401", "404", "500")},
            _KEYED,
            parameters=[{"name": "model", "in": "query", "required": False, "schema": _STRING}],
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
                **_request_schemas(model_names),
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
