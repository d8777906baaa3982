"""The chat-only request fields: tools and tool_choice, the template fields, echo and the
reasoning budget; and the chat format's defaults, read from the template."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_workers.tiny.tokenizer import CHAT_TEMPLATE
from omni.errors import APIError
from omni.serving.requests import parse_chat_completion_request
from omni.text.chat_format import ChatFormat, detect_reasoning_parser, detect_tool_parser

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def error(body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(body)
    assert e.value.status == 400
    return e.value


def test_tool_choice_defaults_to_auto_with_tools_and_none_without() -> None:
    assert parse_chat_completion_request(chat()).tools.choice == "none"
    req = parse_chat_completion_request(chat(tools=[WEATHER, TIME]))
    assert req.tools.choice == "auto" and req.tools.parallel
    assert [f.name for f in req.tools.functions] == ["get_weather", "get_time"]
    assert req.tools.functions[1].parameters == {"type": "object", "properties": {}}
    assert req.tools.template_tools[0] == WEATHER  # the template gets the tool as sent
    assert req.tools.forced == ()


def test_required_forces_every_tool_and_a_named_choice_forces_one() -> None:
    req = parse_chat_completion_request(chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False))
    assert [f.name for f in req.tools.forced] == ["get_weather", "get_time"] and not req.tools.parallel
    named = {"type": "function", "function": {"name": "get_time"}}
    req = parse_chat_completion_request(chat(tools=[WEATHER, TIME], tool_choice=named))
    assert req.tools.choice == "named" and [f.name for f in req.tools.forced] == ["get_time"]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice.function.name"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        # OpenAI's limit of 128 tools
        ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_tool_fields_are_400s_naming_the_field(fields: dict[str, Any], param: str) -> None:
    assert error(chat(**fields)).param == param


def test_assistant_tool_calls_reach_the_template_with_parsed_arguments() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3C"},
    ]
    req = parse_chat_completion_request({"model": "m", "messages": messages})
    call = req.template_messages[1]["tool_calls"][0]
    assert call == {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Seoul"}}}
    assert req.template_messages[2] == {"role": "tool", "content": "3C", "tool_call_id": "call_1"}
    del messages[1]["tool_calls"][0]["function"]["name"]  # a call with no name is no call
    assert error({"model": "m", "messages": messages}).param == "messages[1].tool_calls[0].function.name"


def test_a_call_whose_arguments_are_no_object_is_left_out_of_the_prompt() -> None:
    """The server's own reply, sent back: two calls, the second cut by the length limit. Its
    arguments are no JSON object, so no template can render them as one: the call is left out,
    the turn and the whole call before it are not refused."""
    whole = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'}}
    cut: dict[str, Any] = {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [whole, cut]},
        {"role": "tool", "tool_call_id": "c1", "content": "3C"},
    ]
    req = parse_chat_completion_request({"model": "m", "messages": messages})
    assert [c["id"] for c in req.template_messages[1]["tool_calls"]] == ["c1"]
    assert req.messages[1].tool_calls is not None and len(req.messages[1].tool_calls) == 2  # kept as sent
    # a turn of nothing but such calls is an empty assistant turn (no "None" text, no calls)
    for args in ('{"city": "Par', "[1]", '"text"'):
        cut["function"]["arguments"] = args
        messages[1]["tool_calls"] = [cut]
        req = parse_chat_completion_request({"model": "m", "messages": messages})
        assert req.template_messages[1] == {"role": "assistant", "content": ""}


def test_template_fields() -> None:
    req = parse_chat_completion_request(chat())
    assert req.template.add_generation_prompt and not req.template.continue_final_message
    cont = chat(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}])
    req = parse_chat_completion_request(cont | {"continue_final_message": True, "echo": True})
    assert not req.template.add_generation_prompt and req.template.continue_final_message and req.echo
    req = parse_chat_completion_request(chat(chat_template_kwargs={"skip_reasoning": True}, chat_template="{{ 1 }}"))
    assert req.template.kwargs == {"skip_reasoning": True} and req.template.chat_template == "{{ 1 }}"
    assert parse_chat_completion_request(chat(thinking_token_budget=8)).thinking_token_budget == 8


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        ({"continue_final_message": True}, "continue_final_message"),  # the last message is the user's
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
        ({"chat_template": ""}, "chat_template"),
        ({"add_generation_prompt": 1}, "add_generation_prompt"),
        ({"echo": "yes"}, "echo"),
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
    ],
)
def test_bad_template_fields_are_400s_naming_the_field(fields: dict[str, Any], param: str) -> None:
    assert error(chat(**fields)).param == param


def test_the_parsers_follow_the_template() -> None:
    assert detect_tool_parser(CHAT_TEMPLATE) == "hyperclovax"
    assert detect_reasoning_parser(CHAT_TEMPLATE) == "think"
    hermes = '{{ "<tool_call>\\n" }}{"name": ...}'
    assert detect_tool_parser(hermes) == "hermes" and detect_reasoning_parser(hermes) is None
    assert detect_tool_parser("{{ messages }}") is None


def test_resolve_picks_detected_parsers_unless_told(tiny_tokenizer_dir: Any) -> None:
    from omni.text.tokenizer import TextTokenizer

    tok = TextTokenizer.from_dir(tiny_tokenizer_dir)
    fmt = ChatFormat.resolve(tok)
    assert (fmt.tool_parser, fmt.reasoning_parser) == ("hyperclovax", "think")
    fmt = ChatFormat.resolve(tok, tool_parser="hermes", reasoning_parser="none")
    assert (fmt.tool_parser, fmt.reasoning_parser) == ("hermes", None)
    assert ChatFormat.resolve(tok, chat_template="{{ messages }}").tool_parser is None
    with pytest.raises(ValueError, match="unknown parser"):
        ChatFormat.resolve(tok, tool_parser="mistral")


def test_free_strings_of_a_forced_call_grow_with_the_budget() -> None:
    from omni.serving.chat_turns import free_string_chars

    assert free_string_chars(0) == free_string_chars(200) == 48  # a small budget: the floor
    assert free_string_chars(1000) == 128 and free_string_chars(1023) == 128  # shared by nearby budgets
    assert free_string_chars(128_000) == 16_384  # a whole context: no real argument is cut
