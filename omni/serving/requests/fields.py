"""What every endpoint's body shares: the bounds, the error helpers, the conversion into a
request Struct, and the one mapping of a msgspec ValidationError to the 400 that names the
field."""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import msgspec

from omni.errors import APIError, bad_request

MAX_N = 128  # OpenAI's bound; admission bounds the work (all n choices are admitted together)
MAX_STOP_STRINGS = 4
# torch.Generator.manual_seed accepts exactly this range.
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
MAX_REQUEST_ID_LENGTH = 256
# A request's priority: vLLM takes any int; a 32-bit one is every order a client needs.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1

Json: TypeAlias = Any
Body: TypeAlias = Mapping[str, Json]
T = TypeVar("T")


def merge_extra_body(data: dict[str, Json]) -> dict[str, Json]:
    """A literal "extra_body" object (what the OpenAI SDK merges into the body, sent as it is by
    some clients) is merged into the body; its keys win over top-level ones of the same name,
    as they would had the SDK merged them."""
    if "extra_body" not in data:
        return data
    extra = data.pop("extra_body")
    if extra is None:
        return data
    if not isinstance(extra, dict):
        raise type_error("extra_body", "an object", extra)
    return data | extra


# ----------------------------------------------------------------------------- errors


def _json_type(value: Json) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def type_error(param: str, expected: str, value: Json) -> APIError:
    return bad_request(
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        param=param,
        code="invalid_type",
    )


def value_error(param: str, detail: str) -> APIError:
    return bad_request(f"Invalid value for '{param}': {detail}", param=param, code="invalid_value")


def unsupported(param: str, detail: str) -> APIError:
    return bad_request(
        f"'{param}' is not supported: {detail}", param=param, code="unsupported_parameter"
    )


def body_too_slow(timeout: float | None) -> APIError:
    """A body that did not arrive within --body-timeout: a 408, and the connection is closed."""
    return APIError(
        408,
        f"The request body did not arrive within {timeout or 0:g} seconds.",
        code="request_timeout",
        headers={"Connection": "close"},
    )


def missing(param: str) -> APIError:
    return bad_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


# ----------------------------------------------------------------------------- forms
# A multipart form's values are texts, a field given as several parts (`include[]`) a list.


def form_value(name: str, values: Sequence[T]) -> T:
    """The one text of a field that takes one."""
    if len(values) > 1:
        raise bad_request(f"'{name}' is given {len(values)} times; send it once.", param=name)
    return values[0]


def form_bool(value: str, name: str) -> bool:
    """A form's boolean, as the official client writes it: true or false."""
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise value_error(name, f"expected true or false, got {value!r}.")
    return lowered == "true"


# ----------------------------------------------------------------------------- Structs


def without_nulls(body: Body, *, within: tuple[str, ...] = ()) -> dict[str, Json]:
    """The object without its null values (and those of its objects named in within): null
    means the field's default."""
    out = {k: v for k, v in body.items() if v is not None}
    for name in within:
        if isinstance(out.get(name), dict):
            out[name] = {k: v for k, v in out[name].items() if v is not None}
    return out


def convert(body: Body, cls: type[T], *, within: tuple[str, ...] = (), strict: bool = True) -> T:
    """The body as the request Struct cls. Nulls are dropped first (top-level, and in the
    objects named in within): null means the field's default. strict: no value is coerced
    (a string is no number); a form's texts are read with strict False."""
    try:
        return msgspec.convert(without_nulls(body, within=within), cls, strict=strict)
    except msgspec.ValidationError as e:
        raise validation_error(e, body, cls) from None


# msgspec's ValidationError is only its English message ("Expected `int` >= 1 - at `$.n`"):
# no path or kind as attributes. So the patterns below read it, msgspec is pinned below 1, and
# tests/omni/serving/requests/test_fields_msgspec.py asserts every shape they read word for
# word. A message of a shape they do not know is still a 400 (its own words, the path's param).

