"""The grammar that forces a tool call (tool_choice "required" or a named function).

tool_call_grammar() writes an llguidance Lark grammar for one tool call format: one call (or,
when parallel, one or more separated by "\\n") of one of the given functions, with arguments
that satisfy the function's schema, and nothing after it. The text starts with `%llguidance {}`,
so the compiler's GRAMMAR path (any_to_lark) passes it through unchanged.

    hermes:       <tool_call> "\\n{"name": "f", "arguments": " %json{schema} "}\\n" </tool_call>
    hyperclovax:  <tool_call> "f\\n" (<arg_key> "k" </arg_key> "\\n" <arg_value> v </arg_value> "\\n")* </tool_call>
    json_calls:   "[" "{"name":"f","parameters":" %json{schema} "}" ("," ...)* "]"   (no markup)
    json_arguments:   %json{schema}                                (a named function, no markup)

The markers are written as tokens (`<tool_call>`: special or added ones), and as text where
the tokenizer has no such token. Every argument schema goes to llguidance's own JSON schema
support (`%json`), which implements the keywords tools use (enum, const, numeric bounds,
string lengths, patterns and formats, items and counts, nested and additional properties,
anyOf/oneOf/allOf, type lists, $ref/$defs; titles, descriptions and defaults ignored); a
hyperclovax string value is bare text, held to its enum, length and pattern by a regex.

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
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from omni.text.parsers.tool_calls import ToolFunction, is_string_schema

MAX_FREE_CHARS = 48
# The reference dialect's image tool: the model draws the image as this argument's value, and
# the server answers with the image's URL in its place.
T2I_TOOL = "t2i_model_generation"
T2I_ARG = "discrete_image_token"

# Forced calls on a model whose chat format has no tool markup, as vLLM serves them: the output
# is JSON, which the server reads back as the calls (omni/text/parsers/tool_calls.py's parsers
# of the same names). tool_choice "required": a list of calls, each {"name", "parameters"} as
# vLLM's; a named function: its arguments object alone.
JSON_CALLS = "json_calls"
JSON_ARGUMENTS = "json_arguments"
_JSON_FORMATS = (JSON_CALLS, JSON_ARGUMENTS)

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
    tokens: Container[str] | None = None,
) -> str:
    """A Lark grammar (llguidance's dialect) for one call of one of functions, or, when
    parallel, one or more (at most max_calls when given); ValueError for an unknown format, no
    functions, or max_calls under 1. opened: the first call's <tool_call> is already out (the
    grammar is switched on by that token, for tool_choice "auto"), so the grammar begins after it.

    image_rules: the rules of an image span (ImageSpanFormat.rules("image")), given when the
    model draws images: then the reference's image tool, t2i_model_generation, takes its
    discrete_image_token argument as a whole image span (hyperclovax format only).

    tokens: the markers the tokenizer has as tokens (None: all of them). A marker it lacks is
    written as its text, which the model spells with ordinary tokens and the parser reads
    the same (a checkpoint given a Hermes template its tokenizer was not made for)."""
    if not functions:
        raise ValueError("a forced tool call needs at least one function")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, not {max_calls}")
    if parser_name in _JSON_FORMATS:
        return _json_grammar(parser_name, functions, parallel, max_calls, max_free_chars)
    try:
        write_call = _FORMATS[parser_name]
    except KeyError:
        known = sorted([*_FORMATS, *_JSON_FORMATS])
        raise ValueError(f"no tool call grammar for {parser_name!r}; known: {', '.join(known)}") from None
    mark = _Markers(tokens)
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
            call_rules = _t2i_call(f"fn{i}", function, max_free_chars, mark)
        else:
            call_rules = write_call(f"fn{i}", function, max_free_chars, mark)
        if opened:  # the same call, less its opening token
            head = f"fn{i}: {mark('<tool_call>')} "
            assert call_rules[0].startswith(head)
            call_rules.append(f"fn{i}_opened: " + call_rules[0][len(head) :])
        rules.extend(call_rules)
    if images and any(f.name == T2I_TOOL for f in functions):
        rules.extend(image_rules)
    return "\n".join(rules) + "\n"


def _more_calls(parallel: bool, max_calls: int | None, separator: str = "\n") -> str:
    if not parallel or max_calls == 1:
        return ""
    more = f" ({_literal(separator)} call)"
    return more + "*" if max_calls is None else more + f"{{0,{max_calls - 1}}}"


def _json_grammar(
    format_name: str, functions: Sequence[ToolFunction], parallel: bool, max_calls: int | None, cap: int
) -> str:
    """The JSON formats, for a model whose chat format has no tool markup (see JSON_CALLS)."""
    rules = ["%llguidance {}"]
    if format_name == JSON_ARGUMENTS:
        if len(functions) != 1:
            raise ValueError(f"{JSON_ARGUMENTS} is one named function's arguments, not {len(functions)} functions'")
        schema = _bounded(_object_schema(functions[0].parameters), cap)
        rules += ["start: fn0_args", f"fn0_args: {_inline_json(schema)}"]
        return "\n".join(rules) + "\n"
    rules += [
        'start: "[" call' + _more_calls(parallel, max_calls, ",") + ' "]"',
        "call: " + " | ".join(f"fn{i}" for i in range(len(functions))),
    ]
    for i, function in enumerate(functions):
        head = '{"name":' + json.dumps(function.name, ensure_ascii=False) + ',"parameters":'
        schema = _bounded(_object_schema(function.parameters), cap)
        rules += [f'fn{i}: {_literal(head)} fn{i}_args "}}"', f"fn{i}_args: {_inline_json(schema)}"]
    return "\n".join(rules) + "\n"


class _Markers:
    """How the grammar writes a marker: as its token (`<tool_call>`), or, for a marker the
    tokenizer does not have as one token, as text ("<tool_call>")."""

    def __init__(self, tokens: Container[str] | None) -> None:
        self._tokens = tokens

    def __call__(self, marker: str) -> str:
        return marker if self._tokens is None or marker in self._tokens else _literal(marker)


def _hermes_call(rule: str, function: ToolFunction, cap: int, mark: _Markers) -> list[str]:
    head = "\n" + '{"name": ' + json.dumps(function.name, ensure_ascii=False) + ', "arguments": '
    schema = _bounded(_object_schema(function.parameters), cap)
    return [
        f'{rule}: {mark("<tool_call>")} {_literal(head)} {rule}_args "}}\\n" {mark("</tool_call>")}',
        f"{rule}_args: {_inline_json(schema)}",
    ]


def _hyperclovax_call(rule: str, function: ToolFunction, cap: int, mark: _Markers) -> list[str]:
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
        key_part = f'{mark("<arg_key>")} {_literal(key)} {mark("</arg_key>")} "\\n"'
        rules.append(f'{part}: {key_part} {mark("<arg_value>")} {value} {mark("</arg_value>")} "\\n"')
        rules.extend(_bare_value(value, properties.get(key, {}), definitions, cap))
    head = _literal(function.name + "\n")
    rules.insert(0, f"{rule}: {mark('<tool_call>')} {' '.join([head, *parts])} {mark('</tool_call>')}")
    return rules


def _t2i_call(rule: str, function: ToolFunction, cap: int, mark: _Markers) -> list[str]:
    """The reference's image tool: its image argument is an image span (the `image` rule),
    whatever its schema says (and required: the call exists to draw it; a schema that does not
    declare it gets it last); its other arguments as any hyperclovax call's."""
    schema = _object_schema(function.parameters)
    properties = dict(schema.get("properties") or {})
    properties.setdefault(T2I_ARG, {"type": "string"})
    required = [k for k in schema.get("required", []) if isinstance(k, str) and k != T2I_ARG] + [T2I_ARG]
    with_image = dataclasses.replace(function, parameters={**schema, "properties": properties, "required": required})
    rules = _hyperclovax_call(rule, with_image, cap, mark)
    keys = list(properties) + [k for k in required if k not in properties]
    value = f"{rule}_{keys.index(T2I_ARG)}_value"
    terminal = value.upper() + ":"
    # the image argument's value rule (and the terminal a string value has) become the span
    return [f"{value}: image" if r.startswith(f"{value}: ") else r for r in rules if not r.startswith(terminal)]


