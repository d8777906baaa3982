"""The tool fields of a chat request: `tools`, `tool_choice`, `parallel_tool_calls`.

Tools reach the chat template as the client sent them (OpenAI's {"type": "function",
"function": {...}} dicts, which Hugging Face templates expect); their parsed form
(ToolFunction) is what the tool-call parser and the forced-call grammar read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, structs

from omni.errors import bad_request
from omni.serving.requests.fields import Json, value_error
from omni.text.parsers.tool_calls import ToolFunction

NAME_PATTERN = "^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names
MAX_TOOLS = 128  # OpenAI's limit

ToolChoiceMode = Literal["none", "auto", "required", "named"]


class FunctionDefinition(Struct, frozen=True, kw_only=True):
    name: Annotated[str, Meta(pattern=NAME_PATTERN, description="1 to 64 letters, digits, '_' or '-'.")]
    description: str | None = None
    parameters: Annotated[dict[str, Any], Meta(description="A JSON schema of the arguments.")] | None = None
    strict: bool | None = None


class Tool(Struct, frozen=True, kw_only=True):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(Struct, frozen=True, kw_only=True):
    name: str


class NamedToolChoice(Struct, frozen=True, kw_only=True):
    function: NamedFunction
    type: Literal["function"] = "function"


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


def tool_fields(
    tools: Sequence[Tool], choice_sent: Literal["none", "auto", "required"] | NamedToolChoice | None, parallel: bool
) -> ToolFields:
    functions: list[ToolFunction] = []
    template: list[dict[str, Json]] = []
    for i, t in enumerate(tools):
        fn = t.function
        if any(f.name == fn.name for f in functions):
            raise value_error(f"tools[{i}].function.name", f"'{fn.name}' is defined twice.")
        parameters = {"type": "object", "properties": {}} if fn.parameters is None else fn.parameters
        functions.append(ToolFunction(name=fn.name, description=fn.description, parameters=parameters))
        sent = {k: v for k, v in structs.asdict(fn).items() if v is not None}
        template.append({"type": "function", "function": sent})

    choice: ToolChoiceMode
    named = None
    if choice_sent is None:
        choice = "auto" if functions else "none"
    elif isinstance(choice_sent, NamedToolChoice):
        named = choice_sent.function.name
        choice = "named"
    else:
        choice = choice_sent
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
        parallel=parallel,
    )
