"""The grammar that forces a tool call (tool_choice "required" or a named function).

tool_call_grammar() writes an llguidance Lark grammar for one tool call format: one call (or,
when parallel, one or more separated by "\\n") of one of the given functions, with arguments
that satisfy the function's schema, and nothing after it. The text starts with `%llguidance {}`,
so the compiler's GRAMMAR path (any_to_lark) passes it through unchanged.

    hermes:       <tool_call> "\\n{"name": "f", "arguments": " %json{schema} "}\\n" </tool_call>
    hyperclovax:  <tool_call> "f\\n" (<arg_key> "k" </arg_key> "\\n" <arg_value> v </arg_value> "\\n")* </tool_call>

The markers are written as special tokens (`<tool_call>`), so the tokenizer must have them as
special (or added) tokens; the grammar does not compile otherwise.

A forced call must be able to end, even for a weak model that samples almost at random (the
tiny test models do), so free text is bounded: a string with no maxLength, enum, const or
pattern gets max_free_chars (a bare hyperclovax value and a JSON string alike), and an object
schema that does not say otherwise takes only its declared properties, since unknown keys are
strings without end. A real model writing a longer string is cut at that bound; raise it where
models are trusted to stop on their own. Not bounded: a pattern (bounding it might leave nothing
to match, which does not compile), the digits of a number, and the number of parallel calls
unless max_calls is given.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omni.text.parsers.tool_calls import ToolFunction, is_string_schema

MAX_FREE_CHARS = 48
# The reference dialect's image tool: the model draws the image as this argument's value, and
# the server answers with the image's URL in its place.
T2I_TOOL = "t2i_model_generation"
T2I_ARG = "discrete_image_token"

# JSON as the rest of the server writes it under a grammar: no free whitespace, which a weak
# model would fill max_tokens with. Lenient: a client's tool schema with a keyword llguidance
# does not implement still forces a call (that keyword unchecked) rather than failing the request.
_JSON_OPTIONS = {"whitespace_flexible": False, "lenient": True}

# Markup spelled out as plain text inside a bare value would end it early when parsed.
_NOT_MARKUP = r"~/(?s:.*)<\/?(tool_call|arg_key|arg_value)>(?s:.*)/"


def tool_call_grammar(
    parser_name: str,
    functions: Sequence[ToolFunction],
    *,
    parallel: bool,
    max_calls: int | None = None,
    max_free_chars: int = MAX_FREE_CHARS,
    opened: bool = False,
    image_rules: Sequence[str] = (),
) -> str:
    """A Lark grammar (llguidance's dialect) for one call of one of functions, or, when
    parallel, one or more (at most max_calls when given); ValueError for an unknown format, no
    functions, or max_calls under 1. opened: the first call's <tool_call> is already out (the
    grammar is switched on by that token, for tool_choice "auto"), so the grammar begins after it.

    image_rules: the rules of an image span (ImageSpanFormat.rules("image")), given when the
    model draws images: then the reference's image tool, t2i_model_generation, takes its
    discrete_image_token argument as a whole image span (hyperclovax format only)."""
    if not functions:
        raise ValueError("a forced tool call needs at least one function")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, not {max_calls}")
    try:
        write_call = _FORMATS[parser_name]
    except KeyError:
        raise ValueError(f"no tool call grammar for {parser_name!r}; known: {', '.join(sorted(_FORMATS))}") from None
    first = "opened" if opened else "call"
    rules = [
        "%llguidance {}",
        f"start: {first}" + _more_calls(parallel, max_calls),
        "call: " + " | ".join(f"fn{i}" for i in range(len(functions))),
    ]
    if opened:
        rules.append("opened: " + " | ".join(f"fn{i}_opened" for i in range(len(functions))))
    images = bool(image_rules) and parser_name == "hyperclovax"
    for i, function in enumerate(functions):
        if images and function.name == T2I_TOOL:
            call_rules = _t2i_call(f"fn{i}", function, max_free_chars)
        else:
            call_rules = write_call(f"fn{i}", function, max_free_chars)
        if opened:  # the same call, less its opening token
            head = f"fn{i}: <tool_call> "
            assert call_rules[0].startswith(head)
            call_rules.append(f"fn{i}_opened: " + call_rules[0][len(head) :])
        rules.extend(call_rules)
    if images and any(f.name == T2I_TOOL for f in functions):
        rules.extend(image_rules)
    return "\n".join(rules) + "\n"


def _more_calls(parallel: bool, max_calls: int | None) -> str:
    if not parallel or max_calls == 1:
        return ""
    more = ' ("\\n" call)'
    return more + "*" if max_calls is None else more + f"{{0,{max_calls - 1}}}"


def _hermes_call(rule: str, function: ToolFunction, cap: int) -> list[str]:
    head = "\n" + '{"name": ' + json.dumps(function.name, ensure_ascii=False) + ', "arguments": '
    schema = _bounded(_object_schema(function.parameters), cap)
    return [
        f'{rule}: <tool_call> {_literal(head)} {rule}_args "}}\\n" </tool_call>',
        f"{rule}_args: {_inline_json(schema)}",
    ]


def _hyperclovax_call(rule: str, function: ToolFunction, cap: int) -> list[str]:
    schema = _object_schema(function.parameters)
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = [k for k in schema.get("required", []) if isinstance(k, str)]
    # Declared order, as the JSON path has it; a required key the schema does not describe
    # comes after them, taking any JSON value.
    keys = list(properties) + [k for k in required if k not in properties]
    definitions: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}  # for $refs
    rules = []
    parts = []
    for n, key in enumerate(keys):
        part = f"{rule}_{n}"
        value = f"{rule}_{n}_value"
        parts.append(part if key in required else part + "?")
        rules.append(f'{part}: <arg_key> {_literal(key)} </arg_key> "\\n" <arg_value> {value} </arg_value> "\\n"')
        rules.extend(_bare_value(value, properties.get(key, {}), definitions, cap))
    head = _literal(function.name + "\n")
    rules.insert(0, f"{rule}: <tool_call> {' '.join([head, *parts])} </tool_call>")
    return rules


def _t2i_call(rule: str, function: ToolFunction, cap: int) -> list[str]:
    """The reference's image tool: its image argument is an image span (the `image` rule),
    whatever its schema says (and required: the call exists to draw it; a schema that does not
    declare it gets it last); its other arguments as any hyperclovax call's."""
    schema = _object_schema(function.parameters)
    properties = dict(schema.get("properties") or {})
    properties.setdefault(T2I_ARG, {"type": "string"})
    required = [k for k in schema.get("required", []) if isinstance(k, str) and k != T2I_ARG] + [T2I_ARG]
    with_image = dataclasses.replace(function, parameters={**schema, "properties": properties, "required": required})
    rules = _hyperclovax_call(rule, with_image, cap)
    keys = list(properties) + [k for k in required if k not in properties]
    value = f"{rule}_{keys.index(T2I_ARG)}_value"
    terminal = value.upper() + ":"
    # the image argument's value rule (and the terminal a string value has) become the span
    return [f"{value}: image" if r.startswith(f"{value}: ") else r for r in rules if not r.startswith(terminal)]