# msgspec's words for a JSON type, as our 400s word it
_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
    "bytes": "a base64 string",
}
_SCALARS = frozenset({"str", "int", "float", "bool"})
_AT = re.compile(r"^(?P<what>.*?)(?: - at `(?P<path>[^`]*)`(?: in `(?P<outer>[^`]*)`)?)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")
_EXPECTED_TYPE = re.compile(r"^Expected `(?P<expected>[^`]+)`, got `(?P<got>[^`]+)`$")
_BOUND = re.compile(r"^Expected `(?P<type>[^`]+)` (?P<rest>.+)$")
_ENUM = re.compile(r"^Invalid (?:enum )?value (?P<value>.+)$")
_INDEX = re.compile(r"\[(\d+|\.\.\.)\]$")
# Objects whose every key is named by the object itself in a 400 (a key of neither kind
# there reads as a wrong value of the object).
OBJECT_PARAMS = frozenset({"structured_outputs"})


def _param(path: str) -> str:
    return path.removeprefix("$").removeprefix(".")


def _words(types: str) -> str:
    return " or ".join(_TYPE_WORDS.get(t, t) for t in types.split(" | "))


def validation_error(e: msgspec.ValidationError, body: Body | None = None, cls: type | None = None) -> APIError:
    """The OpenAI error object for msgspec's message, e.g. "Expected `int` >= 1 - at `$.n`":
    its path becomes the param ("messages[0].content"); an item of an array of scalars is
    named by the array ("stop", not "stop[1]"), as the API reference names fields."""
    match = _AT.match(str(e))
    assert match is not None
    what, path = match["what"], match["outer"] or match["path"] or "$"
    if match["outer"]:  # "`key` in `$.logit_bias`": a key of a map
        path = match["outer"]
    param = _param(path)
    if m := _MISSING.match(what):
        return missing(f"{param}.{m['name']}" if param else m["name"])
    if m := _UNKNOWN.match(what):
        if param in OBJECT_PARAMS:
            return value_error(param, f"unknown field '{m['name']}'.")
        name = f"{param}.{m['name']}" if param else m["name"]
        known = _schema_nodes(cls, _param(path)) if cls is not None else []
        fields = sorted({key for node in known for key in node.get("properties", {})})
        listed = f" (fields: {', '.join(fields)})" if fields else ""
        return bad_request(
            f"Unrecognized request argument supplied: '{name}' is not a field of '{param or 'the body'}'{listed}.",
            param=name,
            code="unknown_parameter",
        )
    scalar = (m := _EXPECTED_TYPE.match(what) or _BOUND.match(what)) is not None and set(
        (m.groupdict().get("expected") or m.groupdict().get("type") or "").split(" | ")
    ) <= _SCALARS
    while (scalar or param.endswith("[...]")) and _INDEX.search(param):
        param = _INDEX.sub("", param)
        scalar = False
    if m := _EXPECTED_TYPE.match(what):
        expected = m["expected"]
        if not any(c in param for c in ".[") and expected != "null":  # a top-level null was dropped: it is the default
            expected = " | ".join(t for t in expected.split(" | ") if t != "null")
        return bad_request(
            f"Invalid type for '{param}': expected {_words(expected)}, but got {_words(m['got'])} instead.",
            param=param,
            code="invalid_type",
        )
    if m := _BOUND.match(what):
        got = _value_at(body, _param(path))
        if got is _NOTHING and path.endswith("[...]"):  # a value of a map: the first out of bounds
            got = _first_out_of_bounds(_value_at(body, _param(path.removesuffix("[...]"))), m["rest"])
        bounds = _numeric_bounds(cls, param) if cls is not None and m["rest"][0] in "<>" else None
        detail = bounds or _bound_words(m["type"], m["rest"])
        if isinstance(got, str) and m["rest"].startswith("of length"):  # its length, not the text
            return value_error(param, f"{detail}, got {len(got)}.")
        shown = got is not _NOTHING and not isinstance(got, (dict, list))
        return value_error(param, detail + (f", got {_dump(got)}." if shown else "."))
    if m := _ENUM.match(what):
        accepted = _accepted_values(cls, _param(path)) if cls is not None else ()
        if not accepted:
            return value_error(_INDEX.sub("", param), f"{m['value']} is not one of the accepted values.")
        listed = ", ".join(_dump(v) for v in accepted)
        return value_error(_INDEX.sub("", param), f"expected one of {listed}, got {m['value']}.")
    return value_error(param, what.rstrip(".") + ".")  # a rule a Struct's __post_init__ raised


@functools.lru_cache(maxsize=64)
def _json_schema(cls: type) -> dict[str, Any]:
    return msgspec.json.schema(cls)


