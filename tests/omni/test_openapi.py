"""The OpenAPI document is valid OpenAPI 3.1 and stays true: every known request field and every
route of the app is in it, and its request schemas refuse what the parsers refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from omni.api.errors import APIError
from omni.api.openapi import EXTRA_BODY, FIELD_SCHEMAS, OPENAPI_PATH, REQUIRED, openapi_document
from omni.api.schemas import parse_chat_completion_request, parse_completion_request
from omni.api.schemas.fields import merge_extra_body
from omni.api.schemas.known_fields import FIELDS, STREAM_OPTIONS_FIELDS, Disposition, Endpoint
from omni.app import create_app
from omni.config import ServerConfig

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


def test_stream_options_are_the_known_keys() -> None:
    assert set(SCHEMAS["StreamOptions"]["properties"]) == set(STREAM_OPTIONS_FIELDS)


def test_every_route_of_the_app_is_an_operation(tmp_path: Path) -> None:
    app = create_app(ServerConfig(engines=(), store=f"local:{tmp_path}"))
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
    assert "enum" not in openapi_document([])["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]


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


@pytest.mark.parametrize("endpoint, body", BODIES)
def test_the_schema_refuses_what_the_parser_refuses(endpoint: Endpoint, body: dict[str, Any]) -> None:
    parse = parse_chat_completion_request if endpoint == "chat" else parse_completion_request
    try:
        parse(merge_extra_body(dict(body)))  # as read_json merges it
        parsed = True
    except APIError as e:
        assert e.status == 400
        parsed = False
    errors = [e.message for e in validator(REQUEST_SCHEMAS[endpoint]).iter_errors(body)]
    assert (not errors) == parsed, errors


async def test_the_handler_serves_the_document(tmp_path: Path) -> None:
    app = create_app(ServerConfig(engines=(), store=f"local:{tmp_path}"))
    async with TestClient(TestServer(app)) as client:
        response = await client.get(OPENAPI_PATH)
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == openapi_document([])
