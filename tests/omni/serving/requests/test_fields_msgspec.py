"""msgspec's wording, as omni/serving/requests/fields.py:validation_error reads it.

msgspec's ValidationError carries only its English message (no path or kind as attributes), so
fields.py parses it, and pyproject pins msgspec below 1. Every message shape the parser relies
on is asserted here word for word: a msgspec that words one differently fails this test before
a client gets a 400 that names the wrong field."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec
import pytest
from msgspec import Meta, Struct

from omni.serving.requests.fields import validation_error


class Inner(Struct, forbid_unknown_fields=True):
    role: str


class A(Struct, tag_field="type", tag="a"):
    pass


class B(Struct, tag_field="type", tag="b"):
    pass


class Color(enum.Enum):
    RED = "red"


class Body(Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    t: Annotated[float, Meta(ge=0.0, le=2.0)] = 1.0
    p: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.5
    s: Annotated[str, Meta(min_length=1, max_length=3)] | None = None
    stop: str | Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=4)] = ""
    bias: dict[Annotated[str, Meta(pattern="^[0-9]+$")], Annotated[float, Meta(ge=-100.0, le=100.0)]] = {}
    inner: list[Inner] = []
    lit: Literal["x", "y"] = "x"
    color: Color = Color.RED
    fmt: A | B | None = None
    opt: int | None = None


M = {"model": "m"}
# (body, msgspec's exact message, the param and code validation_error reads from it)
CASES: list[tuple[dict[str, Any], str, str, str]] = [
    ({}, "Object missing required field `model`", "model", "missing_required_parameter"),
    (M | {"zzz": 1}, "Object contains unknown field `zzz`", "zzz", "unknown_parameter"),
    (M | {"inner": [{}]}, "Object missing required field `role` - at `$.inner[0]`", "inner[0].role",
     "missing_required_parameter"),
    (M | {"inner": [{"role": "u", "q": 1}]}, "Object contains unknown field `q` - at `$.inner[0]`", "inner[0].q",
     "unknown_parameter"),
    (M | {"n": "x"}, "Expected `int`, got `str` - at `$.n`", "n", "invalid_type"),
    (M | {"opt": "x"}, "Expected `int | null`, got `str` - at `$.opt`", "opt", "invalid_type"),
    (M | {"stop": 5}, "Expected `str | array`, got `int` - at `$.stop`", "stop", "invalid_type"),
    (M | {"stop": [1]}, "Expected `str`, got `int` - at `$.stop[0]`", "stop", "invalid_type"),
    (M | {"inner": {}}, "Expected `array`, got `object` - at `$.inner`", "inner", "invalid_type"),
    (M | {"n": 0}, "Expected `int` >= 1 - at `$.n`", "n", "invalid_value"),
    (M | {"n": 129}, "Expected `int` <= 128 - at `$.n`", "n", "invalid_value"),
    (M | {"t": -0.5}, "Expected `float` >= 0.0 - at `$.t`", "t", "invalid_value"),
    (M | {"t": 3}, "Expected `float` <= 2.0 - at `$.t`", "t", "invalid_value"),
    (M | {"p": 0.0}, "Expected `float` > 0.0 - at `$.p`", "p", "invalid_value"),
    (M | {"p": 1.0}, "Expected `float` < 1.0 - at `$.p`", "p", "invalid_value"),
    (M | {"s": ""}, "Expected `str` of length >= 1 - at `$.s`", "s", "invalid_value"),
    (M | {"s": "abcd"}, "Expected `str` of length <= 3 - at `$.s`", "s", "invalid_value"),
    (M | {"stop": ["a"] * 5}, "Expected `array` of length <= 4 - at `$.stop`", "stop", "invalid_value"),
    (M | {"stop": ["a", ""]}, "Expected `str` of length >= 1 - at `$.stop[1]`", "stop", "invalid_value"),
    (M | {"bias": {"x": 1}}, "Expected `str` matching regex '^[0-9]+$' - at `key` in `$.bias`", "bias",
     "invalid_value"),
    (M | {"bias": {"1": 1000}}, "Expected `float` <= 100.0 - at `$.bias[...]`", "bias", "invalid_value"),
    (M | {"lit": "z"}, "Invalid enum value 'z' - at `$.lit`", "lit", "invalid_value"),
    (M | {"color": "blue"}, "Invalid enum value 'blue' - at `$.color`", "color", "invalid_value"),
    (M | {"fmt": {"type": "c"}}, "Invalid value 'c' - at `$.fmt.type`", "fmt.type", "invalid_value"),
    (M | {"fmt": {}}, "Object missing required field `type` - at `$.fmt`", "fmt.type", "missing_required_parameter"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "message", "param", "code"), CASES, ids=[c[1] for c in CASES])
def test_msgspec_words_each_error_as_the_parser_expects(body: dict[str, Any], message: str, param: str, code: str) -> None:
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.convert(body, Body)
    assert str(e.value) == message
    error = validation_error(e.value, body, Body)
    assert (error.status, error.param, error.code) == (400, param, code)


class Checked(Struct):
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must not be negative")


class Outer(Struct):
    items: list[Checked]


def test_a_rule_a_struct_raises_keeps_its_own_words_and_gets_the_path() -> None:
    """A __post_init__'s ValueError (chat.py's messages) comes back with msgspec's path."""
    body = {"items": [{"a": 1}, {"a": -1}]}
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.convert(body, Outer)
    assert str(e.value) == "a must not be negative - at `$.items[1]`"
    error = validation_error(e.value, body, Outer)
    assert (error.param, error.message) == ("items[1]", "Invalid value for 'items[1]': a must not be negative.")


@pytest.mark.parametrize("message", ["Something new happened - at `$.n`", "Expected something else", "Invalid thing"])
def test_a_message_of_an_unknown_shape_is_still_a_400(message: str) -> None:
    """Should a msgspec below 1 word an error anew, the client gets msgspec's words in a 400."""
    error = validation_error(msgspec.ValidationError(message), M | {"n": 0}, Body)
    assert error.status == 400
    assert message.split(" - at")[0] in error.message