def _bare_value(rule: str, schema: Any, definitions: Mapping[str, Any], cap: int) -> list[str]:
    """A hyperclovax value: a string property as its text (its length, enum and pattern
    enforced; its format not), anything else as JSON."""
    if not is_string_schema(schema):
        return [f"{rule}: {_inline_json(_bounded({**definitions, **_as_schema(schema)}, cap))}"]
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None:
        return [f"{rule}: " + " | ".join(_literal(v) for v in values if isinstance(v, str))]
    low = int(schema.get("minLength", 0))
    high = schema.get("maxLength")
    pattern = schema.get("pattern")
    if high is None and not isinstance(pattern, str):
        high = max(cap, low)
    terminal = rule.upper()
    text = f"/(?s:.{{{low},{'' if high is None else int(high)}}})/ & {_NOT_MARKUP}"
    if isinstance(pattern, str):
        text += f" & /{_search_regex(pattern)}/"
    return [f"{rule}: {terminal}", f"{terminal}: {text}"]


def _search_regex(pattern: str) -> str:
    """A JSON schema pattern matches anywhere in the string unless anchored; llguidance's
    regexes match the whole lexeme."""
    lead = trail = "(?s:.*)"
    if pattern.startswith("^"):
        pattern, lead = pattern[1:], ""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern, trail = pattern[:-1], ""
    return lead + "(?:" + re.sub(r"(?<!\\)/", r"\\/", pattern) + ")" + trail  # "/" ends a Lark regex


def _object_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments are always an object: no parameters means none."""
    schema = dict(parameters)
    if "type" not in schema and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
        schema["type"] = "object"
    return schema


def _as_schema(schema: Any) -> dict[str, Any]:
    if schema is True or schema is None:
        return {}
    if schema is False:
        return {"not": {}}
    return dict(schema)


def _bounded(schema: Any, cap: int, *, close_objects: bool = True) -> Any:
    """A copy of schema in which every string and every object can end (see the module doc)."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)

    def nested(sub: Any) -> Any:
        return _bounded(sub, cap)

    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(out.get(key), Mapping):
            out[key] = {k: nested(v) for k, v in out[key].items()}
    for key in ("items", "additionalProperties", "contains"):
        if isinstance(out.get(key), Mapping):
            out[key] = nested(out[key])
    for key in ("prefixItems", "anyOf", "oneOf", "items"):
        if isinstance(out.get(key), list):
            out[key] = [nested(s) for s in out[key]]
    if isinstance(out.get("allOf"), list):  # closing a part would refuse the other parts' keys
        out["allOf"] = [_bounded(s, cap, close_objects=False) for s in out["allOf"]]
    # A pattern is left as it is: with a bound it might match nothing, which does not compile.
    if _admits(out, "string") and not any(k in out for k in ("maxLength", "enum", "const", "pattern")):
        out["maxLength"] = max(cap, int(out.get("minLength", 0)))
    said = any(k in out for k in ("anyOf", "oneOf", "allOf", "$ref", "additionalProperties", "patternProperties"))
    if close_objects and _admits(out, "object") and not said:
        out["additionalProperties"] = False
    return out


def _admits(schema: Mapping[str, Any], kind: str) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _inline_json(schema: Mapping[str, Any]) -> str:
    return "%json " + json.dumps({"x-guidance": _JSON_OPTIONS, **schema}, ensure_ascii=False)


def _literal(text: str) -> str:
    # Lark string literals take JSON's escapes.
    return json.dumps(text, ensure_ascii=False)


_FORMATS: dict[str, Callable[[str, ToolFunction, int], list[str]]] = {
    "hermes": _hermes_call,
    "hyperclovax": _hyperclovax_call,
    "glm45": _hyperclovax_call,
}
