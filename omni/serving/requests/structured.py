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
from omni.serving.requests.fields import Body, opt_object, opt_str, type_error, value_error
from omni.text.constrained.spec import GrammarKind, GrammarSpec

# vLLM's backend names: they pick an implementation, and every request here gets llguidance.
GUIDED_BACKENDS = frozenset({"auto", "guidance", "llguidance", "xgrammar", "outlines", "lm-format-enforcer"})


def parse_grammar(body: Body) -> GrammarSpec | None:
    found = [
        spec
        for spec in (
            _response_format(body),
            _structured_outputs(body),
            _guided(body, "guided_json", GrammarKind.JSON_SCHEMA),
            _guided(body, "guided_regex", GrammarKind.REGEX),
            _guided(body, "guided_choice", GrammarKind.CHOICE),
            _guided(body, "guided_grammar", GrammarKind.GRAMMAR),
        )
        if spec is not None
    ]
    backend = opt_str(body, "guided_decoding_backend")
    if backend is not None and backend not in GUIDED_BACKENDS:
        raise value_error("guided_decoding_backend", f"'{backend}'; known: {', '.join(sorted(GUIDED_BACKENDS))}.")
    if len(found) > 1:
        names = ", ".join(f"'{s.param}'" for s in found)
        raise bad_request(f"Only one output constraint may be given; got {names}.", param=found[1].param)
    return found[0] if found else None


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()  # one cache key per schema


def _response_format(body: Body) -> GrammarSpec | None:
    fmt = opt_object(body, "response_format")
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(GrammarKind.JSON_OBJECT, "", "response_format")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict):
            raise type_error("response_format.json_schema", "an object", inner)
        schema = inner.get("schema", {})  # OpenAI: omitted means any JSON (an empty schema)
        if not isinstance(schema, (dict, bool)):
            raise type_error("response_format.json_schema.schema", "an object", schema)
        strict = inner.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise type_error("response_format.json_schema.strict", "a boolean", strict)
        # strict or not, the output is held to the schema: constraining is what we can offer,
        # and a client asking for a schema wants it kept.
        return GrammarSpec(GrammarKind.JSON_SCHEMA, _json_text(schema), "response_format.json_schema.schema")
    raise value_error("response_format.type", f"'{kind}'; expected text, json_object or json_schema.")


def _structured_outputs(body: Body) -> GrammarSpec | None:
    so = opt_object(body, "structured_outputs")
    if so is None:
        return None
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) not in (None, False)]
    unknown = sorted(set(so) - {"json", "regex", "choice", "grammar", "json_object", "backend", "whitespace_pattern"})
    if unknown:
        raise value_error("structured_outputs", f"unknown field '{unknown[0]}'.")
    if so.get("whitespace_pattern") is not None:
        raise bad_request(
            "'structured_outputs.whitespace_pattern' is not supported: JSON output uses compact separators.",
            param="structured_outputs.whitespace_pattern",
            code="unsupported_parameter",
        )
    if len(given) != 1:
        raise value_error("structured_outputs", "give exactly one of json, regex, choice, grammar, json_object.")
    key = given[0]
    param = f"structured_outputs.{key}"
    value = so[key]
    if key == "json_object":
        if value is not True:
            raise type_error(param, "true", value)
        return GrammarSpec(GrammarKind.JSON_OBJECT, "", param)
    kind = {"json": GrammarKind.JSON_SCHEMA, "regex": GrammarKind.REGEX, "choice": GrammarKind.CHOICE, "grammar": GrammarKind.GRAMMAR}[key]
    return _spec(kind, value, param)


def _guided(body: Body, key: str, kind: GrammarKind) -> GrammarSpec | None:
    value = body.get(key)
    return None if value is None else _spec(kind, value, key)


def _spec(kind: GrammarKind, value: Any, param: str) -> GrammarSpec:
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
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise type_error(param, "a non-empty array of non-empty strings", value)
        return GrammarSpec(kind, _json_text(list(value)), param)
    if not isinstance(value, str) or not value:
        raise type_error(param, "a non-empty string", value)
    return GrammarSpec(kind, value, param)
