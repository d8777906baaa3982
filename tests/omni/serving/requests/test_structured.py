"""response_format, structured_outputs and guided_* all become one GrammarSpec."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests import parse_chat_completion_request, parse_completion_request
from omni.text.constrained.spec import GrammarKind, GrammarSpec

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SCHEMA_TEXT = json.dumps(SCHEMA, sort_keys=True, separators=(",", ":"))


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, GrammarSpec(GrammarKind.JSON_OBJECT, "", "response_format")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
            GrammarSpec(GrammarKind.JSON_SCHEMA, SCHEMA_TEXT, "response_format.json_schema.schema"),
        ),
        ({"structured_outputs": {"json": SCHEMA}}, GrammarSpec(GrammarKind.JSON_SCHEMA, SCHEMA_TEXT, "structured_outputs.json")),
        ({"structured_outputs": {"regex": "[a-z]+"}}, GrammarSpec(GrammarKind.REGEX, "[a-z]+", "structured_outputs.regex")),
        ({"structured_outputs": {"choice": ["a", "b"]}}, GrammarSpec(GrammarKind.CHOICE, '["a","b"]', "structured_outputs.choice")),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, GrammarSpec(GrammarKind.GRAMMAR, 'root ::= "a"', "structured_outputs.grammar")),
        ({"structured_outputs": {"json_object": True}}, GrammarSpec(GrammarKind.JSON_OBJECT, "", "structured_outputs.json_object")),
        ({"guided_json": json.dumps(SCHEMA)}, GrammarSpec(GrammarKind.JSON_SCHEMA, SCHEMA_TEXT, "guided_json")),
        ({"guided_regex": "x+", "guided_decoding_backend": "xgrammar"}, GrammarSpec(GrammarKind.REGEX, "x+", "guided_regex")),
        ({"guided_choice": ["yes", "no"]}, GrammarSpec(GrammarKind.CHOICE, '["yes","no"]', "guided_choice")),
        ({"guided_grammar": 'start: "a"'}, GrammarSpec(GrammarKind.GRAMMAR, 'start: "a"', "guided_grammar")),
    ],
)
def test_each_form_parses_to_its_spec(fields: dict[str, Any], expected: GrammarSpec | None) -> None:
    assert parse_chat_completion_request(chat(**fields)).grammar == expected
    completion = {"model": "m", "prompt": "x", **fields}
    assert parse_completion_request(completion).grammar == expected


def test_the_same_schema_written_differently_is_one_cache_key() -> None:
    a = parse_chat_completion_request(chat(guided_json={"required": ["a"], "type": "object"}))
    b = parse_chat_completion_request(chat(guided_json='{"type": "object", "required": ["a"]}'))
    assert a.grammar == b.grammar


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}, "response_format.json_schema.strict"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"bogus": 1}}, "structured_outputs"),
        ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", 3]}, "guided_choice"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "a", "guided_decoding_backend": "magic"}, "guided_decoding_backend"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ],
)
def test_malformed_or_conflicting_constraints_are_a_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(chat(**fields))
    assert (e.value.status, e.value.param) == (400, param)
