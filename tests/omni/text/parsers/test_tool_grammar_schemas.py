"""One forced-call test per JSON-schema construct a tool's parameters use (issue 20, acceptance
6): in every call format the grammar compiles, and constrained generations on the tiny
tokenizer, sampling uniformly among the tokens the grammar allows (the weakest model there
is), write calls that the format's parser reads back into arguments which validate against
the schema with the `jsonschema` package, formats checked. The formats: the template's
(hermes: JSON inside <tool_call>; hyperclovax: bare <arg_key>/<arg_value> pairs, string values
as text) and the server's own for a template with none (json_calls for "required",
json_arguments for a named function)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.parsers.tool_calls import ToolFunction, tool_parser_class
from omni.text.parsers.tool_grammar import tool_call_grammar
from omni.text.tokenizer import TextTokenizer
from tests.omni.text.parsers.test_tool_grammar import walk

FORMATS = ["hermes", "hyperclovax", "json_calls", "json_arguments"]
SEEDS = range(12)
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def params(properties: dict[str, Any], required: list[str] | None = None, **more: Any) -> dict[str, Any]:
    required = list(properties) if required is None else required
    return {"type": "object", "properties": properties, "required": required, **more}


# The issue's tool: an enum string, an integer range, an array of enum items with min/maxItems.
ISSUE_TOOL = params(
    {
        "mode": {"type": "string", "enum": ["train", "bus", "car"], "description": "How to travel"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "extras": {
            "type": "array",
            "items": {"type": "string", "enum": ["breakfast", "parking", "wifi"]},
            "minItems": 1,
            "maxItems": 2,
        },
    }
)

CONSTRUCTS: dict[str, dict[str, Any]] = {
    "issue_tool": ISSUE_TOOL,
    "enum_string": params({"x": {"type": "string", "enum": ["celsius", "fahrenheit", "two words"]}}),
    "enum_untyped": params({"x": {"enum": ["a", "b"]}}),
    "enum_number": params({"x": {"type": "number", "enum": [1, 2.5, -3]}}),
    "enum_mixed": params({"x": {"enum": ["a", 1, None, True]}}),
    "const": params({"x": {"const": "fixed"}, "y": {"const": 3}}),
    "integer_range": params({"x": {"type": "integer", "minimum": -5, "maximum": 12}}),
    "integer_exclusive": params({"x": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}),
    "number_range": params({"x": {"type": "number", "minimum": -1.5, "maximum": 2.5}}),
    "number_exclusive": params({"x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}),
    # A 64-bit integer's range (protobuf and Go clients write it): llguidance's own ranges
    # overflow at -2**63, so the grammar narrows the bound to 2**53.
    "integer_int64_range": params({"x": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}}),
    "string_lengths": params({"x": {"type": "string", "minLength": 2, "maxLength": 5}}),
    "string_pattern": params({"x": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{2}$"}}),
    "string_pattern_unanchored": params({"x": {"type": "string", "pattern": "[0-9]{3}", "maxLength": 8}}),
    "string_format_date": params({"x": {"type": "string", "format": "date"}}),
    "string_format_date_time": params({"x": {"type": "string", "format": "date-time"}}),
    "string_format_time": params({"x": {"type": "string", "format": "time"}}),
    "string_format_email": params({"x": {"type": "string", "format": "email"}}),
    "string_format_uuid": params({"x": {"type": "string", "format": "uuid"}}),
    "string_format_ipv4": params({"x": {"type": "string", "format": "ipv4"}}),
    "array_items_counts": params(
        {"x": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4}}
    ),
    # Counts a client wrote as floats (2.0): llguidance compiles only integers.
    "array_float_counts": params(
        {"x": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1.0, "maxItems": 3.0}}
    ),
    "nested_object": params(
        {
            "guest": params({"name": {"type": "string", "maxLength": 8}, "vip": {"type": "boolean"}}, ["name"]),
            "note": {"type": "string", "maxLength": 6},
        },
        ["guest"],
    ),
    "additional_properties_false": params({"a": {"type": "integer"}}, [], additionalProperties=False),
    "additional_properties_schema": params(
        {"counts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}, "maxProperties": 2}}
    ),
    "optional_only": params({"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}}, []),
    "any_of": params(
        {"x": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "string", "enum": ["none"]}]}}
    ),
    "one_of": params(
        {
            "x": {
                "oneOf": [
                    params({"kind": {"const": "a"}}, additionalProperties=False),
                    params({"kind": {"const": "b"}, "v": {"type": "integer"}}, additionalProperties=False),
                ]
            }
        }
    ),
    "nullable_type_list": params(
        {
            "s": {"type": ["string", "null"], "maxLength": 5},
            "n": {"type": ["integer", "null"], "minimum": 0, "maximum": 3},
        }
    ),
    "nullable_any_of": params({"x": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}}),
    "ref_defs": {
        **params({"unit": {"$ref": "#/$defs/unit"}, "place": {"$ref": "#/$defs/place"}}),
        "$defs": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "place": params({"lat": {"type": "number", "minimum": -90, "maximum": 90}}),
        },
    },
    "ref_definitions_recursive": {
        **params({"list": {"$ref": "#/definitions/node"}}),
        "definitions": {"node": params({"v": {"type": "integer"}, "next": {"$ref": "#/definitions/node"}}, ["v"])},
    },
    "annotations_ignored": params(
        {"x": {"type": "integer", "title": "X", "description": "a } brace", "default": 3, "maximum": 9}},
        title="Arguments",
        description="What the call takes",
        default={},
    ),
    "all_of": params({"x": {"allOf": [{"type": "integer"}, {"minimum": 2, "maximum": 4}]}}),
    "no_parameters": {},
}


@pytest.fixture(scope="module")
def compiler(tiny_tokenizer_dir: Path) -> GrammarCompiler:
    return GrammarCompiler(TextTokenizer.from_dir(tiny_tokenizer_dir))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("construct", list(CONSTRUCTS))
async def test_each_construct_makes_calls_that_validate(compiler: GrammarCompiler, construct: str, fmt: str) -> None:
    schema = CONSTRUCTS[construct]
    function = ToolFunction("f", "a tool", schema)
    text = tool_call_grammar(fmt, [function], parallel=False)
    grammar = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, text, "tool_choice"))
    parser_class = tool_parser_class(fmt)
    seen = set()
    for seed in SEEDS:
        output, _, stopped = walk(grammar, compiler.tokenizer, seed)
        assert stopped, output
        content, calls = parser_class([function]).parse(output)
        assert content == "" and [c.name for c in calls] == ["f"], output
        args = json.loads(calls[0].arguments)
        jsonschema.validate(args, schema, format_checker=FORMAT_CHECKER)
        seen.add(calls[0].arguments)
    assert len(seen) > 1 or construct in ("const", "no_parameters", "additional_properties_false", "optional_only")