def _bare_value(rule: str, schema: Any, definitions: Mapping[str, Any], cap: int) -> list[str]:
    """A hyperclovax value: a string property as its text (its length, enum and pattern
    enforced, and its format where _BARE_FORMATS has it), anything else as JSON."""
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
    form = _BARE_FORMATS.get(schema.get("format"))  # type: ignore[arg-type]
    if form is not None:
        text += f" & /{form}/"
    return [f"{rule}: {terminal}", f"{terminal}: {text}"]


# A bare string's format, as a regex (JSON strings have llguidance's own). Stricter than the
# formats where that is simpler: no leap day, no leap second, a plain dotted email domain.
_DAY = (  # month-day: the 31-day months, the 30-day ones, February
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_DATE = r"[0-9]{4}-" + _DAY
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?"
_BARE_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "email": rf"[a-zA-Z0-9._+-]{{1,32}}@{_LABEL}(?:\.{_LABEL}){{1,3}}",
}


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
    _as_llguidance_reads(out)
    form = _BARE_FORMATS.get(out.get("format"))  # type: ignore[arg-type]
    if form is not None and "pattern" not in out:  # stricter than llguidance's (it takes a leap second)
        out["pattern"] = f"^(?:{form})$"
        del out["format"]
    # A pattern is left as it is: with a bound it might match nothing, which does not compile.
    if _admits(out, "string") and not any(k in out for k in ("maxLength", "enum", "const", "pattern")):
        out["maxLength"] = max(cap, int(out.get("minLength", 0)))
    extra = out.get("additionalProperties")
    if isinstance(extra, Mapping) and not out.get("properties") and not out.get("patternProperties"):
        # A map (keys are data): its keys bounded as free strings are. llguidance has no
        # propertyNames; a pattern would also apply to declared properties, so only a map's.
        out["patternProperties"] = {f"^.{{0,{cap}}}$": extra}
        out["additionalProperties"] = False
    said = any(k in out for k in ("anyOf", "oneOf", "allOf", "$ref", "additionalProperties", "patternProperties"))
    if close_objects and _admits(out, "object") and not said:
        out["additionalProperties"] = False
    return out


