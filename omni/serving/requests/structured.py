"""The output-constraint fields of both endpoints -> one GrammarSpec (or none).

OpenAI's `response_format` (text, json_object, json_schema with name, schema, strict), vLLM's
`structured_outputs` object (json, regex, choice, grammar, json_object) and its older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` fields. A request may ask for
one constraint at most; whether it compiles is the grammar compiler's 400 (omni/text/constrained).
"""

from __future__ import annotations

from typing import Any

import orjson

from omni.errors import bad_request
from omni.serving.requests.common import (
    GenerationFields,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    ResponseFormat,
    StructuredOutputs,
)
from omni.serving.requests.fields import type_error, value_error
from omni.text.constrained.spec import GrammarKind, GrammarSpec

_STRUCTURED_KINDS = {
    "json": GrammarKind.JSON_SCHEMA,
    "regex": GrammarKind.REGEX,
    "choice": GrammarKind.CHOICE,
    "grammar": GrammarKind.GRAMMAR,
}


def grammar_of(req: GenerationFields) -> GrammarSpec | None:
    found = [
        spec
        for spec in (
            _response_format(req.response_format),
            _structured_outputs(req.structured_outputs),
            _guided(req.guided_json, "guided_json", GrammarKind.JSON_SCHEMA),
            _guided(req.guided_regex, "guided_regex", GrammarKind.REGEX),
            _guided(req.guided_choice, "guided_choice", GrammarKind.CHOICE),
            _guided(req.guided_grammar, "guided_grammar", GrammarKind.GRAMMAR),
        )
        if spec is not None
    ]
    if len(found) > 1:
        names = ", ".join(f"'{s.param}'" for s in found)
        raise bad_request(f"Only one output constraint may be given; got {names}.", param=found[1].param)
    return found[0] if found else None


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()  # one cache key per schema


def _response_format(fmt: ResponseFormat | None) -> GrammarSpec | None:
    if isinstance(fmt, JsonObjectFormat):
        return GrammarSpec(GrammarKind.JSON_OBJECT, "", "response_format")
    if isinstance(fmt, JsonSchemaResponseFormat):
        # strict or not, the output is held to the schema: constraining is what we can offer,
        # and a client asking for a schema wants it kept.
        schema = fmt.json_schema.schema_
        return GrammarSpec(GrammarKind.JSON_SCHEMA, _json_text(schema), "response_format.json_schema.schema")
    return None  # text, or none


def _structured_outputs(so: StructuredOutputs | None) -> GrammarSpec | None:
    if so is None:
        return None
    if so.whitespace_pattern is not None:
        raise bad_request(
            "'structured_outputs.whitespace_pattern' is not supported: JSON output uses compact separators.",
            param="structured_outputs.whitespace_pattern",
            code="unsupported_parameter",
        )
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(so, k) not in (None, False)]
    if len(given) != 1:
        raise value_error("structured_outputs", "give exactly one of json, regex, choice, grammar, json_object.")
    key = given[0]
    param = f"structured_outputs.{key}"
    if key == "json_object":
        return GrammarSpec(GrammarKind.JSON_OBJECT, "", param)
    return _spec(_STRUCTURED_KINDS[key], getattr(so, key), param)


def _guided(value: Any, param: str, kind: GrammarKind) -> GrammarSpec | None:
    return None if value is None else _spec(kind, value, param)


def _spec(kind: GrammarKind, value: Any, param: str) -> GrammarSpec:
    """value has its Struct type: a schema (or its JSON text), a non-empty list of non-empty
    strings for a choice, a non-empty string otherwise."""
    if kind is GrammarKind.JSON_SCHEMA:
        if isinstance(value, str):  # vLLM accepts the schema as JSON text too
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError as e:
                raise value_error(param, f"not a JSON schema: {e}") from None
        if not isinstance(value, (dict, bool)):
            raise type_error(param, "a JSON schema object", value)
        return GrammarSpec(kind, _json_text(value), param)
    if kind is GrammarKind.CHOICE:
        return GrammarSpec(kind, _json_text(list(value)), param)
    return GrammarSpec(kind, value, param)