def _accepted_values(cls: type, path: str) -> tuple[Any, ...]:
    """The values msgspec's schema of cls lists at path ("response_format.type"): every enum of
    every branch there (a tagged union's tags, a Literal's values)."""
    values: list[Any] = []
    for node in _schema_nodes(cls, path):
        values += [v for v in node.get("enum", ()) if v not in values]
        if "const" in node and node["const"] not in values:
            values.append(node["const"])
    return tuple(values)


def _schema_nodes(cls: type, path: str) -> list[dict[str, Any]]:
    """The branches of msgspec's schema of cls at path ("messages[0].content"), unions opened."""
    schema = _json_schema(cls)
    defs = schema.get("$defs", {})

    def branches(node: Any) -> list[dict[str, Any]]:
        if not isinstance(node, dict):
            return []
        if "$ref" in node:
            return branches(defs.get(node["$ref"].rsplit("/", 1)[-1]))
        union = node.get("anyOf") or node.get("oneOf")
        if union:
            return [b for sub in union for b in branches(sub)]
        return [node]

    nodes = branches(schema)
    for name, index in _STEP.findall("." + path if path else ""):
        step: list[dict[str, Any]] = []
        for node in nodes:
            if name:
                step += branches(node.get("properties", {}).get(name))
            else:
                step += branches(node.get("items"))
        nodes = step
    return nodes


def _bound_words(kind: str, rest: str) -> str:
    """msgspec's "of length >= 1", ">= 0.0", "matching regex '...'" in our words."""
    if rest.startswith("matching regex"):
        return f"does not match the pattern {rest.removeprefix('matching regex ')}"
    unit = " items" if kind in ("array", "object") else " characters" if kind == "str" else ""
    rest = rest.removeprefix("of length ")
    op, _, number = rest.partition(" ")
    words = {">=": "at least", "<=": "at most", ">": "greater than", "<": "less than"}.get(op, op)
    number = number.removesuffix(".0")
    if number == "1":
        unit = unit.removesuffix("s")
    return f"must be {words} {number}{unit}"


def _numeric_bounds(cls: type, name: str) -> str | None:
    """A top-level field's whole range as today's 400s say it: "must be between 0 and 2"."""
    try:
        info = next(f for f in msgspec.structs.fields(cls) if f.encode_name == name)
    except (StopIteration, TypeError):
        return None
    found: dict[str, Any] = {}

    def walk(t: Any) -> None:
        if typing.get_origin(t) is typing.Annotated:
            for meta in t.__metadata__:
                if isinstance(meta, msgspec.Meta):
                    found.update({k: getattr(meta, k) for k in ("ge", "le", "gt", "lt") if getattr(meta, k) is not None})
            walk(t.__origin__)
        elif typing.get_origin(t) in (types.UnionType, typing.Union, list, dict, tuple):
            for arg in typing.get_args(t):
                walk(arg)

    walk(info.type)
    low = f"at least {_num(found['ge'])}" if "ge" in found else f"greater than {_num(found['gt'])}" if "gt" in found else None
    high = f"at most {_num(found['le'])}" if "le" in found else f"less than {_num(found['lt'])}" if "lt" in found else None
    if "ge" in found and "le" in found:
        return f"must be between {_num(found['ge'])} and {_num(found['le'])}"
    return "must be " + " and ".join(w for w in (low, high) if w) if low or high else None


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


_NOTHING = object()
_COMPARE = {">=": float.__ge__, "<=": float.__le__, ">": float.__gt__, "<": float.__lt__}


def _first_out_of_bounds(values: Any, rest: str) -> Any:
    op, _, number = rest.partition(" ")
    if not isinstance(values, dict) or op not in _COMPARE:
        return _NOTHING
    bound = float(number)
    return next(
        (v for v in values.values() if isinstance(v, (int, float)) and not _COMPARE[op](float(v), bound)), _NOTHING
    )
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _value_at(body: Body | None, param: str) -> Any:
    """The body's value at a param like "messages[0].content" (for the message), if it is there."""
    value: Any = body
    for name, index in _STEP.findall("." + param if param else ""):
        try:
            value = value[name] if name else value[int(index)]
        except (KeyError, IndexError, TypeError):
            return _NOTHING
    return _NOTHING if value is body else value


def _dump(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() is False:
        return repr(value)
    return repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)
