"""The two generation parsers' order of checks: a field the endpoint does not take is named
before any type is read, a body too large is refused before it is converted, the Struct's types
and bounds come next, the rules between fields last; each endpoint takes only its own fields."""

from __future__ import annotations

from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests.parse import parse_chat_completion_request, parse_completion_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def refused(parse: Any, body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as e:
        parse(body)
    assert e.value.status == 400
    return e.value


def test_an_unknown_field_is_named_before_a_type_error_elsewhere() -> None:
    error = refused(parse_chat_completion_request, {**CHAT, "temperature": "hot", "frobnicate": 1})
    assert (error.param, error.code) == ("frobnicate", "unknown_parameter")
    assert refused(parse_chat_completion_request, {**CHAT, "temperature": "hot"}).param == "temperature"


def test_each_endpoint_takes_its_own_fields() -> None:
    assert refused(parse_completion_request, {**COMPLETION, "messages": CHAT["messages"]}).param == "messages"
    assert refused(parse_chat_completion_request, {**CHAT, "prompt": "hi"}).param == "prompt"
    assert refused(parse_chat_completion_request, {**CHAT, "suffix": "x"}).param == "suffix"


def test_the_rules_between_fields_come_after_the_types() -> None:
    # both a type error and a rule broken: the type is reported
    error = refused(parse_completion_request, {**COMPLETION, "max_tokens": "many", "stream_options": {"include_usage": True}})
    assert error.param == "max_tokens"
    assert refused(parse_completion_request, {**COMPLETION, "stream_options": {"include_usage": True}}).param == "stream_options"
    assert refused(parse_chat_completion_request, {**CHAT, "max_tokens": 2, "min_tokens": 3}).param == "min_tokens"


def test_well_formed_bodies_parse() -> None:
    chat = parse_chat_completion_request({**CHAT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
    assert (chat.max_tokens, chat.stream) == (4, True)
    completion = parse_completion_request({**COMPLETION, "n": 2, "seed": 3})
    assert (completion.prompts, completion.n, completion.seed) == (("hi",), 2, 3)
