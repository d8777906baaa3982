"""tool_fields: the tools as the parser and the grammar read them and as the template gets them,
the choice a request makes (its default, required, named), and the 400s of a bad pairing."""

from __future__ import annotations

import msgspec
import pytest

from omni.errors import APIError
from omni.serving.requests.tools import (
    MAX_TOOLS,
    NAME_PATTERN,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    Tool,
    tool_fields,
)
from omni.text.parsers.tool_calls import ToolFunction

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = Tool(function=FunctionDefinition(name="weather", description="Now", parameters=SCHEMA))
TIME = Tool(function=FunctionDefinition(name="time"))


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice(function=NamedFunction(name=name))


def refused(*args: object) -> APIError:
    with pytest.raises(APIError) as e:
        tool_fields(*args)  # type: ignore[arg-type]
    assert e.value.status == 400
    return e.value


def test_tools_become_functions_and_the_template_gets_them_as_sent() -> None:
    fields = tool_fields([WEATHER, TIME], None, True)
    assert fields.functions == (
        ToolFunction("weather", "Now", SCHEMA),
        ToolFunction("time", None, {"type": "object", "properties": {}}),  # no parameters: an empty object
    )
    assert fields.template_tools == (
        {"type": "function", "function": {"name": "weather", "description": "Now", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "time"}},  # unset fields are left out, not null
    )


def test_the_choice_defaults_to_auto_with_tools_and_none_without() -> None:
    assert tool_fields([WEATHER], None, True).choice == "auto"
    assert tool_fields([], None, True).choice == "none"
    assert tool_fields([WEATHER], "none", True).forced == ()


def test_required_forces_any_tool_and_named_forces_one_call_to_it() -> None:
    required = tool_fields([WEATHER, TIME], "required", True)
    assert [f.name for f in required.forced] == ["weather", "time"] and not required.single_call
    one = tool_fields([WEATHER, TIME], named("time"), True)
    assert (one.choice, one.named, [f.name for f in one.forced]) == ("named", "time", ["time"])
    assert one.single_call  # a named choice is one call, as vLLM makes it
    assert tool_fields([WEATHER], "auto", False).single_call  # parallel_tool_calls false


def test_bad_pairings_are_400s_naming_the_field() -> None:
    assert refused([], "required", True).param == "tool_choice"
    assert refused([], named("weather"), True).param == "tool_choice"
    unknown = refused([WEATHER], named("nope"), True)
    assert unknown.param == "tool_choice.function.name" and "'nope' is not one of" in str(unknown)
    twice = refused([WEATHER, WEATHER], None, True)
    assert twice.param == "tools[1].function.name" and "defined twice" in str(twice)


def test_a_function_name_follows_openais_rule() -> None:
    assert (NAME_PATTERN, MAX_TOOLS) == ("^[A-Za-z0-9_-]{1,64}$", 128)
    msgspec.convert({"function": {"name": "a_b-9"}}, Tool)
    for bad in ("has space", "x" * 65, ""):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"function": {"name": bad}}, Tool)
