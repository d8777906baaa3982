"""Every request field of OpenAI's and vLLM's chat completions and completions APIs, and
what this server does with each, so that no field a client sends is silently ignored.

The tables are read back from the request Structs: each field carries its KnownField in its
Meta (common.py). A field is HONOURED, ACCEPTED_DEFAULT_ONLY, INFORMATIONAL or REJECTED; a field
in neither API is a 400 naming it. JSON null always means "the default" and is accepted for
every known field.

Sources: OpenAI's chat.completions.create and completions.create (openai-python's
completion_create_params), vLLM's ChatCompletionRequest and CompletionRequest (old fields
such as guided_* and structural_tag included, as clients still send them).

The OpenAI client's extra_body is no field: the client merges it into the body, and the
server merges a literal "extra_body" object into the body before check_fields sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, TypeAlias

from omni.errors import APIError, bad_request
from omni.serving.requests.chat import ChatCompletionRequest
from omni.serving.requests.common import (
    OBJECT,
    STRING,
    STRING_MAP,
    Disposition,
    JsonType,
    KnownField,
    SameAs,
    StreamOptions,
    known_fields,
)
from omni.serving.requests.completions import CompletionRequest
from omni.serving.requests.fields import Body

__all__ = [
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "FIELDS",
    "OBJECT",
    "PATHS",
    "STREAM_OPTIONS_FIELDS",
    "STRING",
    "STRING_MAP",
    "Disposition",
    "Endpoint",
    "JsonType",
    "KnownField",
    "SameAs",
    "check_fields",
]

Endpoint: TypeAlias = Literal["chat", "completions"]

PATHS: Mapping[Endpoint, str] = MappingProxyType({"chat": "/v1/chat/completions", "completions": "/v1/completions"})

CHAT_FIELDS = known_fields(ChatCompletionRequest)
COMPLETION_FIELDS = known_fields(CompletionRequest)
STREAM_OPTIONS_FIELDS = known_fields(StreamOptions)  # the keys of stream_options (both endpoints)

FIELDS: Mapping[Endpoint, Mapping[str, KnownField]] = MappingProxyType(
    {"chat": CHAT_FIELDS, "completions": COMPLETION_FIELDS}
)


def check_fields(body: Body, endpoint: Endpoint) -> None:
    """Raise a 400 naming the first field the endpoint does not take: one in neither API
    ("unknown_parameter"), or a value it cannot honour ("unsupported_parameter")."""
    table = FIELDS[endpoint]
    for name, value in body.items():
        field = table.get(name)
        if field is None:
            raise _unknown(name, endpoint)
        if value is not None:
            field.check(name, value, body)
    options = body.get("stream_options")
    if isinstance(options, dict):  # anything else is the Struct's type error
        for key, value in options.items():
            param = f"stream_options.{key}"
            field = STREAM_OPTIONS_FIELDS.get(key)
            if field is None:
                raise _unknown(param, endpoint)
            if value is not None:
                field.check(param, value, body)


def _unknown(param: str, endpoint: Endpoint) -> APIError:
    if param.startswith("stream_options."):
        where = "a key of stream_options"
    else:
        where = f"a field of {PATHS[endpoint]}"
        other: Endpoint = "completions" if endpoint == "chat" else "chat"
        if param in FIELDS[other]:  # e.g. prompt sent to chat: say where it belongs
            where += f" (it is one of {PATHS[other]})"
    return bad_request(
        f"Unrecognized request argument supplied: '{param}' is not {where} in OpenAI's or vLLM's API.",
        param=param,
        code="unknown_parameter",
    )