# Counts llguidance takes only as JSON integers; a client may write them as 2.0.
_COUNTS = (
    "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains", "maxContains"
)  # fmt: skip
# llguidance builds a number's range as a regex over i64 (a bound near -2**63 overflows it).
# A bound beyond this one is moved in to it: the range only narrows, so what the grammar
# admits still validates, and no model writes a 17-digit argument a client meant.
_NUMBER_BOUND = 2**53  # the integers a JSON number holds exactly


def _as_llguidance_reads(schema: dict[str, Any]) -> None:
    """In place: the schema's counts and number bounds in the forms llguidance compiles."""
    for key in _COUNTS:
        value = schema.get(key)
        if isinstance(value, float) and value.is_integer():
            schema[key] = int(value)
    lows = [schema[k] for k in ("minimum", "exclusiveMinimum") if _is_number(schema.get(k))]
    highs = [schema[k] for k in ("maximum", "exclusiveMaximum") if _is_number(schema.get(k))]
    for key in ("minimum", "exclusiveMinimum"):
        if _is_number(schema.get(key)) and schema[key] < -_NUMBER_BOUND and all(h >= -_NUMBER_BOUND for h in highs):
            schema[key] = -_NUMBER_BOUND
    for key in ("maximum", "exclusiveMaximum"):
        if _is_number(schema.get(key)) and schema[key] > _NUMBER_BOUND and all(lo <= _NUMBER_BOUND for lo in lows):
            schema[key] = _NUMBER_BOUND


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)  # draft 4's exclusiveMinimum: true


def _admits(schema: Mapping[str, Any], kind: str) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _inline_json(schema: Mapping[str, Any]) -> str:
    return "%json " + json.dumps({"x-guidance": _JSON_OPTIONS, **schema}, ensure_ascii=False)


def _literal(text: str) -> str:
    # Lark string literals take JSON's escapes.
    return json.dumps(text, ensure_ascii=False)


_FORMATS: dict[str, Callable[[str, ToolFunction, int, _Markers], list[str]]] = {
    "hermes": _hermes_call,
    "hyperclovax": _hyperclovax_call,
    "glm45": _hyperclovax_call,
}
