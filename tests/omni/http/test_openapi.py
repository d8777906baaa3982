"""The OpenAPI document is valid OpenAPI 3.1 and stays true: every known request field and every
route of the app is in it, and its request schemas refuse what the parsers refuse."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from omni.config import ServerConfig, StoreConfig
from omni.errors import APIError, Error
from omni.http.app import create_app
from omni.http.openapi import EXTRA_BODY, FIELD_SCHEMAS, IMAGES_PATH, OPENAPI_PATH, REQUIRED, openapi_document
from omni.serving.bodies import RESPONSE_TYPES
from omni.serving.requests import parse_chat_completion_request, parse_completion_request
from omni.serving.requests.dispositions import FIELDS, STREAM_OPTIONS_FIELDS, Disposition, Endpoint
from omni.serving.requests.fields import merge_extra_body
from omni.serving.requests.images import IMAGE_FIELDS, parse_image_generation_request
from omni.serving.requests.speech import SPEECH_FIELDS, SPEECH_PATH, parse_speech_request
from omni.serving.requests.tokenize import CHAT_FIELDS, DETOKENIZE_FIELDS, PROMPT_FIELDS
from omni.serving.requests.transcriptions import (
    TRANSCRIPTION_FIELDS,
    TRANSCRIPTIONS_PATH,
    TranscriptionForm,
    parse_transcription_request,
)
from omni.shared.media.audio_encoding import MEDIA_TYPES, SPEECH_AUDIO_FORMATS

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions")
REQUEST_SCHEMAS = {"chat": "ChatCompletionRequest", "completions": "TextCompletionRequest"}
DOC = openapi_document(["omni-tiny"])
SCHEMAS = DOC["components"]["schemas"]


def validator(name: str) -> Draft202012Validator:
    """A validator of one component schema, its $refs resolved in the whole document."""
    registry = Registry().with_resource("urn:doc", Resource.from_contents(DOC, default_specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(DOC)
    for schema in SCHEMAS.values():
        Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_known_field_is_a_property_and_no_other(endpoint: Endpoint) -> None:
    schema = SCHEMAS[REQUEST_SCHEMAS[endpoint]]
    assert set(schema["properties"]) == set(FIELDS[endpoint]) | {EXTRA_BODY}
    assert schema["required"] == list(REQUIRED[endpoint])
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_no_written_schema_is_stale(endpoint: Endpoint) -> None:
    """A field removed from the table, or no longer read by a parser, loses its written schema."""
    table = FIELDS[endpoint]
    for name in FIELD_SCHEMAS[endpoint]:
        assert name in table, name
        assert table[name].disposition in (Disposition.HONOURED, Disposition.INFORMATIONAL), name


def test_every_field_the_image_parser_reads_is_a_property_and_no_other() -> None:
    schema = SCHEMAS["ImageGenerationRequest"]
    assert set(schema["properties"]) == set(IMAGE_FIELDS) | {EXTRA_BODY}
    assert schema["required"] == ["prompt"] and schema["additionalProperties"] is False
    for name in set(IMAGE_FIELDS) - {"prompt"}:  # each takes null, as the parser does
        parse_image_generation_request({"prompt": "a fox", name: None})
        assert not list(validator("ImageGenerationRequest").iter_errors({"prompt": "a fox", name: None})), name


def test_every_field_the_audio_parsers_read_is_a_property_and_no_other() -> None:
    transcription = SCHEMAS["TranscriptionRequest"]
    assert set(transcription["properties"]) == set(TRANSCRIPTION_FIELDS)  # a form: no extra_body
    assert transcription["required"] == ["file"] and transcription["additionalProperties"] is False
    speech = SCHEMAS["SpeechRequest"]
    assert set(speech["properties"]) == set(SPEECH_FIELDS) | {EXTRA_BODY}
    assert speech["required"] == ["input"] and speech["additionalProperties"] is False
    assert [a["required"] for a in speech["anyOf"]] == [["voice"], ["reference_audio"]]  # a voice, or a recording's
    for name in set(SPEECH_FIELDS) - {"input", "voice"}:  # each takes null, as the parser does
        parse_speech_request({"input": "Hi", "voice": "alloy", name: None})
        assert not list(validator("SpeechRequest").iter_errors({"input": "Hi", "voice": "alloy", name: None})), name


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("TokenizeCompletionRequest", PROMPT_FIELDS),
        ("TokenizeChatRequest", CHAT_FIELDS),
        ("DetokenizeRequest", DETOKENIZE_FIELDS),
    ],
)
def test_every_field_the_tokenize_parser_reads_is_a_property_and_no_other(name: str, fields: Mapping[str, Any]) -> None:
    schema = SCHEMAS[name]
    assert set(schema["properties"]) == set(fields) | {EXTRA_BODY}
    assert schema["additionalProperties"] is False


def test_stream_options_are_the_known_keys() -> None:
    assert set(SCHEMAS["StreamOptions"]["properties"]) == set(STREAM_OPTIONS_FIELDS)


def test_every_route_of_the_app_is_an_operation(tmp_path: Path) -> None:
    # the playground's page and files (--ui) are no API operation: left out, as --no-ui leaves them
    app = create_app(ServerConfig(store=StoreConfig(f"local:{tmp_path}"), ui=False))
    # aiohttp adds a HEAD beside every GET; the document leaves them out.
    routes = {
        (route.method.lower(), resource.canonical)
        for resource in app.router.resources()
        for route in resource
        if route.method != "HEAD"
    }
    documented = {(method, path) for path, item in DOC["paths"].items() for method in item}
    assert documented == routes


def test_model_is_an_enum_of_the_served_names() -> None:
    doc = openapi_document(["a", "b"])
    for name in REQUEST_SCHEMAS.values():
        assert doc["components"]["schemas"][name]["properties"]["model"]["enum"] == ["a", "b"]
    # a form has no null: a model left out is the only one that reads audio
    assert doc["components"]["schemas"]["TranscriptionRequest"]["properties"]["model"]["enum"] == ["a", "b"]
    assert doc["components"]["schemas"]["SpeechRequest"]["properties"]["model"]["anyOf"][0]["enum"] == ["a", "b"]
    assert "enum" not in openapi_document([])["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    # optional for images: null is the only model that draws
    image_model = doc["components"]["schemas"]["ImageGenerationRequest"]["properties"]["model"]
    assert image_model["anyOf"] == [{**image_model["anyOf"][0], "enum": ["a", "b"]}, {"type": "null"}]


CHAT = {"model": "omni-tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "omni-tiny", "prompt": "hi"}

# (endpoint, body): the parser and the schema agree on each.
BODIES: list[tuple[Endpoint, dict[str, Any]]] = [
    ("chat", CHAT),
    ("chat", CHAT | {"max_tokens": 4, "n": 2, "temperature": 0, "stop": ["x"], "seed": -1, "top_k": -1}),
    ("chat", CHAT | {"max_tokens": 0}),
    ("chat", CHAT | {"n": 17}),
    ("chat", CHAT | {"temperature": 2.5}),
    ("chat", CHAT | {"top_p": 0}),
    ("chat", CHAT | {"stop": ""}),
    ("chat", CHAT | {"stop": ["a", "b", "c", "d", "e"]}),
    ("chat", CHAT | {"logit_bias": {"5": 100}}),
    ("chat", CHAT | {"logit_bias": {"x": 1}}),
    ("chat", CHAT | {"logit_bias": {"5": 101}}),
    ("chat", CHAT | {"truncate_prompt_tokens": -1}),
    ("chat", CHAT | {"truncate_prompt_tokens": 0}),
    ("chat", CHAT | {"request_id": ""}),
    ("chat", CHAT | {"best_of": None, "use_beam_search": False, "length_penalty": 1}),
    ("chat", CHAT | {"use_beam_search": True}),
    ("chat", CHAT | {"functions": []}),
    ("chat", CHAT | {"user": 5}),
    ("chat", CHAT | {"metadata": {"a": 1}}),
    ("chat", CHAT | {"guided_decoding_backend": "xgrammar"}),
    ("chat", CHAT | {"guided_decoding_backend": "mine"}),
    ("chat", CHAT | {"modalities": ["text"], "audio": {"voice": "x", "format": "wav"}}),
    ("chat", CHAT | {"modalities": ["audio"]}),
    ("chat", CHAT | {"audio": {"voice": "x", "format": "ogg"}}),
    ("chat", CHAT | {"tool_choice": "any"}),
    ("chat", CHAT | {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"function": {"name": "f"}}}),
    ("chat", CHAT | {"tools": [{"function": {"name": "f g"}}]}),
    ("chat", CHAT | {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}),
    ("chat", CHAT | {"response_format": {"type": "yaml"}}),
    ("chat", CHAT | {"structured_outputs": {"regex": "a+"}}),
    ("chat", CHAT | {"structured_outputs": {"regex": "a+", "choice": ["a"]}}),
    ("chat", CHAT | {"structured_outputs": {}}),
    ("chat", CHAT | {"structured_outputs": {"json_object": True, "regex": None, "backend": "x"}}),
    ("chat", CHAT | {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}}),
    ("chat", CHAT | {"stream": True, "stream_options": {"include_obfuscation": True}}),
    ("chat", CHAT | {"stream": True, "stream_options": {"other": True}}),
    ("chat", CHAT | {"chat_template_kwargs": {"enable_thinking": False}}),
    ("chat", CHAT | {"chat_template_kwargs": {"messages": []}}),
    ("chat", CHAT | {"extra_body": {"top_k": 2}}),
    ("chat", CHAT | {"prompt": "hi"}),
    ("chat", {"model": "omni-tiny", "messages": []}),
    ("chat", {"model": "omni-tiny"}),
    ("chat", {"messages": CHAT["messages"]}),
    ("chat", CHAT | {"messages": [{"role": "robot", "content": "hi"}]}),
    ("chat", CHAT | {"messages": [{"role": "user"}]}),
    ("chat", CHAT | {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]}),
    ("chat", CHAT | {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}),
    ("chat", CHAT | {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": "x"}]}]}),
    ("chat", CHAT | {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ("chat", CHAT | {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]}),
    ("chat", CHAT | {"messages": [{"role": "user", "content": [{"type": "file"}]}]}),
    ("chat", CHAT | {"messages": [{"role": "user", "content": []}]}),
    ("chat", CHAT | {"modalities": ["text", "image"]}),
    ("chat", CHAT | {"modalities": ["image"]}),
    ("chat", CHAT | {"modalities": ["text", "audio"]}),
    ("chat", CHAT | {"modalities": []}),
    ("chat", CHAT | {"modalities": ["video"]}),
    ("chat", CHAT | {"image": {"size": "1024x576", "response_format": "b64_json", "output_format": "jpeg"}}),
    ("chat", CHAT | {"image": {"output_format": "webp", "output_compression": 80, "num_inference_steps": 100}}),
    ("chat", CHAT | {"image": {"size": None, "guidance_scale": 20}}),
    ("chat", CHAT | {"image": {}}),
    ("chat", CHAT | {"image": None}),
    ("chat", CHAT | {"image": {"size": "1024x1024"}}),
    ("chat", CHAT | {"image": {"output_compression": 80}}),  # png, the default, has none
    ("chat", CHAT | {"image": {"output_format": "png", "output_compression": 80}}),
    ("chat", CHAT | {"image": {"num_inference_steps": 0}}),
    ("chat", CHAT | {"image": {"guidance_scale": 21}}),
    ("chat", CHAT | {"image": {"response_format": "file"}}),
    ("chat", CHAT | {"image": {"quality": "hd"}}),
    ("chat", CHAT | {"image": "png"}),
    ("completions", COMPLETION),
    ("completions", COMPLETION | {"prompt": [[1, 2], [3]], "logprobs": 5, "echo": True, "max_tokens": 0}),
    ("completions", COMPLETION | {"prompt": [1, -2]}),
    ("completions", COMPLETION | {"prompt": []}),
    ("completions", COMPLETION | {"prompt": [[]]}),
    ("completions", COMPLETION | {"logprobs": 6}),
    ("completions", COMPLETION | {"suffix": ""}),
    ("completions", COMPLETION | {"suffix": "x"}),
    ("completions", COMPLETION | {"messages": []}),
    ("completions", {"model": "omni-tiny", "prompt": None}),
]


PROMPT = {"prompt": "a red fox in snow"}

# Images bodies, against parse_image_generation_request: the endpoint has no KnownField table.
IMAGE_BODIES: list[Any] = [
    PROMPT,
    PROMPT | {"model": "omni-tiny", "n": 10, "size": "auto", "response_format": "b64_json", "seed": 7},
    PROMPT | {"size": "1024x576", "output_format": "jpeg", "output_compression": 0, "user": "u"},
    PROMPT | {"output_format": "webp", "output_compression": 100},
    PROMPT | {"stream": True, "partial_images": 3},
    PROMPT | {"stream": False, "partial_images": 0},
    PROMPT | {"quality": "auto", "background": "opaque", "moderation": "auto", "style": None},
    PROMPT | {"num_inference_steps": 1, "guidance_scale": 0},
    PROMPT | {"num_inference_steps": 100, "guidance_scale": 20.0},
    PROMPT | {"extra_body": {"num_inference_steps": 4}},
    {},
    {"prompt": None},
    {"prompt": " "},
    {"prompt": "x" * 32_001},
    PROMPT | {"model": 5},
    PROMPT | {"n": 0},
    PROMPT | {"n": 11},
    PROMPT | {"size": "1024x1024"},
    PROMPT | {"size": "big"},
    PROMPT | {"response_format": "file"},
    PROMPT | {"output_format": "gif"},
    pytest.param(
        PROMPT | {"output_compression": 50},  # png, the default, has no compression
    ),
    PROMPT | {"output_format": "png", "output_compression": 50},
    PROMPT | {"output_format": "jpeg", "output_compression": 101},
    PROMPT | {"partial_images": 1},
    PROMPT | {"stream": False, "partial_images": 2},
    PROMPT | {"stream": True, "partial_images": 4},
    PROMPT | {"quality": "hd"},
    PROMPT | {"background": "transparent"},
    PROMPT | {"moderation": "low"},
    PROMPT | {"style": "vivid"},
    PROMPT | {"user": 5},
    PROMPT | {"seed": "7"},
    PROMPT | {"num_inference_steps": 0},
    PROMPT | {"num_inference_steps": 101},
    PROMPT | {"guidance_scale": -1},
    PROMPT | {"guidance_scale": 21},
    PROMPT | {"negative_prompt": "blur"},
]


AUDIO = {"file": "RIFF....WAVE"}  # a form's file, as the schema sees it (binary) and the parser (bytes)

# Transcription bodies as typed values; the parser gets each as a form's text (_as_form).
TRANSCRIPTION_BODIES: list[dict[str, Any]] = [
    AUDIO,
    AUDIO | {"model": "omni-tiny", "language": "en", "prompt": "Names: Ana.", "temperature": 0.5, "seed": 3},
    AUDIO | {"response_format": "text", "stream": True, "temperature": 1, "language": "EN"},
    AUDIO | {"response_format": "verbose_json", "stream": False, "language": ""},
    AUDIO | {"include": ["logprobs"], "stream": True},
    AUDIO | {"include": ["logprobs"], "response_format": "json"},
    AUDIO | {"include": []},
    {},
    {"model": "omni-tiny"},
    AUDIO | {"response_format": "srt"},
    AUDIO | {"response_format": "vtt"},
    AUDIO | {"response_format": "diarized_json"},
    AUDIO | {"temperature": 1.5},
    AUDIO | {"temperature": -0.5},
    AUDIO | {"language": "eng"},
    AUDIO | {"language": "e"},
    AUDIO | {"prompt": "x" * 4097},
    AUDIO | {"stream": True, "response_format": "verbose_json"},
    AUDIO | {"include": ["words"]},
    AUDIO | {"include": ["logprobs"], "response_format": "text"},
    AUDIO | {"timestamp_granularities": ["word"]},
    AUDIO | {"chunking_strategy": "auto"},
    AUDIO | {"known_speaker_names": ["a"], "known_speaker_references": ["data:audio/wav;base64,"]},
    AUDIO | {"keywords": ["omni"]},
    AUDIO | {"languages": ["en"]},
    AUDIO | {"seed": 2**64},
    AUDIO | {"max_tokens": 8},
]


def _as_form(body: dict[str, Any]) -> TranscriptionForm:
    """A typed body as the multipart form that carries it: every value as text, a list as parts."""
    fields: dict[str, list[str]] = {}
    for name, value in body.items():
        if name != "file":
            values = value if isinstance(value, list) else [value]
            fields[name] = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    return TranscriptionForm(fields, body["file"].encode() if "file" in body else None)


@pytest.mark.parametrize("body", TRANSCRIPTION_BODIES)
def test_the_transcription_schema_refuses_what_the_parser_refuses(body: dict[str, Any]) -> None:
    errors = [e.message for e in validator("TranscriptionRequest").iter_errors(body)]
    try:
        parse_transcription_request(_as_form(body))
        parses = True
    except APIError as e:
        assert e.status == 400
        parses = False
    assert (not errors) == parses, errors


SPEECH = {"input": "Hello there.", "voice": "alloy"}
SPEECH_BODIES: list[dict[str, Any]] = [
    SPEECH,
    SPEECH | {"model": "omni-tiny", "instructions": "Cheerfully.", "response_format": "wav", "speed": 0.25, "seed": 1},
    SPEECH | {"voice": {"id": "alloy"}, "stream_format": "sse", "speed": 4, "max_units": 3, "instructions": ""},
    SPEECH | {"response_format": "pcm", "stream_format": "audio", "max_units": 2000},
    SPEECH | {"input": "x" * 4096},
    SPEECH | {"extra_body": {"seed": 2}},
    {},
    {"input": "Hello there."},
    {"voice": "alloy"},
    SPEECH | {"input": ""},
    SPEECH | {"input": " "},
    SPEECH | {"input": "x" * 4097},
    SPEECH | {"input": 5},
    SPEECH | {"voice": None},
    SPEECH | {"voice": 5},
    SPEECH | {"voice": {"id": None}},
    SPEECH | {"voice": {"name": "alloy"}},
    SPEECH | {"instructions": "x" * 4097},
    SPEECH | {"response_format": "ogg"},
    SPEECH | {"response_format": "pcm16"},
    SPEECH | {"stream_format": "chunks"},
    SPEECH | {"speed": 0.2},
    SPEECH | {"speed": 4.5},
    SPEECH | {"speed": True},
    SPEECH | {"max_units": 2},
    SPEECH | {"max_units": 2001},
    SPEECH | {"seed": "1"},
    SPEECH | {"model": 5},
    SPEECH | {"language": "en"},
]


@pytest.mark.parametrize("body", SPEECH_BODIES)
def test_the_speech_schema_refuses_what_the_parser_refuses(body: dict[str, Any]) -> None:
    errors = [e.message for e in validator("SpeechRequest").iter_errors(body)]
    assert (not errors) == _parses(parse_speech_request, body), errors


def _parses(parse: Any, body: dict[str, Any]) -> bool:
    try:
        parse(merge_extra_body(dict(body)))  # as read_json merges it
    except APIError as e:
        assert e.status == 400
        return False
    return True


@pytest.mark.parametrize("body", IMAGE_BODIES)
def test_the_image_schema_refuses_what_the_parser_refuses(body: dict[str, Any]) -> None:
    errors = [e.message for e in validator("ImageGenerationRequest").iter_errors(body)]
    assert (not errors) == _parses(parse_image_generation_request, body), errors


@pytest.mark.parametrize("endpoint, body", BODIES)
def test_the_schema_refuses_what_the_parser_refuses(endpoint: Endpoint, body: dict[str, Any]) -> None:
    parse = parse_chat_completion_request if endpoint == "chat" else parse_completion_request
    errors = [e.message for e in validator(REQUEST_SCHEMAS[endpoint]).iter_errors(body)]
    assert (not errors) == _parses(parse, body), errors


USAGE = {
    "input_tokens": 9,
    "input_tokens_details": {"text_tokens": 9, "image_tokens": 0},
    "output_tokens": 760,
    "total_tokens": 769,
}
DESCRIBED = {"output_format": "png", "size": "1024x576", "quality": "auto", "background": "opaque"}
EVENT = {"b64_json": "iVBO", "created_at": 1700000000, **DESCRIBED}

# (schema, body, valid): the bodies the handlers write, as their docstrings give them.
RESPONSES: list[tuple[str, dict[str, Any], bool]] = [
    ("ImagesResponse", {"created": 1700000000, "data": [{"url": "http://x/a.png"}], **DESCRIBED, "usage": USAGE}, True),
    ("ImagesResponse", {"created": 0, "data": [{"b64_json": "iVBO"}] * 2, **DESCRIBED, "usage": USAGE}, True),
    ("ImagesResponse", {"created": 1700000000, "data": [{}], **DESCRIBED, "usage": USAGE}, False),
    ("ImagesResponse", {"created": 1700000000, "data": [{"url": "u"}], **DESCRIBED}, False),
    ("ImageGenPartialImageEvent", {"type": "image_generation.partial_image", "partial_image_index": 0, **EVENT}, True),
    ("ImageGenPartialImageEvent", {"type": "image_generation.partial_image", **EVENT}, False),
    ("ImageGenCompletedEvent", {"type": "image_generation.completed", **EVENT, "usage": USAGE}, True),
    ("ImageGenCompletedEvent", {"type": "image_generation.partial_image", **EVENT, "usage": USAGE}, False),
]


CHAT_USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}


def _chat_completion(content: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": CHAT_USAGE}


def _chunk(content: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None}
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


TOKEN_USAGE = {
    "type": "tokens",
    "input_tokens": 70,
    "input_token_details": {"text_tokens": 20, "audio_tokens": 50},
    "output_tokens": 5,
    "total_tokens": 75,
}
LOGPROB = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}
SEGMENT = {
    "id": 0, "seek": 0, "start": 0.0, "end": 1.0, "text": "Hi", "tokens": [5, 6], "temperature": 0.0,
    "avg_logprob": -0.5, "compression_ratio": 0.2, "no_speech_prob": 0.0,
}  # fmt: skip
VERBOSE = {"task": "transcribe", "language": "en", "duration": 1.0, "text": "Hi", "segments": [SEGMENT]}
RESPONSES += [
    ("Transcription", {"text": "Hi", "usage": TOKEN_USAGE}, True),
    ("Transcription", {"text": "Hi", "logprobs": [LOGPROB], "usage": TOKEN_USAGE}, True),
    ("Transcription", {"text": "Hi"}, False),
    ("Transcription", {"text": "Hi", "usage": {"type": "duration", "seconds": 1.0}}, False),
    ("TranscriptionVerbose", VERBOSE | {"usage": {"type": "duration", "seconds": 1.0}}, True),
    ("TranscriptionVerbose", VERBOSE | {"segments": [], "usage": {"type": "duration", "seconds": 1.0}}, False),
    ("TranscriptionVerbose", VERBOSE | {"usage": TOKEN_USAGE}, False),
    ("TranscriptTextDeltaEvent", {"type": "transcript.text.delta", "delta": "H"}, True),
    ("TranscriptTextDeltaEvent", {"type": "transcript.text.delta", "delta": "H", "logprobs": [LOGPROB]}, True),
    ("TranscriptTextDeltaEvent", {"type": "transcript.text.done", "delta": "H"}, False),
    ("TranscriptTextDoneEvent", {"type": "transcript.text.done", "text": "Hi", "usage": TOKEN_USAGE}, True),
    ("TranscriptTextDoneEvent", {"type": "transcript.text.done", "text": "Hi"}, False),
    ("SpeechAudioDeltaEvent", {"type": "speech.audio.delta", "audio": "UklGRg=="}, True),
    ("SpeechAudioDeltaEvent", {"type": "speech.audio.delta"}, False),
    (
        "SpeechAudioDoneEvent",
        {"type": "speech.audio.done", "usage": {"input_tokens": 9, "output_tokens": 41, "total_tokens": 50}},
        True,
    ),
    ("SpeechAudioDoneEvent", {"type": "speech.audio.done"}, False),
]

IMAGE_PART = {"type": "image_url", "image_url": {"url": "http://x/a.png"}}
RESPONSES += [
    ("ChatCompletion", _chat_completion("hi"), True),
    ("ChatCompletion", _chat_completion(None), True),
    ("ChatCompletion", _chat_completion([{"type": "text", "text": "a fox:"}, IMAGE_PART]), True),
    ("ChatCompletion", _chat_completion([IMAGE_PART, IMAGE_PART]), True),
    ("ChatCompletion", _chat_completion([{"type": "input_audio", "input_audio": {"data": ""}}]), False),
    # a whole completion always carries its usage, a chunk only with stream_options.include_usage
    ("ChatCompletion", {k: v for k, v in _chat_completion("hi").items() if k != "usage"}, False),
    ("ChatCompletion", _chat_completion("hi") | {"object": "chat.completion.chunk"}, False),
    ("ChatCompletionChunk", _chunk("hi") | {"usage": None}, True),
    ("ChatCompletionChunk", _chunk("hi") | {"usage": CHAT_USAGE}, True),
    ("ChatCompletionChunk", _chunk("hi"), True),
    ("ChatCompletionChunk", _chunk([IMAGE_PART]), True),
    ("ChatCompletionChunk", _chunk([{"type": "image_url", "image_url": {}}]), False),
]


@pytest.mark.parametrize("name, body, valid", RESPONSES)
def test_the_response_schemas_describe_the_bodies(name: str, body: dict[str, Any], valid: bool) -> None:
    errors = [e.message for e in validator(name).iter_errors(body)]
    assert (not errors) == valid, errors


def test_the_response_schemas_are_the_structs_own() -> None:
    """Each response component is its Struct's schema; a request component of the same name
    wins only where it is the same Struct (TextPart, a content part either way)."""
    _, generated = msgspec.json.schema_components((*RESPONSE_TYPES, Error), ref_template="#/components/schemas/{name}")
    for name, schema in generated.items():
        assert name == "TextPart" or SCHEMAS[name] == schema, name


def test_the_images_operation_streams_events() -> None:
    content = DOC["paths"][IMAGES_PATH]["post"]["responses"]["200"]["content"]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/ImagesResponse"}
    description = content["text/event-stream"]["schema"]["description"]
    assert "ImageGenPartialImageEvent" in description and "ImageGenCompletedEvent" in description


def test_the_audio_operations_answer_files_and_events() -> None:
    transcription = DOC["paths"][TRANSCRIPTIONS_PATH]["post"]
    assert set(transcription["requestBody"]["content"]) == {"multipart/form-data"}
    content = transcription["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/plain", "text/event-stream"}
    description = content["text/event-stream"]["schema"]["description"]
    assert "TranscriptTextDeltaEvent" in description and "TranscriptTextDoneEvent" in description
    content = DOC["paths"][SPEECH_PATH]["post"]["responses"]["200"]["content"]
    assert set(content) == {MEDIA_TYPES[f] for f in SPEECH_AUDIO_FORMATS} | {"text/event-stream"}
    assert set(content) >= {"audio/mpeg", "audio/opus", "audio/aac", "audio/flac", "audio/wav", "audio/pcm"}
    description = content["text/event-stream"]["schema"]["description"]
    assert "SpeechAudioDeltaEvent" in description and "SpeechAudioDoneEvent" in description


async def test_the_handler_serves_the_document(tmp_path: Path) -> None:
    app = create_app(ServerConfig(store=StoreConfig(f"local:{tmp_path}")))
    async with TestClient(TestServer(app)) as client:
        response = await client.get(OPENAPI_PATH)
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == openapi_document([])
