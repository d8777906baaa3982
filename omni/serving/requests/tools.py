"""The tool fields of a chat request: `tools`, `tool_choice`, `parallel_tool_calls`.

Tools reach the chat template as the client sent them (OpenAI's {"type": "function",
"function": {...}} dicts, which Hugging Face templates expect); their parsed form
(ToolFunction) is what the tool-call parser and the forced-call grammar read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from omni.errors import bad_request
from omni.serving.requests.fields import Body, Json, missing, opt_bool, required_str, type_error, value_error
from omni.text.parsers.tool_calls import ToolFunction

# OpenAI's rule for function names.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128  # OpenAI's limit

ToolChoiceMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolFields:
    functions: tuple[ToolFunction, ...] = ()
    template_tools: tuple[dict[str, Json], ...] = ()  # as sent, for the chat template
    choice: ToolChoiceMode = "none"
    named: str | None = None  # the function a named tool_choice forces
    parallel: bool = True

    @property
    def single_call(self) -> bool:
        """At most one call: parallel_tool_calls false, or a named tool_choice (one call to that
        function, as vLLM makes it)."""
        return not self.parallel or self.choice == "named"

    @property
    def forced(self) -> tuple[ToolFunction, ...]:
        """The functions a call must be made to (required: any; named: that one); () if none is forced."""
        if self.choice == "required":
            return self.functions
        if self.choice == "named":
            return tuple(f for f in self.functions if f.name == self.named)
        return ()


def _parse_tool(value: Json, param: str) -> tuple[ToolFunction, dict[str, Json]]:
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    kind = value.get("type", "function")
    if kind != "function":
        raise value_error(f"{param}.type", f"'{kind}'; only 'function' tools are supported.")
    fn = value.get("function")
    if fn is None:
        raise missing(f"{param}.function")
    if not isinstance(fn, dict):
        raise type_error(f"{param}.function", "an object", fn)
    name = required_str(fn, "name", f"{param}.function.name")
    if not _NAME.match(name):
        raise value_error(
            f"{param}.function.name", f"'{name}'; names are 1 to 64 letters, digits, '_' or '-'."
        )
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise type_error(f"{param}.function.description", "a string", description)
    parameters = fn.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise type_error(f"{param}.function.parameters", "a JSON schema object", parameters)
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise type_error(f"{param}.function.strict", "a boolean", strict)
    template = {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}
    return ToolFunction(name=name, description=description, parameters=parameters), template


def parse_tool_fields(body: Body) -> ToolFields:
    raw = body.get("tools")
    functions: list[ToolFunction] = []
    template: list[dict[str, Json]] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise type_error("tools", "an array", raw)
        if len(raw) > MAX_TOOLS:
            raise value_error("tools", f"at most {MAX_TOOLS} tools are allowed, got {len(raw)}.")
        for i, t in enumerate(raw):
            fn, tpl = _parse_tool(t, f"tools[{i}]")
            if any(f.name == fn.name for f in functions):
                raise value_error(f"tools[{i}].function.name", f"'{fn.name}' is defined twice.")
            functions.append(fn)
            template.append(tpl)

    parallel = opt_bool(body, "parallel_tool_calls")
    choice: ToolChoiceMode
    named = None
    value = body.get("tool_choice")
    if value is None:
        choice = "auto" if functions else "none"
    elif isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise value_error("tool_choice", f"'{value}'; expected none, auto, required or a named function.")
        choice = value  # type: ignore[assignment]  # checked just above
    elif isinstance(value, dict):
        if value.get("type", "function") != "function":
            raise value_error("tool_choice.type", f"'{value.get('type')}'; expected 'function'.")
        named_fn = value.get("function")
        if not isinstance(named_fn, dict):
            raise type_error("tool_choice.function", "an object", named_fn)
        named = required_str(named_fn, "name", "tool_choice.function.name")
        choice = "named"
    else:
        raise type_error("tool_choice", "a string or an object", value)

    if choice in ("required", "named") and not functions:
        raise bad_request(
            f"'tool_choice' {'required' if choice == 'required' else 'naming a function'} needs 'tools'.",
            param="tool_choice",
            code="invalid_value",
        )
    if named is not None and all(f.name != named for f in functions):
        raise value_error("tool_choice.function.name", f"'{named}' is not one of the request's tools.")
    return ToolFields(
        functions=tuple(functions),
        template_tools=tuple(template),
        choice=choice,
        named=named,
        parallel=parallel is not False,
    )
