"""The chat-only steps about tools and reasoning: which format a reply's calls are read in, the
call grammar a forced or "auto" choice gets, tool markup banned under "none", the free-string
bound a budget allows, and the OutputFormat each choice is parsed with. (Drawn images are
tests/omni/serving/requests/test_images.py's and the image output's.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.serving.chat_turns import (
    ban_tool_markup,
    check_tool_choice,
    free_string_chars,
    output_format,
    tool_format,
    tool_grammar,
)
from omni.serving.model import ServedModel
from omni.serving.requests import parse_chat_completion_request
from omni.text.chat_format import ChatFormat
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.parsers.tool_grammar import JSON_ARGUMENTS, JSON_CALLS, MAX_FREE_CHARS
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams
from tests.omni.fake_pool import FakePool

TOOL_CALL = 1310  # <tool_call> in the tiny tokenizer
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}
TIME = {"type": "function", "function": {"name": "time"}}
OPEN = [1281, 1090, 343, 274, 83, 198, 1308, 198]  # "<|im_start|>assistant\n<think>\n"


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def served(tokenizer: TextTokenizer, **fmt: Any) -> ServedModel:
    return ServedModel("m", tokenizer, cast(ModelPool, FakePool([1])), created=0, chat_format=ChatFormat(**fmt))


def chat(**fields: Any) -> Any:
    return parse_chat_completion_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_calls_are_read_in_the_templates_format_or_as_json_when_forced(tokenizer: TextTokenizer) -> None:
    hermes, bare = served(tokenizer, tool_parser="hermes"), served(tokenizer)
    tools = [WEATHER, TIME]
    assert tool_format(hermes, chat(tools=tools)) == "hermes"
    assert tool_format(hermes, chat(tools=tools, tool_choice="none")) is None
    assert tool_format(bare, chat(tools=tools)) is None  # "auto" on a template without calls: plain text
    assert tool_format(bare, chat(tools=tools, tool_choice="required")) == JSON_CALLS
    named = {"type": "function", "function": {"name": "time"}}
    assert tool_format(bare, chat(tools=tools, tool_choice=named)) == JSON_ARGUMENTS


def test_auto_turned_off_is_a_400_before_any_work(tokenizer: TextTokenizer) -> None:
    off = served(tokenizer, tool_parser="hermes", auto_tool_choice=False)
    with pytest.raises(APIError) as refused:
        check_tool_choice(off, chat(tools=[WEATHER]))
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "tool_choice", "unsupported_parameter")
    check_tool_choice(off, chat(tools=[WEATHER], tool_choice="required"))
    check_tool_choice(served(tokenizer, tool_parser="hermes"), chat(tools=[WEATHER]))


def test_none_with_tools_bans_the_call_token(tokenizer: TextTokenizer) -> None:
    model = served(tokenizer, tool_parser="hermes")
    params = SamplingParams(max_tokens=4, bad_words_token_ids=((9,),))
    assert ban_tool_markup(model, chat(tools=[WEATHER], tool_choice="none"), params).bad_words_token_ids == ((9,), (TOOL_CALL,))
    assert ban_tool_markup(model, chat(tools=[WEATHER]), params) is params
    assert ban_tool_markup(model, chat(tool_choice="none"), params) is params  # no tools: nothing to ban
    assert ban_tool_markup(served(tokenizer), chat(tools=[WEATHER], tool_choice="none"), params) is params


@pytest.mark.parametrize(("max_tokens", "chars"), [(0, MAX_FREE_CHARS), (16, MAX_FREE_CHARS), (4 * 4096, 4096), (4 * 5000, 4096), (10**6, 1 << 17)])
def test_the_free_string_bound_is_a_power_of_two_of_a_quarter_of_the_budget(max_tokens: int, chars: int) -> None:
    assert free_string_chars(max_tokens) == max(chars, MAX_FREE_CHARS)


async def test_a_forced_call_holds_from_the_first_token_and_auto_from_the_call_token(tokenizer: TextTokenizer) -> None:
    model = served(tokenizer, tool_parser="hermes")
    forced = await tool_grammar(model, chat(tools=[WEATHER], tool_choice="required"), 64)
    assert forced is not None and forced.trigger_token_id is None
    (mask,) = fill_masks([forced.grammar.new_constraint()])
    assert allowed_tokens(mask, tokenizer.vocab_size).tolist() == [TOOL_CALL]  # the call opens at once
    auto = await tool_grammar(model, chat(tools=[WEATHER]), 64)
    assert auto is not None and auto.trigger_token_id == TOOL_CALL
    assert await tool_grammar(model, chat(tools=[WEATHER], tool_choice="none"), 64) is None
    assert await tool_grammar(served(tokenizer), chat(tools=[WEATHER]), 64) is None  # no format: no grammar


def test_each_choice_is_parsed_with_the_models_parsers(tokenizer: TextTokenizer) -> None:
    model = served(tokenizer, tool_parser="hermes", reasoning_parser="think")
    fmt = output_format(model, chat(tools=[WEATHER, TIME], parallel_tool_calls=False), OPEN)
    assert (fmt.reasoning_parser, fmt.in_reasoning, fmt.tool_parser, fmt.single_call) == ("think", True, "hermes", True)
    assert [t.name for t in fmt.tools] == ["weather", "time"]
    named = {"type": "function", "function": {"name": "time"}}
    json_named = output_format(served(tokenizer), chat(tools=[WEATHER, TIME], tool_choice=named), OPEN)
    assert (json_named.tool_parser, [t.name for t in json_named.tools], json_named.in_reasoning) == (JSON_ARGUMENTS, ["time"], False)
